"""``raftmq chaos ...``: run a fault-injection scenario against a local group and check what the clients saw.

Exit codes: 0 the verdict is clean, 1 it is not (violations, an incomplete run, replicas that differ),
2 usage errors.
"""

from __future__ import annotations

import inspect
import secrets
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import click

from cli.extras import require_extra

if TYPE_CHECKING:
    from chaos.scenarios import Scenario

try:  # the scenarios import toxiproxy-python and friends: the [chaos] extra (the group says so when missing)
    from chaos import scenarios as _scenarios

    SCENARIOS: Mapping[str, Scenario] = _scenarios.SCENARIOS
except ImportError:
    SCENARIOS = {}

USAGE_ERROR = 2
SYSTEMS = ("raftmq", "nats")


@click.group()
def chaos() -> None:
    """Fault injection with a recording workload, a checker and a report (Jepsen-style).

    Needs the chaos extra: pip install 'raftmq[chaos]'.
    """
    require_extra("chaos", "raftmq chaos")


@chaos.command("run")
@click.option("--scenario", required=True, type=click.Choice(sorted(SCENARIOS)), help="What faults to inject.")
@click.option("--duration", type=click.FloatRange(1, 86_400), default=60.0, show_default=True,
              help="Seconds of faults (the workload also runs before and after, then drains).")
@click.option("--seed", type=click.IntRange(0, 2**63 - 1), default=None,
              help="Seed of the workload and the fault schedule (default: a random one, printed).")
@click.option("--report", "report_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Report directory (default: ./chaos-report/SCENARIO-SEED).")
@click.option("--rate", type=click.FloatRange(1, 10_000), default=40.0, show_default=True,
              help="Messages per second per producer (3 producers).")
@click.option("--burst", "burst_messages", type=click.IntRange(0, 1_000_000), default=0, show_default=True,
              help="Messages the first producer sends at the start, in batches (above 65,536: its ids' 16-bit "
                   "counter wraps within the dedupe window).")
@click.option("--id-clock-month-offset-ms", type=click.IntRange(0, 28 * 86_400_000 - 1), default=None,
              help="Start the producers' id clock this many ms into the current month (2147483448: 0.2 s "
                   "before the wrap of the id's time field, on any day).")
@click.option("--no-verify", is_flag=True, help="Skip the Spark byte-equality check (the verdict is then partial).")
@click.option("--keep-data", is_flag=True, help="Keep the members' data after a clean run too.")
@click.option("--system", type=click.Choice(SYSTEMS), default="raftmq", show_default=True,
              help="What the faults hit: raftmq, or (power-loss only) a three-node NATS JetStream cluster "
                   "with an R3 stream under the same workload, for comparison (needs Debian's nats-server).")
def run_command(scenario: str, duration: float, seed: int | None, report_dir: Path | None, rate: float,
                burst_messages: int, id_clock_month_offset_ms: int | None, no_verify: bool, keep_data: bool,
                system: str) -> None:
    """Run one scenario: a three-member group (Raft links through Toxiproxy for network faults), producers
    and consumers recording a history throughout, faults on a seeded schedule, heal, drain, check, and the
    Spark check that the replicas are byte-identical.

    Writes REPORT/report.json (verdict and figures), REPORT/history.jsonl (every send, delivery, fault and
    leader change) and REPORT/timeline.png. Exit code 0 only when the verdict is clean.

    \b
    Scenarios:
    """
    import dataclasses

    from chaos.runner import RunOptions, UsageError, run
    from chaos.workload import WorkloadConfig

    chosen_seed = seed if seed is not None else secrets.randbits(31)
    if system == "nats":
        _run_nats(scenario, duration, chosen_seed, report_dir, rate, burst_messages, id_clock_month_offset_ms,
                  keep_data)
    directory = report_dir if report_dir is not None else Path("chaos-report") / f"{scenario}-{chosen_seed}"
    options = RunOptions(scenario, directory, duration_seconds=duration, seed=chosen_seed,
                         workload=dataclasses.replace(WorkloadConfig(), rate_per_producer=rate,
                                                      burst_messages=burst_messages,
                                                      id_clock_month_offset_ms=id_clock_month_offset_ms),
                         verify=not no_verify, keep_data=keep_data)
    try:
        outcome = run(options)
    except UsageError as exc:
        click.echo(f"Error: {exc}", err=True)
        sys.exit(USAGE_ERROR)
    sys.exit(outcome.exit_code)


def _run_nats(scenario: str, duration: float, seed: int, report_dir: Path | None, rate: float, burst_messages: int,
              id_clock_month_offset_ms: int | None, keep_data: bool) -> NoReturn:
    """``--system nats``: the power-loss scenario against NATS JetStream (chaos.nats_power_loss); exits."""
    from chaos.nats_power_loss import NatsRunOptions, run
    from chaos.runner import UsageError

    if scenario != "power-loss":
        click.echo(f"Error: --system nats runs the power-loss scenario only, not {scenario}", err=True)
        sys.exit(USAGE_ERROR)
    if burst_messages or id_clock_month_offset_ms is not None:
        click.echo("Error: --burst and --id-clock-month-offset-ms are about raftmq's ids, not NATS", err=True)
        sys.exit(USAGE_ERROR)
    directory = report_dir if report_dir is not None else Path("chaos-report") / f"{scenario}-nats-{seed}"
    try:
        outcome = run(NatsRunOptions(directory, duration_seconds=duration, seed=seed, rate_per_producer=rate,
                                     keep_data=keep_data))
    except UsageError as exc:
        click.echo(f"Error: {exc}", err=True)
        sys.exit(USAGE_ERROR)
    sys.exit(outcome.exit_code)


run_command.help = inspect.cleandoc(run_command.help or "") + "".join(
    f"\n  {name:<24} {scenario.summary}" for name, scenario in SCENARIOS.items()) + """

\b
Example:
  raftmq chaos run --scenario kill-leader --duration 120 --seed 7
  raftmq chaos run --scenario mixed --duration 600 --report ./chaos-mixed
  raftmq chaos run --scenario kill-leader --burst 70000 --id-clock-month-offset-ms 2147483448
  raftmq chaos run --scenario power-loss --system nats --seed 3"""


@chaos.command("check")
@click.argument("history", type=click.Path(exists=True, dir_okay=False, path_type=Path))
def check_command(history: Path) -> None:
    """Check a recorded history (HISTORY is a run's history.jsonl) again and print the verdict with the
    slice of history behind each violation. Exit code 0 when it is clean.

    \b
    Example:
      raftmq chaos check chaos-report/kill-leader-7/history.jsonl
    """
    from chaos.checker import check, describe
    from chaos.history import HistoryError, read_history

    try:
        recorded = read_history(history)
    except HistoryError as exc:
        click.echo(f"Error: {exc}", err=True)
        sys.exit(USAGE_ERROR)
    result = check(recorded)
    click.echo(describe(result, recorded))
    sys.exit(0 if result.clean else 1)


@chaos.command("scenarios")
def scenarios_command() -> None:
    """List the scenarios."""
    width = max(len(name) for name in SCENARIOS)
    for name, scenario in SCENARIOS.items():
        click.echo(f"{name:<{width}}  {'network' if scenario.needs_proxies else 'process'}  {scenario.summary}")


COMMANDS: list[click.Command] = [chaos]
