"""When a member must keep out of elections: its log may lack entries it acknowledged (damage found on its
disk), or its disk is full. On a real ``RaftNode`` fed messages by hand (no network)."""

from __future__ import annotations

import time
from typing import Any

import pytest
from pysyncobj.node import TCPNode

from commitlog.errors import DiskFullError
from dledger import raft_node
from dledger.raft_node import RAFT_STATE_LEADER, RaftNode
from tests.dledger.test_log_matching import OTHER, RecordingTransport, append, deliver, entries, follower


def vote_request(term: int, last_index: int = 1, last_term: int = 0) -> dict[str, Any]:
    return {"type": "request_vote", "term": term, "last_log_index": last_index, "last_log_term": last_term}


def votes(raft: RaftNode) -> list[dict[str, Any]]:
    transport: RecordingTransport = raft._SyncObj__transport
    return [message for _, message in transport.sent if message["type"] == "response_vote"]


def refetch_index(raft: RaftNode) -> int | None:
    return raft._refetch_index


def connected(raft: RaftNode) -> None:
    """pysyncobj starts an election only while connected to someone: pretend to be; and election timeouts
    of 10-20 ms."""
    raft._SyncObj__connectedToAnyone = lambda: True
    conf = raft._SyncObj__conf
    conf.raftMinTimeout, conf.raftMaxTimeout = 0.01, 0.02
    raft._SyncObj__raftElectionDeadline = time.monotonic() + 0.02


def test_a_member_that_may_lack_acknowledged_entries_votes_only_once_it_holds_them_again(tmp_path: Any) -> None:
    with follower(tmp_path) as raft:
        raft._refetch_index = 10  # what damage found at start sets: it may have held (and acked) up to 10
        raft._SyncObj__onMessageReceived(TCPNode(OTHER), vote_request(term=5))
        assert votes(raft) == []  # its short log would have elected a member lacking 2-10
        # a leader brings the log back up to 10 and commits it
        deliver(raft, append((1, 0), entries(2, 10, 1), commit=10))
        raft.doTick(0)
        assert refetch_index(raft) is None
        raft._SyncObj__onMessageReceived(TCPNode(OTHER), vote_request(term=6, last_index=10, last_term=1))
        assert [vote["term"] for vote in votes(raft)] == [6]  # granted (pysyncobj answers only a grant)


def test_a_member_that_may_lack_acknowledged_entries_does_not_stand_for_election(tmp_path: Any) -> None:
    with follower(tmp_path) as raft:
        connected(raft)
        raft._refetch_index = 10
        deadline = time.monotonic() + 0.3  # many election timeouts
        while time.monotonic() < deadline:
            raft.doTick(0.005)
        assert raft.raftCurrentTerm == 0 and raft._SyncObj__raftState == 0
        raft._refetch_index = None
        deadline = time.monotonic() + 10.0
        while raft.raftCurrentTerm == 0 and time.monotonic() < deadline:
            raft.doTick(0.005)
        assert raft.raftCurrentTerm >= 1  # the same member stands once the hold is lifted


def full_disk(raft: RaftNode, monkeypatch: pytest.MonkeyPatch) -> None:
    journal = raft._SyncObj__raftLog

    def add(command: bytes, idx: int, term: int) -> None:
        raise DiskFullError("no space left writing the journal")

    monkeypatch.setattr(journal, "add", add)


def test_a_follower_with_a_full_disk_does_not_answer_and_catches_up_after(tmp_path: Any,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    with follower(tmp_path) as raft:
        with monkeypatch.context() as patch:
            full_disk(raft, patch)
            assert deliver(raft, append((1, 0), entries(2, 4, 1), commit=4)) is None  # nothing claimed
        assert deliver(raft, append((1, 0), entries(2, 4, 1), commit=4)) == {
            "type": "next_node_idx", "next_node_idx": 5, "reset": False, "success": True}
        assert raft.raftLastApplied == 4


def test_a_leader_whose_disk_is_full_steps_down_and_stays_out_of_elections(tmp_path: Any,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    with follower(tmp_path) as raft:
        connected(raft)
        raft._SyncObj__otherNodes = set()  # alone: it elects itself
        deadline = time.monotonic() + 10.0
        while raft._SyncObj__raftState != RAFT_STATE_LEADER and time.monotonic() < deadline:
            raft.doTick(0.005)
        assert raft._SyncObj__raftState == RAFT_STATE_LEADER
        term = raft.raftCurrentTerm
        monkeypatch.setattr(raft_node, "DISK_FULL_HOLD_SECONDS", 0.3)
        full_disk(raft, monkeypatch)
        raft.propose_raw(b"\x00\xfeone", lambda result, error: None)
        raft.doTick(0)  # the append finds the disk full: no exception out of the tick thread
        assert raft._SyncObj__raftState == 0
        held_until = time.monotonic() + 0.2
        while time.monotonic() < held_until:
            raft.doTick(0.005)
        assert raft.raftCurrentTerm == term  # no election while the disk is full (the others lead meanwhile)
