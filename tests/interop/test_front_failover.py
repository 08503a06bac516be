"""A stock C++ producer (PyPI ``rocketmq==0.4.4``, librocketmq 1.2.x) behind the group's front (cli.front: a real
HAProxy routing to the followers, registered as the group's brokerId 0) while the leader is SIGKILLed.

The producer sends sync at a steady rate (bench/cpp_failover_producer.py, a process of its own) and knows only
the front's address. The test kills the leader, waits until sends are acknowledged again, then reads every
queue of the topic back: every acknowledged message is stored, once, with the group's address (the front)
as its store host. The time without an ack is printed, never asserted (a shared host's timing is not the
broker's). A follower's own address takes writes too (it forwards them to the leader).

Every process (group, front, producer) is stopped at the end, even after a failure; nothing sleeps to wait.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import pytest

from cli.cluster import LocalCluster, is_alive
from cli.front import FOLLOWER_ROUTE_SOURCE
from protocol.codes import RequestCode, ResponseCode
from tests.interop.harness import (
    REPOSITORY,
    call,
    create_topic,
    describe,
    master_address,
    route,
    stored_messages,
)
from tests.support.stores import small_store
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow

QUEUES: Final = 4
RATE_PER_SECOND: Final = 50
#: acknowledged sends wanted before the kill, and after the first ack that follows it
ACKS_BEFORE_KILL: Final = 25
ACKS_AFTER_RECOVERY: Final = 25
STEP_SECONDS: Final = 90.0


@pytest.fixture
def fronted_group(tmp_path: Path) -> Iterator[LocalCluster]:
    with LocalCluster.start(tmp_path / "group", nodes=3, overrides=small_store(), front="haproxy") as cluster:
        yield cluster


class Producer:
    """The C++ producer process; its JSON lines read back as they are written."""

    def __init__(self, directory: Path, namesrv: str, topic: str) -> None:
        (directory / "home").mkdir(parents=True)
        self.out = directory / "events.jsonl"
        self.stop_file = directory / "stop"
        self.stderr_path = directory / "stderr.txt"
        with self.stderr_path.open("wb") as stderr:
            self.process = subprocess.Popen(
                [sys.executable, str(REPOSITORY / "bench" / "cpp_failover_producer.py"), "--namesrv", namesrv,
                 "--topic", topic, "--group", f"{topic}_producers", "--rate", str(RATE_PER_SECOND),
                 "--run", topic, "--out", str(self.out), "--stop-file", str(self.stop_file),
                 "--deadline-seconds", "300"],
                cwd=REPOSITORY, env=dict(os.environ, HOME=str(directory / "home")), stdout=subprocess.DEVNULL,
                stderr=stderr, stdin=subprocess.DEVNULL)

    def events(self, kind: str) -> list[dict[str, Any]]:
        if not self.out.exists():
            return []
        lines = self.out.read_text(encoding="utf-8").splitlines()
        return [event for line in lines if line.endswith("}") and (event := json.loads(line))["event"] == kind]

    def stop(self) -> None:
        self.stop_file.touch()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()


def test_a_stock_producer_rides_through_a_leader_kill_behind_the_front(fronted_group: LocalCluster,
                                                                       tmp_path: Path) -> None:
    cluster = fronted_group
    front = cluster.info.front
    topic = "front_failover"
    created = create_topic(front, topic, QUEUES)  # through the front: the leader takes it
    assert created.code == ResponseCode.SUCCESS, describe(created)
    # the name server gives the front as the group's brokerId 0, the only address a stock client sends to
    assert wait_for(lambda: (data := route(cluster.namesrv, topic)) and master_address(data),
                    f"a route of {topic}",
                    timeout_seconds=30.0) == front

    producer = Producer(tmp_path / "producer", cluster.namesrv, topic)
    try:
        wait_for(lambda: len(producer.events("ack")) >= ACKS_BEFORE_KILL, "acks before the kill",
                 timeout_seconds=STEP_SECONDS)
        leader = cluster.leader_id()
        assert leader is not None
        killed_at = time.monotonic()
        cluster.kill(leader)
        first_after = wait_for(lambda: next((event for event in producer.events("ack") if event["at"] > killed_at),
                                            None), "an ack after the kill", timeout_seconds=STEP_SECONDS)
        wait_for(lambda: sum(event["at"] > first_after["at"] for event in producer.events("ack"))
                 >= ACKS_AFTER_RECOVERY, "acks after the recovery", timeout_seconds=STEP_SECONDS)
    finally:
        producer.stop()
    acks, errors = producer.events("ack"), producer.events("error")
    last_before = max(event["at"] for event in acks if event["at"] <= killed_at)
    print(f"\nleader {leader} SIGKILLed: {first_after['at'] - last_before:.2f} s without an ack through the front; "
          f"{len(acks)} sends acknowledged, {len(errors)} failed")

    stored = stored_messages(cluster.namesrv, topic)
    stored_bodies = [message.body.decode() for message in stored]
    acknowledged = {event["body"] for event in acks}
    missing = acknowledged - set(stored_bodies)
    assert not missing, f"{len(missing)} acknowledged messages are not stored: {sorted(missing)[:10]}"
    duplicated = {body for body in acknowledged if stored_bodies.count(body) > 1}
    assert not duplicated, f"acknowledged messages stored more than once: {sorted(duplicated)[:10]}"
    # the store host is the group's address (the front), whichever member stored the message
    front_host, front_port = front.rsplit(":", 1)
    assert {message.store_host for message in stored} == {f"{front_host}:{front_port}"}
    # and the born host is the producer's own: the front (connecting from FOLLOWER_ROUTE_SOURCE) named it in
    # a PROXY v2 header, which the members believe from that source only
    assert {message.born_host.rpartition(":")[0] for message in stored} == {"127.0.0.1"} != {FOLLOWER_ROUTE_SOURCE}

    # any member takes writes: a follower's own address forwards a send to the leader
    current_leader = cluster.leader_id()
    follower = next(node for node in cluster.info.nodes if node.id != current_leader and is_alive(node.pid))
    answer = call(follower.broker_address, RequestCode.SEND_MESSAGE, {
        "producerGroup": f"{topic}_producers", "topic": topic, "defaultTopic": "TBW102", "defaultTopicQueueNums": "4",
        "queueId": "0", "sysFlag": "0", "bornTimestamp": str(int(time.time() * 1000)), "flag": "0",
        "properties": "UNIQ_KEY\x01forwarded-0\x02", "reconsumeTimes": "0", "unitMode": "false",
    }, b"sent to a follower")
    assert answer.code == ResponseCode.SUCCESS, describe(answer)
    # read through the front, so possibly from a follower that has not applied it yet: it shows there soon
    wait_for(lambda: b"sent to a follower" in {message.body for message in stored_messages(cluster.namesrv, topic)},
             "the forwarded send, read back through the front", timeout_seconds=STEP_SECONDS)
