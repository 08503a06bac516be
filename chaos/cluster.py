"""A local group for chaos runs: :class:`cli.cluster.LocalCluster`, optionally with every Raft link and
every client-to-broker link running through a Toxiproxy proxy, so that network faults can cut or slow
any link.

Why one proxy per *pair* of members, and how identities stay consistent
-----------------------------------------------------------------------
pysyncobj (0.3.17 ``TCPTransport``) opens one connection per pair of members: the member whose own
address string is greater dials the other (``_shouldConnect``: ``self.address > node.address``), then
announces its own address; the acceptor looks that string up among its configured peer addresses. So:

* each member keeps its real ``raft_address`` as its identity (it binds it and announces it);
* the dialer of a pair is configured with the *proxy's* address for the other member, so its
  connection runs through that pair's proxy;
* the acceptor is configured with the dialer's real address, which is exactly what the dialer announces.

For the dialer to be the one pysyncobj picks, its own address must compare greater than the proxy
address it has for the acceptor, and the acceptor must not dial (its address is the smaller of the
two real ones). Ports are therefore assigned by their string order: proxies get the smallest, the
members' Raft ports the largest, in member order (``n2`` > ``n1`` > ``n0``: the later member dials).

Every pair's traffic then crosses exactly one proxy (``raft_<dialer>_<acceptor>``), in both directions:
cutting the proxies of a member's pairs isolates it, and cutting one proxy cuts one link, whatever the
roles. Catch-up transfers (a wiped follower's raw copy) are not proxied.

Client links
------------
Each broker also gets a proxy in front of its remoting port (``<prefix>-client-<member>``, a
:class:`ClientLink`): the broker keeps listening on its own address, and its ``advertised_address`` is
the proxy's. That is what it registers with the name server and what the other members hand out as
``leaderAddress`` (their ``peer_addresses``), so every client that finds brokers through the name server
(the workload's producers and consumers) reaches them only through these proxies. The name server is not
proxied, and neither are the runner's own probes (the leader monitor asks each member directly, so it
sees the truth while a client link is cut). The group's ``store_host`` (inside every message id) is the
first member's proxy too.

Each member also serves RocketMQ 5.x clients on a ``grpc_address`` of its own (``[broker] grpc_address``; the
others' in ``peer_grpc_addresses``, to name the leader and forward writes), as a plain LocalCluster's members
do. Those links are not proxied (the address a member serves gRPC on is also the one its routes name): a
client-link fault leaves a run's 5.x clients (chaos.grpc_workload) alone; Raft faults reach them as any other.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import os
import secrets
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from chaos.toxiproxy_control import ToxiproxyHandle, create_proxy, delete_proxy, heal
from cli.cluster import (
    HOST,
    START_TIMEOUT_SECONDS,
    ClusterError,
    ClusterInfo,
    LocalCluster,
    NodeInfo,
    free_ports,
    node_toml,
)

PROXY_PREFIX: Final = "raftmq-chaos"


@dataclass(frozen=True, slots=True)
class RaftLink:
    """The proxy one pair of members talks through."""

    name: str
    #: the member that connects (its address is the greater)
    dialer: str
    #: the member that accepts
    acceptor: str
    #: the proxy's address: what the dialer has as the acceptor's Raft address
    listen: str
    #: the acceptor's own Raft address
    upstream: str

    def joins(self, node_id: str) -> bool:
        return node_id in (self.dialer, self.acceptor)


@dataclass(frozen=True, slots=True)
class ClientLink:
    """The proxy every client reaches one broker through."""

    name: str
    #: the member behind it
    node_id: str
    #: the proxy's address: the broker's advertised address (what the name server hands out)
    listen: str
    #: the broker's own listen address
    upstream: str


def assign_ports(ports: list[int], nodes: int) -> tuple[list[int], list[int], list[int]]:
    """(proxy ports, other ports, Raft ports): proxies first and Raft ports last in string order, so every
    proxy address compares below every member address (see the module doc)."""
    pairs = nodes * (nodes - 1) // 2
    ordered = sorted(ports, key=lambda port: f"{HOST}:{port}")
    return ordered[:pairs], ordered[pairs:len(ordered) - nodes], ordered[len(ordered) - nodes:]


def member_views(infos: list[NodeInfo], links: list[RaftLink]) -> dict[str, list[NodeInfo]]:
    """Each member's peers as it is configured: the proxy's address for a peer it dials."""
    by_pair = {(link.dialer, link.acceptor): link for link in links}
    views = {}
    for node in infos:
        peers = []
        for peer in infos:
            if peer is node:
                continue
            link = by_pair.get((node.id, peer.id))
            peers.append(dataclasses.replace(peer, raft_address=link.listen) if link is not None else peer)
        views[node.id] = peers
    return views


class ChaosCluster:
    """A started group (a :class:`LocalCluster` in ``local``) and its proxies, if any: one per pair of
    members (``links``) and one in front of each broker for its clients (``client_links``)."""

    def __init__(self, local: LocalCluster, links: tuple[RaftLink, ...] = (),
                 toxiproxy: ToxiproxyHandle | None = None, client_links: tuple[ClientLink, ...] = ()) -> None:
        self.local = local
        self.links = links
        self.client_links = client_links
        self.toxiproxy = toxiproxy

    @property
    def data_dir(self) -> Path:
        return self.local.data_dir

    @property
    def namesrv(self) -> str:
        return self.local.namesrv

    @property
    def node_ids(self) -> list[str]:
        return [node.id for node in self.local.info.nodes]

    @property
    def proxied(self) -> bool:
        return bool(self.links)

    def node_by_address(self, broker_address: str) -> str | None:
        """The member at ``broker_address``: its listen address or the address its clients use."""
        for node in self.local.info.nodes:
            if broker_address in (node.broker_address, node.client_address):
                return node.id
        return None

    def client_link(self, node_id: str) -> ClientLink:
        """The proxy clients reach ``node_id`` through (a proxied cluster only)."""
        for link in self.client_links:
            if link.node_id == node_id:
                return link
        raise KeyError(f"no client link to {node_id!r} (proxied: {self.proxied})")

    def client_links_to(self, node_ids: set[str]) -> list[ClientLink]:
        return [link for link in self.client_links if link.node_id in node_ids]

    def links_between(self, group: set[str], others: set[str]) -> list[RaftLink]:
        """The links with one end in ``group`` and the other in ``others``."""
        return [link for link in self.links
                if (link.dialer in group and link.acceptor in others)
                or (link.acceptor in group and link.dialer in others)]

    @property
    def proxy_names(self) -> list[str]:
        return [link.name for link in self.links] + [link.name for link in self.client_links]

    def heal_links(self) -> None:
        """Every proxy (Raft and client links) enabled and without toxics."""
        if self.toxiproxy is None:
            return
        for name in self.proxy_names:
            heal(self.toxiproxy, name)

    def stop(self) -> None:
        """Stop the processes, then delete our proxies (a server we found keeps running)."""
        try:
            self.local.stop()
        finally:
            if self.toxiproxy is not None:
                for name in self.proxy_names:
                    with contextlib.suppress(Exception):  # the server may be gone already
                        delete_proxy(self.toxiproxy, name)

    def __enter__(self) -> ChaosCluster:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @classmethod
    def start(cls, data_dir: Path, nodes: int = 3, toxiproxy: ToxiproxyHandle | None = None,
              overrides: dict[str, dict[str, Any]] | None = None,
              timeout_seconds: float = START_TIMEOUT_SECONDS) -> ChaosCluster:
        """Without ``toxiproxy``: a plain LocalCluster. With it: every Raft link and every client link
        through a proxy."""
        if toxiproxy is None:
            return cls(LocalCluster.start(data_dir, nodes=nodes, overrides=overrides, timeout_seconds=timeout_seconds))
        return _start_proxied(data_dir, nodes, toxiproxy, overrides or {}, timeout_seconds)


def _start_proxied(data_dir: Path, nodes: int, toxiproxy: ToxiproxyHandle, overrides: dict[str, dict[str, Any]],
                   timeout_seconds: float) -> ChaosCluster:
    if not 2 <= nodes <= 9:
        raise ClusterError("a proxied cluster has 2 to 9 nodes")
    data_dir = data_dir.resolve()
    if (data_dir / "cluster.json").exists():
        raise ClusterError(f"{data_dir} already holds a cluster; use an empty directory")
    data_dir.mkdir(parents=True, exist_ok=True)
    pairs = nodes * (nodes - 1) // 2
    # other ports: the name server's, then each member's broker and catch-up ports, then its client proxy's,
    # then its gRPC server's (5.x clients: not proxied, they reach each member directly)
    proxy_ports, other_ports, raft_ports = assign_ports(free_ports(pairs + 1 + 5 * nodes), nodes)
    secret_path = data_dir / "group.secret"
    secret_path.write_text(secrets.token_hex(24) + "\n")
    secret_path.chmod(0o600)
    namesrv = f"{HOST}:{other_ports[0]}"
    client_proxy_ports = other_ports[1 + 2 * nodes:1 + 3 * nodes]
    grpc_ports = other_ports[1 + 3 * nodes:]
    infos = []
    for index in range(nodes):
        node_dir = data_dir / f"n{index}"
        node_dir.mkdir(exist_ok=True)
        broker_port, catchup_port = other_ports[1 + 2 * index: 3 + 2 * index]
        infos.append(NodeInfo(f"n{index}", f"{HOST}:{broker_port}", f"{HOST}:{raft_ports[index]}",
                              f"{HOST}:{catchup_port}", str(node_dir / "node.toml"), str(node_dir / "broker.log"),
                              advertised_address=f"{HOST}:{client_proxy_ports[index]}",
                              grpc_address=f"{HOST}:{grpc_ports[index]}"))
    run_id = f"{os.getpid()}-{secrets.token_hex(3)}"
    links = [RaftLink(f"{PROXY_PREFIX}-{run_id}-{dialer.id}-{acceptor.id}", dialer.id, acceptor.id,
                      f"{HOST}:{port}", acceptor.raft_address)
             for (acceptor, dialer), port in zip(itertools.combinations(infos, 2), proxy_ports, strict=True)]
    client_links = [ClientLink(f"{PROXY_PREFIX}-{run_id}-client-{node.id}", node.id, node.client_address,
                               node.broker_address) for node in infos]
    info = ClusterInfo(str(data_dir), namesrv, 0, str(data_dir / "namesrv.log"), infos)
    views = member_views(infos, links)
    for index, node in enumerate(infos):
        Path(node.config).write_text(node_toml(node, views[node.id], namesrv, index + 1, infos[0].client_address,
                                               str(secret_path), overrides))
    local = LocalCluster(info)
    cluster = ChaosCluster(local, tuple(links), toxiproxy, tuple(client_links))
    try:
        proxies: list[RaftLink | ClientLink] = [*links, *client_links]
        for proxy in proxies:
            create_proxy(toxiproxy, proxy.name, proxy.upstream, listen=proxy.listen)
        info.namesrv_pid = _spawn_namesrv(other_ports[0], Path(info.namesrv_log), data_dir)
        info.save()
        for node in infos:
            local.restart(node.id)  # starts a member that is not running
        local.wait_ready(timeout_seconds)
    except BaseException:
        cluster.stop()
        raise
    return cluster


def _spawn_namesrv(port: int, log_path: Path, cwd: Path) -> int:
    with open(log_path, "ab") as log_file:
        process = subprocess.Popen([sys.executable, "-m", "broker.namesrv", "--host", HOST, "--port", str(port)],
                                   stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=cwd,
                                   start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    return process.pid


#: tests/clock/sitecustomize.py moves the wall clock of a Python process that has its directory on
#: PYTHONPATH by RAFTMQ_TEST_CLOCK_OFFSET_NS (the monotonic clock stays real: libfaketime moves both, and
#: Python's timed waits then hang)
CLOCK_DIRECTORY: Final = Path(__file__).resolve().parents[1] / "tests" / "clock"
CLOCK_OFFSET_VARIABLE: Final = "RAFTMQ_TEST_CLOCK_OFFSET_NS"


def clock_unavailable() -> str | None:
    """Why a member's clock cannot be moved here (None: it can)."""
    if not (CLOCK_DIRECTORY / "sitecustomize.py").is_file():
        return f"{CLOCK_DIRECTORY}/sitecustomize.py is missing (a source checkout is needed)"
    return None


def restart_with_clock(local: LocalCluster, node_id: str, offset_ns: int) -> None:
    """``local.restart(node_id)``, the member's wall clock moved by ``offset_ns`` from the other members'
    (0: the same clock; under ``make test-at`` every process's clock is moved already, and this adds to it).
    LocalCluster starts members with this process's environment, so the variables are set around the
    start only (chaos faults run one at a time; nothing else starts processes meanwhile)."""
    paths = [entry for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep)
             if entry and Path(entry).resolve() != CLOCK_DIRECTORY]
    base_ns = int(os.environ.get(CLOCK_OFFSET_VARIABLE, "0") or "0")
    moved = {"PYTHONPATH": os.pathsep.join([str(CLOCK_DIRECTORY), *paths]),
             CLOCK_OFFSET_VARIABLE: str(base_ns + offset_ns)}
    saved = {name: os.environ.get(name) for name in moved}
    os.environ.update(moved)
    try:
        local.restart(node_id)
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
