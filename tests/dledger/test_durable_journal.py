"""An entry counts as held by a member only once its Raft journal is flushed with it: a follower flushes
(on its flusher thread) before it answers success, the leader before it counts itself, every member before
it applies; term and vote are stored durably. On real RaftNodes over our segmented journal (no network),
so a pysyncobj upgrade that stops calling our hooks fails here."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from pysyncobj import SyncObj, SyncObjConf
from pysyncobj.node import TCPNode

from dledger.journal import SegmentedJournal
from dledger.raft_node import RAW_COMMAND_PREFIX, RaftNode
from dledger.snapshot import Snapshot, encode_snapshot
from tests.dledger.test_log_matching import (
    LEADER,
    NO_OP,
    OTHER,
    SELF,
    RecordingTransport,
    StubMember,
    append,
    entries,
    load_snapshot,
    write_snapshot,
)

#: events are recorded under it, the flusher thread's and the tick thread's alike
ORDER = threading.Lock()
#: what happened, in order: ("flush", last index flushed), ("send", message type, success),
#: ("apply", index, whether the journal had unflushed records then)
Events = list[tuple[Any, ...]]


class RecordingMember(StubMember):
    def __init__(self, events: Events) -> None:
        self.events = events
        self.raft: RaftNode | None = None

    def apply_raw(self, raft_index: int, command: bytes) -> None:
        assert self.raft is not None
        journal = self.raft._SyncObj__raftLog
        with ORDER:
            self.events.append(("apply", raft_index, journal.sync_enabled and raft_index > journal.durable_index))


@contextmanager
def node(tmp_path: Path, events: Events, peers: list[str], monkeypatch: pytest.MonkeyPatch,
         durable: bool = True) -> Iterator[RaftNode]:
    make_durable = SegmentedJournal.make_durable

    def flush(journal: SegmentedJournal) -> None:
        # recorded under ORDER as the durable index it reached: what the tick thread does once it sees that
        # index (send, apply) is recorded after it
        with ORDER:
            before = journal.durable_index
            make_durable(journal)
            if journal.durable_index > before:
                events.append(("flush", journal.durable_index))

    monkeypatch.setattr(SegmentedJournal, "make_durable", flush)
    flush_unless_busy = SegmentedJournal.make_durable_unless_busy

    def flush_here(journal: SegmentedJournal) -> bool:  # the tick thread's own flush, recorded alike
        with ORDER:
            before = journal.durable_index
            flushed = flush_unless_busy(journal)
            if journal.durable_index > before:
                events.append(("flush", journal.durable_index))
        return flushed

    monkeypatch.setattr(SegmentedJournal, "make_durable_unless_busy", flush_here)
    conf = SyncObjConf(autoTick=False, journalFile=str(tmp_path / "journal"), fullDumpFile=str(tmp_path / "snapshot"),
                       deserializer=load_snapshot, serializer=write_snapshot, logCompactionMinEntries=1 << 30,
                       logCompactionMinTime=1 << 30, raftMinTimeout=0.01, raftMaxTimeout=0.02,
                       appendEntriesPeriod=0.002)
    stub = RecordingMember(events)
    raft = RaftNode(stub, SELF, peers, conf, RecordingTransport, durable_journal=durable)  # type: ignore[arg-type]
    stub.raft = raft
    transport: RecordingTransport = raft._SyncObj__transport
    send = transport.send

    def recorded_send(to: Any, message: Any) -> bool:
        with ORDER:
            events.append(("send", message["type"], message.get("success")))
        return bool(send(to, message))

    monkeypatch.setattr(transport, "send", recorded_send)
    try:
        raft.doTick(0)  # the first tick starts the flusher thread
        raft._SyncObj__raftLog.make_durable()  # pysyncobj's first entry
        flusher = raft._flusher  # (none for the page-cache policy)
        if flusher is not None:
            cycles = flusher.cycles
            flusher.request()  # one whole cycle, then nothing pending: no flush runs unasked during the test
            deadline = time.monotonic() + 10
            while (flusher.cycles == cycles or flusher.pending) and time.monotonic() < deadline:
                raft.doTick(0.001)
        events[:] = [event for event in events if event != ("flush", 1)]
        yield raft
    finally:
        raft.destroy()


def tick_until(raft: RaftNode, events: Events, event: tuple[Any, ...], timeout_seconds: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_seconds
    while event not in events and time.monotonic() < deadline:
        raft.doTick(0.01)
    assert event in events, events


def test_a_follower_flushes_its_journal_before_it_answers_success(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    events: Events = []
    with node(tmp_path, events, [LEADER, OTHER], monkeypatch) as follower:
        follower._SyncObj__onMessageReceived(TCPNode(LEADER), append((1, 0), entries(2, 4, 1), 1))
        tick_until(follower, events, ("send", "next_node_idx", True))
        assert events == [("flush", 4), ("send", "next_node_idx", True)]
        events.clear()
        # entries already held: nothing new to flush, the answer goes at once
        follower._SyncObj__onMessageReceived(TCPNode(LEADER), append((1, 0), entries(2, 4, 1), 1))
        assert events == [("send", "next_node_idx", True)]
        events.clear()
        # a conflicting tail is cut and replaced: the new entry is flushed before it is claimed
        follower._SyncObj__onMessageReceived(TCPNode(LEADER), append((2, 1), entries(3, 3, 2), 1, term=2))
        tick_until(follower, events, ("send", "next_node_idx", True))
        assert events == [("flush", 3), ("send", "next_node_idx", True)]


def test_with_its_flusher_idle_a_follower_flushes_and_answers_at_once(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """No thread hand-off when the flusher has nothing to do: the tick thread flushes the entries it just
    appended and answers in the same step (before, the answer waited for the flusher thread and a wake-up)."""
    events: Events = []
    with node(tmp_path, events, [LEADER, OTHER], monkeypatch) as follower:
        assert follower._flusher is not None and not follower._flusher.pending
        follower._SyncObj__onMessageReceived(TCPNode(LEADER), append((1, 0), entries(2, 4, 1), 1))
        assert events == [("flush", 4), ("send", "next_node_idx", True)]  # no tick in between
        assert follower._SyncObj__raftLog.durable_index == 4 and not follower._pending_replies


def slow_flushes(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """Flushes wait until the event returned is set (a disk that is busy)."""
    release = threading.Event()
    flush = SegmentedJournal.make_durable

    def slow_flush(journal: SegmentedJournal) -> None:
        release.wait(10)
        flush(journal)

    monkeypatch.setattr(SegmentedJournal, "make_durable", slow_flush)
    # a busy disk: the tick thread does not flush itself either, it leaves it to the flusher
    monkeypatch.setattr(SegmentedJournal, "make_durable_unless_busy", lambda journal: False)
    return release


def test_a_follower_goes_on_receiving_while_its_flusher_syncs(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The flush runs on the flusher thread: the tick thread takes the next entries meanwhile, and the
    replies claim only what the flush covered."""
    events: Events = []
    with node(tmp_path, events, [LEADER, OTHER], monkeypatch) as follower:
        release = slow_flushes(monkeypatch)
        follower._SyncObj__onMessageReceived(TCPNode(LEADER), append((1, 0), entries(2, 4, 1), 1))
        follower._SyncObj__onMessageReceived(TCPNode(LEADER), append((4, 1), entries(5, 9, 1), 1))
        follower.doTick(0)
        assert follower._SyncObj__raftLog.last_index == 9  # both taken while the disk was busy
        assert ("send", "next_node_idx", True) not in events  # nothing claimed before it is on disk
        release.set()
        tick_until(follower, events, ("send", "next_node_idx", True))
        transport: RecordingTransport = follower._SyncObj__transport
        replies = [message["next_node_idx"] for _, message in transport.sent if message["type"] == "next_node_idx"]
        assert replies[-1] == 10 and follower._SyncObj__raftLog.durable_index >= 9


def test_a_held_back_reply_is_dropped_when_its_entries_are_cut(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A reply waiting for the flush must not claim entries that a newer leader replaced meanwhile."""
    events: Events = []
    with node(tmp_path, events, [LEADER, OTHER], monkeypatch) as follower:
        release = slow_flushes(monkeypatch)
        follower._SyncObj__onMessageReceived(TCPNode(LEADER), append((1, 0), entries(2, 4, 1), 1))
        # a leader of term 2 replaces 3-4 before the flush of term 1's entries finished
        follower._SyncObj__onMessageReceived(TCPNode(OTHER), append((2, 1), entries(3, 3, 2), 1, term=2))
        release.set()
        tick_until(follower, events, ("send", "next_node_idx", True))
        transport: RecordingTransport = follower._SyncObj__transport
        replies = [(str(to), message["next_node_idx"]) for to, message in transport.sent
                   if message["type"] == "next_node_idx" and message["success"]]
        assert (LEADER, 5) not in replies  # the old leader is never told 3-4 of term 1 are held
        assert replies == [(OTHER, 4)]


def test_every_applied_entry_was_flushed_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    events: Events = []
    with node(tmp_path, events, [LEADER, OTHER], monkeypatch) as follower:
        journal = follower._SyncObj__raftLog
        for index in (2, 3):  # written by a path that answers nothing (as a snapshot install writes)
            journal.add(RAW_COMMAND_PREFIX + b"x", index, 1)
        follower._SyncObj__raftCommitIndex = 3
        tick_until(follower, events, ("apply", 3, False))
        # a flush came first (the flusher may cover 2 alone, then 3), and each entry was on disk when it
        # applied (the event's last field: beyond the durable index)
        assert events[0][0] == "flush", events
        applied = [event for event in events if event[0] == "apply"]
        assert applied == [("apply", 2, False), ("apply", 3, False)]


def test_a_leader_counts_itself_toward_a_majority_only_for_entries_on_its_disk(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The leader's flush runs on its flusher thread (its tick thread goes on meanwhile): a follower's
    success for entries the leader has not flushed yet is not a majority with the leader's own copy."""
    events: Events = []
    with node(tmp_path, events, [LEADER, OTHER], monkeypatch) as leader:
        leader._SyncObj__setCurrentTerm(1, None)
        leader._SyncObj__onBecomeLeader()  # appends the term's no-op (index 2)
        deadline = time.monotonic() + 10
        while leader._SyncObj__raftLog.durable_index < 2 and time.monotonic() < deadline:
            leader.doTick(0.001)
        release = slow_flushes(monkeypatch)  # the disk gets busy
        leader.propose_raw(RAW_COMMAND_PREFIX + b"one", lambda result, error: None)
        leader.propose_raw(RAW_COMMAND_PREFIX + b"two", lambda result, error: None)
        leader.doTick(0)
        assert leader._SyncObj__raftLog.last_index == 4 and leader._SyncObj__raftLog.durable_index == 2
        # one follower holds the no-op and both commands on its disk
        leader._SyncObj__onMessageReceived(TCPNode(LEADER), {"type": "next_node_idx", "next_node_idx": 5,
                                                             "success": True, "term": 1})
        for _ in range(5):
            leader.doTick(0)
        assert leader.raftCommitIndex == 2  # the follower and the leader's page cache are not a majority
        assert not [event for event in events if event[0] == "apply" and event[1] > 2]
        release.set()
        tick_until(leader, events, ("apply", 4, False))
        assert leader.raftCommitIndex == 4


def test_with_its_flusher_idle_a_leader_flushes_what_it_sends_in_the_same_step(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No thread hand-off when the flusher has nothing to do: the tick that sends new entries to the
    followers flushes them too, so the next commit step counts the leader without waiting for a wake-up."""
    events: Events = []
    with node(tmp_path, events, [LEADER, OTHER], monkeypatch) as leader:
        leader._SyncObj__setCurrentTerm(1, None)
        leader._SyncObj__onBecomeLeader()
        deadline = time.monotonic() + 10
        while leader._SyncObj__raftLog.durable_index < 2 and time.monotonic() < deadline:
            leader.doTick(0.001)
        assert leader._flusher is not None and not leader._flusher.pending
        events.clear()
        leader.propose_raw(RAW_COMMAND_PREFIX + b"one", lambda result, error: None)
        leader.doTick(0)  # one tick: appended, sent and on disk (not left to the flusher thread)
        assert events == [("flush", 3)] and leader._SyncObj__raftLog.durable_index == 3
        leader._SyncObj__onMessageReceived(TCPNode(LEADER), {"type": "next_node_idx", "next_node_idx": 4,
                                                             "success": True, "term": 1})
        leader.doTick(0)
        assert leader.raftCommitIndex == 3  # the follower and the leader's disk: a majority, no wake-up needed


def test_a_single_member_leader_flushes_before_it_commits_and_applies(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    events: Events = []
    with node(tmp_path, events, [], monkeypatch) as leader:
        deadline = time.monotonic() + 10.0  # its election timeout is 10-20 ms
        while not leader._isLeader() and time.monotonic() < deadline:
            leader.doTick(0.001)
        assert leader._isLeader()
        leader.propose_raw(RAW_COMMAND_PREFIX + b"one", lambda result, error: None)
        leader.propose_raw(RAW_COMMAND_PREFIX + b"two", lambda result, error: None)
        tick_until(leader, events, ("apply", 4, False))  # its flushes run on the flusher thread
        applied = [event for event in events if event[0] == "apply"]
        # a new journal starts with pysyncobj's no-op at index 1; the leader's own no-op is index 2
        assert [index for _, index, _ in applied] == [3, 4] and all(not unsynced for _, _, unsynced in applied)
        # the no-op of the new term and the two commands were flushed (on the flusher thread, together when
        # they came faster than a flush) before the commit step counted the leader for them
        first_flush = next(event for event in events if event[0] == "flush" and event[1] >= 3)
        assert events.index(first_flush) < events.index(("apply", 3, False))
        assert ("flush", 4) in events


def test_a_proposal_wakes_a_tick_thread_that_waits_in_its_poll(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A proposal leaves at once, not when the tick thread's poll times out (``autoTickPeriod``, 1 ms in
    production, here a tick that would wait 60 s): pysyncobj's batch mode queued it and woke nobody."""
    events: Events = []
    with node(tmp_path, events, [], monkeypatch) as leader:
        deadline = time.monotonic() + 10.0
        while not leader._isLeader() and time.monotonic() < deadline:
            leader.doTick(0.001)
        assert leader._isLeader()
        for _ in range(3):
            leader.doTick(0)  # nothing left over to wake the next poll
        waiting = threading.Thread(target=leader.doTick, args=(60.0,), daemon=True)
        waiting.start()
        leader.propose_raw(RAW_COMMAND_PREFIX + b"one", lambda result, error: None)
        waiting.join(timeout=20.0)
        assert not waiting.is_alive(), "the tick thread slept through the proposal"
        tick_until(leader, events, ("apply", 3, False))


def test_the_page_cache_policy_never_flushes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    events: Events = []
    with node(tmp_path, events, [LEADER, OTHER], monkeypatch, durable=False) as follower:
        follower._SyncObj__onMessageReceived(TCPNode(LEADER), append((1, 0), entries(2, 4, 1), 1))
        follower.doTick(0)
        assert [event for event in events if event[0] == "flush"] == []
        assert ("send", "next_node_idx", True) in events


def test_a_member_stopped_before_compacting_to_its_snapshot_keeps_the_entries_after_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The snapshot at 10 was on disk, the journal not yet compacted to it (the member stopped in between):
    the entries after 10, which it may have acknowledged, stay in its log."""
    journal = SegmentedJournal(tmp_path / "journal.d")
    for _, index, term in [(None, 1, 0), *entries(2, 20, 1)]:
        journal.add(NO_OP, index, term)
    journal.setCurrentTerm(1, None)
    journal.make_durable()
    journal.close()
    snapshot = Snapshot((NO_OP, 10, 1), (NO_OP, 9, 1), 0, 0, (SELF, LEADER, OTHER), b"")
    (tmp_path / "snapshot").write_bytes(encode_snapshot(snapshot))
    events: Events = []
    with node(tmp_path, events, [LEADER, OTHER], monkeypatch) as member:
        raft_log = member._SyncObj__raftLog
        assert [raft_log[i][1] for i in range(len(raft_log))] == list(range(9, 21))
        assert member.raftLastApplied == 10


def test_term_and_vote_are_fsynced_with_their_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    journal = SegmentedJournal(tmp_path / "journal.d")
    monkeypatch.setattr(os, "fsync", fsync)
    journal.setCurrentTerm(7, OTHER)
    meta = tmp_path / "journal.d" / "meta"
    assert synced[-2:] == [str(meta) + ".tmp", str(meta.parent)]  # the file before its rename, the directory after
    journal.close()
    reopened = SegmentedJournal(tmp_path / "journal.d")
    assert (reopened.getCurrentTerm(), reopened.getVotedForNodeId()) == (7, OTHER)
    reopened.close()


def test_the_pinned_pysyncobj_still_has_what_the_hooks_override() -> None:
    """The durability hooks override these by name; a pysyncobj without them would silently skip a flush
    (the behaviour tests above would fail too, this says why)."""
    for name in ("_onTick", "_SyncObj__onBecomeLeader", "_checkCommandsToApply", "_SyncObj__sendNextNodeIdx",
                 "_SyncObj__onMessageReceived", "_SyncObj__applyLogEntries", "_SyncObj__getEntries", "_doDestroy",
                 "_SyncObj__setState", "_SyncObj__generateRaftTimeout", "_SyncObj__getCurrentLogIndex",
                 "_SyncObj__sendAppendEntries"):
        assert callable(getattr(SyncObj, name, None)), name
