"""Log lines as JSON (`--log-format json`) and logs rotated by size, stdout and stderr following the file."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.logs import JsonFormatter, set_log_context
from cli.cluster import LocalCluster
from tests.support.stores import small_store
from tests.support.waiting import wait_for

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def clean_context() -> Iterator[None]:
    from broker import logs

    saved = dict(logs._context)
    try:
        yield
    finally:
        logs._context.clear()
        logs._context.update(saved)


def test_a_json_line_carries_time_level_logger_message_and_context(clean_context: None) -> None:
    set_log_context(node="n0", group="broker-a")
    record = logging.LogRecord("dledger.member", logging.WARNING, __file__, 1, "role %s -> %s", ("a", "b"), None)
    record.created = 1_795_000_000.25
    line = json.loads(JsonFormatter().format(record))
    assert line == {"time": "2026-11-18T11:06:40.250Z", "level": "WARNING", "logger": "dledger.member",
                    "message": "role a -> b", "node": "n0", "group": "broker-a"}


def test_an_exception_is_one_field_of_one_line(clean_context: None) -> None:
    try:
        raise ValueError("bad \"input\"\nsecond line")
    except ValueError:
        record = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed", (), sys.exc_info())
    text = JsonFormatter().format(record)
    assert "\n" not in text
    line = json.loads(text)
    assert line["message"] == "failed" and "ValueError: bad \"input\"\nsecond line" in line["exception"]


def test_the_log_rotates_by_size_and_stdout_and_stderr_follow_it(tmp_path: Path) -> None:
    log = tmp_path / "broker.log"
    script = textwrap.dedent(f"""
        import logging, sys
        from pathlib import Path
        from broker.logs import configure_logging
        configure_logging("INFO", "json", Path({str(log)!r}), max_bytes=2000, backups=2)
        for number in range(200):
            logging.getLogger("filler").info("line %d %s", number, "x" * 40)
        print("printed after the rotations", flush=True)
        sys.stderr.write("written to stderr at the end\\n")
        raise SystemExit("a fatal error text")
    """)
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and result.stdout == "" and result.stderr == ""  # everything went to the file
    files = sorted(path.name for path in tmp_path.iterdir())
    assert files == ["broker.log", "broker.log.1", "broker.log.2"]  # two backups kept, older ones removed
    assert all(path.stat().st_size <= 2000 for path in tmp_path.iterdir())
    current = log.read_text().splitlines()
    assert current[-3:] == ["printed after the rotations", "written to stderr at the end", "a fatal error text"]
    assert json.loads(current[-4])["message"].startswith("line 199 ")
    for path in tmp_path.iterdir():  # every logging line is JSON
        assert all(json.loads(line)["logger"] == "filler" for line in path.read_text().splitlines()
                   if line.startswith("{"))


@pytest.mark.slow
def test_a_local_group_logs_json_lines_and_rotates_its_logs(tmp_path: Path) -> None:
    with LocalCluster.start(tmp_path / "cluster", overrides=small_store(), log_format="json",
                            log_max_bytes=300) as cluster:
        leader = cluster.leader_node()
        assert leader is not None
        member_log = Path(leader.log)

        def rotated() -> bool:
            return member_log.with_name("broker.log.1").exists()

        wait_for(rotated, "the leader's log rotated at 300 bytes", timeout_seconds=30)
        lines = [json.loads(line) for path in member_log.parent.glob("broker.log*")
                 for line in path.read_text().splitlines() if line.startswith('{"time"')]
        assert lines and all(line["node"] == leader.id and line["group"] == "broker-a" for line in lines)
        assert any(line["logger"] == "dledger.member" for line in lines)
        assert len(list(member_log.parent.glob("broker.log*"))) <= 1 + cluster.info.log_backups
        namesrv_lines = Path(cluster.info.namesrv_log).read_text().splitlines()
        assert any(json.loads(line).get("logger", "").startswith("broker") for line in namesrv_lines
                   if line.startswith('{"time"'))
        info = json.loads((cluster.data_dir / "cluster.json").read_text())
        assert info["log_format"] == "json" and info["log_max_bytes"] == 300


@pytest.mark.parametrize("command", [["cluster", "up"], ["broker", "--config", "node.toml"], ["namesrv"]])
def test_an_unknown_log_format_is_a_usage_error(command: list[str]) -> None:
    from click.testing import CliRunner

    from cli.main import main

    result = CliRunner().invoke(main, [*command, "--log-format", "xml"])
    assert result.exit_code == 2 and "'xml' is not one of 'text', 'json'" in result.output, result.output
