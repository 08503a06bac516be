"""Raft replication throughput and commit latency: stock pysyncobj against dledger's transport.

Run from the repository root: ``python -m bench.raft_transport_bench`` (or ``python
bench/raft_transport_bench.py``). Prints one JSON line per run and stops by itself.

Each run starts three fresh member processes on 127.0.0.1 and lets the leader's process generate the
load (where raftmq's broker proposes too), so the driver process only orchestrates. Messages are
random 1 KiB slices of a random pool; ``--batch`` of them form one entry. Runs:

* ``stock-default-single``: the stock transport, ``SyncObjConf()`` defaults, one message per entry;
* ``tuned-bytes``: the authenticated transport, ``tuned_conf()``, each batch passed as ``bytes``
  (pysyncobj pickles it with protocol 2: every byte >= 0x80 becomes two);
* ``tuned-int``: the same with each batch passed as one ``int`` (pickled as raw little-endian bytes);
* ``latency-stock-default`` and ``latency-tuned``: single-message entries proposed at a fixed rate
  (open loop), commit latency from the call to the callback.

Throughput counts only acknowledged (committed and applied on the leader) messages between the end of a
warm-up second and the end of the run, and the run checks that all three members applied the same
number of messages afterwards.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    # Run as a script path: make the repository root importable, as ``-m`` from the root would.
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pysyncobj import SyncObj, SyncObjConf, replicated
from pysyncobj.transport import TCPTransport

from cli.cluster import free_ports
from client.figures import percentile
from dledger.transport import transport_class
from dledger.tuning import tuned_conf
from tests.support.process_group import MemberProcess, running_processes
from tests.support.waiting import wait_for

RANDOM_POOL_BYTES = 8 * 1024 * 1024
WARM_UP_SECONDS = 1.0
#: a member process exits by itself after this long, whatever the driver does
MEMBER_LIFETIME_MAX_SECONDS = 180.0
LEADER_WAIT_SECONDS = 20.0
STATUS_TIMEOUT_SECONDS = 10.0


# -- member process ------------------------------------------------------------------------------------


class BenchMember(SyncObj):  # type: ignore[misc]  # pysyncobj ships no type hints
    """Counts applied messages; apply does the conversion a real apply needs, nothing more."""

    def __init__(self, self_address: str, partners: list[str], conf: SyncObjConf, transport: Any, message_bytes: int):
        super().__init__(self_address, partners, conf=conf, transportClass=transport)
        self.message_bytes = message_bytes
        self.applied_messages = 0

    @replicated  # type: ignore[untyped-decorator]
    def append_bytes(self, batch: bytes) -> int:
        self.applied_messages += len(batch) // self.message_bytes
        return len(batch)

    @replicated  # type: ignore[untyped-decorator]
    def append_int(self, value: int, length: int) -> int:
        batch = value.to_bytes(length, "little")
        self.applied_messages += len(batch) // self.message_bytes
        return len(batch)


class LoadGenerator:
    """Proposes entries from one thread; callbacks arrive on pysyncobj's tick thread."""

    def __init__(self, member: BenchMember, message_bytes: int, seed: int) -> None:
        self._member = member
        self._message_bytes = message_bytes
        self._random = random.Random(seed)
        self._pool = self._random.randbytes(RANDOM_POOL_BYTES)
        self._condition = threading.Condition()
        self._in_flight = 0
        self._acked_messages = 0
        self._failed_entries = 0
        self._latencies: list[float] = []

    def _messages(self, count: int) -> bytes:
        pool = self._pool
        size = self._message_bytes
        offsets = [self._random.randrange(RANDOM_POOL_BYTES - size) for _ in range(count)]
        return b"".join(pool[offset : offset + size] for offset in offsets)

    def _on_result(self, messages: int, started: float, _result: Any, error: int) -> None:
        finished = time.perf_counter()
        with self._condition:
            self._in_flight -= 1
            if error == 0:
                self._acked_messages += messages
                self._latencies.append(finished - started)
            else:
                self._failed_entries += 1
            self._condition.notify_all()

    def _propose(self, form: str, batch: bytes, messages: int) -> None:
        callback = _bind_result(self._on_result, messages, time.perf_counter())
        if form == "int":
            self._member.append_int(int.from_bytes(batch, "little"), len(batch), callback=callback)
        else:
            self._member.append_bytes(batch, callback=callback)

    def throughput(self, form: str, batch_messages: int, duration_seconds: float, in_flight_bytes: int) -> dict[str, Any]:
        in_flight_max = max(2, in_flight_bytes // (batch_messages * self._message_bytes))
        started = time.perf_counter()
        measure_from = started + WARM_UP_SECONDS
        end = measure_from + duration_seconds
        acked_at_measure_start: int | None = None
        while (now := time.perf_counter()) < end:
            if acked_at_measure_start is None and now >= measure_from:
                with self._condition:
                    acked_at_measure_start = self._acked_messages
                    measure_from = now
            with self._condition:
                while self._in_flight >= in_flight_max and time.perf_counter() < end:
                    self._condition.wait(timeout=0.05)
                if time.perf_counter() >= end:
                    break
                self._in_flight += 1
            self._propose(form, self._messages(batch_messages), batch_messages)
        with self._condition:
            acked = self._acked_messages - (acked_at_measure_start or 0)
            elapsed = time.perf_counter() - measure_from
            result = {
                "acked_messages": acked,
                "elapsed_seconds": round(elapsed, 3),
                "msgs_per_second": round(acked / elapsed),
                "mb_per_second": round(acked * self._message_bytes / elapsed / 1e6, 2),
                "failed_entries": self._failed_entries,
                "in_flight_entries_max": in_flight_max,
            }
        self._drain(10.0)
        return result

    def latency(self, rate_per_second: float, duration_seconds: float) -> dict[str, Any]:
        interval = 1.0 / rate_per_second
        started = time.perf_counter()
        count = int(rate_per_second * duration_seconds)
        for index in range(count):
            delay = started + index * interval - time.perf_counter()
            if delay > 0:
                time.sleep(delay)  # open loop: proposals keep their schedule whatever commit does
            with self._condition:
                self._in_flight += 1
            self._propose("bytes", self._messages(1), 1)
        self._drain(10.0)
        with self._condition:
            latencies = list(self._latencies)
            failed = self._failed_entries
        if not latencies:
            return {"samples": 0, "failed_entries": failed}
        return {
            "samples": len(latencies),
            "p50_ms": round(percentile(latencies, 0.50) * 1000, 2),
            "p99_ms": round(percentile(latencies, 0.99) * 1000, 2),
            "max_ms": round(max(latencies) * 1000, 2),
            "failed_entries": failed,
        }

    def _drain(self, timeout_seconds: float) -> None:
        deadline = time.perf_counter() + timeout_seconds
        with self._condition:
            while self._in_flight > 0 and time.perf_counter() < deadline:
                self._condition.wait(timeout=0.05)


def _bind_result(
    function: Callable[[int, float, Any, int], None], messages: int, started: float
) -> Callable[[Any, int], None]:
    def callback(result: Any, error: int) -> None:
        function(messages, started, result, error)

    return callback


def member_conf(mode: str) -> SyncObjConf:
    if mode == "stock":
        return SyncObjConf()
    # Compaction keeps the in-memory journal (and the GC's work) bounded during a run.
    return tuned_conf(log_compaction_min_entries=2000)


def run_member(arguments: argparse.Namespace) -> None:
    # A watchdog, so that a member never outlives a driver that died without killing it.
    threading.Timer(MEMBER_LIFETIME_MAX_SECONDS, os._exit, args=(3,)).start()
    transport: Any = TCPTransport if arguments.mode == "stock" else transport_class(bytes.fromhex(arguments.secret_hex))
    member = BenchMember(arguments.self_address, arguments.partners, member_conf(arguments.mode), transport, arguments.message_bytes)
    member.waitBinded()
    print(json.dumps({"started": arguments.self_address}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        operation = request["op"]
        if operation == "quit":
            break
        if operation == "status":
            status = member.getStatus()
            answer: dict[str, Any] = {
                "leader": None if status["leader"] is None else str(status["leader"]),
                "is_leader": status["state"] == 2,
                "applied_messages": member.applied_messages,
            }
        elif operation == "throughput":
            generator = LoadGenerator(member, arguments.message_bytes, request["seed"])
            answer = generator.throughput(request["form"], request["batch"], request["duration"], request["in_flight_bytes"])
        elif operation == "latency":
            generator = LoadGenerator(member, arguments.message_bytes, request["seed"])
            answer = generator.latency(request["rate"], request["duration"])
        else:
            answer = {"error": f"unknown op {operation!r}"}
        answer["applied_messages"] = member.applied_messages
        print(json.dumps(answer), flush=True)
    os._exit(0)  # skip pysyncobj's teardown: the run is over and the driver waits for the exit


# -- driver ------------------------------------------------------------------------------------------


class MemberHandle(MemberProcess):
    """A bench member process: a request is a JSON object, answered with one."""

    def __init__(self, address: str, command: list[str]) -> None:
        super().__init__(address, command, log_path=Path(os.devnull))  # the figures are in its answers
        self.address = address

    def request(self, timeout_seconds: float, **fields: Any) -> dict[str, Any]:
        return self.ask(json.dumps(fields), timeout_seconds)


@contextlib.contextmanager
def member_group(mode: str, message_bytes: int) -> Iterator[list[MemberHandle]]:
    """Three members on free loopback ports; all are killed on exit, whatever happened."""
    addresses = [f"127.0.0.1:{port}" for port in free_ports(3)]
    secret = os.urandom(32)
    handles = []
    for address in addresses:
        command = [sys.executable, "-m", "bench.raft_transport_bench", "member", "--self", address]
        command += ["--mode", mode, "--secret-hex", secret.hex(), "--message-bytes", str(message_bytes)]
        for partner in addresses:
            if partner != address:
                command += ["--partner", partner]
        handles.append(MemberHandle(address, command))
    with running_processes(handles):
        for handle in handles:
            handle.read_answer(LEADER_WAIT_SECONDS)
        yield handles


def wait_for_leader(handles: list[MemberHandle]) -> MemberHandle:
    def agreed_leader() -> MemberHandle | None:
        statuses = [handle.request(STATUS_TIMEOUT_SECONDS, op="status") for handle in handles]
        leaders = {status["leader"] for status in statuses}
        if len(leaders) == 1 and None not in leaders:
            for handle, status in zip(handles, statuses, strict=True):
                if status["is_leader"]:
                    return handle
        return None

    return wait_for(agreed_leader, "a leader elected", timeout_seconds=LEADER_WAIT_SECONDS)


def applied_on_every_member(handles: list[MemberHandle], at_least: int, timeout_seconds: float) -> list[int]:
    """Poll until every member applied the same number of messages, at least ``at_least``; the counts (as
    they are at the deadline when they never agree: the run reports them)."""

    def counts() -> list[int]:
        return [handle.request(STATUS_TIMEOUT_SECONDS, op="status")["applied_messages"] for handle in handles]

    def agreed() -> list[int] | None:
        applied = counts()
        return applied if len(set(applied)) == 1 and applied[0] >= at_least else None

    try:
        return wait_for(agreed, f"every member to apply {at_least} messages", timeout_seconds=timeout_seconds,
                        interval_seconds=0.1)
    except AssertionError:
        return counts()


def run_scenario(name: str, mode: str, request: dict[str, Any], arguments: argparse.Namespace) -> dict[str, Any]:
    with member_group(mode, arguments.message_bytes) as handles:
        leader = wait_for_leader(handles)
        answer = leader.request(request["duration"] + 60, **request)
        applied = answer.pop("applied_messages")
        counts = applied_on_every_member(handles, applied, 30.0)
        answer["replicated_identically"] = len(set(counts)) == 1
        if not answer["replicated_identically"]:
            answer["applied_messages_per_member"] = counts
        leader_only = {key: value for key, value in request.items() if key not in ("op", "seed")}
        return {"scenario": name, "transport": mode, **leader_only, "message_bytes": arguments.message_bytes, **answer}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    subcommands = parser.add_subparsers(dest="command")
    member = subcommands.add_parser("member", help="internal: one group member")
    member.add_argument("--self", dest="self_address", required=True)
    member.add_argument("--partner", dest="partners", action="append", default=[])
    member.add_argument("--mode", choices=["stock", "tuned"], required=True)
    member.add_argument("--secret-hex", required=True)
    member.add_argument("--message-bytes", type=int, required=True)
    parser.add_argument("--duration", type=float, default=10.0, help="measured seconds per run")
    parser.add_argument("--batch", type=int, default=128, help="messages per entry in the batched runs")
    parser.add_argument("--message-bytes", type=int, default=1024)
    parser.add_argument("--in-flight-bytes", type=int, default=2 * 1024 * 1024)
    parser.add_argument("--rate", type=float, default=1000.0, help="messages per second in the latency runs")
    parser.add_argument("--only", action="append", default=[], help="run only these scenarios")
    arguments = parser.parse_args()
    if arguments.command == "member":
        run_member(arguments)
        return
    throughput = {"op": "throughput", "duration": arguments.duration, "in_flight_bytes": arguments.in_flight_bytes}
    scenarios: list[tuple[str, str, dict[str, Any]]] = [
        ("stock-default-single", "stock", {**throughput, "form": "bytes", "batch": 1, "seed": 1}),
        ("tuned-bytes", "tuned", {**throughput, "form": "bytes", "batch": arguments.batch, "seed": 2}),
        ("tuned-int", "tuned", {**throughput, "form": "int", "batch": arguments.batch, "seed": 3}),
        ("latency-stock-default", "stock", {"op": "latency", "rate": arguments.rate, "duration": arguments.duration, "seed": 4}),
        ("latency-tuned", "tuned", {"op": "latency", "rate": arguments.rate, "duration": arguments.duration, "seed": 5}),
    ]
    for name, mode, request in scenarios:
        if arguments.only and name not in arguments.only:
            continue
        try:
            print(json.dumps(run_scenario(name, mode, request, arguments)), flush=True)
        except (TimeoutError, AssertionError) as error:  # a member that did not answer, no leader elected
            print(json.dumps({"scenario": name, "error": str(error)}), flush=True)


if __name__ == "__main__":
    main()
