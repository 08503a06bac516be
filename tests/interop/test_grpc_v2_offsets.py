"""The 5.x offset RPCs (PullMessage, UpdateOffset, GetOffset, QueryOffset: broker.v2.pull) against a three-node
raftmq group, driven with our generated stubs in this process: the stock Python SDK 5.1.2 has no pull consumer.

An offset committed through any member's gRPC endpoint reaches the leader, goes through Raft like a 4.x
UPDATE_CONSUMER_OFFSET, and is then what every member answers, in both protocols. One group for the module,
a topic of its own (one queue, so every message lands on queue 0) per test.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final

import grpc
import pytest
from google.protobuf.message import Message as ProtobufMessage

from broker.v2.protocol import service_pb2 as pb
from broker.v2.protocol.definition_pb2 import (
    Code,
    FilterExpression,
    FilterType,
    Message,
    MessageQueue,
    QueryOffsetPolicy,
    Resource,
)
from broker.v2.server import SERVICE_NAME
from cli.cluster import LocalCluster, NodeInfo
from protocol.codes import ResponseCode
from tests.interop.harness import consumer_offset, create_topic, run_async
from tests.support.stores import small_store
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow

CALL_TIMEOUT_SECONDS: Final = 10.0
#: what a pull may wait for a message in the long-polling test (it must come back long before)
POLLING_SECONDS: Final = 8
GROUP: Final = "GID_offsets"


@dataclass(frozen=True)
class Group:
    cluster: LocalCluster

    def leader(self) -> NodeInfo:
        return wait_for(self.cluster.leader_node, "a leader", timeout_seconds=30.0)

    def followers(self) -> list[NodeInfo]:
        leader = self.leader()
        return [node for node in self.cluster.info.nodes if node.id != leader.id]

    def create_topic(self, topic: str) -> None:
        def created() -> bool:
            return create_topic(self.leader().broker_address, topic, 1).code == ResponseCode.SUCCESS

        wait_for(created, f"the leader to create topic {topic}", timeout_seconds=30.0)


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Group]:
    with LocalCluster.start(tmp_path_factory.mktemp("offsets-group"), nodes=3, overrides=small_store()) as cluster:
        yield Group(cluster)


@pytest.fixture
def topic(request: pytest.FixtureRequest) -> str:
    return "offsets_" + re.sub(r"[^A-Za-z0-9_-]+", "_", request.node.name.removeprefix("test_")).strip("_")[:100]


# --------------------------------------------------------------------------------------------- stubs


def _serialize(message: object) -> bytes:
    assert isinstance(message, ProtobufMessage)
    return message.SerializeToString()


async def unary(node: NodeInfo, method: str, request: object, response_type: type[object]) -> object:
    async with grpc.aio.insecure_channel(node.grpc_address) as channel:
        stub: grpc.aio.UnaryUnaryMultiCallable[object, object] = channel.unary_unary(
            f"/{SERVICE_NAME}/{method}", request_serializer=_serialize,
            response_deserializer=response_type.FromString)  # type: ignore[attr-defined]
        return await stub(request, metadata=(("x-mq-client-id", "raftmq-offsets-test"),), timeout=CALL_TIMEOUT_SECONDS)


def call(node: NodeInfo, method: str, request: object, response_type: type[object]) -> object:
    return run_async(unary(node, method, request, response_type))


def queue(topic: str, queue_id: int = 0) -> MessageQueue:
    return MessageQueue(topic=Resource(name=topic), id=queue_id)


def send(node: NodeInfo, topic: str, *tagged_bodies: tuple[str, str]) -> None:
    """(tag, body) each, one per request, in order."""
    for index, (tag, body) in enumerate(tagged_bodies):
        message = Message(topic=Resource(name=topic), body=body.encode())
        message.system_properties.message_id = f"0102FC000000013FAF0B1A149D{time.time_ns() % 10**8:08X}{index:02X}"
        message.system_properties.tag = tag
        response = call(node, "SendMessage", pb.SendMessageRequest(messages=[message]), pb.SendMessageResponse)
        assert isinstance(response, pb.SendMessageResponse) and response.status.code == Code.OK, response


def pull_request(topic: str, offset: int, *, tag: str = "*", batch: int = 32, polling_seconds: int = 0,
                 queue_id: int = 0, group: str = GROUP, filter_type: int = FilterType.TAG) -> pb.PullMessageRequest:
    request = pb.PullMessageRequest(group=Resource(name=group), message_queue=queue(topic, queue_id), offset=offset,
                                    batch_size=batch,
                                    filter_expression=FilterExpression(type=filter_type, expression=tag))  # type: ignore[arg-type]
    request.long_polling_timeout.seconds = polling_seconds
    return request


@dataclass(frozen=True)
class Pulled:
    code: int
    messages: list[Message]
    next_offset: int | None

    @property
    def bodies(self) -> list[str]:
        return [message.body.decode() for message in self.messages]


async def pull_async(node: NodeInfo, request: pb.PullMessageRequest) -> Pulled:
    async with grpc.aio.insecure_channel(node.grpc_address) as channel:
        stream = channel.unary_stream(f"/{SERVICE_NAME}/PullMessage", request_serializer=_serialize,
                                      response_deserializer=pb.PullMessageResponse.FromString)
        timeout = CALL_TIMEOUT_SECONDS + request.long_polling_timeout.seconds
        responses = [response async for response in stream(request, timeout=timeout)]
    kinds = [response.WhichOneof("content") for response in responses]
    # a status first, then the messages, then the next offset (none after a refusal)
    assert kinds[0] == "status" and "status" not in kinds[1:], kinds
    if kinds[-1] != "next_offset":
        assert kinds == ["status"], kinds
        return Pulled(responses[0].status.code, [], None)
    assert set(kinds[1:-1]) <= {"message"}, kinds
    return Pulled(responses[0].status.code, [response.message for response in responses[1:-1]],
                  responses[-1].next_offset)


def pull(node: NodeInfo, request: pb.PullMessageRequest) -> Pulled:
    return run_async(pull_async(node, request), CALL_TIMEOUT_SECONDS * 2 + request.long_polling_timeout.seconds)


def query_offset(node: NodeInfo, topic: str, policy: int, timestamp_ms: int | None = None) -> pb.QueryOffsetResponse:
    request = pb.QueryOffsetRequest(message_queue=queue(topic), query_offset_policy=policy)  # type: ignore[arg-type]
    if timestamp_ms is not None:
        request.timestamp.seconds, millis = divmod(timestamp_ms, 1000)
        request.timestamp.nanos = millis * 1_000_000
    response = call(node, "QueryOffset", request, pb.QueryOffsetResponse)
    assert isinstance(response, pb.QueryOffsetResponse)
    return response


def update_offset(node: NodeInfo, topic: str, offset: int, *, queue_id: int = 0,
                  group: str = GROUP) -> pb.UpdateOffsetResponse:
    request = pb.UpdateOffsetRequest(group=Resource(name=group), message_queue=queue(topic, queue_id), offset=offset)
    response = call(node, "UpdateOffset", request, pb.UpdateOffsetResponse)
    assert isinstance(response, pb.UpdateOffsetResponse)
    return response


def get_offset(node: NodeInfo, topic: str, *, queue_id: int = 0, group: str = GROUP) -> pb.GetOffsetResponse:
    request = pb.GetOffsetRequest(group=Resource(name=group), message_queue=queue(topic, queue_id))
    response = call(node, "GetOffset", request, pb.GetOffsetResponse)
    assert isinstance(response, pb.GetOffsetResponse)
    return response


def end_offset(node: NodeInfo, topic: str) -> int:
    answer = query_offset(node, topic, QueryOffsetPolicy.END)
    assert answer.status.code == Code.OK, answer
    return answer.offset


# ----------------------------------------------------------------------------------------------- tests


def test_pull_from_an_offset_with_and_without_tags(group: Group, topic: str) -> None:
    group.create_topic(topic)
    leader = group.leader()
    send(leader, topic, ("TagA", "a-0"), ("TagB", "b-1"), ("TagA", "a-2"), ("TagC", "c-3"))
    everything = pull(leader, pull_request(topic, 0))
    assert (everything.code, everything.bodies, everything.next_offset) == (Code.OK, ["a-0", "b-1", "a-2", "c-3"], 4)
    assert [message.system_properties.queue_offset for message in everything.messages] == [0, 1, 2, 3]
    assert [message.system_properties.tag for message in everything.messages] == ["TagA", "TagB", "TagA", "TagC"]
    tagged = pull(leader, pull_request(topic, 1, tag="TagA"))
    assert (tagged.code, tagged.bodies, tagged.next_offset) == (Code.OK, ["a-2"], 4)
    batch = pull(leader, pull_request(topic, 0, batch=2))
    assert (batch.bodies, batch.next_offset) == (["a-0", "b-1"], 2)
    none = pull(leader, pull_request(topic, 0, tag="TagZ"))
    assert (none.code, none.messages, none.next_offset) == (Code.MESSAGE_NOT_FOUND, [], 4)
    # every member serves pulls of what it applied
    for follower in group.followers():
        def applied(node: NodeInfo = follower) -> Pulled | None:
            pulled = pull(node, pull_request(topic, 0, tag="TagB || TagC", polling_seconds=1))
            return pulled if pulled.code == Code.OK and len(pulled.messages) == 2 else None

        assert wait_for(applied, f"{follower.id} to serve the pull",
                        timeout_seconds=30.0).bodies == ["b-1", "c-3"]


def test_long_polling_pull_returns_when_a_message_arrives(group: Group, topic: str) -> None:
    group.create_topic(topic)
    leader = group.leader()
    send(leader, topic, ("TagA", "before"))
    offset = end_offset(leader, topic)

    async def park_then_send() -> tuple[Pulled, float]:
        started = time.monotonic()
        waiting = asyncio.ensure_future(pull_async(leader, pull_request(topic, offset, tag="TagB",
                                                                        polling_seconds=POLLING_SECONDS)))
        # not waiting for a condition: the pull gets the time to park on the empty end of the queue first
        await asyncio.sleep(0.5)
        assert not waiting.done(), waiting.result()
        await asyncio.to_thread(send, leader, topic, ("TagA", "other-tag"), ("TagB", "arrived"))
        return await waiting, time.monotonic() - started

    pulled, seconds = run_async(park_then_send(), CALL_TIMEOUT_SECONDS * 3)
    assert (pulled.code, pulled.bodies, pulled.next_offset) == (Code.OK, ["arrived"], offset + 2)
    assert seconds < POLLING_SECONDS, seconds
    # with nothing arriving: MESSAGE_NOT_FOUND at the end of the polling time, to continue from the same offset
    started = time.monotonic()
    idle = pull(leader, pull_request(topic, offset + 2, polling_seconds=1))
    assert (idle.code, idle.messages, idle.next_offset) == (Code.MESSAGE_NOT_FOUND, [], offset + 2)
    assert time.monotonic() - started >= 0.9


def test_update_offset_through_a_follower_reaches_the_leader_and_every_member(group: Group, topic: str) -> None:
    group.create_topic(topic)
    leader = group.leader()
    send(leader, topic, ("TagA", "m-0"), ("TagA", "m-1"), ("TagA", "m-2"))
    assert get_offset(leader, topic).status.code == Code.OFFSET_NOT_FOUND
    assert update_offset(leader, topic, 1).status.code == Code.OK
    answer = get_offset(leader, topic)  # answered once applied on the leader
    assert (answer.status.code, answer.offset) == (Code.OK, 1)
    follower = group.followers()[0]
    assert update_offset(follower, topic, 2).status.code == Code.OK  # forwarded to the leader
    assert get_offset(leader, topic).offset == 2
    for node in group.cluster.info.nodes:
        def committed(member: NodeInfo = node) -> bool:
            answer = get_offset(member, topic)
            return answer.status.code == Code.OK and answer.offset == 2

        wait_for(committed, f"the offset on {node.id}", timeout_seconds=30.0)
    # the same replicated offset as the 4.x protocol's
    assert consumer_offset(leader.broker_address, GROUP, topic, 0).ext_fields["offset"] == "2"
    # a bad update through the follower is answered by the leader, and changes nothing
    assert update_offset(follower, topic, 99).status.code == Code.ILLEGAL_OFFSET
    assert get_offset(leader, topic).offset == 2


def test_query_offset_policies(group: Group, topic: str) -> None:
    group.create_topic(topic)
    leader = group.leader()
    assert (query_offset(leader, topic, QueryOffsetPolicy.END).offset,
            query_offset(leader, topic, QueryOffsetPolicy.BEGINNING).offset) == (0, 0)
    send(leader, topic, ("TagA", "t-0"))
    send(leader, topic, ("TagA", "t-1"))
    stored = pull(leader, pull_request(topic, 0)).messages
    assert len(stored) == 2
    first_ms, second_ms = (message.system_properties.store_timestamp.ToMilliseconds() for message in stored)
    begin = query_offset(leader, topic, QueryOffsetPolicy.BEGINNING)
    end = query_offset(leader, topic, QueryOffsetPolicy.END)
    assert (begin.status.code, begin.offset, end.status.code, end.offset) == (Code.OK, 0, Code.OK, 2)
    assert query_offset(leader, topic, QueryOffsetPolicy.TIMESTAMP, first_ms).offset == 0
    assert query_offset(leader, topic, QueryOffsetPolicy.TIMESTAMP, second_ms).offset == (1 if second_ms > first_ms
                                                                                          else 0)
    assert query_offset(leader, topic, QueryOffsetPolicy.TIMESTAMP, second_ms + 1).offset == 2
    assert query_offset(leader, topic, QueryOffsetPolicy.TIMESTAMP, 0).offset == 0
    missing = query_offset(leader, topic, QueryOffsetPolicy.TIMESTAMP)
    assert missing.status.code == Code.BAD_REQUEST
    for follower in group.followers():  # every member answers from its own store
        def caught_up(node: NodeInfo = follower) -> bool:
            return end_offset(node, topic) == 2

        wait_for(caught_up, f"{follower.id}'s end offset", timeout_seconds=30.0)


def test_offset_rpcs_with_bad_input_get_the_protocols_codes(group: Group, topic: str) -> None:
    group.create_topic(topic)
    leader = group.leader()
    follower = group.followers()[0]
    send(leader, topic, ("TagA", "only"))
    unknown = topic + "_none"
    pulls = [
        (pb.PullMessageRequest(), Code.ILLEGAL_TOPIC),
        (pull_request(topic, 0, group=""), Code.ILLEGAL_CONSUMER_GROUP),
        (pull_request(unknown, 0), Code.TOPIC_NOT_FOUND),
        (pull_request(topic, 0, queue_id=1), Code.BAD_REQUEST),
        (pull_request(topic, 0, queue_id=-1), Code.BAD_REQUEST),
        (pull_request(topic, -5), Code.ILLEGAL_OFFSET),
        (pull_request(topic, 0, batch=0), Code.BAD_REQUEST),
        (pull_request(topic, 0, tag="a > 1", filter_type=FilterType.SQL), Code.NOT_IMPLEMENTED),
    ]
    for request, expected in pulls:
        for node in (leader, follower):
            pulled = pull(node, request)
            assert (pulled.code, pulled.messages, pulled.next_offset) == (expected, [], None), (node.id, request)
    # past the end: where to continue (as RocketMQ moves it: the queue's start while that is 0, else its end)
    moved = pull(leader, pull_request(topic, 7))
    assert (moved.code, moved.next_offset) == (Code.ILLEGAL_OFFSET, 0)
    for node in (leader, follower):
        assert update_offset(node, topic, -1).status.code == Code.ILLEGAL_OFFSET
        assert update_offset(node, topic, 0, queue_id=3).status.code == Code.BAD_REQUEST
        assert update_offset(node, unknown, 0).status.code == Code.TOPIC_NOT_FOUND
        assert update_offset(node, topic, 0, group="no group").status.code == Code.ILLEGAL_CONSUMER_GROUP
        empty = call(node, "UpdateOffset", pb.UpdateOffsetRequest(), pb.UpdateOffsetResponse)
        assert isinstance(empty, pb.UpdateOffsetResponse) and empty.status.code == Code.ILLEGAL_TOPIC
        assert get_offset(node, unknown).status.code == Code.TOPIC_NOT_FOUND
        assert get_offset(node, topic, queue_id=9).status.code == Code.BAD_REQUEST
        assert get_offset(node, topic, group="").status.code == Code.ILLEGAL_CONSUMER_GROUP
        assert get_offset(node, topic).status.code == Code.OFFSET_NOT_FOUND  # nothing was committed
        assert query_offset(node, unknown, QueryOffsetPolicy.END).status.code == Code.TOPIC_NOT_FOUND
        assert query_offset(node, topic, 5).status.code == Code.BAD_REQUEST
        empty_query = call(node, "QueryOffset", pb.QueryOffsetRequest(), pb.QueryOffsetResponse)
        assert isinstance(empty_query, pb.QueryOffsetResponse) and empty_query.status.code == Code.ILLEGAL_TOPIC
    assert consumer_offset(leader.broker_address, GROUP, topic, 0).ext_fields.get("offset") in (None, "0")

