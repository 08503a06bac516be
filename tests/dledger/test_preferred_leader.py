"""The preferred leader takes leadership back under a steady load (``GroupMember._on_tick``, the tick thread's
half of it, with pysyncobj and group commit stood in for).

pysyncobj sends the target its ``timeout_now`` only while the target holds the whole log. Under a steady load
the log grows on every tick, so a leader that merely asks each second is denied every time, and the preferred
member never leads again (the CI failure of ``test_group.py::test_the_preferred_leader_takes_leadership_back``).
Once the preferred member is connected and close, the leader holds new entries back as a requested transfer
does, so it catches up."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from dledger.member import (
    PREFERENCE_BACKOFF_SECONDS,
    PREFERENCE_LAG_ENTRIES_MAX,
    TRANSFER_TIMEOUT_SECONDS,
    GroupMember,
)

PREFERRED = "127.0.0.1:7003"


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


class Committer:
    """Group commit as far as a transfer goes: paused or not."""

    def __init__(self) -> None:
        self.paused = False
        self.pauses = 0

    def held(self) -> bool:
        return self.paused

    def pause(self) -> None:
        self.paused = True
        self.pauses += 1

    def resume(self) -> None:
        self.paused = False


class SteadyLoadLeader:
    """A leader's pysyncobj under a steady load, as the tick callback sees it: on every tick the follower has
    acknowledged what was sent before, and one more entry was proposed (unless group commit is paused).
    ``transferLeadership`` follows pysyncobj: denied unless the target holds the log's last entry."""

    def __init__(self, committer: Committer, behind: int = 1, connected: bool = True) -> None:
        self.committer = committer
        self.last = 1_000
        self.match = self.last - behind
        self.connected = connected
        self.leader = True
        self.timeouts_sent: list[str | None] = []
        self.catching_up = True

    def tick(self) -> None:
        if self.catching_up:
            self.match = self.last
        if not self.committer.paused:
            self.last += 1

    def _isLeader(self) -> bool:  # pysyncobj's name
        return self.leader

    def follower_lag(self, address: str) -> int | None:
        assert address == PREFERRED
        return self.last - self.match if self.connected else None

    def transferLeadership(self, node: str | None = None) -> None:  # pysyncobj's name
        if self.connected and self.match == self.last:
            self.timeouts_sent.append(node)


def leader_member(raft: SteadyLoadLeader, committer: Committer, preferred: str | None = PREFERRED) -> GroupMember:
    """A GroupMember with only what its tick callback reads."""
    member = object.__new__(GroupMember)
    applied = threading.Event()
    applied.set()
    member.__dict__.update(raft=raft, committer=committer, _byte_config_applied=applied, _transfer=None,
                           _next_transfer_attempt=0.0, _next_preference_check=0.0, _preferred_address=preferred,
                           _leading=True)
    return member


def run(member: GroupMember, raft: SteadyLoadLeader, clock: Clock, seconds: float, step: float = 0.01) -> None:
    end = clock.now + seconds
    while clock.now < end:
        raft.tick()
        member._on_tick()
        clock.now += step


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr("dledger.member.time", SimpleNamespace(monotonic=fake))  # this module's clock only
    return fake


def test_a_preferred_member_one_entry_behind_on_every_tick_is_handed_leadership(clock: Clock) -> None:
    committer = Committer()
    raft = SteadyLoadLeader(committer)
    member = leader_member(raft, committer)
    run(member, raft, clock, 3.0)
    # told to stand once it held the whole log, while entries waited (again each retry until it leads)
    assert raft.timeouts_sent and set(raft.timeouts_sent) == {PREFERRED}
    assert committer.held()
    assert member.write_refusal() == "handing leadership over"
    raft.leader = False  # the preferred member won its election
    run(member, raft, clock, 0.1)
    assert not committer.held() and member._transfer is None  # what waited goes to the new leader


def test_a_preferred_member_far_behind_is_left_to_catch_up_without_holding_writes(clock: Clock) -> None:
    committer = Committer()
    raft = SteadyLoadLeader(committer, behind=PREFERENCE_LAG_ENTRIES_MAX + 100)
    raft.catching_up = False
    member = leader_member(raft, committer)
    run(member, raft, clock, 5.0)
    assert committer.pauses == 0 and raft.timeouts_sent == []
    raft.catching_up = True  # it caught up: the next check hands over
    run(member, raft, clock, 1.5)
    assert committer.pauses == 1 and set(raft.timeouts_sent) == {PREFERRED}


def test_a_disconnected_preferred_member_is_not_waited_for(clock: Clock) -> None:
    committer = Committer()
    raft = SteadyLoadLeader(committer, connected=False)
    member = leader_member(raft, committer)
    run(member, raft, clock, 5.0)
    assert committer.pauses == 0 and raft.timeouts_sent == []


def test_a_handover_that_gives_up_resumes_writes_and_backs_off(clock: Clock) -> None:
    committer = Committer()
    raft = SteadyLoadLeader(committer)
    member = leader_member(raft, committer)
    raft.tick()
    member._on_tick()  # close: the handover starts
    assert committer.held()
    raft.catching_up = False  # and then the preferred member stops answering
    run(member, raft, clock, TRANSFER_TIMEOUT_SECONDS + 0.5)
    assert not committer.held() and member._transfer is None and raft.timeouts_sent == []
    raft.catching_up = True
    run(member, raft, clock, PREFERENCE_BACKOFF_SECONDS - 2.0)
    assert committer.pauses == 1  # writes are not held again every second
    run(member, raft, clock, 3.0)
    assert committer.pauses == 2 and set(raft.timeouts_sent) == {PREFERRED}


def test_the_preferred_leader_itself_and_a_group_without_one_hand_nothing_over(clock: Clock) -> None:
    for preferred in (None, "127.0.0.1:7001"):
        committer = Committer()
        raft = SteadyLoadLeader(committer)
        raft.follower_lag = lambda address: None  # type: ignore[method-assign]  # itself: not a follower
        member = leader_member(raft, committer, preferred)
        run(member, raft, clock, 3.0)
        assert committer.pauses == 0 and raft.timeouts_sent == []
