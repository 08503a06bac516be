"""The ``raftmq`` command."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import click

from cli.extras import require_extra
from commitlog.config import ConfigError, StoreConfig
from commitlog.errors import StoreError
from commitlog.hosts import encode_host
from commitlog.message import MessageInput
from commitlog.outcomes import AppendStatus
from commitlog.record_codec import decode_record
from commitlog.store import MessageStore
from protocol.properties import encode_properties

USAGE_ERROR = 2


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="raftmq")
def main() -> None:
    """raftmq: a RocketMQ-compatible broker group whose commit log is replicated by Raft."""


@main.command()
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where to put the cluster (default: a temporary directory, removed afterwards).")
@click.option("--count", type=click.IntRange(1, 10_000_000), default=None,
              help="Messages to send (default: 2,000; 20,000 with --store-only).")
@click.option("--queues", type=click.IntRange(1, 1024), default=4, show_default=True,
              help="Queues of the store-only demo.")
@click.option("--store-only", is_flag=True, help="Only the local store: write, crash-reopen, read back.")
@click.option("--no-verify", is_flag=True, help="Skip the Spark consistency check at the end.")
def demo(data_dir: Path | None, count: int | None, queues: int, store_only: bool, no_verify: bool) -> None:
    """The main job: a three-node group, every kind of message, the leader killed halfway, every
    acknowledged message consumed, the replicas verified byte for byte by Spark.

    \b
    Example:
      raftmq demo
      raftmq demo --data-dir ./demo --count 5000
      raftmq demo --store-only --count 50000
    """
    temporary = data_dir is None
    root = Path(tempfile.mkdtemp(prefix="raftmq-demo-")) if data_dir is None else data_dir
    try:
        if store_only:
            _run_demo(root / "store", count or 20_000, queues)
            return
        if not no_verify:
            require_extra("spark", "the demo's Spark check (--no-verify skips it)")
        from cli.cluster import ClusterError
        from cli.demo import run_demo

        try:
            code = run_demo(root, count or 2_000, verify=not no_verify)
        except ClusterError as exc:
            raise click.ClickException(str(exc)) from exc
        if code:
            raise SystemExit(code)
    finally:
        if temporary:
            shutil.rmtree(root, ignore_errors=True)


def _run_demo(directory: Path, count: int, queues: int) -> None:
    try:
        config = StoreConfig(data_dir=directory, segment_size_bytes=64 << 20).validate()
        store = MessageStore(config)
    except (ConfigError, StoreError) as exc:
        raise click.ClickException(str(exc)) from exc
    host = encode_host("127.0.0.1", 50000)
    raft_index = store.applied_raft_index
    started = time.perf_counter()
    batch_size = 128
    with click.progressbar(length=count, label="append") as bar:
        for first in range(0, count, batch_size):
            raft_index += 1
            batch = [
                MessageInput("DemoTopic", number % queues, 0, 0, int(time.time() * 1000), host,
                             int(time.time() * 1000), 0, 0, f"message {number}".encode() * 50,
                             encode_properties({"TAGS": f"tag{number % 3}", "KEYS": f"order-{number}",
                                                "UNIQ_KEY": f"DEMO{number:028d}"}))
                for number in range(first, min(first + batch_size, count))
            ]
            outcome = store.append(raft_index, batch)
            if any(result.status is AppendStatus.REJECTED for result in outcome.results):
                raise click.ClickException("the store rejected a demo message")
            bar.update(len(batch))
    append_seconds = time.perf_counter() - started
    # reopen without flushing or closing: what a process crash leaves behind
    store.abandon()
    reopened = MessageStore(config)
    consumed = 0
    for queue_id in range(queues):
        offset = reopened.min_queue_offset("DemoTopic", queue_id)
        while True:
            result = reopened.get_messages("DemoTopic", queue_id, offset, 256)
            if not result.messages:
                break
            for raw in result.messages:
                if decode_record(raw).queue_id != queue_id:
                    raise click.ClickException("read a record from the wrong queue")
            consumed += len(result.messages)
            offset = result.next_begin_offset
    found = reopened.query_by_key("DemoTopic", f"order-{count // 2}", 1)
    reopened.close()
    summary = {
        "written": count,
        "read_back_after_reopen": consumed,
        "append_seconds": round(append_seconds, 2),
        "commit_log_bytes": reopened.max_physical_offset,
        "query_by_key": found[0].msg_id if found else None,
    }
    click.echo(json.dumps(summary))
    if consumed != count or not found:
        raise click.ClickException("the store did not return everything it acknowledged")


@main.command()
@click.option("--data-dir", default=None, type=click.Path(path_type=Path),
              help="The cluster directory of a stopped group: one sub-directory per replica (n0, n1, ...), each "
                   "with store/.")
@click.option("--namesrv", default=None, help="A live group: its name server(s), HOST:PORT[;HOST:PORT].")
@click.option("--members", default=None, help="A live group: its members' broker addresses, HOST:PORT,HOST:PORT,...")
@click.option("--group", default=None, help="With --namesrv: the broker group, when the name server lists several.")
@click.option("--secret-file", default=None, type=click.Path(dir_okay=False, exists=True, path_type=Path),
              help="A live group without ACL: the group secret file (audit keys derive from it). With ACL, set "
                   "RAFTMQ_ACCESS_KEY and RAFTMQ_SECRET_KEY to an admin account instead.")
@click.option("--every", default=None, help="A live group: audit again every PERIOD (10m, 30s, 1h), each round "
                                            "from where the last ended.")
@click.option("--rounds", default=None, type=click.IntRange(min=1), help="With --every: stop after this many rounds.")
@click.option("--metrics-port", default=None, type=click.IntRange(1, 65535),
              help="With --every: serve the audit's figures as Prometheus text on 127.0.0.1:PORT/metrics.")
@click.option("--master", default=None, help="A Spark master URL (default: an embedded local[2] session).")
@click.option("--report", type=click.Path(path_type=Path), default=None,
              help="Where to write the JSON report (default: DATA_DIR/verify-report.json; for a live group "
                   "./verify-report.json, with --every a directory, default .).")
@click.option("--history", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="A client history (JSON lines, see spark_analytics/history.py) to join against the replicas.")
def verify(data_dir: Path | None, namesrv: str | None, members: str | None, group: str | None,
           secret_file: Path | None, every: str | None, rounds: int | None, metrics_port: int | None,
           master: str | None, report: Path | None, history: Path | None) -> None:
    """Check with Spark that the replicas are byte-identical and each one is intact: integrity and feature
    invariants per replica, consume queues and replicated state across replicas, and with --history the
    acknowledged sends and deliveries of a client history.

    A stopped group is read from --data-dir. A live group (--namesrv or --members) is read over the network
    from its members (read-only, authenticated), on the prefix every member has applied when the job starts,
    while it keeps serving; a member that does not answer is reported and left out.

    Exit code 0 when every check holds, 1 when one fails (the report says where), 2 for usage errors.

    \b
    Example:
      raftmq verify --data-dir ./demo-data
      raftmq verify --data-dir /srv/raftmq --master spark://spark-master:7077 --report out.json
      raftmq verify --data-dir ./chaos-run --history ./chaos-run/history.jsonl
      raftmq verify --namesrv 10.0.0.5:9876 --secret-file group.secret --master spark://spark-master:7077
      raftmq verify --namesrv 10.0.0.5:9876 --secret-file group.secret --every 10m --metrics-port 9108
    """
    if (data_dir is not None) + (namesrv is not None) + (members is not None) != 1:
        raise click.UsageError("give exactly one of --data-dir, --namesrv and --members")
    require_extra("spark", "raftmq verify")
    if data_dir is not None:
        if every is not None or secret_file is not None:
            raise click.UsageError("--every and --secret-file are for a live group (--namesrv, --members)")
        from spark_analytics.verify import verify as run_verify

        raise SystemExit(run_verify(data_dir, master=master, report_path=report, history_path=history))
    if history is not None:
        raise click.UsageError("--history is for a stopped group's files (--data-dir)")
    raise SystemExit(_verify_live(namesrv, members, group, secret_file, every, rounds, metrics_port, master, report))


def _verify_live(namesrv: str | None, members: str | None, group: str | None, secret_file: Path | None,
                 every: str | None, rounds: int | None, metrics_port: int | None, master: str | None,
                 report: Path | None) -> int:
    from spark_analytics.live import (
        AuditMetrics,
        LiveError,
        audit_continuously,
        audit_once,
        group_members,
        parse_period,
        serve_metrics,
    )
    from spark_analytics.remote import Access

    access_key, secret_key = os.environ.get("RAFTMQ_ACCESS_KEY", ""), os.environ.get("RAFTMQ_SECRET_KEY", "")
    if secret_file is None and not (access_key and secret_key):
        raise click.UsageError("a live group needs --secret-file, or RAFTMQ_ACCESS_KEY and RAFTMQ_SECRET_KEY "
                               "(an admin account) when ACL is on")
    secret = secret_file.read_bytes().strip() if secret_file is not None else b""

    def access() -> Access:
        """Fresh credentials (an audit key expires): the group's audit key and/or the ACL account."""
        audit = Access.from_secret(secret) if secret else Access()
        return Access(audit.audit_key_hex, audit.expiry_seconds, access_key if secret_key else "", secret_key)

    try:
        period = parse_period(every) if every is not None else None
        addresses = (group_members(namesrv, group) if namesrv is not None
                     else [part.strip() for part in (members or "").split(",") if part.strip()])
    except LiveError as exc:
        raise click.UsageError(str(exc)) from None
    if not addresses:
        raise click.UsageError("no member address given")
    if period is None:
        done = audit_once(addresses, access(), report or Path("verify-report.json"), master)
        return done.exit_code
    report_dir = report or Path(".")
    if not report_dir.is_dir():
        raise click.UsageError(f"with --every, --report is a directory: {report_dir} is not one")
    metrics = AuditMetrics()
    server = serve_metrics(metrics, metrics_port) if metrics_port is not None else None
    try:
        return audit_continuously(addresses, access, report_dir, period, master, metrics, rounds)
    finally:
        if server is not None:
            server.shutdown()


def _register_commands() -> None:
    """Commands live in one module per area: the cluster and its processes, and the client side."""
    from cli import chaos_commands, client_commands, cluster_commands

    for command in (*cluster_commands.COMMANDS, *client_commands.COMMANDS, *chaos_commands.COMMANDS):
        main.add_command(command)


_register_commands()

if __name__ == "__main__":
    main(prog_name=os.path.basename(__file__))
