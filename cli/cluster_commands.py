"""``raftmq cluster ...``, ``raftmq broker`` and ``raftmq namesrv``: the processes of a group."""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path
from typing import Any

import click

from broker.logs import LOG_FORMATS
from cli.cluster import GROUPS_MAX, LOG_MAX_BYTES, ClusterError, LocalCluster, check_overrides, parse_setting
from cli.front import FRONT_KINDS, ROUTES, FrontUnavailableError, resolve_front

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
    """Run a local three-node group (or N nodes; or several groups) with a name server, on 127.0.0.1."""


@cluster.command()
@data_dir_option
@click.option("--nodes", type=click.IntRange(1, 9), default=3, show_default=True,
              help="Members of each group to start.")
@click.option("--groups", type=click.IntRange(1, GROUPS_MAX), default=1, show_default=True,
              help="Broker groups to start under the one name server (broker-a, broker-b, ...; members a0, a1, ..., "
                   "b0, ...; one group's members are n0, n1, ...). Topics spread their queues over every group.")
@click.option("--base-port", type=click.IntRange(1024, 65000), default=None,
              help="First of 1 + GROUPS * (1 + 5 * NODES) consecutive ports (default: free ports picked at start).")
@click.option("--set", "overrides", multiple=True, metavar="SECTION.KEY=VALUE", callback=_settings,
              help="A node-file setting for every member (repeatable): a key of [store], [raft], [group_commit] "
                   "or [broker], e.g. store.segment_size_bytes=134217728 or store.flush_policy=sync.")
@click.option("--front", type=click.Choice(FRONT_KINDS), default="auto", show_default=True,
              help="A front in front of each group: HAProxy, registered as the group's brokerId 0 address, so "
                   "stock clients ride through a leader change (auto: HAProxy when installed; none: clients are "
                   "given the leader's own address).")
@click.option("--front-route", type=click.Choice(ROUTES), default="followers", show_default=True,
              help="Where the front sends clients: to the followers, which forward to the leader and hold a "
                   "request through an election (a leader's death cuts no client connection), or to the leader.")
@click.option("--log-format", type=click.Choice(LOG_FORMATS), default="text", show_default=True,
              help="The members' and name server's log lines: plain text or one JSON object per line. Their logs "
                   "rotate by size either way (DATA_DIR/<node>/broker.log, .1, .2, ...).")
@click.option("--log-max-bytes", type=click.IntRange(min=1024), default=LOG_MAX_BYTES, show_default=True,
              help="Rotate a member's or the name server's log at this size.")
def up(data_dir: Path, nodes: int, groups: int, base_port: int | None, overrides: dict[str, dict[str, Any]],
       front: str, front_route: str, log_format: str, log_max_bytes: int) -> None:
    """Start a name server and the members of each broker group in the background; wait for every group's leader.

    Prints `namesrv=HOST:PORT` (what 4.x clients need), then `grpc=HOST:PORT` (an endpoint for RocketMQ 5.x
    clients: the first group's leader's), then `front=HOST:PORT` when the group has a front, and writes
    DATA_DIR/cluster.json (every member's addresses, and the front's). With --groups N above 1, one line per
    group follows instead of `front=`: `group=broker-a leader=a0 grpc=HOST:PORT front=HOST:PORT` (front only
    when the group has one).

    \b
    Example:
      raftmq cluster up --data-dir ./demo --nodes 3
      raftmq cluster up --data-dir ./demo --groups 2
      raftmq cluster up --set store.segment_size_bytes=268435456 --set group_commit.linger_ms=2
      export RAFTMQ_NAMESRV=$(raftmq cluster up | sed -n 's/^namesrv=//p')
    """
    try:
        front_kind = resolve_front(front)
    except FrontUnavailableError as exc:
        raise click.UsageError(str(exc)) from None
    try:
        started = LocalCluster.start(data_dir, nodes=nodes, base_port=base_port, overrides=overrides,
                                     front=front_kind, front_route_to=front_route, log_format=log_format,
                                     log_max_bytes=log_max_bytes, groups=groups)
    except ClusterError as exc:
        _fail(exc)
    click.echo(f"namesrv={started.namesrv}")
    if not started.info.groups:
        leader = started.leader_id()
        leader_node = started.info.node(leader) if leader is not None else started.info.nodes[0]
        click.echo(f"grpc={leader_node.grpc_address}")
        if started.info.front:
            click.echo(f"front={started.info.front}")
        click.echo(f"leader={leader}", err=True)
    else:
        summaries = []
        for group in started.info.groups:
            leader = started.leader_id(group.name)
            summaries.append((group, leader, started.info.node(leader or group.nodes[0]).grpc_address))
        click.echo(f"grpc={summaries[0][2]}")  # the first group's leader, as for one group
        for group, leader, grpc in summaries:
            click.echo(f"group={group.name} leader={leader} grpc={grpc}" + (f" front={group.front}" if group.front else ""))
    click.echo(f"cluster file: {started.data_dir / 'cluster.json'}", err=True)


@cluster.command()
@data_dir_option
@click.option("--namesrv", default=None, metavar="HOST:PORT[;HOST:PORT]",
              help="Report a deployment through its name servers instead of DATA_DIR's cluster.json: every broker "
                   "group and member they know, from each member's runtime info.")
@click.option("--json", "as_json", is_flag=True, help="One JSON line per node instead of a table.")
@click.option("--watch", "watch_seconds", type=click.FloatRange(min=0.1), default=None, metavar="SECONDS",
              help="Report again every SECONDS until Ctrl-C.")
@click.option("--count", type=click.IntRange(min=1), default=None,
              help="With --watch: stop after this many reports.")
@click.option("--timeout", "timeout_seconds", type=click.FloatRange(min=0.1), default=2.0, show_default=True,
              help="With --namesrv: how long each name server and member may take to answer.")
@click.pass_context
def status(context: click.Context, data_dir: Path, namesrv: str | None, as_json: bool, watch_seconds: float | None,
           count: int | None, timeout_seconds: float) -> None:
    """Show each node: role, term, commit/applied index, commit-log max offset, lag, pid, alive, and
    any damage found on a node's disk that keeps it from voting (and its group, when there are several).

    With --namesrv, every broker group and member the name servers know (no cluster.json needed): members
    that do not answer are shown as unreachable; lag is in commit-log bytes behind the group's furthest
    member, index_lag in Raft entries not yet applied.

    \b
    Example:
      raftmq cluster status --data-dir ./demo
      raftmq cluster status --namesrv 10.0.0.5:9876 --json
      raftmq cluster status --namesrv "ns-a:9876;ns-b:9876" --watch 2
    """
    if namesrv is not None and context.get_parameter_source("data_dir") is click.core.ParameterSource.COMMANDLINE:
        raise click.UsageError("give --data-dir (a local cluster) or --namesrv (any deployment), not both")
    if count is not None and watch_seconds is None:
        raise click.UsageError("--count goes with --watch")
    reports = 0
    try:
        while True:
            if watch_seconds is not None and reports and not as_json and sys.stdout.isatty():
                click.clear()
            if not _report_status(data_dir, namesrv, as_json, timeout_seconds, watching=watch_seconds is not None):
                sys.exit(1)
            reports += 1
            if watch_seconds is None or (count is not None and reports >= count):
                return
            time.sleep(watch_seconds)
    except KeyboardInterrupt:  # Ctrl-C ends a watch: not an error
        return


def _report_status(data_dir: Path, namesrv: str | None, as_json: bool, timeout_seconds: float,
                   watching: bool) -> bool:
    """Print one report; False when there is nothing to report (the error is printed; a watch goes on)."""
    import json

    from cli.remote_status import COLUMNS, RemoteStatusError, format_table, remote_status

    try:
        if namesrv is not None:
            rows = remote_status(namesrv, timeout_seconds)
            columns: tuple[str, ...] = COLUMNS
        else:
            local = LocalCluster.open(data_dir)
            rows = local.status()
            columns = ("node", "role", "term", "commit_index", "applied_index", "max_offset", "lag", "pid", "alive",
                       "address", "metrics_url")
            if local.info.groups:  # several groups: say whose member each row is
                columns = ("group", *columns)
    except (ClusterError, RemoteStatusError) as exc:
        click.echo(f"Error: {exc}", err=True)
        return watching
    if as_json:
        for row in rows:
            click.echo(json.dumps(row))
        return True
    if watching:
        click.echo(time.strftime("%Y-%m-%d %H:%M:%S"))
    for line in format_table(rows, columns):
        click.echo(line)
    for row in rows:
        if row.get("damage"):
            click.echo(f"{row['node']}: not voting until it has re-fetched its Raft log: {row['damage']}")
        if row.get("error"):
            click.echo(f"{row['group']} at {row['address']}: unreachable: {row['error']}")
    if watching:
        click.echo("")
    return True


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
@click.option("--leader", "kill_leader", is_flag=True,
              help="Kill whichever node leads now (of the group --group names, when there are several).")
@click.option("--group", default=None, metavar="NAME",
              help="With --leader: the broker group (broker-a, broker-b, ...) whose leader to kill.")
@click.option("--signal", "signal_name", type=click.Choice(sorted(SIGNALS)), default="KILL", show_default=True,
              help="KILL (crash), STOP (pause), CONT (resume), TERM (clean stop).")
def kill(data_dir: Path, node: str | None, kill_leader: bool, group: str | None, signal_name: str) -> None:
    """Send a signal to one node (by id, or the leader).

    \b
    Example:
      raftmq cluster kill --leader
      raftmq cluster kill n1 --signal STOP
      raftmq cluster kill --leader --group broker-b    # a cluster of several groups
    """
    if (node is None) == (not kill_leader):
        raise click.UsageError("name exactly one NODE or --leader")
    if group is not None and not kill_leader:
        raise click.UsageError("--group goes with --leader")
    try:
        local = LocalCluster.open(data_dir)
        if kill_leader:
            if group is None and local.info.groups:
                names = ", ".join(each.name for each in local.info.groups)
                raise click.UsageError(f"the cluster has several groups: say whose leader with --group ({names})")
            if group is not None:
                local.info.group(group)  # ClusterError naming the groups there are
            node = local.leader_id(group)
            if node is None:
                raise ClusterError(f"no node of {group} leads right now" if group else "no node leads right now")
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
@click.option("--log-format", type=click.Choice(LOG_FORMATS), default="text", show_default=True,
              help="Plain text log lines, or one JSON object per line (time, level, logger, message, node, group).")
@click.option("--log-file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Log to this file, rotated by size, instead of stderr.")
@click.option("--log-max-bytes", type=click.IntRange(min=1024), default=64 << 20, show_default=True,
              help="With --log-file: rotate it at this size, keeping 5 older files.")
@click.option("--check", is_flag=True,
              help="Only validate the node file and resolve every host name in it; start nothing. "
                   "Exit 0 when it is usable, 2 (saying why) when not.")
def broker(config_path: Path, log_level: str, log_format: str, log_file: Path | None, log_max_bytes: int,
           check: bool) -> None:
    """Run one broker group member in the foreground (systemd, containers).

    Addresses are IPv4 addresses, host names (resolved at each connection, so a peer may change its
    address) or [IPv6]:port.

    \b
    Example:
      raftmq broker --config /etc/raftmq/n0.toml
      raftmq broker --config /etc/raftmq/n0.toml --check
      raftmq broker --config /etc/raftmq/n0.toml --log-format json
    """
    if check:
        from broker.check import check_node_file

        report = check_node_file(config_path)
        for note in report.notes:
            click.echo(note)
        for problem in report.problems:
            click.echo(f"Error: {problem}", err=True)
        if not report.ok:
            click.echo(f"{config_path}: not usable ({len(report.problems)} problem(s))", err=True)
            sys.exit(2)
        click.echo(f"{config_path}: ok")
        return
    from broker.node import main as node_main

    log_file_arguments = [] if log_file is None else ["--log-file", str(log_file), "--log-max-bytes", str(log_max_bytes)]
    sys.exit(node_main(["--config", str(config_path), "--log-level", log_level, "--log-format", log_format,
                        *log_file_arguments]))


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=click.IntRange(0, 65535), default=9876, show_default=True, help="0 picks a free port.")
@click.option("--broker-expiry-seconds", type=click.FloatRange(min=0.1), default=120.0, show_default=True)
@click.option("--log-format", type=click.Choice(LOG_FORMATS), default="text", show_default=True,
              help="Plain text log lines, or one JSON object per line.")
def namesrv(host: str, port: int, broker_expiry_seconds: float, log_format: str) -> None:
    """Run one name server in the foreground.

    \b
    Example:
      raftmq namesrv --port 9876
    """
    from broker.namesrv.__main__ import main as namesrv_main

    sys.exit(namesrv_main(["--host", host, "--port", str(port),
                           "--broker-expiry-seconds", str(broker_expiry_seconds), "--log-format", log_format]))


COMMANDS: list[click.Command] = [cluster, broker, namesrv]
