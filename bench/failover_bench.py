"""How long producers go without an acknowledged send when the leader is SIGKILLed, through the group's front.

    python bench/failover_bench.py [--kills 10] [--rate 50] [--clients cpp,ours] [--front haproxy|none]
                                   [--route-to leader|followers] [--cpp-send-timeout-ms 3000]

A local three-member group with its front (cli.front: HAProxy, registered as brokerId 0, by default sending
clients to the followers, which forward to the leader and hold a request through an election).
For each client, a producer sends sync at ``--rate`` messages/s while the bench kills the leader ``--kills``
times (SIGKILL; the member is restarted and back in the group before the next kill). The figure of one kill
is the time without an ack: the longest time between two acknowledged sends from the last one before the
kill until SETTLE_SECONDS after the first one after it (so a second stall, as clients reconnect, counts too).
Printed: p50 and max over the kills, per client, the sends that failed meanwhile, and what reading the topic
back found: acknowledged messages missing or stored twice.

- ``cpp``: the stock C++ client 1.2.3 (PyPI ``rocketmq``), in a process of its own
  (bench/cpp_failover_producer.py); it knows only the route's brokerId 0 address, the front;
- ``ours``: raftmq's own client (client.sync.Producer), in this process.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cli.cluster import LocalCluster
from cli.front import ROUTES
from tests.support.waiting import wait_for

REPOSITORY: Final = Path(__file__).resolve().parents[1]
#: the longest the bench waits for one step (acks to resume, a member to rejoin)
STEP_DEADLINE_SECONDS: Final = 90.0
POLL_SECONDS: Final = 0.02
#: how long after the first ack that follows a kill stalls still count towards that kill
SETTLE_SECONDS: Final = 3.0
#: the small store files the tests use (tests/support/stores.py SMALL_STORE): a member restarted ten times starts quickly
STORE: Final = {"segment_size_bytes": 8 << 20, "consume_queue_units_per_file": 4096, "index_slot_count": 4096,
                "index_entry_capacity": 16_384}


@dataclass
class Acks:
    """When each acknowledged send returned (``time.monotonic()``), and the failures."""

    times: list[float] = field(default_factory=list)
    errors: int = 0
    #: the bodies of the acknowledged sends
    bodies: set[bytes] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, at: float, ok: bool, body: bytes = b"") -> None:
        with self.lock:
            if ok:
                self.times.append(at)
                self.bodies.add(body)
            else:
                self.errors += 1

    def snapshot(self) -> tuple[list[float], int]:
        with self.lock:
            return list(self.times), self.errors


class CppProducer:
    """The stock C++ producer in its own process; its events file read as it grows."""

    def __init__(self, namesrv: str, topic: str, rate: float, directory: Path, send_timeout_ms: int) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "home").mkdir(exist_ok=True)
        self.out = directory / "events.jsonl"
        self.stop_file = directory / "stop"
        self._read_bytes = 0
        self.acks = Acks()
        with (directory / "stderr.txt").open("wb") as stderr:
            self.process = subprocess.Popen(
                [sys.executable, str(REPOSITORY / "bench" / "cpp_failover_producer.py"), "--namesrv", namesrv,
                 "--topic", topic, "--group", "failover-bench-cpp", "--rate", str(rate), "--run", "cpp",
                 "--out", str(self.out), "--stop-file", str(self.stop_file), "--send-timeout-ms",
                 str(send_timeout_ms)],
                cwd=REPOSITORY, env=dict(os.environ, HOME=str(directory / "home")), stdout=subprocess.DEVNULL,
                stderr=stderr, stdin=subprocess.DEVNULL)

    def poll(self) -> Acks:
        if self.out.exists():
            with self.out.open("rb") as events:
                events.seek(self._read_bytes)
                data = events.read()
            complete = data[: data.rfind(b"\n") + 1]
            self._read_bytes += len(complete)
            for line in complete.splitlines():
                event = json.loads(line)
                if event["event"] in ("ack", "error"):
                    self.acks.add(float(event["at"]), event["event"] == "ack", str(event["body"]).encode())
        return self.acks

    def stop(self) -> None:
        self.stop_file.touch()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


class OwnProducer:
    """raftmq's own client, sending sync from a thread of this process."""

    def __init__(self, namesrv: str, topic: str, rate: float) -> None:
        self.acks = Acks()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(namesrv, topic, rate), name="own-producer",
                                        daemon=True)
        self._thread.start()

    def _run(self, namesrv: str, topic: str, rate: float) -> None:
        from client import Message, Producer, ProducerConfig
        from client.errors import MQClientError

        period = 1.0 / rate
        with Producer(namesrv, ProducerConfig(group="failover-bench-ours", send_timeout_seconds=30.0)) as producer:
            index = 0
            next_send = time.monotonic()
            while not self._stop.is_set():
                body = f"ours|{index}".encode()
                try:
                    producer.send(Message(topic, body, keys=(f"key-{index}",)))
                except MQClientError:
                    self.acks.add(time.monotonic(), False)
                else:
                    self.acks.add(time.monotonic(), True, body)
                index += 1
                next_send = max(next_send + period, time.monotonic() - period)
                self._stop.wait(max(0.0, next_send - time.monotonic()))  # pacing the sends

    def poll(self) -> Acks:
        return self.acks

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)


def stored_bodies(namesrv: str, topic: str) -> list[bytes]:
    """Every message body of ``topic``, read queue by queue from offset 0."""
    from client import ConsumerConfig, PullConsumer
    from client.message import PullStatus

    bodies: list[bytes] = []
    with PullConsumer(namesrv, ConsumerConfig(group=f"{topic}_readers")) as reader:
        for queue in reader.fetch_subscribe_queues(topic):
            offset = 0
            while True:
                result = reader.pull(queue, "*", offset, 32)
                if result.status is not PullStatus.FOUND:
                    break
                bodies.extend(message.body for message in result.messages)
                offset = result.next_begin_offset
    return bodies


def ready(http_address: str, role: str = "") -> bool:
    """The member answers ``GET /readyz`` 200: healthy, a leader known, applied what the group committed (with
    ``role="leader"``: it is the leader taking writes, what the front checks)."""
    query = f"?role={role}" if role else ""
    try:
        with urllib.request.urlopen(f"http://{http_address}/readyz{query}", timeout=1.0) as answer:
            return bool(answer.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def gap_around(times: list[float], killed_at: float) -> float | None:
    """The time without an ack around ``killed_at`` (see the module docstring), None before it is known."""
    before = [at for at in times if at <= killed_at]
    after = [at for at in times if at > killed_at]
    if not before or not after or after[-1] < after[0] + SETTLE_SECONDS:
        return None
    window = [before[-1], *(at for at in after if at <= after[0] + SETTLE_SECONDS)]
    return max(later - earlier for earlier, later in itertools.pairwise(window))


def measure(cluster: LocalCluster, producer: CppProducer | OwnProducer, kills: int, name: str) -> list[float]:
    gaps: list[float] = []
    wait_for(lambda: len(producer.poll().times) >= 20, f"{name}: acknowledged sends",
             timeout_seconds=STEP_DEADLINE_SECONDS, interval_seconds=POLL_SECONDS)
    for kill in range(kills):
        wait_for(lambda: all(ready(node.http_address) for node in cluster.info.nodes), "every member ready",
                 timeout_seconds=STEP_DEADLINE_SECONDS, interval_seconds=POLL_SECONDS)
        settled = time.monotonic()
        wait_for(lambda settled=settled: any(at > settled + 0.5 for at in producer.poll().times),  # type: ignore[misc]
                 f"{name}: acks before kill", timeout_seconds=STEP_DEADLINE_SECONDS,
                 interval_seconds=POLL_SECONDS)
        leaders = [node.id for node in cluster.info.nodes if ready(node.http_address, "leader")]
        if len(leaders) != 1:  # (a member's status can say LEADER a moment after it lost an election)
            raise RuntimeError(f"not one leader to kill: {leaders}")
        leader = leaders[0]
        killed_at = time.monotonic()
        cluster.kill(leader)
        wait_for(lambda killed_at=killed_at: gap_around(producer.poll().times, killed_at) is not None,  # type: ignore[misc]
                 f"{name}: acks after the kill", timeout_seconds=STEP_DEADLINE_SECONDS,
                 interval_seconds=POLL_SECONDS)
        times, errors = producer.poll().snapshot()
        gap = gap_around(times, killed_at)
        assert gap is not None
        gaps.append(gap)
        print(f"{name} kill {kill + 1}/{kills}: {leader} killed, {gap:.2f} s without an ack "
              f"({errors} failed sends so far)", flush=True)
        cluster.restart(leader)
    return gaps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--rate", type=float, default=50.0, help="sends per second of each producer")
    parser.add_argument("--clients", default="cpp,ours", help="comma-separated: cpp, ours")
    parser.add_argument("--front", choices=("haproxy", "none"), default="haproxy")
    parser.add_argument("--route-to", choices=ROUTES, default="followers",
                        help="where the front sends new connections (cli.front.haproxy_config)")
    parser.add_argument("--cpp-send-timeout-ms", type=int, default=3000,
                        help="the C++ producer's send timeout (its default: 3000); a send in flight when the leader "
                             "dies fails only when it runs out")
    parser.add_argument("--data-dir", type=Path, default=None, help="default: a temporary directory, removed")
    arguments = parser.parse_args()
    clients = [name.strip() for name in arguments.clients.split(",") if name.strip()]
    with tempfile.TemporaryDirectory(prefix="failover-bench-") as temporary:
        directory = arguments.data_dir or Path(temporary)
        figures: dict[str, tuple[list[float], int]] = {}
        #: per client: acknowledged, not stored, stored more than once
        audits: dict[str, tuple[int, int, int]] = {}
        with LocalCluster.start(directory / "group", nodes=3, overrides={"store": dict(STORE)},
                                front=arguments.front, front_route_to=arguments.route_to) as cluster:
            print(f"group up: namesrv={cluster.namesrv} front={cluster.info.front or '-'}", flush=True)
            for name in clients:
                topic = f"FailoverBench_{name}"
                producer: CppProducer | OwnProducer = (
                    CppProducer(cluster.namesrv, topic, arguments.rate, directory / "cpp",
                                arguments.cpp_send_timeout_ms) if name == "cpp"
                    else OwnProducer(cluster.namesrv, topic, arguments.rate))
                try:
                    gaps = measure(cluster, producer, arguments.kills, name)
                finally:
                    producer.stop()
                acks = producer.poll()
                figures[name] = (gaps, acks.snapshot()[1])
                stored = stored_bodies(cluster.namesrv, topic)
                counts: dict[bytes, int] = {}
                for body in stored:
                    counts[body] = counts.get(body, 0) + 1
                audits[name] = (len(acks.bodies), len(acks.bodies - set(counts)),
                                sum(1 for body in acks.bodies if counts.get(body, 0) > 1))
        print()
        print(f"time without an ack over {arguments.kills} leader SIGKILLs, {arguments.rate:g} sync sends/s, "
              f"front={arguments.front} (to the {arguments.route_to}), C++ send timeout {arguments.cpp_send_timeout_ms} ms")
        for name, (gaps, errors) in figures.items():
            acknowledged, lost, duplicated = audits[name]
            print(f"  {name:5s} p50 {statistics.median(gaps):.2f} s  max {max(gaps):.2f} s  "
                  f"(failed sends: {errors}; each: {', '.join(f'{gap:.2f}' for gap in gaps)})")
            print(f"        acknowledged {acknowledged}, read back: {lost} missing, {duplicated} stored twice")


if __name__ == "__main__":
    main()
