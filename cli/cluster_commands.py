"""``raftmq cluster ...``, ``raftmq broker`` and ``raftmq namesrv``: the processes of a group."""

from __future__ import annotations

import signal
import sys
from pathlib import Path
from typing import Any

import click

from cli.cluster import ClusterError, LocalCluster, check_overrides, parse_setting

DEFAULT_DATA_DIR = Path("./raftmq-data")
SIGNALS = {"KILL": signal.SIGKILL, "STOP": signal.SIGSTOP, "CONT": signal.SIGCONT, "TERM": signal.SIGTERM}

data_dir_option = click.option(
    "--data-dir", type=click.Path(file_okay=False, path_type=Path), default=DEFAULT_DATA_DIR, show_default=True,
    help="The cluster directory (cluster.json, one sub-directory per node).")


def _fail(error: Exception) -> None:
    click.echo(f"Error: {error}", err=True)
    sys.exit(1)


def _settings(context: click.Context, parameter: click.Parameter, values: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    """``--set`` values as node-file overrides, checked as a member would check its file: a bad one is a usage
    error (exit 2) before anything is written or started."""
    overrides: dict[str, dict[str, Any]] = {}
    for text in values:
        try:
            section, key, value = parse_setting(text)
        except ValueError as exc:
            raise click.BadParameter(str(exc), context, parameter) from None
        overrides.setdefault(section, {})[key] = value
    try:
        check_overrides(overrides)
    except (ValueError, TypeError) as exc:  # ConfigError is a ValueError; so is a value TOML cannot hold
        raise click.BadParameter(str(exc), context, parameter) from None
    return overrides


@click.group()
def cluster() -> None:
    """Run a local three-node group (or N nodes) with a name server, on 127.0.0.1."""


@cluster.command()
@data_dir_option
@click.option("--nodes", type=click.IntRange(1, 9), default=3, show_default=True, help="Group members to start.")
@click.option("--base-port", type=click.IntRange(1024, 65000), default=None,
              help="First of 1 + 4 * NODES consecutive ports (default: free ports picked at start).")
@click.option("--set", "overrides", multiple=True, metavar="SECTION.KEY=VALUE", callback=_settings,
              help="A node-file setting for every member (repeatable): a key of [store], [raft], [group_commit] "
                   "or [broker], e.g. store.segment_size_bytes=134217728 or store.flush_policy=sync.")
def up(data_dir: Path, nodes: int, base_port: int | None, overrides: dict[str, dict[str, Any]]) -> None:
    """Start a name server and the group's members in the background; wait for a leader.

    Prints `namesrv=HOST:PORT` (what 4.x clients need), then `grpc=HOST:PORT` (an endpoint for RocketMQ 5.x
    clients: the leader's), and writes DATA_DIR/cluster.json (every member's addresses).

    \b
    Example:
      raftmq cluster up --data-dir ./demo --nodes 3
      raftmq cluster up --set store.segment_size_bytes=268435456 --set group_commit.linger_ms=2
      export RAFTMQ_NAMESRV=$(raftmq cluster up | sed -n 's/^namesrv=//p')
    """
    try:
        started = LocalCluster.start(data_dir, nodes=nodes, base_port=base_port, overrides=overrides)
    except ClusterError as exc:
        _fail(exc)
    leader = started.leader_id()
    click.echo(f"namesrv={started.namesrv}")
    leader_node = started.info.node(leader) if leader is not None else started.info.nodes[0]
    click.echo(f"grpc={leader_node.grpc_address}")
    click.echo(f"leader={leader}", err=True)
    click.echo(f"cluster file: {started.data_dir / 'cluster.json'}", err=True)


@cluster.command()
@data_dir_option
@click.option("--json", "as_json", is_flag=True, help="One JSON line per node instead of a table.")
def status(data_dir: Path, as_json: bool) -> None:
    """Show each node: role, term, commit/applied index, commit-log max offset, lag, pid, alive, and
    any damage found on a node's disk that keeps it from voting.

    \b
    Example:
      raftmq cluster status --data-dir ./demo
    """
    import json

    try:
        rows = LocalCluster.open(data_dir).status()
    except ClusterError as exc:
        _fail(exc)
    if as_json:
        for row in rows:
            click.echo(json.dumps(row))
        return
    columns = ["node", "role", "term", "commit_index", "applied_index", "max_offset", "lag", "pid", "alive", "address"]
    table = [[str(row[column]) for column in columns] for row in rows]
    widths = [max(len(column), *(len(line[i]) for line in table)) for i, column in enumerate(columns)]
    click.echo("  ".join(column.ljust(widths[i]) for i, column in enumerate(columns)))
    for line in table:
        click.echo("  ".join(value.ljust(widths[i]) for i, value in enumerate(line)))
    for row in rows:
        if row["damage"]:
            click.echo(f"{row['node']}: not voting until it has re-fetched its Raft log: {row['damage']}")


@cluster.command()
@data_dir_option
def down(data_dir: Path) -> None:
    """Stop every process of the cluster (SIGTERM, SIGKILL after a grace period). Data stays.

    \b
    Example:
      raftmq cluster down --data-dir ./demo
    """
    try:
        LocalCluster.open(data_dir).stop()
    except ClusterError as exc:
        _fail(exc)
    click.echo("stopped")


@cluster.command()
@data_dir_option
@click.argument("node", required=False)
@click.option("--leader", "kill_leader", is_flag=True, help="Kill whichever node leads now.")
@click.option("--signal", "signal_name", type=click.Choice(sorted(SIGNALS)), default="KILL", show_default=True,
              help="KILL (crash), STOP (pause), CONT (resume), TERM (clean stop).")
def kill(data_dir: Path, node: str | None, kill_leader: bool, signal_name: str) -> None:
    """Send a signal to one node (by id, or the leader).

    \b
    Example:
      raftmq cluster kill --leader
      raftmq cluster kill n1 --signal STOP
    """
    if (node is None) == (not kill_leader):
        raise click.UsageError("name exactly one NODE or --leader")
    try:
        local = LocalCluster.open(data_dir)
        if kill_leader:
            node = local.leader_id()
            if node is None:
                raise ClusterError("no node leads right now")
        assert node is not None
        local.kill(node, SIGNALS[signal_name])
    except ClusterError as exc:
        _fail(exc)
    click.echo(f"sent SIG{signal_name} to {node}")


@cluster.command()
@data_dir_option
@click.argument("node")
def restart(data_dir: Path, node: str) -> None:
    """Start a node again (stopping it first if it runs).

    \b
    Example:
      raftmq cluster restart n0
    """
    try:
        LocalCluster.open(data_dir).restart(node)
    except ClusterError as exc:
        _fail(exc)
    click.echo(f"restarted {node}")


@click.command(context_settings={"ignore_unknown_options": True})
@click.option("--config", "config_path", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="The node's TOML file ([node], [[peers]], [broker], [store], ...).")
@click.option("--log-level", type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"]), default="INFO",
              show_default=True)
def broker(config_path: Path, log_level: str) -> None:
    """Run one broker group member in the foreground (systemd, containers).

    \b
    Example:
      raftmq broker --config /etc/raftmq/n0.toml
    """
    from broker.node import main as node_main

    sys.exit(node_main(["--config", str(config_path), "--log-level", log_level]))


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=click.IntRange(0, 65535), default=9876, show_default=True, help="0 picks a free port.")
@click.option("--broker-expiry-seconds", type=click.FloatRange(min=0.1), default=120.0, show_default=True)
def namesrv(host: str, port: int, broker_expiry_seconds: float) -> None:
    """Run one name server in the foreground.

    \b
    Example:
      raftmq namesrv --port 9876
    """
    from broker.namesrv.__main__ import main as namesrv_main

    sys.exit(namesrv_main(["--host", host, "--port", str(port),
                           "--broker-expiry-seconds", str(broker_expiry_seconds)]))


COMMANDS: list[click.Command] = [cluster, broker, namesrv]
