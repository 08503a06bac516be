"""Raft journal micro-benchmark: dledger.journal's SegmentedJournal against the journal it replaced
(pysyncobj's mmapped FileJournal, made durable by an msync of its map), side by side in one run, for 1 KB
and 300 KB entries. Prints one JSON line per journal and entry size, then a table:

* ``add_us``: microseconds per ``add`` (written to the page cache, not synced);
* ``syncs_per_s``: ``add`` + ``make_durable`` per entry, one after the other (a sync per entry: the rate
  of durable flushes the disk gives this journal);
* ``group_entries_per_s``: entries made durable per second when ``make_durable`` follows every
  ``--group`` adds (group fsync).

Usage: ``python bench/journal_bench.py [--seconds 3] [--group 32] [--dir /path/on/the/disk/to/measure]``
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pysyncobj.journal import FileJournal

from dledger.journal import SegmentedJournal

#: entries per size for the add timing: enough to roll segments, bounded in bytes
ADD_COUNTS = {1024: 20_000, 300 * 1024: 600}
SIZES = (1024, 300 * 1024)


def open_segmented(directory: Path) -> Any:
    return SegmentedJournal(directory / "journal.d")


class MsyncedFileJournal(FileJournal):  # type: ignore[misc]  # pysyncobj ships no type hints
    """pysyncobj's file journal as the member used it before dledger.journal: durable by msync."""

    def make_durable(self) -> None:
        self.flush()


def open_file_journal(directory: Path) -> Any:
    return MsyncedFileJournal(str(directory / "journal"))


JOURNALS: dict[str, Callable[[Path], Any]] = {"segmented": open_segmented, "file_journal": open_file_journal}


def time_adds(journal: Any, payloads: list[bytes], first_index: int) -> float:
    start = time.perf_counter()
    for offset, payload in enumerate(payloads):
        journal.add(payload, first_index + offset, 1)
    return (time.perf_counter() - start) / len(payloads) * 1e6


def rate(journal: Any, payload: bytes, first_index: int, group: int, seconds: float) -> tuple[float, int, int]:
    """(entries made durable per second, make_durable calls, the next index) adding ``group`` entries per
    make_durable."""
    index = first_index
    calls = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(group):
            journal.add(payload, index, 1)
            index += 1
        journal.make_durable()
        calls += 1
    return (index - first_index) / (time.perf_counter() - start), calls, index


def measure(name: str, size: int, root: Path, seconds: float, group: int) -> dict[str, Any]:
    directory = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=root))
    journal = JOURNALS[name](directory)
    try:
        payloads = [os.urandom(size) for _ in range(min(ADD_COUNTS[size], 64))]
        count = ADD_COUNTS[size]
        add_us = time_adds(journal, [payloads[i % len(payloads)] for i in range(count)], 1)
        journal.make_durable()
        syncs_before = journal.syncs
        _, single_calls, next_index = rate(journal, payloads[0], count + 1, 1, seconds)
        syncs = journal.syncs - syncs_before  # fdatasyncs (segmented) or msyncs (file journal) per entry
        group_rate, _, _ = rate(journal, payloads[0], next_index, group, seconds)
        return {"journal": name, "entry_bytes": size, "add_us": round(add_us, 2),
                "syncs_per_s": round(single_calls / seconds, 1), "syncs_counted": syncs,
                "group": group, "group_entries_per_s": round(group_rate, 1),
                "group_mb_per_s": round(group_rate * size / 1e6, 1)}
    finally:
        journal._destroy()
        shutil.rmtree(directory, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=3.0, help="duration of each sync-rate measurement")
    parser.add_argument("--group", type=int, default=32, help="adds per make_durable for the group rate")
    parser.add_argument("--dir", type=Path, default=None, help="where the journals go (default: a temp dir)")
    arguments = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="journal-bench-", dir=arguments.dir))
    results = []
    try:
        for size in SIZES:
            for name in JOURNALS:
                result = measure(name, size, root, arguments.seconds, arguments.group)
                results.append(result)
                print(json.dumps(result), flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"\n{'entry':>8} {'journal':>13} {'add µs':>9} {'syncs/s':>9} {'entries/s (group ' + str(arguments.group) + ')':>24}"
          f" {'MB/s':>7}")
    for result in results:
        print(f"{result['entry_bytes']:>8} {result['journal']:>13} {result['add_us']:>9} {result['syncs_per_s']:>9}"
              f" {result['group_entries_per_s']:>24} {result['group_mb_per_s']:>7}")


if __name__ == "__main__":
    main()
