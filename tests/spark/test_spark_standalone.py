"""``raftmq verify --master spark://... --namesrv ...`` on a real Spark standalone cluster (a master and two
workers started from the installed pyspark) against a live three-member group under a light load, after one
byte of a follower's segment was flipped below the committed position: the report names that member, the
byte's offset and the record. The executors read the replicas over the network, as on other hosts.

One ``verify`` process (a driver JVM of its own) keeps the cost down; the clean case over the network is
test_live_verify.py's, in the run's local session. ``make audit-cluster`` runs both cases here."""

from __future__ import annotations

from pathlib import Path

import pytest

from cli.audit_demo import Load, flip_byte, follower, run_verify, start_group, wait_messages
from spark_analytics.standalone import SparkStandalone

pytestmark = pytest.mark.slow


def test_a_real_spark_cluster_names_the_member_offset_and_record_of_a_flipped_byte(tmp_path: Path) -> None:
    with SparkStandalone.start(tmp_path / "spark", workers=2) as spark_cluster, \
            start_group(tmp_path / "group") as group:
        load = Load(group.namesrv, rate=100).start()
        try:
            wait_messages(load, 300, 60)
            target = follower(group)
            corruption = flip_byte(target)
            sent_before = load.acknowledged
            audit = run_verify(spark_cluster.master_url, group.namesrv, tmp_path / "group" / "group.secret",
                               tmp_path / "report.json")
            served_meanwhile = load.acknowledged - sent_before
        finally:
            load.stop()
        # the executors ran on the workers: each has an application directory
        assert all(any((tmp_path / "spark" / f"worker-{number}").iterdir()) for number in range(2))
    assert audit.exit_code == 1, audit.output
    report = audit.report
    assert report is not None and served_meanwhile > 0
    flipped_at = int(corruption.segment.name) + corruption.file_offset
    live = report["live"]
    assert flipped_at < live["cut"] and not live["unreachable"] and len(live["members"]) == 3
    equality = report["byte_equality"]
    assert equality["odd_replicas"] == [target.id] and equality["blocks_differing"] == 1
    [difference] = equality["differences"]
    assert difference["replica"] == target.id and difference["physical_offset"] == flipped_at
    assert difference["actual_byte"] == corruption.flipped and difference["expected_byte"] == corruption.original
    record = difference["actual"]
    assert record["record_offset"] == corruption.record_offset and record["uniq_key"] == corruption.uniq_key
    assert record["kind"] == "message" and record["field"] == "body" and record["topic"] == "AuditLoad"
    # the member's own integrity check finds the record's CRC wrong; the other members are intact
    for replica in report["integrity"]["replicas"]:
        crc = next(invariant for invariant in replica["invariants"] if invariant["name"] == "crc")
        assert crc["violations"] == (1 if replica["replica"] == target.id else 0)
        if replica["replica"] == target.id:
            assert crc["examples"][0]["physical_offset"] == corruption.record_offset
    assert f"{target.id} differs first at byte {flipped_at}" in audit.output
