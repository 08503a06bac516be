"""``raftmq chaos``: exit codes of check and of run's usage errors (no cluster is started here)."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from chaos.history import History, write_history
from cli.main import main
from tests.chaos.history_builders import ack, deliver, run_header


def test_check_exits_0_for_a_clean_history_and_1_with_the_slice_of_a_violation(tmp_path: Path) -> None:
    clean = tmp_path / "clean.jsonl"
    write_history(clean, History.of([run_header(seed=5), ack("A", 0, 0, 1.0), deliver("A", 0, 0, 2.0)]))
    result = CliRunner().invoke(main, ["chaos", "check", str(clean)])
    assert result.exit_code == 0 and "seed 5: clean" in result.output
    lost = tmp_path / "lost.jsonl"
    write_history(lost, History.of([run_header(seed=6), ack("A", 0, 0, 1.0)]))
    result = CliRunner().invoke(main, ["chaos", "check", str(lost)])
    assert result.exit_code == 1 and "seed 6: 1 violation(s)" in result.output and '"uniq_key":"A"' in result.output


def test_check_of_a_broken_history_is_a_usage_error(tmp_path: Path) -> None:
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"type": "nope"}\n')
    result = CliRunner().invoke(main, ["chaos", "check", str(broken)])
    assert result.exit_code == 2 and "line 1" in result.output


def test_run_refuses_an_unknown_scenario_and_a_bad_duration() -> None:
    assert CliRunner().invoke(main, ["chaos", "run", "--scenario", "nope"]).exit_code == 2
    assert CliRunner().invoke(main, ["chaos", "run", "--scenario", "kill-leader", "--duration", "0"]).exit_code == 2


def test_scenarios_lists_every_scenario() -> None:
    result = CliRunner().invoke(main, ["chaos", "scenarios"])
    assert result.exit_code == 0
    for name in ("kill-leader", "pause-leader", "partition-leader", "partition-random", "kill-all-restart",
                 "wipe-follower", "slow-link", "disk-full", "disk-full-leader", "corrupt-follower", "partition-client-leader",
                 "client-link-reset", "slow-client-link", "mixed"):
        assert name in result.output


def test_run_on_nats_takes_the_power_loss_scenario_only() -> None:
    """Refused before anything starts (no nats-server needed to see it)."""
    result = CliRunner().invoke(main, ["chaos", "run", "--scenario", "kill-leader", "--system", "nats"])
    assert result.exit_code == 2 and "power-loss scenario only" in result.output
    result = CliRunner().invoke(main, ["chaos", "run", "--scenario", "power-loss", "--system", "nats",
                                       "--burst", "10"])
    assert result.exit_code == 2 and "--burst" in result.output
