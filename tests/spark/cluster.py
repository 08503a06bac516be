"""Test clusters: the same appends written into several MessageStore directories (no Raft needed), and
the defects the checks must find, injected into the files afterwards (or, for the broker's features,
written by a faulty "broker": :class:`FeatureDefects`).

Every cluster holds, after the random base batches, what the broker writes for its features
(:func:`append_features`): three transaction halves (one committed, one rolled back, one pending) with
their op records, two delayed messages and their deliveries, and a message sent back once to its retry
topic (through the schedule topic) and once to its dead-letter topic. Each replica's checkpoint carries
a replicated state (:func:`node_state`) that matches the log: consumer offsets, topics, timer progress."""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from commitlog.consume_queue import UNIT_BYTES
from commitlog.message import MessageInput
from commitlog.record_codec import StoredMessage
from commitlog.store import MessageStore
from commitlog.sys_flags import TRANSACTION_COMMIT_TYPE, TRANSACTION_PREPARED_TYPE, TRANSACTION_ROLLBACK_TYPE
from dledger.command import ConsumerOffset, SubscriptionGroup, TopicConfig
from dledger.state import ReplicatedState
from protocol.topics import SCHEDULE_TOPIC, TRANS_HALF_TOPIC, TRANS_OP_HALF_TOPIC
from spark_analytics.walker import walk_segment
from tests.commitlog.helpers import message, small_config

TOPICS = ("TopicTest", "Orders")
QUEUES_PER_TOPIC = 3
BATCHES = 60
BATCH_MESSAGES = 12
#: the batch n2 applies twice in the duplicated cluster (conftest.py)
DUPLICATED_BATCH = 10


def batches(seed: int = 7) -> list[list[MessageInput]]:
    """Deterministic batches: two topics, three queues each, bodies of varied size, a few transaction
    records (prepared, rollback) that are not dispatched."""
    rng = random.Random(seed)
    result: list[list[MessageInput]] = []
    number = 0
    for _ in range(BATCHES):
        batch = []
        for _ in range(BATCH_MESSAGES):
            number += 1
            sys_flag = 0
            draw = rng.random()
            if draw < 0.03:
                sys_flag = TRANSACTION_PREPARED_TYPE
            elif draw < 0.05:
                sys_flag = TRANSACTION_ROLLBACK_TYPE
            body = rng.randbytes(rng.randint(40, 700))
            batch.append(message(number, topic=TOPICS[number % 2], queue_id=rng.randrange(QUEUES_PER_TOPIC),
                                 body=body, tags=f"Tag{number % 5}" if number % 7 else None, sys_flag=sys_flag))
        result.append(batch)
    return result


def node_store(cluster: Path, node: str) -> Path:
    return cluster / node / "store"


def batch_stamp(batch_number: int) -> int:
    """The leader's store timestamp for a batch (apply stamps a whole entry with one)."""
    return 1_700_000_100_000 + batch_number * 10


#: the consumer group of the retry and dead-letter copies, and the producer group of the halves
GROUP = "cg"
RETRY_TOPIC = f"%RETRY%{GROUP}"
DLQ_TOPIC = f"%DLQ%{GROUP}"
#: the store time of the first feature batch, after the base batches
FEATURE_STAMP = batch_stamp(BATCHES) + 1_000
#: message numbers (UNIQ_KEYs) of the feature records
HALVES = (9001, 9002, 9003)
DELAYED_LEVEL_1 = 9010
DELAYED_LEVEL_3 = 9011
RETRIED = 9020
OP_NUMBERS = (9030, 9031)


@dataclass(frozen=True)
class FeatureDefects:
    """Broker bugs to write into every replica alike (a deterministic apply replicates them)."""

    #: the commit of the first half writes no op record
    missing_op: bool = False
    #: the level-1 delayed message is delivered a second time, with the level-3 ones
    delivered_twice: bool = False
    #: the level-3 delayed message is delivered 4 s after it was scheduled, not 10 s
    delivered_early: bool = False
    #: the first half is committed a second time (at the end), and the rolled-back one committed too
    committed_again: bool = False
    #: the dead-letter copy's ORIGIN_MESSAGE_ID names the first half's physical offset, not the original's
    wrong_origin: bool = False


def append_features(store: MessageStore, raft_index: int, defects: FeatureDefects) -> int:
    """Append what the broker writes for transactions, delays and retries; returns the last Raft index."""
    store_timestamp = FEATURE_STAMP
    halves = [message(number, topic=TRANS_HALF_TOPIC, queue_id=0, REAL_TOPIC="Orders", REAL_QID="1",
                      TRAN_MSG="true", PGROUP="pg") for number in HALVES]
    delayed = [message(DELAYED_LEVEL_1, topic=SCHEDULE_TOPIC, queue_id=0, REAL_TOPIC="TopicTest", REAL_QID="2",
                       DELAY="1"),
               message(DELAYED_LEVEL_3, topic=SCHEDULE_TOPIC, queue_id=2, REAL_TOPIC="TopicTest", REAL_QID="0",
                       DELAY="3")]
    original = message(RETRIED, topic="TopicTest", queue_id=1)
    raft_index += 1
    results = store.append(raft_index, [*halves, *delayed, original], store_timestamp).results
    half_offset, original_id = results[0].physical_offset, results[-1].msg_id

    commit = message(HALVES[0], topic="Orders", queue_id=1, sys_flag=TRANSACTION_COMMIT_TYPE, REAL_TOPIC="Orders",
                     REAL_QID="1", TRAN_MSG="true", PGROUP="pg")._replace(prepared_transaction_offset=half_offset)
    op_commit = message(OP_NUMBERS[0], topic=TRANS_OP_HALF_TOPIC, queue_id=0, body=b"0", tags="d")
    op_rollback = message(OP_NUMBERS[1], topic=TRANS_OP_HALF_TOPIC, queue_id=0, body=b"1", tags="d")
    sent_back = message(RETRIED, topic=SCHEDULE_TOPIC, queue_id=2, REAL_TOPIC=RETRY_TOPIC, REAL_QID="0", DELAY="3",
                        RETRY_TOPIC="TopicTest", ORIGIN_MESSAGE_ID=original_id)._replace(reconsume_times=1)
    second = [commit, *(() if defects.missing_op else (op_commit,)), op_rollback, sent_back]

    delivered_1 = message(DELAYED_LEVEL_1, topic="TopicTest", queue_id=2, REAL_TOPIC="TopicTest", REAL_QID="2")
    delivered_3 = message(DELAYED_LEVEL_3, topic="TopicTest", queue_id=0, REAL_TOPIC="TopicTest", REAL_QID="0")
    retried = message(RETRIED, topic=RETRY_TOPIC, queue_id=0, REAL_TOPIC=RETRY_TOPIC, REAL_QID="0",
                      RETRY_TOPIC="TopicTest", ORIGIN_MESSAGE_ID=original_id)._replace(reconsume_times=1)
    dead = message(RETRIED, topic=DLQ_TOPIC, queue_id=0, RETRY_TOPIC="TopicTest",
                   ORIGIN_MESSAGE_ID=results[0].msg_id if defects.wrong_origin else original_id
                   )._replace(reconsume_times=2)
    later: list[tuple[int, list[MessageInput]]] = [(store_timestamp + 10, second), (store_timestamp + 1_000, [delivered_1])]
    if defects.delivered_early:
        later.append((store_timestamp + 4_000, [delivered_3]))
    later.append((store_timestamp + 10_010, [*(() if defects.delivered_early else (delivered_3,)), retried,
                                   *((delivered_1,) if defects.delivered_twice else ())]))
    later.append((store_timestamp + 10_020, [dead]))
    if defects.committed_again:
        rolled_back = message(HALVES[1], topic="Orders", queue_id=1, sys_flag=TRANSACTION_COMMIT_TYPE,
                              REAL_TOPIC="Orders", REAL_QID="1", TRAN_MSG="true", PGROUP="pg")._replace(
            prepared_transaction_offset=results[1].physical_offset)
        later.append((store_timestamp + 10_030, [commit, rolled_back]))
    for batch_stamp_ms, batch in later:
        raft_index += 1
        store.append(raft_index, batch, batch_stamp_ms)
    return raft_index


def node_state(applied_index: int, offsets: Mapping[tuple[str, str, int], int] | None = None) -> ReplicatedState:
    """The replicated state that goes with the log :func:`build_cluster` writes (every scheduled message
    delivered), at ``applied_index``; ``offsets`` replace consumer offsets."""
    state = ReplicatedState(applied_index=applied_index, last_store_timestamp=FEATURE_STAMP + 10_020)
    state.apply_offsets(tuple(ConsumerOffset(GROUP, "TopicTest", queue_id, 5 + queue_id) for queue_id in range(3)))
    state.apply_offsets(tuple(ConsumerOffset(group, topic, queue_id, offset)
                              for (group, topic, queue_id), offset in (offsets or {}).items()))
    for topic in ("TopicTest", "Orders"):
        state.apply_topic(TopicConfig(topic, 3, 3, 6))
    state.apply_topic(TopicConfig(RETRY_TOPIC, 1, 1, 6))
    state.apply_group(SubscriptionGroup(GROUP))
    state.apply_timer_progress("level:1", 1)
    state.apply_timer_progress("level:3", 2)
    return state


class StateHolder:
    """The replicated state a store's checkpoint carries (its extension provider)."""

    def __init__(self) -> None:
        self.state = ReplicatedState()

    def encode(self) -> bytes:
        return self.state.encode()


def build_cluster(cluster: Path, nodes: int = 3, seed: int = 7, extra_apply: dict[str, int] | None = None,
                  defects: FeatureDefects = FeatureDefects(),
                  offsets: Mapping[str, Mapping[tuple[str, str, int], int]] | None = None) -> list[Path]:
    """Write the same batches into ``nodes`` stores under ``cluster`` (``n0/store`` ...), then the feature
    records. ``extra_apply`` maps a node to a batch number that node applies twice, as a non-idempotent
    apply of a replayed entry would: its messages are stored twice. ``offsets`` maps a node to consumer
    offsets its replicated state holds besides the common ones."""
    written = batches(seed)
    stores = []
    for number in range(nodes):
        name = f"n{number}"
        holder = StateHolder()
        store = MessageStore(small_config(node_store(cluster, name)), extension_provider=holder.encode)
        raft_index = 0
        for batch_number, batch in enumerate(written):
            raft_index += 1
            store.append(raft_index, batch, batch_stamp(batch_number))
            if extra_apply and extra_apply.get(name) == batch_number:
                raft_index += 1
                store.append(raft_index, batch, batch_stamp(batch_number))
        raft_index = append_features(store, raft_index, defects)
        holder.state = node_state(raft_index, (offsets or {}).get(name))  # the close flushes it
        store.close()
        stores.append(node_store(cluster, name))
    return stores


def history_lines(records: list[StoredMessage], topics: tuple[str, ...] = TOPICS) -> list[dict[str, object]]:
    """A client history of the visible messages of ``topics`` (reconsume times 0), one acknowledged send
    each at the queue offset it holds, sent and acknowledged one after another in log order."""
    lines: list[dict[str, object]] = []
    for number, record in enumerate(r for r in records if r.topic in topics and r.reconsume_times == 0
                                    and r.sys_flag & 0xC not in (TRANSACTION_PREPARED_TYPE, TRANSACTION_ROLLBACK_TYPE)):
        lines.append({"type": "send", "uniq_key": record.property_map["UNIQ_KEY"], "topic": record.topic,
                      "queue": record.queue_id, "queue_offset": record.queue_offset, "acked": True,
                      "send_time": float(number), "end_time": number + 0.5})
    return lines


def segment_size(store: Path) -> int:
    return int(small_config(store).segment_size_bytes)


def records_of(store: Path) -> list[StoredMessage]:
    """Every message record of a store's commit log, in log order (read with the walk, not the store:
    opening a MessageStore would recover, and so change, a damaged directory)."""
    size = segment_size(store)
    found: list[StoredMessage] = []
    for path in sorted((store / "commitlog").iterdir()):
        data = path.read_bytes()
        found.extend(entry.message for entry in walk_segment(data, int(path.name), size) if entry.message is not None)
    return found


def segment_file(store: Path, physical_offset: int) -> Path:
    size = segment_size(store)
    return store / "commitlog" / f"{physical_offset - physical_offset % size:020d}"


def flip_byte(store: Path, physical_offset: int) -> None:
    """Invert every bit of one commit-log byte in place."""
    path = segment_file(store, physical_offset)
    local = physical_offset % segment_size(store)
    with open(path, "r+b") as handle:
        handle.seek(local)
        value = handle.read(1)[0]
        handle.seek(local)
        handle.write(bytes((value ^ 0xFF,)))


def overwrite(path: Path, position: int, data: bytes) -> None:
    with open(path, "r+b") as handle:
        handle.seek(position)
        handle.write(data)


def body_offset(record: StoredMessage) -> int:
    """The physical offset of a record's first body byte."""
    return record.physical_offset + record.total_size - len(record.properties) - 2 - len(record.topic.encode()) - 1 \
        - len(record.body)


def queue_file(store: Path, topic: str, queue_id: int, queue_offset: int) -> tuple[Path, int]:
    """The consume-queue file holding a unit, and the unit's byte position in it."""
    units_per_file = small_config(store).consume_queue_units_per_file
    first = queue_offset - queue_offset % units_per_file
    return store / "consumequeue" / topic / str(queue_id) / f"{first * UNIT_BYTES:020d}", \
        (queue_offset - first) * UNIT_BYTES
