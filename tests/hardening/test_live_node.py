"""A live three-node group under hostile input: seeded garbage on the remoting ports while a workload
runs (the workload sees no error, every node stays up), and the connection limits as a peer meets them
(idle, trickling and half-closed connections are closed; connections beyond the limit are refused).

One group for the module, with a short idle timeout and a small connection limit. Nothing sleeps to wait
for a condition: every wait polls with a deadline; the only paced waits are a trickling peer's.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pytest

from cli.cluster import LocalCluster, is_alive, route_master
from client import (
    ClientConfig,
    ConsumerConfig,
    Message,
    MessageExt,
    Producer,
    ProducerConfig,
    PushConsumer,
    SendStatus,
)
from tests.acl.helpers import runtime_info
from tests.hardening.garbage import KINDS, GarbageSender
from tests.support.stores import small_store
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow

SEED: Final = 20_261_122
IDLE_TIMEOUT_SECONDS: Final = 4.0
CONNECTIONS_MAX: Final = 64
MESSAGES: Final = 300
#: the workload goes on until the garbage senders made at least this many connections
GARBAGE_CONNECTIONS_MIN: Final = 300
WORKLOAD_SECONDS_MAX: Final = 120.0
TOPIC: Final = "hardening-workload"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    overrides = small_store({"broker": {"remoting_idle_timeout_seconds": IDLE_TIMEOUT_SECONDS,
                                        "remoting_connections_max": CONNECTIONS_MAX}})
    with LocalCluster.start(tmp_path_factory.mktemp("hardening-group"), nodes=3, overrides=overrides) as started:
        yield started


def leader(cluster: LocalCluster) -> str:
    return wait_for(lambda: route_master(cluster.namesrv), "a leader in the routes", timeout_seconds=30)


def all_alive(cluster: LocalCluster) -> None:
    for node in cluster.info.nodes:
        assert is_alive(node.pid), f"{node.id} died; see {node.log}"
        assert runtime_info(node.broker_address) is not None, f"{node.id} does not answer; see {node.log}"


#: pysyncobj logs this at CRITICAL whenever a leader re-sends entries a follower already applied, identical
#: ones included; it shows up under a plain workload without any garbage (the replicas' commit logs stay
#: byte-identical), so it says nothing about hostile input
_PYSYNCOBJ_RESEND: Final = "truncating already-applied log entries"


def log_problems(cluster: LocalCluster) -> list[str]:
    """Lines of the broker logs that show a programmer error (an unexpected exception or worse)."""
    problems = []
    for node in cluster.info.nodes:
        for line in Path(node.log).read_text(errors="replace").splitlines():
            if _PYSYNCOBJ_RESEND in line:
                continue
            if " CRITICAL " in line or "Traceback" in line or ("processor" in line and " failed " in line):
                problems.append(f"{node.id}: {line}")
    return problems


def test_garbage_on_every_remoting_port_while_a_workload_runs(cluster: LocalCluster) -> None:
    config = ClientConfig((cluster.namesrv,), client_ip="127.0.0.1", request_timeout_seconds=5.0,
                          route_refresh_interval_seconds=2.0, heartbeat_interval_seconds=2.0)
    consumer_config = ConsumerConfig.from_mapping({
        "group": "hardening-consumers", "consume_from_where": "CONSUME_FROM_FIRST_OFFSET",
        "suspend_timeout_seconds": 1.0, "pull_backoff_seconds": 0.1, "rebalance_interval_seconds": 1.0})
    received: dict[bytes, int] = {}
    lock = threading.Lock()

    def listener(messages: list[MessageExt], context: object) -> None:
        with lock:
            for message in messages:
                received[message.body] = received.get(message.body, 0) + 1

    garbage = GarbageSender([node.broker_address for node in cluster.info.nodes], SEED)
    bodies: list[bytes] = []
    results = []
    with Producer(config, ProducerConfig(group="hardening-producers")) as producer:
        producer.send(Message(TOPIC, b"warm-up"))  # the topic exists before the consumer subscribes
        consumer = PushConsumer(config, consumer_config, listener=listener)
        consumer.subscribe(TOPIC)
        with consumer:
            garbage.start()
            try:
                deadline = time.monotonic() + WORKLOAD_SECONDS_MAX
                while len(bodies) < MESSAGES or garbage.connections < GARBAGE_CONNECTIONS_MIN:
                    assert time.monotonic() < deadline, f"workload too slow: {len(bodies)} sends, {garbage}"
                    bodies.append(f"workload {len(bodies)}".encode())
                    results.append(producer.send(Message(TOPIC, bodies[-1])))
                wait_for(lambda: all(body in received for body in bodies), "every message consumed",
                         timeout_seconds=60)
            finally:
                garbage.stop()
    assert {result.status for result in results} == {SendStatus.SEND_OK}
    assert set(garbage.kinds) == set(KINDS), garbage
    duplicates = {body: count for body, count in received.items() if count > 1 and body in bodies}
    assert not duplicates, f"delivered more than once: {list(duplicates)[:5]}"
    all_alive(cluster)
    assert not log_problems(cluster), "\n".join(log_problems(cluster)[:20])


def read_until_closed(connection: socket.socket, deadline_seconds: float, trickle: bytes = b"") -> float:
    """Seconds until the broker closed ``connection``; with ``trickle``, one more byte of it is sent each
    time a second passes without the connection closing (a slow-loris peer)."""
    started = time.monotonic()
    connection.settimeout(1.0)
    position = 0
    while time.monotonic() - started < deadline_seconds:
        try:
            if not connection.recv(65536):
                return time.monotonic() - started
        except TimeoutError:
            if trickle and position < len(trickle):
                connection.sendall(trickle[position:position + 1])
                position += 1
        except ConnectionResetError:
            return time.monotonic() - started
    raise AssertionError(f"the broker kept the connection open for {deadline_seconds} s")


def test_idle_trickling_and_half_closed_connections_are_closed(cluster: LocalCluster) -> None:
    address = leader(cluster)
    host, _, port = address.rpartition(":")
    frame_start = b"\x00\x00\x10\x00\x00\x00\x00\x80" + b"{" * 64  # a 4 KiB frame that never completes
    with socket.create_connection((host, int(port))) as silent:
        closed_silent = read_until_closed(silent, 4 * IDLE_TIMEOUT_SECONDS)
    with socket.create_connection((host, int(port))) as slow:
        closed_slow = read_until_closed(slow, 4 * IDLE_TIMEOUT_SECONDS, trickle=frame_start)
    # a partial frame is no activity: the trickle does not keep the connection open
    assert closed_silent >= IDLE_TIMEOUT_SECONDS * 0.5, closed_silent
    assert closed_slow <= 2 * IDLE_TIMEOUT_SECONDS + 1, closed_slow
    with socket.create_connection((host, int(port))) as half:
        half.sendall(frame_start)
        half.shutdown(socket.SHUT_WR)
        assert read_until_closed(half, IDLE_TIMEOUT_SECONDS) < IDLE_TIMEOUT_SECONDS
    assert runtime_info(address) is not None


def test_connections_beyond_the_limit_are_refused_and_the_node_serves_again(cluster: LocalCluster) -> None:
    address = leader(cluster)
    host, _, port = address.rpartition(":")
    opened: list[socket.socket] = []
    try:
        for _ in range(CONNECTIONS_MAX + 16):
            opened.append(socket.create_connection((host, int(port)), timeout=5))

        def refused(connection: socket.socket) -> bool:
            connection.settimeout(0.05)
            try:
                return connection.recv(1) == b""
            except TimeoutError:
                return False
            except ConnectionResetError:
                return True

        wait_for(lambda: sum(refused(connection) for connection in opened) >= 16,
                 "the connections over the limit to be closed",
                 timeout_seconds=10)
    finally:
        for connection in opened:
            with contextlib.suppress(OSError):
                connection.close()
    wait_for(lambda: runtime_info(address), "the leader to serve again", timeout_seconds=10)
