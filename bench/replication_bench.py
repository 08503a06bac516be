"""Replication benchmark: a 3-member group in 3 processes on this machine; prints one JSON line.

* ``acked_msgs_per_s`` / ``acked_MB_per_s``: random 1 KB messages (nothing compresses) from concurrent
  callers in the leader's process, measured over ``--duration`` after 2 s of load, one message per call
  (``single``) and 32 per call (``batch32``, a batch send); ``cpu_us_per_msg``: CPU (user + system) per acked message of the leader and of a follower.
* ``resent_entries_share``: of the entries the followers received in a throughput run, the share they held
  already (sent again for nothing; 0.39 before the leader stopped moving a follower's next index back on
  success replies).
* ``commit_p50_ms`` / ``commit_p99_ms``: acknowledgement latency at an offered 1,000 msgs/s.
* ``journal_syncs_per_s`` / ``journal_syncs_per_msg``: Raft journal flushes (msync) per second and per acked
  message, of the leader and of a follower, in the single run. Every figure above is of the durable default
  (an entry counts toward a majority once flushed on that member); ``page_cache`` repeats the single and the
  latency run with ``journal_flush = "page_cache"`` in the same bench run, for the ratio.
* ``rss_MB_max``: the largest resident set of each member while at least ``--volume-mb`` is written;
  ``rss_anon_MB_max_by_half``: the largest anonymous RSS in the first and in the second half of that run.
* ``machine_loop_s``: a fixed Python loop's seconds before and after the runs: the host's speed, which every
  other figure follows (compare runs taken at similar values).
* ``baseline``: plain pysyncobj with its default settings and transport, one message per entry, measured
  in the same run (bench/raft_transport_bench.py's stock scenario).

The group commits at most 16 entries of up to 512 messages in flight (the product default is 4): measured
in alternating pairs, batch32 did ~50-58k with 8, ~53-59k with 16 and ~58-61k with 24 in flight.

The callers run inside the leader's process, so their cost counts against it: each message (single) or
batch (batch32) is its own append with its own future and acknowledgement callback, which checks each
result's status and counts it. They do not write the acknowledgement log the replication tests check
(``RAFTMQ_TEST_ACK_LOG=0``): no real caller pays for that; nor do they read the clock per send outside the
latency run, which is paced and measures latency on its own.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.dledger.group import running_group
from tests.support.waiting import wait_for

STORE = {"segment_size_bytes": 256 << 20}
GROUP_COMMIT = {"in_flight_entries_max": 16}  # and the product default of 512 messages per entry
MESSAGE_BYTES = 1024 + 130  # body plus stored-record overhead in this workload
NO_ACK_LOG = {"RAFTMQ_TEST_ACK_LOG": "0"}
#: seconds of load before a throughput run measures
WARM_UP_SECONDS = 2.0


def rss_mb(pid: int, field: str = "VmRSS:") -> float:
    """Resident set (VmRSS: all; RssAnon: heap and stacks, without mapped file pages)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field):
            return int(line.split()[1]) / 1024
    return 0.0


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def throughput(root: Path, duration: float, env: dict[str, str], raft: dict[str, Any] | None = None) -> dict[str, Any]:
    """Acked msgs/s, and the CPU each member spent per acked message (µs): steadier than msgs/s on a shared
    machine, whose speed drifts by tens of percent from one run to the next."""
    with running_group(root, store=STORE, group_commit=GROUP_COMMIT, raft=raft or {}, env=env) as group:
        leader = group.wait_leader(60)
        group.load(True)
        wait_for(lambda: leader.request("status")["acked"] > 1000, "the load to start", timeout_seconds=60)
        time.sleep(WARM_UP_SECONDS)  # steady state: the first segments, queue and index files are made by then
        pids = {node.node_id: node.process.pid for node in group.nodes if node.process is not None}
        first = leader.request("status")
        cpu_first = {node: cpu_seconds(pid) for node, pid in pids.items()}
        syncs_first = {node.node_id: node.request("status")["journal_syncs"] for node in group.nodes}
        started = time.monotonic()
        time.sleep(duration)  # a benchmark measures over a fixed interval
        last = leader.request("status")
        cpu_last = {node: cpu_seconds(pid) for node, pid in pids.items()}
        syncs_last = {node.node_id: node.request("status")["journal_syncs"] for node in group.nodes}
        elapsed = time.monotonic() - started
        group.load(False)
        statuses = group.wait_converged()
    # entries a follower received again (it held them already): each one was sent, hashed and parsed for nothing
    resent = [(status["entries_already_held"], status["entries_received"]) for node, status in statuses.items()
              if node != leader.node_id]
    # The run's files go, and with them their dirty pages, which would otherwise be written back during the
    # next run and cost its members CPU.
    shutil.rmtree(root, ignore_errors=True)
    acked = last["acked"] - first["acked"]
    messages = acked / elapsed
    per_message = {node: (cpu_last[node] - cpu_first[node]) / max(1, acked) * 1e6 for node in pids}
    followers = [value for node, value in per_message.items() if node != leader.node_id]
    syncs = {node: syncs_last[node] - syncs_first[node] for node in syncs_first}
    follower_syncs = sum(count for node, count in syncs.items() if node != leader.node_id) / max(1, len(syncs) - 1)
    return {"msgs_per_s": round(messages), "MB_per_s": round(messages * MESSAGE_BYTES / 1e6, 1),
            "journal_syncs_per_s": {"leader": round(syncs[leader.node_id] / elapsed),
                                    "follower": round(follower_syncs / elapsed)},
            "journal_syncs_per_msg": {"leader": round(syncs[leader.node_id] / max(1, acked), 4),
                                      "follower": round(follower_syncs / max(1, acked), 4)},
            "cpu_us_per_msg": {"leader": round(per_message[leader.node_id], 1),
                               "follower": round(sum(followers) / max(1, len(followers)), 1)},
            "resent_entries_share": round(sum(held for held, _ in resent) / max(1, sum(got for _, got in resent)), 3)}


def latency(root: Path, duration: float, raft: dict[str, Any] | None = None) -> dict[str, float]:
    env = {"RAFTMQ_TEST_RATE": "1000", "RAFTMQ_TEST_IN_FLIGHT": "1000", **NO_ACK_LOG}
    with running_group(root, store=STORE, group_commit=GROUP_COMMIT, raft=raft or {}, env=env) as group:
        leader = group.wait_leader(60)
        group.load(True)
        time.sleep(2)  # warm-up
        leader.request("latency")
        time.sleep(duration)
        figures = leader.request("latency")
        group.load(False)
        return {"p50_ms": round(figures["p50_ms"], 2), "p99_ms": round(figures["p99_ms"], 2), "count": figures["count"]}


def memory(root: Path, volume_mb: int) -> dict[str, Any]:
    env = {"RAFTMQ_TEST_REQUEST_MESSAGES": "32", "RAFTMQ_TEST_IN_FLIGHT": "256", **NO_ACK_LOG}
    samples: dict[str, list[float]] = {}
    anonymous: dict[str, list[float]] = {}
    with running_group(root, store=STORE, group_commit=GROUP_COMMIT, env=env) as group:
        leader = group.wait_leader(60)
        group.load(True)
        deadline = time.monotonic() + 1800
        while leader.request("status")["end"] < volume_mb << 20 and time.monotonic() < deadline:
            for node in group.nodes:
                assert node.process is not None
                samples.setdefault(node.node_id, []).append(rss_mb(node.process.pid))
                anonymous.setdefault(node.node_id, []).append(rss_mb(node.process.pid, "RssAnon:"))
            time.sleep(1)
        written = leader.request("status")["end"]
        group.load(False)
    return {
        "written_MB": round(written / 1e6),
        "rss_MB_max": {node: round(max(values)) for node, values in samples.items()},
        "rss_MB_first_sample": {node: round(values[0]) for node, values in samples.items()},
        "rss_anon_MB_max": {node: round(max(values)) for node, values in anonymous.items()},
        "rss_anon_MB_first_sample": {node: round(values[0]) for node, values in anonymous.items()},
        # flat, not growing with data written: the largest of the second half of the run against the first's
        "rss_anon_MB_max_by_half": {node: (round(max(values[: len(values) // 2 or 1])),
                                           round(max(values[len(values) // 2 :])))
                                    for node, values in anonymous.items()},
    }


def baseline(duration: float) -> dict[str, Any]:
    from bench import raft_transport_bench

    arguments = argparse.Namespace(message_bytes=1024, duration=duration, in_flight_bytes=2 << 20)
    request = {"op": "throughput", "duration": duration, "in_flight_bytes": 2 << 20, "form": "bytes", "batch": 1,
               "seed": 1}
    single = raft_transport_bench.run_scenario("stock-default-single", "stock", request, arguments)
    slow = raft_transport_bench.run_scenario(
        "latency-stock-default", "stock", {"op": "latency", "rate": 1000.0, "duration": duration, "seed": 4}, arguments)
    return {"acked_msgs_per_s": single.get("msgs_per_second"), "commit_p50_ms": slow.get("p50_ms"),
            "commit_p99_ms": slow.get("p99_ms")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=10.0, help="measured seconds per throughput run")
    parser.add_argument("--volume-mb", type=int, default=1024, help="data written in the memory run")
    parser.add_argument("--skip-baseline", action="store_true")
    arguments = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="replication-bench-") as directory:
        run(Path(directory), arguments)


def machine_speed() -> float:
    """Seconds a fixed pure-Python loop takes on one core: this host's speed drifts by up to ~50% within an
    hour, and every figure here moves with it, so the bench prints it before and after its runs."""
    started = time.perf_counter()
    total = 0
    for number in range(3_000_000):
        total += number
    return round(time.perf_counter() - started, 3)


def run(root: Path, arguments: argparse.Namespace) -> None:
    speed_before = machine_speed()
    single = throughput(root / "single", arguments.duration, {"RAFTMQ_TEST_IN_FLIGHT": "4096", **NO_ACK_LOG})
    batch = throughput(root / "batch", arguments.duration,
                       {"RAFTMQ_TEST_REQUEST_MESSAGES": "32", "RAFTMQ_TEST_IN_FLIGHT": "256", **NO_ACK_LOG})
    low_load = latency(root / "latency", arguments.duration)
    page_cache = {"journal_flush": "page_cache"}
    single_page_cache = throughput(root / "single-page-cache", arguments.duration,
                                   {"RAFTMQ_TEST_IN_FLIGHT": "4096", **NO_ACK_LOG}, page_cache)
    low_load_page_cache = latency(root / "latency-page-cache", arguments.duration, page_cache)
    rss = memory(root / "memory", arguments.volume_mb)
    result: dict[str, Any] = {
        "acked_msgs_per_s": single["msgs_per_s"],
        "acked_MB_per_s": single["MB_per_s"],
        "cpu_us_per_msg": single["cpu_us_per_msg"],
        "acked_msgs_per_s_batch32": batch["msgs_per_s"],
        "acked_MB_per_s_batch32": batch["MB_per_s"],
        "cpu_us_per_msg_batch32": batch["cpu_us_per_msg"],
        "resent_entries_share": {"single": single["resent_entries_share"], "batch32": batch["resent_entries_share"]},
        "commit_p50_ms": low_load["p50_ms"],
        "commit_p99_ms": low_load["p99_ms"],
        "journal_syncs_per_s": single["journal_syncs_per_s"],
        "journal_syncs_per_msg": single["journal_syncs_per_msg"],
        "page_cache": {"acked_msgs_per_s": single_page_cache["msgs_per_s"],
                       "cpu_us_per_msg": single_page_cache["cpu_us_per_msg"],
                       "commit_p50_ms": low_load_page_cache["p50_ms"], "commit_p99_ms": low_load_page_cache["p99_ms"],
                       "durable_over_page_cache_msgs": round(single["msgs_per_s"] / max(1, single_page_cache["msgs_per_s"]),
                                                             2)},
        **rss,
        "cores": os.cpu_count(),
    }
    if not arguments.skip_baseline:
        result["baseline"] = baseline(arguments.duration)
        if result["baseline"]["acked_msgs_per_s"]:
            result["speedup_vs_baseline"] = round(single["msgs_per_s"] / result["baseline"]["acked_msgs_per_s"], 1)
            result["speedup_vs_baseline_batch32"] = round(
                batch["msgs_per_s"] / result["baseline"]["acked_msgs_per_s"], 1)
    result["machine_loop_s"] = {"before": speed_before, "after": machine_speed()}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
