"""Broker benchmark: a three-node group (a name server and three broker processes) on this machine, driven
through the RocketMQ wire protocol by one client process, next to a three-node NATS JetStream R3 file stream
measured the same way in the same run. Prints one JSON line per measurement:

* ``produce`` at in-flight 1, 32 and 256: acked SEND_MESSAGE_V2 of 1 KB messages (msgs/s, MB/s, p50/p99 ms),
  one frame per send as stock clients send them (``"client": "python"``), then the same through our producer
  SDK (``"client": "sdk"``, ``--no-sdk`` leaves it out), whose concurrent sends to one queue leave as batch
  requests (client/coalesce.py);
* the one-frame sends again through a follower (``"route": "follower"``; ``--no-via-follower`` leaves them
  out), which forwards each to the leader: what a stock client behind the group's front meets by default
  (``cluster up --front-route followers``, broker/forwarding.py);
* ``consume``: PULL_MESSAGE of everything produced, 32 messages per pull, one queue after another;
* ``cpu_us_per_msg`` in each: CPU microseconds per acknowledged (consumed) message of each process over the
  measurement (``bench/cpu_meter.py``): the leader, both followers, the name server and the client.

Each line names its ``journal_flush``: the durable default, then (unless ``--journal-flush durable``) a
second group with ``page_cache`` in the same run, for the ratio (README.md, "Flush policy").

``--variant NAME:SECTION.KEY=VALUE[,SECTION.KEY=VALUE...]`` (repeatable) adds a group per variant, durable,
with those settings changed, in the same run: a change's effect as a ratio measured side by side.

The first group also serves the stock C++ client (``bench/cpp_producer.py``; ``--no-cpp`` leaves it out):
sync sends in a loop and async sends at the largest in-flight setting, ``"client": "cpp"``.

NATS (``bench/nats_bench.py``; ``"system": "nats"``): when ``nats-server`` (Debian) and ``nats-py`` are
installed, unless ``--no-nats``; stderr says why when it is skipped. The same body, counts and in-flight
settings; once with JetStream's default sync (no fsync per write) and, where the installed server takes
``sync_interval: always``, once fsyncing every write (``nats_sync_setting``).

Before the first group starts, any other process busy on the machine is named (stderr and the table's
notes): it would be measured too.

``--rounds N`` measures every system N times, taking turns (every other round in reverse order; each record
carries its ``round``): on a shared machine whose speed drifts over minutes, a ratio of two systems measured
in the same round holds where figures of different runs do not (the stock C++ client: first round only).

After the JSON lines (each a line starting with ``{``) comes a table for people: each ratio raftmq / NATS,
p50 and p99 of both, CPU per message and the C++ client's figures (``bench/bench_table.py``; with rounds,
medians and the median same-round ratio with its range).

Usage: ``python bench/broker_bench.py [--count 20000] [--inflight 1,32,256] [--journal-flush both]
[--variant linger0:group_commit.linger_ms=0] [--rounds 3] [--no-nats] [--no-cpp] [--client-loop asyncio]``
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import importlib.util
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine, Mapping
from pathlib import Path
from typing import Any, Final, TypeVar

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import bench_table, cpp_producer, cpu_meter
from bench.figures import produce_figures
from bench.sdk_sends import timed_sends
from cli.cluster import LocalCluster, route_master
from client.config import ProducerConfig
from client.message import Message
from client.producer import AsyncProducer
from protocol.client import RemotingClient
from protocol.codes import RequestCode, ResponseCode

TOPIC: Final = "BenchTopic"
QUEUES: Final = 4
BODY: Final = os.urandom(1024)
#: in-flight 1 is slow: it sends at most this many messages whatever ``--count`` says
IN_FLIGHT_1_COUNT_MAX: Final = 2000
CLIENT_LOOPS: Final = ("uvloop", "asyncio")

Result = TypeVar("Result")


#: the message ids' process part, as a stock client keeps it (asking the kernel on every send cost this
#: client an eighth of its time: a system call is dear on this machine)
_UNIQ_PREFIX: Final = f"UNIQ_KEY\x01BENCH{os.getpid():08X}"


def send_fields(sequence: int) -> dict[str, str]:
    return {"a": "bench-producer", "b": TOPIC, "c": "TBW102", "d": "4", "e": str(sequence % QUEUES), "f": "0",
            "g": str(int(time.time() * 1000)), "h": "0",
            "i": f"{_UNIQ_PREFIX}{sequence:020X}\x02TAGS\x01bench\x02", "j": "0", "k": "false",
            "m": "false"}


async def produce(address: str, count: int, in_flight: int, first: int,
                  processes: Mapping[str, int]) -> dict[str, object]:
    host, _, port = address.rpartition(":")
    connections = max(1, min(8, in_flight // 32))
    clients = [await RemotingClient.connect(host, int(port)) for _ in range(connections)]
    latencies: list[float] = []
    errors = 0
    next_sequence = first
    end = first + count

    async def worker(client: RemotingClient) -> None:
        nonlocal next_sequence, errors
        while next_sequence < end:
            sequence = next_sequence
            next_sequence += 1
            started = time.perf_counter()
            response = await client.request(RequestCode.SEND_MESSAGE_V2, send_fields(sequence), BODY,
                                            timeout_seconds=30)
            if response.code != ResponseCode.SUCCESS:
                errors += 1
                continue
            latencies.append(time.perf_counter() - started)

    before = cpu_meter.sample(processes)
    started = time.perf_counter()
    await asyncio.gather(*(worker(clients[n % connections]) for n in range(in_flight)))
    seconds = time.perf_counter() - started
    after = cpu_meter.sample(processes)
    for client in clients:
        await client.close()
    return {"bench": "broker", "system": "raftmq", "client": "python", "mode": "produce", "in_flight": in_flight,
            **produce_figures(latencies, errors, seconds, len(BODY)),
            "cpu_us_per_msg": cpu_meter.microseconds_per_message(before, after, len(latencies))}


async def produce_with_sdk(namesrv: str, count: int, in_flight: int,
                           processes: Mapping[str, int]) -> dict[str, object]:
    """Our producer (client.producer.AsyncProducer, its defaults: concurrent sends to one queue coalesced into
    batch requests, each with its own result): ``in_flight`` tasks awaiting ``send`` in a loop."""
    config = ProducerConfig(group="bench-sdk-producer", inflight_sends_max=in_flight, compress_body_over_bytes=0)
    async with AsyncProducer(namesrv, config) as producer:
        await producer.send(Message(TOPIC, BODY, tags="bench"))  # routes and connections before the clock starts
        before = cpu_meter.sample(processes)
        latencies, errors, seconds = await timed_sends(producer, lambda: Message(TOPIC, BODY, tags="bench"), count,
                                                       in_flight)
        after = cpu_meter.sample(processes)
        coalescer = producer._coalescer
        batches = {} if coalescer is None else {"batches": coalescer.batches, "batched_sends": coalescer.batched_sends}
    return {"bench": "broker", "system": "raftmq", "client": "sdk", "mode": "produce", "in_flight": in_flight,
            **produce_figures(latencies, errors, seconds, len(BODY)), **batches,
            "cpu_us_per_msg": cpu_meter.microseconds_per_message(before, after, len(latencies))}


async def consume(address: str, processes: Mapping[str, int]) -> dict[str, object]:
    host, _, port = address.rpartition(":")
    client = await RemotingClient.connect(host, int(port))
    total = 0
    pulls = 0
    before = cpu_meter.sample(processes)
    started = time.perf_counter()
    for queue_id in range(QUEUES):
        offset = 0
        while True:
            response = await client.request(RequestCode.PULL_MESSAGE, {
                "consumerGroup": "bench-consumer", "topic": TOPIC, "queueId": str(queue_id),
                "queueOffset": str(offset), "maxMsgNums": "32", "sysFlag": "0", "commitOffset": "0",
                "suspendTimeoutMillis": "0", "subVersion": "0", "expressionType": "TAG"}, timeout_seconds=30)
            pulls += 1
            if response.code != ResponseCode.SUCCESS:
                break
            offset = int(response.ext_fields["nextBeginOffset"])
            position = 0
            body = response.body
            while position < len(body):
                position += int.from_bytes(body[position : position + 4], "big")
                total += 1
    seconds = time.perf_counter() - started
    after = cpu_meter.sample(processes)
    await client.close()
    return {"bench": "broker", "system": "raftmq", "client": "python", "mode": "consume", "messages": total,
            "pulls": pulls, "msgs_per_s": round(total / seconds), "MB_per_s": round(total * len(BODY) / seconds / 1e6, 2),
            "cpu_us_per_msg": cpu_meter.microseconds_per_message(before, after, total)}


def variant(text: str) -> tuple[str, dict[str, dict[str, object]]]:
    """``NAME:SECTION.KEY=VALUE,...`` as (name, overrides); values are ints when they parse as one."""
    name, _, assignments = text.partition(":")
    changes: dict[str, dict[str, object]] = {}
    for assignment in filter(None, assignments.split(",")):
        key, equals, raw = assignment.partition("=")
        section, dot, field = key.partition(".")
        if not (name and equals and dot and section and field):
            raise argparse.ArgumentTypeError(f"expected NAME:SECTION.KEY=VALUE[,...], got {text!r}")
        value: object = int(raw) if raw.lstrip("-").isdigit() else raw
        changes.setdefault(section, {})[field] = value
    return name, changes


def run(coroutine: Coroutine[Any, Any, Result], client_loop: str) -> Result:
    """The client's coroutine on ``client_loop``: uvloop (libuv's loop, as the brokers use) or asyncio's."""
    if client_loop == "uvloop":
        import uvloop

        return uvloop.run(coroutine)
    return asyncio.run(coroutine)


def raftmq_processes(cluster: LocalCluster) -> dict[str, int]:
    """The group's processes by role (the leader, its followers, the name server) and this client."""
    leader = cluster.leader_node()
    if leader is None:
        raise RuntimeError("the group has no leader")
    followers = [node for node in cluster.info.nodes if node is not leader]
    return {"leader": leader.pid, **{f"follower_{number}": node.pid for number, node in enumerate(followers, 1)},
            "namesrv": cluster.info.namesrv_pid, "client": os.getpid()}


def first_follower(cluster: LocalCluster) -> str:
    """The client address of ``follower_1`` in :func:`raftmq_processes`."""
    leader = cluster.leader_node()
    follower = next(node for node in cluster.info.nodes if node is not leader)
    return follower.broker_address


def nats_server() -> str | None:
    """The nats-server binary (Debian installs it in /usr/sbin, which a user's PATH may leave out)."""
    return shutil.which("nats-server", path=os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin"]))


def nats_unavailable() -> str | None:
    """Why NATS cannot be measured here, or None."""
    if importlib.util.find_spec("nats") is None:
        return "nats-py is not installed (pip install -e '.[dev]')"
    if nats_server() is None:
        return "nats-server is not installed (Debian: apt-get install nats-server; make bench-packages)"
    return None


class Bench:
    """What one run measured so far, printed as it goes."""

    def __init__(self, arguments: argparse.Namespace, scratch: Path) -> None:
        self.arguments = arguments
        self.scratch = scratch
        self.records: list[dict[str, object]] = []
        #: the round being measured (``--rounds``): every record carries it
        self.round = 0
        self.notes: list[str] = []
        self.failures: list[str] = []
        in_flights = [int(value) for value in arguments.inflight.split(",")]
        self.settings = [(in_flight, min(arguments.count, IN_FLIGHT_1_COUNT_MAX) if in_flight == 1
                          else arguments.count) for in_flight in in_flights]

    def emit(self, record: dict[str, object]) -> None:
        record = {**record, "round": self.round}
        print(json.dumps(record), flush=True)
        self.records.append(record)

    def skip(self, what: str, reason: str) -> None:
        note = f"{what} skipped: {reason}"
        if note not in self.notes:  # once, however many rounds
            print(f"broker_bench: {note}", file=sys.stderr, flush=True)
            self.notes.append(note)

    def warn(self, note: str) -> None:
        print(f"broker_bench: {note}", file=sys.stderr, flush=True)
        self.notes.append(note)

    def fail(self, what: str, error: BaseException) -> None:
        if self.arguments.rounds > 1:
            what = f"{what} in round {self.round + 1}"
        print(f"broker_bench: {what} failed: {error}", file=sys.stderr, flush=True)
        self.failures.append(f"{what} failed: {error}")

    def measure_raftmq(self, label: dict[str, str], changes: dict[str, dict[str, object]], with_cpp: bool) -> None:
        overrides: dict[str, dict[str, object]] = {"broker": {"default_topic_queue_nums": QUEUES},
                                                   "raft": {"journal_flush": "durable"}}
        for section, values in changes.items():
            overrides[section] = {**overrides.get(section, {}), **values}
        loop = {"client_loop": self.arguments.client_loop}
        with (tempfile.TemporaryDirectory(prefix="raftmq-broker-bench-") as directory,
              LocalCluster.start(Path(directory) / "cluster", overrides=overrides) as cluster):
            address = route_master(cluster.namesrv)
            assert address is not None
            processes = raftmq_processes(cluster)
            sent = 0
            for in_flight, count in self.settings:
                figures = run(produce(address, count, in_flight, sent, processes), self.arguments.client_loop)
                self.emit({**figures, **loop, **label})
                sent += count
            if self.arguments.via_follower:
                # what a stock client behind the group's front meets by default: a follower (follower_1)
                # forwards each send to the leader (broker.forwarding)
                follower = first_follower(cluster)
                for in_flight, count in self.settings:
                    figures = run(produce(follower, count, in_flight, sent, processes), self.arguments.client_loop)
                    self.emit({**figures, **loop, **label, "route": "follower"})
                    sent += count
            if self.arguments.sdk:
                for in_flight, count in self.settings:
                    figures = run(produce_with_sdk(cluster.namesrv, count, in_flight, processes),
                                  self.arguments.client_loop)
                    self.emit({**figures, **loop, **label})
                    sent += count + 1
            self.emit({**run(consume(address, processes), self.arguments.client_loop), **loop, **label})
            if with_cpp:
                self.measure_cpp(cluster.namesrv, {key: pid for key, pid in processes.items() if key != "client"},
                                 label, Path(directory))

    def measure_cpp(self, namesrv: str, processes: dict[str, int], label: dict[str, str], directory: Path) -> None:
        """The stock C++ client: sync sends (in-flight 1), then async at the largest in-flight setting."""
        largest = max(in_flight for in_flight, _ in self.settings)
        for mode, in_flight, count in (("sync", 1, min(self.arguments.count, IN_FLIGHT_1_COUNT_MAX)),
                                       ("async", largest, self.arguments.count)):
            try:
                figures = cpp_producer.measure(namesrv, TOPIC, mode, count, in_flight, processes,
                                               directory / f"cpp-{mode}")
            except (RuntimeError, OSError) as error:
                self.fail(f"the C++ client ({mode})", error)
                return
            self.emit({"bench": "broker", "system": "raftmq", "mode": "produce", **figures, **label})

    def measure_nats(self) -> None:
        from bench import nats_bench
        from chaos.nats_cluster import server_version

        binary = nats_server()
        assert binary is not None
        version = server_version(binary)
        always = nats_bench.sync_always_support(binary, self.scratch / "nats-probe")
        syncs: list[tuple[str, str | None, str]] = [("default", None, nats_bench.default_sync(version))]
        if always is None:
            syncs.append(("always", "always", "fsync per write (sync_interval: always)"))
        else:
            self.skip(f"NATS with sync_interval: always (nats-server {version})", always)
        note = (f"NATS: nats-server {version}, R3 file stream; default sync: {syncs[0][2]}; "
                f"in-flight N = nats-py publish_async with a window of N")
        if note not in self.notes:
            self.notes.append(note)
        for setting, sync_interval, described in syncs:
            label = {"bench": "broker", "system": "nats", "client": "nats-py", "nats_server": version,
                     "nats_sync_setting": setting, "nats_sync": described,
                     "client_loop": self.arguments.client_loop}
            try:
                # a fresh cluster each round: a store left by the last one names peers that are gone
                with nats_bench.NatsCluster(binary, self.scratch / f"nats-{setting}-{self.round}",
                                            sync_interval) as cluster:
                    figures = run(nats_bench.measure(cluster, BODY, self.settings, os.getpid()),
                                  self.arguments.client_loop)
            except nats_bench.FAILURES as error:
                self.fail(f"NATS ({setting} sync)", error)
                continue
            for record in figures:
                self.emit({**label, **({"publish": "publish_async window"} if record["mode"] == "produce" else {}),
                           **record})


def stop_on_terminate(signal_number: int, _frame: object) -> None:
    """SIGTERM unwinds like Ctrl-C, through the ``with`` blocks that stop every server this run started
    (a second SIGTERM is ignored: it would cut that short)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise SystemExit(128 + signal_number)


def main() -> None:
    signal.signal(signal.SIGTERM, stop_on_terminate)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=20_000, help="messages per in-flight setting")
    parser.add_argument("--inflight", default="1,32,256")
    parser.add_argument("--journal-flush", choices=("durable", "page_cache", "both"), default="both")
    parser.add_argument("--variant", action="append", default=[], type=variant,
                        help="NAME:SECTION.KEY=VALUE[,...]: one more durable group with these settings")
    parser.add_argument("--nats", action=argparse.BooleanOptionalAction, default=None,
                        help="measure NATS JetStream R3 too (default: when nats-server and nats-py are installed)")
    parser.add_argument("--sdk", action=argparse.BooleanOptionalAction, default=True,
                        help="also produce with our producer SDK, whose concurrent sends are coalesced (default: on)")
    parser.add_argument("--via-follower", action=argparse.BooleanOptionalAction, default=True,
                        help="also send one frame a send through a follower, which forwards to the leader: the "
                             "route a stock client behind the group's front takes by default (default: on)")
    parser.add_argument("--cpp", action=argparse.BooleanOptionalAction, default=True,
                        help="measure the stock C++ client against the first group (default: on)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="measure every system this many times, taking turns (every other round in reverse "
                             "order); the table gives medians and same-round ratios (default: 1)")
    parser.add_argument("--client-loop", choices=CLIENT_LOOPS,
                        default="uvloop" if importlib.util.find_spec("uvloop") is not None else "asyncio",
                        help="the event loop of the Python clients, ours and nats-py (default: uvloop when there)")
    arguments = parser.parse_args()
    if arguments.rounds < 1:
        parser.error("--rounds must be at least 1")
    missing_nats = None if arguments.nats is False else nats_unavailable()
    if arguments.nats and missing_nats:
        parser.error(f"--nats: {missing_nats}")
    policies = ("durable", "page_cache") if arguments.journal_flush == "both" else (arguments.journal_flush,)
    groups: list[tuple[dict[str, str], dict[str, dict[str, object]]]] = [
        ({"journal_flush": policy}, {"raft": {"journal_flush": policy}}) for policy in policies]
    groups += [({"journal_flush": "durable", "variant": name}, changes) for name, changes in arguments.variant]
    with tempfile.TemporaryDirectory(prefix="raftmq-bench-reference-") as scratch:
        bench = Bench(arguments, Path(scratch))
        for share, pid, command in cpu_meter.busy_neighbours():
            bench.warn(f"another process used {share:.0%} of a core before the run (pid {pid}: {command}): "
                       "it is measured too; stop it for figures worth comparing")
        if arguments.nats is False:
            bench.skip("NATS", "--no-nats")
        elif missing_nats:
            bench.skip("NATS", missing_nats)
        if not arguments.cpp:
            bench.skip("the C++ client", "--no-cpp")
        elif importlib.util.find_spec("rocketmq") is None:
            bench.skip("the C++ client", "PyPI rocketmq is not installed (pip install -e '.[dev]')")
        with_cpp = arguments.cpp and importlib.util.find_spec("rocketmq") is not None
        with_nats = arguments.nats is not False and missing_nats is None
        # each round measures every system once, so that two systems are measured minutes apart, not a whole
        # run apart; reversing every other round cancels a drift of the machine's speed over the run
        turns: list[Callable[[], None]] = [
            functools.partial(bench.measure_raftmq, label, changes, with_cpp=with_cpp and index == 0)
            for index, (label, changes) in enumerate(groups)]
        if with_nats:
            turns.append(bench.measure_nats)
        for round_ in range(arguments.rounds):
            bench.round = round_
            for turn in turns if round_ % 2 == 0 else reversed(turns):
                turn()
            turns[0] = functools.partial(bench.measure_raftmq, *groups[0], with_cpp=False)  # C++: one round
    print()
    print(bench_table.render(bench.records, bench.notes + bench.failures), flush=True)
    if bench.failures:
        sys.exit(1)


if __name__ == "__main__":
    main()
