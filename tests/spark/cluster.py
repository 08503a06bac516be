"""Test clusters: the same appends written into several MessageStore directories (no Raft needed), and
the defects the checks must find, injected into the files afterwards."""

from __future__ import annotations

import random
from pathlib import Path

from commitlog.consume_queue import UNIT_BYTES
from commitlog.message import (
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_PREPARED_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
    MessageInput,
    StoredMessage,
)
from commitlog.store import MessageStore
from spark_analytics.walker import walk_segment
from tests.commitlog.helpers import message, small_config

TOPICS = ("TopicTest", "Orders")
QUEUES_PER_TOPIC = 3
BATCHES = 60
BATCH_MESSAGES = 12


def batches(seed: int = 7) -> list[list[MessageInput]]:
    """Deterministic batches: two topics, three queues each, bodies of varied size, a few transaction
    records (prepared, commit, rollback) that are not dispatched or are."""
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
            elif draw < 0.07:
                sys_flag = TRANSACTION_COMMIT_TYPE
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


def build_cluster(cluster: Path, nodes: int = 3, seed: int = 7,
                  extra_apply: dict[str, int] | None = None) -> list[Path]:
    """Write the same batches into ``nodes`` stores under ``cluster`` (``n0/store`` ...). ``extra_apply``
    maps a node to a batch number that node applies twice, as a non-idempotent apply of a replayed entry
    would: its messages are stored twice."""
    written = batches(seed)
    stores = []
    for number in range(nodes):
        name = f"n{number}"
        store = MessageStore(small_config(node_store(cluster, name)))
        raft_index = 0
        for batch_number, batch in enumerate(written):
            raft_index += 1
            store.append(raft_index, batch, batch_stamp(batch_number))
            if extra_apply and extra_apply.get(name) == batch_number:
                raft_index += 1
                store.append(raft_index, batch, batch_stamp(batch_number))
        store.close()
        stores.append(node_store(cluster, name))
    return stores


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
