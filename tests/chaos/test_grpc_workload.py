"""A short chaos run with RocketMQ 5.x clients in the workload (chaos.grpc_workload): one of the producers sends
over gRPC (FIFO, a message group per sharding key) and a 5.x consumer group of two SimpleConsumers receives and
acknowledges (pop through Raft) next to the 4.x groups, while the leader is SIGKILLed. The checker holds the 5.x
operations to the same promises (nothing acknowledged lost, each key in order, one position per message, nothing
received that was not sent) and one of pop's own: a message whose ack the leader answered OK never comes back.

The suite runs a short leader kill (about 25 s on two shared cores). Longer runs, any scenario, are opt-in:

    RAFTMQ_CHAOS_GRPC=1 .venv/bin/pytest tests/chaos/test_grpc_workload.py -k any_scenario -s

``RAFTMQ_CHAOS_GRPC_SCENARIO`` names the scenario (default mixed) and ``RAFTMQ_CHAOS_GRPC_SECONDS`` the seconds of
faults (default 60). Fixed seed; the runner stops every process it started, which each test checks.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
from pathlib import Path
from typing import Final

import pytest

from chaos.grpc_workload import NAME_SUFFIX
from chaos.history import read_history
from chaos.runner import RunOptions, run
from chaos.scenarios import SCENARIOS
from chaos.workload import WorkloadConfig
from cli.cluster import ClusterInfo, is_alive
from tests.support.stores import small_store

pytestmark = pytest.mark.slow

VARIABLE: Final = "RAFTMQ_CHAOS_GRPC"
GROUP_V5: Final = "chaos-v5"
#: two 4.x producers and one 5.x, at a modest rate (the group shares two cores); the 4.x groups as always
WORKLOAD: Final = dataclasses.replace(WorkloadConfig(), producers=3, rate_per_producer=20.0, grpc_producers=1,
                                      grpc_groups=(GROUP_V5,), grpc_consumers_per_group=2)


def run_with_5x_clients(scenario: str, report_dir: Path, duration_seconds: float) -> None:
    """Run ``scenario`` with :data:`WORKLOAD`; assert a clean verdict in which the 5.x clients took part."""
    out = io.StringIO()
    outcome = run(RunOptions(scenario, report_dir, duration_seconds=duration_seconds, seed=27, workload=WORKLOAD,
                             warmup_seconds=2.0, cooldown_seconds=3.0, drain_timeout_seconds=60.0, verify=False,
                             keep_data=True, overrides=small_store(SCENARIOS[scenario].overrides)), out)
    printed = out.getvalue()
    info = ClusterInfo.load(report_dir / "cluster")
    left = [pid for pid in (info.namesrv_pid, *(node.pid for node in info.nodes)) if is_alive(pid)]
    assert left == [], f"processes left running: {left}"
    history = read_history(report_dir / "history.jsonl")
    v5_sends = [send for send in history.sends if send.producer.endswith(NAME_SUFFIX)]
    v5_acked = {send.uniq_key for send in v5_sends if send.acked}
    pops = [delivery for delivery in history.deliveries if delivery.group == GROUP_V5]
    pop_acks = [pop_ack for pop_ack in history.pop_acks if pop_ack.acked]
    figures = outcome.report["check"]
    print(f"\n{scenario}: {figures['acked']} acknowledged sends ({len(v5_acked)} over 5.x, of {len(v5_sends)} 5.x "
          f"attempts); {GROUP_V5}: {len(pops)} deliveries ({sum(1 for pop in pops if pop.attempt > 1)} "
          f"redelivered), {len(pop_acks)} acks taken of {len(history.pop_acks)}; "
          f"faults {json.dumps(outcome.report['faults'])}")
    assert outcome.verdict == "clean", printed
    assert outcome.report["drained"] and outcome.report["replicas_identical"], printed
    # the 5.x clients took part: sends acknowledged and received by every group, 4.x and 5.x; acks taken
    assert len(v5_acked) > 20, printed
    for group in WORKLOAD.group_names:
        received = {delivery.uniq_key for delivery in history.deliveries if delivery.group == group}
        assert v5_acked <= received, group
    assert len(pop_acks) > 20 and any(pop.attempt > 1 for pop in pops), printed


def test_a_leader_kill_under_5x_producers_and_consumers_short_run_is_clean(tmp_path: Path) -> None:
    """Six seconds of faults: one leader kill (2-4 s in; the member stays down to the end of the faults)."""
    run_with_5x_clients("kill-leader", tmp_path / "kill-leader", 6.0)
    assert "kill" in json.loads((tmp_path / "kill-leader" / "report.json").read_text())["faults"]


@pytest.mark.skipif(os.environ.get(VARIABLE) != "1", reason=f"a long 5.x chaos run ({VARIABLE}=1)")
def test_any_scenario_with_5x_clients_is_clean(tmp_path: Path) -> None:
    scenario = os.environ.get("RAFTMQ_CHAOS_GRPC_SCENARIO", "mixed")
    run_with_5x_clients(scenario, tmp_path / scenario, float(os.environ.get("RAFTMQ_CHAOS_GRPC_SECONDS", "60")))
