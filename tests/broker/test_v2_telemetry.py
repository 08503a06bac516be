"""broker.v2.telemetry without a server: which stream a transaction recovery goes to, what it carries, and the
bounds (streams, outbox)."""

from __future__ import annotations

import asyncio
import random

import pytest

from broker.v2.protocol.definition_pb2 import Code, MessageType, Publishing, Resource, Settings, Subscription
from broker.v2.status import StatusError
from broker.v2.telemetry import TELEMETRY_OUTBOX_MAX, TelemetrySessions
from commitlog.message import MessageInput
from commitlog.record_codec import StoredMessage, decode_record, encode_record
from commitlog.sys_flags import TRANSACTION_PREPARED_TYPE
from protocol.topics import TRANS_HALF_TOPIC

STORE_HOST = bytes([127, 0, 0, 1]) + (10911).to_bytes(4, "big")


def half(topic: str = "orders", body: bytes = b"pay") -> StoredMessage:
    properties = (f"TAGS\x01TagA\x02KEYS\x01k1\x02UNIQ_KEY\x01MSG-1\x02TRAN_MSG\x01true\x02PGROUP\x01{topic}\x02"
                  f"REAL_TOPIC\x01{topic}\x02REAL_QID\x013\x02")
    message = MessageInput(TRANS_HALF_TOPIC, 0, 0, TRANSACTION_PREPARED_TYPE, 1_000, STORE_HOST, 2_000, 0, 0, body,
                           properties.encode())
    return decode_record(encode_record(message, 7, 4096, STORE_HOST))


def producer_settings(*topics: str) -> Settings:
    return Settings(publishing=Publishing(topics=[Resource(name=topic) for topic in topics]))


def test_a_recovery_goes_to_a_producer_of_the_half_topic_with_the_message_as_sent() -> None:
    async def body() -> None:
        sessions = TelemetrySessions(rng=random.Random(1))
        consumer = sessions.open("consumer")
        consumer.settings = Settings(subscription=Subscription())
        other = sessions.open("other-topic")
        other.settings = producer_settings("refunds")
        producer = sessions.open("producer")
        producer.settings = producer_settings("refunds", "orders")
        assert sessions.recover_transaction(half("payments")) is None
        stored = half()
        assert sessions.recover_transaction(stored) == "producer"
        assert consumer.outbox.empty() and other.outbox.empty()
        command = producer.outbox.get_nowait().recover_orphaned_transaction_command
        assert command.transaction_id == stored.msg_id  # what SendMessage answered as the transaction id
        message = command.message
        assert message.topic.name == "orders" and message.body == b"pay"
        system = message.system_properties
        assert (system.message_id, system.tag, list(system.keys)) == ("MSG-1", "TagA", ["k1"])
        assert system.message_type == MessageType.TRANSACTION and system.queue_id == 3
        assert not message.user_properties  # REAL_TOPIC, PGROUP, ... are the broker's own
        sessions.close(producer)
        assert sessions.recover_transaction(stored) is None

    asyncio.run(body())


def test_a_full_outbox_drops_the_recovery_and_streams_are_bounded() -> None:
    async def body() -> None:
        sessions = TelemetrySessions(streams_max=1)
        producer = sessions.open("producer")
        producer.settings = producer_settings("orders")
        for _ in range(TELEMETRY_OUTBOX_MAX):
            assert sessions.recover_transaction(half()) == "producer"
        assert sessions.recover_transaction(half()) is None
        with pytest.raises(StatusError) as refused:
            sessions.open("another")
        assert refused.value.code == Code.TOO_MANY_REQUESTS

    asyncio.run(body())
