"""Every Python process of a test run reads its wall clock moved by one offset: ``make test-at DATE=...``
puts this directory first on PYTHONPATH, so Python imports this module at startup in the test process and
in every broker, name server and client process it starts, and they all agree on the moved time.

Only the wall clock moves (``time.time``, ``time.time_ns``: what our code reads for dates, store and born
timestamps, UNIQ_KEYs, timers and retention); the monotonic clock, which paces waits and timeouts, does
not. (libfaketime moves it too, and Python's timed waits then hang or fail.)
"""

from __future__ import annotations

import os
import time

OFFSET_NS = int(os.environ.get("RAFTMQ_TEST_CLOCK_OFFSET_NS", "0") or "0")

if OFFSET_NS:
    _real_time_ns = time.time_ns

    def _moved_time_ns() -> int:
        return _real_time_ns() + OFFSET_NS

    def _moved_time() -> float:
        return (_real_time_ns() + OFFSET_NS) / 1e9

    time.time_ns = _moved_time_ns
    time.time = _moved_time
