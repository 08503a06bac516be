"""`raftmq cluster up --groups 2`: two broker groups under one name server. A topic spreads its queues over
both; sends land in both; one group losing its leader delays only its own queues while the other keeps
acknowledging; the killed group's queues resume after its election; nothing acknowledged is lost.

No front (it would only add two HAProxy processes); small store files (tests.support.stores.small_store).
"""

from __future__ import annotations

import asyncio
import json
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import pytest
from click.testing import CliRunner

from cli.cluster import LocalCluster, is_alive
from cli.main import main
from client.config import ConsumerConfig, ProducerConfig
from client.errors import MQClientError
from client.message import Message, MessageQueue, PullStatus
from client.producer import AsyncProducer
from client.pull_consumer import AsyncPullConsumer
from tests.support.stores import small_store
from tests.support.waiting import wait_for

GROUPS: Final = ("broker-a", "broker-b")
TOPIC: Final = "MultiGroup"
AUTO_TOPIC: Final = "MultiGroupAuto"
QUEUES_PER_GROUP: Final = 2
STEP_SECONDS: Final = 30.0
#: each sender's pause between sends: a steady load the two cores shared with the members can carry
SEND_PACING_SECONDS: Final = 0.02
ACKS_PER_QUEUE: Final = 5


def raftmq(*arguments: str, exit_code: int = 0) -> str:
    result = CliRunner().invoke(main, list(arguments))
    assert result.exit_code == exit_code, result.output
    return result.output


@pytest.fixture
def data_dir(tmp_path: Path) -> Iterator[Path]:
    directory = tmp_path / "cluster"
    try:
        yield directory
    finally:
        if (directory / "cluster.json").exists():
            LocalCluster.open(directory).stop()  # whatever the test did, nothing outlives it


@dataclass(frozen=True)
class Ack:
    at: float
    queue: MessageQueue
    sequence: int
    queue_offset: int
    broker_address: str


class Senders:
    """One sender per queue (pinned: a send waits for its own group only), each sending a numbered body
    after another until stopped; every acknowledgement is recorded with the time it arrived."""

    def __init__(self, producer: AsyncProducer, queues: list[MessageQueue]) -> None:
        self.producer = producer
        self.queues = queues
        self.acks: list[Ack] = []
        self.failures: list[tuple[MessageQueue, int, str]] = []
        self.stopping = asyncio.Event()
        self.tasks = [asyncio.create_task(self._send(queue)) for queue in queues]

    @staticmethod
    def body(queue: MessageQueue, sequence: int) -> bytes:
        return f"{queue.broker_name}/{queue.queue_id}/{sequence}".encode()

    async def _send(self, queue: MessageQueue) -> None:
        sequence = 0
        while not self.stopping.is_set():
            try:
                result = await self.producer.send(Message(TOPIC, self.body(queue, sequence)), queue=queue)
            except MQClientError as error:  # not acknowledged: may or may not be stored
                self.failures.append((queue, sequence, str(error)))
            else:
                assert result.message_queue == queue
                self.acks.append(Ack(time.monotonic(), queue, sequence, result.queue_offset, result.broker_address))
            sequence += 1
            await asyncio.sleep(SEND_PACING_SECONDS)

    async def stop(self) -> None:
        self.stopping.set()
        await asyncio.gather(*self.tasks)

    async def wait(self, condition: object, what: str) -> None:
        """Poll ``condition()`` (on the event loop, the senders running) until it holds."""
        assert callable(condition)
        deadline = time.monotonic() + STEP_SECONDS
        while not condition():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {STEP_SECONDS} s waiting for {what}")
            await asyncio.sleep(0.05)


async def read_everything(namesrv: str, queues: list[MessageQueue]) -> dict[MessageQueue, list[tuple[int, bytes]]]:
    """Every stored message of each queue, as (queue offset, body), read from offset 0."""
    stored: dict[MessageQueue, list[tuple[int, bytes]]] = {}
    async with AsyncPullConsumer(namesrv, ConsumerConfig(group="multi_group_readers")) as reader:
        for queue in queues:
            messages: list[tuple[int, bytes]] = []
            offset = 0
            while True:
                result = await reader.pull(queue, "*", offset, 32)
                if result.status is not PullStatus.FOUND:
                    break
                messages += [(message.queue_offset, message.body) for message in result.messages]
                offset = result.next_begin_offset
            stored[queue] = messages
    return stored


async def send_to_a_new_topic(namesrv: str, count: int) -> set[str]:
    """Send ``count`` messages at once to a topic nobody created (auto-creation); the groups that took them."""
    async with AsyncProducer(namesrv, ProducerConfig(group="multi_group_auto")) as producer:
        results = await asyncio.gather(*(producer.send(Message(AUTO_TOPIC, f"auto {index}".encode()))
                                         for index in range(count)))
    return {result.message_queue.broker_name for result in results}


async def kill_a_leader_under_load(cluster: LocalCluster) -> None:
    killed_group, other_group = GROUPS
    async with AsyncProducer(cluster.namesrv, ProducerConfig(group="multi_group_senders")) as producer:
        queues = sorted(await producer.fetch_publish_queues(TOPIC))
        # the topic's route lists every group's queues
        assert [(queue.broker_name, queue.queue_id) for queue in queues] == [
            (group, queue_id) for group in GROUPS for queue_id in range(QUEUES_PER_GROUP)]
        senders = Senders(producer, queues)
        try:
            def acked_everywhere(since: float) -> bool:
                counts = {queue: 0 for queue in queues}
                for ack in senders.acks:
                    counts[ack.queue] += ack.at > since
                return min(counts.values()) >= ACKS_PER_QUEUE

            await senders.wait(lambda: acked_everywhere(0.0), "acks on every queue of both groups")
            old_leader = await asyncio.to_thread(cluster.group_leader, killed_group)
            assert old_leader is not None
            killed_at = time.monotonic()
            await asyncio.to_thread(cluster.kill, old_leader.id)

            def resumed() -> Ack | None:  # the killed group's first ack from its next leader
                return next((ack for ack in senders.acks if ack.at > killed_at and ack.queue.broker_name == killed_group
                             and ack.broker_address != old_leader.client_address), None)

            await senders.wait(resumed, f"{killed_group} acknowledging again after its election")
            first_after = resumed()
            assert first_after is not None
            await senders.wait(lambda: acked_everywhere(first_after.at), "acks on every queue after the election")
        finally:
            await senders.stop()

    # the killed group's no-leader window: from its last ack (by the old leader) to its first by the next one
    killed_acks = [ack for ack in senders.acks if ack.queue.broker_name == killed_group]
    window_start = max(ack.at for ack in killed_acks if ack.at < first_after.at)
    assert all(ack.broker_address == old_leader.client_address for ack in killed_acks if ack.at <= window_start)
    # the other group went on acknowledging inside that window, on each of its queues
    inside = [ack for ack in senders.acks if window_start < ack.at < first_after.at]
    assert inside and {ack.queue.broker_name for ack in inside} == {other_group}
    assert {ack.queue for ack in inside} == {queue for queue in queues if queue.broker_name == other_group}
    # and every queue of the killed group came back after its election
    assert {ack.queue for ack in killed_acks if ack.at >= first_after.at} == {
        queue for queue in queues if queue.broker_name == killed_group}

    # nothing acknowledged is lost, nor moved, nor reordered within its queue
    stored = await read_everything(cluster.namesrv, queues)
    for queue in queues:
        offsets = {body: offset for offset, body in stored[queue]}
        acked = [ack for ack in senders.acks if ack.queue == queue]
        missing = [ack.sequence for ack in acked if Senders.body(queue, ack.sequence) not in offsets]
        assert not missing, f"{queue}: acknowledged and not stored: {missing}"
        assert all(offsets[Senders.body(queue, ack.sequence)] == ack.queue_offset for ack in acked)
        sequences = [int(body.rsplit(b"/", 1)[1]) for _, body in sorted(stored[queue])]
        assert sequences == sorted(sequences), f"{queue}: stored out of order"


@pytest.mark.slow
def test_two_groups_spread_a_topic_and_one_losing_its_leader_delays_only_its_own_queues(data_dir: Path) -> None:
    settings = [option for key, value in small_store()["store"].items()
                for option in ("--set", f"store.{key}={value}")]
    output = raftmq("cluster", "up", "--data-dir", str(data_dir), "--groups", "2", "--front", "none", *settings)
    lines = output.splitlines()
    namesrv = next(line for line in lines if line.startswith("namesrv=")).split("=", 1)[1]
    assert [line.split()[0] for line in lines if line.startswith("group=")] == [f"group={name}" for name in GROUPS]

    # cluster.json records every group: its members, secret; ids and ports unique across groups
    info = json.loads((data_dir / "cluster.json").read_text())
    assert [(group["name"], group["nodes"]) for group in info["groups"]] == [
        ("broker-a", ["a0", "a1", "a2"]), ("broker-b", ["b0", "b1", "b2"])]
    assert [node["id"] for node in info["nodes"]] == ["a0", "a1", "a2", "b0", "b1", "b2"]
    ports = [info["namesrv"]] + [node[key] for node in info["nodes"] for key in (
        "broker_address", "raft_address", "catchup_address", "grpc_address", "http_address")]
    assert len(set(ports)) == len(ports)
    secrets = [Path(group["secret_file"]).read_text() for group in info["groups"]]
    assert len(set(secrets)) == 2
    for group in info["groups"]:
        for node_id in group["nodes"]:
            settings_file = tomllib.loads((data_dir / node_id / "node.toml").read_text())
            assert settings_file["broker"]["broker_name"] == group["name"]
            assert settings_file["node"]["secret_file"] == group["secret_file"]
            assert {peer["id"] for peer in settings_file["peers"]} == set(group["nodes"]) - {node_id}

    # `cluster status`, local and through the name server, lists both groups: one leader each
    rows = [json.loads(line) for line in raftmq("cluster", "status", "--data-dir", str(data_dir), "--json").splitlines()]
    assert sorted((row["group"], row["role"]) for row in rows) == sorted(
        (group, role) for group in GROUPS for role in ("leader", "follower", "follower"))
    assert raftmq("cluster", "status", "--data-dir", str(data_dir)).splitlines()[0].split()[:2] == ["group", "node"]

    def remote_settled() -> list[dict[str, object]] | None:
        remote = [json.loads(line) for line in raftmq("cluster", "status", "--namesrv", namesrv, "--json").splitlines()]
        roles = sorted((str(row["group"]), str(row["role"])) for row in remote)
        return remote if roles == sorted((group, role) for group in GROUPS
                                         for role in ("leader", "follower", "follower")) else None

    remote = wait_for(remote_settled, "both groups reported through the name server",
                      timeout_seconds=STEP_SECONDS)
    assert {str(row["node"]) for row in remote} == {"a0", "a1", "a2", "b0", "b1", "b2"}

    # a topic created through the CLI holds its queues on every group
    raftmq("topic", "create", TOPIC, "--queues", str(QUEUES_PER_GROUP), "--namesrv", namesrv)
    # and so does one auto-created by its first sends, which borrow TBW102's route: every group's queues
    # (RocketMQ's auto-creation: each group that takes a first send creates the topic and registers it)
    assert asyncio.run(send_to_a_new_topic(namesrv, 8)) == set(GROUPS)

    def auto_routed() -> bool:
        described = CliRunner().invoke(main, ["topic", "describe", AUTO_TOPIC, "--json", "--namesrv", namesrv])
        return described.exit_code == 0 and sorted(
            data["brokerName"] for data in json.loads(described.output)["queueDatas"]) == list(GROUPS)

    wait_for(auto_routed, f"{AUTO_TOPIC} routed to both groups", timeout_seconds=STEP_SECONDS)
    cluster = LocalCluster.open(data_dir)
    asyncio.run(kill_a_leader_under_load(cluster))

    # --leader needs its group when there are several; restart and down work for a member of any group
    assert "--group" in raftmq("cluster", "kill", "--leader", "--data-dir", str(data_dir), exit_code=2)
    killed = next(row["node"] for row in cluster.status() if not row["alive"])
    assert str(killed).startswith("a")
    raftmq("cluster", "restart", str(killed), "--data-dir", str(data_dir))
    restarted = LocalCluster.open(data_dir)
    wait_for(lambda: all(row["alive"] and row["role"] in ("leader", "follower") for row in restarted.status()),
             f"{killed} back", timeout_seconds=STEP_SECONDS)
    raftmq("cluster", "down", "--data-dir", str(data_dir))
    assert not any(is_alive(node.pid) for node in restarted.info.nodes) and not is_alive(restarted.info.namesrv_pid)


@pytest.mark.parametrize(("arguments", "exit_code", "message"), [
    (["cluster", "up", "--groups", "0"], 2, "--groups"),
    (["cluster", "up", "--groups", "27"], 2, "--groups"),
    (["cluster", "up", "--groups", "2", "--front", "none", "--set", "broker.broker_name=mine"], 1,
     "broker.broker_name is set per group"),
    (["cluster", "kill", "n0", "--group", "broker-a"], 2, "--group goes with --leader"),
])
def test_bad_group_options_are_refused_before_anything_starts(tmp_path: Path, arguments: list[str], exit_code: int,
                                                              message: str) -> None:
    directory = tmp_path / "cluster"
    output = raftmq(*arguments, "--data-dir", str(directory), exit_code=exit_code)
    assert message in output and "Traceback" not in output
    assert not directory.exists()
