"""The reviewer's finding on real processes: one member's wall clock 73 h ahead (tests/clock/sitecustomize.py,
that member only), made leader. It must not delete the group's minutes-old segments (retention keeps an
hour here), stamp messages 73 h ahead, or deliver a timer due in an hour at once."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cli.cluster import LocalCluster
from protocol.codes import ResponseCode
from tests.broker import wire
from tests.broker.test_retention import min_offsets
from tests.support.stores import small_store
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow
SEGMENT = 1 << 20
BODY = b"s" * (100 << 10)
SKEW_NS = 73 * 3600 * 10**9
CLOCK_DIRECTORY = Path(__file__).resolve().parents[1] / "clock"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    overrides = small_store({"store": {"segment_size_bytes": SEGMENT, "body_size_max_bytes": 256 << 10},
                             "broker": {"file_reserved_seconds": 3600, "retention_check_seconds": 0.3}})
    with LocalCluster.start(tmp_path_factory.mktemp("clock-skew"), overrides=overrides) as started:
        yield started


def restart_with_clock_moved(cluster: LocalCluster, node_id: str, offset_ns: int) -> None:
    """Restart one member with its wall clock moved (the children inherit this process's environment)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RAFTMQ_TEST_CLOCK_OFFSET_NS", str(offset_ns))
        patch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(CLOCK_DIRECTORY), os.environ.get("PYTHONPATH")])))
        cluster.restart(node_id)


def make_leader(cluster: LocalCluster, node_id: str) -> None:
    """Pause whoever else leads until ``node_id`` wins an election (pysyncobj has no transfer from outside)."""
    for _ in range(20):
        leader = wait_for(cluster.leader_node, "a leader", timeout_seconds=30)
        if leader.id == node_id:
            return
        paused = leader.id
        os.kill(leader.pid, signal.SIGSTOP)
        try:
            def another_leads(paused: str = paused) -> bool:
                now = cluster.leader_node()
                return now is not None and now.id != paused

            wait_for(another_leads, "a new leader", timeout_seconds=30)
        finally:
            os.kill(leader.pid, signal.SIGCONT)
    raise AssertionError(f"{node_id} never won an election")


def test_a_member_73_hours_ahead_leads_without_deleting_or_releasing_early(cluster: LocalCluster) -> None:
    address = wire.leader_address(cluster.namesrv)
    wire.create_topic(address, "Skewed", queues=1)
    wire.create_topic(address, "SkewedTimer", queues=1)
    for _ in range(30):  # about three segments, seconds old
        code, _, remark = wire.send(address, "Skewed", BODY, queue_id=0)
        assert code == ResponseCode.SUCCESS, remark
    skewed = next(node.id for node in cluster.info.nodes if node.broker_address != address)
    restart_with_clock_moved(cluster, skewed, SKEW_NS)
    make_leader(cluster, skewed)
    skewed_address = cluster.broker_address(skewed)
    real_ms = int(time.time() * 1000)
    code, _, remark = wire.send(skewed_address, "Skewed", b"stamped by the skewed leader", queue_id=0)
    assert code == ResponseCode.SUCCESS, remark
    code, _, remark = wire.send(skewed_address, "SkewedTimer", b"due in an hour", queue_id=0,
                                properties={"TIMER_DELIVER_MS": str(real_ms + 3_600_000)})
    assert code == ResponseCode.SUCCESS, remark
    time.sleep(3.0)  # ten retention checks and three timer rounds on the skewed leader
    assert min_offsets(cluster) == [0, 0, 0], "a segment seconds old was deleted"
    code, _, messages = wire.pull(skewed_address, "Skewed", 0, 30)
    assert code == ResponseCode.SUCCESS and messages
    assert abs(messages[-1].store_timestamp - real_ms) < 60_000, "stamped by the skewed clock"
    code, _, released = wire.pull(skewed_address, "SkewedTimer", 0, 0)
    assert not released, "a timer due in an hour was delivered at once"
