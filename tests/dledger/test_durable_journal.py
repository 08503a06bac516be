"""An entry counts as held by a member only once its Raft journal is flushed with it: a follower flushes
before it answers success, the leader before it counts itself, every member before it applies; term and
vote are stored durably; a failed flush stops the member. On real _RaftNodes over pysyncobj's file journal
(no network), so a pysyncobj upgrade that stops calling our hooks fails here."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from pysyncobj import SyncObj, SyncObjConf
from pysyncobj.journal import FileJournal
from pysyncobj.node import TCPNode

from commitlog.errors import EXIT_SYNC_FAILED
from dledger.member import RAW_COMMAND_PREFIX, _FileJournal, _MetaStorer, _RaftNode
from tests.dledger.test_log_matching import (
    LEADER,
    OTHER,
    SELF,
    RecordingTransport,
    StubMember,
    append,
    entries,
    load_snapshot,
    write_snapshot,
)

#: what happened, in order: ("flush", last index flushed), ("send", message type, success),
#: ("apply", index, whether the journal had unflushed records then)
Events = list[tuple[Any, ...]]


class RecordingMember(StubMember):
    def __init__(self, events: Events) -> None:
        self.events = events
        self.raft: _RaftNode | None = None

    def apply_raw(self, raft_index: int, command: bytes) -> None:
        assert self.raft is not None
        journal = self.raft._SyncObj__raftLog
        self.events.append(("apply", raft_index, journal.unsynced))


@contextmanager
def node(tmp_path: Path, events: Events, peers: list[str], monkeypatch: pytest.MonkeyPatch,
         durable: bool = True) -> Iterator[_RaftNode]:
    def flush(journal: FileJournal) -> None:
        events.append(("flush", journal[-1][1]))  # the last index the flush covers
        FileJournal.flush(journal)

    monkeypatch.setattr(_FileJournal, "flush", flush)
    conf = SyncObjConf(autoTick=False, journalFile=str(tmp_path / "journal"), fullDumpFile=str(tmp_path / "snapshot"),
                       deserializer=load_snapshot, serializer=write_snapshot, logCompactionMinEntries=1 << 30,
                       logCompactionMinTime=1 << 30, raftMinTimeout=0.01, raftMaxTimeout=0.02,
                       appendEntriesPeriod=0.002)
    stub = RecordingMember(events)
    raft = _RaftNode(stub, SELF, peers, conf, RecordingTransport, durable_journal=durable)  # type: ignore[arg-type]
    stub.raft = raft
    transport: RecordingTransport = raft._SyncObj__transport
    send = transport.send

    def recorded_send(to: Any, message: Any) -> bool:
        events.append(("send", message["type"], message.get("success")))
        return bool(send(to, message))

    monkeypatch.setattr(transport, "send", recorded_send)
    try:
        yield raft
    finally:
        raft.destroy()


def test_a_follower_flushes_its_journal_before_it_answers_success(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    events: Events = []
    with node(tmp_path, events, [LEADER, OTHER], monkeypatch) as follower:
        follower._SyncObj__onMessageReceived(TCPNode(LEADER), append((1, 0), entries(2, 4, 1), 1))
        assert events == [("flush", 4), ("send", "next_node_idx", True)]
        events.clear()
        # entries already held: nothing new to flush, the answer goes at once
        follower._SyncObj__onMessageReceived(TCPNode(LEADER), append((1, 0), entries(2, 4, 1), 1))
        assert events == [("send", "next_node_idx", True)]
        events.clear()
        # a conflicting tail is cut and replaced: the cut is flushed with the new entries
        follower._SyncObj__onMessageReceived(TCPNode(LEADER), append((2, 1), entries(3, 3, 2), 1, term=2))
        assert events == [("flush", 3), ("send", "next_node_idx", True)]


def test_every_applied_entry_was_flushed_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    events: Events = []
    with node(tmp_path, events, [LEADER, OTHER], monkeypatch) as follower:
        journal = follower._SyncObj__raftLog
        for index in (2, 3):  # written by a path that answers nothing (as a snapshot install writes)
            journal.add(RAW_COMMAND_PREFIX + b"x", index, 1)
        follower._SyncObj__raftCommitIndex = 3
        follower.doTick(0)
        assert events[0] == ("flush", 3)
        applied = [event for event in events if event[0] == "apply"]
        assert applied == [("apply", 2, False), ("apply", 3, False)]


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
        for _ in range(5):
            leader.doTick(0)
        applied = [event for event in events if event[0] == "apply"]
        # a new journal starts with pysyncobj's no-op at index 1; the leader's own no-op is index 2
        assert [index for _, index, _ in applied] == [3, 4] and all(not unsynced for _, _, unsynced in applied)
        flushed = [event[1] for event in events if event[0] == "flush"]
        # the no-op of the new term was flushed when it was appended; the two commands when proposed
        assert flushed[0] == 2 and 4 in flushed
        assert events.index(("flush", 4)) < events.index(("apply", 3, False))


def test_the_page_cache_policy_never_flushes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    events: Events = []
    with node(tmp_path, events, [LEADER, OTHER], monkeypatch, durable=False) as follower:
        follower._SyncObj__onMessageReceived(TCPNode(LEADER), append((1, 0), entries(2, 4, 1), 1))
        follower.doTick(0)
        assert [event for event in events if event[0] == "flush"] == []
        assert ("send", "next_node_idx", True) in events


def test_a_failed_flush_stops_the_member(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(journal: FileJournal) -> None:
        raise OSError(5, "Input/output error")

    def exit_now(code: int) -> None:
        raise SystemExit(code)

    journal = FileJournal(str(tmp_path / "journal"))
    journal.__class__ = _FileJournal
    monkeypatch.setattr(_FileJournal, "flush", broken)
    monkeypatch.setattr(os, "_exit", exit_now)
    journal.add(b"x", 1, 1)
    with pytest.raises(SystemExit) as stopped:
        journal.make_durable()
    assert stopped.value.code == EXIT_SYNC_FAILED
    assert journal.unsynced  # never marked durable


def test_term_and_vote_are_fsynced_with_their_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    path = tmp_path / "journal.meta"
    _MetaStorer(str(path)).storeMeta({"currentTerm": 7, "votedForNodeId": OTHER, "raftCommitIndex": 3})
    assert synced == [str(path) + ".tmp", str(tmp_path)]  # the file before its rename, the directory after
    assert FileJournal(str(tmp_path / "journal")).getCurrentTerm() == 7


def test_the_pinned_pysyncobj_still_has_what_the_hooks_override() -> None:
    """The durability hooks override these by name; a pysyncobj without them would silently skip a flush
    (the behaviour tests above would fail too, this says why)."""
    for name in ("_onTick", "_SyncObj__onBecomeLeader", "_checkCommandsToApply", "_SyncObj__sendNextNodeIdx",
                 "_SyncObj__onMessageReceived"):
        assert callable(getattr(SyncObj, name, None)), name
    for name in ("add", "clear", "deleteEntriesFrom", "deleteEntriesTo", "flush", "onOneSecondTimer"):
        assert callable(getattr(FileJournal, name, None)), name
