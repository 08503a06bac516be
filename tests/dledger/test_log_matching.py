"""The follower's side of append_entries (Raft §5.3, §7) without a network: the pure plan, then a real
``RaftNode`` fed messages by hand through a transport that only records what it sends."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from pysyncobj import SyncObjConf
from pysyncobj.node import TCPNode
from pysyncobj.transport import Transport

from dledger.log_matching import AppendPlan, Entry, matching_entries, plan_append
from dledger.raft_node import RAFT_STATE_LEADER, RaftNode
from dledger.snapshot import BackgroundSnapshots, Snapshot, encode_snapshot, read_snapshot

NO_OP = b"\x01"  # pysyncobj's no-op command: applies nothing, so these tests need no store
SELF, LEADER, OTHER = "127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"


def entries(first: int, last: int, term: int) -> list[Entry]:
    return [(NO_OP, index, term) for index in range(first, last + 1)]


def log_terms(log: list[Entry]) -> Any:
    by_index = {index: term for _, index, term in log}
    return by_index.get


# ---------------------------------------------------------------------------------------- the pure plan

#: a log holding 1 (term 0), 2-10 (term 1)
LOG = [(NO_OP, 1, 0), *entries(2, 10, 1)]
LAST = (10, 1)


@pytest.mark.parametrize(
    ("prev", "sent", "commit", "plan"),
    [
        # a re-sent batch the log holds: nothing deleted, nothing added, a reply for what it proved
        ((3, 1), entries(4, 6, 1), 10, AppendPlan(10, 1, [], 6, 7, held=3)),
        # a stale heartbeat: likewise (pysyncobj deleted 6-10)
        ((5, 1), [], 10, AppendPlan(10, 1, [], 5, 6)),
        # a batch running past the log's end: only the new entries are appended, after 10
        ((8, 1), entries(9, 12, 1), 12, AppendPlan(10, 1, entries(11, 12, 1), 12, 13, held=2)),
        # a conflict at 7: truncated from 7 only, after the matching 6
        ((5, 1), entries(6, 6, 1) + entries(7, 8, 2), 8, AppendPlan(6, 1, entries(7, 8, 2), 8, 9, held=1)),
        # a conflict on the first entry: truncated right after the previous entry
        ((5, 1), entries(6, 7, 2), 7, AppendPlan(5, 1, entries(6, 7, 2), 7, 8)),
        # the leader's commit index beyond the message is not ours to take: entries past it are unverified
        ((4, 1), entries(5, 5, 1), 10, AppendPlan(10, 1, [], 5, 6, held=1)),
    ],
)
def test_a_follower_keeps_what_matches_and_truncates_from_the_first_conflict(
        prev: tuple[int, int], sent: list[Entry], commit: int, plan: AppendPlan) -> None:
    assert plan_append(log_terms(LOG), LAST, prev[0], prev[1], sent, commit) == plan


@pytest.mark.parametrize("prev", [(5, 2), (11, 1), (0, 0)])
def test_a_previous_entry_that_does_not_match_is_left_to_pysyncobj(prev: tuple[int, int]) -> None:
    assert plan_append(log_terms(LOG), LAST, prev[0], prev[1], entries(prev[0] + 1, prev[0] + 1, 2), 10) is None


def test_matching_entries_stops_at_the_first_entry_the_log_lacks_or_contradicts() -> None:
    assert matching_entries(log_terms(LOG), entries(8, 12, 1)) == 3
    assert matching_entries(log_terms(LOG), entries(2, 3, 1) + entries(4, 4, 2) + entries(5, 5, 1)) == 2
    assert matching_entries(log_terms(LOG), []) == 0


# ------------------------------------------------------------------------------- a real RaftNode


class RecordingTransport(Transport):  # type: ignore[misc]  # pysyncobj ships no type hints
    """No network: the node never connects to anyone (so never starts an election); sends are kept."""

    def __init__(self, sync_obj: Any, self_node: Any, other_nodes: Any) -> None:
        super().__init__(sync_obj, self_node, other_nodes)
        self.sent: list[tuple[str, dict[str, Any]]] = []

    def send(self, node: Any, message: Any) -> bool:
        self.sent.append((str(node), message))
        return True


def capture_snapshot(data: Any) -> Snapshot:
    last_entry, previous_entry, _ = data
    return Snapshot(last_entry, previous_entry, 0, 0, (SELF, LEADER, OTHER), b"")


class StubMember:
    snapshot_load_failed = False

    def _snapshots(self, base: Any) -> BackgroundSnapshots:
        return BackgroundSnapshots(base, Path(base._Serializer__fileName), capture_snapshot, lambda: None)


def write_snapshot(file_name: str, data: Any) -> None:
    raise AssertionError("BackgroundSnapshots writes the snapshots")


def load_snapshot(file_name: str) -> tuple[Any, Any, Any]:
    snapshot = read_snapshot(Path(file_name))
    return snapshot.last_entry, snapshot.previous_entry, frozenset(snapshot.members)


@contextmanager
def follower(tmp_path: Path) -> Iterator[RaftNode]:
    conf = SyncObjConf(autoTick=False, fullDumpFile=str(tmp_path / "snapshot"), deserializer=load_snapshot,
                       serializer=write_snapshot, logCompactionMinEntries=1 << 30,
                       logCompactionMinTime=1 << 30)
    raft = RaftNode(StubMember(), SELF, [LEADER, OTHER], conf, RecordingTransport)  # type: ignore[arg-type]
    try:
        yield raft
    finally:
        raft.destroy()


def deliver(raft: RaftNode, message: dict[str, Any]) -> dict[str, Any] | None:
    """Hand ``message`` from the leader to the follower's handler and tick (apply); its reply, if any."""
    transport: RecordingTransport = raft._SyncObj__transport
    sent_before = len(transport.sent)
    raft._SyncObj__onMessageReceived(TCPNode(LEADER), message)
    raft.doTick(0)
    replies = [reply for _, reply in transport.sent[sent_before:] if reply["type"] == "next_node_idx"]
    assert len(replies) <= 1, replies
    return replies[0] if replies else None


def append(prev: tuple[int, int], sent: list[Entry], commit: int, term: int = 1) -> dict[str, Any]:
    return {"type": "append_entries", "term": term, "commit_index": commit, "prevLogIdx": prev[0],
            "prevLogTerm": prev[1], "entries": sent}


def log_of(raft: RaftNode) -> list[tuple[int, int]]:
    raft_log = raft._SyncObj__raftLog
    return [(raft_log[i][1], raft_log[i][2]) for i in range(len(raft_log))]


def success(next_index: int) -> dict[str, Any]:
    return {"type": "next_node_idx", "next_node_idx": next_index, "reset": False, "success": True}


def test_a_resent_batch_or_stale_heartbeat_leaves_applied_entries_in_place(tmp_path: Path) -> None:
    with follower(tmp_path) as raft:
        assert deliver(raft, append((1, 0), entries(2, 10, 1), commit=10)) == success(11)
        assert raft.raftLastApplied == 10
        # the leader rewound its next index on a stale reply and sends again what was already there
        assert deliver(raft, append((3, 1), entries(4, 6, 1), commit=10)) == success(7)
        assert deliver(raft, append((5, 1), [], commit=10)) == success(6)
        assert log_of(raft) == [(1, 0)] + [(index, 1) for index in range(2, 11)]
        assert (raft.raftLastApplied, raft.raftCommitIndex) == (10, 10)
        # and the next new entry still goes after the last one
        assert deliver(raft, append((10, 1), entries(11, 11, 1), commit=11)) == success(12)
        assert log_of(raft)[-1] == (11, 1)


def test_a_new_leader_truncates_from_the_first_conflicting_entry_only(tmp_path: Path) -> None:
    with follower(tmp_path) as raft:
        deliver(raft, append((1, 0), entries(2, 10, 1), commit=3))
        assert deliver(raft, append((5, 1), entries(6, 6, 1) + entries(7, 8, 2), commit=8, term=2)) == success(9)
        assert log_of(raft) == [(1, 0)] + [(index, 1) for index in range(2, 7)] + [(7, 2), (8, 2)]
        assert raft.raftCommitIndex == 8


def test_entries_past_the_message_are_not_committed_on_the_leaders_word(tmp_path: Path) -> None:
    with follower(tmp_path) as raft:
        deliver(raft, append((1, 0), entries(2, 10, 1), commit=2))
        # the leader's commit index is 10, but this message proves our log only up to 4
        assert deliver(raft, append((4, 1), [], commit=10, term=2)) == success(5)
        assert raft.raftCommitIndex == 4
        assert log_of(raft)[-1] == (10, 1)


def snapshot_chunks(index: int, term: int) -> list[dict[str, Any]]:
    data = encode_snapshot(Snapshot((NO_OP, index, term), (NO_OP, index - 1, term), 0, 0, (SELF, LEADER, OTHER),
                                    b""))
    return [{"type": "append_entries", "term": 1, "commit_index": index, "serialized": chunk}
            for chunk in ((data, True, False), (b"", False, True))]


def test_a_snapshot_older_than_the_log_is_not_installed(tmp_path: Path) -> None:
    with follower(tmp_path) as raft:
        deliver(raft, append((1, 0), entries(2, 10, 1), commit=10))
        first, last = snapshot_chunks(8, 1)
        assert deliver(raft, first) is None
        assert deliver(raft, last) == success(9)  # what the snapshot proves, not our log's end
        assert log_of(raft)[-1] == (10, 1)
        assert raft.raftLastApplied == 10
        assert not (tmp_path / "snapshot").exists(), "the leader's older snapshot was written over ours"


def test_a_snapshot_newer_than_the_log_is_installed(tmp_path: Path) -> None:
    with follower(tmp_path) as raft:
        deliver(raft, append((1, 0), entries(2, 10, 1), commit=10))
        first, last = snapshot_chunks(20, 1)
        assert deliver(raft, first) is None
        assert deliver(raft, last) == success(21)
        assert log_of(raft) == [(19, 1), (20, 1)]
        assert raft.raftLastApplied == 20


def test_a_member_whose_own_snapshot_did_not_load_installs_the_leaders(tmp_path: Path) -> None:
    """Its snapshot was damaged on disk, so nothing loaded (applied 1) while its journal, compacted to that
    snapshot, starts at 9: the leader's snapshot at 15 is in its log with the same term, yet it is the only
    way this member applies anything again."""
    with follower(tmp_path) as raft:
        raft_log = raft._SyncObj__raftLog
        raft_log.clear()
        for _, index, term in entries(9, 20, 1):
            raft_log.add(NO_OP, index, term)
        first, last = snapshot_chunks(15, 1)
        assert deliver(raft, first) is None
        assert deliver(raft, last) == success(16)
        assert raft.raftLastApplied == 15


def test_a_compaction_finished_just_before_a_stale_snapshot_still_leaves_a_log(tmp_path: Path) -> None:
    """The sequence that emptied a restarted member's log (its every tick then raised IndexError): a local
    compaction is written at index 9 and pysyncobj deletes the entries up to it on the next tick; in
    between, the leader's older snapshot (index 5) arrived and pysyncobj cut the log back to it."""
    with follower(tmp_path) as raft:
        deliver(raft, append((1, 0), entries(2, 10, 1), commit=10))
        raft.forceLogCompaction()
        raft.doTick(0)  # the snapshot at 9 is captured and written; the log is compacted on the next tick
        raft._SyncObj__serializer.settle()
        for chunk in snapshot_chunks(5, 1):
            raft._SyncObj__onMessageReceived(TCPNode(LEADER), chunk)
        raft.doTick(0)
        assert log_of(raft) == [(9, 1), (10, 1)]
        assert raft.raftLastApplied == 10


# ------------------------------------------------------------------------------- the leader's side


def reply(next_index: int, success: bool = True, reset: bool = False) -> dict[str, Any]:
    return {"type": "next_node_idx", "next_node_idx": next_index, "reset": reset, "success": success}


def test_a_success_reply_never_moves_the_leaders_next_index_back(tmp_path: Path) -> None:
    """pysyncobj's leader set a follower's next index to just after each success reply, so everything it had
    sent since went again (0.64 re-sent entries per new one under load). Replies only move it forward now;
    a failure (reset) still moves it back."""
    with follower(tmp_path) as raft:
        raft._SyncObj__raftState = RAFT_STATE_LEADER
        peer = TCPNode(OTHER)
        next_index, match_index = raft._SyncObj__raftNextIndex, raft._SyncObj__raftMatchIndex
        next_index[peer], match_index[peer] = 11, 3  # entries up to 10 sent, up to 3 acknowledged

        def handle(message: dict[str, Any]) -> tuple[int, int]:
            raft._SyncObj__onMessageReceived(peer, message)
            return next_index[peer], match_index[peer]

        assert handle(reply(6)) == (11, 5)  # acknowledges what was sent first: the rest is still on its way
        assert handle(reply(4)) == (11, 5)  # a stale reply changes nothing
        assert handle(reply(20)) == (20, 19)  # it holds more than the leader thought it sent
        assert handle(reply(8, success=False, reset=True)) == (8, 19)  # a conflict: send again from 8
        responded = raft._SyncObj__lastResponseTime[peer]
        assert handle(reply(21)) == (21, 20)
        assert raft._SyncObj__lastResponseTime[peer] >= responded  # counts as contact for the leader's lease
