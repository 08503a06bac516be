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

The network path (``--no-network`` leaves it out), in the same run over the same replicas: each replica is
served by a process of its own through the member API (:mod:`broker.replica_files`: a remoting server, the
store opened as a member opens it) and ``verify`` reads them as a live group's cut
(:mod:`spark_analytics.remote`): ``network_byte_equality`` (each member hashes its own blocks, as ``verify``
does; only digests travel), ``network_byte_equality_read`` (the executors read every byte over the network
and hash it: ``member_digests=false``) and ``network_full_check``, with ``network_vs_local_*`` the ratios to
the local figures (``_warm``: to the local steady rate, as the network run comes after the local one in the
same JVM).

Replica n0 is written through ``MessageStore.append`` (1 KB messages, 8 queues, batches of 128); n1 and n2
are copies of its files, byte-identical by construction, as writing the same appends would make them.

    python bench/verify_bench.py                       # 64 MB per replica
    python bench/verify_bench.py --size-mb 1024        # the issue's 1 GB per replica
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from commitlog.config import StoreConfig
from commitlog.hosts import encode_host
from commitlog.message import MessageInput
from commitlog.store import MessageStore
from protocol.properties import encode_properties
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


SECRET = b"verify-bench-group-secret-0123456789"
SERVE_READY = "serving"


class ServedMember:
    """What :class:`broker.replica_files.ReplicaFilesProcessor` asks of a member, for a store served alone."""

    def __init__(self, name: str, store: MessageStore) -> None:
        self.name = name
        self.store = store

    def status(self) -> SimpleNamespace:
        applied = self.store.applied_raft_index
        return SimpleNamespace(node_id=self.name, role="follower", commit_index=applied, applied_index=applied)


def serve(store_dir: Path, name: str, port: int, segment_bytes: int) -> None:
    """One replica's store over the member API until killed (a process per replica, as members are)."""
    from broker.remoting.server import RemotingServer
    from broker.replica_files import REPLICA_FILES_CODES, ReplicaFilesProcessor

    store = MessageStore(StoreConfig(data_dir=store_dir, segment_size_bytes=segment_bytes,
                                     flush_interval_ms=3_600_000))

    async def run() -> None:
        server = RemotingServer("127.0.0.1", port)
        server.register(REPLICA_FILES_CODES, ReplicaFilesProcessor(ServedMember(name, store), SECRET, lambda: False),
                        queue_max=64, workers=4, name="replica-files")
        await server.start()
        print(SERVE_READY, flush=True)
        await server.wait_stopped()

    asyncio.run(run())


def network_figures(spark: Any, root: Path, segment_bytes: int, block_bytes: int, total_mb: float,
                    local: dict[str, Any]) -> dict[str, Any]:
    """Byte equality and the full check through the member API, each replica served by a process."""
    from cli.cluster import free_ports
    from spark_analytics.remote import Access, take_cut
    from tests.support.process_group import MemberProcess, running_processes

    ports = free_ports(3)
    servers = []
    for name, port in zip(("n0", "n1", "n2"), ports, strict=True):
        command = [sys.executable, "-m", "bench.verify_bench", "--serve", str(root / name / "store"),
                   "--name", name, "--port", str(port), "--segment-mb", str(segment_bytes // MIB)]
        servers.append(MemberProcess(name, command))
    figures: dict[str, Any] = {}
    with running_processes(servers):
        for server in servers:
            if server.read_line(timeout_seconds=None).strip() != SERVE_READY:
                raise RuntimeError("a replica server did not start")
        cut = take_cut([f"127.0.0.1:{port}" for port in ports], Access.from_secret(SECRET))
        source = cut.encode()
        check_byte_equality(spark, source, block_bytes)  # the Python workers meet the servers once, untimed
        started = time.perf_counter()
        equality = check_byte_equality(spark, source, block_bytes)
        figures.update(_rate("network_byte_equality", started, total_mb))
        with ReplicaTables(spark, source) as tables:
            integrity = check_integrity(spark, source, tables=tables)
            derived = check_derived_state(spark, source, equality.common_start, equality.common_end, tables)
        figures.update(_rate("network_full_check", started, total_mb))
        # the executors reading every byte instead (the path before members hashed their own blocks)
        check_byte_equality(spark, source, block_bytes, member_digests=False)  # untimed, as above
        started = time.perf_counter()
        read_equality = check_byte_equality(spark, source, block_bytes, member_digests=False)
        figures.update(_rate("network_byte_equality_read", started, total_mb))
        equality_ok = equality.ok and read_equality.ok
        figures["network_checks_ok"] = equality_ok and integrity.ok and derived.ok
        figures["network_bytes_compared_per_replica"] = equality.bytes_compared_per_replica
        for name, local_name in (("byte_equality", "byte_equality"), ("byte_equality_read", "byte_equality"),
                                 ("full_check", "full_check")):
            figures[f"network_vs_local_{name}"] = round(figures[f"network_{name}_mb_per_s"]
                                                        / local[f"{local_name}_mb_per_s"], 2)
        # the network run's JVM has compiled the checks' plans already: beside the local run as verify runs
        # it (first integrity run), the local steady rate (byte equality, second integrity run, derived state)
        warm_seconds = sum(local[f"{name}_seconds"] for name in ("byte_equality", "integrity_second_run",
                                                                  "derived_state"))
        figures["local_full_check_warm_mb_per_s"] = round(total_mb / warm_seconds, 1)
        figures["network_vs_local_full_check_warm"] = round(figures["network_full_check_mb_per_s"]
                                                            / figures["local_full_check_warm_mb_per_s"], 2)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mb", type=int, default=64, help="commit-log size of each replica")
    parser.add_argument("--message-bytes", type=int, default=1024)
    parser.add_argument("--segment-mb", type=int, default=64)
    parser.add_argument("--block-mb", type=int, default=BLOCK_SIZE_BYTES_DEFAULT // MIB)
    parser.add_argument("--master", default=MASTER_DEFAULT)
    parser.add_argument("--driver-memory", default="2g")
    parser.add_argument("--dir", type=Path, default=None, help="where to build the replicas (removed after)")
    parser.add_argument("--no-network", action="store_true", help="leave the network path out")
    parser.add_argument("--serve", type=Path, default=None, help=argparse.SUPPRESS)  # a replica server
    parser.add_argument("--name", default="n0", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    arguments = parser.parse_args()
    if arguments.serve is not None:
        serve(arguments.serve, arguments.name, arguments.port, arguments.segment_mb * MIB)
        return

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
        if not arguments.no_network:
            figures.update(network_figures(spark, root, arguments.segment_mb * MIB, arguments.block_mb * MIB,
                                           total_mb, figures))
        spark.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(figures))


def _rate(name: str, started: float, megabytes: float) -> dict[str, float]:
    seconds = time.perf_counter() - started
    return {f"{name}_seconds": round(seconds, 2), f"{name}_mb_per_s": round(megabytes / seconds, 1)}


if __name__ == "__main__":
    main()
