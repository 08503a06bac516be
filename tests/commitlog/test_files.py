"""The derived files on their own: consume-queue units and the key index."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from commitlog.consume_queue import CQ_UNIT, ConsumeQueue
from commitlog.key_index import KeyIndex, key_hash

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
