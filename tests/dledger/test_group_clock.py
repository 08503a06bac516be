"""The group's time (dledger.group_clock): a majority of the members' clocks, monotonic, floored by the
replicated state, blind to stale readings; and the transport feeding it from real connections."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
from pysyncobj import SyncObj

from dledger.command import LeaderStamp
from dledger.group_clock import (
    CLOCK_SAMPLE_MAX_AGE_SECONDS,
    GroupClock,
    clock_message,
    clock_reading,
    majority_reading,
    replicated_floor_ms,
)
from dledger.state import ReplicatedState
from dledger.transport import transport_class
from dledger.tuning import tuned_conf
from tests.support.waiting import wait_for

T = 1_750_000_000_000
HOUR_MS = 3_600_000
SECRET = b"raftmq test secret: 32 bytes ok!"


class Clocks:
    """A wall clock and a monotonic clock that tests move by hand."""

    def __init__(self, wall_ms: int = T) -> None:
        self.wall_ms = wall_ms
        self.monotonic_seconds = 1000.0

    def wall(self) -> int:
        return self.wall_ms

    def monotonic(self) -> float:
        return self.monotonic_seconds

    def advance(self, seconds: float) -> None:
        self.wall_ms += int(seconds * 1000)
        self.monotonic_seconds += seconds


def clock_of(clocks: Clocks, members: int = 3, floor_ms: int = 0) -> GroupClock:
    return GroupClock(members, lambda: floor_ms, wall_clock_ms=clocks.wall, monotonic=clocks.monotonic)


@pytest.mark.parametrize(("readings", "members", "expected"), [
    ([T, T + 73 * HOUR_MS, T + 5], 3, T + 5),            # one clock ahead: outvoted
    ([T, T - 73 * HOUR_MS, T + 5], 3, T),                # one clock behind: outvoted too (the median)
    ([T + 73 * HOUR_MS, T], 3, T),                       # two of three heard: the lower
    ([T + 73 * HOUR_MS], 3, None),                       # only our own: no majority
    ([T], 1, T),                                         # a single member is its own majority
    ([T + HOUR_MS, T], 2, T),                            # two members: both must have reached it
    ([T + 9, T + 1, T + 7, T + 3, T + 5], 5, T + 5),     # the median of five
    ([T + 9, T + 1, T + 7, T + 3], 5, T + 3),            # four of five: the third latest
    ([T + 9, T + 7], 5, None),
])
def test_the_majority_reading(readings: list[int], members: int, expected: int | None) -> None:
    assert majority_reading(readings, members) == expected


def test_a_leader_hours_ahead_is_outvoted_by_its_peers() -> None:
    clocks = Clocks(T + 73 * HOUR_MS)
    clock = clock_of(clocks)
    clock.record("n1", T)
    clock.record("n2", T + 3)
    assert clock.now_ms() == T + 3  # the median: the later of the two right clocks
    assert clock.corroborated_ms() == T + 3
    assert clock.offsets_ms() == {"n1": -73 * HOUR_MS, "n2": -73 * HOUR_MS + 3}


def test_a_peer_estimate_moves_with_our_monotonic_clock_not_our_wall_clock() -> None:
    clocks = Clocks(T)
    clock = clock_of(clocks)
    clock.record("n1", T)
    clock.record("n2", T)
    clocks.advance(2.0)
    assert clock.now_ms() == T + 2000
    clocks.wall_ms += 73 * HOUR_MS  # our own clock jumps after the readings: the peers' estimates do not
    assert clock.now_ms() == T + 2000
    assert sorted(clock.readings_ms()) == [T + 2000, T + 2000, T + 2000 + 73 * HOUR_MS]


def test_the_group_time_never_goes_back() -> None:
    clocks = Clocks(T)
    clock = clock_of(clocks)
    clock.record("n1", T + 10_000)
    clock.record("n2", T + 10_000)
    assert clock.now_ms() == T + 10_000
    clock.record("n1", T - HOUR_MS)  # a majority steps back an hour
    clock.record("n2", T - HOUR_MS)
    assert clock.corroborated_ms() == T - HOUR_MS
    assert clock.now_ms() == T + 10_000


def test_the_group_time_is_never_below_the_replicated_state() -> None:
    state = ReplicatedState(last_store_timestamp=T + HOUR_MS)
    clocks = Clocks(T)
    clock = GroupClock(3, lambda: replicated_floor_ms(state), wall_clock_ms=clocks.wall, monotonic=clocks.monotonic)
    clock.record("n1", T)
    clock.record("n2", T)
    assert clock.now_ms() == T + HOUR_MS  # a new leader behind its predecessor continues from its last stamp
    assert clock.corroborated_ms() == T  # destructive decisions do not take the floor
    state.leader_stamp = LeaderStamp(4, "n1", T + 2 * HOUR_MS)
    assert clock.now_ms() == T + 2 * HOUR_MS


def test_stale_readings_are_ignored() -> None:
    clocks = Clocks(T + 73 * HOUR_MS)
    clock = clock_of(clocks)
    clock.record("n1", T)
    clocks.advance(CLOCK_SAMPLE_MAX_AGE_SECONDS / 2)
    clock.record("n2", T + int(CLOCK_SAMPLE_MAX_AGE_SECONDS * 500))
    assert len(clock.readings_ms()) == 3
    clocks.advance(CLOCK_SAMPLE_MAX_AGE_SECONDS / 2 + 0.1)  # n1's reading is now too old
    assert len(clock.readings_ms()) == 2
    assert clock.corroborated_ms() == min(clock.readings_ms())  # two of three: the lower, never ours alone
    clocks.advance(CLOCK_SAMPLE_MAX_AGE_SECONDS)  # none left: no majority
    assert clock.readings_ms() == [clocks.wall_ms]
    assert clock.corroborated_ms() is None
    before = clock.now_ms()
    clocks.advance(10.0)
    assert clock.now_ms() == before  # cut off from the group: time does not follow our clock alone
    assert clock.offsets_ms() == {}


def test_a_new_group_starts_from_a_clock_not_the_epoch() -> None:
    clocks = Clocks(T)
    assert clock_of(clocks).now_ms() == T
    assert clock_of(clocks, members=1).now_ms() == T


def test_clock_messages_are_recognized_and_nothing_else() -> None:
    assert clock_reading(clock_message(T)) == T
    for other in ({"type": "append_entries"}, {"type": "raftmq_clock", "wall_clock_ms": "1"},
                  {"type": "raftmq_clock", "wall_clock_ms": True}, {"type": "raftmq_clock", "wall_clock_ms": -1},
                  ["raftmq_clock"], "n1", None):
        assert clock_reading(other) is None


def free_port() -> int:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        port: int = listener.getsockname()[1]
        return port


@contextmanager
def members_with_clocks(offsets_ms: list[int]) -> Iterator[list[GroupClock]]:
    """Real pysyncobj members on loopback, each with our transport and a group clock whose own wall clock
    is the real one moved by its offset."""
    addresses = [f"127.0.0.1:{free_port()}" for _ in offsets_ms]
    def moved(offset_ms: int) -> Callable[[], int]:
        return lambda: time.time_ns() // 1_000_000 + offset_ms

    clocks = [GroupClock(len(offsets_ms), wall_clock_ms=moved(offset)) for offset in offsets_ms]
    members = [SyncObj(address, [other for other in addresses if other != address], conf=tuned_conf(),
                       transportClass=transport_class(SECRET, group_clock=clock))
               for address, clock in zip(addresses, clocks, strict=True)]
    try:
        yield clocks
    finally:
        for member in members:
            member.destroy()


def test_members_learn_each_others_clocks_over_the_transport() -> None:
    with members_with_clocks([73 * HOUR_MS, 0, 0]) as clocks:
        wait_for(lambda: all(len(clock.readings_ms()) == 3 for clock in clocks),
                 "every member hears the others", timeout_seconds=10)
        skewed = clocks[0]
        offsets = sorted(skewed.offsets_ms().values())
        assert all(abs(offset + 73 * HOUR_MS) < 2000 for offset in offsets), offsets
        real_ms = time.time_ns() // 1_000_000
        for clock in clocks:  # every member, the skewed one too, agrees on the majority's time
            assert abs(clock.now_ms() - real_ms) < 2000
