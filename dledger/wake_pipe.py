"""A pipe that wakes pysyncobj's tick thread from its poll: pysyncobj's ``PipeNotifier``, drained with one read.

``PipeNotifier`` reads its pipe until the read fails with EAGAIN: a second system call and an exception on
every wake-up, 4% of a leader's Raft thread at in-flight 1 (system calls are dear). The writers here send at
most one byte per wake-up (``RaftNode._wake_tick_thread`` keeps a flag; the journal flusher one per flush),
so a read that returns less than it asked for has emptied the pipe.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from typing import Any, Final

from pysyncobj.poller import POLL_EVENT_TYPE

_READ_BYTES: Final = 4096


class WakePipe:
    """``notify`` from any thread makes the poll return and ``callback`` run on the polling thread."""

    def __init__(self, poller: Any, callback: Callable[[], None]) -> None:
        self._callback = callback
        self._read_fd, self._write_fd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        poller.subscribe(self._read_fd, self._on_readable, POLL_EVENT_TYPE.READ)

    def notify(self) -> None:
        """One byte in the pipe; a full pipe already holds a wake-up, so BlockingIOError is not raised."""
        with contextlib.suppress(BlockingIOError):
            os.write(self._write_fd, b"w")

    def _on_readable(self, _descriptor: int, _event_mask: int) -> None:
        try:
            while len(os.read(self._read_fd, _READ_BYTES)) == _READ_BYTES:
                pass  # more may wait: a full read leaves the rest for the next one
        except BlockingIOError:
            pass  # exactly a multiple of the read size was there
        self._callback()
