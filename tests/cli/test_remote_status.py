"""`raftmq cluster status --namesrv`: a deployment reported from its name server and members, no cluster.json."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from cli import cluster_commands
from cli.cluster import LocalCluster, free_ports
from cli.main import main
from cli.remote_status import _Group, _group_rows, format_table, name_servers
from tests.support.stores import small_store
from tests.support.waiting import wait_for


def status_rows(*arguments: str) -> list[dict[str, object]]:
    result = CliRunner().invoke(main, ["cluster", "status", *arguments, "--json"])
    assert result.exit_code == 0, result.output
    return [json.loads(line) for line in result.output.splitlines()]


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster.start(tmp_path_factory.mktemp("remote-status"), overrides=small_store()) as cluster:
        yield cluster


@pytest.mark.slow
def test_every_member_of_a_running_group_is_reported_from_the_name_server(running: LocalCluster) -> None:
    def settled() -> list[dict[str, object]] | None:
        rows = status_rows("--namesrv", running.namesrv)
        return rows if len(rows) == 3 and sorted(str(row["role"]) for row in rows) == ["follower", "follower",
                                                                                         "leader"] else None

    rows = wait_for(settled, "three members, one leader, reported remotely", timeout_seconds=30)
    assert [row["node"] for row in rows] == ["n0", "n1", "n2"]
    assert {row["group"] for row in rows} == {"broker-a"} and {row["cluster"] for row in rows} == {"DefaultCluster"}
    assert all(row["reachable"] and row["error"] == "" for row in rows)
    assert len({row["term"] for row in rows}) == 1
    assert {row["address"] for row in rows} == {node.client_address for node in running.info.nodes}
    leader = next(row for row in rows if row["role"] == "leader")
    assert leader["broker_ids"] == [0] and leader["node"] == running.leader_id()
    assert all(isinstance(row["lag"], int) and isinstance(row["index_lag"], int) for row in rows)
    assert all(int(str(row["applied_index"])) > 0 for row in rows)
    # the table, and the same through the local cluster.json for comparison
    table = CliRunner().invoke(main, ["cluster", "status", "--namesrv", running.namesrv])
    assert table.exit_code == 0, table.output
    header, *lines = table.output.splitlines()
    assert header.split() == ["cluster", "group", "node", "role", "term", "commit_index", "applied_index",
                              "max_offset", "lag", "index_lag", "address"]
    assert len(lines) == 3 and sum(" leader " in line for line in lines) == 1


@pytest.mark.slow
def test_watch_reports_again_until_its_count(running: LocalCluster) -> None:
    rows = status_rows("--namesrv", running.namesrv, "--watch", "0.1", "--count", "3")
    assert len(rows) == 9 and len({row["time"] for row in rows}) == 3


@pytest.mark.slow
def test_a_member_that_does_not_answer_is_shown_unreachable(running: LocalCluster) -> None:
    follower = next(node for node in running.info.nodes if node.id != running.leader_id())
    os.kill(follower.pid, signal.SIGSTOP)  # still registered, no longer answering
    try:
        rows = status_rows("--namesrv", running.namesrv, "--timeout", "0.5")
        unreachable = [row for row in rows if not row["reachable"]]
        assert [(row["role"], row["address"], row["node"]) for row in unreachable] == [
            ("unreachable", follower.client_address, "?")]
        assert unreachable[0]["error"] and len(rows) == 3
        table = CliRunner().invoke(main, ["cluster", "status", "--namesrv", running.namesrv, "--timeout", "0.5"])
        assert f"broker-a at {follower.client_address}: unreachable" in table.output
    finally:
        os.kill(follower.pid, signal.SIGCONT)
    wait_for(lambda: all(row["reachable"] for row in status_rows("--namesrv", running.namesrv)),
             "the follower answering again",
             timeout_seconds=30)


def test_no_name_server_answering_is_a_failure_with_a_clear_message() -> None:
    (port,) = free_ports(1)
    result = CliRunner().invoke(main, ["cluster", "status", "--namesrv", f"127.0.0.1:{port}", "--timeout", "0.5"])
    assert result.exit_code == 1
    assert "no name server answered" in result.output and "Traceback" not in result.output


def test_ctrl_c_ends_a_watch_quietly(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    reports = []

    def report(*arguments: object, **keywords: object) -> bool:
        reports.append(arguments)
        return True

    def interrupted(seconds: float) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(cluster_commands, "_report_status", report)
    monkeypatch.setattr("cli.cluster_commands.time.sleep", interrupted)
    result = CliRunner().invoke(main, ["cluster", "status", "--namesrv", "127.0.0.1:1", "--watch", "5"])
    assert result.exit_code == 0 and len(reports) == 1


@pytest.mark.parametrize(("arguments", "message"), [
    (["--count", "2"], "--count goes with --watch"),
    (["--namesrv", "127.0.0.1:1", "--data-dir", "x"], "not both"),
    (["--watch", "0"], "--watch"),
])
def test_usage_errors_exit_2(arguments: list[str], message: str) -> None:
    result = CliRunner().invoke(main, ["cluster", "status", *arguments])
    assert result.exit_code == 2 and message in result.output, result.output


def test_name_servers_are_separated_by_semicolons() -> None:
    assert name_servers("a:1; b:2;") == ["a:1", "b:2"]


def test_one_member_behind_two_addresses_is_one_row_and_lag_is_against_the_group() -> None:
    group = _Group("c", {"front:1": {0}, "n0:1": {1}, "n1:1": {2}, "n2:1": {3}})
    answers: dict[str, dict[str, str] | str] = {
        "front:1": {"nodeId": "n0", "brokerRole": "LEADER", "raftTerm": "4", "commitIndex": "10",
                    "appliedIndex": "10", "commitLogMaxOffset": "500", "brokerAddress": "n0:1"},
        "n0:1": {"nodeId": "n0", "brokerRole": "LEADER", "raftTerm": "4", "commitIndex": "10",
                 "appliedIndex": "10", "commitLogMaxOffset": "500", "brokerAddress": "n0:1"},
        "n1:1": {"nodeId": "n1", "brokerRole": "FOLLOWER", "raftTerm": "4", "commitIndex": "9",
                 "appliedIndex": "7", "commitLogMaxOffset": "300", "brokerAddress": "n1:1"},
        "n2:1": "connection refused",
    }
    rows = _group_rows("g", group, answers, 1.0)
    assert [(row["node"], row["role"], row["lag"], row["index_lag"]) for row in rows] == [
        ("n0", "leader", 0, 0), ("n1", "follower", 200, 3), ("?", "unreachable", "-", "-")]
    assert rows[0]["addresses"] == ["front:1", "n0:1"] and rows[0]["broker_ids"] == [0, 1]
    header, *lines = format_table(rows, ("node", "role", "lag"))
    assert header.split() == ["node", "role", "lag"] and lines[2].split() == ["?", "unreachable", "-"]
