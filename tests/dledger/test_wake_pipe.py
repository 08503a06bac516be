"""dledger/wake_pipe.py: a wake-up is drained with one read (pysyncobj's PipeNotifier read until EAGAIN: a
second system call and an exception per wake-up), every wake-up still runs the callback, and a full pipe is
drained whole."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import pytest
from pysyncobj.poller import createPoller

from dledger.wake_pipe import WakePipe


class CountingPoller:
    """pysyncobj's poller interface, recording the one subscription."""

    def __init__(self) -> None:
        self.descriptor = -1
        self.handler: Callable[[int, int], None] | None = None

    def subscribe(self, descriptor: int, handler: Callable[[int, int], None], _events: int) -> None:
        self.descriptor, self.handler = descriptor, handler


def reads_counted(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    counts: list[int] = []
    real_read = os.read

    def read(descriptor: int, size: int) -> bytes:
        counts.append(descriptor)
        return real_read(descriptor, size)

    monkeypatch.setattr(os, "read", read)
    return counts


def test_one_wake_up_is_drained_with_one_read(monkeypatch: pytest.MonkeyPatch) -> None:
    poller = CountingPoller()
    woken: list[int] = []
    pipe = WakePipe(poller, lambda: woken.append(1))
    pipe.notify()
    reads = reads_counted(monkeypatch)
    assert poller.handler is not None
    poller.handler(poller.descriptor, 1)
    assert woken == [1] and len(reads) == 1
    monkeypatch.undo()
    with pytest.raises(BlockingIOError):
        os.read(poller.descriptor, 1)  # drained


def test_a_full_pipe_neither_raises_nor_stays_full(monkeypatch: pytest.MonkeyPatch) -> None:
    poller = CountingPoller()
    woken: list[int] = []
    pipe = WakePipe(poller, lambda: woken.append(1))
    for _ in range(70_000):  # more than a pipe holds (64 KiB)
        pipe.notify()
    assert poller.handler is not None
    poller.handler(poller.descriptor, 1)
    assert woken == [1]
    with pytest.raises(BlockingIOError):
        os.read(poller.descriptor, 1)


def test_a_notify_from_another_thread_wakes_a_real_poll() -> None:
    import threading

    poller: Any = createPoller("auto")
    woken = threading.Event()
    pipe = WakePipe(poller, woken.set)
    thread = threading.Thread(target=pipe.notify)
    thread.start()
    thread.join()
    poller.poll(5.0)  # returns at once: the byte is there
    assert woken.is_set()
