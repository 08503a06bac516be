"""Waiting for a condition with a deadline: tests never sleep to wait for something to happen."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

__all__ = ["POLL_INTERVAL_SECONDS", "wait_for"]

Result = TypeVar("Result")
POLL_INTERVAL_SECONDS = 0.05


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
