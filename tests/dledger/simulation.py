"""A seeded simulation of a group's replicas in one process: their apply, their stores, their faults.

Each replica is a real :class:`dledger.apply.StateMachine` over a real :class:`commitlog.store.MessageStore`
in a directory of its own, fed through the follower's entrance: ``apply(raft_index, command bytes)``, the
bytes of a committed Raft entry. One ``random.Random(seed)`` decides everything: the commands a leader
proposes (built with the broker's own builders and the command encoders the group committer and the
leader's services use), the group's clock, and the faults. Nothing else varies, so a seed replays exactly.

Raft itself is not simulated: the log is the list of committed entries, and the faults are what a replica
can live through while the log grows: it lags and catches up, its process dies (the page cache survives),
the machine loses power (everything since its last flush is gone), its data directory is wiped (it restarts
from a peer's snapshot and copies the commit log from that peer), it re-applies entries it already applied.

At checkpoints every replica is brought up to the end of the log and all must hold the same bytes: the
commit-log segments, consume queues and key-index files, and the replicated state (offsets, topics,
transactions, timers, pop consumption). A difference names the seed, the step and the recent events, so
``RAFTMQ_SIM_SEED=<seed>`` replays it.
"""

from __future__ import annotations

import dataclasses
import random
import shutil
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Final, NoReturn, cast

import numpy as np

from broker.config import BrokerConfig
from broker.context import BrokerContext
from broker.delay import delivered_message, level_key
from broker.send import SendProcessor
from broker.transactions import committed_message, op_record
from commitlog.config import StoreConfig
from commitlog.consume_queue import UNIT_BYTES
from commitlog.hosts import encode_host
from commitlog.message import MessageInput
from commitlog.record_codec import StoredMessage, decode_record
from commitlog.records import RecordBuilder
from commitlog.store import MessageStore
from commitlog.sys_flags import TRANSACTION_PREPARED_TYPE
from dledger.apply import StateMachine
from dledger.catchup import CatchupServer, fetch
from dledger.command import (
    AclDocument,
    ByteConfig,
    Command,
    ConsumerOffset,
    ConsumerOffsets,
    LeaderStamp,
    Messages,
    Operation,
    PopAck,
    PopChangeInvisible,
    PopReceive,
    PopRevive,
    Retention,
    SubscriptionGroup,
    TimerProgress,
    TimerRelease,
    TopicConfig,
    TransactionAction,
    TransactionOp,
    encode_command,
    encode_messages_command,
    encode_records_command,
)
from dledger.pop import due_entries
from dledger.snapshot import Snapshot, decode_snapshot, encode_snapshot
from dledger.state import TRANSACTION_PROGRESS_KEY, ReplicatedState
from dledger.timers import TIMER_PROGRESS_KEY, TIMER_RELEASE_MAX
from protocol.topics import SCHEDULE_TOPIC, TIMER_TOPIC, TRANS_CHECK_MAX_TIME_TOPIC, TRANS_HALF_TOPIC
from spark_analytics.equality import first_difference
from spark_analytics.replicated_state import ReplicaCheckpoint, compare_states
from tests.commitlog.helpers import data_bytes, small_config

#: seeds `make test` runs; RAFTMQ_SIM_SEEDS=N runs N, RAFTMQ_SIM_SEED=S runs S alone
DEFAULT_SEEDS: Final = 20
STEPS: Final = 120
#: steps between checks of every replica's bytes (and once more at the end)
CHECK_EVERY_STEPS: Final = 40
#: the events a failure report lists (the most recent ones)
HISTORY_SHOWN: Final = 40
TOPICS: Final = ("TopicA", "TopicB")
QUEUES: Final = 4
TAGS: Final = ("TagA", "TagB", "TagC")
PRODUCER_GROUP: Final = "producer-group"
POP_GROUP: Final = "pop-group"
#: deliveries before a popped message goes to the dead-letter queue
POP_ATTEMPTS_MAX: Final = 2
#: the delay levels sends use (of broker.config's defaults: 1 s, 5 s, 10 s)
DELAY_LEVELS: Final = (1, 2, 3)
CATCHUP_SECRET: Final = b"simulation"
START_MS: Final = 1_800_000_000_000


class Divergence(AssertionError):
    """Replicas fed the same log hold different bytes."""


class DurableImageStore(MessageStore):
    """A store that copies its directory after every flush, its own (recovery, retention, a catch-up) or the
    simulation's: the copy is what a power loss leaves, every write since the flush lost. (A preallocation in
    flight, ``*.allocating``, is not a file of the store yet.)"""

    def __init__(self, config: StoreConfig, image_dir: Path, clock: Callable[[], float],
                 extension_provider: Callable[[], bytes], background_flush: bool) -> None:
        self.image_dir = image_dir  # first: opening may flush
        super().__init__(config, clock=clock, extension_provider=extension_provider, background_flush=background_flush)

    def flush(self) -> None:
        super().flush()
        shutil.rmtree(self.image_dir, ignore_errors=True)
        shutil.copytree(self.config.data_dir, self.image_dir, ignore=shutil.ignore_patterns("*.allocating"))


@dataclass
class Replica:
    """One member's apply and store, and what the simulation knows of it."""

    name: str
    root: Path
    config: StoreConfig
    state: ReplicatedState = field(default_factory=ReplicatedState)
    store: MessageStore | None = None
    machine: StateMachine | None = None
    #: the next Raft index this replica applies
    next_index: int = 1
    #: steps it stays down (crashed, powered off or wiped) or lagging; 0: up and applying
    down_steps: int = 0
    lag_steps: int = 0
    #: how it comes back: "crash", "power loss" or "wipe"
    down_kind: str = ""
    #: it copied the commit log from past a peer's retention point: its key-index files begin there, so they
    #: roll at other entries than the others' files, and their entries are compared instead of their bytes
    copied_past_retention: bool = False

    @property
    def store_dir(self) -> Path:
        return self.root / "store"

    @property
    def durable_dir(self) -> Path:
        """The store directory as of its last flush: what a power loss leaves."""
        return self.root / "durable"

    def open(self) -> None:
        """Open the store as a member does: the replicated state comes back from the checkpoint's extension."""
        self.state = ReplicatedState()
        self.store = DurableImageStore(self.config, self.durable_dir, clock=lambda: 0.0,
                                       extension_provider=self._encode_state, background_flush=False)
        if self.store.extension:
            self.state = ReplicatedState.decode(self.store.extension)
        self.machine = StateMachine(self.store, self.state)

    def _encode_state(self) -> bytes:
        return self.state.encode()

    def running(self) -> tuple[MessageStore, StateMachine]:
        store, machine = self.store, self.machine
        assert store is not None and machine is not None, f"{self.name} is down"
        return store, machine

    def flush(self) -> None:
        self.running()[0].flush()

    def kill(self) -> None:
        """What a killed process leaves: no final flush, the page cache intact."""
        store, _ = self.running()
        store.abandon()
        self.store = self.machine = None


def _send_side(config: StoreConfig, broker_config: BrokerConfig, clock: Callable[[], int]) -> SendProcessor:
    """The broker's send processor over what its ``build_message`` reads of a broker: the store's body limit,
    the broker's configuration and the group's clock. Sends are built as the broker builds them."""
    broker = SimpleNamespace(store=SimpleNamespace(config=config), config=broker_config, wall_clock_ms=clock)
    return SendProcessor(cast(BrokerContext, broker))


class Simulation:
    def __init__(self, seed: int, directory: Path, replicas: int = 3, steps: int = STEPS) -> None:
        self.seed = seed
        self.random = random.Random(seed)
        self.steps = steps
        self.step = 0
        self.replicas = [Replica(f"r{number}", directory / f"r{number}",
                                 small_config(directory / f"r{number}" / "store", segment_size_bytes=40 * 1024,
                                              body_size_max_bytes=4096))
                         for number in range(replicas)]
        for replica in self.replicas:
            replica.open()
        self.config = self.replicas[0].config
        #: committed entries: log[i] is Raft index i + 1
        self.log: list[bytes] = []
        self.history: list[str] = []
        self.now_ms = START_MS
        self.term = 1
        self.leader = self.replicas[0]
        self.snapshot: bytes | None = None
        #: the Raft index of the last retention the leader proposed (0: none)
        self.retention_index = 0
        self.broker_config = BrokerConfig("127.0.0.1:10911")
        self.sends = _send_side(self.config, self.broker_config, lambda: self.now_ms)
        self.builder = RecordBuilder(self.config.store_host_bytes, self.config.segment_size_bytes,
                                     self.config.body_size_max_bytes, excluded_topics=(TIMER_TOPIC,))
        #: sends a producer may retry, as the broker built them
        self.sent: list[MessageInput] = []
        self.number = 0
        #: called with (replica, raft index, command bytes) before each apply; may return other bytes
        self.tamper: Callable[[Replica, int, bytes], bytes] | None = None
        #: indexes the leader applied as a no-op because a transaction's half was not pending
        self.refused_transactions: set[int] = set()
        #: (replica, index) of each such entry replayed while the state had applied it and the store had not:
        #: what test_a_refused_end_transaction_is_refused_again_after_a_restart shows diverging

    # ------------------------------------------------------------------------------------ driving

    def run(self) -> None:
        try:
            self.propose(encode_command(Command((ByteConfig.of(self.config),))), "byte configuration")
            for step in range(1, self.steps + 1):
                self.step = step
                self._fault()
                self._propose_something()
                self._advance()
                if self.step % CHECK_EVERY_STEPS == 0:
                    self.check()
            self.check()
        finally:
            self.close()

    def close(self) -> None:
        for replica in self.replicas:
            if replica.store is not None:
                replica.store.close()
                replica.store = replica.machine = None

    def note(self, event: str) -> None:
        self.history.append(f"step {self.step}: {event}")

    def propose(self, data: bytes, what: str) -> None:
        """A committed entry: the leader applies it at once (it proposed it), followers when they advance."""
        self.log.append(data)
        self.note(f"index {len(self.log)}: {what}")
        self.apply_up_to(self.leader, len(self.log))
        noops = self.leader.running()[1].noops
        if noops and noops[-1][0] == len(self.log) and "is not pending" in noops[-1][1]:
            self.refused_transactions.add(len(self.log))

    def apply_up_to(self, replica: Replica, last_index: int) -> None:
        _, machine = replica.running()
        while replica.next_index <= last_index:
            index = replica.next_index
            data = self.log[index - 1]
            if self.tamper is not None:
                data = self.tamper(replica, index, data)
            machine.apply(index, data)
            replica.next_index = index + 1

    def _advance(self) -> None:
        for replica in self.replicas:
            if replica.down_steps:
                replica.down_steps -= 1
                if not replica.down_steps:
                    self._restart(replica)
                continue
            if replica.lag_steps:
                replica.lag_steps -= 1
                continue
            # a follower applies what it has heard of so far: sometimes not yet the last entry
            self.apply_up_to(replica, len(self.log) - self.random.choice((0, 0, 0, 1, 2)))

    # ------------------------------------------------------------------------------------ faults

    def _fault(self) -> None:
        roll = self.random.random()
        if roll > 0.2:
            return
        up = [replica for replica in self.replicas if replica.store is not None]
        followers = [replica for replica in up if replica is not self.leader]
        target = self.random.choice(up)
        kinds = ["flush", "flush", "reapply", "snapshot", "leader change", "lag"]
        if len(self.replicas) - len(up) < (len(self.replicas) - 1) // 2:  # a majority stays up
            kinds += ["crash", "crash", "power loss", "power loss", "wipe"]
        kind = self.random.choice(kinds)
        if kind == "flush":
            target.flush()
            self.note(f"{target.name} flushes")
        elif kind == "reapply":
            self._reapply(target)
        elif kind == "snapshot":
            self.capture_snapshot(self.leader)
        elif kind == "leader change" and followers:
            self._change_leader(self.random.choice(followers))
        elif kind == "lag" and followers:
            lagging = self.random.choice(followers)
            lagging.lag_steps = self.random.randint(1, 15)
            self.note(f"{lagging.name} lags for {lagging.lag_steps} steps")
        elif kind in ("crash", "power loss", "wipe"):
            if kind == "wipe" and self.snapshot is None:
                kind = "crash"
            if target is self.leader:
                self._change_leader(self.random.choice(followers))
            target.kill()
            target.down_kind = kind
            target.down_steps = self.random.randint(1, 12)
            self.note(f"{target.name} goes down ({kind}) for {target.down_steps} steps")

    def _restart(self, replica: Replica) -> None:
        kind = replica.down_kind
        if kind == "wipe":
            assert self.snapshot is not None
            if decode_snapshot(self.snapshot).index < self.retention_index:
                # a snapshot from before the last retention: replaying the entries in between over a copy that
                # starts at the retention point dedupes otherwise than the others did (they still held the
                # records below it), what test_a_replica_restarted_from_a_snapshot_older_than_the_retention_*
                # shows: the seeds have the leader compact after the retention instead
                self.capture_snapshot(self.leader)
            self.restart_from_snapshot(replica)
        else:
            if kind == "power loss":
                shutil.rmtree(replica.store_dir)
                if replica.durable_dir.exists():
                    shutil.copytree(replica.durable_dir, replica.store_dir)
            replica.open()
            store, _ = replica.running()
            # Raft replays its journal from its last snapshot, at or before what the store and state hold;
            # apply skips what they already have
            recovered = min(store.applied_raft_index, replica.state.applied_index)
            replica.next_index = self.random.randint(max(1, recovered - 5), recovered + 1)
        store, _ = replica.running()
        self.note(f"{replica.name} restarts after a {kind}: store at index {store.applied_raft_index}, "
                  f"state at {replica.state.applied_index}, replaying from {replica.next_index}")
        replica.down_kind = ""

    def _reapply(self, replica: Replica) -> None:
        """An entry applied again (a replayed journal, a retried apply) changes nothing."""
        if replica.next_index <= 1:
            return
        index = self.random.randint(1, replica.next_index - 1)
        _, machine = replica.running()
        before = self.digest(replica)
        machine.apply(index, self.log[index - 1])
        after = self.digest(replica)
        self.note(f"{replica.name} applies index {index} again")
        self._compare(replica.name, before, f"{replica.name} after re-applying index {index}", after)

    def _change_leader(self, replica: Replica) -> None:
        self.apply_up_to(replica, len(self.log))  # a leader has applied everything committed before it leads
        self.leader = replica
        self.term += 1
        # the new leader's clock may be behind the old one's: what it stamps is floored by apply
        self.now_ms -= self.random.randint(0, 800)
        self.propose(encode_command(Command((LeaderStamp(self.term, replica.name, self.now_ms),))),
                     f"{replica.name} leads term {self.term}")

    def capture_snapshot(self, replica: Replica) -> None:
        """Log compaction as a member makes it: the store flushed (its checkpoint covers the index), then
        the commit log's range and the replicated state, at the last applied index."""
        replica.flush()
        store, _ = replica.running()
        index = replica.next_index - 1
        self.snapshot = encode_snapshot(Snapshot(
            last_entry=(self.log[index - 1], index, self.term), previous_entry=(b"", index - 1, self.term),
            commit_log_min=store.commit_log.min_offset, commit_log_end=store.max_physical_offset,
            members=tuple(peer.name for peer in self.replicas), state=replica.state.encode()))
        self.note(f"{replica.name} captures a snapshot at index {index}")

    def restart_from_snapshot(self, replica: Replica) -> None:
        """A replica whose data directory was wiped starts empty and installs the leader's last snapshot, as a
        member does: the commit-log bytes it lacks copied from a peer (dledger.catchup, over loopback), then
        the snapshot's state; Raft goes on after the snapshot's index."""
        assert self.snapshot is not None
        shutil.rmtree(replica.root)
        replica.open()
        snapshot = decode_snapshot(self.snapshot)
        store, _ = replica.running()
        if store.applied_raft_index < snapshot.index:
            server = CatchupServer(("127.0.0.1", 0), CATCHUP_SECRET, self.leader.running()[0])
            try:
                fetch([server.address], CATCHUP_SECRET, store, snapshot.commit_log_end, snapshot.index,
                      snapshot.commit_log_min)
            finally:
                server.listener.shutdown(socket.SHUT_RDWR)  # wakes its accept at once: close waits for a timeout
                server.close()
        replica.copied_past_retention = store.commit_log.min_offset > 0
        if replica.state.applied_index < snapshot.index:
            installed = ReplicatedState.decode(snapshot.state)
            for state_field in dataclasses.fields(ReplicatedState):
                setattr(replica.state, state_field.name, getattr(installed, state_field.name))
            store.flush()
        replica.next_index = snapshot.index + 1

    # ------------------------------------------------------------------------------------ checking

    def digest(self, replica: Replica) -> dict[str, bytes]:
        """The replica's data files and its replicated state. A file's trailing zeros are left out: segments,
        consume-queue and key-index files are preallocated whole, and when the next one is allocated (in the
        background, ahead of need) is each store's own affair; the bytes written are the replicated ones.

        While it runs, consume-queue units below their queue's first offset are left out too (a replica that
        copied the commit log from past a retention point never had them; the others keep the files that
        hold them), and each queue's range and the key-index entries that point into the commit log are
        added (what :meth:`check` compares instead of the key-index files of such a replica)."""
        store = replica.store
        files = {name: (data if store is None else _queue_units_kept(store, name, data)).rstrip(b"\0")
                 for name, data in data_bytes(replica.store_dir).items()}
        digest = {name: data for name, data in files.items() if data}
        digest["(replicated state)"] = replica.state.encode()
        if store is not None:
            digest["(consume-queue ranges)"] = repr([
                (topic, queue_id, store.min_queue_offset(topic, queue_id), store.max_queue_offset(topic, queue_id))
                for topic, queue_id in store.queue_ids() if store.max_queue_offset(topic, queue_id) > 0]).encode()
            entries = [index_file.stored_columns() for index_file in store.index.files]
            kept = [np.stack([part.hashes, part.physicals, part.timestamps])[:, part.physicals >= store.state.min_offset]
                    for part in entries]
            digest["(key-index entries)"] = np.concatenate(kept, axis=1).tobytes() if kept else b""
        return digest

    def check(self) -> None:
        """Every replica up and at the end of the log, then byte for byte the same."""
        for replica in self.replicas:
            if replica.store is None:
                replica.down_steps = 0
                self._restart(replica)
            replica.lag_steps = 0
            self.apply_up_to(replica, len(self.log))
        self.note(f"check at index {len(self.log)}")
        reference = self.replicas[0]
        expected = self.digest(reference)
        for replica in self.replicas[1:]:
            if replica.state.encode() != reference.state.encode():  # named entry by entry, as verify names them
                result = compare_states([ReplicaCheckpoint(peer.name, None, peer.state)
                                         for peer in (reference, replica)])
                self.fail(f"the replicated state differs between {reference.name} and {replica.name}: "
                          f"{result.differences}")
            ours, theirs = expected, self.digest(replica)
            if reference.copied_past_retention or replica.copied_past_retention:
                ours, theirs = _without_key_index_files(ours), _without_key_index_files(theirs)
            self._compare(reference.name, ours, replica.name, theirs)

    def _compare(self, expected_name: str, expected: dict[str, bytes], actual_name: str,
                 actual: dict[str, bytes]) -> None:
        for name in sorted(expected.keys() | actual.keys()):
            ours, theirs = expected.get(name), actual.get(name)
            if ours == theirs:
                continue
            if ours is None or theirs is None:
                self.fail(f"{name} is only on {expected_name if theirs is None else actual_name}")
            at = first_difference(ours, theirs)
            self.fail(f"{name} differs between {expected_name} and {actual_name} at byte {at} "
                      f"(lengths {len(ours)} and {len(theirs)})")

    def fail(self, problem: str) -> NoReturn:
        recent = "\n  ".join(self.history[-HISTORY_SHOWN:])
        raise Divergence(f"seed {self.seed}, step {self.step}: {problem}\n"
                         f"replay with RAFTMQ_SIM_SEED={self.seed}; the last events:\n  {recent}")

    # ------------------------------------------------------------------------------------ commands

    def _propose_something(self) -> None:
        self.now_ms += self.random.choice((0, 1, 7, 250, 1000, 3000))
        if self.random.random() < 0.02:
            self.now_ms += 130_000  # past the UNIQ_KEY window: a retry now is a new message
        weighted: tuple[tuple[int, Callable[[], None]], ...] = (
            (20, self._send), (8, self._batch), (6, self._retry), (4, self._delay), (4, self._timer),
            (3, self._release_timers), (3, self._deliver_delays), (4, self._prepare), (4, self._end_transaction),
            (2, self._check_transaction), (5, self._offsets), (1, self._topic), (8, self._pop), (2, self._retention),
            (2, self._other))
        self.random.choices([action for _, action in weighted], weights=[weight for weight, _ in weighted])[0]()

    def message(self, transaction: int = 0, queue: tuple[str, int] | None = None, **properties: str) -> MessageInput:
        """A producer's send, built as the broker builds it (its UNIQ_KEY, tags and keys as a client sets them);
        ``transaction``: TRANSACTION_PREPARED_TYPE for a transaction's half message; ``queue``: (topic, queue id),
        else one at random."""
        self.number += 1
        topic, queue_id = self.random.choice(TOPICS), self.random.randrange(QUEUES)
        if queue is not None:
            topic, queue_id = queue
        values = {"UNIQ_KEY": f"{self.random.getrandbits(128):032X}", "WAIT": "true",
                  "TAGS": self.random.choice(TAGS), "KEYS": f"order-{self.random.randrange(50)}"}
        values.update(properties)
        size = self.random.choice((8, 100, 700, 3000))
        body = (self.random.randbytes(size) if self.random.random() < 0.5
                else f"body {self.number} ".encode() * (size // 10 + 1))
        return self.sends.build_message(
            topic, queue_id, 0, transaction,
            self.now_ms - self.random.randrange(50), encode_host("192.168.0.10", 40_000 + self.number % 7), body,
            values, 0, transaction, PRODUCER_GROUP)

    def propose_sends(self, messages: list[MessageInput], what: str) -> None:
        """As the group committer proposes sends: one stamp for all, as prepared records when they can be,
        else as messages."""
        store_timestamp = self.now_ms
        self.sent.extend(messages)
        records = self.builder.build(messages, store_timestamp) if self.random.random() < 0.6 else None
        if records is not None:
            self.propose(encode_records_command(records), f"{what} as records")
        else:
            self.propose(encode_messages_command(messages, store_timestamp), f"{what} as messages")

    def _send(self) -> None:
        self.propose_sends([self.message()], "a send")

    def _batch(self) -> None:
        messages = [self.message() for _ in range(self.random.randint(2, 12))]
        if self.random.random() < 0.5:
            messages.append(self.random.choice(messages))  # a message twice in one batch
        self.propose_sends(messages, f"a batch of {len(messages)}")

    def _retry(self) -> None:
        """A producer's retry: the same message again (a duplicate), or, rarely, another content under an
        earlier UNIQ_KEY (a key collision, stored as a new message)."""
        if not self.sent:
            return self._send()
        earlier = self.random.choice(self.sent[-40:])
        if self.random.random() < 0.2:
            earlier = earlier._replace(body=earlier.body + b"!")
            return self.propose_sends([earlier], "a send reusing an earlier UNIQ_KEY")
        return self.propose_sends([earlier], "a retried send")

    def _delay(self) -> None:
        self.propose_sends([self.message(DELAY=str(self.random.choice(DELAY_LEVELS)))], "a send with a delay level")

    def _timer(self) -> None:
        self.propose_sends([self.message(TIMER_DELAY_SEC=str(self.random.randint(2, 20)))], "a timed send")

    def _release_timers(self) -> None:
        """As the leader's timer service: release the timers due up to a second, from a position in it."""
        progress = self.leader.state.timer_progress.get(TIMER_PROGRESS_KEY)
        now_second = self.now_ms // 1000
        if progress is None or progress >= now_second:
            return self._send()
        second = self.random.randint(progress + 1, now_second)
        start = self.random.choice((0, 0, 0, TIMER_RELEASE_MAX))
        self.propose(encode_command(Command((TimerRelease(second, start),))),
                     f"release timers due by second {second} from {start}")

    def _deliver_delays(self) -> None:
        """As the leader's delay service: a level's due messages and its new progress, in one command."""
        store, _ = self.leader.running()
        level = self.random.choice(DELAY_LEVELS)
        delay_ms = self.broker_config.delay_levels_seconds[level - 1] * 1000
        progress = max(self.leader.state.timer_progress.get(level_key(level), 0),
                       store.min_queue_offset(SCHEDULE_TOPIC, level - 1))
        result = store.get_messages(SCHEDULE_TOPIC, level - 1, progress, 8)
        delivered: list[MessageInput] = []
        next_offset = progress
        for offset, raw in zip(result.queue_offsets, result.messages, strict=True):
            stored = decode_record(raw)
            if stored.store_timestamp + delay_ms > self.now_ms:
                break
            message = delivered_message(stored, self.now_ms)
            if message is not None:
                delivered.append(message)
            next_offset = offset + 1
        if next_offset == progress:
            return self._send()
        operations: tuple[Operation, ...] = (TimerProgress(level_key(level), next_offset),)
        if delivered:
            operations = (Messages(tuple(delivered)), *operations)
        self.propose(encode_command(Command(operations)), f"deliver level {level} up to {next_offset}")

    def _prepare(self) -> None:
        self.propose_sends([self.message(TRANSACTION_PREPARED_TYPE)], "a transaction's half message")

    def _half(self) -> tuple[int, StoredMessage] | None:
        """A half message the leader holds (pending or not: a second END_TRANSACTION is a no-op)."""
        store, _ = self.leader.running()
        low = store.min_queue_offset(TRANS_HALF_TOPIC, 0)
        end = store.max_queue_offset(TRANS_HALF_TOPIC, 0)
        if end <= low:
            return None
        offset = self.random.randrange(max(low, end - 6), end)
        result = store.get_messages(TRANS_HALF_TOPIC, 0, offset, 1)
        if not result.messages:
            return None
        return result.queue_offsets[0], decode_record(result.messages[0])

    def _end_transaction(self) -> None:
        """END_TRANSACTION as the broker proposes it: commit (the real message and the op record) or rollback."""
        found = self._half()
        if found is None:
            return self._prepare()
        offset, half = found
        born_host = encode_host("10.1.2.3", 10911)
        if self.random.random() < 0.6:
            messages: tuple[MessageInput, ...] = (committed_message(half, self.now_ms),
                                                  op_record(offset, born_host, self.now_ms))
            action = TransactionAction.COMMIT
        else:
            messages, action = (op_record(offset, born_host, self.now_ms),), TransactionAction.ROLLBACK
        self.propose(encode_command(Command((Messages(messages),
                                             TransactionOp(offset, action, PRODUCER_GROUP, self.now_ms)))),
                     f"{action.name.lower()} half {offset}")

    def _check_transaction(self) -> None:
        """The leader's check-back: a counted check, a discard, or the progress past resolved halves."""
        found = self._half()
        if found is None:
            return self._prepare()
        offset, half = found
        choice = self.random.random()
        if choice < 0.5:
            operations: tuple[Operation, ...] = (TransactionOp(offset, TransactionAction.CHECK, PRODUCER_GROUP,
                                                               self.now_ms),)
        elif choice < 0.7:
            discarded = MessageInput(TRANS_CHECK_MAX_TIME_TOPIC, 0, half.flag, half.sys_flag, half.born_timestamp,
                                     half.born_host, self.now_ms, half.reconsume_times, half.physical_offset,
                                     half.body, half.properties)
            operations = (Messages((discarded, op_record(offset, encode_host("10.1.2.3", 10911), self.now_ms))),
                          TransactionOp(offset, TransactionAction.DISCARD, PRODUCER_GROUP, self.now_ms))
        else:
            state = self.leader.state
            pending = [half for half in range(state.transaction_progress, offset + 1)
                       if half not in state.transactions_resolved]
            operations = (TimerProgress(TRANSACTION_PROGRESS_KEY, pending[0] if pending else offset + 1),)
        self.propose(encode_command(Command(operations)), f"check-back of half {offset}")

    def _offsets(self) -> None:
        offsets = tuple(ConsumerOffset(self.random.choice(("g1", "g2")), self.random.choice(TOPICS),
                                       self.random.randrange(QUEUES), self.random.randrange(100))
                        for _ in range(self.random.randint(1, 4)))
        self.propose(encode_command(Command((ConsumerOffsets(offsets),))), "consumer offsets")

    def _topic(self) -> None:
        operation: Operation
        if self.random.random() < 0.5:
            operation = TopicConfig(self.random.choice(TOPICS), QUEUES, QUEUES, 6)
        else:
            operation = SubscriptionGroup(POP_GROUP, retry_max_times=POP_ATTEMPTS_MAX - 1,
                                          consume_orderly=self.random.random() < 0.3)
        self.propose(encode_command(Command((operation,))), f"configuration {operation}")

    def _pop(self) -> None:
        """The leader's pop service: a receive, an ack (or a dead-letter forward), a new invisible time, a revive."""
        store, _ = self.leader.running()
        queues = self.leader.state.pop_queues
        topic, queue_id = self.random.choice(TOPICS), self.random.randrange(QUEUES)
        queue = queues.get((POP_GROUP, topic, queue_id))
        in_flight = sorted(queue.in_flight.items()) if queue is not None else []
        choice = self.random.random()
        operation: PopReceive | PopAck | PopChangeInvisible | PopRevive
        if choice < 0.4 or not in_flight:
            cursor = queue.cursor if queue is not None else store.min_queue_offset(topic, queue_id)
            offsets = [offset for offset, entry in in_flight if entry.revived][:4]
            result = store.get_messages(topic, queue_id, cursor, 4 - len(offsets))
            offsets.extend(result.queue_offsets)
            scan_end = max(cursor, result.next_begin_offset)
            if not offsets and scan_end == cursor:
                return self._send()
            operation = PopReceive(POP_GROUP, topic, queue_id, cursor, scan_end, tuple(sorted(offsets)),
                                   self.now_ms + self.random.choice((1000, 5000, 30_000)), fifo=False)
        elif choice < 0.8:
            offset, entry = self.random.choice(in_flight)
            handle_id = entry.handle_id + (1 if self.random.random() < 0.1 else 0)  # sometimes a stale handle
            if choice < 0.6:
                operation = PopAck(POP_GROUP, topic, queue_id, offset, handle_id,
                                   dead_letter=self.random.random() < 0.3, timestamp=self.now_ms)
            else:
                operation = PopChangeInvisible(POP_GROUP, topic, queue_id, offset, handle_id,
                                               self.now_ms + 2000, keep_handle=self.random.random() < 0.5)
        else:
            due = [offsets for key, offsets in due_entries(queues, self.now_ms) if key == (POP_GROUP, topic, queue_id)]
            if not due:
                return self._send()
            operation = PopRevive(POP_GROUP, topic, queue_id, tuple(due[0]), self.now_ms, POP_ATTEMPTS_MAX)
        self.propose(encode_command(Command((operation,))), f"{type(operation).__name__} of {topic}/{queue_id}")

    def _retention(self) -> None:
        """As the leader's retention service: delete whole segments below one it keeps."""
        store, _ = self.leader.running()
        starts = sorted(store.commit_log.starts)
        if len(starts) < 3:
            return self._send()
        self.propose(encode_command(Command((Retention(starts[1]),))), f"retention below {starts[1]}")
        self.retention_index = len(self.log)

    def _other(self) -> None:
        """What else reaches the log: an ACL document, or bytes no member can decode (a recorded no-op)."""
        if self.random.random() < 0.5:
            self.propose(encode_command(Command((AclDocument(b'{"accounts": []}'),))), "an ACL document")
        else:
            self.propose(b"\x07not a command", "undecodable bytes")


def _without_key_index_files(digest: dict[str, bytes]) -> dict[str, bytes]:
    return {name: data for name, data in digest.items() if not name.startswith("index/")}


def _queue_units_kept(store: MessageStore, name: str, data: bytes) -> bytes:
    """``data`` of the file ``name``; for a consume-queue file, its units below the queue's first offset zeroed."""
    parts = name.split("/")
    if parts[0] != "consumequeue":
        return data
    _, topic, queue_id, file_name = parts
    below = store.min_queue_offset(topic, int(queue_id)) - int(file_name) // UNIT_BYTES
    return data if below <= 0 else bytes(min(len(data), below * UNIT_BYTES)) + data[below * UNIT_BYTES:]


def run_simulation(seed: int, directory: Path, tamper: Callable[[Replica, int, bytes], bytes] | None = None,
                   replicas: int = 3) -> Simulation:
    simulation = Simulation(seed, directory, replicas)
    simulation.tamper = tamper
    simulation.run()
    return simulation
