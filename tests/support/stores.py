"""Small store files for the members that tests and benchmarks start."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

__all__ = ["SMALL_STORE", "small_store"]

#: [store] sizes for the members tests start. Store files are preallocated whole: with what a local cluster
#: gets otherwise (cli.cluster's 64 MiB segments, StoreConfig's 84 MB key index and 6 MB per consume queue)
#: each three-member group took about 0.5 GB, most of the suite's disk. Small files only roll sooner, as
#: any store's files do. The segment still holds the largest record under the default 4 MiB body limit
#: (StoreConfig.validate checks it), so body limits stay what the tests expect. An index file holds 16k
#: keys: a test that writes far more keyed messages sizes its index itself (a UNIQ_KEY lookup reads every
#: index file; see tests/dledger/test_group.py).
SMALL_STORE: Final[Mapping[str, int]] = {
    "segment_size_bytes": 8 << 20,
    "consume_queue_units_per_file": 4096,  # 80 KiB files
    "index_slot_count": 4096,
    "index_entry_capacity": 16_384,  # 336 KiB files with the slots
}


def small_store(overrides: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, dict[str, Any]]:
    """Member settings (``cli.cluster.node_toml`` sections) with :data:`SMALL_STORE` under the [store] keys
    ``overrides`` sets itself (a test that needs other sizes says so and wins)."""
    merged = {section: dict(values) for section, values in (overrides or {}).items()}
    merged["store"] = {**SMALL_STORE, **merged.get("store", {})}
    return merged

