"""Scrub benchmark: what :meth:`MessageStore.scrub` costs per scrubbed byte. Prints one JSON line.

A store of ``--size-mb`` of 1 KB messages (8 queues, UNIQ_KEY and KEYS indexed, batches of 128, as
bench/store_bench.py writes them) is scrubbed from its first byte to its end in calls of ``--step-kb``, as the
member's scrubber calls it, ``--runs`` times (the page cache is warm after the first). Figures:

* ``cpu_s_per_MiB``: CPU seconds of the scrubbing thread (``time.thread_time``) per scrubbed MiB, the median
  of the runs; ``wall_s_per_MiB`` the same in wall-clock time.
* ``lock_hold_ms_max`` / ``_p99`` / ``_mean``: how long one hold of the store lock lasted (outermost acquire
  to release, measured by a wrapper put in place of the store's lock), the longest, the 99th percentile and
  the mean over every hold during the scrubs: what apply may wait for behind the scrubber. (The longest
  counts a hold the machine's scheduler stretched: compare the percentile.)
* ``calls_per_pass``: scrub calls one pass took; ``store_MiB``: what a pass covers.

    python bench/scrub_bench.py                  # 128 MiB
    python bench/scrub_bench.py --size-mb 256 --runs 5
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import TracebackType

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.store_bench import make_messages
from client.figures import percentile
from commitlog.config import StoreConfig
from commitlog.store import MessageStore

MIB = 1 << 20
BATCH = 128


class TimedLock:
    """An RLock that records how long each outermost hold lasted (seconds), in place of the store's lock."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._depth = 0
        self._acquired_at = 0.0
        self.holds: list[float] = []

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        acquired = self._lock.acquire(blocking, timeout)
        if acquired:
            self._depth += 1
            if self._depth == 1:
                self._acquired_at = time.perf_counter()
        return acquired

    def release(self) -> None:
        self._depth -= 1
        if self._depth == 0:
            self.holds.append(time.perf_counter() - self._acquired_at)
        self._lock.release()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.release()


def build_store(directory: Path, size_mb: int, segment_mb: int) -> MessageStore:
    config = StoreConfig(data_dir=directory, segment_size_bytes=segment_mb * MIB, flush_interval_ms=3_600_000)
    store = MessageStore(config)
    count = size_mb * MIB // (1024 + 200)
    messages = make_messages(count, 1024, seed=7)
    for raft_index, start in enumerate(range(0, count, BATCH), start=1):
        store.append(raft_index, messages[start : start + BATCH])
    store.flush()
    return store


def scrub_pass(store: MessageStore, step_bytes: int) -> tuple[float, float, int]:
    """One pass over the whole commit log: (thread CPU seconds, wall seconds, calls)."""
    position = store.commit_log.min_offset
    end = store.max_physical_offset
    calls = 0
    cpu_started = time.thread_time()
    started = time.perf_counter()
    while position < end:
        damaged, position = store.scrub(position, step_bytes)
        calls += 1
        if damaged is not None:
            raise SystemExit(f"the benchmark's store has a damaged record at {damaged}")
    return time.thread_time() - cpu_started, time.perf_counter() - started, calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mb", type=int, default=128)
    parser.add_argument("--segment-mb", type=int, default=64)
    parser.add_argument("--step-kb", type=int, default=1024, help="bytes per scrub call (the member's SCRUB_BYTES)")
    parser.add_argument("--runs", type=int, default=3, help="report the median of this many passes")
    parser.add_argument("--dir", type=Path, default=None)
    arguments = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="scrub-bench-", dir=arguments.dir))
    try:
        store = build_store(root / "store", arguments.size_mb, arguments.segment_mb)
        scrub_pass(store, arguments.step_kb * 1024)  # warm the page cache and the tag-code cache
        timed = TimedLock()
        store.state.lock = timed  # type: ignore[assignment]  # (the bench's instrument; the store only enters it)
        passes = [scrub_pass(store, arguments.step_kb * 1024) for _ in range(arguments.runs)]
        scrubbed_mib = (store.max_physical_offset - store.commit_log.min_offset) / MIB
        holds = timed.holds
        figures = {
            "store_MiB": round(scrubbed_mib, 1),
            "step_KiB": arguments.step_kb,
            "cpu_s_per_MiB": round(statistics.median(cpu for cpu, _, _ in passes) / scrubbed_mib, 5),
            "wall_s_per_MiB": round(statistics.median(wall for _, wall, _ in passes) / scrubbed_mib, 5),
            "lock_hold_ms_max": round(max(holds) * 1000, 2),
            "lock_hold_ms_p99": round(percentile(holds, 0.99) * 1000, 2),
            "lock_hold_ms_mean": round(statistics.fmean(holds) * 1000, 3),
            "lock_holds_per_pass": len(holds) // arguments.runs,
            "calls_per_pass": passes[0][2],
            "runs": arguments.runs,
        }
        store.close()
        print(json.dumps(figures))
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
