"""``verify``: exit codes, the JSON report, usage errors."""

from __future__ import annotations

import io
import json
import os
import shutil
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from spark_analytics.verify import EXIT_FAILED, EXIT_OK, EXIT_USAGE, REPORT_NAME, main, verify
from tests.spark.cluster import body_offset, build_cluster, flip_byte, history_lines, node_store, records_of


def test_clean_cluster_verifies_and_the_report_says_so(spark: SparkSession, clean_cluster: Path,
                                                         tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    history = tmp_path / "history.jsonl"
    lines = history_lines(records_of(node_store(clean_cluster, "n0")))
    history.write_text("".join(json.dumps(line) + "\n" for line in lines))
    output = io.StringIO()
    assert verify(clean_cluster, report_path=report, output=output, history_path=history) == EXIT_OK
    written = json.loads(report.read_text())
    assert written["ok"] and written["replicas"] == ["n0", "n1", "n2"]
    assert written["byte_equality"]["ok"] and written["integrity"]["ok"] and written["derived_state"]["ok"]
    assert written["derived_state"]["replicated_state"]["groups_compared"] == [["n0", "n1", "n2"]]
    assert written["history"]["ok"] and written["history"]["acknowledged_sends"] == len(lines)
    printed = output.getvalue()
    assert "byte equality: ok" in printed and "consume queues across replicas: ok" in printed
    assert "replicated state across replicas: ok" in printed and "history n2: ok" in printed


def test_derived_state_and_history_failures_fail_verification(spark: SparkSession, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    cluster = tmp_path / "cluster"
    build_cluster(cluster, offsets={"n2": {("cg", "TopicTest", 0): 1}})  # n2 says 1, the others 5
    history = tmp_path / "history.jsonl"
    history.write_text('{"type": "send", "uniq_key": "AB", "topic": "TopicTest", "queue": 0, "queue_offset": 3}\n')
    assert main(["--data-dir", str(cluster), "--history", str(history)]) == EXIT_FAILED
    written = json.loads((cluster / REPORT_NAME).read_text())
    assert written["byte_equality"]["ok"] and written["integrity"]["ok"] and not written["ok"]
    state = written["derived_state"]["replicated_state"]
    assert state["odd_replicas"] == ["n2"] and state["differences"][0]["key"] == "cg/TopicTest/0"
    assert [check["name"] for replica in written["history"]["replicas"] for check in replica["checks"]
            if not check["ok"]] == ["lost"] * 3
    printed = capsys.readouterr().out
    assert "replicated state across replicas: FAILED (odd: n2)" in printed
    assert "n2 consumer_offsets[cg/TopicTest/0] = 1, n0, n1: 5" in printed
    assert "history n0: FAILED: lost (1)" in printed
    history.write_text("not json\n")
    assert main(["--data-dir", str(cluster), "--history", str(history)]) == EXIT_USAGE
    assert f"{history}:1: not JSON" in capsys.readouterr().err


def test_a_damaged_replica_fails_verification(spark: SparkSession, clean_cluster: Path, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    cluster = tmp_path / "cluster"
    shutil.copytree(clean_cluster, cluster)
    record = records_of(node_store(cluster, "n0"))[50]
    flip_byte(node_store(cluster, "n0"), body_offset(record))
    assert main(["--data-dir", str(cluster)]) == EXIT_FAILED
    written = json.loads((cluster / REPORT_NAME).read_text())
    assert not written["ok"] and written["byte_equality"]["odd_replicas"] == ["n0"]
    assert written["byte_equality"]["differences"][0]["physical_offset"] == body_offset(record)
    failed = [i["name"] for r in written["integrity"]["replicas"] for i in r["invariants"] if not i["ok"]]
    assert failed == ["crc"]
    printed = capsys.readouterr().out
    assert "FAILED (odd: n0)" in printed and "crc (1)" in printed and f"byte {body_offset(record)}" in printed


def test_usage_errors_exit_2_with_a_clear_message(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                  clean_cluster: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert verify(tmp_path / "absent") == EXIT_USAGE
    assert "does not exist" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert verify(tmp_path / "empty") == EXIT_USAGE
    assert "holds no replica" in capsys.readouterr().err
    assert verify(clean_cluster, report_path=tmp_path / "no" / "such" / "dir.json") == EXIT_USAGE
    assert "cannot write the report" in capsys.readouterr().err
    # unreadable files (faked: the tests may run as root, who reads everything)
    segment = next((node_store(clean_cluster, "n1") / "commitlog").iterdir())
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: real_access(path, mode) and Path(path) != segment)
    assert verify(clean_cluster) == EXIT_USAGE
    assert f"{segment} is not readable" in capsys.readouterr().err
