"""``raftmq broker --config node.toml --check``: validate a node file without starting anything.

The file is read exactly as the broker reads it (every value checked, unknown keys refused, referenced
files such as the secret and the ACL file read); then every host name in it is resolved as the broker
would resolve it when connecting. A name that does not resolve is a problem; so is a malformed file. An
address the member listens on that is not one of this host's addresses is only a warning: the file may be
checked on another machine than the one it is for.
"""

from __future__ import annotations

import errno
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from broker.config import BrokerConfig, load_node_file
from commitlog.config import ConfigError
from dledger.addresses import WILDCARD_HOSTS, lookup, split_host_port
from dledger.config import NodeConfig

Lookup = Callable[[str], list[tuple[socket.AddressFamily, str]]]


@dataclass
class CheckReport:
    #: what keeps the node from starting or working (exit 2)
    problems: list[str] = field(default_factory=list)
    #: what was checked and what it resolved to, and warnings
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def addresses_of(node: NodeConfig, broker: BrokerConfig) -> list[tuple[str, str, bool]]:
    """(setting, address, whether this member listens on it) for every address in the node file."""
    listed: list[tuple[str, str, bool]] = [
        ("node.raft_address", node.raft_address, True),
        ("node.catchup_address", node.catchup_address, True),
    ]
    for position, peer in enumerate(node.peers):
        listed += [(f"peers[{position}].raft_address", peer.raft_address, False),
                   (f"peers[{position}].catchup_address", peer.catchup_address, False)]
    listed.append(("broker.listen_address", broker.listen_address, True))
    if broker.advertised_address:
        listed.append(("broker.advertised_address", broker.advertised_address, False))
    listed += [(f"broker.namesrv[{position}]", address, False) for position, address in enumerate(broker.namesrv)]
    listed += [(f"broker.peer_addresses.{member}", address, False)
               for member, address in sorted(broker.peer_addresses.items())]
    if broker.grpc_address:
        listed.append(("broker.grpc_address", broker.grpc_address, True))
    listed += [(f"broker.peer_grpc_addresses.{member}", address, False)
               for member, address in sorted(broker.peer_grpc_addresses.items())]
    for name in ("http_address", "front_address"):  # the HTTP probes and the group's front, when this has them
        address = getattr(broker, name, "")
        if isinstance(address, str) and address:
            listed.append((f"broker.{name}", address, name == "http_address"))
    return listed


def is_local_address(family: socket.AddressFamily, ip: str) -> bool:
    """Whether this host has ``ip`` (binding a socket to it with port 0 says so; nothing listens)."""
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((ip, 0))
        except OSError as exc:
            if exc.errno == errno.EADDRNOTAVAIL:
                return False
            raise
    return True


def check_node_file(path: Path, resolve: Lookup = lookup,
                    is_local: Callable[[socket.AddressFamily, str], bool] = is_local_address) -> CheckReport:
    report = CheckReport()
    try:
        node, broker = load_node_file(path)
    except ConfigError as exc:
        report.problems.append(f"invalid configuration: {exc}")
        return report
    report.notes.append(f"node {node.id} of group {broker.broker_name} (cluster {broker.cluster_name}), "
                        f"{1 + len(node.peers)} members, data in {node.data_dir}")
    for setting, address, listens in addresses_of(node, broker):
        host_port = split_host_port(address)  # load_node_file checked the syntax
        if host_port.host in WILDCARD_HOSTS:
            report.notes.append(f"{setting} {address}: every interface")
            continue
        try:
            answers = resolve(host_port.host)
        except (OSError, UnicodeError) as exc:
            report.problems.append(f"{setting} {address}: cannot resolve {host_port.host!r}: {exc}")
            continue
        ips = ", ".join(ip for _, ip in answers)
        note = f"{setting} {address}" + ("" if host_port.is_ip_literal else f" -> {ips}")
        if listens:
            family, ip = answers[0]
            try:
                local = is_local(family, ip)
            except OSError as exc:
                local, note = True, f"{note} (cannot tell whether {ip} is local: {exc})"
            if not local:
                note += f" (warning: {ip} is not an address of this host; the member cannot listen there)"
        report.notes.append(note)
    return report
