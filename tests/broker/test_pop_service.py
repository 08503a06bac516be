"""The leader's side of pop consumption (broker.pop, broker.v2.consumer) against a real store and apply,
without Raft: proposals apply at once at the next index. The group's time is a variable of the test."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import ipaddress
import zlib
from collections.abc import Sequence
from pathlib import Path

import pytest

from broker.acl.authorizer import AclRules
from broker.acl.config import AclConfig
from broker.config import BrokerConfig
from broker.pop import RENEW_AHEAD_MS, RENEW_INVISIBLE_MS, PopService
from broker.pull import tag_codes
from broker.v2.auth import Authenticator
from broker.v2.consumer import ConsumerService, v2_message
from broker.v2.protocol.definition_pb2 import (
    Code,
    DigestType,
    Encoding,
    FilterExpression,
    MessageQueue,
    Resource,
)
from broker.v2.protocol.service_pb2 import (
    AckMessageEntry,
    AckMessageRequest,
    ReceiveMessageRequest,
    ReceiveMessageResponse,
)
from client.message import message_from_record
from commitlog.message import MessageInput
from commitlog.store import MessageStore
from commitlog.sys_flags import SYSFLAG_COMPRESSED
from dledger.apply import ApplyResult, StateMachine
from dledger.command import Command, Messages, SubscriptionGroup, TopicConfig, encode_command
from dledger.state import ReplicatedState
from protocol.route_data import PERM_READ, PERM_WRITE
from tests.commitlog.helpers import message, small_config

TOPIC = "TopicTest"
GROUP = "GID_service"


class FakeMember:
    is_leader = True


class FakeBroker:
    """What PopService uses of BrokerContext: proposals apply here at once."""

    def __init__(self, directory: Path) -> None:
        self.state = ReplicatedState()
        self.store = MessageStore(small_config(directory), extension_provider=lambda: self.state.encode())
        self.machine = StateMachine(self.store, self.state)
        self.config = BrokerConfig(listen_address="127.0.0.1:10911")
        self.member = FakeMember()
        self.now_ms = 1_000_000
        self.index = 0
        self.apply(Command((TopicConfig(TOPIC, 2, 2, PERM_READ | PERM_WRITE),)))

    def wall_clock_ms(self) -> int:
        return self.now_ms

    def apply(self, command: Command) -> ApplyResult:
        self.index += 1
        return self.machine.apply(self.index, encode_command(command))

    def send(self, messages: Sequence[MessageInput]) -> None:
        self.apply(Command((Messages(tuple(messages)),)))

    def require_leader(self) -> None:
        pass

    async def propose(self, command: Command) -> ApplyResult:
        return self.apply(command)

    async def ensure_topic(self, topic: str, queue_nums: int, perm: int = PERM_READ | PERM_WRITE) -> TopicConfig:
        config = TopicConfig(topic, queue_nums, queue_nums, perm)
        self.apply(Command((config,)))
        return config

    def topic_config(self, topic: str) -> TopicConfig | None:
        return self.state.topics.get(topic)


@pytest.fixture
def broker(tmp_path: Path) -> FakeBroker:
    return FakeBroker(tmp_path / "store")


def service(broker: FakeBroker) -> PopService:
    return PopService(broker)  # type: ignore[arg-type]


def test_receive_filters_by_tag_and_skips_what_it_filtered(broker: FakeBroker) -> None:
    broker.send([message(1, tags="TagA"), message(2, tags="TagB"), message(3, tags="TagA")])
    pops = service(broker)
    popped = asyncio.run(pops.receive(GROUP, TOPIC, 0, 8, 30_000, tag_codes("TagA")))
    assert [item.queue_offset for item in popped] == [0, 2] and {item.attempt for item in popped} == {1}
    assert broker.state.pop_queues[(GROUP, TOPIC, 0)].cursor == 3
    assert asyncio.run(pops.receive(GROUP, TOPIC, 0, 8, 30_000, None)) == []


def test_revive_redelivers_then_dead_letters_after_the_groups_attempts(broker: FakeBroker) -> None:
    broker.apply(Command((SubscriptionGroup(GROUP, retry_max_times=1),)))
    broker.send([message(1)])
    pops = service(broker)
    (first,) = asyncio.run(pops.receive(GROUP, TOPIC, 0, 8, 10_000, None))
    assert asyncio.run(pops.revive_due())[0] == 0  # not due yet
    broker.now_ms += 10_000
    assert asyncio.run(pops.revive_due())[0] == 1
    (second,) = asyncio.run(pops.receive(GROUP, TOPIC, 0, 8, 10_000, None))
    assert second.attempt == 2 and second.queue_offset == first.queue_offset
    broker.now_ms += 10_000
    assert asyncio.run(pops.revive_due())[0] == 1
    assert broker.store.max_queue_offset(f"%DLQ%{GROUP}", 0) == 1
    assert broker.state.pop_queues[(GROUP, TOPIC, 0)].in_flight == {}
    assert asyncio.run(pops.receive(GROUP, TOPIC, 0, 8, 10_000, None)) == []


def test_auto_renew_keeps_the_handle_until_acknowledged(broker: FakeBroker) -> None:
    broker.send([message(1)])
    pops = service(broker)
    (popped,) = asyncio.run(pops.receive(GROUP, TOPIC, 0, 8, 60_000, None, auto_renew=True))
    assert asyncio.run(pops.renew_due()) == 0
    broker.now_ms += 60_000 - RENEW_AHEAD_MS + 1
    assert asyncio.run(pops.renew_due()) == 1
    entry = broker.state.pop_queues[(GROUP, TOPIC, 0)].in_flight[0]
    assert entry.handle_id == popped.handle_id and entry.invisible_until == broker.now_ms + RENEW_INVISIBLE_MS
    (outcome,) = asyncio.run(pops.ack_many(GROUP, TOPIC, [(0, 0, popped.handle_id)]))
    assert outcome.reason is None and pops.renewals == {}


def test_fifo_group_gets_one_batch_of_a_queue_at_a_time(broker: FakeBroker) -> None:
    broker.apply(Command((SubscriptionGroup(GROUP, consume_orderly=True),)))
    broker.send([message(1), message(2), message(3)])
    pops = service(broker)
    first = asyncio.run(pops.receive(GROUP, TOPIC, 0, 2, 30_000, None))
    assert [item.queue_offset for item in first] == [0, 1]
    assert asyncio.run(pops.receive(GROUP, TOPIC, 0, 2, 30_000, None)) == []
    asyncio.run(pops.ack_many(GROUP, TOPIC, [(0, item.queue_offset, item.handle_id) for item in first]))
    assert [item.queue_offset for item in asyncio.run(pops.receive(GROUP, TOPIC, 0, 2, 30_000, None))] == [2]


def test_a_4x_message_converts_for_a_5x_consumer(broker: FakeBroker) -> None:
    body = b"x" * 5000
    compressed = message(1, tags="TagA", keys="k1 k2", body=zlib.compress(body))
    broker.send([compressed._replace(sys_flag=compressed.sys_flag | SYSFLAG_COMPRESSED)])
    (popped,) = asyncio.run(service(broker).receive(GROUP, TOPIC, 0, 1, 30_000, None))
    converted = v2_message(popped, Resource(name=TOPIC), 30_000)
    assert converted.body == body and converted.system_properties.body_encoding == Encoding.IDENTITY
    assert converted.system_properties.body_digest.type == DigestType.MD5
    assert converted.system_properties.body_digest.checksum == hashlib.md5(body).hexdigest().upper()
    assert converted.system_properties.tag == "TagA" and list(converted.system_properties.keys) == ["k1", "k2"]
    assert converted.system_properties.message_id == popped.message.property_map["UNIQ_KEY"]
    assert converted.system_properties.delivery_attempt == 1 and converted.system_properties.queue_offset == 0
    assert converted.system_properties.receipt_handle.startswith("rq1.0.0.")


def test_receive_stream_and_ack_results(broker: FakeBroker) -> None:
    broker.send([message(1), message(2)])
    consumer = ConsumerService(service(broker), Authenticator(None))

    async def receive(polling_ms: int) -> list[ReceiveMessageResponse]:
        request = ReceiveMessageRequest(group=Resource(name=GROUP),
                                        message_queue=MessageQueue(topic=Resource(name=TOPIC), id=0),
                                        filter_expression=FilterExpression(expression="*"), batch_size=8)
        request.invisible_duration.seconds = 30
        request.long_polling_timeout.nanos = polling_ms * 1_000_000
        return [response async for response in consumer.receive(request, {}, "127.0.0.1", None)]

    responses = asyncio.run(receive(0))
    assert responses[0].status.code == Code.OK and responses[-1].HasField("delivery_timestamp")
    messages = [response.message for response in responses if response.HasField("message")]
    assert len(messages) == 2
    (empty,) = asyncio.run(receive(50))  # long polling with nothing new: MESSAGE_NOT_FOUND at the end
    assert empty.status.code == Code.MESSAGE_NOT_FOUND
    entries = [AckMessageEntry(message_id="a", receipt_handle=messages[0].system_properties.receipt_handle),
               AckMessageEntry(message_id="b", receipt_handle="garbage")]
    answer = asyncio.run(consumer.ack(AckMessageRequest(group=Resource(name=GROUP), topic=Resource(name=TOPIC),
                                                        entries=entries), {}, "127.0.0.1"))
    assert answer.status.code == Code.MULTIPLE_RESULTS
    assert [entry.status.code for entry in answer.entries] == [Code.OK, Code.INVALID_RECEIPT_HANDLE]


def test_a_receive_delivers_only_its_tags_when_another_tag_shares_their_hash_code(broker: FakeBroker) -> None:
    """"Aa" and "BB" have one Java hash code, so the consume queue cannot tell them apart: the exact check
    passes the other tag's message over (as a message of another tag: not delivered, not left behind)."""
    assert tag_codes("Aa") == tag_codes("BB")
    broker.send([message(1, tags="Aa"), message(2, tags="BB"), message(3, tags="Aa")])
    consumer = ConsumerService(service(broker), Authenticator(None))

    async def receive() -> list[ReceiveMessageResponse]:
        request = ReceiveMessageRequest(group=Resource(name=GROUP),
                                        message_queue=MessageQueue(topic=Resource(name=TOPIC), id=0),
                                        filter_expression=FilterExpression(expression="Aa"), batch_size=8)
        request.invisible_duration.seconds = 30
        return [response async for response in consumer.receive(request, {}, "127.0.0.1", None)]

    messages = [response.message for response in asyncio.run(receive()) if response.HasField("message")]
    assert [(item.system_properties.tag, item.system_properties.queue_offset) for item in messages] == [
        ("Aa", 0), ("Aa", 2)]
    assert broker.state.pop_queues[(GROUP, TOPIC, 0)].cursor == 3


def test_hosts_are_written_as_addresses_of_their_family(broker: FakeBroker) -> None:
    """An IPv6 born host (and store host) reaches a 5.x consumer bracketed and compressed, as our 4.x client
    shows it: ``[2001:db8::5]:4242``."""
    born = ipaddress.IPv6Address("2001:db8::5").packed + (4242).to_bytes(4, "big")
    broker.send([message(1, born_host=born)])
    (popped,) = asyncio.run(service(broker).receive(GROUP, TOPIC, 0, 1, 30_000, None))
    converted = v2_message(popped, Resource(name=TOPIC), 30_000)
    assert converted.system_properties.born_host == "[2001:db8::5]:4242"
    assert message_from_record(popped.message).born_host == "[2001:db8::5]:4242"
    assert converted.system_properties.store_host == message_from_record(popped.message).store_host


def test_consumption_calls_are_under_acl(broker: FakeBroker) -> None:
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
    metadata = {"x-mq-date-time": date, "authorization": "MQv2-HMAC-SHA1 Credential=consumer1, "
                                                          f"SignedHeaders=x-mq-date-time, Signature={signature}"}
    broker.send([message(1)])
    consumer = ConsumerService(service(broker), Authenticator(AclRules(acl, lambda: b"")))

    async def receive(group: str, headers: dict[str, str]) -> list[ReceiveMessageResponse]:
        request = ReceiveMessageRequest(group=Resource(name=group),
                                        message_queue=MessageQueue(topic=Resource(name=TOPIC), id=0), batch_size=8)
        request.invisible_duration.seconds = 30
        return [response async for response in consumer.receive(request, headers, "127.0.0.1", None)]

    assert asyncio.run(receive(GROUP, {}))[0].status.code == Code.UNAUTHORIZED
    assert asyncio.run(receive("GID_other", metadata))[0].status.code == Code.FORBIDDEN
    assert broker.state.pop_queues == {}  # nothing was popped by the refused calls
    assert asyncio.run(receive(GROUP, metadata))[0].status.code == Code.OK
    refused = asyncio.run(consumer.ack(AckMessageRequest(group=Resource(name=GROUP), topic=Resource(name=TOPIC),
                                                         entries=[AckMessageEntry(receipt_handle="rq1.0.0.2")]),
                                       {}, "127.0.0.1"))
    assert refused.status.code == Code.UNAUTHORIZED
