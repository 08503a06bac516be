"""The ``raftmq`` command."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import click

from commitlog.config import ConfigError, StoreConfig
from commitlog.errors import StoreError
from commitlog.message import MessageInput, decode_record, encode_host, encode_properties
from commitlog.store import AppendStatus, MessageStore

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
@click.option("--data-dir", required=True, type=click.Path(path_type=Path),
              help="The cluster directory: one sub-directory per replica (n0, n1, ...), each with store/.")
@click.option("--master", default=None, help="A Spark master URL (default: an embedded local[2] session).")
@click.option("--report", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Where to write the JSON report (default: DATA_DIR/verify-report.json).")
@click.option("--history", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="A client history (JSON lines, see spark_analytics/history.py) to join against the replicas.")
def verify(data_dir: Path, master: str | None, report: Path | None, history: Path | None) -> None:
    """Check with Spark that the replicas are byte-identical and each one is intact: integrity and feature
    invariants per replica, consume queues and replicated state across replicas, and with --history the
    acknowledged sends and deliveries of a client history.

    Exit code 0 when every check holds, 1 when one fails (the report says where), 2 for usage errors.

    \b
    Example:
      raftmq verify --data-dir ./demo-data
      raftmq verify --data-dir /srv/raftmq --master spark://spark-master:7077 --report out.json
      raftmq verify --data-dir ./chaos-run --history ./chaos-run/history.jsonl
    """
    from spark_analytics.verify import verify as run_verify

    raise SystemExit(run_verify(data_dir, master=master, report_path=report, history_path=history))


def _register_commands() -> None:
    """Commands live in one module per area: the cluster and its processes, and the client side."""
    from cli import chaos_commands, client_commands, cluster_commands

    for command in (*cluster_commands.COMMANDS, *client_commands.COMMANDS, *chaos_commands.COMMANDS):
        main.add_command(command)


_register_commands()

if __name__ == "__main__":
    main(prog_name=os.path.basename(__file__))
