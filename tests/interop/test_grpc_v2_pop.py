"""RocketMQ 5.x consumption (pop through Raft) against three-node raftmq groups.

The stock Python SDK's SimpleConsumer (``rocketmq-python-client==5.1.2``, in a subprocess of its own venv,
:mod:`tests.interop.sdk5`) receives what a 5.x producer and our 4.x producer sent, acknowledges, and gets an
unacknowledged message back after its invisible time. Receipt handles, changes of invisibility and the
failover of the leader with messages in flight are driven with our generated stubs in this process.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import grpc
import pytest
from click.testing import CliRunner, Result
from google.protobuf.duration_pb2 import Duration
from google.protobuf.message import Message as ProtobufMessage

from broker.v2.protocol import service_pb2 as pb
from broker.v2.protocol.definition_pb2 import (
    Code,
    FilterExpression,
    FilterType,
    Message,
    MessageQueue,
    Resource,
)
from broker.v2.server import SERVICE_NAME
from cli.cluster import LocalCluster, NodeInfo
from cli.main import main as cli_main
from client.config import ClientConfig, ProducerConfig
from client.message import Message as Message4
from client.producer import AsyncProducer
from protocol.codes import RequestCode, ResponseCode
from tests.broker import wire
from tests.interop import sdk5
from tests.interop.harness import create_topic, max_offset, member_ready, run_async
from tests.support.stores import small_store
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow

QUEUES: Final = 2
CALL_TIMEOUT_SECONDS: Final = 15.0


class Group:
    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster

    def leader(self) -> NodeInfo:
        return wait_for(self.cluster.leader_node, "a leader", timeout_seconds=30.0)

    def create_topic(self, topic: str, queues: int = QUEUES) -> None:
        def created() -> bool:
            return create_topic(self.leader().broker_address, topic, queues).code == ResponseCode.SUCCESS

        wait_for(created, f"the leader to create topic {topic}", timeout_seconds=30.0)


def start_group(directory: Path) -> LocalCluster:
    return LocalCluster.start(directory, nodes=3, overrides=small_store())


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Group]:
    sdk5.ensure()
    with start_group(tmp_path_factory.mktemp("pop-group")) as cluster:
        yield Group(cluster)


@pytest.fixture
def topic(request: pytest.FixtureRequest) -> str:
    return "pop_" + re.sub(r"[^A-Za-z0-9_-]+", "_", request.node.name.removeprefix("test_")).strip("_")[:100]


# --------------------------------------------------------------------------------------------- stubs


def _serialize(message: object) -> bytes:
    assert isinstance(message, ProtobufMessage)
    return message.SerializeToString()


def call(node: NodeInfo, method: str, request: object, response_type: type[object]) -> object:
    async def once() -> object:
        async with grpc.aio.insecure_channel(node.grpc_address) as channel:
            stub: grpc.aio.UnaryUnaryMultiCallable[object, object] = channel.unary_unary(
                f"/{SERVICE_NAME}/{method}", request_serializer=_serialize,
                response_deserializer=response_type.FromString)  # type: ignore[attr-defined]
            return await stub(request, metadata=(("x-mq-client-id", "raftmq-pop-test"),),
                              timeout=CALL_TIMEOUT_SECONDS)

    return run_async(once())


def send(node: NodeInfo, topic: str, *bodies: str) -> None:
    messages = []
    for index, body in enumerate(bodies):
        message = Message(body=body.encode())
        message.topic.name = topic
        message.system_properties.message_id = f"0102FC000000013FAF0B1A149D{time.time_ns() % 10**8:08X}{index:02X}"
        message.system_properties.tag = "TagA"
        messages.append(message)
    for message in messages:  # one per request: each on a queue of its own choosing
        response = call(node, "SendMessage", pb.SendMessageRequest(messages=[message]), pb.SendMessageResponse)
        assert isinstance(response, pb.SendMessageResponse) and response.status.code == Code.OK, response


def receive(node: NodeInfo, group_name: str, topic: str, *, invisible_ms: int, polling_ms: int = 0,
            batch: int = 32, tag: str = "*") -> tuple[int, list[Message]]:
    """One ReceiveMessage on every queue (id -1): the status code and the messages."""
    request = pb.ReceiveMessageRequest(
        group=Resource(name=group_name), message_queue=MessageQueue(topic=Resource(name=topic), id=-1),
        filter_expression=FilterExpression(type=FilterType.TAG, expression=tag), batch_size=batch,
        invisible_duration=Duration(seconds=invisible_ms // 1000, nanos=invisible_ms % 1000 * 1_000_000),
        long_polling_timeout=Duration(seconds=polling_ms // 1000, nanos=polling_ms % 1000 * 1_000_000))

    async def once() -> list[pb.ReceiveMessageResponse]:
        async with grpc.aio.insecure_channel(node.grpc_address) as channel:
            stream = channel.unary_stream(f"/{SERVICE_NAME}/ReceiveMessage", request_serializer=_serialize,
                                          response_deserializer=pb.ReceiveMessageResponse.FromString)
            return [response async for response in stream(request, timeout=CALL_TIMEOUT_SECONDS + polling_ms / 1000)]

    responses = run_async(once(), timeout_seconds=CALL_TIMEOUT_SECONDS * 2 + polling_ms / 1000)
    statuses = [response.status.code for response in responses if response.HasField("status")]
    assert len(statuses) == 1, responses
    messages = [response.message for response in responses if response.HasField("message")]
    if messages:
        assert responses[-1].HasField("delivery_timestamp"), responses
    return statuses[0], messages


def receive_all(node: NodeInfo, group_name: str, topic: str, expected: int, *, invisible_ms: int,
                timeout_seconds: float = 30.0) -> list[Message]:
    found: list[Message] = []
    deadline = time.monotonic() + timeout_seconds
    while len(found) < expected and time.monotonic() < deadline:
        found += receive(node, group_name, topic, invisible_ms=invisible_ms, polling_ms=1000)[1]
    assert len(found) == expected, [message.body for message in found]
    return found


def ack(node: NodeInfo, group_name: str, topic: str, message: Message, handle: str | None = None) -> int:
    entry = pb.AckMessageEntry(message_id=message.system_properties.message_id,
                               receipt_handle=handle or message.system_properties.receipt_handle)
    response = call(node, "AckMessage", pb.AckMessageRequest(group=Resource(name=group_name),
                                                             topic=Resource(name=topic), entries=[entry]),
                    pb.AckMessageResponse)
    assert isinstance(response, pb.AckMessageResponse)
    return response.status.code


# --------------------------------------------------------------------------------------------- tests


def test_sdk_simple_consumer_receives_acks_and_gets_an_unacked_message_back(group: Group, topic: str) -> None:
    group.create_topic(topic)
    leader = group.leader()
    run = sdk5.produce(leader.grpc_address, topic, [{"body": "v5-0", "tag": "TagA", "keys": ["k0"]},
                                                    {"body": "v5-1", "tag": "TagA"},
                                                    {"body": "v5-other-tag", "tag": "TagB"}])
    assert run.returncode == 0 and all(result["ok"] for result in run.results), run.describe()
    big = "v4-big-" + "x" * 6000  # our 4.x producer compresses it (zlib, sysFlag 0x1)

    async def produce_4x() -> None:
        async with AsyncProducer(ClientConfig.of(group.cluster.namesrv), ProducerConfig(group="PG_pop")) as producer:
            for body in ("v4-0", big):
                await producer.send(Message4(topic=topic, body=body.encode(), tags="TagA"))

    run_async(produce_4x())
    consumed = sdk5.consume(leader.grpc_address, topic, "GID_pop_sdk", deliveries=5, seconds=60, invisible_seconds=3,
                            await_seconds=2, tag="TagA", no_ack_first=["v5-1"])
    deliveries = [result for result in consumed.results if "body" in result]
    assert consumed.returncode == 0, consumed.describe()
    bodies = sorted(result["body"] for result in deliveries)
    assert bodies == sorted(["v5-0", "v5-1", "v5-1", "v4-0", big]), consumed.describe()
    again = [result for result in deliveries if result["body"] == "v5-1"]
    assert [result["attempt"] for result in again] == [1, 2] and [r["acked"] for r in again] == [False, True]
    assert all(result["acked"] and not result["ack_error"] for result in deliveries if result["body"] != "v5-1")
    assert next(result for result in deliveries if result["body"] == "v5-0")["keys"] == ["k0"]
    # what was acknowledged never comes back; the other tag was never delivered to this group
    code, messages = receive(leader, "GID_pop_sdk", topic, invisible_ms=5000, polling_ms=500, tag="TagA")
    assert code == Code.MESSAGE_NOT_FOUND and not messages


def test_sdk_push_consumer_gets_a_failed_message_again(group: Group, topic: str) -> None:
    group.create_topic(topic)
    leader = group.leader()
    send(leader, topic, "push-0", "push-1", "push-2")
    run = sdk5.push(leader.grpc_address, topic, "GID_pop_push", deliveries=4, seconds=90, fail_first=["push-1"])
    assert run.returncode == 0, run.describe()
    deliveries = [(result["body"], result["attempt"]) for result in run.results]
    assert sorted(deliveries) == [("push-0", 1), ("push-1", 1), ("push-1", 2), ("push-2", 1)], run.describe()
    code, rest = receive(leader, "GID_pop_push", topic, invisible_ms=5000, polling_ms=500)
    assert code == Code.MESSAGE_NOT_FOUND and not rest, [message.body for message in rest]


def test_change_invisible_issues_a_new_handle_and_old_handles_are_refused(group: Group, topic: str) -> None:
    group.create_topic(topic)
    leader = group.leader()
    send(leader, topic, "one")
    (message,) = receive_all(leader, "GID_pop_handles", topic, 1, invisible_ms=30_000)
    old = message.system_properties.receipt_handle
    assert message.system_properties.delivery_attempt == 1
    changed = call(leader, "ChangeInvisibleDuration", pb.ChangeInvisibleDurationRequest(
        group=Resource(name="GID_pop_handles"), topic=Resource(name=topic), receipt_handle=old,
        invisible_duration=Duration(seconds=60), message_id=message.system_properties.message_id),
        pb.ChangeInvisibleDurationResponse)
    assert isinstance(changed, pb.ChangeInvisibleDurationResponse) and changed.status.code == Code.OK
    assert changed.receipt_handle and changed.receipt_handle != old
    assert ack(leader, "GID_pop_handles", topic, message, old) == Code.INVALID_RECEIPT_HANDLE
    assert ack(leader, "GID_pop_handles", topic, message, "not-a-handle") == Code.INVALID_RECEIPT_HANDLE
    assert ack(leader, "GID_pop_handles", topic, message, changed.receipt_handle) == Code.OK
    assert ack(leader, "GID_pop_handles", topic, message, changed.receipt_handle) == Code.INVALID_RECEIPT_HANDLE
    assert receive(leader, "GID_pop_handles", topic, invisible_ms=5000)[0] == Code.MESSAGE_NOT_FOUND


def test_leader_failover_with_messages_in_flight(group: Group) -> None:
    """Acknowledged messages never come back; unacknowledged ones come back at their time from the new
    leader; a handle of the old leader is honoured while its entry stands, and refused once redelivered.
    On the module's group (a topic and consumer group of its own; nothing here needs a fresh group): the old
    leader is restarted and back as a member before the next test."""
    topic = "pop_failover"
    cluster = group.cluster
    group.create_topic(topic)
    old_leader = group.leader()
    send(old_leader, topic, "acked-0", "acked-1", "back-0", "honoured-0")
    received = {message.body.decode(): message
                for message in receive_all(old_leader, "GID_pop_failover", topic, 4, invisible_ms=8_000)}
    for body in ("acked-0", "acked-1"):
        assert ack(old_leader, "GID_pop_failover", topic, received[body]) == Code.OK
    cluster.kill(old_leader.id)
    def new_leader_node() -> NodeInfo | None:
        node = cluster.leader_node()
        return node if node is not None and node.id != old_leader.id else None

    new_leader = wait_for(new_leader_node, "a new leader", timeout_seconds=60.0)
    # the old leader's handle of an in-flight message is honoured by the new leader (replicated state)
    assert ack(new_leader, "GID_pop_failover", topic, received["honoured-0"]) == Code.OK
    deadline = time.monotonic() + 40.0
    again: list[Message] = []
    while time.monotonic() < deadline and not again:
        again = receive(new_leader, "GID_pop_failover", topic, invisible_ms=30_000, polling_ms=2000)[1]
    assert [message.body for message in again] == [b"back-0"]
    assert again[0].system_properties.delivery_attempt == 2
    # the old handle of the redelivered message is stale now; the new one works
    assert ack(new_leader, "GID_pop_failover", topic, received["back-0"]) == Code.INVALID_RECEIPT_HANDLE
    assert ack(new_leader, "GID_pop_failover", topic, again[0]) == Code.OK
    code, rest = receive(new_leader, "GID_pop_failover", topic, invisible_ms=5000, polling_ms=500)
    assert code == Code.MESSAGE_NOT_FOUND and not rest
    cluster.restart(old_leader.id)

    def caught_up() -> bool:
        rows = {str(row["node"]): row for row in cluster.status()}
        return rows[old_leader.id]["role"] in ("follower", "leader")

    wait_for(caught_up, "the old leader back", timeout_seconds=60.0)


def test_forward_to_dead_letter_queue_stores_it_there_once(group: Group, topic: str) -> None:
    group.create_topic(topic)
    leader = group.leader()
    send(leader, topic, "dead")
    (message,) = receive_all(leader, "GID_pop_dlq", topic, 1, invisible_ms=30_000)
    request = pb.ForwardMessageToDeadLetterQueueRequest(
        group=Resource(name="GID_pop_dlq"), topic=Resource(name=topic),
        receipt_handle=message.system_properties.receipt_handle, message_id=message.system_properties.message_id,
        delivery_attempt=1, max_delivery_attempts=1)
    forwarded = call(leader, "ForwardMessageToDeadLetterQueue", request, pb.ForwardMessageToDeadLetterQueueResponse)
    assert isinstance(forwarded, pb.ForwardMessageToDeadLetterQueueResponse) and forwarded.status.code == Code.OK
    again = call(leader, "ForwardMessageToDeadLetterQueue", request, pb.ForwardMessageToDeadLetterQueueResponse)
    assert isinstance(again, pb.ForwardMessageToDeadLetterQueueResponse)
    assert again.status.code == Code.INVALID_RECEIPT_HANDLE
    assert max_offset(leader.broker_address, "%DLQ%GID_pop_dlq", 0).ext_fields["offset"] == "1"
    assert receive(leader, "GID_pop_dlq", topic, invisible_ms=5000)[0] == Code.MESSAGE_NOT_FOUND


def test_a_follower_forwards_acks_and_answers_receives_with_a_retryable_code(group: Group, topic: str) -> None:
    group.create_topic(topic)
    leader = group.leader()
    # a follower that knows the leader (the failover test before may have just restarted one)
    follower = wait_for(lambda: next((node for node in group.cluster.info.nodes
                                      if node.id != leader.id and member_ready(node.http_address)), None),
                        "a ready follower", timeout_seconds=60.0)
    send(leader, topic, "via-follower")
    (message,) = receive_all(leader, "GID_pop_follower", topic, 1, invisible_ms=30_000)
    code, _ = receive(follower, "GID_pop_follower", topic, invisible_ms=5000)
    assert code == Code.INTERNAL_SERVER_ERROR
    assert ack(follower, "GID_pop_follower", topic, message) == Code.OK


def test_query_assignment_names_the_leader_with_queue_minus_one(group: Group, topic: str) -> None:
    group.create_topic(topic)
    leader = group.leader()
    response = call(leader, "QueryAssignment", pb.QueryAssignmentRequest(
        topic=Resource(name=topic), group=Resource(name="GID_pop_assign")), pb.QueryAssignmentResponse)
    assert isinstance(response, pb.QueryAssignmentResponse) and response.status.code == Code.OK
    (assignment,) = response.assignments
    assert assignment.message_queue.id == -1
    assert f"{assignment.message_queue.broker.endpoints.addresses[0].host}:" \
           f"{assignment.message_queue.broker.endpoints.addresses[0].port}" == leader.grpc_address
    missing = call(leader, "QueryAssignment", pb.QueryAssignmentRequest(
        topic=Resource(name=topic + "_none"), group=Resource(name="GID_pop_assign")), pb.QueryAssignmentResponse)
    assert isinstance(missing, pb.QueryAssignmentResponse) and missing.status.code == Code.TOPIC_NOT_FOUND




def raftmq_cli(cluster: LocalCluster, *arguments: str) -> Result:
    result = CliRunner().invoke(cli_main, list(arguments), env={"RAFTMQ_NAMESRV": cluster.namesrv})
    assert result.exit_code == 0, result.output
    return result


def test_a_group_configured_through_admin_dead_letters_after_its_max_attempts(group: Group, topic: str) -> None:
    """``raftmq group update --retry-max 1``: a stock 5.x SimpleConsumer that never acknowledges gets the
    message twice (max attempts = retry max + 1), then it is in %DLQ%group, readable by a 4.x pull once
    ``raftmq topic update`` made it readable; an old
    4.x client's send-back (no maxReconsumeTimes in its header) follows the same setting."""
    group.create_topic(topic)
    leader = group.leader()
    name, dead_letters = "GID_pop_max", "%DLQ%GID_pop_max"
    assert "retry max 1, broker id 0" in raftmq_cli(group.cluster, "group", "update", name, "--retry-max", "1").stdout
    # each update changes only what it is given
    assert "retry max 1, broker id 0, orderly" in raftmq_cli(group.cluster, "group", "update", name, "--orderly").stdout
    unordered = raftmq_cli(group.cluster, "group", "update", name, "--no-orderly").stdout
    assert "retry max 1" in unordered and "orderly" not in unordered
    # a follower forwards the change to the leader (as mqadmin updateSubGroup sends it, the whole config)
    follower = next(node for node in group.cluster.info.nodes if node.id != leader.id)
    config = json.dumps({"groupName": name, "retryMaxTimes": 1, "consumeMessageOrderly": False}).encode()
    code, _, _ = wire.call(follower.broker_address, RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, {}, config)
    assert code == ResponseCode.SUCCESS
    produced = sdk5.produce(leader.grpc_address, topic, [{"body": "poison", "tag": "TagA"}, {"body": "fine", "tag": "TagA"}])
    assert produced.returncode == 0 and all(result["ok"] for result in produced.results), produced.describe()
    consumed = sdk5.consume(leader.grpc_address, topic, name, deliveries=3, seconds=60, invisible_seconds=2,
                            await_seconds=2, never_ack=["poison"])
    assert consumed.returncode == 0, consumed.describe()
    deliveries = [(result["body"], result["attempt"], result["acked"]) for result in consumed.results if "body" in result]
    assert sorted(deliveries) == [("fine", 1, True), ("poison", 1, False), ("poison", 2, False)], consumed.describe()
    wait_for(lambda: max_offset(leader.broker_address, dead_letters, 0).ext_fields.get("offset") == "1",
             "the dead letter after the second delivery's invisible time",
             timeout_seconds=30.0)
    # write-only as the broker creates it (RocketMQ's PERM_WRITE): made readable as an operator does
    assert "perm rw" in raftmq_cli(group.cluster, "topic", "update", dead_letters, "--perm", "rw").stdout
    code, fields, pulled = wire.pull(leader.broker_address, dead_letters, 0, 0)
    assert code == ResponseCode.SUCCESS and len(pulled) == 1, (code, fields)
    (dead,) = pulled
    assert code == ResponseCode.SUCCESS and dead.body == b"poison"
    assert dead.property_map["DLQ_ORIGIN_TOPIC"] == topic and dead.reconsume_times == 2
    code, rest = receive(leader, name, topic, invisible_ms=5000, polling_ms=500)
    assert code == Code.MESSAGE_NOT_FOUND and not rest
    # 4.x send-back: below the group's retry max to %RETRY%, at it to the dead-letter queue
    fine = next(message for queue_id in range(QUEUES)
                for message in wire.pull(leader.broker_address, topic, queue_id, 0)[2] if message.body == b"fine")
    back = {"offset": str(fine.physical_offset), "group": name, "delayLevel": "1", "originMsgId": fine.msg_id,
            "originTopic": topic, "unitMode": "false"}
    assert wire.call(leader.broker_address, RequestCode.CONSUMER_SEND_MSG_BACK, back)[0] == ResponseCode.SUCCESS
    wait_for(lambda: max_offset(leader.broker_address, f"%RETRY%{name}", 0).ext_fields.get("offset") == "1",
             "the retry after its 1 s delay",
             timeout_seconds=30.0)
    (retried,) = wire.pull(leader.broker_address, f"%RETRY%{name}", 0, 0)[2]
    back["offset"] = str(retried.physical_offset)
    assert wire.call(leader.broker_address, RequestCode.CONSUMER_SEND_MSG_BACK, back)[0] == ResponseCode.SUCCESS
    wait_for(lambda: max_offset(leader.broker_address, dead_letters, 0).ext_fields.get("offset") == "2",
             "the 4.x dead letter",
             timeout_seconds=30.0)
    # consume disabled: both protocols refuse the group
    disabled = raftmq_cli(group.cluster, "group", "update", name, "--no-consume-enable").stdout
    assert "retry max 1" in disabled and "consume disabled" in disabled
    assert wire.pull(leader.broker_address, topic, 0, 0, group=name)[0] == ResponseCode.NO_PERMISSION
    assert receive(leader, name, topic, invisible_ms=5000)[0] == Code.FORBIDDEN
    # deleted: the group consumes with the broker's defaults again
    assert f"group {name} deleted" in raftmq_cli(group.cluster, "group", "delete", name).stdout
    listed = json.loads(wire.call(leader.broker_address, RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG)[2])
    entry = listed["subscriptionGroupTable"].get(name)  # listed while it has committed offsets
    assert entry is None or entry["retryMaxTimes"] == 16
