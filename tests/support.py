"""Helpers every real-process test and benchmark shares."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any, Final, TypeVar

import pytest

import commitlog.records as records_module
from cli.cluster import free_ports

__all__ = ["SMALL_STORE", "free_ports", "small_store", "wait_for"]

Result = TypeVar("Result")
POLL_INTERVAL_SECONDS = 0.05
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


@pytest.fixture(params=["record by record", "column-wise"])
def both_apply_paths(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run a test both ways of storing prepared records and index entries (``commitlog.records.COLUMNS_MIN``):
    use with ``pytestmark = pytest.mark.usefixtures("both_apply_paths")`` after importing it."""
    if request.param == "column-wise":
        monkeypatch.setattr(records_module, "COLUMNS_MIN", 1)
    return str(request.param)
