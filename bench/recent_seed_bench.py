"""The cost of seeding the recent-keys filter at open. Prints one JSON line.

Builds a store whose key index holds ``--entries`` entries stamped within the last dedupe window (written
straight into the index, all pointing into one large stored message, so no commit log of that size is
needed; distinct offsets name the index files),
then times opening it with the default seed span and with span 0 (which seeds only the newest second:
the open without the seed, near enough), and :meth:`RecentKeys.seed` on its own. Page cache warm: the
files were just written.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from commitlog.config import StoreConfig
from commitlog.hosts import encode_host
from commitlog.key_index import IndexColumns
from commitlog.key_index_files import KeyIndex
from commitlog.message import MessageInput
from commitlog.recent_keys import SEED_SPAN_MS, RecentKeys
from commitlog.store import MessageStore
from protocol.properties import encode_properties

NEWEST_MS = 1_700_000_000_000
BODY_BYTES = 4_000_000


def build(directory: Path, entries: int, seed: int) -> StoreConfig:
    config = StoreConfig(data_dir=directory, flush_policy="sync").validate()
    store = MessageStore(config, background_flush=False)
    message = MessageInput("BenchTopic", 0, 0, 0, NEWEST_MS - SEED_SPAN_MS, encode_host("127.0.0.1", 1),
                           NEWEST_MS - SEED_SPAN_MS, 0, 0, b"x" * BODY_BYTES,
                           encode_properties({"UNIQ_KEY": "first", "KEYS": "first"}))
    store.append(1, [message])
    store.close()
    rng = np.random.default_rng(seed)
    index = KeyIndex(directory / "index", config.index_slot_count, config.index_entry_capacity)
    # stamps rise evenly over the last window and end at the newest
    timestamps = NEWEST_MS - SEED_SPAN_MS + 1 + (np.arange(entries, dtype=np.int64) * (SEED_SPAN_MS - 1)) // entries
    timestamps[-1] = NEWEST_MS
    # within the one record: recovery keeps entries below the commit log's end
    physicals = (np.arange(entries, dtype=np.int64) * BODY_BYTES) // entries
    chunk = 500_000
    for start in range(0, entries, chunk):
        end = min(entries, start + chunk)
        columns = IndexColumns(rng.integers(0, 1 << 32, end - start, dtype=np.int64),
                               physicals[start:end], timestamps[start:end])
        index.prepare(columns)
        index.insert_many(columns)
    for index_file in index.files:
        index_file.file.flush(0, index.file_bytes)
    index.close()
    return config


def time_open(config: StoreConfig, span_ms: int, repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        store = MessageStore(config, background_flush=False, recent_keys_seed_span_ms=span_ms)
        samples.append(time.perf_counter() - started)
        store.close()
    return statistics.median(samples)


def time_seed(config: StoreConfig, repeats: int) -> float:
    index = KeyIndex(config.data_dir / "index", config.index_slot_count, config.index_entry_capacity)
    samples = []
    try:
        for _ in range(repeats):
            recent = RecentKeys()
            started = time.perf_counter()
            recent.seed(index)
            samples.append(time.perf_counter() - started)
    finally:
        index.close()
    return statistics.median(samples)


def seeded_entries(config: StoreConfig) -> int:
    index = KeyIndex(config.data_dir / "index", config.index_slot_count, config.index_entry_capacity)
    try:
        newest = index.newest_timestamp()
        assert newest is not None
        return sum(len(columns) for columns in index.entries_from_second((newest - SEED_SPAN_MS) // 1000))
    finally:
        index.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--entries", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=1)
    arguments = parser.parse_args()
    directory = Path(tempfile.mkdtemp(prefix="recent-seed-bench-"))
    try:
        config = build(directory, arguments.entries, arguments.seed)
        result = {
            "entries": arguments.entries,
            "index_files": len(list((directory / "index").iterdir())),
            "seeded_entries": seeded_entries(config),
            "open_seeded_s": round(time_open(config, SEED_SPAN_MS, arguments.repeats), 4),
            "open_span_0_s": round(time_open(config, 0, arguments.repeats), 4),
            "seed_only_s": round(time_seed(config, arguments.repeats), 4),
        }
        print(json.dumps(result))
    finally:
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
