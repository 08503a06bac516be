"""Helpers every real-process test and benchmark shares."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from cli.cluster import free_ports

__all__ = ["free_ports", "wait_for"]

Result = TypeVar("Result")
POLL_INTERVAL_SECONDS = 0.05


def wait_for(condition: Callable[[], Result | None], timeout_seconds: float, what: str) -> Result:
    """Poll ``condition`` until it returns something truthy (0, None, False and empty mean "not yet");
    AssertionError naming ``what`` at the deadline (tests never sleep to wait for a condition)."""
    deadline = time.monotonic() + timeout_seconds
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_seconds} s waiting for {what}")
        time.sleep(POLL_INTERVAL_SECONDS)
