"""``verify``: run every check over a cluster directory, write a JSON report, return an exit code.

    python -m spark_analytics.verify --data-dir DIR [--master URL] [--report FILE]

Exit codes: 0 every check holds, 1 some check fails (the report says which, where, and on which
replica), 2 usage error (missing directory, no replicas, unreadable files, no Java): nothing was checked.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Final, TextIO

from spark_analytics.layout import LayoutError, list_replicas

EXIT_OK: Final = 0
EXIT_FAILED: Final = 1
EXIT_USAGE: Final = 2
REPORT_NAME: Final = "verify-report.json"
REPORT_VERSION: Final = 1


def verify(cluster_dir: Path | str, master: str | None = None, report_path: Path | str | None = None,
           output: TextIO | None = None) -> int:
    """Check the replicas under ``cluster_dir`` (byte equality, then each replica's integrity) and write
    the report to ``report_path`` (default ``<cluster_dir>/verify-report.json``). A one-line verdict per
    check goes to ``output`` (default stdout), problems to stderr. Uses the active Spark session if there
    is one (``master`` is then ignored), else starts one on ``master`` (default local[2]) and stops it."""
    out = output if output is not None else sys.stdout
    directory = Path(cluster_dir)
    try:
        replicas = list_replicas(directory)
    except LayoutError as exc:
        print(f"verify: {exc}", file=sys.stderr)
        return EXIT_USAGE
    report_file = Path(report_path) if report_path is not None else directory / REPORT_NAME
    if not report_file.parent.is_dir():
        print(f"verify: cannot write the report: {report_file.parent} is not a directory", file=sys.stderr)
        return EXIT_USAGE

    from pyspark.errors import PySparkException
    from pyspark.sql import SparkSession

    from spark_analytics.checks import check_byte_equality, check_integrity
    from spark_analytics.results import to_json
    from spark_analytics.session import MASTER_DEFAULT, build_session

    started = time.perf_counter()
    owned = SparkSession.getActiveSession() is None
    try:
        spark = build_session(master or MASTER_DEFAULT)
    except (PySparkException, OSError) as exc:  # no Java, a bad master URL
        print(f"verify: cannot start Spark: {exc}", file=sys.stderr)
        return EXIT_USAGE
    session_seconds = time.perf_counter() - started
    try:
        checked = time.perf_counter()
        equality = check_byte_equality(spark, directory)
        equality_seconds = time.perf_counter() - checked
        checked = time.perf_counter()
        integrity = check_integrity(spark, directory)
        integrity_seconds = time.perf_counter() - checked
    except LayoutError as exc:  # files changed or vanished between listing and reading
        print(f"verify: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except PySparkException as exc:  # an executor could not read a file (permissions, I/O errors, races)
        print(f"verify: reading the replicas' files failed: {str(exc).strip().splitlines()[0]}", file=sys.stderr)
        return EXIT_USAGE
    finally:
        if owned:
            spark.stop()

    ok = equality.ok and integrity.ok
    report: dict[str, Any] = {
        "version": REPORT_VERSION,
        "cluster_dir": str(directory.resolve()),
        "replicas": [replica.name for replica in replicas],
        "ok": ok,
        "byte_equality": to_json(equality),
        "integrity": to_json(integrity),
        "seconds": {"session": round(session_seconds, 3), "byte_equality": round(equality_seconds, 3),
                    "integrity": round(integrity_seconds, 3)},
    }
    try:
        report_file.write_text(json.dumps(report, indent=2) + "\n")
    except OSError as exc:
        print(f"verify: cannot write the report {report_file}: {exc.strerror}", file=sys.stderr)
        return EXIT_USAGE
    _print_summary(report, report_file, out)
    return EXIT_OK if ok else EXIT_FAILED


def _print_summary(report: dict[str, Any], report_file: Path, out: TextIO) -> None:
    equality = report["byte_equality"]
    verdict = "ok" if equality["ok"] else f"FAILED (odd: {', '.join(equality['odd_replicas']) or 'no majority'})"
    print(f"byte equality: {verdict}: {equality['bytes_compared_per_replica']} bytes x "
          f"{len(equality['replicas'])} replicas, {equality['blocks_differing']} of {equality['blocks_compared']} "
          f"blocks differ", file=out)
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
    print(f"report: {report_file}", file=out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m spark_analytics.verify", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", required=True, type=Path, help="the cluster directory (<node>/store/ below it)")
    parser.add_argument("--master", default=None, help="Spark master URL (default local[2])")
    parser.add_argument("--report", default=None, type=Path, help=f"report file (default DATA_DIR/{REPORT_NAME})")
    arguments = parser.parse_args(argv)
    return verify(arguments.data_dir, arguments.master, arguments.report)


if __name__ == "__main__":
    sys.exit(main())
