"""The SDK against a real three-node group (name server + broker processes on loopback): sends of every
kind, admin, push and lite-pull consumers with offsets on the broker, a redelivery through the retry
topic, and a leader kill that loses no acknowledged message. One cluster for the module."""

from __future__ import annotations

import asyncio
import json
import signal
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from cli.cluster import LocalCluster
from client import (
    Admin,
    ClientConfig,
    ConsumeConcurrentlyStatus,
    ConsumeContext,
    ConsumerConfig,
    LitePullConsumer,
    LocalTransactionState,
    Message,
    MessageExt,
    MessageQueue,
    MQBrokerError,
    Producer,
    ProducerConfig,
    PullConsumer,
    PushConsumer,
    SendResult,
    SendStatus,
    TransactionProducer,
    select_by_sharding_key,
)
from client.producer import AsyncProducer
from client.unique_id import month_start_ms
from protocol.codes import RequestCode, ResponseCode
from tests.broker import wire
from tests.support.stores import small_store
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    # transaction check-backs a second after a half message, not RocketMQ's 6 s / 60 s
    overrides = small_store({"broker": {"transaction_timeout_ms": 1000,
                                        "transaction_check_interval_ms": 500}})
    with LocalCluster.start(tmp_path_factory.mktemp("client-cluster"), overrides=overrides) as started:
        yield started


def client_config(cluster: LocalCluster) -> ClientConfig:
    return ClientConfig(
        (cluster.namesrv,),
        client_ip="127.0.0.1",
        request_timeout_seconds=2.0,
        route_refresh_interval_seconds=2.0,
        heartbeat_interval_seconds=2.0,
    )


def consumer_config(group: str, **overrides: object) -> ConsumerConfig:
    values: dict[str, object] = {
        "group": group,
        "consume_from_where": "CONSUME_FROM_FIRST_OFFSET",
        "suspend_timeout_seconds": 1.0,
        "pull_backoff_seconds": 0.1,
        "rebalance_interval_seconds": 1.0,
        "persist_offsets_interval_seconds": 0.5,
    }
    values.update(overrides)
    return ConsumerConfig.from_mapping(values)


def test_sends_admin_and_push_consumer(cluster: LocalCluster) -> None:
    config = client_config(cluster)
    with Admin(config) as admin, Producer(config, ProducerConfig(group="it-producer")) as producer:
        admin.create_topic("ItOrders", read_queue_nums=4, write_queue_nums=4)
        assert len(admin.describe_topic("ItOrders").publish_queues) == 4
        sent = [producer.send(Message("ItOrders", f"m{i}".encode(), tags="T", keys=(f"key-{i}",))) for i in range(10)]
        assert {result.status for result in sent} == {SendStatus.SEND_OK}
        batch = producer.send_batch([Message("ItOrders", f"b{i}".encode()) for i in range(5)])
        assert len(batch.msg_ids) == 5
        for step in range(3):
            producer.send_orderly(Message("ItOrders", f"o{step}".encode(), sharding_key="order-9"),
                                  select_by_sharding_key)
        futures = [producer.send_async(Message("ItOrders", f"a{i}".encode())) for i in range(10)]
        assert all(future.result(30).status is SendStatus.SEND_OK for future in futures)
        assert sum(entry.max_offset for entry in admin.topic_offsets("ItOrders")) == 28
        (found,) = admin.query_messages_by_key("ItOrders", "key-3")
        assert found.body == b"m3" and found.msg_id == sent[3].msg_id
        assert admin.view_message(sent[4].offset_msg_id).body == b"m4"

        received: dict[str, bytes] = {}
        consumer = PushConsumer(config, consumer_config("it-push"),
                                listener=lambda messages, context: received.update((m.msg_id, m.body) for m in messages))
        consumer.subscribe("ItOrders")
        with consumer:
            wait_for(lambda: len(received) == 28, "28 consumed messages", timeout_seconds=30.0)
            wait_for(lambda: admin.consumer_progress("it-push", ["ItOrders"]).total_lag == 0,
                     "offsets committed", timeout_seconds=30.0)
        assert set(received) >= {result.msg_id for result in sent}
        assert admin.consumer_ids("it-push") == []  # unregistered at close


def test_consumer_running_info_through_the_broker(cluster: LocalCluster) -> None:
    """GET_CONSUMER_RUNNING_INFO, as ``mqadmin consumerStatus`` sends it: the broker asks the consumer over
    its own connection and passes its answer back."""
    config = client_config(cluster)
    with Admin(config) as admin, Producer(config, ProducerConfig(group="it-info-producer")) as producer:
        admin.create_topic("ItInfo", read_queue_nums=2, write_queue_nums=2)
        for index in range(6):
            producer.send(Message("ItInfo", f"i{index}".encode(), tags="T"))
        received: list[MessageExt] = []
        consumer = PushConsumer(config, consumer_config("it-info"),
                                listener=lambda messages, context: received.extend(messages))
        consumer.subscribe("ItInfo", "T")
        with consumer:
            wait_for(lambda: len(received) == 6, "6 consumed messages", timeout_seconds=30.0)
            wait_for(lambda: sum(offset for queue, offset in consumer.offsets().items() if queue.topic == "ItInfo")
                     == 6, "the consumed offsets recorded", timeout_seconds=30.0)
            (client_id,) = admin.consumer_ids("it-info")
            info = admin.consumer_running_info("it-info", client_id, jstack=True)
            assert info.client_id == client_id
            assert info.properties["PROP_CONSUME_TYPE"] == "CONSUME_PASSIVELY"
            assert info.properties["PROP_CONSUMEORDERLY"] == "false"
            assert info.properties["consumerGroup"] == "it-info"
            assert {(entry["topic"], entry["subString"]) for entry in info.subscriptions} == {
                ("ItInfo", "T"), ("%RETRY%it-info", "*")}
            broker = admin.describe_topic("ItInfo").subscribe_queues[0].broker_name
            mine = {queue: row for queue, row in info.queues.items() if queue.topic == "ItInfo"}
            assert set(mine) == {MessageQueue("ItInfo", broker, 0), MessageQueue("ItInfo", broker, 1)}
            assert sum(int(row["commitOffset"]) for row in mine.values()) == 6  # all consumed, nothing cached
            assert all(row["cachedMsgCount"] == 0 and row["lastPullTimestamp"] > 0 for row in mine.values())
            assert any(row["lastConsumeTimestamp"] > 0 for row in mine.values())
            status = info.status["ItInfo"]
            assert status["pullTPS"] > 0 and status["consumeOKTPS"] > 0 and status["consumeFailedMsgs"] == 0
            assert "task" in info.jstack and "rebalance it-info" in info.jstack
            assert admin.consumer_running_info("it-info", client_id).jstack == ""
            with pytest.raises(MQBrokerError, match="The Consumer <it-info> <nobody@0> not online"):
                admin.consumer_running_info("it-info", "nobody@0")
            # what mqadmin topicStatus, consumerProgress, consumerConnection and producerConnection read
            topic_stats = admin.topic_stats("ItInfo")
            assert [row.queue for row in topic_stats] == sorted(mine)
            assert sum(row.max_offset for row in topic_stats) == 6 and all(row.min_offset == 0 for row in topic_stats)
            assert all((row.last_update_ms > 0) == (row.max_offset > 0) for row in topic_stats)
            consumer.persist_offsets()
            consume_stats = admin.consume_stats("it-info", "ItInfo")
            assert [(row.queue, row.broker_offset, row.consumer_offset, row.lag) for row in consume_stats] == [
                (row.queue, row.max_offset, row.max_offset, 0) for row in topic_stats]
            assert [row.last_timestamp_ms for row in consume_stats] == [row.last_update_ms for row in topic_stats]
            assert {row.queue.topic for row in admin.consume_stats("it-info")} <= {"ItInfo", "%RETRY%it-info"}
            # 6 messages served to the group's pulls within the last minute (the leader's own count)
            assert 6 / 20 < admin.consume_tps("it-info", "ItInfo") <= 6 / 10
            assert admin.consume_tps("it-info") == pytest.approx(admin.consume_tps("it-info", "ItInfo"), rel=0.01)
            connection = admin.consumer_connections("it-info")
            assert [(entry.client_id, entry.language) for entry in connection.connections] == [(client_id, "PYTHON")]
            assert connection.connections[0].address.startswith("127.0.0.1:")
            assert set(connection.subscriptions) == {"ItInfo", "%RETRY%it-info"}
            assert connection.subscriptions["ItInfo"]["subString"] == "T"
            assert (connection.consume_type, connection.message_model, connection.consume_from_where) == (
                "CONSUME_PASSIVELY", "CLUSTERING", "CONSUME_FROM_FIRST_OFFSET")
            with pytest.raises(MQBrokerError, match="the consumer group\\[nobody\\] not online"):
                admin.consumer_connections("nobody")
        producers = admin.producer_connections("it-info-producer")
        assert len(producers) == 1 and producers[0].language == "PYTHON"
        with pytest.raises(MQBrokerError, match="the producer group\\[nobody\\] not exist"):
            admin.producer_connections("nobody")
        # a pull consumer keeps queues and offsets itself: it reports its configuration and topics only
        with PullConsumer(config, consumer_config("it-info-pull")) as puller:
            puller.pull(MessageQueue("ItInfo", broker, 0), offset=0)
            (pull_id,) = wait_for(lambda: admin.consumer_ids("it-info-pull"), "the pull consumer's heartbeat",
                                  timeout_seconds=30.0)
            info = admin.consumer_running_info("it-info-pull", pull_id)
            assert info.properties["PROP_CONSUME_TYPE"] == "CONSUME_ACTIVELY"
            assert [entry["topic"] for entry in info.subscriptions] == ["ItInfo"]
            assert info.queues == {} and info.status == {}


def test_reconsume_later_is_redelivered_through_the_retry_topic(cluster: LocalCluster) -> None:
    config = client_config(cluster)
    with Producer(config, ProducerConfig(group="it-producer")) as producer:
        result = producer.send(Message("ItRetry", b"try me"))
    deliveries: list[MessageExt] = []

    def listener(messages: list[MessageExt], context: ConsumeContext) -> ConsumeConcurrentlyStatus:
        deliveries.extend(messages)
        if len(deliveries) == 1:
            context.delay_level_when_next_consume = 1  # 1 s
            return ConsumeConcurrentlyStatus.RECONSUME_LATER
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

    consumer = PushConsumer(config, consumer_config("it-retry"), listener=listener)
    consumer.subscribe("ItRetry")
    with consumer:
        wait_for(lambda: len(deliveries) >= 2, "the redelivery", timeout_seconds=30.0)
    again = deliveries[1]
    assert again.topic == "ItRetry" and again.msg_id == result.msg_id and again.reconsume_times == 1


def test_a_leader_kill_loses_no_acknowledged_message(cluster: LocalCluster, tmp_path: Path) -> None:
    config = client_config(cluster)
    acknowledged: list[str] = []
    with Producer(config, ProducerConfig(group="it-failover", send_timeout_seconds=30.0)) as producer:
        for index in range(20):
            acknowledged.append(producer.send(Message("ItFailover", f"before-{index}".encode())).msg_id)
        leader = cluster.leader_id()
        assert leader is not None
        cluster.kill(leader, signal.SIGKILL)
        acknowledged.append(producer.send(Message("ItFailover", b"during")).msg_id)  # rides out the election
        for index in range(20):
            acknowledged.append(producer.send(Message("ItFailover", f"after-{index}".encode())).msg_id)
    seen: set[str] = set()
    with LitePullConsumer(config, consumer_config("it-failover-reader")) as reader:
        reader.subscribe("ItFailover")

        def read_more() -> bool:
            seen.update(message.msg_id for message in reader.poll(0.5))
            return set(acknowledged) <= seen

        wait_for(read_more, "every acknowledged message", timeout_seconds=30.0)
    cluster.restart(leader)
    # the tests after this one call every member directly: the group is whole again only once it serves
    restarted = cluster.info.node(leader).broker_address
    wait_for(lambda: serves(restarted), f"{leader} serving again after its restart", timeout_seconds=60.0)


def serves(address: str) -> bool:
    try:
        code, _, _ = wire.call(address, RequestCode.GET_BROKER_RUNTIME_INFO)
    except OSError:
        return False
    return code == ResponseCode.SUCCESS


class _Transactions:
    def __init__(self) -> None:
        self.checked: list[MessageExt] = []

    def execute_local_transaction(self, message: Message, arg: object) -> LocalTransactionState:
        return {"commit": LocalTransactionState.COMMIT_MESSAGE, "rollback": LocalTransactionState.ROLLBACK_MESSAGE,
                "later": LocalTransactionState.UNKNOW}[str(arg)]

    def check_local_transaction(self, message: MessageExt) -> LocalTransactionState:
        self.checked.append(message)
        return LocalTransactionState.COMMIT_MESSAGE


def test_transactions_commit_roll_back_and_answer_check_backs(cluster: LocalCluster) -> None:
    config = client_config(cluster)
    listener = _Transactions()
    with TransactionProducer(config, ProducerConfig(group="it-tx"), listener=listener) as producer:
        committed = producer.send_message_in_transaction(Message("ItTx", b"commit"), "commit")
        producer.send_message_in_transaction(Message("ItTx", b"rollback"), "rollback")
        # left open: the broker checks back once the transaction timeout (1 s here) passed
        later = producer.send_message_in_transaction(Message("ItTx", b"later"), "later")
        seen: dict[str, bytes] = {}
        with LitePullConsumer(config, consumer_config("it-tx-reader")) as reader:
            reader.subscribe("ItTx")

            def read_more() -> bool:
                seen.update((m.msg_id, m.body) for m in reader.poll(0.5))
                return later.msg_id in seen

            wait_for(read_more, "the checked-back transaction", timeout_seconds=30.0)
    assert seen[committed.msg_id] == b"commit" and seen[later.msg_id] == b"later"
    assert b"rollback" not in seen.values()
    assert [message.msg_id for message in listener.checked][:1] == [later.msg_id]


def test_more_than_65536_sends_of_one_producer_within_the_dedupe_window_are_all_stored(cluster: LocalCluster) -> None:
    """From the 25th of each month (2^31 ms into it) our ids stopped changing but for their 16-bit counter:
    one producer's 65,537th send within the dedupe window was taken for a retry and never stored. The
    producer's clock is frozen there (the time field can only change by running out of counter values)."""
    frozen_ms = month_start_ms(1_700_000_000_000)[0] + 2**31 + 1_000
    config = client_config(cluster)
    count, batch_size = 70_000, 500
    ids: set[str] = set()
    with Admin(config) as admin, Producer(config, ProducerConfig(group="it-many"), clock_ms=lambda: frozen_ms) as producer:
        admin.create_topic("ItMany", read_queue_nums=4, write_queue_nums=4)
        before = collisions(cluster)
        for start in range(0, count, batch_size):
            messages = [Message("ItMany", f"m{number}".encode()) for number in range(start, start + batch_size)]
            result = producer.send_batch(messages)
            assert result.status is SendStatus.SEND_OK and len(result.msg_ids) == batch_size
            ids.update(message.unique_id or "" for message in messages)
        assert len(ids) == count  # no id repeated
        assert sum(entry.max_offset for entry in admin.topic_offsets("ItMany")) == count
        assert collisions(cluster) == before  # and none stored as a collision either


def collisions(cluster: LocalCluster) -> int:
    """uniqKeyCollisions summed over the members (GET_BROKER_RUNTIME_INFO)."""
    total = 0
    for node in cluster.info.nodes:
        code, _, body = wire.call(node.broker_address, RequestCode.GET_BROKER_RUNTIME_INFO)
        assert code == ResponseCode.SUCCESS
        total += int(json.loads(body)["table"]["uniqKeyCollisions"])
    return total


def test_coalesced_sends_are_stored_where_each_result_says(cluster: LocalCluster) -> None:
    """Concurrent sends leave as batch requests (client/coalesce.py): every caller's result names its own
    message, its queue offset and its offset message id, exactly as the broker stored it."""
    config = client_config(cluster)
    messages = [Message("ItCoalesce", f"c{index}".encode(), tags=f"t{index % 2}", keys=(f"ck{index}",))
                for index in range(200)]

    async def send_all() -> tuple[list[SendResult], int]:
        async with AsyncProducer(config, ProducerConfig(group="it-coalesce")) as producer:
            await producer.send(Message("ItCoalesce", b"warm-up"))  # the route: the rest park in one loop turn
            results = await asyncio.gather(*(producer.send(message) for message in messages))
            assert producer._coalescer is not None
            return list(results), producer._coalescer.batches

    with Admin(config) as admin, PullConsumer(config, consumer_config("it-coalesce-reader")) as reader:
        admin.create_topic("ItCoalesce", read_queue_nums=4, write_queue_nums=4)
        results, batches = asyncio.run(send_all())
        assert batches >= 4  # one batch per queue at least: it did coalesce
        stored: dict[str, MessageExt] = {}
        for queue in reader.fetch_subscribe_queues("ItCoalesce"):
            offset = 0
            while True:
                pulled = reader.pull(queue, "*", offset, 32)
                if not pulled.messages:
                    break
                stored.update((message.msg_id, message) for message in pulled.messages)
                offset = pulled.next_begin_offset
        assert len(stored) == 201
        for message, result in zip(messages, results, strict=True):
            found = stored[result.msg_id]
            assert result.msg_id == message.unique_id
            assert found.body == message.body and found.tags == message.tags
            assert (found.queue_id, found.queue_offset) == (result.message_queue.queue_id, result.queue_offset)
            assert found.offset_msg_id == result.offset_msg_id
        assert sorted(set(Counter(result.message_queue.queue_id for result in results).values())) == [50]
