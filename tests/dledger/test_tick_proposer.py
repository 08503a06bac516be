"""Group commit proposed by pysyncobj's tick thread (``proposer = "tick"``, the default): the tick that frees an
in-flight slot takes the next batch and sends it, with no batcher thread between a send and Raft; linger,
pause and the apply timeout keep their meaning; ``proposer = "thread"`` keeps the batcher thread."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from commitlog.config import ConfigError
from commitlog.hosts import encode_host
from commitlog.message import MessageInput
from commitlog.outcomes import AppendResult, AppendStatus
from dledger.apply import ApplyResult
from dledger.command import Command, Messages
from dledger.config import GroupCommitSettings
from dledger.group_commit import GroupCommitter, OutcomeUnknownError
from dledger.member import GroupMember
from tests.dledger.group import SECRET
from tests.support.in_process_group import running_members
from tests.support.process_group import member_configs
from tests.support.waiting import wait_for

STORE = {"segment_size_bytes": 2097152, "body_size_max_bytes": 1048576, "consume_queue_units_per_file": 1000,
         "index_slot_count": 1000, "index_entry_capacity": 4000}


def message(sequence: int) -> MessageInput:
    return MessageInput("Ticked", 0, 0, 0, sequence, encode_host("127.0.0.1", 1), 0, 0, 0, b"%06d" % sequence * 50,
                        b"UNIQ_KEY\x01ticked-%d\x02" % sequence)


class Held:
    """A propose that holds each entry until the test applies it: message n of the log gets offset n."""

    def __init__(self) -> None:
        self.entries: list[tuple[list[MessageInput], Callable[[ApplyResult | None, int], None]]] = []
        self.threads: list[str] = []

    def propose(self, data: bytes, callback: Callable[[ApplyResult | None, int], None], built: Command) -> None:
        (operation,) = built.operations
        assert isinstance(operation, Messages)
        self.entries.append((list(operation.messages), callback))
        self.threads.append(threading.current_thread().name)

    def apply(self, entry: int) -> None:
        messages, callback = self.entries[entry]
        start = sum(len(m) for m, _ in self.entries[:entry])
        results = tuple(AppendResult(AppendStatus.OK, start + i, 0, 1) for i in range(len(messages)))
        callback(ApplyResult(entry + 1, (results,)), 0)


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def ticked(settings: GroupCommitSettings, held: Held, clock: Clock | None = None
           ) -> tuple[GroupCommitter, list[int]]:
    wakes: list[int] = []
    committer = GroupCommitter(settings, held.propose, lambda: (True, None), entry_bytes_max=1 << 20,
                               monotonic=clock or Clock(), wake=lambda: wakes.append(1))
    return committer, wakes


def test_the_owner_of_propose_takes_batches_on_its_tick_and_is_woken_only_for_a_free_slot() -> None:
    held = Held()
    committer, wakes = ticked(GroupCommitSettings(in_flight_entries_max=1), held)
    try:
        assert not any(t.name == "group-commit" for t in threading.enumerate())  # no batcher thread
        first = committer.submit([message(0)])
        assert wakes == [1]  # work, and a free slot: the tick thread is woken
        assert held.entries == []  # nothing proposed until it takes
        committer.take_ready()
        assert len(held.entries) == 1 and held.threads == [threading.current_thread().name]
        later = [committer.submit([message(i)]) for i in range(1, 4)]
        assert wakes == [1]  # the one slot is taken: the apply that frees it takes them, no wake-up
        committer.take_ready()
        assert len(held.entries) == 1  # still in flight
        held.apply(0)
        assert [r.physical_offset for r in first.result(timeout=5)] == [0]
        committer.take_ready()  # the tick that applied the entry takes the next batch: all three in one
        assert [len(m) for m, _ in held.entries] == [1, 3]
        held.apply(1)
        assert [future.result(timeout=5)[0].physical_offset for future in later] == [1, 2, 3]
    finally:
        committer.stop()


def test_a_paused_committer_takes_nothing_and_its_resume_wakes_the_tick_thread() -> None:
    held = Held()
    committer, wakes = ticked(GroupCommitSettings(), held)
    try:
        committer.pause()
        future = committer.submit([message(0)])
        assert wakes == []  # held back: nothing to do for the tick thread
        committer.take_ready()
        assert held.entries == []
        committer.resume()
        assert wakes == [1]
        committer.take_ready()
        held.apply(0)
        assert future.result(timeout=5)[0].physical_offset == 0
    finally:
        committer.stop()


def test_linger_is_kept_from_the_oldest_waiting_send_unless_the_batch_is_full() -> None:
    held = Held()
    clock = Clock()
    committer, _ = ticked(GroupCommitSettings(linger_ms=20, batch_messages_max=4), held, clock)
    try:
        committer.submit([message(0)])
        clock.now += 0.010
        committer.submit([message(1)])
        committer.take_ready()
        assert held.entries == []  # 10 ms of 20
        clock.now += 0.011
        committer.take_ready()  # the oldest waited 21 ms: both go
        assert [len(m) for m, _ in held.entries] == [2]
        for i in range(2, 6):
            committer.submit([message(i)])
        committer.take_ready()  # a full batch does not linger
        assert [len(m) for m, _ in held.entries] == [2, 4]
    finally:
        committer.stop()


def test_an_entry_that_does_not_apply_in_time_fails_with_an_unknown_outcome_on_a_later_tick() -> None:
    held = Held()
    clock = Clock()
    committer, _ = ticked(GroupCommitSettings(apply_timeout_ms=500), held, clock)
    try:
        future = committer.submit([message(0)])
        committer.take_ready()
        clock.now += 0.4
        committer.take_ready()
        assert not future.done()
        clock.now += 0.2
        committer.take_ready(leading=False)  # a member that lost leadership still fails it
        with pytest.raises(OutcomeUnknownError):
            future.result(timeout=0)
        held.apply(0)  # a late apply finds nothing to complete
    finally:
        committer.stop()


def test_the_proposer_setting_is_checked() -> None:
    with pytest.raises(ConfigError, match="proposer"):
        GroupCommitSettings(proposer="loop").validate()


def proposals_threads(member: GroupMember) -> list[tuple[str, bool]]:
    """Record, for each proposal of ``member``, the thread that made it and whether its tick was taking."""
    seen: list[tuple[str, bool]] = []
    raft = member.raft
    propose_raw = raft.propose_raw

    def recording(command: bytes, callback: Callable[[ApplyResult | None, int], None]) -> None:
        seen.append((threading.current_thread().name, raft._taking))
        propose_raw(command, callback)

    raft.propose_raw = recording  # type: ignore[method-assign]
    return seen


@pytest.mark.parametrize("proposer", ["tick", "thread"])
def test_sends_are_proposed_by_the_configured_thread_and_stored_alike_on_every_member(
        tmp_path: Path, proposer: str) -> None:
    configs = member_configs(tmp_path, 3, secret=SECRET,
                             sections={"store": STORE, "group_commit": {"proposer": proposer}})
    with running_members([config.path for config in configs]) as members:
        leader = wait_for(lambda: next((m for m in members if m.is_leader), None), "a leader",
                          timeout_seconds=60)
        wait_for(lambda: leader.write_refusal() is None, "the byte configuration applied", timeout_seconds=30)
        seen = proposals_threads(leader)
        futures = [leader.append([message(i)]) for i in range(200)]
        offsets = [future.result(timeout=60)[0].queue_offset for future in futures]
        assert offsets == list(range(200))
        tick = leader.raft.tick_thread()
        assert tick is not None
        if proposer == "tick":
            assert seen and all(name == tick.name and taking for name, taking in seen), seen[:5]
        else:
            assert seen and all(name == "group-commit" and not taking for name, taking in seen), seen[:5]
        end = leader.store.max_physical_offset
        wait_for(lambda: all(m.store.max_physical_offset == end for m in members),
                 "every member to apply every send", timeout_seconds=30)
        for member in members:
            assert member.store.read_committed(0, end) == leader.store.read_committed(0, end)
