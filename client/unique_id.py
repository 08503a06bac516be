"""Client-side message ids (``UNIQ_KEY``), in the format of Java's ``MessageClientIDSetter``.

32 upper-case hex characters of 16 bytes::

    ip (4) | pid (int16) | a per-generator random int32 (Java: the class loader's hash code) |
    milliseconds since the start of the current month (int32) | counter (int16)

The first 10 bytes are fixed per generator; the last 6 change with every id. The generator takes its
clock and randomness from the caller, so tests drive it deterministically.

**No id of a generator repeats within a month of its clock** (the broker's dedupe window is two
minutes), whatever the date, the send rate or the clock does:

* the time field is Java's ``(int)`` cast of the milliseconds since the month began: past 2^31 ms (the
  25th, about 20:31) it wraps to negative values instead of stopping, and a month never holds 2^32 ms;
* the generator's time never goes back: a clock that steps back holds the time field where it was, and
  the counter goes on (Java sets the field to 0 instead, which may repeat earlier ids);
* a time field takes at most 2^16 counter values: the 2^16+1-th id within one millisecond (or while a
  clock that stepped back is held) moves the generator's time one millisecond ahead of the clock;
* two generators of one process never share the fixed part, even when seeded alike: the random field is
  mixed with the generator's sequence number in the process.
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
#: counter values (int16) one time field can take before the generator's time moves on
COUNTER_VALUES: Final = 1 << 16
#: a Weyl-sequence step (odd, so distinct sequence numbers below 2^32 give distinct products mod 2^32)
_SEQUENCE_SPREAD: Final = 0x9E3779B1
#: generators made in this process so far (each takes the next number)
_generator_numbers = itertools.count()


def month_start_ms(now_ms: int) -> tuple[int, int]:
    """(start of the month holding ``now_ms``, start of the next month), local time, in ms (Java uses
    the local calendar too)."""
    moment = datetime.datetime.fromtimestamp(now_ms / 1000).astimezone()
    start = moment.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    following = (start + datetime.timedelta(days=32)).replace(day=1)
    return int(start.timestamp() * 1000), int(following.timestamp() * 1000)


def as_int32(value: int) -> int:
    """Java's ``(int)`` cast of a long: the low 32 bits, signed."""
    return ((value & 0xFFFFFFFF) ^ 0x80000000) - 0x80000000


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
        # generators seeded alike (tests, or two producers given one seed) still differ in this field
        spread = next(_generator_numbers) * _SEQUENCE_SPREAD
        random_field = as_int32(generator_random.randint(-(2**31), 2**31 - 1) ^ spread)
        self._prefix = _PREFIX.pack(packed_ip, pid_short, random_field)
        self._clock_ms = clock_ms if clock_ms is not None else (lambda: time.time_ns() // 1_000_000)
        self._counter = generator_random.randrange(0, COUNTER_VALUES)
        self._lock = threading.Lock()
        #: the generator's time: the clock's, except that it never goes back and moves on when a
        #: millisecond has used every counter value
        self._now_ms = self._clock_ms()
        #: ids given with the time field of ``_now_ms``
        self._ids_at_now = 0
        self._start_ms, self._next_start_ms = month_start_ms(self._now_ms)

    def next_id(self) -> str:
        with self._lock:
            clock = self._clock_ms()
            if clock > self._now_ms:
                self._now_ms, self._ids_at_now = clock, 0
            elif self._ids_at_now >= COUNTER_VALUES:
                # every counter value was given at this time field: take the next millisecond
                self._now_ms, self._ids_at_now = self._now_ms + 1, 0
            now_ms = self._now_ms
            if now_ms >= self._next_start_ms:
                self._start_ms, self._next_start_ms = month_start_ms(now_ms)
            self._ids_at_now += 1
            counter = self._counter
            self._counter = (counter + 1) & 0xFFFF
        return (self._prefix + _SUFFIX.pack(as_int32(now_ms - self._start_ms), counter)).hex().upper()


def is_unique_id(text: str) -> bool:
    return len(text) == UNIQUE_ID_HEX_CHARS and all(ch in "0123456789ABCDEF" for ch in text)
