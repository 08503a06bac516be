"""The power-loss scenario pointed at NATS JetStream (chaos.nats_power_loss), run short: three real
nats-server processes on powerfs, one or two cuts of all three under acknowledged publishes, and the
report with its figures. What NATS loses depends on timing, so only the figures' sanity is checked here,
never that it loses (or keeps) anything.

Opt-in (``RAFTMQ_CHAOS_NATS=1``): it measures NATS, not a property of raftmq, and `make test` already
spends minutes of two cores on raftmq's own chaos runs. It is skipped, with the reason, when nats-server
(Debian's; `make bench-packages` installs it) or FUSE mounts are missing.
"""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pytest

from chaos import nats_cluster, powerfs
from chaos.nats_power_loss import PUBLISHES_FILE, REPORT_FILE, NatsRunOptions, run

pytestmark = pytest.mark.slow

#: set to 1 to run the NATS comparison
NATS_VARIABLE = "RAFTMQ_CHAOS_NATS"


@pytest.mark.skipif(os.environ.get(NATS_VARIABLE) != "1",
                    reason=f"the NATS comparison measures NATS, not raftmq ({NATS_VARIABLE}=1 runs it)")
def test_power_loss_on_nats_short_run_reports_sane_figures(tmp_path: Path) -> None:
    if (reason := nats_cluster.nats_unavailable()) is not None:
        pytest.skip(f"the NATS power-loss run cannot run here: {reason}")
    report_dir = tmp_path / "power-loss-nats"
    out = io.StringIO()
    outcome = run(NatsRunOptions(report_dir, duration_seconds=8.0, seed=15, producers=2, rate_per_producer=30.0,
                                 warmup_seconds=2.0, cooldown_seconds=2.0, keep_data=True), out)
    printed = out.getvalue()
    report = json.loads((report_dir / REPORT_FILE).read_text())
    assert outcome.verdict in ("clean", "violations") and report["verdict"] == outcome.verdict, printed
    assert 1 <= report["cuts"] <= 2 and len(report["cut_details"]) == report["cuts"], printed
    figures = report["check"]
    assert report["acked"] > 100 and figures["messages"] >= report["acked"], printed
    assert 0 <= report["lost"] <= report["acked"] and 0 <= report["reordered"] <= report["acked"], printed
    assert figures["stored"] <= figures["messages"] + figures["stored_twice"] + figures["phantom"], printed
    assert set(report["replicas"]) == {"n0", "n1", "n2"}, printed
    assert f"acked {report['acked']}, lost {report['lost']}" in printed
    publishes = (report_dir / PUBLISHES_FILE).read_text().splitlines()
    assert len(publishes) == figures["messages"]
    # every server stopped, every disk given back (the stores back in place on the real disk)
    cluster_dir = report_dir / "cluster"
    assert nats_cluster.running_servers(cluster_dir) == []
    assert powerfs.mounted_powerfs(tmp_path) == [] and not list(cluster_dir.glob("*/.*.powerfs"))
    assert all((cluster_dir / name / "store").is_dir() for name in ("n0", "n1", "n2"))
