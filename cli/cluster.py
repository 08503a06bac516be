"""A local raftmq cluster: one name server and one or more broker groups of N members each, as background
processes on 127.0.0.1, described by ``DIR/cluster.json`` so later commands (status, kill, restart, down) find them.

Layout: ``DIR/cluster.json``, ``DIR/namesrv.log``, ``DIR/group.secret``, and per node ``DIR/<id>/``
(``node.toml``, ``broker.log``, ``store/`` with the segments under ``store/commitlog/``, ``raft/``).
With a front (``front="haproxy"``, cli.front), also ``DIR/haproxy.cfg`` and ``DIR/haproxy.log``: HAProxy
listens on the group's address, which the leader registers as brokerId 0 and every member stamps as store host.

Several groups (``groups=N``, as RocketMQ scales out: every group holds its own queues of a topic, under one
name server): group ``k`` is ``broker-<letter>`` (broker-a, broker-b, ...) with members ``<letter>0``,
``<letter>1``, ... (a0, a1, a2, b0, ...), its own ports, Raft peers, secret (``DIR/broker-b.secret``) and front
(``DIR/haproxy-broker-b.cfg``, ``.log``). One group keeps the names above: n0, n1, n2 of broker-a.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import time
import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

from broker.config import BrokerConfig
from cli.front import FOLLOWER_ROUTE_SOURCE, ROUTES
from dledger.addresses import split_host_port
from dledger.config import NodeConfig
from protocol.client import RemotingClient
from protocol.codes import RequestCode, ResponseCode
from protocol.connection import RemotingError
from protocol.signature import sign_fields

CLUSTER_FILE = "cluster.json"
START_TIMEOUT_SECONDS = 60.0
#: a local member's log (and the name server's) rotates at this size, keeping this many older files
LOG_MAX_BYTES = 32 << 20
LOG_BACKUPS = 3
STOP_TIMEOUT_SECONDS = 10.0
POLL_SECONDS = 0.1
HOST = "127.0.0.1"


#: the broker name of a single-group cluster, and of the first of several (BrokerConfig's default)
DEFAULT_BROKER_NAME: Final = "broker-a"
#: groups a local cluster may have: one letter each (broker-a ... broker-z)
GROUPS_MAX: Final = 26


class ClusterError(Exception):
    """A cluster that cannot be started, found or reached (the CLI prints it and exits 1)."""


def group_letter(index: int) -> str:
    return chr(ord("a") + index)


@dataclass
class GroupInfo:
    """One broker group of a cluster started with several (``cluster.json`` ``groups``)."""

    #: the group's broker name (``[broker] broker_name``): broker-a, broker-b, ...
    name: str
    #: its members' ids, in broker-id order
    nodes: list[str]
    secret_file: str
    #: the group's front and its process; empty / 0: no front
    front: str = ""
    front_pid: int = 0


@dataclass
class NodeInfo:
    id: str
    #: where the broker listens (the cluster tools and the chaos monitor talk to it here)
    broker_address: str
    raft_address: str
    catchup_address: str
    config: str
    log: str
    pid: int = 0
    #: the address the broker gives clients (``[broker] advertised_address``); empty: ``broker_address``
    advertised_address: str = ""
    #: where RocketMQ 5.x clients reach this member (``[broker] grpc_address``); empty: no gRPC server
    grpc_address: str = ""
    #: where the member answers ``GET /healthz``, ``/readyz``, ``/metrics`` (``[broker] http_address``)
    http_address: str = ""
    #: the member's Prometheus metrics (``http://<http_address>/metrics``); empty: no HTTP port
    metrics_url: str = ""

    def __post_init__(self) -> None:
        if self.http_address and not self.metrics_url:
            self.metrics_url = f"http://{self.http_address}/metrics"

    @property
    def client_address(self) -> str:
        """Where clients reach this broker: what it registers with the name server."""
        return self.advertised_address or self.broker_address


@dataclass
class ClusterInfo:
    data_dir: str
    namesrv: str
    namesrv_pid: int
    namesrv_log: str
    nodes: list[NodeInfo] = field(default_factory=list)
    #: the group's front (cli.front: HAProxy in front of every member, registered as brokerId 0) and its
    #: process; empty / 0: no front
    front: str = ""
    front_pid: int = 0
    #: how the members and the name server log ("text" or "json" lines: broker.logs), and the size at which
    #: their logs rotate, keeping ``log_backups`` older files (0: the log is the process's output, unrotated)
    log_format: str = "text"
    log_max_bytes: int = 0
    log_backups: int = 0
    #: every group of a cluster started with several (each with its own front; ``front`` is then empty);
    #: empty: one group, broker-a, of every node, whose front is ``front``
    groups: list[GroupInfo] = field(default_factory=list)

    def save(self) -> None:
        path = Path(self.data_dir) / CLUSTER_FILE
        temporary = path.with_suffix(".tmp")
        document = asdict(self)
        if not self.groups:  # a single group's file stays as it always was
            del document["groups"]
        temporary.write_text(json.dumps(document, indent=2) + "\n")
        temporary.replace(path)

    def group_list(self) -> list[GroupInfo]:
        """Every group (a single group as one, made up from the top-level fields: read it, do not change it)."""
        if self.groups:
            return self.groups
        return [GroupInfo(DEFAULT_BROKER_NAME, [node.id for node in self.nodes],
                          str(Path(self.data_dir) / "group.secret"), self.front, self.front_pid)]

    def group_of(self, node_id: str) -> GroupInfo:
        for group in self.group_list():
            if node_id in group.nodes:
                return group
        raise ClusterError(f"no node {node_id!r} (nodes: {', '.join(n.id for n in self.nodes)})")

    def group(self, name: str) -> GroupInfo:
        for group in self.group_list():
            if group.name == name:
                return group
        raise ClusterError(f"no group {name!r} (groups: {', '.join(g.name for g in self.group_list())})")

    def group_nodes(self, group: GroupInfo) -> list[NodeInfo]:
        return [self.node(node_id) for node_id in group.nodes]

    @classmethod
    def load(cls, data_dir: Path) -> ClusterInfo:
        path = data_dir / CLUSTER_FILE
        try:
            raw = json.loads(path.read_text())
            nodes = [NodeInfo(**node) for node in raw.pop("nodes")]
            groups = [GroupInfo(**group) for group in raw.pop("groups", [])]
            return cls(**raw, nodes=nodes, groups=groups)
        except FileNotFoundError:
            raise ClusterError(f"no cluster in {data_dir} (no {CLUSTER_FILE}); start one with `raftmq cluster up`") from None
        except (OSError, ValueError, TypeError, KeyError) as exc:
            raise ClusterError(f"{path} is unreadable: {exc}") from None

    def node(self, node_id: str) -> NodeInfo:
        for node in self.nodes:
            if node.id == node_id:
                return node
        raise ClusterError(f"no node {node_id!r} (nodes: {', '.join(n.id for n in self.nodes)})")


#: the lowest port handed out when the kernel's ephemeral range leaves room below it
PORT_FLOOR = 10_000


def _ports_below_ephemeral() -> tuple[int, int] | None:
    """[PORT_FLOOR, start of the kernel's ephemeral range), or None when that is too small or unknown."""
    try:
        ephemeral_low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return (PORT_FLOOR, ephemeral_low) if ephemeral_low - PORT_FLOOR >= 1000 else None


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports free on HOST now, from below the kernel's ephemeral range when it leaves
    room: the kernel never gives those to outgoing connections as source ports, so a member that was killed
    finds its port free again when it restarts (a port from the ephemeral range could meanwhile serve as some
    connection's source port). Falls back to ports the kernel picks."""
    import random
    import socket

    span = _ports_below_ephemeral()
    sockets: list[socket.socket] = []
    chosen: list[int] = []
    rng = random.Random()  # which free ports: never part of any result
    try:
        attempts = 0
        while span is not None and len(chosen) < count and attempts < 200 * count:
            attempts += 1
            port = rng.randrange(*span)
            if port in chosen:
                continue
            probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                probe.bind((HOST, port))
            except OSError:
                probe.close()
                continue
            sockets.append(probe)
            chosen.append(port)
        while len(chosen) < count:
            probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            probe.bind((HOST, 0))
            sockets.append(probe)
            chosen.append(probe.getsockname()[1])
        return chosen
    finally:
        for probe in sockets:
            probe.close()


def is_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        finished, _ = os.waitpid(pid, os.WNOHANG)  # reap our own children
        if finished == pid:
            return False
    except ChildProcessError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie that is not our child still answers kill(0): look at its state
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


#: the tables ``raftmq cluster up --set`` may change, and the keys of them it writes itself
SETTABLE_SECTIONS: Final = ("store", "raft", "group_commit", "broker")
RESERVED_SETTINGS: Final = frozenset({("store", "store_host"), ("broker", "listen_address"), ("broker", "namesrv"),
                                      ("broker", "broker_id"), ("broker", "advertised_address"),
                                      ("broker", "peer_addresses"), ("broker", "grpc_address"),
                                      ("broker", "peer_grpc_addresses"), ("broker", "front_address"),
                                      ("broker", "http_address")})


def parse_setting(text: str) -> tuple[str, str, Any]:
    """``SECTION.KEY=VALUE`` as (section, key, value); VALUE is a TOML value (``64``, ``true``, ``"sync"``),
    or else the text itself as a string. ValueError says what is wrong."""
    name, equals, raw = text.partition("=")
    section, dot, key = name.strip().partition(".")
    if not equals or not dot or not key:
        raise ValueError(f"{text!r} is not SECTION.KEY=VALUE")
    if section not in SETTABLE_SECTIONS:
        raise ValueError(f"{text!r}: the section must be one of {', '.join(SETTABLE_SECTIONS)}")
    if (section, key) in RESERVED_SETTINGS:
        raise ValueError(f"{text!r}: {section}.{key} is set by `raftmq cluster up` itself")
    try:
        value = tomllib.loads(f"value = {raw.strip()}")["value"]
    except tomllib.TOMLDecodeError:
        value = raw.strip()
    scalar = (str, int, float, bool)
    if not (isinstance(value, scalar) or (isinstance(value, list) and all(isinstance(item, scalar) for item in value))):
        raise ValueError(f"{text!r}: VALUE must be a number, true or false, a string or a list of them")
    return section, key, value


def check_overrides(overrides: dict[str, dict[str, Any]]) -> None:
    """Validate ``overrides`` as a node file would be (ConfigError naming the setting), before anything is
    written or started: the configuration of a sample member with them."""
    sample = [NodeInfo(f"n{index}", f"{HOST}:{10 + 3 * index}", f"{HOST}:{11 + 3 * index}",
                       f"{HOST}:{12 + 3 * index}", "", "") for index in range(2)]
    document = tomllib.loads(node_toml(sample[0], sample[1:], f"{HOST}:9", 1, sample[0].broker_address, "",
                                       overrides))
    document["node"].pop("secret_file")
    document["node"]["secret"] = "0" * 32
    broker_values = document.pop("broker")
    NodeConfig.from_mapping(document)
    BrokerConfig.from_mapping(broker_values)


def node_toml(node: NodeInfo, peers: list[NodeInfo], namesrv: str, broker_id: int, store_host: str,
              secret_file: str, overrides: dict[str, dict[str, Any]], broker_name: str = "") -> str:
    """A member's node file; ``broker_name`` empty: the default group name (broker-a) is left unwritten."""
    def value(item: Any) -> str:
        return json.dumps(item) if not isinstance(item, bool) else ("true" if item else "false")

    lines = [
        "[node]",
        f"id = {value(node.id)}",
        f"raft_address = {value(node.raft_address)}",
        f"catchup_address = {value(node.catchup_address)}",
        'data_dir = "."',
        f"secret_file = {value(secret_file)}",
        "",
    ]
    for peer in peers:
        lines += ["[[peers]]", f"id = {value(peer.id)}", f"raft_address = {value(peer.raft_address)}",
                  f"catchup_address = {value(peer.catchup_address)}", ""]
    broker = {"listen_address": node.broker_address, "namesrv": [namesrv], "broker_id": broker_id,
              **({"broker_name": broker_name} if broker_name else {}),
              **({"advertised_address": node.advertised_address} if node.advertised_address else {}),
              **({"grpc_address": node.grpc_address} if node.grpc_address else {}),
              **({"http_address": node.http_address} if node.http_address else {}),
              **overrides.get("broker", {})}
    lines.append("[broker]")
    lines += [f"{key} = {value(item)}" for key, item in broker.items()]
    lines.append("[broker.peer_addresses]")  # what a follower names the leader by: the peers' advertised addresses
    lines += [f"{peer.id} = {value(peer.client_address)}" for peer in peers]
    if node.grpc_address:  # the others' gRPC addresses: to name the leader to 5.x clients and forward to it
        lines.append("[broker.peer_grpc_addresses]")
        lines += [f"{peer.id} = {value(peer.grpc_address)}" for peer in peers if peer.grpc_address]
    store = {"store_host": store_host, "segment_size_bytes": 64 << 20, **overrides.get("store", {})}
    lines += ["", "[store]"] + [f"{key} = {value(item)}" for key, item in store.items()]
    for section in ("raft", "group_commit"):
        if overrides.get(section):
            lines += ["", f"[{section}]"] + [f"{key} = {value(item)}" for key, item in overrides[section].items()]
    return "\n".join(lines) + "\n"


def _spawn(arguments: list[str], log_path: Path, cwd: Path) -> subprocess.Popen[bytes]:
    log_file = open(log_path, "ab")  # noqa: SIM115 - handed to the child
    try:
        return subprocess.Popen(arguments, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                cwd=cwd, start_new_session=True,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
    finally:
        log_file.close()


async def _request(address: str, code: int, fields: dict[str, str] | None = None,
                   timeout_seconds: float = 2.0) -> tuple[int, dict[str, str], bytes]:
    access_key, secret_key = os.environ.get("RAFTMQ_ACCESS_KEY"), os.environ.get("RAFTMQ_SECRET_KEY")
    if access_key and secret_key:  # a group with ACL on: probe as that (admin) account
        fields = dict(sign_fields(fields or {}, b"", access_key, secret_key) or {})
    target = split_host_port(address)  # host:port, a.b.c.d:port or [v6]:port (AddressError: a ValueError)
    client = await RemotingClient.connect(target.host, target.port, connect_timeout_seconds=timeout_seconds)
    try:
        response = await client.request(code, fields or {}, timeout_seconds=timeout_seconds)
        return response.code, dict(response.ext_fields), response.body
    finally:
        await client.close()


def request(address: str, code: int, fields: dict[str, str] | None = None,
            timeout_seconds: float = 2.0) -> tuple[int, dict[str, str], bytes]:
    """One remoting request from synchronous code (the CLI, tests; from inside an event loop too, on a
    thread of its own)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(_request(address, code, fields, timeout_seconds))
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, _request(address, code, fields, timeout_seconds)).result()


def node_status(node: NodeInfo) -> dict[str, str] | None:
    """The node's runtime info (role, term, indexes, offsets), or None when it does not answer."""
    try:
        code, _, body = request(node.broker_address, RequestCode.GET_BROKER_RUNTIME_INFO, timeout_seconds=1.0)
    except (RemotingError, OSError, TimeoutError):
        return None
    if code != ResponseCode.SUCCESS:
        return None
    table = json.loads(body).get("table", {})
    return {str(key): str(item) for key, item in table.items()}


def route_master(namesrv: str, topic: str = "TBW102") -> str | None:
    """The address the name server gives as brokerId 0 for ``topic`` (of its first broker group), or None."""
    return next(iter(route_masters(namesrv, topic).values()), None)


def route_masters(namesrv: str, topic: str = "TBW102") -> dict[str, str]:
    """Broker name -> the address the name server gives as its brokerId 0 for ``topic``, in the route's order
    (empty when there is no route or no answer)."""
    try:
        code, _, body = request(namesrv, RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic}, timeout_seconds=1.0)
    except (RemotingError, OSError, TimeoutError):
        return {}
    if code != ResponseCode.SUCCESS:
        return {}
    masters: dict[str, str] = {}
    for broker in json.loads(body).get("brokerDatas", []):
        address = broker.get("brokerAddrs", {}).get("0")
        if address:
            masters[str(broker.get("brokerName", ""))] = str(address)
    return masters


class LocalCluster:
    """A started (or found) local cluster. ``with LocalCluster.start(dir) as cluster:`` stops it at the end."""

    def __init__(self, info: ClusterInfo) -> None:
        self.info = info
        self.data_dir = Path(info.data_dir)

    @property
    def namesrv(self) -> str:
        return self.info.namesrv

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @classmethod
    def open(cls, data_dir: Path) -> LocalCluster:
        return cls(ClusterInfo.load(data_dir.resolve()))

    @classmethod
    def start(cls, data_dir: Path, nodes: int = 3, base_port: int | None = None,
              overrides: dict[str, dict[str, Any]] | None = None,
              timeout_seconds: float = START_TIMEOUT_SECONDS, front: str = "none", front_route_to: str = "followers",
              log_format: str = "text", log_max_bytes: int = LOG_MAX_BYTES, log_backups: int = LOG_BACKUPS,
              groups: int = 1) -> LocalCluster:
        """Start a name server and ``groups`` broker groups of ``nodes`` members each (and, with
        ``front="haproxy"``, HAProxy in front of each group, sending clients to ``front_route_to``: cli.front);
        wait until every group's leader serves routes (through its front, when there is one)."""
        if not 1 <= nodes <= 9:
            raise ClusterError("a cluster has 1 to 9 nodes")
        if not 1 <= groups <= GROUPS_MAX:
            raise ClusterError(f"a cluster has 1 to {GROUPS_MAX} groups")
        if groups > 1 and "broker_name" in (overrides or {}).get("broker", {}):
            raise ClusterError("broker.broker_name is set per group (broker-a, broker-b, ...) when there are several")
        data_dir = data_dir.resolve()
        if (data_dir / CLUSTER_FILE).exists():
            existing = ClusterInfo.load(data_dir)
            if is_alive(existing.namesrv_pid) or any(is_alive(node.pid) for node in existing.nodes):
                raise ClusterError(f"a cluster is already running in {data_dir}; stop it with `raftmq cluster down`")
        data_dir.mkdir(parents=True, exist_ok=True)
        if front not in ("haproxy", "none"):
            raise ClusterError(f"the front must be haproxy or none, got {front!r}")
        if front_route_to not in ROUTES:
            raise ClusterError(f"the front routes to one of {', '.join(ROUTES)}, got {front_route_to!r}")
        # the name server, then per group: broker, Raft and catch-up ports per member, then each member's gRPC
        # port, then each member's HTTP port, then the front's (one group: 2 + 5 * nodes, as always)
        group_port_count = 1 + 5 * nodes
        port_count = 1 + groups * group_port_count
        ports = (list(range(base_port, base_port + port_count)) if base_port is not None
                 else free_ports(port_count))
        infos: list[NodeInfo] = []
        group_infos: list[GroupInfo] = []
        for group_index in range(groups):
            block = ports[1 + group_index * group_port_count: 1 + (group_index + 1) * group_port_count]
            letter = group_letter(group_index)
            name = f"broker-{letter}"
            secret_path = data_dir / ("group.secret" if groups == 1 else f"{name}.secret")
            if not secret_path.exists():
                secret_path.write_text(secrets.token_hex(24) + "\n")
                secret_path.chmod(0o600)
            members = []
            for index in range(nodes):
                node_id = f"n{index}" if groups == 1 else f"{letter}{index}"
                node_dir = data_dir / node_id
                node_dir.mkdir(exist_ok=True)
                broker_port, raft_port, catchup_port = block[3 * index: 3 + 3 * index]
                members.append(NodeInfo(node_id, f"{HOST}:{broker_port}", f"{HOST}:{raft_port}",
                                        f"{HOST}:{catchup_port}", str(node_dir / "node.toml"),
                                        str(node_dir / "broker.log"), grpc_address=f"{HOST}:{block[3 * nodes + index]}",
                                        http_address=f"{HOST}:{block[4 * nodes + index]}"))
            infos += members
            group_infos.append(GroupInfo(name, [member.id for member in members], str(secret_path),
                                         f"{HOST}:{block[5 * nodes]}" if front == "haproxy" else ""))
        namesrv = f"{HOST}:{ports[0]}"
        if log_format not in ("text", "json"):
            raise ClusterError(f"the log format must be text or json, got {log_format!r}")
        info = ClusterInfo(str(data_dir), namesrv, 0, str(data_dir / "namesrv.log"), infos, log_format=log_format,
                           log_max_bytes=log_max_bytes, log_backups=log_backups,
                           groups=group_infos if groups > 1 else [])
        if groups == 1:
            info.front = group_infos[0].front
        for group in group_infos:
            members = info.group_nodes(group)
            node_overrides = dict(overrides or {})
            store_host = members[0].broker_address
            if group.front:  # the group's address: what the leader registers, and the stored store host
                store_host = group.front
                front_settings: dict[str, object] = {"front_address": group.front}
                if front_route_to == "followers":  # the leader hands the front's connections to the followers
                    front_settings["follower_front_hosts"] = [FOLLOWER_ROUTE_SOURCE]
                node_overrides["broker"] = {**node_overrides.get("broker", {}), **front_settings}
            for index, node in enumerate(members):
                peers = [peer for peer in members if peer is not node]
                Path(node.config).write_text(node_toml(node, peers, namesrv, index + 1, store_host, group.secret_file,
                                                       node_overrides, broker_name=group.name if groups > 1 else ""))
        cluster = cls(info)
        try:
            process = _spawn([sys.executable, "-m", "broker.namesrv", "--host", HOST, "--port", str(ports[0]),
                              *cluster._log_arguments(info.namesrv_log)], Path(info.namesrv_log), data_dir)
            info.namesrv_pid = process.pid
            for node in infos:
                cluster._start_node(node)
            info.save()
            for group in info.group_list():
                if group.front:
                    cluster._start_front(front_route_to, group)
                    info.save()
            cluster.wait_ready(timeout_seconds)
        except BaseException:
            cluster.stop()
            raise
        return cluster

    def _start_node(self, node: NodeInfo) -> None:
        process = _spawn([sys.executable, "-m", "broker.node", "--config", node.config,
                          *self._log_arguments(node.log)], Path(node.log), Path(node.config).parent)
        node.pid = process.pid

    def _log_arguments(self, log: str) -> list[str]:
        """A member's or the name server's logging options: the format, and rotation of its log by size (the
        process then writes the file itself, its stdout and stderr following the current one: broker.logs)."""
        arguments = [] if self.info.log_format == "text" else ["--log-format", self.info.log_format]
        if self.info.log_max_bytes > 0:
            arguments += ["--log-file", log, "--log-max-bytes", str(self.info.log_max_bytes),
                          "--log-backups", str(self.info.log_backups)]
        return arguments

    def _start_front(self, route_to: str, group: GroupInfo) -> None:
        """Start ``group``'s front (DIR/haproxy.cfg for a single group; DIR/haproxy-<group>.cfg for one of
        several) and record its process."""
        from cli.front import FrontMember, FrontUnavailableError, haproxy_config, start_haproxy

        stem = "haproxy" if not self.info.groups else f"haproxy-{group.name}"
        config_path = self.data_dir / f"{stem}.cfg"
        config_path.write_text(haproxy_config(group.front, [
            FrontMember(node.id, node.broker_address, node.http_address) for node in self.info.group_nodes(group)],
            route_to))
        try:
            pid = start_haproxy(config_path, self.data_dir / f"{stem}.log", self.data_dir).pid
        except (FrontUnavailableError, OSError, subprocess.SubprocessError) as exc:
            raise ClusterError(f"cannot start the front of {group.name}: {exc}") from None
        if self.info.groups:
            group.front_pid = pid
        else:
            self.info.front_pid = pid

    def wait_ready(self, timeout_seconds: float = START_TIMEOUT_SECONDS) -> str:
        """Wait until every group has a leader and the name server routes to it; return the address it routes
        the first group to (the leader's advertised address, or the front, which must then reach the leader)."""
        deadline = time.monotonic() + timeout_seconds
        groups = self.info.group_list()
        while True:
            if not is_alive(self.info.namesrv_pid):
                raise ClusterError(f"the name server exited; see {self.info.namesrv_log}")
            for group in groups:
                if group.front and not is_alive(group.front_pid):
                    log = "haproxy.log" if not self.info.groups else f"haproxy-{group.name}.log"
                    raise ClusterError(f"the front (HAProxy) of {group.name} exited; see {self.data_dir / log}")
            masters = route_masters(self.namesrv)
            ready = [self._group_ready(group, masters) for group in groups]
            if all(ready):
                return str(ready[0])
            if time.monotonic() > deadline:
                dead = [node.id for node in self.info.nodes if not is_alive(node.pid)]
                waiting = [group.name for group, master in zip(groups, ready, strict=True) if not master]
                raise ClusterError(f"no leader serving routes after {timeout_seconds:.0f} s"
                                   + (f" in {', '.join(waiting)}" if self.info.groups else "")
                                   + (f"; exited: {', '.join(dead)} (see their broker.log)" if dead else ""))
            time.sleep(POLL_SECONDS)

    def _group_ready(self, group: GroupInfo, masters: dict[str, str]) -> str | None:
        """The address the name server routes ``group`` to, once that reaches its leader; else None."""
        # a single group is whatever the route names (its broker name may have been set with --set)
        master = masters.get(group.name) if self.info.groups else next(iter(masters.values()), None)
        if master is None:
            return None
        # one group: leader_node() (a subclass may probe members its own way)
        leader = self.group_leader(group.name) if self.info.groups else self.leader_node()
        if group.front:
            # the front answers (from the leader, or a follower that forwards to it) and a leader is known
            front = self.front_node(group.name if self.info.groups else None)
            return master if master == group.front and node_status(front) is not None and leader is not None else None
        return master if leader is not None and leader.client_address == master else None

    def leader_node(self) -> NodeInfo | None:
        """The leader of the first group found to have one (of the one group of a single-group cluster)."""
        return self._leader_among(self.info.nodes)

    def group_leader(self, group: str) -> NodeInfo | None:
        """The leader of ``group`` (a broker name: broker-a, ...), or None; ClusterError: no such group."""
        return self._leader_among(self.info.group_nodes(self.info.group(group)))

    @staticmethod
    def _leader_among(nodes: list[NodeInfo]) -> NodeInfo | None:
        for node in nodes:
            if not is_alive(node.pid):
                continue
            status = node_status(node)
            if status is not None and status.get("brokerRole") == "LEADER":
                return node
        return None

    def front_node(self, group: str | None = None) -> NodeInfo:
        """A group's front (the first group's when None) as a node to ask: whatever member it reaches (the
        leader, once its check passed)."""
        address = self.info.front if not self.info.groups else (
            self.info.group(group) if group is not None else self.info.groups[0]).front
        return NodeInfo("front", address, "", "", "", "")

    def leader_id(self, group: str | None = None) -> str | None:
        """The id of ``group``'s leader (a broker name), or of :meth:`leader_node`'s when None."""
        leader = self.leader_node() if group is None else self.group_leader(group)
        return None if leader is None else leader.id

    def broker_address(self, node_id: str) -> str:
        return self.info.node(node_id).broker_address

    def status(self) -> list[dict[str, object]]:
        """One row per node, group by group; ``lag`` is in commit-log bytes behind its group's furthest member.
        Rows of a cluster with several groups also name their ``group``."""
        rows: list[dict[str, object]] = []
        for group in self.info.group_list():
            group_rows: list[dict[str, object]] = []
            for node in self.info.group_nodes(group):
                alive = is_alive(node.pid)
                status = node_status(node) if alive else None
                group_rows.append({
                    **({"group": group.name} if self.info.groups else {}),
                    "node": node.id, "address": node.broker_address, "pid": node.pid, "alive": alive,
                    "role": (status or {}).get("brokerRole", "-" if not alive else "unreachable").lower(),
                    "term": (status or {}).get("raftTerm", "-"),
                    "commit_index": (status or {}).get("commitIndex", "-"),
                    "applied_index": (status or {}).get("appliedIndex", "-"),
                    "max_offset": (status or {}).get("commitLogMaxOffset", "-"),
                    "damage": (status or {}).get("raftDamage", ""), "metrics_url": node.metrics_url})
            offsets = [int(str(row["max_offset"])) for row in group_rows if str(row["max_offset"]).isdigit()]
            top = max(offsets, default=0)
            for row in group_rows:
                row["lag"] = top - int(str(row["max_offset"])) if str(row["max_offset"]).isdigit() else "-"
            rows += group_rows
        return rows

    def kill(self, node_id: str, signal_number: int = signal.SIGKILL) -> None:
        node = self.info.node(node_id)
        if not is_alive(node.pid):
            raise ClusterError(f"node {node_id} is not running")
        os.kill(node.pid, signal_number)
        if signal_number in (signal.SIGKILL, signal.SIGTERM):
            deadline = time.monotonic() + STOP_TIMEOUT_SECONDS
            while is_alive(node.pid) and time.monotonic() < deadline:
                time.sleep(0.02)

    def restart(self, node_id: str) -> None:
        node = self.info.node(node_id)
        if is_alive(node.pid):
            os.kill(node.pid, signal.SIGCONT)  # a paused process would not stop
            self._terminate([node.pid])
        self._start_node(node)
        self.info.save()

    def stop(self) -> None:
        """Stop every process of the cluster (SIGTERM, then SIGKILL after a grace period)."""
        pids = [node.pid for node in self.info.nodes] + [self.info.namesrv_pid] + [
            group.front_pid for group in self.info.group_list() if group.front_pid]
        for pid in pids:
            if is_alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
        self._terminate(pids)

    @staticmethod
    def _terminate(pids: list[int]) -> None:
        live = [pid for pid in pids if is_alive(pid)]
        for pid in live:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_SECONDS
        while time.monotonic() < deadline and any(is_alive(pid) for pid in live):
            time.sleep(0.05)
        for pid in live:
            if is_alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + STOP_TIMEOUT_SECONDS
        while time.monotonic() < deadline and any(is_alive(pid) for pid in live):
            time.sleep(0.02)
