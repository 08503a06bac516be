"""Send coalescing (client/coalesce.py) against the in-process fake group: concurrent sends to one queue
leave as one batch request and each caller gets its own result; what is stored, where, and the answers
are those of single sends; a rejected batch falls back to single sends."""

from __future__ import annotations

import asyncio
import random
from collections import Counter

import pytest

from client.config import ConfigError, ProducerConfig
from client.errors import MQBrokerError
from client.message import Message, SendResult
from client.producer import AsyncProducer
from protocol.codes import RequestCode, ResponseCode
from tests.client.fake_broker import FakeGroup
from tests.client.helpers import fake_group, fast_client_config, run


def producer_for(group: FakeGroup, **config: object) -> AsyncProducer:
    return AsyncProducer(
        fast_client_config(group.namesrv),
        ProducerConfig.from_mapping({"group": "PG", "send_timeout_seconds": 5.0, **config}),
        rng=random.Random(7),
    )


def stored_by_unique_id(group: FakeGroup, topic: str) -> dict[str, tuple[int, int, dict[str, str], bytes]]:
    return {properties["UNIQ_KEY"]: (queue_id, offset, properties, body)
            for queue_id, offset, properties, body in group.all_records(topic)}


async def send_concurrently(producer: AsyncProducer, messages: list[Message]) -> list[SendResult]:
    return list(await asyncio.gather(*(producer.send(message) for message in messages)))


def test_concurrent_sends_leave_as_batches_and_each_caller_gets_its_own_result() -> None:
    async def scenario() -> None:
        async with fake_group() as group, producer_for(group) as producer:
            await producer.send(Message("C", b"warm-up"))  # the route, so the rest park in one loop turn
            before = Counter(group.leader.requests)
            messages = [Message("C", f"m{index}".encode(), tags=f"t{index % 3}", keys=(f"k{index}",),
                                properties={"n": str(index)}, flag=index) for index in range(40)]
            results = await send_concurrently(producer, messages)
            sent = Counter(group.leader.requests) - before
            queues = {result.message_queue.queue_id for result in results}
            # one batch per queue round-robin gave out, no single sends
            assert sent[RequestCode.SEND_BATCH_MESSAGE] == len(queues) == 4
            assert sent[RequestCode.SEND_MESSAGE_V2] == 0
            stored = stored_by_unique_id(group, "C")
            for message, result in zip(messages, results, strict=True):
                assert result.msg_id == message.unique_id
                queue_id, offset, properties, body = stored[result.msg_id]
                # each result names where its own message is
                assert (result.message_queue.queue_id, result.queue_offset) == (queue_id, offset)
                assert body == message.body
                assert properties == {"TAGS": message.tags, "KEYS": message.keys[0], "WAIT": "true",
                                      "UNIQ_KEY": message.unique_id, "n": properties["n"]}
                assert properties["n"] == str(message.flag)
            assert len({result.offset_msg_id for result in results}) == 40
            # queues spread as round-robin spreads single sends: ten each
            assert sorted(Counter(result.message_queue.queue_id for result in results).values()) == [10] * 4

    run(scenario())


def test_a_lone_send_and_sends_that_a_batch_would_change_go_alone() -> None:
    async def scenario() -> None:
        async with fake_group() as group, producer_for(group, compress_body_over_bytes=64) as producer:
            await producer.send(Message("S", b"warm-up"))
            before = Counter(group.leader.requests)
            await producer.send(Message("S", b"alone"))
            messages = [Message("S", b"delayed", delay_level=2), Message("S", b"timed", deliver_at_ms=1_900_000_000_000),
                        Message("S", b"compressible " * 20), Message("S", b"no-wait", wait_store_msg_ok=False),
                        Message("%RETRY%G", b"retry")]
            await send_concurrently(producer, messages)
            results = await asyncio.gather(*(producer.send(Message("S", b"pinned"), queue=result.message_queue)
                                             for result in [await producer.send(Message("S", b"q"))] * 3))
            assert len(results) == 3
            sent = Counter(group.leader.requests) - before
            assert sent[RequestCode.SEND_BATCH_MESSAGE] == 0
            assert sent[RequestCode.SEND_MESSAGE_V2] == 1 + len(messages) + 1 + 3

    run(scenario())


def test_coalescing_off_sends_one_request_per_message() -> None:
    async def scenario() -> None:
        async with fake_group() as group, producer_for(group, coalesce_sends=False) as producer:
            await producer.send(Message("O", b"warm-up"))
            before = Counter(group.leader.requests)
            await send_concurrently(producer, [Message("O", b"x") for _ in range(12)])
            sent = Counter(group.leader.requests) - before
            assert sent[RequestCode.SEND_MESSAGE_V2] == 12 and sent[RequestCode.SEND_BATCH_MESSAGE] == 0

    run(scenario())


def test_limits_cut_batches() -> None:
    async def scenario() -> None:
        async with fake_group() as group, producer_for(group, coalesce_messages_max=3) as producer:
            await producer.send(Message("L", b"warm-up"))
            before = Counter(group.leader.requests)
            results = await send_concurrently(producer, [Message("L", b"x") for _ in range(40)])
            sent = Counter(group.leader.requests) - before
            # ten sends per queue, at most three per batch: 3 + 3 + 3 + 1 (alone) per queue
            assert sent[RequestCode.SEND_BATCH_MESSAGE] == 12 and sent[RequestCode.SEND_MESSAGE_V2] == 4
            assert len(stored_by_unique_id(group, "L")) == 41 and len({r.msg_id for r in results}) == 40

    run(scenario())


def test_a_rejected_batch_is_sent_again_one_by_one_and_each_gets_its_own_verdict() -> None:
    async def scenario() -> None:
        async with fake_group() as group, producer_for(group) as producer:
            await producer.send(Message("R", b"warm-up"))
            # the first batch is refused (nothing stored); of the single sends after it, one is refused too
            group.inject(RequestCode.SEND_BATCH_MESSAGE, ResponseCode.MESSAGE_ILLEGAL)
            group.inject(RequestCode.SEND_MESSAGE_V2, ResponseCode.MESSAGE_ILLEGAL)
            before = Counter(group.leader.requests)
            messages = [Message("R", f"r{index}".encode()) for index in range(8)]  # two per queue: four batches
            outcomes = await asyncio.gather(*(producer.send(message) for message in messages), return_exceptions=True)
            sent = Counter(group.leader.requests) - before
            assert sent[RequestCode.SEND_BATCH_MESSAGE] == 4 and sent[RequestCode.SEND_MESSAGE_V2] == 2
            refused = [outcome for outcome in outcomes if isinstance(outcome, MQBrokerError)]
            assert len(refused) == 1 and refused[0].code == ResponseCode.MESSAGE_ILLEGAL
            stored = stored_by_unique_id(group, "R")
            delivered = [outcome for outcome in outcomes if isinstance(outcome, SendResult)]
            assert len(delivered) == 7
            for result in delivered:
                assert (stored[result.msg_id][0], stored[result.msg_id][1]) == (
                    result.message_queue.queue_id, result.queue_offset)
            assert len(stored) == 1 + 7  # the warm-up and the seven accepted: the refused batch left nothing

    run(scenario())


def test_coalescing_settings_are_checked() -> None:
    with pytest.raises(ConfigError):
        ProducerConfig(coalesce_bytes_max=8 * 1024 * 1024)
    with pytest.raises(ConfigError):
        ProducerConfig(coalesce_messages_max=0)
    with pytest.raises(ConfigError):
        ProducerConfig.from_mapping({"coalesce_sends": "yes"})
