"""`raftmq verify`'s live-group options, without a group: what is a usage error, and the pieces the
continuous audit is made of (periods, the printed line, the metrics text)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from cli.main import main
from spark_analytics.live import AuditMetrics, AuditRound, LiveError, parse_period, round_line


@pytest.mark.parametrize(("arguments", "message"), [
    ([], "exactly one of --data-dir, --namesrv and --members"),
    (["--data-dir", ".", "--members", "127.0.0.1:1"], "exactly one of"),
    (["--data-dir", ".", "--every", "10m"], "for a live group"),
    (["--members", "127.0.0.1:1"], "needs --secret-file"),
    (["--members", "127.0.0.1:1", "--history", "h.jsonl"], "--history is for a stopped group"),
])
def test_usage_errors(arguments: list[str], message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAFTMQ_ACCESS_KEY", raising=False)
    monkeypatch.delenv("RAFTMQ_SECRET_KEY", raising=False)
    result = CliRunner().invoke(main, ["verify", *arguments])
    assert result.exit_code == 2 and message in result.output, result.output


def test_an_every_period_is_a_positive_number_of_seconds_minutes_or_hours(tmp_path: Path) -> None:
    assert [parse_period(text) for text in ("10m", "30s", "1h", "2.5", "0.5m")] == [600, 30, 3600, 2.5, 30]
    for text in ("0s", "-1m", "10 minutes", "m"):
        with pytest.raises(LiveError):
            parse_period(text)
    secret = tmp_path / "group.secret"
    secret.write_text("0" * 32)
    result = CliRunner().invoke(main, ["verify", "--members", "127.0.0.1:1", "--secret-file", str(secret),
                                       "--every", "soon"])
    assert result.exit_code == 2 and "a period is a positive number" in result.output


def test_each_round_is_one_line_and_the_metrics_follow_the_last() -> None:
    metrics = AuditMetrics()
    assert "raftmq_audit_rounds_total 0" in metrics.text() and "last" not in metrics.text()
    first = AuditRound(0, 4096, 0, 1_800_000_000.0, 4096, 0, (), 12.5, 3)
    second = AuditRound(1, 8192, 4096, 1_800_000_600.0, 6000, 2, ("127.0.0.1:9",), 10.0, 2)
    metrics.record(first)
    metrics.record(second)
    text = metrics.text()
    for line in ("raftmq_audit_rounds_total 2", "raftmq_audit_bytes_total 10096", "raftmq_audit_last_findings 2",
                 "raftmq_audit_last_cut_offset 8192", "raftmq_audit_last_members_unreachable 1",
                 "raftmq_audit_last_ok 0", "raftmq_audit_last_timestamp_seconds 1800000600.000",
                 "raftmq_audit_last_bytes 6000"):
        assert f"\n{line}\n" in f"\n{text}"
    assert round_line(first).endswith(" ok: [0, 4096) 4096 bytes x 3 members, 0 findings, 0 unreachable, 12.5 s")
    assert "FINDINGS" in round_line(second) and "(127.0.0.1:9)" in round_line(second)


def test_a_member_that_goes_away_during_the_job_is_left_out_of_a_second_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import spark_analytics.live as live
    import spark_analytics.verify as verify_module
    from spark_analytics.remote import Access, MemberState, RemoteCut

    def member(name: str, end: int | None) -> MemberState:
        if end is None:
            return MemberState(f"127.0.0.1:{name}", f"127.0.0.1:{name}", None, "connection refused")
        return MemberState(name, f"127.0.0.1:{name}", {"applied_end": end, "files": {}})

    cuts = [RemoteCut((member("1", 500), member("2", 400), member("3", 450)), 400, "", 0.0),
            RemoteCut((member("1", 700), member("2", None), member("3", 650)), 650, "", 0.0)]
    taken: list[RemoteCut] = []

    def take_cut(*_: object) -> RemoteCut:
        taken.append(cuts[min(len(taken), 1)])
        return taken[-1]

    runs: list[str] = []

    def verify(cut_text: str, **options: object) -> int:
        runs.append(cut_text)
        if len(runs) == 1:
            return 2  # an executor's read failed
        report = {"byte_equality": {"bytes_compared_per_replica": 650, "blocks_differing": 0},
                  "integrity": {"replicas": []},
                  "derived_state": {"consume_queues": {"buckets_differing": 0},
                                    "replicated_state": {"differences_found": 0}}}
        Path(str(options["report_path"])).write_text(json.dumps(report))
        return 0

    monkeypatch.setattr(live, "take_cut", take_cut)
    monkeypatch.setattr(verify_module, "verify", verify)
    output = io.StringIO()
    done = live.audit_once(["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"], Access(), tmp_path / "r.json",
                           output=output)
    assert (done.exit_code, done.cut, done.members, done.unreachable, done.bytes_audited) == (
        0, 650, 2, ("127.0.0.1:2",), 650)
    assert len(runs) == 2 and runs == [cuts[0].encode(), cuts[1].encode()]
    assert "stopped answering during the audit" in output.getvalue()
