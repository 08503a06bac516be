"""``make audit-cluster``: audit a live three-member group with a real Spark standalone cluster.

    python -m cli.audit_demo [--work-dir DIR] [--keep]

1. A Spark standalone master and two workers from the installed pyspark (spark_analytics.standalone).
2. A local three-member group (cli.cluster.LocalCluster), its members without their scrubber (see
   chaos/no_scrubber: it would repair the byte flipped in step 5 before the audit reads it), and a producer
   sending a light load (about :data:`LOAD_MESSAGES_PER_SECOND` messages a second) for the whole run.
3. ``raftmq verify --master spark://... --namesrv ...``: the cut, every check on it, while the group serves.
4. One byte flipped in the body of a record of a follower's segment, below the cut (chaos.disk.corrupt_record).
5. ``verify`` again: the report names that member, the byte's offset and the record.

Each ``verify`` runs as a process of its own (a driver JVM per run, as an operator runs it). Prints what
each audit found; exit code 0 when the first audit was clean and the second found the flipped byte.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from chaos.disk import Corruption, corrupt_record
from cli.cluster import LocalCluster, NodeInfo
from client import ClientConfig, Message, Producer
from client.errors import MQClientError
from spark_analytics.standalone import SparkStandalone, executor_environment

#: light load: small batches of messages of varied size
LOAD_MESSAGES_PER_SECOND: Final = 200
LOAD_BATCH: Final = 10
#: messages the group holds before the first audit
WARM_UP_MESSAGES: Final = 2_000
VERIFY_TIMEOUT_SECONDS: Final = 600.0
NO_SCRUBBER: Final = Path(__file__).resolve().parent.parent / "chaos" / "no_scrubber"
#: member settings: small files (as the tests' small_store), so a local group takes little disk
MEMBER_OVERRIDES: Final = {"store": {"segment_size_bytes": 8 << 20, "consume_queue_units_per_file": 4096,
                                     "index_slot_count": 4096, "index_entry_capacity": 65_536}}


@dataclass
class Audit:
    exit_code: int
    report: dict[str, Any] | None
    output: str
    seconds: float


class Load:
    """A producer thread sending a light load until stopped; counts what was acknowledged."""

    def __init__(self, namesrv: str, rate: float = LOAD_MESSAGES_PER_SECOND) -> None:
        self.namesrv = namesrv
        self.rate = rate
        self.acknowledged = 0
        self.errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="audit-load", daemon=True)

    def start(self) -> Load:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        rng = random.Random(28)
        config = ClientConfig((self.namesrv,), client_ip="127.0.0.1", request_timeout_seconds=5.0)
        with Producer(config) as producer:
            number = 0
            while not self._stop.is_set():
                started = time.monotonic()
                for _ in range(LOAD_BATCH):
                    body = rng.randbytes(rng.randrange(16, 2048))
                    try:
                        producer.send(Message("AuditLoad", body, tags=f"t{number % 3}", keys=(f"order-{number}",)))
                        self.acknowledged += 1
                    except (MQClientError, TimeoutError, OSError):  # counted: the audit judges, not the load
                        self.errors += 1
                    number += 1
                self._stop.wait(max(0.0, LOAD_BATCH / self.rate - (time.monotonic() - started)))


def start_group(directory: Path) -> LocalCluster:
    """A three-member group whose members run without their scrubber."""
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([str(NO_SCRUBBER), *([saved] if saved else [])])
    try:
        return LocalCluster.start(directory, nodes=3, overrides=MEMBER_OVERRIDES)
    finally:
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved


def run_verify(master: str, namesrv: str, secret_file: Path, report: Path) -> Audit:
    """``raftmq verify --master MASTER --namesrv NAMESRV`` as a process of its own."""
    started = time.perf_counter()
    command = [sys.executable, "-m", "cli.main", "verify", "--master", master, "--namesrv", namesrv,
               "--secret-file", str(secret_file), "--report", str(report)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=VERIFY_TIMEOUT_SECONDS,
                            env={**os.environ, **executor_environment()}, check=False)
    document = json.loads(report.read_text()) if result.returncode in (0, 1) and report.exists() else None
    return Audit(result.returncode, document, result.stdout + result.stderr, time.perf_counter() - started)


def follower(cluster: LocalCluster) -> NodeInfo:
    leader = cluster.leader_id()
    return next(node for node in cluster.info.nodes if node.id != leader)


def flip_byte(node: NodeInfo, seed: int = 28) -> Corruption:
    """One byte of a record's body in the first half of the member's durable commit log."""
    corruption = corrupt_record(Path(node.config).parent / "store", random.Random(seed))
    if corruption is None:
        raise RuntimeError(f"{node.id} holds no record to damage yet")
    return corruption


def wait_messages(load: Load, count: int, timeout_seconds: float) -> None:
    deadline = time.monotonic() + timeout_seconds
    while load.acknowledged < count:
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {load.acknowledged} messages acknowledged after {timeout_seconds:.0f} s "
                               f"({load.errors} failed)")
        time.sleep(0.1)


def describe(audit: Audit) -> list[str]:
    if audit.report is None:
        return [f"verify exited {audit.exit_code} without a report:", audit.output[-2000:]]
    report = audit.report
    live = report["live"]
    equality = report["byte_equality"]
    lines = [f"verify exit {audit.exit_code} in {audit.seconds:.0f} s: cut at {live['cut']}, "
             f"{equality['bytes_compared_per_replica']} bytes x {len(equality['replicas'])} members compared, "
             f"odd members: {', '.join(equality['odd_replicas']) or 'none'}"]
    for difference in equality["differences"]:
        actual = difference["actual"] or {}
        lines.append(f"  {difference['replica']} differs at commit-log offset {difference['physical_offset']}: "
                     f"{actual.get('kind')} at {actual.get('record_offset')}, {actual.get('topic')}/"
                     f"{actual.get('queue_id')} queue offset {actual.get('queue_offset')}, UNIQ_KEY "
                     f"{actual.get('uniq_key')}, field {actual.get('field')}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cli.audit_demo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work-dir", type=Path, default=None, help="where the group and Spark keep their files")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    arguments = parser.parse_args(argv)
    work_dir = arguments.work_dir or Path(tempfile.mkdtemp(prefix="raftmq-audit-"))
    try:
        with SparkStandalone.start(work_dir / "spark") as spark_cluster, start_group(work_dir / "group") as group:
            print(f"Spark master {spark_cluster.master_url} with 2 workers; group {group.namesrv}", flush=True)
            load = Load(group.namesrv).start()
            try:
                wait_messages(load, WARM_UP_MESSAGES, 120)
                secret = work_dir / "group" / "group.secret"
                clean = run_verify(spark_cluster.master_url, group.namesrv, secret, work_dir / "clean.json")
                print("\n".join(describe(clean)), flush=True)
                target = follower(group)
                corruption = flip_byte(target)
                print(f"flipped {target.id}'s {corruption.describe()}", flush=True)
                damaged = run_verify(spark_cluster.master_url, group.namesrv, secret, work_dir / "damaged.json")
                print("\n".join(describe(damaged)), flush=True)
            finally:
                load.stop()
            print(f"load: {load.acknowledged} messages acknowledged during the run, {load.errors} failed")
        found = (damaged.report is not None and damaged.exit_code == 1
                 and damaged.report["byte_equality"]["odd_replicas"] == [target.id]
                 and any(d["physical_offset"] == int(corruption.segment.name) + corruption.file_offset
                         for d in damaged.report["byte_equality"]["differences"]))
        ok = clean.exit_code == 0 and found
        print("audit-cluster: " + ("ok: the clean group passed, the flipped byte was found" if ok else "FAILED"))
        return 0 if ok else 1
    finally:
        if arguments.work_dir is None and not arguments.keep:
            shutil.rmtree(work_dir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
