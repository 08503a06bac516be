"""The member's answer to "do I lead?", read on every send, against pysyncobj's state changes."""

from __future__ import annotations

from typing import Any

from dledger.command import Command
from dledger.member import BuiltCommands, GroupMember, RoleChange
from dledger.raft_node import RAFT_STATE_LEADER

FOLLOWER = 0


class Raft:  # pysyncobj's method names
    """pysyncobj's view: its state and the leader it knows; counts how often it is asked."""

    def __init__(self) -> None:
        self.state = FOLLOWER
        self.leader: str | None = "127.0.0.1:7002"
        self.asked = 0

    def _isLeader(self) -> bool:
        self.asked += 1
        return self.state == RAFT_STATE_LEADER

    def _getLeader(self) -> str | None:
        self.asked += 1
        return self.leader

    def getStatus(self) -> dict[str, Any]:
        return {"leader": self.leader, "raft_term": 4}


class Committer:
    def __init__(self, member: GroupMember) -> None:
        self.member = member
        self.calls: list[tuple[str, bool]] = []  # (call, whether sends took the fast path then)

    def raise_stamp_floor(self, stamp_ms: int) -> None:
        self.calls.append(("raise_stamp_floor", self.member._leading))

    def step_down(self) -> None:
        self.calls.append(("step_down", self.member._leading))


class State:
    last_store_timestamp = 0


def member() -> tuple[GroupMember, Raft, Committer]:
    node = GroupMember.__new__(GroupMember)  # only what role changes and _leadership touch
    raft = Raft()
    committer = Committer(node)
    node.raft = raft  # type: ignore[assignment]
    node.committer = committer  # type: ignore[assignment]
    node.state = State()  # type: ignore[assignment]
    node.on_role_change = None
    node._leader_name = (None, "")
    node._leading = False
    node._role = RoleChange("follower", 0, None)
    node._built = BuiltCommands()
    return node, raft, committer


def test_leading_is_answered_without_asking_pysyncobj_and_follows_its_state_changes() -> None:
    node, raft, committer = member()
    assert node._leadership() == (False, "127.0.0.1:7002")  # not leading: pysyncobj names the leader
    raft.state, raft.leader = RAFT_STATE_LEADER, "127.0.0.1:7001"
    node._on_state_changed(FOLLOWER, RAFT_STATE_LEADER)
    assert committer.calls == [("raise_stamp_floor", False)]  # the stamp floor first, then the fast path
    asked = raft.asked
    assert [node._leadership()[0] for _ in range(100)] == [True] * 100
    assert node.is_leader
    assert raft.asked == asked  # the fast path: one attribute
    entry = b"\x00\xfe an entry proposed as leader"
    node._built.remember(entry, Command(()))
    raft.state, raft.leader = FOLLOWER, "127.0.0.1:7003"
    node._on_state_changed(RAFT_STATE_LEADER, FOLLOWER)
    assert committer.calls[-1] == ("step_down", False)  # the fast path closed before waiting sends fail
    assert node._built.take(entry) is None  # what it built as leader is decoded if it ever applies here
    assert node._leadership() == (False, "127.0.0.1:7003")
    assert raft.asked > asked
