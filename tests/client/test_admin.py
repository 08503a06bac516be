"""Admin against the fake group: topics on the leader, routes, offsets, progress, message lookup."""

from __future__ import annotations

import random

import pytest

from client.admin import RESET_TO_LATEST, AsyncAdmin, TopicSettings
from client.config import ProducerConfig
from client.errors import MessageValidationError, MQClientError, TopicNotFoundError
from client.loop import EventLoopThread
from client.message import Message, MessageQueue
from client.producer import AsyncProducer
from client.sync import Admin
from protocol.codes import RequestCode, ResponseCode
from protocol.route_data import PERM_READ, PERM_WRITE
from tests.client.fake_broker import FakeGroup
from tests.client.helpers import fake_group, fast_client_config, run


def admin_for(group: FakeGroup) -> AsyncAdmin:
    return AsyncAdmin(fast_client_config(group.namesrv), rng=random.Random(1), timeout_seconds=5.0)


def producer_for(group: FakeGroup) -> AsyncProducer:
    return AsyncProducer(fast_client_config(group.namesrv), ProducerConfig(group="PG"), rng=random.Random(2))


def test_create_update_list_and_describe_topics_on_the_leader() -> None:
    async def scenario() -> None:
        async with fake_group(nodes=2) as group, admin_for(group) as admin:
            await group.elect(1)  # node 0 is now a follower: creation must reach node 1
            assert await admin.create_topic("Orders", read_queue_nums=6, write_queue_nums=6) == ["broker-a"]
            assert group.store.topics["Orders"].write_queue_nums == 6
            route = await admin.describe_topic("Orders")
            assert len(route.publish_queues) == 6 and route.master_address("broker-a") == group.nodes[1].address
            await admin.update_topic("Orders", read_queue_nums=8, write_queue_nums=8, perm=PERM_READ)
            route = await admin.describe_topic("Orders")
            assert len(route.subscribe_queues) == 8 and route.publish_queues == ()
            assert "Orders" in await admin.list_topics()
            assert "TBW102" not in await admin.list_topics()
            assert "TBW102" in await admin.list_topics(include_system=True)
            with pytest.raises(TopicNotFoundError):
                await admin.update_topic("Missing", read_queue_nums=1, write_queue_nums=1)
            with pytest.raises(MessageValidationError):
                await admin.create_topic("bad topic")
            with pytest.raises(MessageValidationError):
                await admin.create_topic("T", read_queue_nums=0, write_queue_nums=0)
            with pytest.raises(MQClientError, match="no cluster named"):
                await admin.create_topic("T", cluster="Elsewhere")
            group.inject(RequestCode.UPDATE_AND_CREATE_TOPIC, ResponseCode.NO_PERMISSION)
            with pytest.raises(MQClientError) as caught:
                await admin.create_topic("T2")
            assert caught.value.code == ResponseCode.NO_PERMISSION

    run(scenario())


def test_update_topic_keeps_what_it_is_not_given() -> None:
    """Issue 26: an update applied the defaults of what it was not given (queues 4, perm rw, not ordered)."""

    async def scenario() -> None:
        async with fake_group() as group, admin_for(group) as admin:
            await admin.create_topic("Kept", read_queue_nums=6, write_queue_nums=6, perm=PERM_READ, order=True)
            await admin.update_topic("Kept", perm=PERM_READ | PERM_WRITE)
            state = group.store.topics["Kept"]
            assert (state.read_queue_nums, state.write_queue_nums, state.perm, state.order) == (6, 6, 6, True)
            await admin.update_topic("Kept", write_queue_nums=3, order=False)
            assert (state.read_queue_nums, state.write_queue_nums, state.perm, state.order) == (6, 3, 6, False)
            settings = await admin.topic_settings("Kept")
            assert settings["broker-a"] == TopicSettings("Kept", "broker-a", 6, 3, 6, False)
            refusals = [
                ({}, "nothing to change"),
                ({"read_queue_nums": 2}, "would never be consumed"),  # 2 read queues for 3 write queues
                ({"read_queue_nums": 0, "write_queue_nums": 0}, "needs read or write queues"),
                ({"perm": 8}, "perm must be"),
                ({"write_queue_nums": 2000}, "write_queue_nums must be"),
            ]
            for options, words in refusals:
                with pytest.raises(MessageValidationError, match=words):
                    await admin.update_topic("Kept", **options)  # type: ignore[arg-type]
            assert (state.read_queue_nums, state.write_queue_nums, state.perm, state.order) == (6, 3, 6, False)

    run(scenario())


def test_deletes_and_resets_refuse_bad_input_before_asking_anyone() -> None:
    async def scenario() -> None:
        async with fake_group() as group, admin_for(group) as admin:
            for topic in ("TBW102", "SCHEDULE_TOPIC_XXXX", "RMQ_SYS_TRANS_HALF_TOPIC", "BenchmarkTest"):
                with pytest.raises(MessageValidationError, match="system topic"):
                    await admin.delete_topic(topic)
                with pytest.raises(MessageValidationError, match="system topic"):
                    await admin.reset_offset("g", topic, RESET_TO_LATEST)
            with pytest.raises(MessageValidationError):
                await admin.delete_topic("bad topic")
            with pytest.raises(MessageValidationError, match="group"):
                await admin.reset_offset("bad group!", "T", RESET_TO_LATEST)
            with pytest.raises(MessageValidationError, match="timestamp_ms"):
                await admin.reset_offset("g", "T", -2)
            with pytest.raises(TopicNotFoundError):
                await admin.delete_topic("Missing")

    run(scenario())


def test_offsets_progress_and_message_lookup() -> None:
    async def scenario() -> None:
        async with fake_group() as group, admin_for(group) as admin, producer_for(group) as producer:
            await admin.create_topic("Q", read_queue_nums=2, write_queue_nums=2, perm=PERM_READ | PERM_WRITE)
            queue0, queue1 = MessageQueue("Q", "broker-a", 0), MessageQueue("Q", "broker-a", 1)
            results = [await producer.send(Message("Q", f"m{i}".encode(), keys=(f"key{i % 3}",)), queue=queue0)
                       for i in range(6)]
            await producer.send(Message("Q", b"other"), queue=queue1)
            assert await admin.max_offset(queue0) == 6 and await admin.min_offset(queue0) == 0
            offsets = await admin.topic_offsets("Q")
            assert [(entry.queue.queue_id, entry.min_offset, entry.max_offset) for entry in offsets] == [(0, 0, 6), (1, 0, 1)]
            assert await admin.search_offset(queue0, 0) == 0
            # consumer progress from committed offsets
            group.store.offsets[("G", "Q", 0)] = 4
            group.store.offsets[("G", "Q", 1)] = 1
            assert await admin.consumer_offset("G", queue0) == 4
            assert await admin.consumer_offset("Other", queue0) is None
            progress = await admin.consumer_progress("G")
            assert [(row.queue.queue_id, row.broker_offset, row.consumer_offset, row.lag) for row in progress.queues] == [
                (0, 6, 4, 2), (1, 1, 1, 0)
            ]
            assert progress.total_lag == 2 and progress.consumer_ids == ()
            explicit = await admin.consumer_progress("Other", ["Q"])
            assert explicit.total_lag == 7
            # lookups
            by_key = await admin.query_messages_by_key("Q", "key1")
            assert [message.body for message in by_key] == [b"m1", b"m4"]
            viewed = await admin.view_message(results[2].offset_msg_id)
            assert viewed.body == b"m2" and viewed.msg_id == results[2].msg_id
            by_unique = await admin.query_message_by_id(results[3].msg_id, topic="Q")
            assert by_unique.body == b"m3"
            with pytest.raises(MQClientError):
                await admin.query_message_by_id(results[3].msg_id)  # a client id needs the topic
            with pytest.raises(MessageValidationError):
                await admin.view_message("not-an-id")

    run(scenario())


def test_sync_admin_facade() -> None:
    group = FakeGroup()
    loop = EventLoopThread("fake-broker")
    try:
        loop.run(group.start())
        with Admin(fast_client_config(group.namesrv)) as admin:
            admin.create_topic("SyncTopic", read_queue_nums=3, write_queue_nums=3)
            assert "SyncTopic" in admin.list_topics()
            assert len(admin.describe_topic("SyncTopic").subscribe_queues) == 3
            assert admin.max_offset(MessageQueue("SyncTopic", "broker-a", 0)) == 0
            assert admin.consumer_ids("nobody") == []
    finally:
        loop.run(group.stop())
        loop.stop()
