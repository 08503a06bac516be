"""UNIQ_KEY generation (client.unique_id) on an injected clock: Java's layout, and no id repeated at any
point of a month, at any rate, or when the clock steps back."""

from __future__ import annotations

import random

import pytest

from client.unique_id import COUNTER_VALUES, UniqueIdGenerator, as_int32, is_unique_id, month_start_ms

#: some instant; every point below is taken relative to the start of its month (local time, as Java's)
SOME_MS = 1_700_000_000_000
MONTH_START_MS, NEXT_MONTH_START_MS = month_start_ms(SOME_MS)
INT32_MS = 2**31  # the 25th of the month at about 20:31


class Clock:
    def __init__(self, now_ms: int) -> None:
        self.now_ms = now_ms

    def __call__(self) -> int:
        return self.now_ms


def time_field(unique_id: str) -> int:
    return int.from_bytes(bytes.fromhex(unique_id)[10:14], "big", signed=True)


def counter_field(unique_id: str) -> int:
    return int.from_bytes(bytes.fromhex(unique_id)[14:16], "big")


def generator_at(now_ms: int, seed: int = 7) -> tuple[UniqueIdGenerator, Clock]:
    clock = Clock(now_ms)
    return UniqueIdGenerator("10.1.2.3", pid=0x12345, rng=random.Random(seed), clock_ms=clock), clock


def test_unique_ids_have_java_layout() -> None:
    generator, _ = generator_at(SOME_MS)
    ids = [generator.next_id() for _ in range(1000)]
    assert len(set(ids)) == 1000 and all(is_unique_id(each) for each in ids)
    first = bytes.fromhex(ids[0])
    assert first[:4] == bytes([10, 1, 2, 3])
    assert first[4:6] == (0x2345).to_bytes(2, "big")  # the pid's low 16 bits, as Java's short
    assert time_field(ids[0]) == SOME_MS - MONTH_START_MS
    # the fixed prefix (ip, pid, random) is shared; only time and counter change
    assert {each[:20] for each in ids} == {ids[0][:20]}
    assert [counter_field(each) for each in ids] == [(counter_field(ids[0]) + n) & 0xFFFF for n in range(1000)]


def test_as_int32_is_javas_cast() -> None:
    assert as_int32(0) == 0 and as_int32(2**31 - 1) == 2**31 - 1
    assert as_int32(2**31) == -(2**31) and as_int32(2**32 - 1) == -1 and as_int32(2**32) == 0
    assert as_int32(-1) == -1


@pytest.mark.parametrize("offset_ms", [0, 1, 86_400_000, INT32_MS - 1, INT32_MS, INT32_MS + 1,
                                       NEXT_MONTH_START_MS - MONTH_START_MS - 1])
def test_time_field_is_javas_int_cast_at_every_point_of_the_month(offset_ms: int) -> None:
    generator, _ = generator_at(MONTH_START_MS + offset_ms)
    assert time_field(generator.next_id()) == as_int32(offset_ms)


def test_ids_keep_changing_past_two_to_the_31_milliseconds() -> None:
    """The bug of the 25th: past 2^31 ms the time field was clamped, so a generator repeated its ids
    after 65,536 sends. 70,000 sends over 7 s of clock from 1 s before the mark: all distinct."""
    generator, clock = generator_at(MONTH_START_MS + INT32_MS - 1000)
    ids = []
    for number in range(70_000):
        if number % 10 == 0:
            clock.now_ms += 1
        ids.append(generator.next_id())
    assert len(set(ids)) == len(ids)
    fields = [time_field(each) for each in ids]
    assert fields[0] == INT32_MS - 999 and fields[-1] == as_int32(INT32_MS + 6000)
    assert min(fields) == -(2**31)  # wrapped, as Java's (int) cast does


def test_ids_differ_across_the_month_boundary_and_the_field_starts_over() -> None:
    generator, clock = generator_at(NEXT_MONTH_START_MS - 2)
    before = [generator.next_id() for _ in range(3)]
    clock.now_ms = NEXT_MONTH_START_MS
    after = [generator.next_id() for _ in range(3)]
    assert len(set(before + after)) == 6
    assert time_field(before[0]) == as_int32(NEXT_MONTH_START_MS - 2 - MONTH_START_MS) < 0  # a 28-day month too
    assert [time_field(each) for each in after] == [0, 0, 0]
    clock.now_ms = NEXT_MONTH_START_MS + 5
    assert time_field(generator.next_id()) == 5


def test_a_clock_that_steps_back_holds_the_time_field_and_repeats_nothing() -> None:
    generator, clock = generator_at(MONTH_START_MS + INT32_MS + 10_000)
    ids = [generator.next_id() for _ in range(100)]
    clock.now_ms -= 5_000  # NTP steps the clock back 5 s
    ids += [generator.next_id() for _ in range(100)]
    assert {time_field(each) for each in ids} == {as_int32(INT32_MS + 10_000)}
    clock.now_ms += 6_000  # the clock passes the time the generator held
    ids.append(generator.next_id())
    assert time_field(ids[-1]) == as_int32(INT32_MS + 11_000)
    assert len(set(ids)) == len(ids)


def test_a_clock_stepping_back_across_the_month_start_keeps_the_later_month() -> None:
    generator, clock = generator_at(NEXT_MONTH_START_MS + 1_000)
    first = generator.next_id()
    clock.now_ms = NEXT_MONTH_START_MS - 60_000  # back into the previous month
    held = generator.next_id()
    assert time_field(first) == time_field(held) == 1_000 and first != held


def test_more_than_65536_ids_in_one_millisecond_move_the_time_on() -> None:
    generator, clock = generator_at(MONTH_START_MS + 1_000)
    ids = [generator.next_id() for _ in range(COUNTER_VALUES * 2 + 10)]  # the clock never moves
    assert len(set(ids)) == len(ids)
    fields = [time_field(each) for each in ids]
    assert fields[0] == fields[COUNTER_VALUES - 1] == 1_000
    assert fields[COUNTER_VALUES] == 1_001 and fields[-1] == 1_002
    clock.now_ms += 1  # the clock catches up with the generator's time: still no repeat
    ids.append(generator.next_id())
    assert time_field(ids[-1]) == 1_002 and len(set(ids)) == len(ids)


def test_generators_seeded_alike_do_not_collide() -> None:
    now = MONTH_START_MS + INT32_MS + 60_000
    first, _ = generator_at(now, seed=3)
    second, _ = generator_at(now, seed=3)
    a = [first.next_id() for _ in range(1000)]
    b = [second.next_id() for _ in range(1000)]
    assert not set(a) & set(b)
    assert a[0][:12] == b[0][:12]  # same ip and pid: the random field tells them apart
