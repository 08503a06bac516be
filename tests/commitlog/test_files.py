"""The derived files on their own: consume-queue units and the key index."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from commitlog.consume_queue import CQ_UNIT, ConsumeQueue
from commitlog.key_index import IndexFile, key_hash
from commitlog.key_index_files import KeyIndex
from tests.support.apply_paths import both_apply_paths  # noqa: F401  (a fixture)

units = st.tuples(st.integers(0, 2**63 - 1), st.integers(1, 2**31 - 1), st.integers(-(2**63), 2**63 - 1))


@settings(derandomize=True, max_examples=200)
@given(units)
def test_consume_queue_unit_round_trip(unit: tuple[int, int, int]) -> None:
    assert CQ_UNIT.size == 20
    assert CQ_UNIT.unpack(CQ_UNIT.pack(*unit)) == unit


@settings(derandomize=True, max_examples=25, deadline=None)
@given(st.lists(units, min_size=1, max_size=60), st.integers(0, 40))
def test_consume_queue_runs_cross_files_and_reopen(tmp_path_factory: object, written: list[tuple[int, int, int]],
                                                   start: int) -> None:
    directory = tmp_path_factory.mktemp("cq")  # type: ignore[attr-defined]
    queue = ConsumeQueue(directory, "T", 0, units_per_file=16)
    queue.ensure_capacity(start, start + len(written) - 1)
    queue.put_run(start, written)
    assert queue.units(start, 1000) == written
    queue.close()
    reopened = ConsumeQueue(directory, "T", 0, units_per_file=16)
    assert reopened.max_offset == start + len(written)
    assert reopened.units(start, 1000) == written


def test_consume_queue_truncate_and_prune(tmp_path: Path) -> None:
    queue = ConsumeQueue(tmp_path, "T", 0, units_per_file=8)
    queue.ensure_capacity(0, 29)
    queue.put_run(0, [(offset * 100, 50, 0) for offset in range(30)])
    queue.truncate_physical(2000)  # units 20.. pointed at cut records
    assert queue.max_offset == 20 and queue.units(18, 10) == [(1800, 50, 0), (1900, 50, 0)]
    queue.prune_below(1000)
    assert queue.min_offset == 10 and queue.units(0, 2) == [(1000, 50, 0), (1100, 50, 0)]
    assert min(queue.files) == 8  # the file holding units 0..7 is gone


@pytest.mark.usefixtures("both_apply_paths")
def test_key_index_undo_restores_every_chain(tmp_path: Path) -> None:
    index = KeyIndex(tmp_path, slot_count=4, entry_capacity=8)  # tiny: collisions and file rolls
    entries = [(key_hash("T", f"k{i % 3}"), i * 10, 1_000 + i) for i in range(20)]
    index.prepare(entries[:12])
    index.insert_many(entries[:12])
    before = {f"k{k}": index.lookup(key_hash("T", f"k{k}"), 100) for k in range(3)}
    index.prepare(entries[12:])
    index.insert_many(entries[12:])
    assert len(index.lookup(key_hash("T", "k0"), 100)) > len(before["k0"])
    index.undo_from(120)  # entries for physical offsets >= 120 were cut
    assert {f"k{k}": index.lookup(key_hash("T", f"k{k}"), 100) for k in range(3)} == before
    index.prune_below(80)
    assert all(f.begin_physical >= 0 for f in index.files)
    assert index.lookup(key_hash("T", "k0"), 100)[-1] >= 80 or len(index.files) == 1


@pytest.mark.usefixtures("both_apply_paths")
def test_key_index_lookups_of_a_recent_window_read_only_recent_files(tmp_path: Path) -> None:
    """Same answers as walking every file (a model), without reading files wholly before the window."""
    import random

    rng = random.Random(11)
    index = KeyIndex(tmp_path, slot_count=8, entry_capacity=16)
    entries = [(key_hash("T", f"k{rng.randrange(12)}"), n * 10, 1_000_000 + n * 700) for n in range(400)]
    for start in range(0, len(entries), 37):
        index.prepare(entries[start : start + 37])
        index.insert_many(entries[start : start + 37])
    assert len(index.files) == 25
    for key in range(12):
        wanted = key_hash("T", f"k{key}")
        for begin in (0, 1_050_000, 1_140_000, 1_200_000, 1_279_300, 1_400_000):
            expected = [physical for hashed, physical, store_timestamp in reversed(entries)
                        if hashed == wanted and store_timestamp // 1000 >= begin // 1000][:100]
            assert index.lookup(wanted, 100, begin) == expected, (key, begin)
    read: set[int] = set()
    original = IndexFile.entry

    def recording_entry(self: IndexFile, number: int) -> tuple[int, int, int, int]:
        read.add(self.begin_physical)
        return original(self, number)

    IndexFile.entry = recording_entry  # type: ignore[method-assign]
    try:
        for key in range(12):
            index.lookup(key_hash("T", f"k{key}"), 100, 1_275_000)
    finally:
        IndexFile.entry = original  # type: ignore[method-assign]
    window_files = {f.begin_physical for n, f in enumerate(index.files)
                    if n + 1 == len(index.files) or index.files[n + 1].begin_timestamp // 1000 >= 1_275}
    assert read and read <= window_files and len(window_files) <= 3
