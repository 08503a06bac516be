"""Timed delivery (TIMER_DELAY_SEC / TIMER_DELIVER_MS / __STARTDELIVERTIME) against a real three-node group:
on time, once, across a leader kill and a restart of the whole group; bad times refused."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator

import pytest

from cli.cluster import LocalCluster
from commitlog.record_codec import StoredMessage
from protocol.codes import RequestCode, ResponseCode
from protocol.connection import RemotingError
from tests.broker import wire
from tests.support.stores import small_store
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster.start(tmp_path_factory.mktemp("timers"), overrides=small_store()) as started:
        yield started


def leader(cluster: LocalCluster) -> str:
    return wire.leader_address(cluster.namesrv)


def delivered(address: str, topic: str) -> list[StoredMessage] | None:
    try:
        code, _, messages = wire.pull(address, topic, 0, 0)
    except RemotingError:
        return None
    return messages if code == ResponseCode.SUCCESS else []


def delivered_at_least(address: str, topic: str, count: int) -> list[StoredMessage] | None:
    messages = delivered(address, topic)
    return messages if messages is not None and len(messages) >= count else None


create_topic = wire.create_topic


def test_timed_messages_arrive_once_not_before_their_time(cluster: LocalCluster) -> None:
    address = leader(cluster)
    create_topic(address, "Timed")
    now_ms = int(time.time() * 1000)
    cases = {"relative": {"TIMER_DELAY_SEC": "2"}, "absolute": {"TIMER_DELIVER_MS": str(now_ms + 2500)},
             "v4": {"__STARTDELIVERTIME": str(now_ms + 1500)}, "past": {"TIMER_DELIVER_MS": str(now_ms - 5000)}}
    for name, properties in cases.items():
        code, _, remark = wire.send(address, "Timed", name.encode(), queue_id=0,
                                    properties={**properties, "UNIQ_KEY": f"TIMER{name}", "KEYS": f"k-{name}"})
        assert code == ResponseCode.SUCCESS, remark
    first = delivered(address, "Timed")
    assert [m.body for m in first or []] == [b"past"]  # already due: delivered at once
    messages = wait_for(lambda: delivered_at_least(address, "Timed", 4), "every timer", timeout_seconds=30)
    by_body = {m.body: m for m in messages}
    for name in cases:
        message = by_body[name.encode()]
        assert message.property_map["UNIQ_KEY"] == f"TIMER{name}" and message.property_map["KEYS"] == f"k-{name}"
        if name != "past":
            assert message.store_timestamp >= int(message.property_map["TIMER_OUT_MS"])
    assert len({m.property_map["UNIQ_KEY"] for m in messages}) == 4


def test_bad_delivery_times_are_refused_and_store_nothing(cluster: LocalCluster) -> None:
    address = leader(cluster)
    create_topic(address, "TimedBad")
    far = str(int(time.time() * 1000) + 31 * 86_400_000)
    for properties in ({"TIMER_DELAY_SEC": "-1"}, {"TIMER_DELIVER_MS": far}, {"TIMER_DELAY_MS": "soon"},
                       {"TIMER_DELAY_SEC": str(31 * 86_400)}):
        code, _, remark = wire.send(address, "TimedBad", b"x", queue_id=0, properties=properties)
        assert code == ResponseCode.MESSAGE_ILLEGAL and remark
    code, fields, _ = wire.call(address, RequestCode.GET_MAX_OFFSET, {"topic": "RMQ_SYS_TIMER_TOPIC", "queueId": "0"})
    before = int(fields["offset"])
    assert wire.send(address, "TimedBad", b"y", queue_id=0, properties={"TIMER_DELAY_SEC": "3600"})[0] == 0
    code, fields, _ = wire.call(address, RequestCode.GET_MAX_OFFSET, {"topic": "RMQ_SYS_TIMER_TOPIC", "queueId": "0"})
    assert int(fields["offset"]) == before + 1  # only the good one became a timer


def test_timer_survives_a_leader_kill_and_a_full_restart(cluster: LocalCluster) -> None:
    address = leader(cluster)
    create_topic(address, "TimedFailover")
    for number, delay in enumerate((3, 6)):
        code, _, remark = wire.send(address, "TimedFailover", f"f{number}".encode(), queue_id=0,
                                    properties={"TIMER_DELAY_SEC": str(delay), "UNIQ_KEY": f"TIMERFAIL{number}"})
        assert code == ResponseCode.SUCCESS, remark
    old = cluster.leader_node()
    assert old is not None
    cluster.kill(old.id, signal.SIGKILL)
    cluster.restart(old.id)
    new_address = leader(cluster)
    wait_for(lambda: delivered_at_least(new_address, "TimedFailover", 1),
             "the first timer from the new leader", timeout_seconds=30)
    # the whole group restarts while the second timer is pending
    for node in cluster.info.nodes:
        cluster.kill(node.id, signal.SIGKILL)
    for node in cluster.info.nodes:
        cluster.restart(node.id)
    address = leader(cluster)
    messages = wait_for(lambda: delivered_at_least(address, "TimedFailover", 2),
                        "the second timer after the restart",
                        timeout_seconds=60)
    assert [m.body for m in messages] == [b"f0", b"f1"]
    for message in messages:
        assert message.store_timestamp >= int(message.property_map["TIMER_OUT_MS"])


def test_leader_killed_while_timers_and_delays_are_being_delivered(cluster: LocalCluster) -> None:
    address = leader(cluster)
    create_topic(address, "TimedMidway")
    keys = []
    for number in range(24):
        key = f"MIDWAY{number:03d}"
        properties = {"UNIQ_KEY": key}
        if number % 2:
            properties["DELAY"] = "2"  # 5 s
        else:
            properties["TIMER_DELAY_MS"] = str(2000 + 150 * number)
        code, _, remark = wire.send(address, "TimedMidway", key.encode(), queue_id=0, properties=properties)
        assert code == ResponseCode.SUCCESS, remark
        keys.append(key)
    wait_for(lambda: delivered_at_least(address, "TimedMidway", 1), "the first due timer", timeout_seconds=30)
    old = cluster.leader_node()
    assert old is not None
    cluster.kill(old.id, signal.SIGKILL)  # due times are passing: some delivered, some not yet
    cluster.restart(old.id)
    new_address = leader(cluster)
    messages = wait_for(lambda: delivered_at_least(new_address, "TimedMidway", 24), "every message",
                        timeout_seconds=60)
    assert sorted(m.property_map["UNIQ_KEY"] for m in messages) == keys  # each exactly once
    for message in messages:
        due = message.property_map.get("TIMER_OUT_MS")
        assert due is None or message.store_timestamp >= int(due)
