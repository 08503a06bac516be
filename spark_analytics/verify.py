"""``verify``: run every check over a cluster directory, write a JSON report, return an exit code.

    python -m spark_analytics.verify --data-dir DIR [--master URL] [--report FILE] [--history FILE]

The checks, in order, over one read of the replicas' files: byte equality of the commit logs; each
replica's integrity and feature invariants; the derived state across replicas (consume queues unit by
unit, the replicated state in the checkpoints); with ``--history``, the client history joined against
every replica (format: :mod:`spark_analytics.history`).

Exit codes: 0 every check holds, 1 some check fails (the report says which, where, and on which
replica), 2 usage error (missing directory, no replicas, unreadable files, an unreadable history, no
Java): nothing was checked.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, TextIO

from spark_analytics.layout import CUT_PREFIX, LayoutError, list_replicas

if TYPE_CHECKING:
    from spark_analytics.rounds import RoundCarry

EXIT_OK: Final = 0
EXIT_FAILED: Final = 1
EXIT_USAGE: Final = 2
REPORT_NAME: Final = "verify-report.json"
#: 2 added derived_state, history and the feature invariants; 3 the live-group audit (``live``, and
#: ``cluster_dir`` null for it)
REPORT_VERSION: Final = 3


def verify(cluster_dir: Path | str, master: str | None = None, report_path: Path | str | None = None,
           output: TextIO | None = None, history_path: Path | str | None = None,
           live: dict[str, Any] | None = None, carried: RoundCarry | None = None,
           on_carry: Callable[[RoundCarry], None] | None = None) -> int:
    """Check the replicas under ``cluster_dir`` (byte equality, each replica's integrity and feature
    invariants, the derived state across replicas, and the client history at ``history_path`` if given)
    and write the report to ``report_path`` (default ``<cluster_dir>/verify-report.json``). A verdict per
    check goes to ``output`` (default stdout), problems to stderr. Uses the active Spark session if there
    is one (``master`` is then ignored), else starts one on ``master`` (default local[2]) and stops it.

    ``cluster_dir`` may also be a live group's cut (:meth:`spark_analytics.remote.RemoteCut.encode`, see
    :mod:`spark_analytics.live`): then ``report_path`` is required and ``live`` (what the members said) goes
    into the report as it is. A round of a continuous audit gets what the previous round read below where
    it starts (``carried``) and hands on its own to ``on_carry`` (:mod:`spark_analytics.rounds`)."""
    out = output if output is not None else sys.stdout
    directory = Path(cluster_dir)
    remote = str(cluster_dir).startswith(CUT_PREFIX)
    try:
        replicas = list_replicas(directory)
    except LayoutError as exc:
        print(f"verify: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if remote and report_path is None:
        print("verify: a live group's audit needs a report path", file=sys.stderr)
        return EXIT_USAGE
    report_file = Path(report_path) if report_path is not None else directory / REPORT_NAME
    if not report_file.parent.is_dir():
        print(f"verify: cannot write the report: {report_file.parent} is not a directory", file=sys.stderr)
        return EXIT_USAGE

    from pyspark.errors import PySparkException
    from pyspark.sql import SparkSession

    from spark_analytics.checks import check_byte_equality, check_integrity
    from spark_analytics.derived import check_derived_state
    from spark_analytics.history import History, HistoryError, check_history, read_history
    from spark_analytics.results import HistoryResult, to_json
    from spark_analytics.session import MASTER_DEFAULT, build_session
    from spark_analytics.tables import ReplicaTables

    history: History | None = None
    if history_path is not None:
        try:  # read before Spark starts: a bad history is a usage error, and a quick one
            history = read_history(history_path)
        except HistoryError as exc:
            print(f"verify: {exc}", file=sys.stderr)
            return EXIT_USAGE

    started = time.perf_counter()
    owned = SparkSession.getActiveSession() is None
    try:
        spark = build_session(master or MASTER_DEFAULT)
    except (PySparkException, OSError) as exc:  # no Java, a bad master URL
        print(f"verify: cannot start Spark: {exc}", file=sys.stderr)
        return EXIT_USAGE
    session_seconds = time.perf_counter() - started
    seconds: dict[str, float] = {"session": round(session_seconds, 3)}
    history_result: HistoryResult | None = None
    try:
        checked = time.perf_counter()
        equality = check_byte_equality(spark, directory)
        seconds["byte_equality"] = round(time.perf_counter() - checked, 3)
        with ReplicaTables(spark, directory) as tables:
            checked = time.perf_counter()
            integrity = check_integrity(spark, directory, tables=tables, carried=carried)
            seconds["integrity"] = round(time.perf_counter() - checked, 3)
            if on_carry is not None:
                from spark_analytics.rounds import carry_forward

                on_carry(carry_forward(spark, tables.records, tables.min_offsets, tables.segment_size, carried))
            checked = time.perf_counter()
            derived = check_derived_state(spark, directory, equality.common_start, equality.common_end, tables)
            seconds["derived_state"] = round(time.perf_counter() - checked, 3)
            if history is not None:
                checked = time.perf_counter()
                history_result = check_history(spark, directory, history, tables)
                seconds["history"] = round(time.perf_counter() - checked, 3)
    except LayoutError as exc:  # files changed or vanished between listing and reading
        print(f"verify: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except PySparkException as exc:  # an executor could not read a file (permissions, I/O errors, races)
        print(f"verify: reading the replicas' files failed: {_first_line(exc)}", file=sys.stderr)
        return EXIT_USAGE
    finally:
        if owned:
            spark.stop()

    ok = equality.ok and integrity.ok and derived.ok and (history_result is None or history_result.ok)
    report: dict[str, Any] = {
        "version": REPORT_VERSION,
        "cluster_dir": None if remote else str(directory.resolve()),
        "live": live,
        "replicas": [replica.name for replica in replicas],
        "ok": ok,
        "byte_equality": to_json(equality),
        "integrity": to_json(integrity),
        "derived_state": to_json(derived),
        "history": to_json(history_result) if history_result is not None else None,
        "seconds": seconds,
    }
    try:
        report_file.write_text(json.dumps(report, indent=2) + "\n")
    except OSError as exc:
        print(f"verify: cannot write the report {report_file}: {exc.strerror}", file=sys.stderr)
        return EXIT_USAGE
    _print_summary(report, report_file, out)
    return EXIT_OK if ok else EXIT_FAILED


def _first_line(exc: Exception) -> str:
    """The line of a Spark error that says what went wrong (a Python worker's own error when there is one)."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    for line in lines:
        if "RemoteError" in line or "LayoutError" in line:
            return line
    return lines[0] if lines else type(exc).__name__


def _print_summary(report: dict[str, Any], report_file: Path, out: TextIO) -> None:
    equality = report["byte_equality"]
    verdict = "ok" if equality["ok"] else f"FAILED (odd: {', '.join(equality['odd_replicas']) or 'no majority'})"
    print(f"byte equality: {verdict}: {equality['bytes_compared_per_replica']} bytes x "
          f"{len(equality['replicas'])} replicas, {equality['blocks_differing']} of {equality['blocks_compared']} "
          f"blocks differ" + (" (each member hashed its own blocks)" if equality["hashed_by"] == "members" else ""),
          file=out)
    for difference in equality["differences"][:3]:
        where = difference["expected"] or {}
        print(f"  {difference['replica']} differs first at byte {difference['physical_offset']} "
              f"({where.get('kind')} {where.get('topic')}/{where.get('queue_id')} queue offset "
              f"{where.get('queue_offset')}, field {where.get('field')})", file=out)
    for note in equality["notes"]:
        print(f"  note: {note}", file=out)
    for replica in report["integrity"]["replicas"]:
        failed = [invariant for invariant in replica["invariants"] if not invariant["ok"]]
        verdict = "ok" if not failed else "FAILED: " + ", ".join(
            f"{invariant['name']} ({invariant['violations']})" for invariant in failed)
        print(f"integrity {replica['replica']}: {verdict}: {replica['messages']} messages, "
              f"{replica['consume_queue_units']} consume-queue units", file=out)
        for invariant in failed:
            for example in invariant["examples"][:2]:
                print(f"  {invariant['name']} at {example['physical_offset']}: {example['detail']}", file=out)
    for note in report["integrity"]["notes"]:
        print(f"  note: {note}", file=out)
    _print_derived(report["derived_state"], out)
    if report["history"] is not None:
        _print_history(report["history"], out)
    print(f"report: {report_file}", file=out)


def _print_derived(derived: dict[str, Any], out: TextIO) -> None:
    queues = derived["consume_queues"]
    verdict = "ok" if queues["ok"] else f"FAILED (odd: {', '.join(queues['odd_replicas']) or 'no majority'})"
    compared = dict(queues["units_compared_per_replica"])
    print(f"consume queues across replicas: {verdict}: {queues['queues_compared']} queues, "
          f"{max(compared.values(), default=0)} units per replica, {queues['buckets_differing']} of "
          f"{queues['buckets_compared']} buckets differ", file=out)
    for difference in queues["differences"][:3]:
        print(f"  {difference['replica']} at {difference['topic']}/{difference['queue_id']} queue offset "
              f"{difference['queue_offset']}: {difference['actual'] or 'no unit'}, the others "
              f"{difference['expected'] or 'no unit'}", file=out)
    for note in queues["notes"]:
        print(f"  note: {note}", file=out)
    state = derived["replicated_state"]
    problems = [f"{replica['replica']}: {replica['problem']}" for replica in state["replicas"] if replica["problem"]]
    verdict = "ok" if state["ok"] else f"FAILED (odd: {', '.join(state['odd_replicas'])})"
    groups = "; ".join(", ".join(group) for group in state["groups_compared"]) or "none"
    print(f"replicated state across replicas: {verdict}: {state['differences_found']} entries differ "
          f"(compared: {groups})", file=out)
    for problem in problems:
        print(f"  {problem}", file=out)
    for difference in state["differences"][:3]:
        key = f"[{difference['key']}]" if difference["key"] else ""
        print(f"  {difference['replica']} {difference['section']}{key} = {difference['actual']}, "
              f"{', '.join(difference['reference_replicas'])}: {difference['expected']} "
              f"(applied index {difference['applied_index']})", file=out)
    for note in state["notes"]:
        print(f"  note: {note}", file=out)


def _print_history(history: dict[str, Any], out: TextIO) -> None:
    print(f"history {history['history_file']}: {history['acknowledged_sends']} acknowledged sends, "
          f"{history['unknown_sends']} unknown, {history['deliveries']} deliveries", file=out)
    for replica in history["replicas"]:
        failed = [check for check in replica["checks"] if not check["ok"]]
        verdict = "ok" if not failed else "FAILED: " + ", ".join(
            f"{check['name']} ({check['violations']})" for check in failed)
        print(f"history {replica['replica']}: {verdict}", file=out)
        for check in failed:
            for example in check["examples"][:2]:
                print(f"  {check['name']}: {example['detail']}", file=out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m spark_analytics.verify", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", required=True, type=Path, help="the cluster directory (<node>/store/ below it)")
    parser.add_argument("--master", default=None, help="Spark master URL (default local[2])")
    parser.add_argument("--report", default=None, type=Path, help=f"report file (default DATA_DIR/{REPORT_NAME})")
    parser.add_argument("--history", default=None, type=Path,
                        help="a client history (JSON lines) to join against the replicas")
    arguments = parser.parse_args(argv)
    return verify(arguments.data_dir, arguments.master, arguments.report, history_path=arguments.history)


if __name__ == "__main__":
    sys.exit(main())
