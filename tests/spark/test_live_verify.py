"""``verify`` against a live group, in the test run's local Spark session: the cut, every check on the prefix
below it while a producer keeps sending, the continuous audit (each round from the last cut, with metrics),
a member that stops answering (reported, left out, not a difference), and requests without the right key.

The real Spark cluster and a flipped byte are tests/spark/test_spark_standalone.py's."""

from __future__ import annotations

import json
import os
import signal
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from cli.audit_demo import Load, start_group, wait_messages
from cli.cluster import LocalCluster, free_ports
from spark_analytics.live import AuditMetrics, audit_continuously, serve_metrics
from spark_analytics.remote import Access, MemberClient, RemoteError

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def live_group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalCluster, Load]]:
    with start_group(tmp_path_factory.mktemp("live-group")) as cluster:
        load = Load(cluster.namesrv, rate=100).start()
        try:
            wait_messages(load, 300, 60)
            yield cluster, load
        finally:
            load.stop()


def access_of(cluster: LocalCluster) -> Access:
    return Access.from_secret((cluster.data_dir / "group.secret").read_bytes().strip())


def test_requests_without_the_groups_key_are_refused(live_group: tuple[LocalCluster, Load]) -> None:
    cluster, _ = live_group
    address = cluster.info.nodes[0].broker_address
    with pytest.raises(RemoteError, match="does not match"):
        MemberClient(address, Access.from_secret(b"not the group secret")).status()
    with pytest.raises(RemoteError, match="need an audit signature"):
        MemberClient(address, None).status()
    status = MemberClient(address, access_of(cluster)).status()
    assert status["member"] == "n0" and status["applied_end"] >= status["durable_end"] > 0


def test_rounds_audit_the_prefix_every_member_applied_each_from_the_last_cut(
        spark: SparkSession, live_group: tuple[LocalCluster, Load], tmp_path: Path) -> None:
    cluster, load = live_group
    addresses = [node.broker_address for node in cluster.info.nodes]
    follower = next(node for node in cluster.info.nodes if node.id != cluster.leader_id())
    metrics = AuditMetrics()
    server = serve_metrics(metrics, free_ports(1)[0])
    stopped: list[int] = []

    def between_rounds(_: float) -> None:  # the second round meets a member that does not answer
        os.kill(follower.pid, signal.SIGSTOP)
        stopped.append(follower.pid)

    sent_before = load.acknowledged
    try:
        worst = audit_continuously(addresses, lambda: access_of(cluster), tmp_path, 0.0, metrics=metrics, rounds_max=2,
                                   sleep=between_rounds, status_timeout_seconds=2.0)
        text = urllib.request.urlopen(f"http://127.0.0.1:{server.server_port}/metrics", timeout=5).read().decode()
    finally:
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)
        server.shutdown()
    assert worst == 0
    first, second = (json.loads(path.read_text()) for path in sorted(tmp_path.glob("verify-report-*.json"),
                                                                     key=lambda p: int(p.stem.rsplit("-", 1)[1])))
    # round 1: every member, the cut is the smallest applied end, and the group kept serving meanwhile
    live = first["live"]
    assert first["ok"] and live["since"] == 0 and not live["unreachable"]
    assert live["cut"] == min(member["applied_end"] for member in live["members"])
    assert first["byte_equality"]["bytes_compared_per_replica"] == live["cut"]
    assert first["replicas"] == ["n0", "n1", "n2"]
    assert all(replica["messages"] >= 300 for replica in first["integrity"]["replicas"])
    assert load.acknowledged > sent_before
    # round 2: from the first cut on; the stopped follower is reported, left out, and nothing differs
    live = second["live"]
    assert second["ok"] and live["since"] == first["live"]["cut"] < live["cut"]
    assert live["unreachable"] == [follower.broker_address]
    assert second["replicas"] == sorted({"n0", "n1", "n2"} - {follower.id})
    # metrics of the last round
    assert "raftmq_audit_rounds_total 2" in text and "raftmq_audit_last_findings 0" in text
    assert f"raftmq_audit_last_cut_offset {live['cut']}" in text
    assert "raftmq_audit_last_members_unreachable 1" in text and "raftmq_audit_last_ok 1" in text
