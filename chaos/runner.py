"""Runs one chaos scenario end to end and writes its report directory.

1. Start a group (three members and a name server; with every Raft link and every client-to-broker link
   through a Toxiproxy proxy when the scenario has network faults: ours is started when no server answers
   at ``TOXIPROXY_URL``).
2. Create the topic, start the leader monitor and the workload; after ``warmup_seconds`` run the
   scenario's faults for ``duration_seconds``; then heal everything (resume, restart, heal links).
3. Keep producing for ``cooldown_seconds`` (recovery shows in the plot), stop the producers, let the
   consumers drain (every acknowledged message received, every queue read to its end), wait until the
   members hold the same commit log, stop the group (SIGTERM: stores flushed).
4. Check the history (:mod:`chaos.checker`), compare the replicas' files byte for byte
   (:mod:`chaos.replicas`, quick), run the Spark check over them (:func:`spark_analytics.verify.verify`:
   byte equality and each replica's integrity), write ``report.json``, ``history.jsonl``, ``timeline.png``.

The verdict is ``clean`` only when the checker found nothing, the drain completed, the members converged,
the replicas are byte-identical and the Spark check passed (when it ran). The seed decides the workload (keys, delays, bodies, consumer
restarts) and the fault schedule (gaps, holds, targets other than "the leader now").
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, TextIO

from chaos import powerfs
from chaos.checker import CheckResult, check, describe
from chaos.cluster import ChaosCluster
from chaos.disk import release_mounts
from chaos.faults import CORRUPTION_UNNOTICED, Faults
from chaos.history import History, HistoryWriter, NoteEvent, RunStarted
from chaos.monitor import LeaderMonitor
from chaos.replicas import compare_replicas
from chaos.report import fault_figures, plot_timeline
from chaos.scenarios import SCENARIOS, Scenario
from chaos.toxiproxy_control import ToxiproxyHandle, ensure_toxiproxy
from chaos.workload import BURST_GRACE_SECONDS, Recorder, Workload, WorkloadConfig
from cli.cluster import ClusterError, ClusterInfo, is_alive
from client.admin import AsyncAdmin
from protocol.topics import TRANS_HALF_TOPIC

EXIT_CLEAN: Final = 0
EXIT_VIOLATIONS: Final = 1
EXIT_USAGE: Final = 2
REPORT_VERSION: Final = 1
CLUSTER_DIRECTORY: Final = "cluster"
HISTORY_FILE: Final = "history.jsonl"
REPORT_FILE: Final = "report.json"
TIMELINE_FILE: Final = "timeline.png"
VERIFY_REPORT_FILE: Final = "verify-report.json"
VERIFY_HISTORY_FILE: Final = "verify-history.jsonl"
CONVERGE_TIMEOUT_SECONDS: Final = 60.0
DIFFERENCES_SHOWN_MAX: Final = 20
#: a half left UNKNOW is checked back after 1 s, every second, and given up only after 100 checks (the
#: defaults, 6 s and 60 s, would leave a check-back-settled transaction undelivered at the drain)
TRANSACTION_OVERRIDES: Final[dict[str, dict[str, Any]]] = {
    "broker": {"transaction_timeout_ms": 1000, "transaction_check_interval_ms": 1000, "transaction_check_max": 100},
}


class UsageError(ValueError):
    """Bad options (an unknown scenario, a bad duration, a report directory in use): exit code 2."""


@dataclass(frozen=True, slots=True)
class RunOptions:
    scenario: str
    report_dir: Path
    duration_seconds: float = 60.0
    seed: int = 1
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    nodes: int = 3
    warmup_seconds: float = 3.0
    cooldown_seconds: float = 5.0
    drain_timeout_seconds: float = 90.0
    #: run the Spark byte-equality check (the verdict needs it; off only to iterate faster)
    verify: bool = True
    #: keep the members' data after a clean run (it is always kept after a failed one)
    keep_data: bool = False
    #: member settings (cli.cluster.node_toml sections), over :data:`TRANSACTION_OVERRIDES`
    overrides: dict[str, dict[str, Any]] = field(default_factory=dict)

    def member_overrides(self, scenario: Scenario) -> dict[str, dict[str, Any]]:
        """``overrides`` over the scenario's over the chaos defaults (transactions checked back within
        seconds, not minutes)."""
        merged = {section: dict(values) for section, values in TRANSACTION_OVERRIDES.items()}
        for layer in (scenario.overrides, self.overrides):
            for section, values in layer.items():
                merged.setdefault(section, {}).update(values)
        return merged

    def validate(self) -> Scenario:
        scenario = SCENARIOS.get(self.scenario)
        if scenario is None:
            raise UsageError(f"no scenario {self.scenario!r} (scenarios: {', '.join(SCENARIOS)})")
        if not 0 < self.duration_seconds <= 24 * 3600:
            raise UsageError("the duration must be in (0, 86400] seconds")
        if not 3 <= self.nodes <= 9:
            raise UsageError("a chaos group has 3 to 9 members")
        try:
            self.workload.validate()
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        reason = scenario.unavailable()
        if reason is not None:
            raise UsageError(f"scenario {self.scenario} cannot run on this machine: {reason}")
        return scenario


@dataclass(frozen=True, slots=True)
class RunOutcome:
    exit_code: int
    verdict: str
    report: dict[str, Any]
    result: CheckResult


@dataclass
class _Progress:
    drained: bool = False
    converged: bool = False
    error: str | None = None


def _prepare_directory(report_dir: Path) -> Path:
    report_dir.mkdir(parents=True, exist_ok=True)
    cluster_dir = report_dir / CLUSTER_DIRECTORY
    if (cluster_dir / "cluster.json").exists():
        try:
            info = ClusterInfo.load(cluster_dir)
        except ClusterError:
            info = None
        if info is not None and (is_alive(info.namesrv_pid) or any(is_alive(node.pid) for node in info.nodes)):
            raise UsageError(f"a cluster is still running in {cluster_dir}; stop it with "
                             f"`raftmq cluster down --data-dir {cluster_dir}`")
    if cluster_dir.exists():
        powerfs.release_mounts(cluster_dir)
        release_mounts(cluster_dir)
        shutil.rmtree(cluster_dir)
    for name in (HISTORY_FILE, REPORT_FILE, TIMELINE_FILE, VERIFY_REPORT_FILE, VERIFY_HISTORY_FILE):
        (report_dir / name).unlink(missing_ok=True)
    return cluster_dir


def run(options: RunOptions, out: TextIO | None = None) -> RunOutcome:
    """Run the scenario; print progress and the verdict to ``out`` (default stdout)."""
    out = out if out is not None else sys.stdout
    scenario = options.validate()
    cluster_dir = _prepare_directory(options.report_dir)
    print(f"chaos {scenario.name}: seed {options.seed}, {options.duration_seconds:g} s, report in "
          f"{options.report_dir}", file=out, flush=True)
    started = time.monotonic()
    rng = random.Random(options.seed)
    progress = _Progress()
    toxiproxy: ToxiproxyHandle | None = None
    writer = HistoryWriter(options.report_dir / HISTORY_FILE)
    recorder = Recorder(writer)
    try:
        if scenario.needs_proxies:
            toxiproxy = ensure_toxiproxy(seed=rng.getrandbits(32))
        if scenario.on_powerfs:  # each member's directory its own machine's disk, from the start
            for index in range(options.nodes):
                powerfs.mount_directory(cluster_dir / f"n{index}")
        cluster = ChaosCluster.start(cluster_dir, options.nodes, toxiproxy, options.member_overrides(scenario))
        if scenario.on_powerfs:
            powerfs.sync_mounts(cluster_dir)  # the members' configuration as installed: durable
    except (ClusterError, OSError, RuntimeError) as exc:  # ToxiproxyStartError is a RuntimeError
        progress.error = f"cannot start the group: {exc}"
        cluster = None
    try:
        if cluster is not None:
            recorder = Recorder(writer)  # time 0 is when the workload starts
            recorder.record(RunStarted(scenario.name, options.seed, options.workload.topic, options.workload.queues,
                                       options.workload.group_names, tuple(cluster.node_ids), time.time(),
                                       options.duration_seconds))
            try:
                asyncio.run(_drive(options, scenario, cluster, recorder, rng, progress, out))
            except Exception as exc:  # reported in the verdict; the history so far is still checked
                progress.error = f"{type(exc).__name__}: {exc}"
                recorder.record(NoteEvent(recorder.now(), "run failed", progress.error))
    finally:
        if cluster is not None:
            cluster.stop()
        if cluster_dir.exists():
            powerfs.release_mounts(cluster_dir)  # a clean shutdown of each member's powerfs disk
            release_mounts(cluster_dir)  # a disk-full member's tmpfs: its data back on the real disk
        writer.close()
        if toxiproxy is not None:
            toxiproxy.close()
    result = check(recorder.history)
    differences = compare_replicas(cluster_dir) if (cluster_dir / "n0").is_dir() else []
    for difference in differences[:DIFFERENCES_SHOWN_MAX]:
        print(f"replicas differ: {difference.describe()}", file=out)
    verify_code = _verify(options, cluster_dir, out)
    corruptions = corruption_outcomes(recorder.history)
    unnoticed = any(outcome["outcome"] == CORRUPTION_UNNOTICED for outcome in corruptions)
    clean = (result.clean and not differences and progress.drained and progress.converged
             and progress.error is None and verify_code in (0, None) and not unnoticed)
    diverged = bool(differences) or verify_code == 1 or unnoticed
    verdict = "clean" if clean else ("violations" if not result.clean or diverged else "incomplete")
    exit_code = EXIT_CLEAN if clean else EXIT_VIOLATIONS
    report = _report(options, result, progress, verify_code, verdict, exit_code, time.monotonic() - started)
    report["replicas_identical"] = not differences
    report["replica_differences"] = [difference.describe() for difference in differences[:DIFFERENCES_SHOWN_MAX]]
    report["corruptions"] = corruptions
    (options.report_dir / REPORT_FILE).write_text(json.dumps(report, indent=2) + "\n")
    try:
        plot_timeline(recorder.history, result, options.report_dir / TIMELINE_FILE)
    except ImportError as exc:
        print(f"no timeline plot: {exc} (install matplotlib)", file=out)
    print(describe(result, recorder.history), file=out)
    _print_summary(report, out)
    if clean and not options.keep_data:
        shutil.rmtree(cluster_dir, ignore_errors=True)
    return RunOutcome(exit_code, verdict, report, result)


async def _drive(options: RunOptions, scenario: Scenario, cluster: ChaosCluster, recorder: Recorder,
                 rng: random.Random, progress: _Progress, out: TextIO) -> None:
    config = options.workload
    nodes = cluster.local.info.nodes
    async with AsyncAdmin(cluster.namesrv) as admin:
        await admin.create_topic(config.topic, read_queue_nums=config.queues, write_queue_nums=config.queues)
    # the monitor asks each member directly (it must see roles while a client link is cut); the workload's
    # clients use the addresses the name server hands out (the client proxies, in a proxied cluster)
    monitor = LeaderMonitor({node.id: node.broker_address for node in nodes}, recorder.record, recorder.now)
    # 5.x clients reach each member's gRPC server directly (not through a client-link proxy)
    workload = Workload(cluster.namesrv, [node.client_address for node in nodes], config, recorder,
                        random.Random(rng.getrandbits(64)), [node.grpc_address for node in nodes if node.grpc_address])
    faults = Faults(cluster, monitor, recorder)
    fault_rng = random.Random(rng.getrandbits(64))
    loop = asyncio.get_running_loop()
    monitor.start()
    workload.start()
    faults.start()
    try:
        await asyncio.sleep(options.warmup_seconds)
        print(f"  faults for {options.duration_seconds:g} s", file=out, flush=True)
        try:
            await scenario.drive(faults, fault_rng, loop.time() + options.duration_seconds)
        finally:
            await faults.heal_everything()
        print(f"  healed; cooling down {options.cooldown_seconds:g} s", file=out, flush=True)
        await asyncio.sleep(options.cooldown_seconds)
        # a burst not done by now goes on for up to BURST_GRACE_SECONDS: the wait covers it
        burst_grace = BURST_GRACE_SECONDS if config.burst_messages else 0.0
        await workload.stop_producers(config.send_timeout_seconds * config.send_attempts_max + 5 + burst_grace)
        print("  draining consumers", file=out, flush=True)
        progress.drained = await workload.drain(options.drain_timeout_seconds)
        await workload.stop()
        progress.converged = await _converge(monitor, recorder)
        failure = workload.failed_task()
        if failure is not None:
            raise RuntimeError(f"a workload task failed: {failure!r}") from failure
    finally:
        await faults.stop()
        await workload.stop()
        await monitor.stop()


def corruption_outcomes(history: History) -> list[dict[str, str]]:
    """Per ``corrupt`` fault: the member, what it did (repaired, refused, unnoticed) and the byte."""
    outcomes = []
    for fault in history.faults:
        if fault.kind == "corrupt":
            outcome, _, what = fault.detail.partition(": ")
            outcomes.append({"node": fault.target, "outcome": outcome, "corruption": what})
    return outcomes


async def _converge(monitor: LeaderMonitor, recorder: Recorder) -> bool:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + CONVERGE_TIMEOUT_SECONDS
    while loop.time() < deadline:
        if monitor.converged():
            return True
        await asyncio.sleep(0.2)
    views = {node: None if view is None else (view.role, view.commit_log_max_offset)
             for node, view in monitor.views.items()}
    recorder.record(NoteEvent(recorder.now(), "members did not converge", json.dumps(views)))
    return False


def _verify(options: RunOptions, cluster_dir: Path, out: TextIO) -> int | None:
    """The Spark check's exit code; None when it was skipped (by option, or nothing to check)."""
    if not options.verify or not (cluster_dir / "n0").exists():
        return None
    from spark_analytics.verify import verify

    print("  verifying replicas and the history against them (Spark)", file=out, flush=True)
    history_path = options.report_dir / VERIFY_HISTORY_FILE
    write_verify_history(options.report_dir / HISTORY_FILE, history_path)
    return verify(cluster_dir, report_path=options.report_dir / VERIFY_REPORT_FILE, output=out,
                  history_path=history_path)


def write_verify_history(history_path: Path, out_path: Path) -> None:
    """The history as the Spark check reads it: a transactional send's ack names its half's offset in the
    half topic's queue 0 (the Spark format's ``topic`` field says so; without it the check would look for
    the half's queue offset in the real topic). The committed message's own position is the chaos
    checker's to check. A 5.x send's ack names no queue: its queue offset is left out too (the Spark check
    then checks that it is stored, not where; the chaos checker compares the offset)."""
    with history_path.open(encoding="utf-8") as source, out_path.open("w", encoding="utf-8") as target:
        for line in source:
            if line.startswith('{"type":"send"') and '"queue":null' in line:
                document = json.loads(line)
                document.pop("queue_offset", None)
                line = json.dumps(document, separators=(",", ":")) + "\n"
            if '"transaction":"' in line and '"transaction":""' not in line:
                document = json.loads(line)
                if document.get("type") == "send" and document.get("transaction"):
                    # every half is stored in the half topic's one queue; the ack's queue is the real one
                    line = json.dumps({**document, "topic": TRANS_HALF_TOPIC, "queue": 0},
                                      separators=(",", ":")) + "\n"
            target.write(line)


def _report(options: RunOptions, result: CheckResult, progress: _Progress, verify_code: int | None, verdict: str,
            exit_code: int, elapsed_seconds: float) -> dict[str, Any]:
    return {
        "version": REPORT_VERSION,
        "scenario": options.scenario,
        "seed": options.seed,
        "duration_seconds": options.duration_seconds,
        "verdict": verdict,
        "exit_code": exit_code,
        "drained": progress.drained,
        "converged": progress.converged,
        "error": progress.error,
        "verify": None if verify_code is None else {"exit_code": verify_code, "report": VERIFY_REPORT_FILE},
        "faults": fault_figures(result.unavailability.faults),
        "check": result.to_json(),
        "workload": dataclasses.asdict(options.workload),
        "elapsed_seconds": round(elapsed_seconds, 1),
        "files": {"history": HISTORY_FILE, "timeline": TIMELINE_FILE},
    }


def _print_summary(report: dict[str, Any], out: TextIO) -> None:
    check_figures = report["check"]
    gap = check_figures["unavailability"]["longest_gap"]
    print(f"verdict: {report['verdict']} (drained {report['drained']}, converged {report['converged']}, "
          f"replicas identical {report['replicas_identical']}, "
          f"verify {report['verify']['exit_code'] if report['verify'] else 'skipped'}"
          + (f", error {report['error']}" if report["error"] else "") + ")", file=out)
    for corruption in report.get("corruptions", []):
        print(f"corrupted {corruption['node']}: {corruption['outcome']} ({corruption['corruption']})", file=out)
    print(f"messages {check_figures['messages']}: acked {check_figures['acked']}, unacked {check_figures['unacked']} "
          f"({check_figures['unacked_stored']} stored), longest ack gap "
          f"{gap['seconds'] if gap else '-'} s", file=out)
    for kind, figures in report["faults"].items():
        print(f"  {kind} x{figures['count']}: recovery p50 {figures['recovery_p50_seconds']} s "
              f"max {figures['recovery_max_seconds']} s; longest ack gap p50 {figures['longest_gap_p50_seconds']} s "
              f"max {figures['longest_gap_max_seconds']} s; first ack after p50 "
              f"{figures['first_ack_after_p50_seconds']} s max {figures['first_ack_after_max_seconds']} s", file=out)
    for full in check_figures["full_disk_leaders"]:
        full_gap = full["longest_gap"]
        print(f"  leader {full['node']}'s disk full {full['start']}-{full['end']} s: "
              + ("WEDGED, " if full["wedged"] else "")
              + f"longest ack gap {full_gap['seconds'] if full_gap else '-'} s, acks resumed after "
              f"{_seconds(full['acks_resumed_after_seconds'], 'never')}, stepped down after "
              f"{_seconds(full['stepped_down_after_seconds'], 'never')}, led {full['led_seconds']} s of it "
              f"(bound {full['bound_seconds']} s)", file=out)
    print(f"report: {REPORT_FILE}", file=out, flush=True)


def _seconds(value: float | None, none: str) -> str:
    return none if value is None else f"{value} s"
