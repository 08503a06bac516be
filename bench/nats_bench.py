"""The reference for ``broker_bench.py``: a three-node NATS JetStream cluster on loopback (Debian's
``nats-server``, driven with ``nats-py``) holding an R3 file stream, measured with the same message body,
message counts and in-flight settings as raftmq, in the same run.

* produce: JetStream publishes, each acknowledged (a PubAck after the stream's Raft group stored it).
  In-flight N is N publishes pipelined on one connection with nats-py's ``publish_async`` (a window of N:
  a new publish goes out as soon as an ack frees a slot), the client's own pipelining; latency runs from
  the publish to its ack. The client connects to the stream leader's server, as raftmq's does to its leader.
* consume: a durable pull consumer (ack policy none, as a RocketMQ pull acknowledges nothing per message)
  fetching ``PULL_BATCH_MESSAGES`` at a time, one fetch after another, as raftmq's PULL_MESSAGE bench does.

Durability differs and is recorded in every line (``nats_sync``): by default JetStream acknowledges what
its file store has written but not fsynced (the store syncs on a timer); ``sync_interval: always``
(nats-server 2.10 and later) fsyncs every write. :func:`sync_always_support` asks the installed server
whether it takes that setting. The servers' store directories, configuration files and logs live under a
directory the caller owns; every server is stopped on the way out, whatever happened.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import nats
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, PubAck, StorageType, StreamConfig

from bench import cpu_meter
from bench.figures import produce_figures
from chaos.nats_cluster import server_config
from cli.cluster import HOST, free_ports

STREAM: Final = "BENCH"
SUBJECT: Final = "bench.messages"
CONSUMER: Final = "bench-consumer"
#: a pull's batch: the same as raftmq's PULL_MESSAGE bench asks for (maxMsgNums)
PULL_BATCH_MESSAGES: Final = 32
START_TIMEOUT_SECONDS: Final = 30.0
STOP_TIMEOUT_SECONDS: Final = 10.0
#: how long one publish's ack, or one fetch, may take before the measurement gives up
REQUEST_TIMEOUT_SECONDS: Final = 30.0
POLL_SECONDS: Final = 0.05
#: what a measurement here can fail with (the caller reports it and goes on with the rest of its run)
FAILURES: Final = (RuntimeError, OSError, TimeoutError, nats.errors.Error)
#: the version that added ``sync_interval`` (and its ``always``); the file store synced every 60 s before it
SYNC_INTERVAL_SINCE: Final = (2, 10, 0)


def default_sync(version: str) -> str:
    """What ``sync_interval`` is when left unset, by version (the file store's default; not an fsync per write)."""
    numbers = tuple(int(part) for part in re.findall(r"\d+", version)[:3])
    return "every 2 min (sync_interval default)" if numbers >= SYNC_INTERVAL_SINCE else "every 60 s (fixed)"


def sync_always_support(binary: str, directory: Path) -> str | None:
    """None when the server takes ``sync_interval: always``; otherwise why not (its own words)."""
    directory.mkdir(parents=True, exist_ok=True)
    probe = directory / "probe.conf"
    probe.write_text(f"jetstream {{\n  store_dir: {json.dumps(str(directory / 'probe-store'))}\n"
                     "  sync_interval: always\n}\n")
    answer = subprocess.run([binary, "-t", "-c", str(probe)], capture_output=True, text=True, timeout=10,
                            check=False)
    if answer.returncode == 0:
        return None
    return (answer.stdout + answer.stderr).strip().replace(str(probe), probe.name) or f"exit {answer.returncode}"


@dataclass
class Server:
    name: str
    client_url: str
    log: Path
    process: subprocess.Popen[bytes]


class NatsCluster:
    """Three nats-server processes with JetStream, routed to each other on free loopback ports.
    ``with NatsCluster(binary, directory, sync_interval) as cluster:`` stops all of them at the end."""

    def __init__(self, binary: str, directory: Path, sync_interval: str | None, members: int = 3) -> None:
        self.binary = binary
        self.directory = directory
        self.sync_interval = sync_interval
        self.members = members
        self.servers: list[Server] = []

    def __enter__(self) -> NatsCluster:
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _start(self) -> None:
        ports = free_ports(2 * self.members)
        client_ports, cluster_ports = ports[: self.members], ports[self.members :]
        for index in range(self.members):
            name = f"n{index}"
            member_dir = self.directory / name
            member_dir.mkdir(parents=True, exist_ok=True)
            config = member_dir / "nats.conf"
            config.write_text(server_config(name, client_ports[index], cluster_ports[index], cluster_ports,
                                            member_dir / "store", sync_interval=self.sync_interval,
                                            cluster_name="raftmq-bench"))
            log = member_dir / "nats.log"
            with log.open("ab") as log_file:
                process = subprocess.Popen([self.binary, "-c", str(config)], stdout=log_file,
                                           stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                           start_new_session=True)
            self.servers.append(Server(name, f"nats://{HOST}:{client_ports[index]}", log, process))
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        for server in self.servers:
            port = int(server.client_url.rpartition(":")[2])
            while not _accepts(port):
                if server.process.poll() is not None:
                    raise RuntimeError(f"nats-server {server.name} exited ({server.process.returncode}); "
                                       f"see {server.log}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"nats-server {server.name} not listening after "
                                       f"{START_TIMEOUT_SECONDS:.0f} s; see {server.log}")
                time.sleep(POLL_SECONDS)

    def pids(self) -> dict[str, int]:
        return {server.name: server.process.pid for server in self.servers}

    def url(self, name: str) -> str:
        return next(server.client_url for server in self.servers if server.name == name)

    def stop(self) -> None:
        """SIGTERM every server, SIGKILL what is left after the grace period, and reap them all."""
        live = [server.process for server in self.servers if server.process.poll() is None]
        for process in live:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_SECONDS
        for process in live:
            try:
                process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=STOP_TIMEOUT_SECONDS)


def _accepts(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.settimeout(0.2)
        return probe.connect_ex((HOST, port)) == 0


async def _quiet_error(_error: Exception) -> None:
    """nats-py logs every failed (re)connect attempt with a traceback unless given a callback."""


async def connect(urls: Sequence[str]) -> Client:
    return await nats.connect(list(urls), connect_timeout=5, max_reconnect_attempts=3, dont_randomize=True,
                              error_cb=_quiet_error)


async def create_stream(cluster: NatsCluster) -> str:
    """Create the R3 file stream (retrying while the cluster elects its meta leader), wait until both
    followers are current, and return the name of the stream leader's server."""
    client = await connect([server.client_url for server in cluster.servers])
    try:
        stream = client.jetstream(timeout=5)
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while True:
            try:
                await stream.add_stream(StreamConfig(name=STREAM, subjects=[SUBJECT], num_replicas=3,
                                                     storage=StorageType.FILE))
                break
            except (nats.errors.Error, TimeoutError) as exc:  # no meta leader yet: timeouts or API errors
                if time.monotonic() > deadline:
                    raise RuntimeError(f"JetStream stream not created after {START_TIMEOUT_SECONDS:.0f} s: "
                                       f"{exc!r}") from None
                await asyncio.sleep(0.25)
        while True:
            info = await stream.stream_info(STREAM)
            group = info.cluster
            if (group is not None and group.leader and len(group.replicas or []) == cluster.members - 1
                    and all(peer.current for peer in group.replicas or [])):
                return group.leader
            if time.monotonic() > deadline:
                raise RuntimeError(f"JetStream stream {STREAM} without a leader and current followers: {group}")
            await asyncio.sleep(POLL_SECONDS)
    finally:
        await client.close()


def process_labels(cluster: NatsCluster, leader: str) -> dict[str, int]:
    """The servers as ``leader``, ``follower_1``, ``follower_2`` (raftmq's labels, so rows line up)."""
    pids = cluster.pids()
    labels = {"leader": pids.pop(leader)}
    labels.update({f"follower_{number}": pid for number, pid in enumerate(pids.values(), start=1)})
    return labels


async def produce(stream: JetStreamContext, body: bytes, count: int, in_flight: int,
                  processes: Mapping[str, int]) -> dict[str, object]:
    """``count`` acknowledged publishes, ``in_flight`` at a time; CPU of ``processes`` over the same span.
    TimeoutError when no ack came for ``REQUEST_TIMEOUT_SECONDS``.

    No timeout per publish: ``asyncio.wait_for`` around each wait for a free slot runs a task per
    message, which hands the loop to nats-py's flusher after every publish (a write per message) and cut
    the rate several times over; a watchdog that looks at the progress now and then costs nothing per message.
    """
    window = asyncio.Semaphore(in_flight)
    latencies: list[float] = []
    errors = 0
    pending: list[asyncio.Future[PubAck]] = []

    def settle(started: float) -> Callable[[asyncio.Future[PubAck]], None]:
        def done(future: asyncio.Future[PubAck]) -> None:
            nonlocal errors
            window.release()
            if future.cancelled() or future.exception() is not None:
                errors += 1
            else:
                latencies.append(time.perf_counter() - started)
        return done

    before = cpu_meter.sample(processes)
    started_all = time.perf_counter()
    async with asyncio.timeout(None) as deadline:
        watchdog = asyncio.create_task(_stall_watchdog(lambda: len(latencies) + errors, deadline))
        try:
            for _ in range(count):
                await window.acquire()
                started = time.perf_counter()
                future = await stream.publish_async(SUBJECT, body)
                future.add_done_callback(settle(started))
                pending.append(future)
            await asyncio.gather(*pending, return_exceptions=True)
        finally:
            watchdog.cancel()
    seconds = time.perf_counter() - started_all
    after = cpu_meter.sample(processes)
    return {"mode": "produce", "in_flight": in_flight, **produce_figures(latencies, errors, seconds, len(body)),
            "cpu_us_per_msg": cpu_meter.microseconds_per_message(before, after, len(latencies))}


async def _stall_watchdog(progress: Callable[[], int], deadline: asyncio.Timeout) -> None:
    """Expire ``deadline`` (its block then raises TimeoutError) once ``progress`` stood still for a period."""
    seen = progress()
    while True:
        await asyncio.sleep(REQUEST_TIMEOUT_SECONDS)
        if progress() == seen:
            deadline.reschedule(asyncio.get_running_loop().time())
            return
        seen = progress()


async def consume(stream: JetStreamContext, processes: Mapping[str, int]) -> dict[str, object]:
    """Every message of the stream through a new durable pull consumer, ``PULL_BATCH_MESSAGES`` a fetch."""
    expected = (await stream.stream_info(STREAM)).state.messages
    subscription = await stream.pull_subscribe(SUBJECT, durable=CONSUMER, config=ConsumerConfig(
        ack_policy=AckPolicy.NONE, deliver_policy=DeliverPolicy.ALL))
    total = 0
    pulls = 0
    size = 0
    before = cpu_meter.sample(processes)
    started = time.perf_counter()
    while total < expected:
        messages = await subscription.fetch(PULL_BATCH_MESSAGES, timeout=REQUEST_TIMEOUT_SECONDS)
        pulls += 1
        total += len(messages)
        size += sum(len(message.data) for message in messages)
    seconds = time.perf_counter() - started
    after = cpu_meter.sample(processes)
    await subscription.unsubscribe()
    return {"mode": "consume", "messages": total, "pulls": pulls, "msgs_per_s": round(total / seconds),
            "MB_per_s": round(size / seconds / 1e6, 2),
            "cpu_us_per_msg": cpu_meter.microseconds_per_message(before, after, total)}


async def measure(cluster: NatsCluster, body: bytes, settings: Sequence[tuple[int, int]],
                  client_pid: int) -> list[dict[str, object]]:
    """Create the stream, then produce at each ``(in_flight, count)`` and consume it all: one figure dict per
    measurement, each with the CPU per message of the three servers and the client (``client_pid``)."""
    leader = await create_stream(cluster)
    processes = {**process_labels(cluster, leader), "client": client_pid}
    client = await connect([cluster.url(leader)])
    try:
        stream = client.jetstream(timeout=REQUEST_TIMEOUT_SECONDS,
                                  publish_async_max_pending=max(in_flight for in_flight, _ in settings))
        figures = [await produce(stream, body, count, in_flight, processes) for in_flight, count in settings]
        figures.append(await consume(stream, processes))
    finally:
        await client.close()
    return figures
