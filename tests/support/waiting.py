"""Waiting for a condition with a deadline: tests never sleep to wait for something to happen (a sleep is
the wrong length on a machine slower or faster than the one it was tuned on)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

__all__ = ["ASYNC_POLL_INTERVAL_SECONDS", "POLL_INTERVAL_SECONDS", "poll_until", "wait_for"]

Result = TypeVar("Result")
POLL_INTERVAL_SECONDS = 0.05
#: in-process servers answer within milliseconds: a test on the event loop checks that often
ASYNC_POLL_INTERVAL_SECONDS = 0.005


def wait_for(
    condition: Callable[[], Result | None],
    what: str,
    *,
    timeout_seconds: float,
    interval_seconds: float = POLL_INTERVAL_SECONDS,
    explain: Callable[[], str] | None = None,
) -> Result:
    """Poll ``condition`` every ``interval_seconds`` until it returns something truthy (0, None, False and
    empty mean "not yet") and return that. At the deadline, AssertionError naming ``what``, followed by what
    ``explain()`` says (a member's log tail, say): the condition is checked once more after the deadline
    passed, so a slow last poll still counts."""
    deadline = time.monotonic() + timeout_seconds
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            message = f"timed out after {timeout_seconds} s waiting for {what}"
            raise AssertionError(message if explain is None else f"{message}\n{explain()}")
        time.sleep(interval_seconds)


async def poll_until(
    condition: Callable[[], object],
    what: str,
    *,
    timeout_seconds: float,
    interval_seconds: float = ASYNC_POLL_INTERVAL_SECONDS,
) -> None:
    """:func:`wait_for` inside an event loop: the test's servers and clients run on the same loop, so it
    sleeps with ``asyncio.sleep`` (letting them run) and reads the loop's clock. AssertionError naming
    ``what`` at the deadline."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_seconds
    while not condition():
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout_seconds} s waiting for {what}")
        await asyncio.sleep(interval_seconds)
