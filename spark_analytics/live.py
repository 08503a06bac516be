"""``verify`` against a live group: a consistent cut (:mod:`spark_analytics.remote`), every check of
``--data-dir`` on it, and the continuous audit.

    raftmq verify --namesrv HOST:PORT --secret-file group.secret [--master spark://...] [--report FILE]
    raftmq verify --members HOST:PORT,HOST:PORT,... ...
    raftmq verify --namesrv HOST:PORT ... --every 10m [--metrics-port 9108]

One round: ask every member for its positions and files at once; the cut is the smallest applied end among
those that answered; run the checks on the prefix below it while the group keeps serving. A member that did
not answer is reported (``live.unreachable``) and left out; every member that answered has applied the
whole prefix, so one that lags the others only shows as lag (``live.members[].lag_bytes``), never as a
difference.

The continuous audit repeats a round every period, each from where the last one ended: segments wholly
below the previous cut are left out (read as if retention had removed them), so a round reads what is new
plus the segment the previous cut fell in. What a round read before where the next starts is handed on
(:mod:`spark_analytics.rounds`): store-timestamp order and the UNIQ_KEY window are checked across rounds.
After each round it prints one line and, with a metrics port, serves the figures as Prometheus text (stdlib
HTTP server: no dependency on the broker's metrics).
"""

from __future__ import annotations

import http.server
import json
import re
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, TextIO

from protocol.codes import RequestCode, ResponseCode
from protocol.route_data import ClusterInfo
from spark_analytics.remote import (
    STATUS_TIMEOUT_SECONDS,
    Access,
    MemberClient,
    RemoteCut,
    RemoteError,
    take_cut,
)

if TYPE_CHECKING:
    from spark_analytics.rounds import RoundCarry

EXIT_OK: Final = 0
EXIT_FAILED: Final = 1
EXIT_USAGE: Final = 2
PERIOD_UNITS: Final = {"s": 1, "m": 60, "h": 3600}
#: runs of one round's checks: again without members that went away during the first
ATTEMPTS_MAX: Final = 2
PERIOD_PATTERN: Final = re.compile(r"^(\d+(?:\.\d+)?)([smh]?)$")


class LiveError(Exception):
    """No member to audit (no name server answer, no group, a bad member list): a usage error."""


def parse_period(text: str) -> float:
    """``10m``, ``30s``, ``1h`` or plain seconds."""
    match = PERIOD_PATTERN.match(text.strip())
    if match is None or float(match.group(1)) <= 0:
        raise LiveError(f"a period is a positive number with s, m or h, got {text!r}")
    return float(match.group(1)) * PERIOD_UNITS[match.group(2) or "s"]


def group_members(namesrv: str, group: str | None = None) -> list[str]:
    """The member addresses the name servers list for a broker group (the only one, or ``group``)."""
    errors = []
    for address in [part.strip() for part in namesrv.split(";") if part.strip()]:
        try:
            response = MemberClient(address, None, timeout_seconds=10.0).request(RequestCode.GET_BROKER_CLUSTER_INFO, {})
        except (RemoteError, OSError) as exc:
            errors.append(str(exc))
            continue
        if response.code != ResponseCode.SUCCESS:
            errors.append(f"{address} answered code {response.code}")
            continue
        groups = ClusterInfo.decode(response.body).broker_datas
        if group is None and len(groups) != 1:
            raise LiveError(f"the name server lists {len(groups)} broker groups ({', '.join(sorted(groups))}): "
                            f"name one with --group")
        name = group if group is not None else next(iter(groups))
        if name not in groups:
            raise LiveError(f"the name server lists no broker group {name!r}")
        return sorted(set(groups[name].broker_addresses.values()))
    raise LiveError("no name server answered: " + "; ".join(errors))


def live_section(cut: RemoteCut) -> dict[str, Any]:
    """What the report says about the members and the cut."""
    answered = cut.answered
    furthest = max((member.applied_end for member in answered), default=0)
    return {
        "cut": cut.cut,
        "since": cut.since,
        "taken_at": cut.taken_at,
        "members": [
            {"member": member.name, "address": member.address,
             **({"problem": member.problem} if member.status is None else {
                 "role": member.status.get("role"), "commit_index": member.status.get("commit_index"),
                 "applied_index": member.status.get("applied_index"),
                 "applied_end": member.status.get("applied_end"), "durable_end": member.status.get("durable_end"),
                 "min_offset": member.status.get("min_offset"), "lag_bytes": furthest - member.applied_end})}
            for member in cut.members
        ],
        "unreachable": [member.name for member in cut.members if member.status is None],
    }


@dataclass
class AuditRound:
    """The outcome of one round, for the printed line and the metrics."""

    exit_code: int
    cut: int
    since: int
    finished_at: float
    bytes_audited: int
    findings: int
    unreachable: tuple[str, ...]
    seconds: float
    members: int
    #: what the next round needs of this one's records (None when the checks did not run)
    carry: RoundCarry | None = None


def audit_once(addresses: list[str], access: Access, report_path: Path, master: str | None = None,
               since: int = 0, output: TextIO | None = None,
               status_timeout_seconds: float = STATUS_TIMEOUT_SECONDS,
               carried: RoundCarry | None = None) -> AuditRound:
    """One round: take the cut, run the checks, write the report. Findings: differences and violations.
    ``carried``: what the previous round handed on (:mod:`spark_analytics.rounds`), so store timestamps and
    UNIQ_KEY copies are compared across the rounds' boundary; the result carries this round's.

    A member can go away during the job: its reads fail and the checks cannot finish (``verify`` exits 2).
    The members are then asked again; when fewer answer, the round is run again on a new cut without the
    ones that went away (reported unreachable), at most :data:`ATTEMPTS_MAX` times."""
    from spark_analytics.verify import verify

    started = time.perf_counter()
    out = output if output is not None else sys.stdout
    cut = take_cut(addresses, access, since, status_timeout_seconds)
    for attempt in range(ATTEMPTS_MAX):
        live = live_section(cut)
        for member in cut.members:
            if member.status is None:
                print(f"member {member.name} unreachable, left out: {member.problem}", file=out)
        if not cut.answered:
            return AuditRound(EXIT_USAGE, cut.cut, since, time.time(), 0, 0, tuple(live["unreachable"]),
                              time.perf_counter() - started, 0)
        print(f"cut at {cut.cut} (the smallest applied end of {len(cut.answered)} members)"
              + (f", audited from segment of {since}" if since else ""), file=out)
        carries: list[RoundCarry] = []
        code = verify(cut.encode(), master=master, report_path=report_path, output=out, live=live, carried=carried,
                      on_carry=carries.append)
        if code != EXIT_USAGE or attempt == ATTEMPTS_MAX - 1:
            break
        again = take_cut(addresses, access, since, status_timeout_seconds)
        if len(again.answered) >= len(cut.answered):
            break  # nobody went away: the failure is something else, and stands
        print(f"{len(cut.answered) - len(again.answered)} member(s) stopped answering during the audit: "
              f"auditing again without them", file=out)
        cut = again
    audited, findings = 0, 0
    if code in (EXIT_OK, EXIT_FAILED):
        report = json.loads(report_path.read_text())
        audited = int(report["byte_equality"]["bytes_compared_per_replica"])
        findings = count_findings(report)
    return AuditRound(code, cut.cut, since, time.time(), audited, findings, tuple(live["unreachable"]),
                      time.perf_counter() - started, len(cut.answered),
                      carries[-1] if carries and code in (EXIT_OK, EXIT_FAILED) else None)


def count_findings(report: dict[str, Any]) -> int:
    """Differences between replicas plus violations of each replica's invariants."""
    findings = int(report["byte_equality"]["blocks_differing"])
    for replica in report["integrity"]["replicas"]:
        findings += sum(int(invariant["violations"]) for invariant in replica["invariants"])
    derived = report["derived_state"]
    findings += int(derived["consume_queues"]["buckets_differing"])
    findings += int(derived["replicated_state"]["differences_found"])
    return findings


@dataclass
class AuditMetrics:
    """The figures of the continuous audit, as Prometheus text."""

    rounds: int = 0
    bytes_audited_total: int = 0
    last: AuditRound | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, done: AuditRound) -> None:
        with self.lock:
            self.rounds += 1
            self.bytes_audited_total += done.bytes_audited
            self.last = done

    def text(self) -> str:
        with self.lock:
            last = self.last
            lines = [
                "# HELP raftmq_audit_rounds_total Audit rounds finished.",
                "# TYPE raftmq_audit_rounds_total counter",
                f"raftmq_audit_rounds_total {self.rounds}",
                "# HELP raftmq_audit_bytes_total Commit-log bytes per replica audited, all rounds.",
                "# TYPE raftmq_audit_bytes_total counter",
                f"raftmq_audit_bytes_total {self.bytes_audited_total}",
            ]
            if last is not None:
                lines += [
                    "# HELP raftmq_audit_last_timestamp_seconds When the last round finished (Unix time).",
                    "# TYPE raftmq_audit_last_timestamp_seconds gauge",
                    f"raftmq_audit_last_timestamp_seconds {last.finished_at:.3f}",
                    "# HELP raftmq_audit_last_bytes Commit-log bytes per replica the last round audited.",
                    "# TYPE raftmq_audit_last_bytes gauge",
                    f"raftmq_audit_last_bytes {last.bytes_audited}",
                    "# HELP raftmq_audit_last_findings Differences and violations the last round found.",
                    "# TYPE raftmq_audit_last_findings gauge",
                    f"raftmq_audit_last_findings {last.findings}",
                    "# HELP raftmq_audit_last_cut_offset The commit-log offset the last round audited up to.",
                    "# TYPE raftmq_audit_last_cut_offset gauge",
                    f"raftmq_audit_last_cut_offset {last.cut}",
                    "# HELP raftmq_audit_last_members_unreachable Members the last round could not reach.",
                    "# TYPE raftmq_audit_last_members_unreachable gauge",
                    f"raftmq_audit_last_members_unreachable {len(last.unreachable)}",
                    "# HELP raftmq_audit_last_ok 1 when the last round found nothing and could run.",
                    "# TYPE raftmq_audit_last_ok gauge",
                    f"raftmq_audit_last_ok {int(last.exit_code == EXIT_OK)}",
                ]
            return "\n".join(lines) + "\n"


def serve_metrics(metrics: AuditMetrics, port: int, host: str = "127.0.0.1") -> http.server.ThreadingHTTPServer:
    """A thread serving ``GET /metrics``; ``shutdown()`` the returned server to stop it."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.split("?")[0] != "/metrics":
                self.send_error(404)
                return
            body = metrics.text().encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            return

    server = http.server.ThreadingHTTPServer((host, port), Handler)
    threading.Thread(target=server.serve_forever, name="audit-metrics", daemon=True).start()
    return server


def round_line(done: AuditRound) -> str:
    verdict = {EXIT_OK: "ok", EXIT_FAILED: "FINDINGS"}.get(done.exit_code, "NOT RUN")
    return (f"audit {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(done.finished_at))} {verdict}: "
            f"[{done.since}, {done.cut}) {done.bytes_audited} bytes x {done.members} members, "
            f"{done.findings} findings, {len(done.unreachable)} unreachable"
            + (f" ({', '.join(done.unreachable)})" if done.unreachable else "") + f", {done.seconds:.1f} s")


def audit_continuously(addresses: list[str], access: Callable[[], Access], report_dir: Path, every_seconds: float,
                       master: str | None = None, metrics: AuditMetrics | None = None, rounds_max: int | None = None,
                       output: TextIO | None = None, sleep: Callable[[float], None] = time.sleep,
                       status_timeout_seconds: float = STATUS_TIMEOUT_SECONDS) -> int:
    """Audit every ``every_seconds``, each round from the previous cut; each round's report is
    ``report_dir/verify-report-<cut>.json``. Runs ``rounds_max`` rounds (forever when None); returns the
    worst exit code seen (0, 1, or 2 when a round could not run). ``access`` is asked for credentials at
    every round (an audit key expires; a fresh one per round)."""
    out = output if output is not None else sys.stdout
    metrics = metrics if metrics is not None else AuditMetrics()
    since = 0
    carried: RoundCarry | None = None
    worst = EXIT_OK
    rounds = 0
    while rounds_max is None or rounds < rounds_max:
        started = time.monotonic()
        report = report_dir / "verify-report-live.json"
        done = audit_once(addresses, access(), report, master, since, out, status_timeout_seconds, carried)
        if done.exit_code in (EXIT_OK, EXIT_FAILED):
            report.replace(report_dir / f"verify-report-{done.cut}.json")
            since = done.cut  # the next round starts where this one ended
            carried = done.carry  # and compares what it reads with what this one read before it
        metrics.record(done)
        print(round_line(done), file=out, flush=True)
        worst = max(worst, done.exit_code)
        rounds += 1
        if rounds_max is not None and rounds >= rounds_max:
            break
        sleep(max(0.0, every_seconds - (time.monotonic() - started)))
    return worst
