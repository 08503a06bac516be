"""Store benchmark: 1 KB messages, 8 queues, one thread. Prints one JSON line.

append: apply-sized batches through MessageStore.append (record encoding, consume-queue dispatch, key
index of UNIQ_KEY and KEYS), async flush policy. read: sequential consume of every queue through the
consume queue in pulls of 32. recovery: reopen after a simulated crash with an unflushed tail of
``--tail-mb`` (time per GB of tail) and a clean reopen of the whole store (which must not grow with it).
raw_write: plain sequential file write of the same bytes, the physical reference.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from commitlog.config import StoreConfig
from commitlog.hosts import encode_host
from commitlog.message import MessageInput
from commitlog.store import MessageStore
from protocol.properties import encode_properties

QUEUES = 8


def make_messages(count: int, size: int, seed: int) -> list[MessageInput]:
    rng = random.Random(seed)
    host = encode_host("10.0.0.7", 50123)
    bodies = [rng.randbytes(size) for _ in range(64)]
    messages = []
    for i in range(count):
        properties = encode_properties(
            {"TAGS": f"tag{i % 4}", "KEYS": f"order-{i}", "UNIQ_KEY": f"0A000007C3CB{i:020X}", "WAIT": "true"}
        )
        messages.append(
            MessageInput("BenchTopic", i % QUEUES, 0, 0, 1_700_000_000_000 + i, host,
                         1_700_000_000_000 + i, 0, 0, bodies[i % 64], properties)
        )
    return messages


def config(directory: Path, segment_mb: int) -> StoreConfig:
    return StoreConfig(data_dir=directory, segment_size_bytes=segment_mb << 20, flush_interval_ms=3_600_000)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--count", type=int, default=400_000)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--tail-mb", type=int, default=128)
    parser.add_argument("--segment-mb", type=int, default=256)
    parser.add_argument("--dir", type=Path, default=None)
    parser.add_argument("--runs", type=int, default=3, help="report the median of this many runs")
    arguments = parser.parse_args()
    runs = [run_once(arguments) for _ in range(arguments.runs)]
    figures = {key: statistics.median(run[key] for run in runs) for key in runs[0]}
    figures["runs"] = arguments.runs
    print(json.dumps(figures))


def run_once(arguments: argparse.Namespace) -> dict[str, float]:
    root = Path(tempfile.mkdtemp(prefix="store-bench-", dir=arguments.dir))
    try:
        messages = make_messages(arguments.count, arguments.size, seed=7)
        store = MessageStore(config(root / "store", arguments.segment_mb))
        batches = [messages[i : i + arguments.batch] for i in range(0, len(messages), arguments.batch)]
        started = time.perf_counter()
        cpu_started = time.process_time()
        for raft_index, batch in enumerate(batches, start=1):
            store.append(raft_index, batch)
        append_seconds = time.perf_counter() - started
        append_cpu_seconds = time.process_time() - cpu_started
        written = store.max_physical_offset
        store.flush()

        started = time.perf_counter()
        read = 0
        for queue_id in range(QUEUES):
            offset = 0
            while True:
                result = store.get_messages("BenchTopic", queue_id, offset, 32)
                if not result.messages:
                    break
                read += len(result.messages)
                offset = result.next_begin_offset
        read_seconds = time.perf_counter() - started
        assert read == arguments.count, (read, arguments.count)

        # an unflushed tail: append more without flushing, then reopen without closing (a process crash
        # keeps the page cache, which is what the second open sees)
        tail_count = max(1, (arguments.tail_mb << 20) // (arguments.size + 200))
        tail = make_messages(tail_count, arguments.size, seed=8)
        index = len(batches)
        for i in range(0, tail_count, arguments.batch):
            index += 1
            store.append(index, tail[i : i + arguments.batch])
        tail_bytes = store.max_physical_offset - written
        store.abandon()
        started = time.perf_counter()
        recovered = MessageStore(config(root / "store", arguments.segment_mb))
        recovery_seconds = time.perf_counter() - started
        assert recovered.applied_raft_index == index
        assert recovered.max_physical_offset == store.max_physical_offset
        recovered.close()
        started = time.perf_counter()
        clean = MessageStore(config(root / "store", arguments.segment_mb))
        clean_open_seconds = time.perf_counter() - started
        clean.close()

        payload = os.urandom(1 << 20)
        started = time.perf_counter()
        with open(root / "raw", "wb") as handle:
            for _ in range(max(1, written >> 20)):
                handle.write(payload)
            handle.flush()
        raw_seconds = time.perf_counter() - started

        return {
            "messages": arguments.count,
            "message_bytes": arguments.size,
            "batch": arguments.batch,
            "append_msgs_per_s": round(arguments.count / append_seconds),
            "append_MB_per_s": round(written / append_seconds / 1e6, 1),
            "append_cpu_msgs_per_s": round(arguments.count / append_cpu_seconds),
            "read_msgs_per_s": round(read / read_seconds),
            "read_MB_per_s": round(written / read_seconds / 1e6, 1),
            "recovery_s_per_GB": round(recovery_seconds / (tail_bytes / 1e9), 2),
            "recovery_tail_MB": round(tail_bytes / 1e6, 1),
            "recovery_tail_s": round(recovery_seconds, 3),
            "clean_open_s": round(clean_open_seconds, 3),
            "store_MB": round((written + tail_bytes) / 1e6, 1),
            "raw_write_MB_per_s": round(written / raw_seconds / 1e6, 1),
            "cores": os.cpu_count() or 0,
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
