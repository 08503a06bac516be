"""Timed delivery at an arbitrary time (second precision, up to 30 days ahead): the send-side rules and the
leader's timer service. The stored form and the replicated rules (what a release releases) are in
``dledger.timers``.

A producer names the time with ``__STARTDELIVERTIME`` or ``TIMER_DELIVER_MS`` (epoch milliseconds) or
``TIMER_DELAY_SEC`` / ``TIMER_DELAY_MS`` (relative). A time less than about a second ahead is delivered at
once; anything else is stored as a timer and released by the leader with a ``TimerRelease`` operation once
due.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Final

from broker.context import BrokerContext
from broker.requests import RequestError
from dledger.command import Command, TimerRelease
from dledger.timers import TIMER_PROGRESS_KEY, TIMER_RELEASE_MAX, TIMER_SPAN_MAX_SECONDS, timer_key
from protocol.codes import ResponseCode
from protocol.topics import TIMER_TOPIC

log = logging.getLogger(__name__)

TIMER_HORIZON_MS: Final = 30 * 86_400_000
#: closer than this, a timed message is simply delivered now
TIMER_IMMEDIATE_MS: Final = 1_000
ABSOLUTE_PROPERTIES: Final = ("__STARTDELIVERTIME", "TIMER_DELIVER_MS")
RELATIVE_PROPERTIES: Final = {"TIMER_DELAY_SEC": 1000, "TIMER_DELAY_MS": 1}
#: every property that asks for a delivery time
TIMER_PROPERTIES: Final = frozenset((*ABSOLUTE_PROPERTIES, *RELATIVE_PROPERTIES))
#: an idle leader moves the progress forward at most this often (one small command)
IDLE_ADVANCE_SECONDS: Final = 10.0


def due_time_ms(properties: dict[str, str], now_ms: int) -> int | None:
    """The delivery time a message asks for, or None; RequestError for a bad value."""
    due: int | None = None
    for name in ABSOLUTE_PROPERTIES:
        if name in properties:
            due = _number(name, properties[name])
    for name, unit in RELATIVE_PROPERTIES.items():
        if name in properties:
            delay = _number(name, properties[name])
            if delay < 0:
                raise RequestError(ResponseCode.MESSAGE_ILLEGAL, f"{name} must not be negative, got {delay}")
            due = now_ms + delay * unit
    if due is None:
        return None
    if due - now_ms > TIMER_HORIZON_MS:
        raise RequestError(ResponseCode.MESSAGE_ILLEGAL,
                           f"delivery time {due} is more than 30 days ahead (now {now_ms})")
    return due


def _number(name: str, text: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise RequestError(ResponseCode.MESSAGE_ILLEGAL, f"{name} must be an integer, got {text[:30]!r}") from None


class TimerService:
    def __init__(self, broker: BrokerContext, wall_clock_ms: Callable[[], int] | None = None,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.broker = broker
        self.wall_clock_ms = wall_clock_ms or broker.wall_clock_ms
        self.monotonic = monotonic
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._last_advance = 0.0
        #: timers released by this member while leader (status, tests)
        self.released = 0

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="timer-delivery")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def wake(self) -> None:
        self._wake.set()

    async def _run(self) -> None:
        while True:
            self._wake.clear()
            sleep_seconds = 1.0
            if self.broker.member.is_leader:
                try:
                    sleep_seconds = await self.release_due()
                except RequestError as exc:
                    log.info("timer delivery paused: %s", exc.remark)
                    sleep_seconds = 0.5
                except Exception:
                    log.exception("timer delivery failed")
                    sleep_seconds = 0.5
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), max(0.001, sleep_seconds))

    async def release_due(self) -> float:
        """Release every due timer; return how long to sleep (until the next second starts)."""
        broker = self.broker
        store = broker.store
        while True:
            progress = broker.state.timer_progress.get(TIMER_PROGRESS_KEY)
            now_ms = self.wall_clock_ms()
            until_next_second = (1000 - now_ms % 1000) / 1000
            if progress is None:
                return 1.0
            now_second = now_ms // 1000
            if progress >= now_second:
                return until_next_second
            last = min(now_second, progress + TIMER_SPAN_MAX_SECONDS)
            target = None
            for second in range(progress + 1, last + 1):
                if store.query_by_key(TIMER_TOPIC, timer_key(second), 1):
                    target = second
                    break
            if target is None:
                if self.monotonic() - self._last_advance < IDLE_ADVANCE_SECONDS and last == now_second:
                    return until_next_second
                target = last
            start = 0
            while True:
                result = await broker.propose(Command((TimerRelease(target, start),)))
                self.released += sum(len(results) for results in result.message_results)
                self._last_advance = self.monotonic()
                if broker.state.timer_progress.get(TIMER_PROGRESS_KEY, 0) >= target:
                    break
                start += TIMER_RELEASE_MAX
