"""Verification benchmark: three replicas of ``--size-mb`` each, checked by Spark. Prints one JSON line.

Figures (MB/s count the bytes of all three replicas' commit logs, page cache warm):

* ``reference_block_hash``: plain Python, one thread: every segment file read in blocks and hashed with the
  same digest as the executors, then the digests compared: the floor the Spark byte-equality job is
  measured against.
* ``byte_equality``: :func:`spark_analytics.checks.check_byte_equality` (executors hash, driver votes).
* ``integrity``: :func:`spark_analytics.checks.check_integrity` (every record decoded, consume queues joined,
  feature invariants), reading the files into the cached tables it shares with the next check.
* ``derived_state``: :func:`spark_analytics.derived.check_derived_state` on those cached tables (consume
  queues across replicas, replicated state in the checkpoints).
* ``full_check``: all three, as ``verify`` runs them (the integrity figure is its first run, as in
  ``verify``; ``integrity_second_run`` is the steady rate, tables read again). Spark session start-up is
  reported apart, and a first byte-equality pass that starts the Python workers is not timed.

Replica n0 is written through ``MessageStore.append`` (1 KB messages, 8 queues, batches of 128); n1 and n2
are copies of its files, byte-identical by construction, as writing the same appends would make them.

    python bench/verify_bench.py                       # 64 MB per replica
    python bench/verify_bench.py --size-mb 1024        # the issue's 1 GB per replica
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from commitlog.config import StoreConfig
from commitlog.message import MessageInput, encode_host, encode_properties
from commitlog.store import MessageStore
from spark_analytics.checks import check_byte_equality, check_integrity
from spark_analytics.derived import check_derived_state
from spark_analytics.session import MASTER_DEFAULT, build_session
from spark_analytics.sources import BLOCK_SIZE_BYTES_DEFAULT, DIGEST_NAME
from spark_analytics.tables import ReplicaTables

QUEUES = 8
BATCH_MESSAGES = 128
MIB = 1 << 20


def build_replicas(root: Path, size_bytes: int, message_bytes: int, segment_bytes: int, seed: int) -> int:
    """Write n0 until its commit log holds ``size_bytes``, copy it to n1 and n2; returns the log's size."""
    rng = random.Random(seed)
    host = encode_host("10.0.0.7", 50123)
    bodies = [rng.randbytes(message_bytes) for _ in range(64)]
    config = StoreConfig(data_dir=root / "n0" / "store", segment_size_bytes=segment_bytes,
                         flush_interval_ms=3_600_000)
    store = MessageStore(config)
    number = 0
    raft_index = 0
    while store.max_physical_offset < size_bytes:
        batch = []
        for _ in range(BATCH_MESSAGES):
            properties = encode_properties({"TAGS": f"tag{number % 4}", "KEYS": f"order-{number}",
                                            "UNIQ_KEY": f"0A000007C3CB{number:020X}", "WAIT": "true"})
            batch.append(MessageInput("BenchTopic", number % QUEUES, 0, 0, 1_700_000_000_000 + number, host,
                                      1_700_000_000_000 + number, 0, 0, bodies[number % 64], properties))
            number += 1
        raft_index += 1
        store.append(raft_index, batch)
    written = store.max_physical_offset
    store.close()
    for name in ("n1", "n2"):
        shutil.copytree(root / "n0", root / name)
    return written


def reference_block_hash(root: Path, block_bytes: int) -> bool:
    """Plain Python: hash every block of every replica's segments, then compare the digests."""
    digests: dict[str, list[bytes]] = {}
    for replica in ("n0", "n1", "n2"):
        blocks: list[bytes] = []
        for path in sorted((root / replica / "store" / "commitlog").iterdir()):
            with open(path, "rb") as handle:
                while block := handle.read(block_bytes):
                    blocks.append(hashlib.new(DIGEST_NAME, block).digest())
        digests[replica] = blocks
    return digests["n0"] == digests["n1"] == digests["n2"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mb", type=int, default=64, help="commit-log size of each replica")
    parser.add_argument("--message-bytes", type=int, default=1024)
    parser.add_argument("--segment-mb", type=int, default=64)
    parser.add_argument("--block-mb", type=int, default=BLOCK_SIZE_BYTES_DEFAULT // MIB)
    parser.add_argument("--master", default=MASTER_DEFAULT)
    parser.add_argument("--driver-memory", default="2g")
    parser.add_argument("--dir", type=Path, default=None, help="where to build the replicas (removed after)")
    arguments = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="verify-bench-", dir=arguments.dir))
    figures: dict[str, Any] = {"size_mb_per_replica": arguments.size_mb, "replicas": 3,
                               "segment_mb": arguments.segment_mb, "block_mb": arguments.block_mb}
    try:
        started = time.perf_counter()
        written = build_replicas(root, arguments.size_mb * MIB, arguments.message_bytes,
                                 arguments.segment_mb * MIB, seed=7)
        figures["build_seconds"] = round(time.perf_counter() - started, 2)
        total_mb = 3 * written / 1e6
        figures["bytes_per_replica"] = written

        started = time.perf_counter()
        equal = reference_block_hash(root, arguments.block_mb * MIB)
        figures.update(_rate("reference_block_hash", started, total_mb))
        figures["reference_equal"] = equal

        started = time.perf_counter()
        spark = build_session(arguments.master, arguments.driver_memory)
        figures["session_start_seconds"] = round(time.perf_counter() - started, 2)
        # the first job starts the Python workers; one untimed pass keeps that out of the figures
        check_byte_equality(spark, root, arguments.block_mb * MIB)

        started = time.perf_counter()
        equality = check_byte_equality(spark, root, arguments.block_mb * MIB)
        figures.update(_rate("byte_equality", started, total_mb))
        with ReplicaTables(spark, root) as tables:
            middle = time.perf_counter()
            integrity = check_integrity(spark, root, tables=tables)
            figures.update(_rate("integrity", middle, total_mb))
            middle = time.perf_counter()
            derived = check_derived_state(spark, root, equality.common_start, equality.common_end, tables)
            figures.update(_rate("derived_state", middle, total_mb))
        figures.update(_rate("full_check", started, total_mb))
        # the first integrity run also pays for the JVM compiling its plans; a second shows the steady rate
        started = time.perf_counter()
        check_integrity(spark, root)
        figures.update(_rate("integrity_second_run", started, total_mb))
        figures["checks_ok"] = equality.ok and integrity.ok and derived.ok
        figures["messages_per_replica"] = integrity.replicas[0].messages
        spark.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(figures))


def _rate(name: str, started: float, megabytes: float) -> dict[str, float]:
    seconds = time.perf_counter() - started
    return {f"{name}_seconds": round(seconds, 2), f"{name}_mb_per_s": round(megabytes / seconds, 1)}


if __name__ == "__main__":
    main()
