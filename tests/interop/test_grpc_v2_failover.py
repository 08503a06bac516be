"""A leader SIGKILL under a stock 5.x producer and a stock 5.x SimpleConsumer running at the same time.

Both are ``rocketmq-python-client==5.1.2`` in subprocesses of the SDK's venv (:mod:`tests.interop.sdk5_flow_driver`,
which records every send, receive and acknowledgement with its time). The producer sends sync at a steady rate;
the consumer receives and acknowledges every message at once. Once both are flowing the leader is SIGKILLed;
both go on against the new leader, then the producer stops and the consumer drains. Then:

- every send the producer saw acknowledged is stored, once (read back with our 4.x pull consumer);
- every one of them was received and acknowledged by the consumer at least once;
- no message whose acknowledgement succeeded was delivered again after it (pop state goes through Raft: an
  acknowledgement answered OK is committed, and the new leader knows it).

How the SDK finds the new leader: it is given every member's gRPC endpoint (``host:port;host:port;...``, one gRPC
channel with pick-first over them) for its QueryRoute calls, and sends, receives and acks go to the endpoint the
route names, the leader's (``broker.v2.service``: QueryRoute names the leader). The SDK refreshes its routes 10 s
after it starts and every 30 s after that, and does nothing else on UNAVAILABLE: after a kill it fails against
the dead member until its next refresh, which one of the live members answers (a dead channel reconnects to the
next address of the list). The test kills early, so the SDK's first refresh (10 s) finds the new leader; a kill
just after a refresh costs up to 30 s more. The time without an ack is printed for both clients, never asserted.

Every process (group and both drivers) is stopped at the end, even after a failure; nothing sleeps to wait.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import grpc
import pytest

from broker.v2.protocol import service_pb2 as pb
from broker.v2.protocol.definition_pb2 import Code, Resource
from broker.v2.server import SERVICE_NAME
from cli.cluster import LocalCluster, NodeInfo
from protocol.codes import ResponseCode
from tests.interop import sdk5
from tests.interop.harness import create_topic, describe, run_async, stored_messages
from tests.support.stores import small_store
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow

DRIVER: Final = Path(__file__).with_name("sdk5_flow_driver.py")
TOPIC: Final = "grpc_failover"
GROUP: Final = "GID_grpc_failover"
QUEUES: Final = 4
RATE_PER_SECOND: Final = 20
INVISIBLE_SECONDS: Final = 5
#: the consumer's long polling: short, so a receive pending on the dead leader fails soon
AWAIT_SECONDS: Final = 2
#: acknowledgements wanted from each client before the kill, and after the first one that follows it
ACKS_BEFORE_KILL: Final = 10
ACKS_AFTER_RECOVERY: Final = 20
#: each wait: the SDK's second route refresh (40 s after it started) plus an election, on two loaded cores
STEP_SECONDS: Final = 90.0
#: a driver ends itself after this long whatever happens (a backstop behind the test's own stop)
DRIVER_DEADLINE_SECONDS: Final = 300.0
#: the SDK's shutdown (it notifies the members it knows, dead ones included) before the driver is killed
STOP_GRACE_SECONDS: Final = 30.0


# ---------------------------------------------------------------------------------------------- drivers


class FlowDriver:
    """One ``sdk5_flow_driver`` process; its JSON lines read back as they are written."""

    def __init__(self, directory: Path, command: str, spec: dict[str, Any]) -> None:
        directory.mkdir(parents=True)
        self.name = command
        self.out = directory / "events.jsonl"
        self.stop_file = directory / "stop"
        self.stderr_path = directory / "stderr.txt"
        spec = {**spec, "out": str(self.out), "stop_file": str(self.stop_file),
                "deadline_seconds": DRIVER_DEADLINE_SECONDS}
        spec_path = directory / "spec.json"
        spec_path.write_text(json.dumps(spec))
        # the SDK logs to $HOME/logs/rocketmq_python/: keep it in the test's directory
        environment = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")}
        environment["HOME"] = str(directory)
        with self.stderr_path.open("wb") as stderr:
            self.process = subprocess.Popen([str(sdk5.ensure()), str(DRIVER), command, str(spec_path)],
                                            cwd=directory, env=environment, stdout=subprocess.DEVNULL, stderr=stderr,
                                            stdin=subprocess.DEVNULL)

    def events(self, kind: str | None = None) -> list[dict[str, Any]]:
        if not self.out.exists():
            return []
        lines = self.out.read_text(encoding="utf-8").splitlines()
        events = [json.loads(line) for line in lines if line.endswith("}")]  # the last may be half written
        return [event for event in events if kind is None or event["event"] == kind]

    def acks(self) -> list[dict[str, Any]]:
        """Successful operations: sends the broker acknowledged, or acknowledgements the broker took."""
        return [event for event in self.events("send" if self.name == "produce" else "ack") if event["ok"]]

    def running(self) -> bool:
        return self.process.poll() is None

    def stop(self) -> None:
        self.stop_file.touch()
        try:
            self.process.wait(STOP_GRACE_SECONDS)
        except subprocess.TimeoutExpired:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()

    def report(self) -> str:
        stderr = self.stderr_path.read_text(errors="replace")[-3000:] if self.stderr_path.exists() else ""
        return f"{self.name}: exit {self.process.poll()}; stderr tail:\n{stderr}"


@pytest.fixture
def group(tmp_path: Path) -> Iterator[LocalCluster]:
    sdk5.ensure()  # before the group starts: an install must not eat into its steps
    with LocalCluster.start(tmp_path / "group", nodes=3, overrides=small_store()) as cluster:
        yield cluster


# ----------------------------------------------------------------------------------------------- helpers


def query_route(node: NodeInfo, topic: str) -> int:
    """The status code of a QueryRoute for ``topic`` on ``node`` (our own stubs)."""

    async def once() -> int:
        async with grpc.aio.insecure_channel(node.grpc_address) as channel:
            stub = channel.unary_unary(f"/{SERVICE_NAME}/QueryRoute", request_serializer=pb.QueryRouteRequest.SerializeToString,
                                       response_deserializer=pb.QueryRouteResponse.FromString)
            response = await stub(pb.QueryRouteRequest(topic=Resource(name=topic)), timeout=10.0)
            return int(response.status.code)

    return run_async(once())


def outage(events: list[dict[str, Any]], killed_at: float, *, time_key: str) -> tuple[float, float]:
    """(last success before the kill, first success after it) among ``events`` (successes, with ``time_key``)."""
    before = max(event[time_key] for event in events if event[time_key] <= killed_at)
    after = min(event[time_key] for event in events if event[time_key] > killed_at)
    return before, after


def redelivered_after_ack(consumer_events: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Message id -> the receives of it that came after one of its acknowledgements succeeded (one consumer,
    one thread: ``seq`` orders its events)."""
    acked_at: dict[str, int] = {}
    late: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for event in sorted(consumer_events, key=lambda item: int(item["seq"])):
        message_id = str(event.get("message_id"))
        if event["event"] == "ack" and event["ok"]:
            acked_at.setdefault(message_id, event["seq"])
        elif event["event"] == "receive" and message_id in acked_at:
            late[message_id].append(event)
    return dict(late)


# ------------------------------------------------------------------------------------------------- test


def test_leader_kill_under_a_5x_producer_and_consumer(group: LocalCluster, tmp_path: Path) -> None:
    cluster = group
    leader = wait_for(cluster.leader_node, "a leader", timeout_seconds=30.0)
    created = create_topic(leader.broker_address, TOPIC, QUEUES)
    assert created.code == ResponseCode.SUCCESS, describe(created)
    # whichever member the SDK's channel picks must know the topic already
    for node in cluster.info.nodes:
        def routes(node: NodeInfo = node) -> bool:
            return query_route(node, TOPIC) == Code.OK

        wait_for(routes, f"{node.id} to route {TOPIC}", timeout_seconds=30.0)
    endpoints = ";".join(node.grpc_address for node in cluster.info.nodes)
    common = {"endpoints": endpoints, "topic": TOPIC, "request_timeout_seconds": 3}
    drivers: list[FlowDriver] = []
    try:
        producer = FlowDriver(tmp_path / "producer", "produce",
                              {**common, "rate_per_second": RATE_PER_SECOND, "body_prefix": "v5-failover"})
        drivers.append(producer)
        consumer = FlowDriver(tmp_path / "consumer", "consume",
                              {**common, "group": GROUP, "invisible_seconds": INVISIBLE_SECONDS,
                               "await_seconds": AWAIT_SECONDS, "batch": 8})
        drivers.append(consumer)

        def flowing() -> bool:
            assert producer.running() and consumer.running(), [driver.report() for driver in drivers]
            return len(producer.acks()) >= ACKS_BEFORE_KILL and len(consumer.acks()) >= ACKS_BEFORE_KILL

        wait_for(flowing, "both clients flowing", timeout_seconds=STEP_SECONDS)
        killed = cluster.leader_id()
        assert killed is not None
        killed_at = time.monotonic()
        cluster.kill(killed)

        def recovered() -> bool:
            assert producer.running() and consumer.running(), [driver.report() for driver in drivers]
            sent = [event for event in producer.acks() if event["end"] > killed_at]
            taken = [event for event in consumer.acks() if event["at"] > killed_at]
            return len(sent) >= ACKS_AFTER_RECOVERY and len(taken) >= ACKS_AFTER_RECOVERY

        wait_for(recovered, "both clients acknowledged again after the kill", timeout_seconds=STEP_SECONDS)
        producer.stop()
        sent_ids = {event["message_id"] for event in producer.acks()}

        def drained() -> bool:
            assert consumer.running(), consumer.report()
            taken = consumer.acks()
            if not taken or not sent_ids <= {event["message_id"] for event in taken}:
                return False
            # and nothing came back for an invisible time after the last ack: an acknowledged message whose
            # ack the group forgot would be delivered again by then
            last_ack: float = max(event["at"] for event in taken)
            return time.monotonic() - last_ack > INVISIBLE_SECONDS + AWAIT_SECONDS + 1

        wait_for(drained, "the consumer to acknowledge every acknowledged send", timeout_seconds=STEP_SECONDS)
        consumer.stop()
    finally:
        for driver in drivers:
            driver.stop()

    sends, consumer_events = producer.events("send"), consumer.events()
    acked_sends = [event for event in sends if event["ok"]]
    receives = [event for event in consumer_events if event["event"] == "receive"]
    acks = [event for event in consumer_events if event["event"] == "ack"]
    good_acks = [event for event in acks if event["ok"]]
    producer_gap = outage(acked_sends, killed_at, time_key="end")
    consumer_gap = outage(good_acks, killed_at, time_key="at")
    late = redelivered_after_ack(consumer_events)
    print(f"\nleader {killed} SIGKILLed. producer: {len(acked_sends)} of {len(sends)} sends acknowledged, "
          f"{producer_gap[1] - producer_gap[0]:.2f} s without an ack ({killed_at - producer_gap[0]:.2f} s before "
          f"the kill to {producer_gap[1] - killed_at:.2f} s after). consumer: {len(receives)} deliveries "
          f"({sum(1 for event in receives if (event['attempt'] or 1) > 1)} redelivered), {len(good_acks)} of "
          f"{len(acks)} acks taken, {len({event['message_id'] for event in good_acks})} messages acknowledged, "
          f"{consumer_gap[1] - consumer_gap[0]:.2f} s without an ack ({killed_at - consumer_gap[0]:.2f} s before "
          f"the kill to {consumer_gap[1] - killed_at:.2f} s after); "
          f"{sum(1 for event in consumer_events if event['event'] == 'receive_error')} failed receives; "
          f"{sum(len(events) for events in late)} deliveries after a successful ack")

    # nothing acknowledged is lost, and the SDK's own retries (one message id) were stored once
    stored = stored_messages(cluster.namesrv, TOPIC)
    stored_ids = Counter(message.msg_id for message in stored)  # the 5.x message id is the UNIQ_KEY
    missing = sorted(sent_ids - set(stored_ids))
    assert not missing, f"{len(missing)} acknowledged sends are not stored: {missing[:10]}"
    twice = sorted(message_id for message_id in sent_ids if stored_ids[message_id] > 1)
    assert not twice, f"acknowledged sends stored more than once: {twice[:10]}"
    # every acknowledged send was consumed and acknowledged, and what was acknowledged never came back
    unconsumed = sorted(sent_ids - {event["message_id"] for event in good_acks})
    assert not unconsumed, f"{len(unconsumed)} acknowledged sends never acknowledged by the consumer: {unconsumed[:10]}"
    assert not late, f"delivered again after a successful ack: {json.dumps(dict(list(late.items())[:5]))}"
    phantoms = sorted({event["message_id"] for event in receives} - set(stored_ids))
    assert not phantoms, f"received messages that are not stored: {phantoms[:10]}"
