"""Helpers every real-process test and benchmark shares."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from typing import TypeVar

Result = TypeVar("Result")
POLL_INTERVAL_SECONDS = 0.05


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """Ports the kernel picked as free; all are held open together so they are distinct."""
    sockets = []
    try:
        for _ in range(count):
            probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            probe.bind((host, 0))
            sockets.append(probe)
        return [probe.getsockname()[1] for probe in sockets]
    finally:
        for probe in sockets:
            probe.close()


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
