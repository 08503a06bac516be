"""Push, lite-pull and pull consumers against the fake group: delivery, tags, rebalance between
members, offsets on the broker (and in a file for broadcasting), retries through the retry topic,
orderly consumption with queue locks, failover."""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from pathlib import Path

import pytest

from client.config import ConsumerConfig, ProducerConfig
from client.errors import MQClientError
from client.lite_pull_consumer import AsyncLitePullConsumer
from client.loop import EventLoopThread
from client.message import Message, MessageExt, MessageQueue, PullStatus
from client.offset_store import read_offsets_file
from client.producer import AsyncProducer
from client.pull_consumer import AsyncPullConsumer
from client.push_consumer import (
    AsyncPushConsumer,
    ConsumeConcurrentlyStatus,
    ConsumeContext,
    ConsumeOrderlyStatus,
)
from client.selector import select_by_sharding_key
from client.sync import LitePullConsumer, PullConsumer, PushConsumer
from protocol.codes import RequestCode, ResponseCode
from tests.client.fake_broker import FakeGroup
from tests.client.helpers import fake_group, fast_client_config, run
from tests.support.waiting import poll_until, wait_for


def consumer_config(group: str = "CG", **overrides: object) -> ConsumerConfig:
    values: dict[str, object] = {
        "group": group,
        "consume_from_where": "CONSUME_FROM_FIRST_OFFSET",
        "suspend_timeout_seconds": 0.5,
        "pull_backoff_seconds": 0.05,
        "rebalance_interval_seconds": 0.2,
        "persist_offsets_interval_seconds": 0.2,
        "lock_interval_seconds": 0.5,
        "suspend_current_queue_seconds": 0.05,
    }
    values.update(overrides)
    return ConsumerConfig.from_mapping(values)


def producer_for(group: FakeGroup) -> AsyncProducer:
    return AsyncProducer(fast_client_config(group.namesrv), ProducerConfig(group="PG"), rng=random.Random(3))


async def produce(group: FakeGroup, topic: str, count: int, **message_options: object) -> list[str]:
    async with producer_for(group) as producer:
        results = [
            await producer.send(Message(topic, f"{topic}-{index}".encode(), **message_options))  # type: ignore[arg-type]
            for index in range(count)
        ]
    return [result.msg_id for result in results]


def committed(group: FakeGroup, consumer_group: str, topic: str) -> dict[int, int]:
    return {queue: offset for (g, t, queue), offset in group.store.offsets.items() if g == consumer_group and t == topic}


def test_push_consumer_consumes_everything_and_commits_offsets() -> None:
    async def scenario() -> None:
        async with fake_group() as group:
            ids = await produce(group, "P", 20)
            received: list[MessageExt] = []

            async def listener(messages: list[MessageExt], context: ConsumeContext) -> ConsumeConcurrentlyStatus:
                received.extend(messages)
                return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

            consumer = AsyncPushConsumer(fast_client_config(group.namesrv), consumer_config(), listener=listener)
            consumer.subscribe("P")
            async with consumer:
                await poll_until(lambda: len(received) == 20, "20 messages", timeout_seconds=10.0)
                # new messages arrive through long polling
                ids += await produce(group, "P", 4)
                await poll_until(lambda: len(received) == 24, "24 messages", timeout_seconds=10.0)
                assert len(consumer.assigned_queues()) == 4 + 1  # P and the group's retry topic
            assert sorted(message.msg_id for message in received) == sorted(ids)
            assert sum(committed(group, "CG", "P").values()) == 24
            beat = next(b for b in group.heartbeats if b.get("consumerDataSet"))
            data = beat["consumerDataSet"][0]  # type: ignore[index]
            assert data["consumeType"] == "CONSUME_PASSIVELY" and data["messageModel"] == "CLUSTERING"
            assert {s["topic"] for s in data["subscriptionDataSet"]} == {"P", "%RETRY%CG"}

    run(scenario())


def test_tag_subscription_filters_messages() -> None:
    async def scenario() -> None:
        async with fake_group() as group:
            async with producer_for(group) as producer:
                for index, tag in enumerate(["A", "B", "C", "A", None]):
                    await producer.send(Message("Tags", f"{index}".encode(), tags=tag))
            seen: list[str] = []
            consumer = AsyncPushConsumer(
                fast_client_config(group.namesrv),
                consumer_config(),
                listener=lambda messages, context: seen.extend(m.tags or "" for m in messages),
            )
            consumer.subscribe("Tags", "A || C")
            async with consumer:
                await poll_until(lambda: sorted(seen) == ["A", "A", "C"], "tagged messages",
                                 timeout_seconds=10.0)
                # nothing matching is left: offsets move past the filtered ones too
                await poll_until(lambda: sum(committed(group, "CG", "Tags").values()) == 5,
                                 "offsets past filtered", timeout_seconds=10.0)

    run(scenario())


def test_two_members_split_queues_and_take_over_when_one_leaves() -> None:
    async def scenario() -> None:
        async with fake_group() as group:
            counts: Counter[str] = Counter()

            def listener_for(name: str):  # type: ignore[no-untyped-def]
                def listener(messages: list[MessageExt], context: ConsumeContext) -> bool:
                    for message in messages:
                        counts[message.msg_id] += 1
                    return True

                return listener

            config = fast_client_config(group.namesrv)
            first = AsyncPushConsumer(config, consumer_config(), listener=listener_for("first"))
            second = AsyncPushConsumer(config, consumer_config(), listener=listener_for("second"))
            for consumer in (first, second):
                consumer.subscribe("Split")
            await produce(group, "Split", 1)  # the topic exists before the members start
            await first.start()
            await second.start()
            try:
                def split() -> bool:
                    mine = {q for q in first.assigned_queues() if q.topic == "Split"}
                    theirs = {q for q in second.assigned_queues() if q.topic == "Split"}
                    return len(mine) == 2 and len(theirs) == 2 and not mine & theirs

                await poll_until(split, "an even split", timeout_seconds=10.0)
                ids = await produce(group, "Split", 40)
                await poll_until(lambda: all(counts[i] >= 1 for i in ids), "every message consumed",
                                 timeout_seconds=10.0)
                await second.close()
                await poll_until(lambda: len([q for q in first.assigned_queues() if q.topic == "Split"]) == 4,
                                 "the remaining member takes every queue", timeout_seconds=10.0)
                more = await produce(group, "Split", 20)
                await poll_until(lambda: all(counts[i] >= 1 for i in more), "messages after the takeover",
                                 timeout_seconds=10.0)
            finally:
                await first.close()
                await second.close()
            assert max(counts[i] for i in ids + more) == 1  # no failure happened: nothing twice

    run(scenario())


def test_reconsume_later_goes_through_the_retry_topic() -> None:
    async def scenario() -> None:
        async with fake_group() as group:
            (msg_id,) = await produce(group, "Retry", 1)
            deliveries: list[MessageExt] = []

            def listener(messages: list[MessageExt], context: ConsumeContext) -> ConsumeConcurrentlyStatus:
                deliveries.extend(messages)
                if len(deliveries) == 1:
                    context.delay_level_when_next_consume = 2
                    return ConsumeConcurrentlyStatus.RECONSUME_LATER
                return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

            consumer = AsyncPushConsumer(fast_client_config(group.namesrv), consumer_config(), listener=listener)
            consumer.subscribe("Retry")
            async with consumer:
                await poll_until(lambda: len(deliveries) == 2, "the redelivery", timeout_seconds=10.0)
            first, again = deliveries
            assert group.sent_back[0]["delayLevel"] == "2" and group.sent_back[0]["originMsgId"] == msg_id
            assert again.topic == "Retry" and again.msg_id == msg_id and again.reconsume_times == 1
            assert again.body == first.body

    run(scenario())


def test_orderly_consumer_locks_queues_and_keeps_order() -> None:
    async def scenario() -> None:
        async with fake_group() as group:
            async with producer_for(group) as producer:
                for step in range(10):
                    for key in ("k1", "k2", "k3"):
                        await producer.send_orderly(
                            Message("Ord", f"{key}:{step}".encode(), sharding_key=key), select_by_sharding_key
                        )
            seen: dict[str, list[int]] = {}
            suspended: set[str] = set()

            def listener(messages: list[MessageExt], context: ConsumeContext) -> ConsumeOrderlyStatus:
                for message in messages:
                    key, step = message.body.decode().split(":")
                    if step == "3" and key not in suspended:
                        suspended.add(key)  # ask for this one again once: order must hold anyway
                        return ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT
                    seen.setdefault(key, []).append(int(step))
                return ConsumeOrderlyStatus.SUCCESS

            consumer = AsyncPushConsumer(fast_client_config(group.namesrv), consumer_config(), listener=listener,
                                         orderly=True)
            consumer.subscribe("Ord")
            async with consumer:
                await poll_until(lambda: sum(len(v) for v in seen.values()) == 30, "30 messages in order",
                                 timeout_seconds=10.0)
                assert {key for (_, topic, _), key in group.locks.items() if topic == "Ord"} == {consumer.client_id}
            assert seen == {key: list(range(10)) for key in ("k1", "k2", "k3")}
            assert {topic for _, topic, _ in group.unlocked} == {"Ord", "%RETRY%CG"}
            assert not [key for key in group.locks if key[1] == "Ord"]

    run(scenario())


def test_orderly_messages_go_to_the_dead_letter_queue_after_max_reconsume_times() -> None:
    async def scenario() -> None:
        async with fake_group() as group:
            await produce(group, "Poison", 1)
            attempts: list[int] = []

            def always_suspend(messages: list[MessageExt], context: ConsumeContext) -> ConsumeOrderlyStatus:
                attempts.append(len(messages))
                return ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT

            consumer = AsyncPushConsumer(
                fast_client_config(group.namesrv),
                consumer_config(max_reconsume_times=2),
                listener=always_suspend,
                orderly=True,
            )
            consumer.subscribe("Poison")
            async with consumer:
                await poll_until(lambda: "%DLQ%CG" in group.store.topics, "the dead-letter queue",
                                 timeout_seconds=10.0)
            assert len(attempts) == 3
            assert group.sent_back[-1]["delayLevel"] == "-1"

    run(scenario())


def test_broadcasting_members_each_get_everything_and_keep_offsets_in_a_file(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with fake_group() as group:
            await produce(group, "Bcast", 8)
            config = consumer_config("BG", message_model="BROADCASTING", offset_store_dir=tmp_path / "a")
            other_config = consumer_config("BG", message_model="BROADCASTING", offset_store_dir=tmp_path / "b")
            got: dict[str, list[bytes]] = {"a": [], "b": []}
            first = AsyncPushConsumer(fast_client_config(group.namesrv), config,
                                      listener=lambda m, c: got["a"].extend(x.body for x in m))
            second = AsyncPushConsumer(fast_client_config(group.namesrv), other_config,
                                       listener=lambda m, c: got["b"].extend(x.body for x in m))
            for consumer in (first, second):
                consumer.subscribe("Bcast")
            async with first, second:
                await poll_until(lambda: len(got["a"]) == 8 and len(got["b"]) == 8, "both members get all 8",
                                 timeout_seconds=10.0)
            assert sorted(got["a"]) == sorted(got["b"])
            offsets = read_offsets_file(tmp_path / "a" / "BG" / "offsets.json")
            assert sum(offsets.values()) == 8 and not committed(group, "BG", "Bcast")
            # a restarted member resumes from its file
            await produce(group, "Bcast", 2)
            again: list[bytes] = []
            restarted = AsyncPushConsumer(fast_client_config(group.namesrv), config,
                                          listener=lambda m, c: again.extend(x.body for x in m))
            restarted.subscribe("Bcast")
            async with restarted:
                await poll_until(lambda: len(again) == 2, "the 2 new messages", timeout_seconds=10.0)
            assert sorted(again) == [b"Bcast-0", b"Bcast-1"]

    run(scenario())


def test_consume_from_last_offset_skips_history_for_a_new_group() -> None:
    async def scenario() -> None:
        async with fake_group() as group:
            await produce(group, "Hist", 6)
            got: list[bytes] = []
            consumer = AsyncPushConsumer(fast_client_config(group.namesrv),
                                         consumer_config("New", consume_from_where="CONSUME_FROM_LAST_OFFSET"),
                                         listener=lambda m, c: got.extend(x.body for x in m))
            consumer.subscribe("Hist")
            async with consumer:
                await poll_until(
                    lambda: len([q for q in consumer.offsets() if q.topic == "Hist"]) == 4, "start offsets",
                    timeout_seconds=10.0,
                )
                await produce(group, "Hist", 1)
                await poll_until(lambda: got == [b"Hist-0"], "only the new message", timeout_seconds=10.0)

    run(scenario())


def test_lite_pull_consumer_polls_commits_and_seeks() -> None:
    async def scenario() -> None:
        async with fake_group() as group:
            await produce(group, "Lite", 12)
            consumer = AsyncLitePullConsumer(fast_client_config(group.namesrv), consumer_config("LG"),
                                             auto_commit=False)
            consumer.subscribe("Lite")
            async with consumer:
                polled: list[MessageExt] = []
                while len(polled) < 12:
                    polled.extend(await consumer.poll(2.0))
                assert sorted(m.body for m in polled) == sorted(f"Lite-{i}".encode() for i in range(12))
                assert await consumer.poll(0.2) == []
                assert committed(group, "LG", "Lite") == {}
                await consumer.commit()
                assert sum(committed(group, "LG", "Lite").values()) == 12
                queue = polled[0].message_queue
                await consumer.seek(queue, 0)
                replay = await consumer.poll(2.0)
                assert replay and {m.queue_id for m in replay} == {queue.queue_id}
                assert replay[0].queue_offset == 0
                before = await consumer.committed(queue)
                assert before is not None and before > 0  # a seek does not commit
                await consumer.commit({queue: 1})
                assert await consumer.committed(queue) == 1

    run(scenario())


def test_lite_pull_assign_mode_and_auto_commit() -> None:
    async def scenario() -> None:
        async with fake_group() as group:
            await produce(group, "Assigned", 8)
            queue = MessageQueue("Assigned", "broker-a", 1)
            consumer = AsyncLitePullConsumer(fast_client_config(group.namesrv), consumer_config("AG"))
            consumer.assign([queue])
            async with consumer:
                first = await consumer.poll(2.0)
                assert first and {m.queue_id for m in first} == {1}
                assert await consumer.poll(0.1) == []  # marks the first poll consumed
            assert committed(group, "AG", "Assigned") == {1: 2}

    run(scenario())


def test_pull_consumer_reads_by_offset_and_long_polls() -> None:
    async def scenario() -> None:
        async with fake_group() as group:
            await produce(group, "Low", 4)
            async with AsyncPullConsumer(fast_client_config(group.namesrv), consumer_config("PLG")) as consumer:
                queues = await consumer.fetch_subscribe_queues("Low")
                assert len(queues) == 4
                queue = queues[0]
                result = await consumer.pull(queue, "*", 0, 32)
                assert result.status is PullStatus.FOUND and result.next_begin_offset == 1
                empty = await consumer.pull(queue, "*", 1, 32)
                assert empty.status is PullStatus.NO_NEW_MSG
                moved = await consumer.pull(queue, "*", 99, 32)
                assert moved.status is PullStatus.OFFSET_ILLEGAL
                waiting = asyncio.ensure_future(consumer.pull(queue, "*", 1, 32, block_seconds=5.0))
                await asyncio.sleep(0.1)
                assert not waiting.done()
                async with producer_for(group) as producer:
                    await producer.send(Message("Low", b"wake"), queue=queue)
                woken = await waiting
                assert [m.body for m in woken.messages] == [b"wake"]
                assert await consumer.max_offset(queue) == 2 and await consumer.min_offset(queue) == 0
                assert await consumer.fetch_consume_offset(queue) is None
                await consumer.update_consume_offset(queue, 2, persist=True)
                assert committed(group, "PLG", "Low") == {queue.queue_id: 2}
                await consumer.send_message_back(woken.messages[0], 1)
                assert group.sent_back[-1]["group"] == "PLG"

    run(scenario())


def test_consumers_ride_out_a_leader_change() -> None:
    async def scenario() -> None:
        async with fake_group(nodes=3) as group:
            ids = await produce(group, "Fail", 5)
            got: list[str] = []
            consumer = AsyncPushConsumer(fast_client_config(group.namesrv), consumer_config("FG"),
                                         listener=lambda m, c: got.extend(x.msg_id for x in m))
            consumer.subscribe("Fail")
            async with consumer:
                await poll_until(lambda: len(got) == 5, "the first 5", timeout_seconds=10.0)
                await group.kill(0)
                await group.elect(1)
                ids += await produce(group, "Fail", 5)
                await poll_until(lambda: len(got) == 10, "5 more after the leader change",
                                 timeout_seconds=10.0)
                await poll_until(lambda: sum(committed(group, "FG", "Fail").values()) == 10,
                                 "offsets on the new leader", timeout_seconds=10.0)
            assert sorted(got) == sorted(ids)


def test_sync_consumer_facades() -> None:
    group = FakeGroup()
    loop = EventLoopThread("fake-broker")
    try:
        loop.run(group.start())
        loop.run(produce(group, "SyncC", 6))
        received: list[bytes] = []
        unsubscribed = PushConsumer(fast_client_config(group.namesrv), consumer_config("SG"),
                                    listener=lambda m, c: None)
        with pytest.raises(MQClientError, match="subscribe"):
            unsubscribed.start()
        consumer = PushConsumer(fast_client_config(group.namesrv), consumer_config("SG"))
        consumer.register_listener(lambda m, c: received.extend(x.body for x in m))
        consumer.subscribe("SyncC")
        with consumer:
            wait_for(lambda: len(received) == 6, "6 pushed messages", timeout_seconds=10.0,
                     interval_seconds=0.02)
            assert len(consumer.assigned_queues()) == 5
        with LitePullConsumer(fast_client_config(group.namesrv), consumer_config("SL")) as lite:
            lite.subscribe("SyncC")
            polled: list[MessageExt] = []

            def poll_more() -> bool:
                polled.extend(lite.poll(0.5))
                return len(polled) == 6

            wait_for(poll_more, "6 polled messages", timeout_seconds=10.0, interval_seconds=0.02)
        with PullConsumer(fast_client_config(group.namesrv), consumer_config("SP")) as puller:
            queue = puller.fetch_subscribe_queues("SyncC")[0]
            assert puller.pull(queue, "*", 0, 10).status is PullStatus.FOUND
    finally:
        loop.run(group.stop())
        loop.stop()


def test_a_new_member_triggers_an_immediate_rebalance() -> None:
    async def scenario() -> None:
        async with fake_group() as group:
            await produce(group, "Notify", 1)
            config = fast_client_config(group.namesrv)
            slow = consumer_config("NG", rebalance_interval_seconds=60.0)
            first = AsyncPushConsumer(config, slow, listener=lambda m, c: None)
            second = AsyncPushConsumer(config, slow, listener=lambda m, c: None)
            for consumer in (first, second):
                consumer.subscribe("Notify")
            async with first:
                await poll_until(lambda: len([q for q in first.assigned_queues() if q.topic == "Notify"]) == 4,
                                 "the only member holds every queue", timeout_seconds=10.0)
                async with second:
                    # NOTIFY_CONSUMER_IDS_CHANGED, not the 60 s period, makes the first member give queues up
                    await poll_until(lambda: len([q for q in first.assigned_queues() if q.topic == "Notify"]) == 2,
                                     "the first member keeps half", timeout_seconds=5.0)

    run(scenario())


def test_a_failed_send_back_is_consumed_again_locally(monkeypatch: pytest.MonkeyPatch) -> None:
    import client.push_consumer as push_consumer

    monkeypatch.setattr(push_consumer, "LOCAL_RETRY_SECONDS", 0.05)

    async def scenario() -> None:
        async with fake_group() as group:
            await produce(group, "Local", 1)
            group.inject(RequestCode.CONSUMER_SEND_MSG_BACK, ResponseCode.SYSTEM_ERROR)
            deliveries: list[MessageExt] = []

            def listener(messages: list[MessageExt], context: ConsumeContext) -> ConsumeConcurrentlyStatus:
                deliveries.extend(messages)
                if len(deliveries) == 1:
                    return ConsumeConcurrentlyStatus.RECONSUME_LATER
                return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

            consumer = AsyncPushConsumer(fast_client_config(group.namesrv), consumer_config("LR"), listener=listener)
            consumer.subscribe("Local")
            async with consumer:
                await poll_until(lambda: len(deliveries) == 2, "the local redelivery", timeout_seconds=10.0)
                await poll_until(lambda: sum(committed(group, "LR", "Local").values()) == 1, "the offset",
                                 timeout_seconds=10.0)
            assert [m.topic for m in deliveries] == ["Local", "Local"]
            assert deliveries[0].msg_id == deliveries[1].msg_id and deliveries[1].reconsume_times == 0
            assert not group.sent_back  # the only send-back was refused

    run(scenario())
