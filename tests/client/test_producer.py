"""The producer against the in-process fake group: what reaches the broker, retries with the same
UNIQ_KEY, failover to a new leader, and the sync facade."""

from __future__ import annotations

import asyncio
import random
import zlib

import pytest

from client.config import ProducerConfig
from client.errors import MessageValidationError, MQBrokerError, RequestTimeoutError
from client.message import Message, MessageQueue, SendStatus
from client.producer import AsyncProducer
from client.selector import select_by_sharding_key
from client.sync import Producer
from client.unique_id import is_unique_id
from commitlog.record_codec import decode_record
from protocol.codes import RequestCode, ResponseCode
from tests.client.fake_broker import FakeGroup
from tests.client.helpers import fake_group, fast_client_config, run


def producer_for(group: FakeGroup, **config: object) -> AsyncProducer:
    return AsyncProducer(
        fast_client_config(group.namesrv),
        ProducerConfig.from_mapping({"group": "PG", "send_timeout_seconds": 5.0, **config}),
        rng=random.Random(42),
    )


def test_send_stores_tags_keys_properties_and_a_unique_key() -> None:
    async def scenario() -> None:
        async with fake_group() as group, producer_for(group) as producer:
            message = Message("Orders", b"hello", tags="TagA", keys=("k1", "k2"), properties={"color": "red"})
            result = await producer.send(message)
            assert result.status is SendStatus.SEND_OK
            assert is_unique_id(result.msg_id) and message.unique_id == result.msg_id
            assert result.message_queue.topic == "Orders" and result.message_queue.broker_name == "broker-a"
            ((queue_id, offset, properties, body),) = group.all_records("Orders")
            assert (queue_id, offset, body) == (result.message_queue.queue_id, result.queue_offset, b"hello")
            assert properties == {
                "TAGS": "TagA", "KEYS": "k1 k2", "WAIT": "true", "UNIQ_KEY": result.msg_id, "color": "red"
            }
            raw = group.store.records[0]
            assert decode_record(raw).born_timestamp > 0
            assert result.offset_msg_id == "0A00000100002A9F0000000000000000"
            # the producer heartbeats its group to the broker
            assert any(beat["producerDataSet"] == [{"groupName": "PG"}] for beat in group.heartbeats)

    run(scenario())


def test_delay_deliver_at_and_compressed_bodies_reach_the_broker() -> None:
    async def scenario() -> None:
        async with fake_group() as group, producer_for(group, compress_body_over_bytes=64) as producer:
            await producer.send(Message("T", b"later", delay_level=3))
            await producer.send(Message("T", b"at", deliver_at_ms=1_900_000_000_000))
            big = b"compressible " * 100
            await producer.send(Message("T", big))
            records = {body: properties for _, _, properties, body in group.all_records("T")}
            assert records[b"later"]["DELAY"] == "3"
            assert records[b"at"]["__STARTDELIVERTIME"] == records[b"at"]["TIMER_DELIVER_MS"] == "1900000000000"
            (compressed,) = [raw for raw in group.store.records.values() if decode_record(raw).sys_flag & 1]
            assert zlib.decompress(decode_record(compressed).body) == big

    run(scenario())


def test_batch_is_one_request_in_one_queue_and_sends_rotate() -> None:
    async def scenario() -> None:
        async with fake_group() as group, producer_for(group) as producer:
            messages = [Message("B", f"m{index}".encode(), keys=(f"k{index}",)) for index in range(5)]
            result = await producer.send_batch(messages)
            assert result.msg_ids == tuple(message.unique_id for message in messages)
            assert len(result.offset_msg_ids) == 5
            assert group.leader.requests.count(RequestCode.SEND_BATCH_MESSAGE) == 1
            records = group.all_records("B")
            assert [body for _, _, _, body in records] == [f"m{index}".encode() for index in range(5)]
            assert {queue for queue, _, _, _ in records} == {result.message_queue.queue_id}
            assert [offset for _, offset, _, _ in records] == [0, 1, 2, 3, 4]
            # ordinary sends rotate over the 4 queues
            queues = [(await producer.send(Message("R", b"x"))).message_queue.queue_id for _ in range(8)]
            assert sorted(set(queues)) == [0, 1, 2, 3]
            with pytest.raises(MessageValidationError, match="same topic"):
                await producer.send_batch([Message("B", b"1"), Message("C", b"2")])
            with pytest.raises(MessageValidationError, match="delayed"):
                await producer.send_batch([Message("B", b"1", delay_level=2)])

    run(scenario())


def test_orderly_sends_keep_a_sharding_key_in_one_queue_in_order() -> None:
    async def scenario() -> None:
        async with fake_group() as group, producer_for(group) as producer:
            for step in range(6):
                for order in ("order-1", "order-2", "order-3"):
                    message = Message("O", f"{order}:{step}".encode(), sharding_key=order)
                    await producer.send_orderly(message, select_by_sharding_key)
            by_queue: dict[int, list[str]] = {}
            for queue_id, _, _, body in group.all_records("O"):
                by_queue.setdefault(queue_id, []).append(body.decode())
            for order in ("order-1", "order-2", "order-3"):
                holders = [q for q, bodies in by_queue.items() if any(b.startswith(order) for b in bodies)]
                assert len(holders) == 1
                steps = [int(b.split(":")[1]) for b in by_queue[holders[0]] if b.startswith(order)]
                assert steps == list(range(6))
            pinned = MessageQueue("O", "broker-a", 3)
            assert (await producer.send(Message("O", b"p"), queue=pinned)).message_queue == pinned

    run(scenario())


def test_async_and_oneway_sends() -> None:
    async def scenario() -> None:
        async with fake_group() as group, producer_for(group, inflight_sends_max=8) as producer:
            tasks = [producer.send_async(Message("A", f"{index}".encode())) for index in range(50)]
            results = await asyncio.gather(*tasks)
            assert len({result.msg_id for result in results}) == 50
            await producer.send_oneway(Message("A", b"oneway"))
            await asyncio.wait_for(_until(lambda: len(group.all_records("A")) == 51), 5)

    run(scenario())


async def _until(condition: object) -> None:
    assert callable(condition)
    while not condition():
        await asyncio.sleep(0.01)


def test_retriable_errors_retry_with_the_same_unique_key() -> None:
    async def scenario() -> None:
        async with fake_group() as group, producer_for(group) as producer:
            group.inject(RequestCode.SEND_MESSAGE_V2, ResponseCode.SYSTEM_BUSY, ResponseCode.SYSTEM_ERROR)
            result = await producer.send(Message("T", b"x"))
            assert result.status is SendStatus.SEND_OK
            assert group.leader.requests.count(RequestCode.SEND_MESSAGE_V2) == 3
            # a non-retriable answer raises at once, with its code
            group.inject(RequestCode.SEND_MESSAGE_V2, ResponseCode.MESSAGE_ILLEGAL)
            with pytest.raises(MQBrokerError) as caught:
                await producer.send(Message("T", b"y"))
            assert caught.value.code == ResponseCode.MESSAGE_ILLEGAL
            # retries exhausted: the last error surfaces
            group.inject(RequestCode.SEND_MESSAGE_V2, *[ResponseCode.SYSTEM_BUSY] * 3)
            with pytest.raises(MQBrokerError) as busy:
                await producer.send(Message("T", b"z"))
            assert busy.value.code == ResponseCode.SYSTEM_BUSY

    run(scenario())


def test_a_lost_answer_is_retried_and_deduplicated_by_unique_key() -> None:
    async def scenario() -> None:
        async with fake_group() as group, producer_for(group) as producer:
            group.drop_answers[RequestCode.SEND_MESSAGE_V2] = 1  # stored, but the answer never comes
            message = Message("T", b"once")
            result = await producer.send(message)
            assert group.leader.requests.count(RequestCode.SEND_MESSAGE_V2) == 2
            assert [body for _, _, _, body in group.all_records("T")] == [b"once"]
            assert result.msg_id == message.unique_id
            # with no time left for a retry the timeout surfaces as a typed error
            group.drop_answers[RequestCode.SEND_MESSAGE_V2] = 100
            with pytest.raises(RequestTimeoutError):
                await producer.send(Message("T", b"lost"), timeout_seconds=1.5)

    run(scenario())


def test_follower_redirect_and_leader_failover() -> None:
    async def scenario() -> None:
        async with fake_group(nodes=3) as group, producer_for(group) as producer:
            await producer.send(Message("F", b"before"))
            # leadership moves while the producer still routes to node 0: node 0 redirects
            await group.elect(1)
            node0_before = group.nodes[0].requests.count(RequestCode.SEND_MESSAGE_V2)
            result = await producer.send(Message("F", b"redirected"))
            assert result.broker_address == group.nodes[1].address
            assert group.nodes[0].requests.count(RequestCode.SEND_MESSAGE_V2) == node0_before + 1
            # the leader dies; a new one is elected a moment later: the send rides it out
            await group.kill(1)
            loop = asyncio.get_running_loop()
            loop.call_later(0.3, lambda: asyncio.ensure_future(group.elect(2)))
            started = loop.time()
            result = await producer.send(Message("F", b"after failover"))
            assert result.broker_address == group.nodes[2].address
            assert loop.time() - started < 4.0
            assert [body for _, _, _, body in group.all_records("F")] == [b"before", b"redirected", b"after failover"]

    run(scenario())


def test_sends_to_a_new_topic_borrow_the_default_route() -> None:
    async def scenario() -> None:
        async with fake_group() as group, producer_for(group, default_topic_queue_nums=2) as producer:
            result = await producer.send(Message("Brand-New", b"x"))
            assert result.message_queue.queue_id in (0, 1)
            assert group.store.topics["Brand-New"].write_queue_nums == 2
            group.auto_create = False
            with pytest.raises(MQBrokerError) as caught:
                await producer.send(Message("Never", b"x"))
            assert caught.value.code == ResponseCode.TOPIC_NOT_EXIST

    run(scenario())


def test_sync_producer_facade() -> None:
    group = FakeGroup()
    from client.loop import EventLoopThread

    loop = EventLoopThread("fake-broker")
    try:
        loop.run(group.start())
        with Producer(fast_client_config(group.namesrv), ProducerConfig(group="SyncPG")) as producer:
            result = producer.send(Message("S", b"sync"))
            assert result.status is SendStatus.SEND_OK
            futures = [producer.send_async(Message("S", f"{index}".encode())) for index in range(10)]
            assert all(future.result(10).status is SendStatus.SEND_OK for future in futures)
            batch = producer.send_batch([Message("S", b"b1"), Message("S", b"b2")])
            assert len(batch.msg_ids) == 2
            assert len(producer.fetch_publish_queues("S")) == 4
            with pytest.raises(MessageValidationError):
                producer.send(Message("S", b""))
        assert len(loop.call(lambda: group.all_records("S"))) == 13
    finally:
        loop.run(group.stop())
        loop.stop()
