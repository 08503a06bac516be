"""The stock RocketMQ 5.x Node.js SDK (npm ``rocketmq-client-nodejs``) against a three-member raftmq group.

The SDK runs only in ``tests/interop/sdk5_node/driver.js`` subprocesses (:mod:`tests.interop.sdk5_nodejs`
installs it with ``npm ci`` from the lock file); what it sends is read back with our 4.x pull consumer, what
our 4.x producer sends is received by its SimpleConsumer, and what its consumers leave behind is checked with
our generated stubs. One group for the module, a topic and consumer group of its own per test. The group
checks unresolved transactions back quickly and holds long polls briefly (a push consumer's shutdown waits
for its receive in flight), so the module stays fast; otherwise it is the other interop modules' group.
"""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any, Final

import pytest

from broker.v2.messages import fifo_queue_id
from broker.v2.protocol.definition_pb2 import Code
from cli.cluster import LocalCluster
from client.config import ClientConfig, ProducerConfig
from client.message import Message as Message4
from client.producer import AsyncProducer
from protocol.codes import RequestCode, ResponseCode
from tests.broker import wire
from tests.interop import sdk5_nodejs
from tests.interop.harness import run_async
from tests.interop.sdk5 import DriverRun
from tests.interop.test_grpc_v2 import QUEUES, Group, consume
from tests.interop.test_grpc_v2_pop import receive
from tests.support.stores import small_store

pytestmark = pytest.mark.slow

#: member settings beyond the small store: a half is checked back once it is 3 s old, every second (the
#: defaults, 6 s and 60 s, would make the check-back test wait a minute), and long polls last 3 s at most
GROUP_SETTINGS: Final = {"broker": {"transaction_timeout_ms": 3_000, "transaction_check_interval_ms": 1_000,
                                    "long_polling_max_ms": 3_000}}


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Group]:
    sdk5_nodejs.ensure()  # before the group starts: npm ci takes a while on a fresh machine
    with LocalCluster.start(tmp_path_factory.mktemp("grpc-node-group"), nodes=3,
                            overrides=small_store(GROUP_SETTINGS)) as cluster:
        yield Group(cluster)


@pytest.fixture
def topic(request: pytest.FixtureRequest) -> str:
    return "node_" + re.sub(r"[^A-Za-z0-9_-]+", "_", request.node.name.removeprefix("test_")).strip("_")[:100]


def sent(run: DriverRun, count: int) -> list[dict[str, Any]]:
    """The driver's per-message results, every one a success."""
    results = [result for result in run.results if "index" in result]
    assert run.returncode == 0 and len(results) == count, run.describe()
    assert all(result["ok"] for result in results), run.describe()
    return results


def deliveries(run: DriverRun) -> list[dict[str, Any]]:
    """A consumer run's deliveries, in the order they arrived; the run itself ended well."""
    assert run.returncode == 0, run.describe()
    return [result for result in run.results if "body" in result]


def nothing_left(group: Group, consumer_group: str, topic: str, tag: str = "*") -> None:
    """The group has nothing more of ``topic`` to deliver (all acknowledged, nothing due again)."""
    code, messages = receive(group.leader(), consumer_group, topic, invisible_ms=5_000, polling_ms=500, tag=tag)
    assert code == Code.MESSAGE_NOT_FOUND and not messages, [message.body for message in messages]


# ----------------------------------------------------------------------------------------------- tests


def test_normal_sends_are_read_by_a_4x_consumer(group: Group, topic: str) -> None:
    """Tags, keys, user properties and the message id (the UNIQ_KEY a 4.x client reads) cross over; the SDK
    is given a follower's endpoint: it routes there, then sends to the leader the route names."""
    group.create_topic(topic)
    messages: list[dict[str, Any]] = [
        {"body": f"node-{index}", "tag": "TagA" if index % 2 else "TagB", "keys": [f"key-{index}", "shared"],
         "properties": {"origin": "nodejs", "index": str(index)}}
        for index in range(6)]
    results = sent(sdk5_nodejs.produce(group.follower().grpc_address, topic, messages), len(messages))
    read = {message.body.decode(): message for message in consume(group, topic, len(messages))}
    assert sorted(read) == sorted(message["body"] for message in messages)
    for message, result in zip(messages, results, strict=True):
        stored = read[message["body"]]
        assert stored.msg_id == result["message_id"]
        assert stored.tags == message["tag"] and set(stored.keys) == set(message["keys"])
        assert stored.properties["origin"] == "nodejs" and stored.properties["index"] == message["properties"]["index"]
        assert stored.reconsume_times == 0 and stored.sys_flag == 0


def test_fifo_sends_keep_each_message_group_in_order_and_a_fifo_group_consumes_them_so(group: Group,
                                                                                       topic: str) -> None:
    """FIFO sends (a message group each): stored on the group's queue in the order sent (read back with a
    4.x pull); then the SDK's PushConsumer in a consumer group made orderly (as ``raftmq group update
    --orderly`` does; the Settings reply says fifo, so it consumes with its FIFO service) gets each message
    group in that order, every message once."""
    group.create_topic(topic)
    names = ("order-1", "order-2", "order-3")
    messages = [{"body": f"{name}:{step}", "message_group": name} for step in range(4) for name in names]
    sent(sdk5_nodejs.produce(group.leader().grpc_address, topic, messages), len(messages))
    read = consume(group, topic, len(messages))
    assert len(read) == len(messages)
    for name in names:
        mine = [message for message in read if message.body.decode().startswith(name + ":")]
        assert {message.queue_id for message in mine} == {fifo_queue_id(name, QUEUES)}
        # consume() reads each queue in offset order: the order they were stored in
        assert [message.body.decode() for message in mine] == [f"{name}:{step}" for step in range(4)]
        assert all(message.properties["__SHARDINGKEY"] == name for message in mine)
    consumer_group = "GID_node_fifo"
    config = json.dumps({"groupName": consumer_group, "consumeMessageOrderly": True}).encode()
    assert wire.call(group.leader().broker_address, RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, {},
                     config)[0] == ResponseCode.SUCCESS
    run = sdk5_nodejs.push(group.leader().grpc_address, topic, consumer_group, deliveries=len(messages), seconds=30)
    got = deliveries(run)
    assert {"fifo": True} in run.results, run.describe()
    assert sorted(result["body"] for result in got) == sorted(message["body"] for message in messages), run.describe()
    for name in names:
        in_group = [result["body"] for result in got if result["message_group"] == name]
        assert in_group == [f"{name}:{step}" for step in range(4)], run.describe()
    assert all(result["attempt"] == 1 and not result["corrupted"] for result in got), run.describe()
    nothing_left(group, consumer_group, topic)


def test_a_delayed_send_is_delivered_at_its_time(group: Group, topic: str) -> None:
    """The SDK's deliveryTimestamp (a Date, to the millisecond): its SimpleConsumer gets the message that
    was sent at once first, the delayed one not before its time (timers release in the second it is due),
    with the delivery timestamp it was sent with."""
    group.create_topic(topic)
    due_ms = int(time.time() * 1000) + 4_000
    sent(sdk5_nodejs.produce(group.leader().grpc_address, topic, [{"body": "later", "delivery_timestamp_ms": due_ms},
                                                                  {"body": "now"}]), 2)
    run = sdk5_nodejs.consume(group.leader().grpc_address, topic, "GID_node_delay", deliveries=2, seconds=30,
                              invisible_ms=10_000)
    now, later = deliveries(run)
    assert (now["body"], later["body"]) == ("now", "later"), run.describe()
    assert now["received_ms"] < due_ms - 1_000 and now["delivery_timestamp_ms"] is None, run.describe()
    assert later["received_ms"] >= due_ms - 1_000 and later["delivery_timestamp_ms"] == due_ms, run.describe()
    assert later["acked"] and now["acked"] and later["attempt"] == now["attempt"] == 1
    nothing_left(group, "GID_node_delay", topic)


def test_transactions_committed_rolled_back_and_checked_back(group: Group, topic: str) -> None:
    """One producer: a transaction it commits, one it rolls back, and two it leaves unresolved; the leader
    checks those back through the producer's Telemetry stream, its checker answers one commit and the
    other rollback (EndTransaction, source SERVER_CHECK). Only the two commits are ever readable."""
    group.create_topic(topic)
    messages: list[dict[str, Any]] = [{"body": "committed", "transaction": "commit", "keys": ["tx-1"]},
                                      {"body": "rolled back", "transaction": "rollback"},
                                      {"body": "check commit", "transaction": "leave", "keys": ["tx-check"]},
                                      {"body": "check rollback", "transaction": "leave"}]
    run = sdk5_nodejs.produce(group.leader().grpc_address, topic, messages, await_checks=2, await_checks_seconds=30,
                              check_answers={"check rollback": "rollback"})
    results = sent(run, len(messages))
    assert all(result["transaction_id"] for result in results), run.describe()
    ended = [result for result in run.results if "ended" in result]
    assert all(result["ok"] for result in ended), run.describe()
    by_client = sorted((result["ended"], result["resolution"]) for result in ended if result["source"] == "client")
    assert by_client == [("committed", "commit"), ("rolled back", "rollback")], run.describe()
    # a resolved half is never checked back; each unresolved one is, with the transaction it was sent in
    checks = [result for result in run.results if "checked" in result]
    assert {check["checked"] for check in checks} == {"check commit", "check rollback"}, run.describe()
    assert all(check["topic"] == topic for check in checks)
    by_check = {(result["ended"], result["resolution"], result["transaction_id"])
                for result in ended if result["source"] == "server_check"}
    assert by_check == {("check commit", "commit", results[2]["transaction_id"]),
                        ("check rollback", "rollback", results[3]["transaction_id"])}, run.describe()
    read = consume(group, topic, 2)
    assert sorted(message.body for message in read) == [b"check commit", b"committed"]
    for message in read:
        index = 0 if message.body == b"committed" else 2
        assert message.msg_id == results[index]["message_id"] and message.keys == tuple(messages[index]["keys"])
        assert message.prepared_transaction_offset > 0  # the half it came from, as a 4.x commit has it


def test_simple_consumer_acks_changes_invisibility_and_gets_unacked_messages_again(group: Group, topic: str) -> None:
    """The SDK's SimpleConsumer, tag TagA, on what the SDK and our 4.x producer sent (a large 4.x body is
    stored zlib-compressed and arrives inflated). It acknowledges each delivery except: node-1's first (back
    after its 2 s invisible time, attempt 2), node-2's first, whose invisible time it changes to 1 s (back
    once more), node-3's first, whose invisible time it changes to 1.5 s and then acknowledges with the new
    receipt handle the change returned (never back). TagB is never delivered to it."""
    group.create_topic(topic)
    leader = group.leader()
    node_messages: list[dict[str, Any]] = [{"body": f"node-{index}", "tag": "TagA"} for index in range(4)]
    node_messages[0].update(keys=["k0"], properties={"origin": "nodejs"})
    node_messages.append({"body": "node-other-tag", "tag": "TagB"})
    sent(sdk5_nodejs.produce(leader.grpc_address, topic, node_messages), len(node_messages))
    big = "v4-big-" + "x" * 6_000  # over our 4.x producer's compression threshold

    async def produce_4x() -> None:
        async with AsyncProducer(ClientConfig.of(group.cluster.namesrv), ProducerConfig(group="PG_node")) as producer:
            for body in ("v4-0", big):
                await producer.send(Message4(topic=topic, body=body.encode(), tags="TagA", keys=("k4",)))

    run_async(produce_4x())
    run = sdk5_nodejs.consume(leader.grpc_address, topic, "GID_node_simple", deliveries=8, seconds=40,
                              invisible_ms=2_000, tag="TagA", no_ack_first=["node-1"],
                              change_invisible_first={"node-2": 1_000, "node-3": 1_500}, ack_after_change=["node-3"])
    got = deliveries(run)
    assert all(not result["ack_error"] and not result["corrupted"] for result in got), run.describe()
    assert Counter((result["body"], result["attempt"], result["acked"], result["changed"]) for result in got) == Counter([
        ("node-0", 1, True, False), ("node-1", 1, False, False), ("node-1", 2, True, False),
        ("node-2", 1, False, True), ("node-2", 2, True, False), ("node-3", 1, True, True),
        ("v4-0", 1, True, False), (big, 1, True, False)]), run.describe()
    assert all(result["tag"] == "TagA" for result in got)
    first = {result["body"]: result for result in got if result["attempt"] == 1}
    assert first["node-0"]["keys"] == ["k0"] and first["node-0"]["properties"] == {"origin": "nodejs"}
    assert first["v4-0"]["keys"] == first[big]["keys"] == ["k4"]
    # node-3's 1.5 s are long over: had the acknowledgement with the new handle been lost, it would be back
    nothing_left(group, "GID_node_simple", topic, tag="TagA")


def test_push_consumer_gets_only_the_tags_it_subscribed(group: Group, topic: str) -> None:
    """The SDK's PushConsumer (QueryAssignment, auto-renewed receives, acks) subscribed to "TagA||TagC"
    consumes each such message once and never one of TagB; it acknowledged everything it consumed."""
    group.create_topic(topic)
    tags = ("TagA", "TagB", "TagC")
    messages = [{"body": f"push-{index}-{tags[index % 3]}", "tag": tags[index % 3]} for index in range(9)]
    sent(sdk5_nodejs.produce(group.leader().grpc_address, topic, messages), len(messages))
    run = sdk5_nodejs.push(group.leader().grpc_address, topic, "GID_node_push", deliveries=6, seconds=30,
                           tag="TagA||TagC")
    got = deliveries(run)
    assert {"fifo": False} in run.results, run.describe()
    wanted = sorted(message["body"] for message in messages if message["tag"] != "TagB")
    assert sorted(result["body"] for result in got) == wanted, run.describe()
    assert all(result["attempt"] == 1 and not result["corrupted"] for result in got), run.describe()
    assert all(result["tag"] == result["body"].rsplit("-", 1)[1] for result in got)
    nothing_left(group, "GID_node_push", topic, tag="TagA||TagC")
