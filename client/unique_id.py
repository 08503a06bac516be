"""Client-side message ids (``UNIQ_KEY``), in the format of Java's ``MessageClientIDSetter``.

32 upper-case hex characters of 16 bytes::

    ip (4) | pid (int16) | a per-generator random int32 (Java: the class loader's hash code) |
    milliseconds since the start of the current month (int32) | counter (int16)

The first 10 bytes are fixed per generator; the last 6 change with every id. The generator takes its
clock and randomness from the caller (house style 7).
"""

from __future__ import annotations

import datetime
import ipaddress
import itertools
import os
import random
import struct
import threading
import time
from collections.abc import Callable
from typing import Final

_PREFIX: Final = struct.Struct(">4shi")
_SUFFIX: Final = struct.Struct(">iH")
UNIQUE_ID_HEX_CHARS: Final = 32


def month_start_ms(now_ms: int) -> tuple[int, int]:
    """(start of the month holding ``now_ms``, start of the next month), local time, in ms (Java uses
    the local calendar too)."""
    moment = datetime.datetime.fromtimestamp(now_ms / 1000).astimezone()
    start = moment.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    following = (start + datetime.timedelta(days=32)).replace(day=1)
    return int(start.timestamp() * 1000), int(following.timestamp() * 1000)


class UniqueIdGenerator:
    """Thread-safe generator of UNIQ_KEY values."""

    def __init__(
        self,
        ip: str = "127.0.0.1",
        *,
        pid: int | None = None,
        rng: random.Random | None = None,
        clock_ms: Callable[[], int] | None = None,
    ) -> None:
        try:
            packed_ip = ipaddress.IPv4Address(ip).packed
        except ValueError:
            packed_ip = bytes(4)
        generator_random = rng if rng is not None else random.Random(os.urandom(16))
        process_id = os.getpid() if pid is None else pid
        # Java keeps the pid as a short: its low 16 bits, signed
        pid_short = ((process_id & 0xFFFF) ^ 0x8000) - 0x8000
        self._prefix = _PREFIX.pack(packed_ip, pid_short, generator_random.randint(-(2**31), 2**31 - 1))
        self._clock_ms = clock_ms if clock_ms is not None else (lambda: time.time_ns() // 1_000_000)
        self._counter = itertools.count(generator_random.randrange(0, 1 << 16))
        self._lock = threading.Lock()
        self._start_ms, self._next_start_ms = month_start_ms(self._clock_ms())

    def next_id(self) -> str:
        with self._lock:
            now_ms = self._clock_ms()
            if now_ms >= self._next_start_ms:
                self._start_ms, self._next_start_ms = month_start_ms(now_ms)
            elapsed = now_ms - self._start_ms
            # as Java's (int) cast: a clock that stepped back a little gives 0
            elapsed = max(0, min(elapsed, 2**31 - 1))
            counter = next(self._counter) & 0xFFFF
        return (self._prefix + _SUFFIX.pack(elapsed, counter)).hex().upper()


def is_unique_id(text: str) -> bool:
    return len(text) == UNIQUE_ID_HEX_CHARS and all(ch in "0123456789ABCDEF" for ch in text)
