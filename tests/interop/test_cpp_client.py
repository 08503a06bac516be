"""The stock C++ client (PyPI ``rocketmq==0.4.4``, librocketmq 1.2.x) against a three-node raftmq group.

One group for the module, started as users start it (``cli.cluster.LocalCluster``; small store files
save the disk), and a fresh topic of four queues per test, created with UPDATE_AND_CREATE_TOPIC as
``mqadmin updateTopic`` does. The client runs only in :mod:`tests.interop.cpp_driver` subprocesses.
Every test checks that each acknowledged message is consumed exactly once per consumer group, with
what was sent (tags, keys, message id, queue offset), in queue order; orderly tests also check the order
of each sharding key.

Nothing here sleeps to wait: consumers report which queues they pull (from the native client's log)
and the tests poll for that, for deliveries and for offsets, each with a deadline.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import pytest
from click.testing import CliRunner

from cli.cluster import LocalCluster
from cli.main import main as cli_main
from client.running_info import decode_running_info
from protocol.codes import RequestCode, ResponseCode
from tests.interop.harness import (
    REPOSITORY,
    Driver,
    DriverPool,
    Event,
    assignment,
    bodies,
    call,
    check_deliveries,
    consumer_offset,
    create_topic,
    describe,
    lock_batch,
    locked_queue_ids,
    master_address,
    max_offset,
    route,
)
from tests.support.stores import small_store
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow

QUEUES: Final = 4
MESSAGES: Final = 40
SEED: Final = 20_240_611
#: a C++ process: start, route lookup, sends or a rebalance; generous for 2 shared cores
PROCESS_SECONDS: Final = 60.0
#: delay level 1 is 1 s in RocketMQ's default table ("1s 5s 10s 30s 1m ...")
DELAY_LEVEL: Final = 1
DELAY_MILLISECONDS: Final = 1000


@dataclass(frozen=True)
class Group:
    """The module's raftmq group, as a client sees it: a name server address."""

    cluster: LocalCluster

    @property
    def namesrv(self) -> str:
        return self.cluster.namesrv

    def create_topic(self, topic: str, queues: int = QUEUES) -> str:
        """Create ``topic`` on the leader and wait until the name server routes it; the master's address."""

        def created() -> bool:
            leader = self.cluster.leader_id()
            if leader is None:
                return False
            response = create_topic(self.cluster.broker_address(leader), topic, queues)
            return response.code == ResponseCode.SUCCESS

        wait_for(created, f"the leader to create topic {topic}", timeout_seconds=30.0)

        def routed() -> str | None:
            data = route(self.namesrv, topic)
            if data is None or not any(queue.get("writeQueueNums") == queues for queue in data["queueDatas"]):
                return None
            return master_address(data)

        return wait_for(routed, f"the name server to route {topic} with {queues} queues",
                        timeout_seconds=30.0)


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Group]:
    directory = tmp_path_factory.mktemp("cpp-group")
    with LocalCluster.start(directory, nodes=3, overrides=small_store()) as cluster:
        yield Group(cluster)


# --------------------------------------------------------------------------------------------- helpers


def produce(drivers: DriverPool, group: Group, topic: str, mode: str, count: int = MESSAGES,
            name: str = "producer", **options: object) -> list[Event]:
    """Run a producer to the end; its ``ack`` (or, oneway, ``sent``) events, one per message."""
    producer = drivers.start(name, "produce", namesrv=group.namesrv, topic=topic, group=f"{topic}_producers",
                             mode=mode, count=count, run=topic, seed=SEED, **options)
    status = producer.wait_exit(PROCESS_SECONDS)
    errors = producer.events("error")
    assert status == 0 and not errors, f"{mode} producer exited {status}; errors: {errors[:5]}"
    sent = producer.events("ack") + producer.events("sent")
    assert len(sent) == count, f"{len(sent)} of {count} sends acknowledged"
    return sent


def consumer(drivers: DriverPool, group: Group, name: str, topic: str, consumer_group: str,
             **options: object) -> Driver:
    return drivers.start(name, "consume", namesrv=group.namesrv, topic=topic, group=consumer_group,
                         instance=name, **options)


def fail_on(problems: list[str]) -> None:
    if problems:
        pytest.fail("\n".join(problems), pytrace=False)


def finished(readers: list[Driver]) -> list[str]:
    """Wait for consumers started with ``expect``; a problem for each that did not see them all."""
    return [f"{reader.name} exited {status} without seeing every message it expected"
            for reader in readers if (status := reader.wait_exit(PROCESS_SECONDS)) != 0]


def deliveries_cover(drivers: list[Driver], wanted: set[str]) -> bool:
    return wanted <= {str(event["body"]) for driver in drivers for event in driver.events("delivery")}


# ------------------------------------------------------------------------------------------ no route


def test_producer_without_a_route_fails_cleanly(drivers: DriverPool, tmp_path: Path) -> None:
    """A bare name server (no broker, no route): every send of every mode fails with an error, and
    the process exits on its own without crashing or hanging."""
    output = tmp_path / "namesrv.out"
    with output.open("wb") as stdout, (tmp_path / "namesrv.err").open("wb") as stderr:
        namesrv = subprocess.Popen([sys.executable, "-m", "broker.namesrv", "--port", "0"], cwd=REPOSITORY,
                                   stdout=stdout, stderr=stderr, stdin=subprocess.DEVNULL)
    try:

        def listening() -> str | None:
            assert namesrv.poll() is None, f"the name server exited with {namesrv.returncode}"
            line = output.read_text()
            return f"127.0.0.1:{json.loads(line)['port']}" if line.endswith("\n") else None

        address = wait_for(listening, "the name server to listen", timeout_seconds=30.0)
        modes = ("sync", "async", "oneway", "batch", "orderly")
        producers = [drivers.start(f"producer-{mode}", "produce", namesrv=address, topic="interop_no_route",
                                   group="interop_no_route_producers", mode=mode, count=2, send_timeout_ms=1000)
                     for mode in modes]
        for mode, producer in zip(modes, producers, strict=True):
            status = producer.wait_exit(PROCESS_SECONDS)
            assert status == 1, f"{mode}: exit status {status} (1 = sends failed, negative = killed by a signal)"
            assert not producer.events("ack"), f"{mode}: acknowledged without a route"
            failed = {event["index"] for event in producer.events("error") if "index" in event}
            assert failed == {0, 1}, f"{mode}: error events for {failed}, expected both sends"
            assert producer.events("stopped"), f"{mode}: the client's shutdown did not finish"
    finally:
        namesrv.terminate()
        try:
            namesrv.wait(timeout=10)
        except subprocess.TimeoutExpired:
            namesrv.kill()
            namesrv.wait()


# -------------------------------------------------------------------------------------- send modes


@pytest.mark.parametrize("mode", ["sync", "async", "oneway", "batch"])
def test_send_mode(mode: str, group: Group, drivers: DriverPool, topic: str) -> None:
    group.create_topic(topic)
    sent = produce(drivers, group, topic, mode, tags="TagA,TagB,TagC")
    reader = consumer(drivers, group, "consumer", topic, f"{topic}_consumers", expect=len(sent), threads=1)
    problems = finished([reader])
    deliveries = reader.events("delivery")
    problems += check_deliveries(sent, {"consumer": deliveries})
    if mode == "batch":
        # a batch goes to one queue, its messages at consecutive offsets
        delivered = {event["body"]: event for event in deliveries}
        by_index = {event["index"]: event for event in sent}
        for event in sent:
            head, member = delivered.get(by_index[event["batch_start"]]["body"]), delivered.get(event["body"])
            if head and member and (member["queue_id"], member["queue_offset"]) != (
                    head["queue_id"], head["queue_offset"] + event["index"] - event["batch_start"]):
                problems.append(f"batch member {event['body']} at {member['queue_id']}/{member['queue_offset']}, "
                                f"its batch starts at {head['queue_id']}/{head['queue_offset']}")
    fail_on(problems)


# ------------------------------------------------------------------------------------------ orderly


def test_orderly_send_and_orderly_consumer_with_queue_locks(group: Group, drivers: DriverPool, topic: str) -> None:
    """Orderly sends with sharding keys (queue = key % 4) read by an orderly consumer, which locks each
    queue at the broker before pulling: another client of the group cannot lock those queues while
    it runs, and can once it shut down (it unlocks)."""
    master = group.create_topic(topic)
    consumer_group = f"{topic}_consumers"
    sent = produce(drivers, group, topic, "orderly", shards=6, tags="TagA,TagB")
    assert {event["queue_id"] for event in sent} == set(range(QUEUES))
    reader = consumer(drivers, group, "orderly-consumer", topic, consumer_group, orderly=True)
    wait_for(lambda: deliveries_cover([reader], bodies(sent)), "the orderly consumer to get all",
             timeout_seconds=PROCESS_SECONDS)
    # the driver reports lock successes from the native log, a little after they happen
    wait_for(lambda: {int(event["queue_id"]) for event in reader.events("queue_locked")} == set(range(QUEUES)),
             "the consumer's log to show it locked every queue", timeout_seconds=PROCESS_SECONDS)
    broker_name = reader.events("queue_locked")[0]["broker_name"]
    queues = [(topic, broker_name, queue_id) for queue_id in range(QUEUES)]
    intruder = "interop-intruder@127.0.0.1"
    taken = locked_queue_ids(lock_batch(master, RequestCode.LOCK_BATCH_MQ, consumer_group, intruder, queues))
    assert taken == set(), f"another client of the group locked queues {taken} the consumer holds"
    other_group = locked_queue_ids(lock_batch(master, RequestCode.LOCK_BATCH_MQ, f"{topic}_others", intruder, queues))
    assert other_group == set(range(QUEUES)), f"a different group could lock only {other_group}"
    lock_batch(master, RequestCode.UNLOCK_BATCH_MQ, f"{topic}_others", intruder, queues)

    assert reader.stop() == 0, "the orderly consumer did not shut down cleanly"
    fail_on(check_deliveries(sent, {"orderly-consumer": reader.events("delivery")}, orderly=True))
    # librocketmq 1.2.x's unlockAll leaves out the first queue of its table (see README): only the
    # queues its log says it unlocked are expected free
    unlocked = {int(event["queue_id"]) for event in reader.events("queue_unlocked")}
    assert unlocked, "the consumer logged no unlock at shutdown"
    taken = locked_queue_ids(lock_batch(master, RequestCode.LOCK_BATCH_MQ, consumer_group, intruder, queues))
    assert unlocked <= taken, f"after the consumer unlocked {unlocked}, another client could lock only {taken}"
    lock_batch(master, RequestCode.UNLOCK_BATCH_MQ, consumer_group, intruder, queues)


# ----------------------------------------------------------------------------------- message models


def test_clustering_consumers_share_the_queues(group: Group, drivers: DriverPool, topic: str) -> None:
    """Two consumers of one group split the four queues and each message reaches exactly one of them.
    Then one leaves (a clean shutdown, as in a rolling restart): the other takes its queues over at
    the offsets it committed, the queues' ends, so nothing is consumed twice."""
    master = group.create_topic(topic)
    consumer_group = f"{topic}_consumers"
    first = consumer(drivers, group, "consumer-a", topic, consumer_group, threads=1)
    second = consumer(drivers, group, "consumer-b", topic, consumer_group, threads=1)

    def split() -> bool:
        mine, theirs = assignment(first), assignment(second)
        return bool(mine and theirs and not mine & theirs and mine | theirs == set(range(QUEUES)))

    wait_for(split, "the two consumers to split the queues between them", timeout_seconds=PROCESS_SECONDS)
    first_queues = assignment(first)
    sent = produce(drivers, group, topic, "sync", tags="TagA")
    wait_for(lambda: deliveries_cover([first, second], bodies(sent)), "all deliveries",
             timeout_seconds=PROCESS_SECONDS)
    ends = {queue_id: max_offset(master, topic, queue_id).ext_fields.get("offset") for queue_id in range(QUEUES)}

    assert first.stop() == 0, "consumer-a did not shut down cleanly"
    wait_for(lambda: assignment(second) == set(range(QUEUES)), "consumer-b to take over consumer-a's queues",
             timeout_seconds=PROCESS_SECONDS)
    resumed = {int(event["queue_id"]): int(event["offset"]) for event in second.events("queue_added")
               if int(event["queue_id"]) in first_queues}
    assert second.stop() == 0, "consumer-b did not shut down cleanly"

    deliveries = {"consumer-a": first.events("delivery"), "consumer-b": second.events("delivery")}
    problems = check_deliveries(sent, deliveries)
    for queue_id, offset in sorted(resumed.items()):
        if str(offset) != ends[queue_id]:
            problems.append(f"consumer-b took queue {queue_id} over at offset {offset}; consumer-a had consumed "
                            f"it to its end, {ends[queue_id]}, and committed that at shutdown")
    before_leaving = {name: [event for event in events if name == "consumer-a" or int(event["queue_id"]) not in
                             first_queues] for name, events in deliveries.items()}
    if not before_leaving["consumer-a"] or not before_leaving["consumer-b"]:
        problems.append(f"one consumer got nothing while both ran: {[(k, len(v)) for k, v in before_leaving.items()]}")
    fail_on(problems)

    def committed() -> list[str]:
        wrong = []
        for queue_id in range(QUEUES):
            offset = consumer_offset(master, consumer_group, topic, queue_id)
            if offset.code != ResponseCode.SUCCESS or offset.ext_fields.get("offset") != ends[queue_id]:
                wrong.append(f"queue {queue_id}: committed {describe(offset)}; max offset {ends[queue_id]}")
        return wrong

    try:
        wait_for(lambda: not committed(), "the committed offsets to reach the queue ends",
                 timeout_seconds=15.0)
    except AssertionError:
        fail_on(committed())


def test_consumer_running_info_from_a_cpp_consumer(group: Group, drivers: DriverPool, topic: str) -> None:
    """``mqadmin consumerStatus`` of a C++ consumer: the broker passes GET_CONSUMER_RUNNING_INFO to it over
    its connection, and its answer (queue objects as keys, int64 fields as strings, some timestamps left
    uninitialized) reads back, through the admin API and ``raftmq group status``."""
    master = group.create_topic(topic)
    consumer_group = f"{topic}_consumers"
    reader = consumer(drivers, group, "consumer", topic, consumer_group, threads=1)
    wait_for(lambda: assignment(reader) == set(range(QUEUES)), "the consumer to hold the queues",
             timeout_seconds=PROCESS_SECONDS)
    listed = call(master, RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": consumer_group})
    (client_id,) = json.loads(listed.body)["consumerIdList"]
    answer = call(master, RequestCode.GET_CONSUMER_RUNNING_INFO,
                  {"consumerGroup": consumer_group, "clientId": client_id, "jstackEnable": "false"})
    assert answer.code == ResponseCode.SUCCESS, describe(answer)
    info = decode_running_info(client_id, answer.body)
    assert {queue.queue_id for queue in info.queues if queue.topic == topic} == set(range(QUEUES))
    assert info.properties["PROP_CONSUME_TYPE"] == "CONSUME_PASSIVELY"
    assert topic in {entry["topic"] for entry in info.subscriptions}
    # mqadmin consumerConnection: its heartbeat's integer enums read back as Java's names
    connections = call(master, RequestCode.GET_CONSUMER_CONNECTION_LIST, {"consumerGroup": consumer_group})
    assert connections.code == ResponseCode.SUCCESS, describe(connections)
    listed_connections = json.loads(connections.body)
    assert [(entry["clientId"], entry["language"]) for entry in listed_connections["connectionSet"]] == [
        (client_id, "CPP")]
    assert (listed_connections["consumeType"], listed_connections["messageModel"],
            listed_connections["consumeFromWhere"]) == ("CONSUME_PASSIVELY", "CLUSTERING", "CONSUME_FROM_LAST_OFFSET")
    assert topic in listed_connections["subscriptionTable"]
    wrong_group = call(master, RequestCode.GET_CONSUMER_RUNNING_INFO,
                       {"consumerGroup": "nobody", "clientId": client_id, "jstackEnable": "false"})
    assert wrong_group.code == ResponseCode.SYSTEM_ERROR and "not online" in (wrong_group.remark or "")

    for extra in (["--json"], []):
        result = CliRunner().invoke(cli_main, ["group", "status", consumer_group, "--namesrv", group.namesrv, *extra])
        assert result.exit_code == 0, result.output
    report = json.loads(CliRunner().invoke(
        cli_main, ["group", "status", consumer_group, "--namesrv", group.namesrv, "--json"]).stdout)
    assert [member["clientId"] for member in report["consumers"]] == [client_id]
    assert reader.stop() == 0, "the consumer did not shut down cleanly"


def test_broadcasting_consumers_each_get_everything(group: Group, drivers: DriverPool, topic: str) -> None:
    group.create_topic(topic)
    consumer_group = f"{topic}_consumers"
    # broadcasting consumers without local offsets start at the queues' max offsets: start them first
    readers = [consumer(drivers, group, name, topic, consumer_group, model="broadcasting", expect=MESSAGES,
                        threads=1) for name in ("consumer-a", "consumer-b")]
    wait_for(lambda: all(assignment(reader) == set(range(QUEUES)) for reader in readers),
             "both broadcasting consumers to pull every queue",
             timeout_seconds=PROCESS_SECONDS)
    sent = produce(drivers, group, topic, "sync", tags="TagA,TagB")
    problems = finished(readers)
    for reader in readers:
        problems += check_deliveries(sent, {reader.name: reader.events("delivery")})
    fail_on(problems)


# --------------------------------------------------------------------------------------------- tags


def test_tag_filtering(group: Group, drivers: DriverPool, topic: str) -> None:
    """Two groups with different tag expressions each get exactly the messages whose tag matches."""
    group.create_topic(topic)
    sent = produce(drivers, group, topic, "sync", count=30, tags="TagA,TagB,TagC")
    expressions = {"TagA||TagC": {"TagA", "TagC"}, "TagB": {"TagB"}}
    readers = {}
    for index, (expression, tags) in enumerate(expressions.items()):
        wanted = {event["body"] for event in sent if event["tags"] in tags}
        readers[expression] = (consumer(drivers, group, f"consumer-{index}", topic, f"{topic}_group{index}",
                                        expression=expression, expect=len(wanted), threads=1), wanted)
    problems = finished([reader for reader, _ in readers.values()])
    for expression, (reader, wanted) in readers.items():
        problems += [f"{expression!r}: {problem}" for problem in
                     check_deliveries(sent, {reader.name: reader.events("delivery")}, expected_bodies=wanted)]
    fail_on(problems)


# -------------------------------------------------------------------------------------------- delay


def _probe_delay(master: str, topic: str) -> tuple[int, str | None]:
    """One SEND carrying a DELAY property, as the C++ client writes it: (response code, remark)."""
    properties = f"DELAY\x01{DELAY_LEVEL}\x02UNIQ_KEY\x01INTEROPDELAYPROBE0000000000000000\x02WAIT\x01true\x02"
    response = call(master, RequestCode.SEND_MESSAGE, {
        "producerGroup": f"{topic}_probe", "topic": topic, "defaultTopic": "TBW102",
        "defaultTopicQueueNums": str(QUEUES), "queueId": "0", "sysFlag": "0",
        "bornTimestamp": str(int(time.time() * 1000)), "flag": "0", "properties": properties,
        "reconsumeTimes": "0", "unitMode": "0", "batch": "0",
    }, b"delay probe")
    return response.code, response.remark


def test_delay_level(group: Group, drivers: DriverPool, topic: str) -> None:
    """Messages sent with delay level 1 reach a running consumer no earlier than 1 s after they were
    sent, each exactly once. Skipped only if the broker answers that it does not support delays."""
    probe_topic = f"{topic}_probe"
    probe_master = group.create_topic(probe_topic)
    code, remark = _probe_delay(probe_master, probe_topic)
    if code != ResponseCode.SUCCESS and "delay" in (remark or "").lower():
        pytest.skip(f"the broker does not support delay levels: code {code}, {remark!r}")
    assert code == ResponseCode.SUCCESS, f"a send with a delay level was answered code {code}: {remark!r}"

    group.create_topic(topic)
    count = 8
    reader = consumer(drivers, group, "consumer", topic, f"{topic}_consumers", expect=count, threads=1)
    wait_for(lambda: assignment(reader) == set(range(QUEUES)), "the consumer to pull every queue",
             timeout_seconds=PROCESS_SECONDS)
    sent = produce(drivers, group, topic, "sync", count=count, tags="TagA", delay_level=DELAY_LEVEL)
    problems = finished([reader])
    deliveries = reader.events("delivery")
    # a delayed message is stored in the schedule topic first: its acknowledged offset is not the
    # offset it is delivered at, so offsets are only checked for order
    problems += check_deliveries(sent, {"consumer": deliveries}, compare_offsets=False)
    sent_at = {event["body"]: int(event["sent_at"]) for event in sent}
    for event in deliveries:
        # both read the drivers' clock (born_timestamp is the C++ client's own)
        waited = int(event["received_at"]) - sent_at[event["body"]]
        if waited < DELAY_MILLISECONDS:
            problems.append(f"{event['body']} delivered {waited} ms after it was sent (delay level "
                            f"{DELAY_LEVEL} is {DELAY_MILLISECONDS} ms)")
    fail_on(problems)
