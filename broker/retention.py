"""Retention (RocketMQ's fileReservedTime), leader-only, through Raft.

Every ``retention_check_seconds`` the leader looks at the oldest commit-log segments: a segment whose
records are all older than ``file_reserved_seconds`` may go, unless something still needs it: a delayed
message not yet delivered, a transaction half not yet resolved, a timer not yet released. The leader
proposes ``Retention(min_physical_offset)`` (the start of the first segment to keep) and every replica
deletes the same whole segments at the same Raft index (``MessageStore.delete_below``), pruning its
consume queues and key index to match. Consumers whose offsets fall below are moved forward, as RocketMQ
moves them (PULL_OFFSET_MOVED).

Time (issue "Time": a leader whose clock was 73 h ahead deleted minutes-old segments on every replica).
Deleting is the one decision that cannot be undone, so it is taken on corroborated time only:

1. The cutoff is the group's *corroborated* time (``GroupClock.corroborated_ms``): the latest time a
   majority of the members' clocks have reached, without the replicated floor. One member's clock, the
   leader's included, moves it neither way; with fewer than a majority of clocks heard nothing is deleted.
2. The group's time may not run ahead of this leader's monotonic clock: the first check of a leadership
   tenure anchors (monotonic time, group time), and a check whose group time is further ahead of the anchor
   than the monotonic time elapsed (plus :data:`CLOCK_JUMP_TOLERANCE_MS` and a drift allowance) deletes
   nothing for the rest of the tenure. This catches a jump of a *majority* of the clocks while a leader
   lasts (a new leader, after a transfer or a restart, starts a new anchor and accepts the time it finds).
3. Nothing is deleted while the cutoff lies further than the idle tolerance past the newest stored
   message (``last_store_timestamp``): with data flowing the cutoff is always far behind it, so this only
   bites a log that has been idle for longer than the retention time plus the tolerance (nothing grows
   then, and the next message written lifts it) or a group time that jumped before anything was stamped
   by it. It costs an idle group nothing, and it stops a majority's jump that nothing has been written at.

What this does not stop: a majority of the clocks ahead together, from a tenure's start with data being
written (messages are then stamped by the jumped time, which becomes the group's); that needs a majority
of wrong clocks, and it is reported (``GroupClock`` warns about every member whose clock is more than
``CLOCK_WARN_OFFSET_MS`` from its own).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Final

from broker.context import BrokerContext
from broker.delay import level_key
from broker.requests import RequestError
from commitlog.record_codec import decode_record
from commitlog.store import MessageStore
from dledger.command import Command, Retention
from dledger.timers import TIMER_PROGRESS_KEY, timer_due_second
from protocol.topics import SCHEDULE_TOPIC, TIMER_TOPIC, TRANS_HALF_TOPIC

log = logging.getLogger(__name__)

#: timer-queue units looked at per check when looking for the oldest pending timer
TIMER_SCAN_MAX: Final = 100_000
#: how far the group's time may run ahead of a leader's monotonic clock within one tenure (NTP steps of
#: seconds pass), plus this fraction of the time elapsed (clock frequency corrections; NTP slews at most
#: 0.05%) ...
CLOCK_JUMP_TOLERANCE_MS: Final = 60_000
CLOCK_DRIFT_RATE_MAX: Final = 0.001
#: ... and how far past the newest stored message a cutoff may lie (at least; and at least a few checks)
IDLE_TOLERANCE_SECONDS_MIN: Final = 600.0
IDLE_TOLERANCE_CHECKS: Final = 3


def first_physical(store: MessageStore, topic: str, queue_id: int, queue_offset: int) -> int | None:
    """The commit-log offset of a queue's unit, or None when the queue does not reach it."""
    if queue_offset >= store.max_queue_offset(topic, queue_id):
        return None
    result = store.get_messages(topic, queue_id, max(queue_offset, store.min_queue_offset(topic, queue_id)), 1)
    if not result.messages:
        return None
    return int.from_bytes(result.messages[0][28:36], "big", signed=True)


class RetentionService:
    def __init__(self, broker: BrokerContext, clock_ms: Callable[[], int | None] | None = None,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        """``clock_ms`` is the corroborated group time (None: not enough clocks heard to delete anything)."""
        self.broker = broker
        self.clock_ms = clock_ms or broker.corroborated_clock_ms
        self.monotonic = monotonic
        self._task: asyncio.Task[None] | None = None
        #: this tenure's (monotonic seconds, group time in ms) that later checks are held to (see module doc)
        self._anchor: tuple[float, int] | None = None
        #: why the last check deleted nothing because of time (status, tests); None when time allowed it
        self.time_refusal: str | None = None
        #: which kind of refusal that was ("clocks", "jump", "idle"): each change of kind is logged once
        self.time_refusal_kind: str | None = None

    def start(self) -> None:
        if self.broker.config.file_reserved_seconds > 0:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="retention")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.broker.config.retention_check_seconds)
            if not self.broker.member.is_leader:
                self._anchor = None  # a later tenure anchors anew
                continue
            try:
                await self.check()
            except RequestError as exc:
                log.info("retention paused: %s", exc.remark)
            except Exception:
                log.exception("retention check failed")

    def pins(self) -> list[int]:
        """Commit-log offsets still needed: undelivered delays, unresolved halves, unreleased timers."""
        broker = self.broker
        store = broker.store
        state = broker.state
        needed: list[int] = []
        for level in range(1, len(broker.config.delay_levels_seconds) + 1):
            physical = first_physical(store, SCHEDULE_TOPIC, level - 1, state.timer_progress.get(level_key(level), 0))
            if physical is not None:
                needed.append(physical)
        physical = first_physical(store, TRANS_HALF_TOPIC, 0, state.transaction_progress)
        if physical is not None:
            needed.append(physical)
        timer_progress = state.timer_progress.get(TIMER_PROGRESS_KEY)
        offset = store.min_queue_offset(TIMER_TOPIC, 0)
        end = min(store.max_queue_offset(TIMER_TOPIC, 0), offset + TIMER_SCAN_MAX)
        while offset < end:
            result = store.get_messages(TIMER_TOPIC, 0, offset, 64)
            if not result.messages:
                break
            pending = None
            for raw in result.messages:
                stored = decode_record(raw, check_crc=False)
                due = timer_due_second(stored.properties)
                if timer_progress is None or due is None or due > timer_progress:
                    pending = stored.physical_offset
                    break
            if pending is not None:
                needed.append(pending)
                break
            offset = result.next_begin_offset
        if offset >= end and end < store.max_queue_offset(TIMER_TOPIC, 0):
            needed.append(first_physical(store, TIMER_TOPIC, 0, end) or 0)  # not scanned yet: keep it
        return needed

    def cutoff_ms(self) -> int | None:
        """Records stored before this may go: the corroborated group time less the retention time, or None
        (and :attr:`time_refusal` says why) when time cannot be trusted to delete (see the module doc)."""
        config = self.broker.config
        self.time_refusal = self.time_refusal_kind = None
        reading = self.clock_ms()
        if reading is None:
            self.time_refusal_kind = "clocks"
            self.time_refusal = "the clocks of a majority of the group are not heard"
            return None
        now = self.monotonic()
        if self._anchor is None:
            self._anchor = (now, reading)
        anchor_seconds, anchor_ms = self._anchor
        elapsed_ms = (now - anchor_seconds) * 1000
        ahead_ms = reading - anchor_ms - elapsed_ms
        if ahead_ms > CLOCK_JUMP_TOLERANCE_MS + elapsed_ms * CLOCK_DRIFT_RATE_MAX:
            self.time_refusal_kind = "jump"
            self.time_refusal = (f"the group's time ran {ahead_ms / 1000:.0f} s ahead of this leader's monotonic "
                                 "clock: a majority of the clocks jumped; nothing is deleted while this member "
                                 "leads (transfer leadership or restart it once the clocks are right)")
            return None
        # The anchor follows the time, but never back: a reading that dips (a clock missing for a moment)
        # must not make the next, right, reading look like a jump.
        self._anchor = (now, max(reading, anchor_ms + int(elapsed_ms)))
        cutoff = reading - config.file_reserved_seconds * 1000
        tolerance_ms = int(max(IDLE_TOLERANCE_SECONDS_MIN, IDLE_TOLERANCE_CHECKS * config.retention_check_seconds)
                           * 1000)
        newest = self.broker.state.last_store_timestamp
        if cutoff > newest + tolerance_ms:
            self.time_refusal_kind = "idle"
            self.time_refusal = (f"the cutoff {cutoff} is {(cutoff - newest) / 1000:.0f} s past the newest stored "
                                 f"message ({newest}): the log is idle or the group's time jumped")
            return None
        return cutoff

    async def check(self) -> int | None:
        """Propose the retention point if it moves; return it (None when nothing can go)."""
        broker = self.broker
        store = broker.store
        previous_refusal = self.time_refusal_kind
        cutoff = self.cutoff_ms()  # first: a tenure's first check anchors its time, whatever the log holds
        if cutoff is None:
            if self.time_refusal_kind != previous_refusal:  # said once, not every check
                log.warning("retention deletes nothing: %s", self.time_refusal)
            return None
        starts = list(store.commit_log.starts)
        if len(starts) < 2:
            return None
        keep_from = starts[0]
        for next_start in starts[1:]:
            if next_start >= store.max_physical_offset:
                break
            # the first record of the next segment was stored after every record of the one before
            if store.store_timestamp_at(next_start) >= cutoff:
                break
            keep_from = next_start
        pins = self.pins()
        if pins:
            lowest = min(pins)
            while keep_from > starts[0] and keep_from > lowest:
                keep_from = max(start for start in starts if start <= lowest)
        if keep_from <= store.commit_log.min_offset:
            return None
        await broker.propose(Command((Retention(keep_from),)))
        log.info("retention: commit log now starts at %d", keep_from)
        return keep_from
