"""`raftmq cluster ...` as users run it: real subprocesses, a real three-node group."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from cli import front as front_module
from cli.cluster import LocalCluster, check_overrides, is_alive, parse_setting, route_master
from cli.main import main
from tests.support.waiting import wait_for

REPO = Path(__file__).resolve().parents[2]


def raftmq(*arguments: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([sys.executable, "-m", "cli.main", *arguments], cwd=REPO, capture_output=True, text=True,
                            timeout=120)
    if check:
        assert result.returncode == 0, result.stdout + result.stderr
    return result


@pytest.fixture
def data_dir(tmp_path: Path) -> Iterator[Path]:
    directory = tmp_path / "cluster"
    try:
        yield directory
    finally:
        if (directory / "cluster.json").exists():
            LocalCluster.open(directory).stop()  # whatever the test did, nothing outlives it


@pytest.mark.slow
def test_up_status_kill_leader_restart_down(data_dir: Path) -> None:
    started = raftmq("cluster", "up", "--data-dir", str(data_dir), "--set", f"store.segment_size_bytes={16 << 20}",
                     "--set", "group_commit.linger_ms=2")
    namesrv = next(line for line in started.stdout.splitlines() if line.startswith("namesrv=")).split("=", 1)[1]
    info = json.loads((data_dir / "cluster.json").read_text())
    assert info["namesrv"] == namesrv and [node["id"] for node in info["nodes"]] == ["n0", "n1", "n2"]
    # an endpoint for 5.x clients (the leader's gRPC address); cluster.json lists every member's
    grpc_endpoint = next(line for line in started.stdout.splitlines() if line.startswith("grpc=")).split("=", 1)[1]
    grpc_addresses = [node["grpc_address"] for node in info["nodes"]]
    assert grpc_endpoint in grpc_addresses and len(set(grpc_addresses)) == 3
    # HAProxy is installed (`make test` installs it): the group has a front, registered as its brokerId 0
    front = next(line for line in started.stdout.splitlines() if line.startswith("front=")).split("=", 1)[1]
    assert info["front"] == front and is_alive(info["front_pid"])
    wait_for(lambda: route_master(namesrv) == front, "the front as the group's brokerId 0",
             timeout_seconds=30)
    assert (data_dir / "n0" / "store" / "commitlog").is_dir()
    for node in ("n0", "n1", "n2"):  # --set reached every member's file, and the store uses it
        settings = tomllib.loads((data_dir / node / "node.toml").read_text())
        assert settings["store"]["segment_size_bytes"] == 16 << 20 and settings["group_commit"]["linger_ms"] == 2
    rows = [json.loads(line) for line in raftmq("cluster", "status", "--data-dir", str(data_dir), "--json").stdout.splitlines()]
    leaders = [row["node"] for row in rows if row["role"] == "leader"]
    assert len(leaders) == 1 and all(row["alive"] for row in rows)
    table = raftmq("cluster", "status", "--data-dir", str(data_dir)).stdout
    assert "applied_index" in table and "leader" in table
    client = ["--namesrv", namesrv]
    raftmq("topic", "create", "E2E", "--queues", "2", *client)
    raftmq("send", "E2E", "before the kill", *client)
    segments = list((data_dir / leaders[0] / "store" / "commitlog").iterdir())
    assert segments and all(segment.stat().st_size == 16 << 20 for segment in segments)
    raftmq("cluster", "kill", "--leader", "--data-dir", str(data_dir))
    raftmq("send", "E2E", "after the kill", *client)  # the client rides out the election
    consumed = raftmq("consume", "E2E", "--group", "e2e", "--from", "first", "--count", "2", *client)
    assert sorted(json.loads(line)["body"] for line in consumed.stdout.splitlines()) == ["after the kill",
                                                                                         "before the kill"]
    wait_for(lambda: LocalCluster.open(data_dir).leader_id() not in (None, leaders[0]), "a new leader",
             timeout_seconds=30)
    assert route_master(namesrv) == front  # the group's address survives its leader
    rows = [json.loads(line) for line in raftmq("cluster", "status", "--data-dir", str(data_dir), "--json").stdout.splitlines()]
    assert [row["alive"] for row in rows if row["node"] == leaders[0]] == [False]
    raftmq("cluster", "restart", leaders[0], "--data-dir", str(data_dir))
    cluster = LocalCluster.open(data_dir)
    wait_for(lambda: all(row["alive"] and row["role"] in ("leader", "follower") for row in cluster.status()),
             "every node back",
             timeout_seconds=60)
    raftmq("cluster", "down", "--data-dir", str(data_dir))
    assert not any(row["alive"] for row in cluster.status())
    assert not is_alive(info["front_pid"])  # the front stops with the group


def test_front_haproxy_where_it_is_not_installed_is_a_usage_error(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(front_module, "find_haproxy", lambda: None)
    directory = tmp_path / "cluster"
    result = CliRunner().invoke(main, ["cluster", "up", "--data-dir", str(directory), "--front", "haproxy"])
    assert result.exit_code == 2, result.output
    assert "HAProxy is not installed" in result.output and "--front none" in result.output
    assert "Traceback" not in result.output and not directory.exists()


def test_usage_errors_exit_2_without_traceback(tmp_path: Path) -> None:
    runner = CliRunner()
    for arguments in (["cluster", "kill", "--data-dir", str(tmp_path)],
                      ["cluster", "up", "--nodes", "0"],
                      ["cluster", "kill", "n0", "--signal", "HUP"]):
        result = runner.invoke(main, arguments)
        assert result.exit_code == 2, result.output
        assert "Traceback" not in result.output


@pytest.mark.parametrize(("setting", "message"), [
    ("store.segment_size_bytes=1", "segment_size_bytes must be an integer"),
    ("store.no_such_key=1", "unknown store settings: no_such_key"),
    ("store.flush_policy=sometimes", "flush_policy must be 'async' or 'sync'"),
    ("raft.journal_flush=sometimes", "journal_flush must be one of durable, page_cache"),
    ("raft.journal_flush=1", "journal_flush must be a string"),
    ("node.id=n7", "the section must be one of store, raft, group_commit, broker"),
    ("store.store_host=10.0.0.1:1", "is set by `raftmq cluster up` itself"),
    ("broker.namesrv=[]", "is set by `raftmq cluster up` itself"),
    ("broker.grpc_address=127.0.0.1:1", "is set by `raftmq cluster up` itself"),
    ("segment_size_bytes=1", "is not SECTION.KEY=VALUE"),
    ("store.segment_size_bytes", "is not SECTION.KEY=VALUE"),
    ("group_commit.linger_ms={ a = 1 }", "VALUE must be a number"),
])
def test_a_bad_setting_is_a_usage_error_before_anything_is_written(tmp_path: Path, setting: str, message: str) -> None:
    directory = tmp_path / "cluster"
    result = CliRunner().invoke(main, ["cluster", "up", "--data-dir", str(directory), "--set", setting])
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output
    assert not directory.exists()  # no trace: nothing written, nothing started


def test_settings_parse_as_toml_values_or_plain_strings() -> None:
    assert parse_setting("store.segment_size_bytes=134217728") == ("store", "segment_size_bytes", 134217728)
    assert parse_setting("store.flush_policy=sync") == ("store", "flush_policy", "sync")
    assert parse_setting('store.flush_policy="sync"') == ("store", "flush_policy", "sync")
    assert parse_setting("broker.auto_create_topic=false") == ("broker", "auto_create_topic", False)
    assert parse_setting("broker.delay_levels_seconds=[1, 5]") == ("broker", "delay_levels_seconds", [1, 5])
    check_overrides({"store": {"flush_policy": "sync"}, "broker": {"delay_levels_seconds": [1, 5]}})


def test_missing_cluster_is_a_failure_with_a_clear_message(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["cluster", "status", "--data-dir", str(tmp_path)])
    assert result.exit_code == 1
    assert "no cluster in" in result.output and "Traceback" not in result.output
