"""Seeded in-process simulations of a group's replicas (tests/dledger/simulation.py): random committed
commands of every kind, crashes, power losses, wiped replicas restarting from a snapshot, lagging replicas
catching up, entries applied twice; every replica must end byte-identical.

``RAFTMQ_SIM_SEEDS=500`` runs 500 seeds instead of the default; ``RAFTMQ_SIM_SEED=N`` runs seed N alone (a
failure names its seed and step). Each seed takes a fraction of a second."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.transactions import committed_message, op_record
from commitlog.record_codec import decode_record
from commitlog.records import PreparedRecords
from commitlog.sys_flags import TRANSACTION_PREPARED_TYPE
from dledger.catchup import CatchupError
from dledger.command import (
    Command,
    CommandError,
    Messages,
    Retention,
    TransactionAction,
    TransactionOp,
    decode_command,
    encode_command,
    encode_messages_command,
)
from protocol.topics import TRANS_HALF_TOPIC
from tests.dledger.simulation import (
    DEFAULT_SEEDS,
    PRODUCER_GROUP,
    START_MS,
    Divergence,
    Replica,
    Simulation,
    run_simulation,
)

SHARED_MEMORY = Path("/dev/shm")

def seeds() -> list[int]:
    chosen = os.environ.get("RAFTMQ_SIM_SEED")
    if chosen:
        return [int(chosen)]
    return list(range(int(os.environ.get("RAFTMQ_SIM_SEEDS", DEFAULT_SEEDS))))


@pytest.fixture(autouse=True)
def quiet_apply(caplog: pytest.LogCaptureFixture) -> None:
    """Apply logs every no-op and key collision it meets, and a simulation meets many on purpose."""
    caplog.set_level(logging.ERROR)


@pytest.fixture
def directory(tmp_path: Path) -> Iterator[Path]:
    """Where the replicas' stores go: in memory when the machine has a tmpfs (the simulation makes power
    losses itself, so real syncs only cost time), else under pytest's temporary directory."""
    if not SHARED_MEMORY.is_dir():
        yield tmp_path
        return
    made = Path(tempfile.mkdtemp(prefix="raftmq-sim-", dir=SHARED_MEMORY))
    try:
        yield made
    finally:
        shutil.rmtree(made, ignore_errors=True)


def run(simulation: Simulation) -> None:
    simulation.run()


@pytest.mark.parametrize("seed", seeds())
def test_replicas_fed_the_same_log_stay_byte_identical(seed: int, directory: Path) -> None:
    run(Simulation(seed, directory))


@pytest.mark.parametrize("seed", range(3))
def test_five_replicas_stay_byte_identical(seed: int, directory: Path) -> None:
    """Two of five may be down at once."""
    run(Simulation(seed, directory, replicas=5))


def test_a_seed_replays_exactly(directory: Path) -> None:
    first = run_simulation(3, directory / "first")
    second = run_simulation(3, directory / "second")
    assert first.log == second.log
    assert first.history == second.history
    assert first.digest(first.replicas[0]) == second.digest(second.replicas[0])


def stamped_one_later(replica: Replica, raft_index: int, data: bytes) -> bytes:
    """r1's apply reads its own clock: every message it stores is a millisecond later than the leader stamped."""
    if replica.name != "r1":
        return data
    try:
        command = decode_command(data)
    except CommandError:
        return data
    operations = []
    for operation in command.operations:
        if isinstance(operation, Messages):
            operation = Messages(tuple(message._replace(store_timestamp=message.store_timestamp + 1)
                                       for message in operation.messages))
        elif isinstance(operation, PreparedRecords):
            operation = operation._replace(store_timestamp=operation.store_timestamp + 1)
        operations.append(operation)
    return encode_command(Command(tuple(operations)))


def test_a_replica_whose_apply_reads_its_own_clock_is_caught(directory: Path) -> None:
    with pytest.raises(Divergence, match=r"(?s)seed 3, step 40: .* differs between r0 and r1.*RAFTMQ_SIM_SEED=3"):
        run_simulation(3, directory, tamper=stamped_one_later)


class MissedEntry:
    """r1 misses one committed entry that stores messages (the first from index 30 on): it applies it as bytes
    no member can decode, every time it applies it."""

    def __init__(self) -> None:
        self.index: int | None = None

    def __call__(self, replica: Replica, raft_index: int, data: bytes) -> bytes:
        if replica.name != "r1" or raft_index < 30:
            return data
        if self.index is None:
            try:
                operations = decode_command(data).operations
            except CommandError:
                return data
            if any(isinstance(operation, Messages | PreparedRecords) for operation in operations):
                self.index = raft_index
        return b"\x07missed" if raft_index == self.index else data


def test_a_replica_that_misses_an_entry_is_caught(directory: Path) -> None:
    with pytest.raises(Divergence, match=r"seed 3, step 40: .* between r0 and r1"):
        run_simulation(3, directory, tamper=MissedEntry())


def test_a_refused_end_transaction_is_refused_again_after_a_restart(directory: Path) -> None:
    """Found by the seeded runs. A rollback of a half already committed is refused as a no-op on every replica.
    A replica that flushes after it (its checkpoint's state at that index, its store at the last index that
    stored something) and restarts before it stores anything else replays the entry (Raft replays from its
    last snapshot): the store has not applied it, the state has, so apply no longer asks whether the half is
    pending, and stores the rollback's op record on that replica alone (a refused commit's message too, unless
    the UNIQ_KEY dedupe happens to find the first one)."""
    simulation = Simulation(0, directory, steps=0)
    try:
        simulation.propose(encode_messages_command([simulation.message(TRANSACTION_PREPARED_TYPE)], START_MS),
                           "a half message")
        store, _ = simulation.leader.running()
        half = decode_record(store.get_messages(TRANS_HALF_TOPIC, 0, 0, 1).messages[0])
        born_host = half.born_host
        simulation.propose(encode_command(Command((
            Messages((committed_message(half, START_MS + 1), op_record(0, born_host, START_MS + 1))),
            TransactionOp(0, TransactionAction.COMMIT, PRODUCER_GROUP, START_MS + 1)))), "commit half 0")
        simulation.propose(encode_command(Command((
            Messages((op_record(0, born_host, START_MS + 2),)),
            TransactionOp(0, TransactionAction.ROLLBACK, PRODUCER_GROUP, START_MS + 2)))), "roll half 0 back")
        assert simulation.refused_transactions == {3}
        for replica in simulation.replicas:
            simulation.apply_up_to(replica, len(simulation.log))
        restarted = simulation.replicas[1]
        restarted.flush()
        restarted.kill()
        restarted.open()
        store, _ = restarted.running()
        assert restarted.state.applied_index == 3
        restarted.next_index = 2  # Raft replays the entries after its last snapshot
        simulation.check()
    finally:
        simulation.close()


def retain_and_compact(simulation: Simulation, kept_from: int) -> None:
    """The leader's retention below ``kept_from``, applied by every replica, then the leader's snapshot."""
    simulation.propose(encode_command(Command((Retention(kept_from),))), f"retention below {kept_from}")
    for replica in simulation.replicas:
        simulation.apply_up_to(replica, len(simulation.log))
    simulation.capture_snapshot(simulation.leader)


def test_a_replica_restarted_past_retention_numbers_a_queue_as_the_others(directory: Path) -> None:
    """Found by the seeded runs (a wiped replica restarting after retention). A queue's only message is in a
    segment retention deletes; a replica wiped then restarts from the leader's snapshot, copying the commit log
    from the leader's first segment. The queue's next message must take the same queue offset on every replica:
    it is written into the record, whose bytes must be the same (the replica asks the leader where each queue
    continues, dledger/catchup.py)."""
    simulation = Simulation(0, directory, steps=0)
    try:
        lone = ("TopicB", 3)
        simulation.propose_sends([simulation.message(queue=lone)], "the queue's only message")
        store, _ = simulation.leader.running()
        while len(store.commit_log.starts) < 4:  # spread: no queue's first consume-queue file is deleted whole
            filler = ("TopicA", simulation.number % 4)
            simulation.propose_sends([simulation.message(queue=filler)], "another queue's message")
        kept_from = sorted(store.commit_log.starts)[2]
        retain_and_compact(simulation, kept_from)
        wiped = simulation.replicas[2]
        wiped.kill()
        simulation.restart_from_snapshot(wiped)
        simulation.propose_sends([simulation.message(queue=lone)], "the queue's next message")
        for replica in simulation.replicas:
            simulation.apply_up_to(replica, len(simulation.log))
        next_offsets = {replica.name: replica.running()[0].max_queue_offset(*lone) for replica in simulation.replicas}
        assert len(set(next_offsets.values())) == 1, f"the queue's end on each replica: {next_offsets}"
        simulation.check()
    finally:
        simulation.close()


def test_a_replica_restarted_past_retention_copies_a_long_queue(directory: Path) -> None:
    """Found by the seeded runs, as the test above. One queue holds every message; retention keeps only the
    last segment, so the queue's first retained message is files into the queue, and a binary search over
    [0, its end) would first probe a unit below it, whose file the copy never made. A wiped replica restarts
    from the leader's snapshot and holds the queue as the others do. (With the default 300,000 units per file:
    a queue that lost more than that many messages to retention.)"""
    simulation = Simulation(0, directory, steps=0)
    try:
        long_queue = ("TopicA", 0)
        store, _ = simulation.leader.running()
        while len(store.commit_log.starts) < 6:
            simulation.propose_sends([simulation.message(queue=long_queue)], "a message of the long queue")
        kept_from = max(store.commit_log.starts)
        retain_and_compact(simulation, kept_from)
        units_per_file = simulation.config.consume_queue_units_per_file
        first, end = store.min_queue_offset(*long_queue), store.max_queue_offset(*long_queue)
        assert end // 2 < first - first % units_per_file, "the search's first probe is below the copied units' files"
        wiped = simulation.replicas[2]
        wiped.kill()
        simulation.restart_from_snapshot(wiped)
        wiped_store, _ = wiped.running()
        assert (wiped_store.min_queue_offset(*long_queue), wiped_store.max_queue_offset(*long_queue)) == (first, end)
        simulation.check()
    finally:
        simulation.close()


def test_a_replica_restarted_past_retention_continues_a_queue_first_written_after_the_snapshot(
        directory: Path) -> None:
    """A queue whose messages below the retention point are gone and whose next message came after the snapshot
    the wiped replica installs: the copied range holds none of its records, the entry replayed after the
    snapshot stores one, and it takes the offset it took on the others (the leader answers where the queue
    continues with the message already stored: later records do not change that answer)."""
    simulation = Simulation(0, directory, steps=0)
    try:
        lone = ("TopicB", 3)
        simulation.propose_sends([simulation.message(queue=lone)], "the queue's first message")
        simulation.propose_sends([simulation.message(queue=lone)], "the queue's second message")
        store, _ = simulation.leader.running()
        while len(store.commit_log.starts) < 4:
            simulation.propose_sends([simulation.message(queue=("TopicA", 0))], "another queue's message")
        kept_from = sorted(store.commit_log.starts)[2]
        retain_and_compact(simulation, kept_from)
        wiped = simulation.replicas[2]
        wiped.kill()
        simulation.propose_sends([simulation.message(queue=lone)], "the queue's next message, after the snapshot")
        starts = store.queue_starts(kept_from)
        assert starts is not None and starts[lone] == 2
        simulation.restart_from_snapshot(wiped)
        simulation.apply_up_to(wiped, len(simulation.log))
        assert wiped.running()[0].max_queue_offset(*lone) == 3
        simulation.check()
    finally:
        simulation.close()


def test_a_snapshot_from_before_a_retention_is_refused_and_a_newer_one_installed(directory: Path) -> None:
    """A replica that installed a snapshot taken before the last retention copied the commit log from the
    retention point, then replayed the entries between the snapshot and the retention over a store without the
    records below it, which the others held when they applied them: a retried send whose first copy lay below
    it was stored again on that replica alone. Now the copy is refused before anything changes, and the newer
    snapshot (every member compacts its log after a retention) installs as any other."""
    simulation = Simulation(0, directory, steps=0)
    try:
        first = simulation.message(queue=("TopicB", 3))
        simulation.propose_sends([first], "a send")
        store, _ = simulation.leader.running()
        while len(store.commit_log.starts) < 4:
            simulation.propose_sends([simulation.message(queue=("TopicA", 0))], "another queue's message")
        for replica in simulation.replicas:
            simulation.apply_up_to(replica, len(simulation.log))
        simulation.capture_snapshot(simulation.leader)
        simulation.propose_sends([first], "the send retried")
        kept_from = sorted(store.commit_log.starts)[2]
        simulation.propose(encode_command(Command((Retention(kept_from),))), f"retention below {kept_from}")
        for replica in simulation.replicas:
            simulation.apply_up_to(replica, len(simulation.log))
        wiped = simulation.replicas[2]
        wiped.kill()
        with pytest.raises(CatchupError, match="a newer snapshot is needed"):
            simulation.restart_from_snapshot(wiped)
        simulation.capture_snapshot(simulation.leader)
        wiped.kill()
        simulation.restart_from_snapshot(wiped)
        simulation.check()
    finally:
        simulation.close()
