"""The CLI as users run it: through click's runner and as a real subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from cli.main import main

REPO = Path(__file__).resolve().parents[2]


def test_demo_writes_and_reads_back(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["demo", "--store-only", "--count", "3000", "--queues", "3", "--data-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output.strip().splitlines()[-1])
    assert summary["written"] == summary["read_back_after_reopen"] == 3000
    assert summary["query_by_key"]


def test_bad_option_is_a_usage_error_without_traceback() -> None:
    result = CliRunner().invoke(main, ["demo", "--count", "0"])
    assert result.exit_code == 2
    assert "Invalid value for '--count'" in result.output
    assert "Traceback" not in result.output


def test_data_dir_that_is_a_file_is_a_clear_failure(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    result = CliRunner().invoke(main, ["demo", "--count", "10", "--data-dir", str(blocker)])
    assert result.exit_code == 2 and "is a file" in result.output


def test_console_script_runs_as_a_process() -> None:
    completed = subprocess.run([sys.executable, "-m", "cli.main", "--help"], capture_output=True, text=True,
                               cwd=REPO, timeout=60)
    assert completed.returncode == 0 and "demo" in completed.stdout


def test_verify_of_a_missing_directory_is_a_usage_error(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["verify", "--data-dir", str(tmp_path / "nope")])
    assert result.exit_code == 2 and "Traceback" not in result.output


def test_verify_needs_a_data_dir() -> None:
    result = CliRunner().invoke(main, ["verify"])
    assert result.exit_code == 2 and "--data-dir" in result.output
