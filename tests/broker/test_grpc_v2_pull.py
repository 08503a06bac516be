"""The 5.x offset RPCs (broker.v2.pull: PullMessage, UpdateOffset, GetOffset, QueryOffset) against a real store
and apply, without Raft or gRPC: proposals apply at once at the next index, pulls wait on the same
``PullWaiters`` the 4.x path uses (notified here by the test, as the node notifies it after applies)."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Final, TypeVar

import pytest

from broker.acl.authorizer import AclRules
from broker.acl.config import AclConfig
from broker.config import BrokerConfig
from broker.offsets import OffsetCommitter
from broker.pull import PullWaiters
from broker.v2.auth import Authenticator
from broker.v2.consumer import tag_filter
from broker.v2.protocol.definition_pb2 import (
    Code,
    FilterExpression,
    FilterType,
    MessageQueue,
    QueryOffsetPolicy,
    Resource,
)
from broker.v2.protocol.service_pb2 import (
    GetOffsetRequest,
    PullMessageRequest,
    PullMessageResponse,
    QueryOffsetRequest,
    UpdateOffsetRequest,
)
from broker.v2.pull import PullService
from broker.v2.service import CallInfo
from broker.v2.status import StatusError
from commitlog.message import MessageInput
from commitlog.store import MessageStore
from dledger.apply import ApplyResult, StateMachine
from dledger.command import Command, Messages, SubscriptionGroup, TopicConfig, encode_command
from dledger.state import ReplicatedState
from protocol.route_data import PERM_READ, PERM_WRITE
from tests.commitlog.helpers import message, small_config

TOPIC: Final = "TopicTest"
GROUP: Final = "GID_pull"
CALL: Final = CallInfo({}, "127.0.0.1", 40000)
#: a pull that must not wait long: the test fails well before this if long polling never returns
POLLING_MS: Final = 20_000

Result = TypeVar("Result")


class FakeMember:
    is_leader = True


class FakeBroker:
    """What PullService and OffsetCommitter use of BrokerContext: proposals apply here at once."""

    def __init__(self, directory: Path) -> None:
        self.state = ReplicatedState()
        self.store = MessageStore(small_config(directory), extension_provider=lambda: self.state.encode())
        self.machine = StateMachine(self.store, self.state)
        self.config = BrokerConfig(listen_address="127.0.0.1:10911")
        self.member = FakeMember()
        self.index = 0
        self.barriers = 0
        self.waiters = PullWaiters(self.store.max_queue_offset)
        self.apply(Command((TopicConfig(TOPIC, 2, 2, PERM_READ | PERM_WRITE),)))

    def apply(self, command: Command) -> ApplyResult:
        self.index += 1
        result = self.machine.apply(self.index, encode_command(command))
        self.waiters.notify()  # as the node does after every apply
        return result

    def send(self, messages: Sequence[MessageInput]) -> None:
        self.apply(Command((Messages(tuple(messages)),)))

    def require_leader(self) -> None:
        pass

    async def propose(self, command: Command) -> ApplyResult:
        return self.apply(command)

    async def barrier(self) -> None:
        self.barriers += 1

    def topic_config(self, topic: str) -> TopicConfig | None:
        return self.state.topics.get(topic)


@pytest.fixture
def broker(tmp_path: Path) -> FakeBroker:
    broker = FakeBroker(tmp_path / "store")
    # queue 0: offsets 0 TagA, 1 TagB, 2 TagA (store timestamps 1_700_000_100_010 + 10 each)
    broker.send([message(1, tags="TagA"), message(2, tags="TagB"), message(3, tags="TagA")])
    return broker


def with_service(broker: FakeBroker, body: Callable[[PullService], Awaitable[Result]],
                 authenticator: Authenticator | None = None) -> Result:
    """Run ``body`` against a PullService whose offset committer runs for the duration."""

    async def run() -> Result:
        offsets = OffsetCommitter(broker)  # type: ignore[arg-type]
        offsets.start()
        service = PullService(broker, offsets, broker.waiters, authenticator or Authenticator(None))  # type: ignore[arg-type]
        try:
            return await body(service)
        finally:
            await offsets.stop()

    return asyncio.run(run())


def queue(queue_id: int = 0, topic: str = TOPIC) -> MessageQueue:
    return MessageQueue(topic=Resource(name=topic), id=queue_id)


def pull_request(offset: int, *, tag: str = "*", batch: int = 8, polling_ms: int = 0, queue_id: int = 0,
                 group: str = GROUP, topic: str = TOPIC, filter_type: int = FilterType.TAG) -> PullMessageRequest:
    request = PullMessageRequest(group=Resource(name=group), message_queue=queue(queue_id, topic), offset=offset,
                                 batch_size=batch,
                                 filter_expression=FilterExpression(type=filter_type, expression=tag))  # type: ignore[arg-type]
    request.long_polling_timeout.seconds, request.long_polling_timeout.nanos = divmod(polling_ms, 1000)
    request.long_polling_timeout.nanos *= 1_000_000
    return request


async def pull(service: PullService, request: PullMessageRequest,
               call: CallInfo = CALL) -> tuple[int, list[bytes], int | None]:
    """(status code, bodies, next offset or None) of one pull's stream, checked for its shape: a status
    first, then messages, then the next offset (none after a refusal)."""
    responses: list[PullMessageResponse] = [response async for response in service.pull(request, call, None)]
    kinds = [response.WhichOneof("content") for response in responses]
    assert kinds[0] == "status" and "status" not in kinds[1:], kinds
    if kinds[-1] == "next_offset":
        assert set(kinds[1:-1]) <= {"message"}, kinds
        return responses[0].status.code, [r.message.body for r in responses[1:-1]], responses[-1].next_offset
    assert kinds == ["status"], kinds
    return responses[0].status.code, [], None


def body(number: int) -> bytes:
    return f"body-{number}-".encode() * 20


# ------------------------------------------------------------------------------------------ PullMessage


def test_pull_from_an_offset_with_and_without_tags(broker: FakeBroker) -> None:
    async def scenario(service: PullService) -> None:
        assert await pull(service, pull_request(0)) == (Code.OK, [body(1), body(2), body(3)], 3)
        assert await pull(service, pull_request(1, batch=1)) == (Code.OK, [body(2)], 2)
        assert await pull(service, pull_request(0, tag="TagA")) == (Code.OK, [body(1), body(3)], 3)
        assert await pull(service, pull_request(0, tag="TagB || TagC")) == (Code.OK, [body(2)], 3)
        # nothing of the tag: not found, and the next offset skips what was read
        assert await pull(service, pull_request(0, tag="TagC")) == (Code.MESSAGE_NOT_FOUND, [], 3)
        # at the end: nothing new, continue from there
        assert await pull(service, pull_request(3)) == (Code.MESSAGE_NOT_FOUND, [], 3)
        # an empty queue at offset 0
        assert await pull(service, pull_request(0, queue_id=1)) == (Code.MESSAGE_NOT_FOUND, [], 0)

    with_service(broker, scenario)


def test_pulled_messages_carry_their_queue_offset_tag_and_attempt(broker: FakeBroker) -> None:
    async def scenario(service: PullService) -> None:
        responses = [response async for response in service.pull(pull_request(1, batch=1), CALL, None)]
        (message,) = [response.message for response in responses if response.HasField("message")]
        system = message.system_properties
        assert (system.queue_id, system.queue_offset, system.tag, system.delivery_attempt) == (0, 1, "TagB", 1)
        assert system.message_id == f"C0A8000A9CB3{2:020X}" and not system.receipt_handle
        assert message.topic.name == TOPIC

    with_service(broker, scenario)


def test_long_polling_returns_when_a_message_arrives(broker: FakeBroker) -> None:
    async def scenario(service: PullService) -> None:
        loop = asyncio.get_running_loop()
        for tag, sent in (("*", [message(4, tags="TagB")]), ("TagC", [message(5, tags="TagB"), message(6, tags="TagC")])):
            offset = broker.store.max_queue_offset(TOPIC, 0)
            started = loop.time()
            waiting = asyncio.ensure_future(pull(service, pull_request(offset, tag=tag, polling_ms=POLLING_MS)))
            while broker.waiters.held == 0:  # the pull is parked until the queue grows
                assert not waiting.done(), waiting.result()
                await asyncio.sleep(0)
            for each in sent:  # one apply each: the TagB one wakes the TagC pull, which parks again
                broker.send([each])
            code, bodies, next_offset = await asyncio.wait_for(waiting, POLLING_MS / 1000)
            assert (code, bodies[-1:]) == (Code.OK, [sent[-1].body]), (tag, code, bodies)
            assert next_offset == offset + len(sent) and loop.time() - started < POLLING_MS / 2000

    with_service(broker, scenario)


def test_long_polling_ends_with_not_found_at_its_timeout(broker: FakeBroker) -> None:
    async def scenario(service: PullService) -> None:
        assert await pull(service, pull_request(3, polling_ms=50)) == (Code.MESSAGE_NOT_FOUND, [], 3)
        assert broker.waiters.held == 0

    with_service(broker, scenario)


def test_offsets_outside_the_queue(broker: FakeBroker) -> None:
    async def scenario(service: PullService) -> None:
        # past the end, on the leader: ILLEGAL_OFFSET once it made sure it is not behind, with where to go
        assert await pull(service, pull_request(7)) == (Code.ILLEGAL_OFFSET, [], 0)
        assert broker.barriers == 1
        assert await pull(service, pull_request(5, queue_id=1)) == (Code.ILLEGAL_OFFSET, [], 0)
        assert await pull(service, pull_request(-1)) == (Code.ILLEGAL_OFFSET, [], None)
        # a follower may lag: it never moves a consumer, it answers at the requested offset
        broker.member.is_leader = False
        assert await pull(service, pull_request(7, polling_ms=30)) == (Code.MESSAGE_NOT_FOUND, [], 7)
        assert await pull(service, pull_request(1, batch=1)) == (Code.OK, [body(2)], 2)  # it serves reads

    with_service(broker, scenario)


def test_pull_bad_input_gets_the_protocols_codes(broker: FakeBroker) -> None:
    negative_polling = pull_request(0)
    negative_polling.long_polling_timeout.seconds = -1
    unknown_type = pull_request(0, filter_type=9)
    cases = [
        (PullMessageRequest(), Code.ILLEGAL_TOPIC),  # nothing set
        (pull_request(0, group=""), Code.ILLEGAL_CONSUMER_GROUP),
        (pull_request(0, group="bad group"), Code.ILLEGAL_CONSUMER_GROUP),
        (pull_request(0, topic="NoSuchTopic"), Code.TOPIC_NOT_FOUND),
        (pull_request(0, topic="%RETRY%x"), Code.ILLEGAL_TOPIC),
        (pull_request(0, queue_id=2), Code.BAD_REQUEST),
        (pull_request(0, queue_id=-1), Code.BAD_REQUEST),
        (pull_request(0, batch=0), Code.BAD_REQUEST),
        (pull_request(0, tag="a = 1", filter_type=FilterType.SQL), Code.NOT_IMPLEMENTED),
        (unknown_type, Code.ILLEGAL_FILTER_EXPRESSION),
        (pull_request(0, tag="Tag\x00A"), Code.ILLEGAL_FILTER_EXPRESSION),
        (negative_polling, Code.ILLEGAL_POLLING_TIME),
    ]

    async def scenario(service: PullService) -> None:
        for request, expected in cases:
            assert await pull(service, request) == (expected, [], None), request

    with_service(broker, scenario)


def test_a_group_with_consumption_disabled_cannot_pull(broker: FakeBroker) -> None:
    broker.apply(Command((SubscriptionGroup(GROUP, consume_enable=False),)))

    async def scenario(service: PullService) -> None:
        assert await pull(service, pull_request(0)) == (Code.FORBIDDEN, [], None)

    with_service(broker, scenario)


def test_tag_filter_reads_expressions_as_the_4x_path() -> None:
    assert tag_filter(FilterExpression(expression="*")).tags is None
    assert tag_filter(FilterExpression(expression="  ")).tags is None
    both = tag_filter(FilterExpression(type=FilterType.TAG, expression=" TagA ||TagB|| "))
    assert both.tags == frozenset({"TagA", "TagB"}) and both.accepts("TagB") and not both.accepts("TagC")
    assert not both.accepts(None)
    with pytest.raises(StatusError) as refused:
        tag_filter(FilterExpression(type=FilterType.SQL, expression="a > 1"))
    assert refused.value.code == Code.NOT_IMPLEMENTED


# ------------------------------------------------------------------------------------------ offsets


def test_update_then_get_offset(broker: FakeBroker) -> None:
    async def scenario(service: PullService) -> None:
        get = GetOffsetRequest(group=Resource(name=GROUP), message_queue=queue())
        assert (await service.get_offset(get, CALL)).status.code == Code.OFFSET_NOT_FOUND
        update = UpdateOffsetRequest(group=Resource(name=GROUP), message_queue=queue(), offset=2)
        assert (await service.update_offset(update, CALL)).status.code == Code.OK
        assert broker.state.consumer_offset(GROUP, TOPIC, 0) == 2  # replicated state, as 4.x commits it
        answer = await service.get_offset(get, CALL)
        assert (answer.status.code, answer.offset) == (Code.OK, 2)
        update.offset = 3  # the queue's end is a valid position
        assert (await service.update_offset(update, CALL)).status.code == Code.OK
        assert (await service.get_offset(get, CALL)).offset == 3
        other = GetOffsetRequest(group=Resource(name="GID_other"), message_queue=queue())
        assert (await service.get_offset(other, CALL)).status.code == Code.OFFSET_NOT_FOUND

    with_service(broker, scenario)


def test_offset_bad_input_gets_the_protocols_codes(broker: FakeBroker) -> None:
    def update(offset: int = 1, queue_id: int = 0, group: str = GROUP, topic: str = TOPIC) -> UpdateOffsetRequest:
        return UpdateOffsetRequest(group=Resource(name=group), message_queue=queue(queue_id, topic), offset=offset)

    def get(queue_id: int = 0, group: str = GROUP, topic: str = TOPIC) -> GetOffsetRequest:
        return GetOffsetRequest(group=Resource(name=group), message_queue=queue(queue_id, topic))

    updates = [(UpdateOffsetRequest(), Code.ILLEGAL_TOPIC), (update(group=""), Code.ILLEGAL_CONSUMER_GROUP),
               (update(topic="NoSuchTopic"), Code.TOPIC_NOT_FOUND), (update(queue_id=2), Code.BAD_REQUEST),
               (update(offset=-1), Code.ILLEGAL_OFFSET), (update(offset=4), Code.ILLEGAL_OFFSET)]
    gets = [(GetOffsetRequest(), Code.ILLEGAL_TOPIC), (get(group=""), Code.ILLEGAL_CONSUMER_GROUP),
            (get(topic="NoSuchTopic"), Code.TOPIC_NOT_FOUND), (get(queue_id=-3), Code.BAD_REQUEST)]

    async def scenario(service: PullService) -> None:
        for request, expected in updates:
            assert (await service.update_offset(request, CALL)).status.code == expected, request
        for get_request, expected in gets:
            assert (await service.get_offset(get_request, CALL)).status.code == expected, get_request
        assert broker.state.consumer_offsets == {}  # nothing was committed

    with_service(broker, scenario)
    assert broker.barriers == 1  # the offset past the end was refused only after the barrier


def test_query_offset_policies(broker: FakeBroker) -> None:
    def query(policy: int, timestamp_ms: int | None = None, queue_id: int = 0,
              topic: str = TOPIC) -> QueryOffsetRequest:
        request = QueryOffsetRequest(message_queue=queue(queue_id, topic), query_offset_policy=policy)  # type: ignore[arg-type]
        if timestamp_ms is not None:
            request.timestamp.seconds, millis = divmod(timestamp_ms, 1000)
            request.timestamp.nanos = millis * 1_000_000
        return request

    second_stored_at = 1_700_000_100_000 + 2 * 10
    answers = [
        (query(QueryOffsetPolicy.BEGINNING), Code.OK, 0),
        (query(QueryOffsetPolicy.END), Code.OK, 3),
        (query(QueryOffsetPolicy.END, queue_id=1), Code.OK, 0),
        (query(QueryOffsetPolicy.TIMESTAMP, second_stored_at), Code.OK, 1),
        (query(QueryOffsetPolicy.TIMESTAMP, second_stored_at + 1), Code.OK, 2),
        (query(QueryOffsetPolicy.TIMESTAMP, 0), Code.OK, 0),
        (query(QueryOffsetPolicy.TIMESTAMP, second_stored_at + 60_000), Code.OK, 3),
        (query(QueryOffsetPolicy.TIMESTAMP), Code.BAD_REQUEST, 0),  # no timestamp
        (query(7), Code.BAD_REQUEST, 0),
        (query(QueryOffsetPolicy.END, topic="NoSuchTopic"), Code.TOPIC_NOT_FOUND, 0),
        (query(QueryOffsetPolicy.END, queue_id=2), Code.BAD_REQUEST, 0),
        (QueryOffsetRequest(), Code.ILLEGAL_TOPIC, 0),
    ]

    async def scenario(service: PullService) -> None:
        for request, code, offset in answers:
            answer = await service.query_offset(request, CALL)
            assert (answer.status.code, answer.offset) == (code, offset), request

    with_service(broker, scenario)


def test_offset_calls_are_under_acl(broker: FakeBroker) -> None:
    acl = AclConfig.from_toml(f'''
[[accounts]]
accessKey = "consumer1"
secretKey = "secret01"
defaultTopicPerm = "DENY"
defaultGroupPerm = "DENY"
topicPerms = ["{TOPIC}=SUB"]
groupPerms = ["{GROUP}=SUB"]
''')
    date = "20260101T101010Z"
    signature = hmac.new(b"secret01", date.encode(), hashlib.sha1).hexdigest()
    signed = CallInfo({"x-mq-date-time": date, "authorization": "MQv2-HMAC-SHA1 Credential=consumer1, "
                                                               f"SignedHeaders=x-mq-date-time, Signature={signature}"},
                      "127.0.0.1", 40000)

    async def scenario(service: PullService) -> None:
        assert (await pull(service, pull_request(0), CALL))[0] == Code.UNAUTHORIZED
        assert (await pull(service, pull_request(0, group="GID_other"), signed))[0] == Code.FORBIDDEN
        assert (await pull(service, pull_request(0), signed))[0] == Code.OK
        refused = UpdateOffsetRequest(group=Resource(name="GID_other"), message_queue=queue(), offset=1)
        assert (await service.update_offset(refused, signed)).status.code == Code.FORBIDDEN
        unsigned = UpdateOffsetRequest(group=Resource(name=GROUP), message_queue=queue(), offset=1)
        assert (await service.update_offset(unsigned, CALL)).status.code == Code.UNAUTHORIZED
        assert broker.state.consumer_offsets == {}
        assert (await service.update_offset(unsigned, signed)).status.code == Code.OK
        get = GetOffsetRequest(group=Resource(name=GROUP), message_queue=queue())
        assert (await service.get_offset(get, CALL)).status.code == Code.UNAUTHORIZED
        assert (await service.get_offset(get, signed)).offset == 1
        query = QueryOffsetRequest(message_queue=queue(), query_offset_policy=QueryOffsetPolicy.END)
        assert (await service.query_offset(query, CALL)).status.code == Code.UNAUTHORIZED
        assert (await service.query_offset(query, signed)).offset == 3

    with_service(broker, scenario, Authenticator(AclRules(acl, lambda: b"")))
