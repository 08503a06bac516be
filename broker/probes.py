"""What ``GET /healthz`` and ``GET /readyz`` answer (broker.http): a snapshot of the member's state, read
from the live objects, and pure decisions over it.

- health: the process serves (its remoting server accepts requests, Raft's thread runs, its durable state
  is not damaged, it is not stopping);
- readiness: healthy, a leader is known, and this member has applied what the group committed, within
  :data:`READY_APPLY_LAG_ENTRIES_MAX` entries (a follower under load is always a few entries behind);
- leader readiness (``?role=leader``): healthy, the Raft leader, hearing a majority, and taking writes (its
  byte configuration applied, no leadership transfer under way). A load balancer in front of the group
  sends writes to the one member that answers it 200;
- follower readiness (``?role=follower``): ready and not the leader (a pool for reads).

Each answer is None (200) or the reason it is not (503). A load balancer asks often: the leader check
reads a few flags and one set of pysyncobj's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

#: how far a member's apply may trail the commit index it knows and the member still count as ready
READY_APPLY_LAG_ENTRIES_MAX: Final = 64
#: the roles ``/readyz?role=`` knows
ROLES: Final = ("leader", "follower")
#: pysyncobj's status can change size under a reader on another thread: read again this many times
_STATUS_READS_MAX: Final = 3


@dataclass(frozen=True, slots=True)
class ProbeState:
    """What the probes decide on: a snapshot of the member."""

    #: the remoting server accepts and serves requests
    serving: bool
    stopping: bool
    #: pysyncobj's tick thread (Raft and apply) is alive
    raft_running: bool
    #: why this member does not vote until it re-fetched its log, or None
    damage: str | None
    #: the last snapshot install failed: the member cannot apply until a leader's snapshot is installed
    snapshot_load_failed: bool
    #: why this member does not take writes, or None when it leads and does (GroupMember.write_refusal)
    write_refusal: str | None
    has_quorum: bool
    leader_known: bool
    applied_index: int
    #: the commit index this member knows of (the leader's, as its last message said)
    leader_commit_index: int


def health_problem(state: ProbeState) -> str | None:
    if state.stopping:
        return "stopping"
    if not state.serving:
        return "the remoting server is not serving"
    if not state.raft_running:
        return "the Raft thread is not running"
    if state.damage is not None:
        return f"damaged, not voting until the log is re-fetched: {state.damage}"
    if state.snapshot_load_failed:
        return "the last snapshot did not load: waiting for the leader's"
    return None


def readiness_problem(state: ProbeState, role: str | None = None) -> str | None:
    """None when ready for ``role`` (None: any), else why not. ValueError for a role not in :data:`ROLES`."""
    if role is not None and role not in ROLES:
        raise ValueError(f"unknown role {role!r}: one of {', '.join(ROLES)}")
    problem = health_problem(state)
    if problem is not None:
        return problem
    if role == "leader":
        if state.write_refusal is not None:
            return state.write_refusal
        if not state.has_quorum:
            return "the leader does not hear a majority"
        return None
    if not state.leader_known:
        return "no leader known"
    behind = state.leader_commit_index - state.applied_index
    if behind > READY_APPLY_LAG_ENTRIES_MAX:
        return f"applying: {behind} committed entries behind"
    if role == "follower" and state.write_refusal is None:
        return "the leader"
    return None


def raft_status(raft: Any) -> dict[str, Any]:
    """pysyncobj's ``getStatus()``, read from another thread than its own."""
    for _ in range(_STATUS_READS_MAX - 1):
        try:
            return dict(raft.getStatus())
        except RuntimeError:  # a dict of pysyncobj's changed size while it was read: read again
            continue
    return dict(raft.getStatus())


def read_probe_state(member: Any, serving: bool, stopping: bool) -> ProbeState:
    """The snapshot of a :class:`dledger.member.GroupMember` (typed loosely: tests give stand-ins)."""
    raft = member.raft
    tick_thread = raft.tick_thread()
    status = raft_status(raft)
    return ProbeState(
        serving=serving,
        stopping=stopping,
        raft_running=tick_thread is None or tick_thread.is_alive(),
        damage=raft.damage,
        snapshot_load_failed=bool(member.snapshot_load_failed),
        write_refusal=member.write_refusal(),
        has_quorum=bool(status.get("has_quorum", False)),
        leader_known=status.get("leader") is not None,
        applied_index=int(member.machine.applied_index),
        leader_commit_index=int(status.get("leader_commit_idx") or 0),
    )


class Probes:
    """The probes of one member: ``health()`` and ``readiness(role)``, None or the reason."""

    def __init__(self, state: Callable[[], ProbeState]) -> None:
        self._state = state

    def health(self) -> str | None:
        return health_problem(self._state())

    def readiness(self, role: str | None = None) -> str | None:
        return readiness_problem(self._state(), role)
