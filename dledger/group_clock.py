"""The group's time: the latest time a majority of the members' wall clocks have reached.

Why: the leader decides every time the group uses (store timestamps, timer and delay releases, transaction
check-backs, retention's cutoff, the dedupe window, which is measured in store timestamps). Read from the
leader's own clock alone, one member whose clock jumps hours ahead becomes a leader that stamps messages
hours into the future, releases timers hours early and deletes segments that are minutes old, on every
replica. As Raft lets a majority decide the log, a majority decides the time: a minority of clocks, ahead
or behind, the leader's included, moves nothing.

How each member learns the others' clocks (no extra round trip): the transport sends each connected peer
a tiny ``clock`` message with its wall clock every :data:`CLOCK_SAMPLE_INTERVAL_SECONDS` (and on connecting).
The receiver keeps, per peer, the last reading and the *monotonic* time it arrived; the peer's clock now
is estimated as that reading plus the monotonic time elapsed since. The estimate does not use the
receiver's own wall clock, so the receiver's clock jumping cannot drag its view of the others along. It
lags by the one-way delay (sub-millisecond on a LAN, up to a frame queue's wait under load), which only
makes the estimate conservative (behind). A reading older than :data:`CLOCK_SAMPLE_MAX_AGE_SECONDS` is not
used: that peer is gone or partitioned.

The group's time (:meth:`GroupClock.now_ms`) is the majority reading: with the member's own clock and
the fresh estimates sorted from the latest down, the one at the position of a majority of the group
(2nd of 3, 3rd of 5). At least a majority of the members' clocks have reached it, so a minority ahead
cannot move it forward; with every reading present it is the median, so a minority behind cannot hold it
back either; with readings missing it leans behind (2 of 3 present: the lower one). It is then raised to
never go below the last value this member returned (monotonic across calls) nor below the highest time
already in the replicated state (the last store timestamp, the last leader stamp): a new leader whose
clock is behind continues from where its predecessor stopped.

With fewer readings than a majority (only possible for a member cut off from most of the group, or in the
instant after a restart, before the peers' first clocks arrive) the time does not advance: such a leader
cannot commit anything anyway, and following its own clock then would let a skewed member that wins an
election before hearing from its peers stamp the group hours ahead for good (store timestamps never go
back). A single-member group has its own clock as its majority. Only when nothing is known at all (a new
group's first moments: no floor, no earlier answer) does the earliest available clock stand in.

Destructive decisions (retention) use :meth:`GroupClock.corroborated_ms`: the majority reading itself,
without the replicated floor (a floor pushed ahead by an earlier skew must not age data) and None when
there is no majority of readings: then nothing is deleted.

Threading: readings are recorded on pysyncobj's tick thread and read from the group-commit thread and the
broker's event loop; one lock guards both.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Final

from dledger.state import ReplicatedState

log = logging.getLogger(__name__)

#: how often the transport sends each connected peer its wall clock
CLOCK_SAMPLE_INTERVAL_SECONDS: Final = 0.5
#: a peer's reading older than this (monotonic) is not used: ten intervals missed means it is gone
CLOCK_SAMPLE_MAX_AGE_SECONDS: Final = 5.0
#: a peer whose clock is further than this from ours is reported (a warning, at most once per period)
CLOCK_WARN_OFFSET_MS: Final = 10_000
CLOCK_WARN_PERIOD_SECONDS: Final = 60.0
#: the ``type`` of the transport's clock message: a dict that pysyncobj ignores (it dispatches on known
#: types only), so a member that does not know it is not disturbed by it
CLOCK_MESSAGE_TYPE: Final = "raftmq_clock"


def system_wall_clock_ms() -> int:
    """The process's wall clock in ms, looked up at each call (tests move ``time.time_ns``)."""
    return time.time_ns() // 1_000_000


def replicated_floor_ms(state: ReplicatedState) -> int:
    """The highest time the replicated state holds: the group's time never goes below it."""
    leader_stamp = state.leader_stamp
    return max(state.last_store_timestamp, leader_stamp.timestamp if leader_stamp is not None else 0)


def clock_message(wall_clock_ms: int) -> dict[str, object]:
    return {"type": CLOCK_MESSAGE_TYPE, "wall_clock_ms": wall_clock_ms}


def clock_reading(message: object) -> int | None:
    """The wall clock a peer's clock message carries, or None when ``message`` is not one."""
    if not isinstance(message, dict) or message.get("type") != CLOCK_MESSAGE_TYPE:
        return None
    value = message.get("wall_clock_ms")
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 62 else None


def majority_reading(readings: list[int], members: int) -> int | None:
    """The latest time at least a majority of ``members`` clocks have reached, from the ``readings`` there
    are (one per member at most); None with fewer readings than a majority. Pure: the rule, in one place."""
    majority = members // 2 + 1
    if len(readings) < majority:
        return None
    return sorted(readings, reverse=True)[majority - 1]


class GroupClock:
    def __init__(self, members: int, floor_ms: Callable[[], int] = lambda: 0,
                 wall_clock_ms: Callable[[], int] = system_wall_clock_ms,
                 monotonic: Callable[[], float] = time.monotonic,
                 sample_max_age_seconds: float = CLOCK_SAMPLE_MAX_AGE_SECONDS) -> None:
        if members < 1:
            raise ValueError("a group has at least one member")
        self.members = members
        self.floor_ms = floor_ms
        self.wall_clock_ms = wall_clock_ms
        self.monotonic = monotonic
        self.sample_max_age_seconds = sample_max_age_seconds
        self._lock = threading.Lock()
        #: peer -> (its wall clock in ms, our monotonic time when that arrived)
        self._samples: dict[str, tuple[int, float]] = {}
        self._last_ms = 0
        self._warned: dict[str, float] = {}

    def record(self, peer: str, peer_wall_clock_ms: int) -> None:
        """A clock message from ``peer`` arrived now (transport, tick thread)."""
        now = self.monotonic()
        with self._lock:
            self._samples[peer] = (peer_wall_clock_ms, now)
        offset_ms = peer_wall_clock_ms - self.wall_clock_ms()
        if abs(offset_ms) > CLOCK_WARN_OFFSET_MS and now - self._warned.get(peer, -CLOCK_WARN_PERIOD_SECONDS) \
                >= CLOCK_WARN_PERIOD_SECONDS:
            self._warned[peer] = now
            log.warning("the clock of member %s is %+.1f s from ours: the group's time follows a majority of "
                        "the clocks, not any one of them", peer, offset_ms / 1000)

    def readings_ms(self) -> list[int]:
        """This member's clock and each peer's clock as estimated now, from fresh readings only."""
        now = self.monotonic()
        local_ms = self.wall_clock_ms()
        with self._lock:
            samples = list(self._samples.values())
        readings = [local_ms]
        for peer_ms, received in samples:
            age = now - received
            if 0 <= age <= self.sample_max_age_seconds:
                readings.append(peer_ms + int(age * 1000))
        return readings

    def offsets_ms(self) -> dict[str, int]:
        """Each peer with a fresh reading -> how far its clock is from ours (status, logs)."""
        now = self.monotonic()
        local_ms = self.wall_clock_ms()
        with self._lock:
            samples = dict(self._samples)
        return {peer: peer_ms + int((now - received) * 1000) - local_ms for peer, (peer_ms, received) in samples.items()
                if 0 <= now - received <= self.sample_max_age_seconds}

    def corroborated_ms(self) -> int | None:
        """The majority reading, None without a majority of fresh readings: for destructive decisions."""
        return majority_reading(self.readings_ms(), self.members)

    def now_ms(self) -> int:
        """The group's time (see the module doc): never below an earlier answer nor the replicated floor."""
        readings = self.readings_ms()
        reading = majority_reading(readings, self.members)
        floor = self.floor_ms()
        with self._lock:
            value = max(self._last_ms, floor, reading if reading is not None else 0)
            if value == 0:
                # nothing known at all (a new group's first moments, before any peer's clock arrived): the
                # earliest clock there is, rather than the epoch
                value = min(readings)
            self._last_ms = value
        return value
