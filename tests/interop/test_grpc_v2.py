"""RocketMQ 5.x clients against a three-node raftmq group, on the members' gRPC servers (broker.v2).

The stock Python SDK (``rocketmq-python-client==5.1.2``) sends, always in a subprocess of its own venv
(:mod:`tests.interop.sdk5`); what it sent is read back with our 4.x pull consumer (the same commit log,
the same topics and queues). Bad input and the calls the SDK would refuse on its own side go through our
generated stubs in this process. One group for the module (``cli.cluster.LocalCluster``, as users start
it), a topic of its own per test.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import grpc
import pytest
from google.protobuf.message import Message as ProtobufMessage

from broker.v2.messages import fifo_queue_id
from broker.v2.protocol import service_pb2 as pb
from broker.v2.protocol.definition_pb2 import (
    ClientType,
    Code,
    Message,
    MessageType,
    Publishing,
    Resource,
    Settings,
)
from broker.v2.server import SERVICE_NAME
from cli.cluster import LocalCluster, NodeInfo
from client.config import ClientConfig, ConsumerConfig
from client.message import MessageExt
from client.pull_consumer import AsyncPullConsumer
from protocol.codes import ResponseCode
from tests.interop import sdk5
from tests.interop.harness import create_topic, max_offset, run_async
from tests.support.stores import small_store
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow

QUEUES: Final = 4
#: how long what a 5.x producer sent may take to be readable through the 4.x path (a delay adds its own)
CONSUME_SECONDS: Final = 30.0
CALL_TIMEOUT_SECONDS: Final = 10.0


@dataclass(frozen=True)
class Group:
    cluster: LocalCluster

    def leader(self) -> NodeInfo:
        return wait_for(self.cluster.leader_node, "a leader", timeout_seconds=30.0)

    def follower(self) -> NodeInfo:
        leader = self.leader()
        return next(node for node in self.cluster.info.nodes if node.id != leader.id)

    def create_topic(self, topic: str, queues: int = QUEUES) -> None:
        def created() -> bool:
            return create_topic(self.leader().broker_address, topic, queues).code == ResponseCode.SUCCESS

        wait_for(created, f"the leader to create topic {topic}", timeout_seconds=30.0)


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Group]:
    sdk5.ensure()  # before the group starts: an install takes a while on a fresh machine
    with LocalCluster.start(tmp_path_factory.mktemp("grpc-group"), nodes=3, overrides=small_store()) as cluster:
        yield Group(cluster)


@pytest.fixture
def topic(request: pytest.FixtureRequest) -> str:
    return "grpc_" + re.sub(r"[^A-Za-z0-9_-]+", "_", request.node.name.removeprefix("test_")).strip("_")[:100]


# --------------------------------------------------------------------------------------------- helpers


def consume(group: Group, topic: str, expected: int, *, timeout_seconds: float = CONSUME_SECONDS) -> list[MessageExt]:
    """Every message of ``topic`` read with the 4.x pull path from offset 0 of each queue, once at least
    ``expected`` are there; in queue order within each queue."""

    async def read_all() -> list[MessageExt]:
        config = ConsumerConfig(group=f"{topic}_reader")
        async with AsyncPullConsumer(ClientConfig.of(group.cluster.namesrv), config) as consumer:
            found: list[MessageExt] = []
            for queue in sorted(await consumer.fetch_subscribe_queues(topic), key=lambda queue: queue.queue_id):
                offset = 0
                while True:
                    result = await consumer.pull(queue, "*", offset, 32)
                    if not result.messages:
                        break
                    found.extend(result.messages)
                    offset = result.next_begin_offset
            return found

    def enough() -> list[MessageExt] | None:
        found = run_async(read_all())
        return found if len(found) >= expected else None

    return wait_for(enough, f"{expected} messages of {topic} readable through PULL",
                    timeout_seconds=timeout_seconds)


def produce(endpoint: str, topic: str, messages: list[dict[str, object]]) -> list[dict[str, object]]:
    run = sdk5.produce(endpoint, topic, messages)
    assert run.returncode == 0 and len(run.results) == len(messages), run.describe()
    assert all(result["ok"] for result in run.results), run.describe()
    return run.results


def call(node: NodeInfo, method: str, request: object, response_type: type[object]) -> object:
    """One unary call with our own generated stubs."""

    async def once() -> object:
        async with grpc.aio.insecure_channel(node.grpc_address) as channel:
            stub: grpc.aio.UnaryUnaryMultiCallable[object, object] = channel.unary_unary(
                f"/{SERVICE_NAME}/{method}", request_serializer=_serialize,
                response_deserializer=response_type.FromString)  # type: ignore[attr-defined]
            metadata = (("x-mq-client-id", "raftmq-test"),)
            return await stub(request, metadata=metadata, timeout=CALL_TIMEOUT_SECONDS)

    return run_async(once())


def _serialize(message: object) -> bytes:
    assert isinstance(message, ProtobufMessage)
    return message.SerializeToString()


def send(node: NodeInfo, *messages: Message) -> pb.SendMessageResponse:
    response = call(node, "SendMessage", pb.SendMessageRequest(messages=messages), pb.SendMessageResponse)
    assert isinstance(response, pb.SendMessageResponse)
    return response


def raw_message(topic: str, body: bytes, message_id: str = "0102FC000000013FAF0B1A149D000000AA") -> Message:
    built = Message(topic=Resource(name=topic), body=body)
    built.system_properties.message_id = message_id
    built.system_properties.message_type = MessageType.NORMAL
    return built


def queue_max_offsets(group: Group, topic: str) -> list[int]:
    leader = group.leader().broker_address
    return [int(max_offset(leader, topic, queue_id).ext_fields.get("offset", "-1")) for queue_id in range(QUEUES)]


# ----------------------------------------------------------------------------------------------- tests


def test_normal_send_is_read_by_a_4x_consumer(group: Group, topic: str) -> None:
    group.create_topic(topic)
    messages: list[dict[str, object]] = [
        {"body": f"normal-{index}", "tag": "TagA" if index % 2 else "TagB", "keys": [f"key-{index}", "shared"],
         "properties": {"origin": "sdk5", "index": str(index)}}
        for index in range(6)]
    results = produce(group.leader().grpc_address, topic, messages)
    read = {message.body.decode(): message for message in consume(group, topic, len(messages))}
    assert sorted(read) == sorted(str(message["body"]) for message in messages)
    for sent, result in zip(messages, results, strict=True):
        message = read[str(sent["body"])]
        assert message.msg_id == result["message_id"]  # the 5.x message id is the UNIQ_KEY a 4.x client reads
        assert message.tags == sent["tag"]
        assert set(message.keys) == set(sent["keys"])  # type: ignore[call-overload]
        assert message.properties["origin"] == "sdk5" and message.properties["index"] == sent["properties"]["index"]  # type: ignore[index]
        assert message.reconsume_times == 0 and message.sys_flag == 0


def test_fifo_send_keeps_each_group_in_order_on_the_proxys_queue(group: Group, topic: str) -> None:
    group.create_topic(topic)
    groups = ("order-1", "order-2", "order-3")
    messages: list[dict[str, object]] = [{"body": f"{name}:{step}", "message_group": name}
                                         for step in range(4) for name in groups]
    produce(group.leader().grpc_address, topic, messages)
    read = consume(group, topic, len(messages))
    for name in groups:
        mine = [message for message in read if message.body.decode().startswith(name + ":")]
        assert {message.queue_id for message in mine} == {fifo_queue_id(name, QUEUES)}
        assert [message.body.decode() for message in mine] == [f"{name}:{step}" for step in range(4)]
        assert all(message.properties["__SHARDINGKEY"] == name for message in mine)


def test_delayed_send_is_delivered_at_its_time(group: Group, topic: str) -> None:
    group.create_topic(topic)
    due_ms = int(time.time() * 1000) + 3_000
    produce(group.leader().grpc_address, topic, [{"body": "later", "delivery_timestamp_ms": due_ms},
                                                 {"body": "now"}])
    (now,) = consume(group, topic, 1)
    assert now.body == b"now"  # the delayed one is not there yet (3 s ahead: far more than a send takes)
    read = consume(group, topic, 2)
    later = next(message for message in read if message.body == b"later")
    # timers have second precision: released in the second it is due
    assert later.store_timestamp_ms >= due_ms - 1_000
    assert later.properties["TIMER_DELIVER_MS"] == str(due_ms)


def test_transactional_send_commit_and_rollback(group: Group, topic: str) -> None:
    group.create_topic(topic)
    results = produce(group.leader().grpc_address, topic, [
        {"body": "committed", "transaction": "commit", "keys": ["tx-1"]},
        {"body": "rolled back", "transaction": "rollback"},
        {"body": "plain"},
    ])
    assert results[0]["transaction_id"] and results[1]["transaction_id"]
    read = consume(group, topic, 2)
    assert sorted(message.body for message in read) == [b"committed", b"plain"]
    committed = next(message for message in read if message.body == b"committed")
    assert committed.msg_id == results[0]["message_id"] and committed.keys == ("tx-1",)
    assert committed.prepared_transaction_offset > 0  # the half it came from, as a 4.x commit has it


def test_an_unresolved_transaction_is_checked_back_through_telemetry(group: Group, topic: str) -> None:
    """Halves the producer neither commits nor rolls back: the leader's check-back service sends each a
    RecoverOrphanedTransactionCommand on the producer's Telemetry stream, and the checker's answer
    (EndTransaction, source SOURCE_SERVER_CHECK) commits one and rolls the other back."""
    group.create_topic(topic)
    run = sdk5.produce(group.leader().grpc_address, topic, [
        {"body": "check-commit", "transaction": "leave", "keys": ["tx-check"]},
        {"body": "check-rollback", "transaction": "leave"},
    ], check_answers={"check-rollback": "rollback"}, await_checks=2, await_checks_seconds=60.0)
    assert run.returncode == 0, run.describe()
    sent = {result["index"]: result for result in run.results if "index" in result}
    assert sent[0]["ok"] and sent[1]["ok"] and sent[0]["transaction_id"], run.describe()
    checks = [result for result in run.results if "checked" in result]
    assert sorted((check["checked"], check["answer"]) for check in checks) == [
        ("check-commit", "commit"), ("check-rollback", "rollback")], run.describe()
    assert all(check["topic"] == topic for check in checks)
    assert {check["message_id"] for check in checks} == {sent[0]["message_id"], sent[1]["message_id"]}
    (committed,) = consume(group, topic, 1)
    assert committed.body == b"check-commit" and committed.msg_id == sent[0]["message_id"]
    assert committed.keys == ("tx-check",) and committed.prepared_transaction_offset > 0


def test_a_follower_forwards_sends_to_the_leader(group: Group, topic: str) -> None:
    group.create_topic(topic)
    follower = group.follower()
    produce(follower.grpc_address, topic, [{"body": "through a follower"}])
    response = send(follower, raw_message(topic, b"raw through a follower"))
    assert response.status.code == Code.OK, response
    assert sorted(message.body for message in consume(group, topic, 2)) == [b"raw through a follower",
                                                                             b"through a follower"]


def test_route_names_the_leader_as_broker_0_from_any_member(group: Group, topic: str) -> None:
    group.create_topic(topic)
    leader = group.leader()
    for node in group.cluster.info.nodes:
        def route(node: NodeInfo = node) -> pb.QueryRouteResponse | None:
            answer = call(node, "QueryRoute", pb.QueryRouteRequest(topic=Resource(name=topic)), pb.QueryRouteResponse)
            assert isinstance(answer, pb.QueryRouteResponse)
            # a follower answers from its replicated state, which has the new topic once it applied it
            return answer if answer.status.code != Code.TOPIC_NOT_FOUND else None

        response = wait_for(route, f"{node.id} to know topic {topic}", timeout_seconds=30)
        assert response.status.code == Code.OK, response
        assert len(response.message_queues) == QUEUES
        for queue in response.message_queues:
            assert queue.broker.id == 0
            address = queue.broker.endpoints.addresses[0]
            assert f"{address.host}:{address.port}" == leader.grpc_address
            assert MessageType.TRANSACTION in queue.accept_message_types
    missing = call(leader, "QueryRoute", pb.QueryRouteRequest(topic=Resource(name=topic + "_missing")),
                   pb.QueryRouteResponse)
    assert isinstance(missing, pb.QueryRouteResponse) and missing.status.code == Code.TOPIC_NOT_FOUND


def test_bad_sends_get_the_protocol_codes_and_store_nothing(group: Group, topic: str) -> None:
    group.create_topic(topic)
    leader = group.leader()
    before = queue_max_offsets(group, topic)
    oversize = raw_message(topic, b"x" * ((4 << 20) + 1))
    cases = [
        (raw_message("", b"body"), Code.ILLEGAL_TOPIC),
        (raw_message(topic + "_unknown", b"body"), Code.TOPIC_NOT_FOUND),
        (oversize, Code.MESSAGE_BODY_TOO_LARGE),
        (raw_message(topic, b""), Code.MESSAGE_BODY_EMPTY),
        (raw_message(topic, b"body", message_id=""), Code.ILLEGAL_MESSAGE_ID),
    ]
    reserved = raw_message(topic, b"body")
    reserved.user_properties["UNIQ_KEY"] = "forged"
    cases.append((reserved, Code.ILLEGAL_MESSAGE_PROPERTY_KEY))
    for message, code in cases:
        response = send(leader, message)
        assert response.status.code == code, (code, response.status)
        assert not response.entries
    empty = call(leader, "SendMessage", pb.SendMessageRequest(), pb.SendMessageResponse)
    assert isinstance(empty, pb.SendMessageResponse) and empty.status.code == Code.MESSAGE_CORRUPTED
    assert queue_max_offsets(group, topic) == before
    unknown = call(leader, "QueryRoute", pb.QueryRouteRequest(topic=Resource(name=topic + "_unknown")),
                   pb.QueryRouteResponse)
    assert isinstance(unknown, pb.QueryRouteResponse) and unknown.status.code == Code.TOPIC_NOT_FOUND  # not created


def test_settings_heartbeat_and_consumption_calls_with_bad_input(group: Group, topic: str) -> None:
    group.create_topic(topic)
    leader = group.leader()

    async def telemetry() -> pb.TelemetryCommand:
        async with grpc.aio.insecure_channel(leader.grpc_address) as channel:
            stream = channel.stream_stream(f"/{SERVICE_NAME}/Telemetry",
                                           request_serializer=pb.TelemetryCommand.SerializeToString,
                                           response_deserializer=pb.TelemetryCommand.FromString)
            settings = Settings(client_type=ClientType.PRODUCER, publishing=Publishing(topics=[Resource(name=topic)]))
            call_ = stream(iter([pb.TelemetryCommand(settings=settings)]), metadata=(("x-mq-client-id", "t1"),),
                           timeout=CALL_TIMEOUT_SECONDS)
            reply: pb.TelemetryCommand = await call_.read()  # type: ignore[assignment]
            call_.cancel()
            return reply

    reply = asyncio.run(telemetry())
    assert reply.status.code == Code.OK
    assert reply.settings.publishing.max_body_size > 0 and reply.settings.backoff_policy.max_attempts > 0
    heartbeat = call(leader, "Heartbeat", pb.HeartbeatRequest(client_type=ClientType.PRODUCER), pb.HeartbeatResponse)
    assert isinstance(heartbeat, pb.HeartbeatResponse) and heartbeat.status.code == Code.OK
    for method, request, response_type in (
        ("AckMessage", pb.AckMessageRequest(), pb.AckMessageResponse),
        ("ChangeInvisibleDuration", pb.ChangeInvisibleDurationRequest(), pb.ChangeInvisibleDurationResponse),
        ("QueryAssignment", pb.QueryAssignmentRequest(), pb.QueryAssignmentResponse),
    ):
        answer = call(leader, method, request, response_type)
        # served now (pop through Raft): a request naming no topic gets the protocol's code, not a crash
        assert answer.status.code == Code.ILLEGAL_TOPIC, (method, answer)  # type: ignore[attr-defined]

    async def receive() -> list[pb.ReceiveMessageResponse]:
        async with grpc.aio.insecure_channel(leader.grpc_address) as channel:
            stream = channel.unary_stream(f"/{SERVICE_NAME}/ReceiveMessage",
                                          request_serializer=pb.ReceiveMessageRequest.SerializeToString,
                                          response_deserializer=pb.ReceiveMessageResponse.FromString)
            return [response async for response in stream(pb.ReceiveMessageRequest(), timeout=CALL_TIMEOUT_SECONDS)]

    (received,) = asyncio.run(receive())
    assert received.status.code == Code.ILLEGAL_TOPIC
    termination = call(leader, "NotifyClientTermination", pb.NotifyClientTerminationRequest(),
                       pb.NotifyClientTerminationResponse)
    assert isinstance(termination, pb.NotifyClientTerminationResponse) and termination.status.code == Code.OK


def test_cluster_file_lists_every_members_grpc_address(group: Group) -> None:
    addresses = [node.grpc_address for node in LocalCluster.open(Path(group.cluster.data_dir)).info.nodes]
    assert len(set(addresses)) == len(addresses) == 3 and all(addresses)
