"""A broker node's configuration: the node's Raft membership (``dledger.config``) plus a ``[broker]`` table.

One TOML file per node (``raftmq broker --config node.toml``)::

    [broker]
    listen_address = "127.0.0.1:10911"         # the remoting port this broker serves on
    advertised_address = "10.0.0.5:10911"       # optional: the address clients are told (default: listen_address)
    broker_name = "broker-a"                    # the group's name: the same on every member
    cluster_name = "DefaultCluster"
    namesrv = ["127.0.0.1:9876"]
    broker_id = 1                               # the id this member registers with while a follower
    peer_addresses = { n1 = "127.0.0.1:10921", n2 = "127.0.0.1:10931" }   # the others' advertised addresses
    acl_file = "acl.toml"                       # optional: RocketMQ plain ACL (broker.acl.config); off if unset
    tls_cert_file = "broker.pem"                # optional, with tls_key_file: TLS on the remoting port
    tls_key_file = "broker.key"
    grpc_address = "127.0.0.1:8081"             # optional: RocketMQ 5.x clients (gRPC, broker.v2); off if unset
    peer_grpc_addresses = { n1 = "127.0.0.1:8082", n2 = "127.0.0.1:8083" }   # the others' grpc_address
    http_address = "127.0.0.1:9100"             # optional: GET /healthz, /readyz, /metrics (broker.http); off if unset
    front_address = "10.0.0.100:10911"          # optional: the group's load balancer; the leader registers it as id 0
    follower_front_hosts = ["10.0.0.100"]       # optional: a front routing to followers connects from these (PROXY v2)

``advertised_address`` is the address that names this broker to clients: it is registered with the name
servers (brokerAddr, haServerAddr), reported by admin requests, and handed out by the other members as
``leaderAddress`` when they refuse a write; set it when clients reach the broker through something else
than its listen address (NAT, a load balancer, a proxy: the chaos runs put a Toxiproxy proxy in front of
every broker). The server itself always listens on ``listen_address``. ``peer_addresses`` are therefore
the other members' advertised addresses (their listen addresses when they advertise none).

``grpc_address`` is both where the gRPC server listens and what it tells 5.x clients (QueryRoute names the
leader's); ``peer_grpc_addresses`` lets a follower name the leader's and forward sends to it.

Relative file names are read from the node file's directory. The file named by ``acl_file`` must exist
and be valid when the node starts; afterwards it is reloaded on change (broker.acl.reloader).

    [node] ... [[peers]] ... [raft] ... [group_commit] ... [store]   (see dledger.config)

Every value is checked; an unknown key or a bad value is a ``ConfigError`` naming it.
"""

from __future__ import annotations

import dataclasses
import math
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from broker.acl.config import load_acl_file
from broker.acl.permissions import AclConfigError
from broker.front_moves import front_host_set
from commitlog.config import ConfigError
from dledger.addresses import WILDCARD_HOSTS
from dledger.config import NodeConfig, parse_address, read_toml

#: RocketMQ's delay levels (``messageDelayLevel``), in seconds
DEFAULT_DELAY_LEVELS_SECONDS: tuple[int, ...] = (
    1, 5, 10, 30, 60, 120, 180, 240, 300, 360, 420, 480, 540, 600, 1200, 1800, 3600, 7200,
)
#: the event loops ``broker.event_loop`` may name
EVENT_LOOPS: Final = ("uvloop", "asyncio")


@dataclass(frozen=True, slots=True)
class BrokerConfig:
    listen_address: str
    #: the address clients are given for this broker; empty: ``listen_address`` (see :attr:`announced_address`)
    advertised_address: str = ""
    broker_name: str = "broker-a"
    cluster_name: str = "DefaultCluster"
    namesrv: tuple[str, ...] = ()
    #: the id this member registers under while it is a follower (the leader registers as 0)
    broker_id: int = 1
    #: member id -> the address clients reach that member at (its advertised address), so a follower
    #: can name the leader to a client
    peer_addresses: Mapping[str, str] = field(default_factory=dict)
    #: create a topic on its first send (RocketMQ's autoCreateTopicEnable)
    auto_create_topic: bool = True
    default_topic_queue_nums: int = 4
    #: re-registration period with the name servers (RocketMQ: 30 s); a role change registers at once
    register_interval_seconds: float = 10.0
    #: the longest a pull is held waiting for messages, whatever the client asks
    long_polling_max_ms: int = 30_000
    #: messages one pull returns at most, and their bytes
    pull_messages_max: int = 64
    pull_bytes_max: int = 4 << 20
    #: reconsume attempts before a message goes to the dead-letter queue (RocketMQ: 16)
    max_reconsume_times: int = 16
    delay_levels_seconds: tuple[int, ...] = DEFAULT_DELAY_LEVELS_SECONDS
    #: consumer or producer connections silent for this long are forgotten (RocketMQ: 120 s)
    client_expiry_seconds: float = 120.0
    #: an orderly consumer's queue lock lives this long without renewal (RocketMQ: 60 s)
    queue_lock_seconds: float = 60.0
    #: a half message is checked back once it is this old (RocketMQ: transactionTimeOut 6 s)
    transaction_timeout_ms: int = 6_000
    #: how often an unresolved half is checked back (RocketMQ: transactionCheckInterval 60 s)
    transaction_check_interval_ms: int = 60_000
    #: check-backs before a half is discarded (RocketMQ: transactionCheckMax 15)
    transaction_check_max: int = 15
    #: commit-log segments whose records are all older than this are deleted (RocketMQ: fileReservedTime
    #: 72 h); 0 keeps everything
    file_reserved_seconds: int = 72 * 3600
    retention_check_seconds: float = 60.0
    #: RocketMQ plain-ACL rules (TOML); empty: access control is off (unless the group replicated rules)
    acl_file: str = ""
    #: TLS on the remoting port: both set, or neither (off)
    tls_cert_file: str = ""
    tls_key_file: str = ""
    #: the remoting server's limits (broker.remoting.server.ServerLimits)
    remoting_connections_max: int = 1024
    remoting_in_flight_requests_max: int = 1024
    #: a connection with no whole frame either way for this long is closed (slow-loris, half-open peers)
    remoting_idle_timeout_seconds: float = 120.0
    #: the RocketMQ 5.x gRPC server (broker.v2): where it listens and what clients are told; empty: off
    grpc_address: str = ""
    #: member id -> that member's ``grpc_address`` (to name the leader to 5.x clients and forward to it)
    peer_grpc_addresses: Mapping[str, str] = field(default_factory=dict)
    #: gRPC calls served at once (Telemetry streams included: one per client); more are refused RESOURCE_EXHAUSTED
    grpc_in_flight_requests_max: int = 1024
    #: where the HTTP probes and metrics listen (``GET /healthz``, ``/readyz``, ``/readyz?role=leader``,
    #: ``/metrics``: broker.http); empty: off
    http_address: str = ""
    #: the group's front (a load balancer in front of every member, routing to the leader): the leader
    #: registers it as brokerId 0 instead of its own address; empty: no front (broker.forwarding)
    front_address: str = ""
    #: requests a follower forwards to the leader at once (more are answered SYSTEM_BUSY), and how long
    #: one forward may take (broker.forwarding)
    forward_in_flight_max: int = 1024
    forward_timeout_seconds: float = 3.0
    #: the hosts (IP addresses) a front that routes clients to followers connects from. Their connections start
    #: with a PROXY protocol v2 header naming the client (broker.remoting.proxy_protocol), and the leader moves
    #: them to the followers when idle (broker.front_moves); empty: a front routing to the leader, or none
    follower_front_hosts: tuple[str, ...] = ()

    #: the broker's event loop: "uvloop" (libuv's, less CPU per request; the stdlib's where uvloop cannot be
    #: imported) or "asyncio" (the stdlib's)
    event_loop: str = "uvloop"

    @property
    def announced_address(self) -> str:
        """The address that names this broker to clients: ``advertised_address``, else ``listen_address``."""
        return self.advertised_address or self.listen_address

    def validate(self) -> BrokerConfig:
        parse_address(self.listen_address, "broker.listen_address")
        if self.advertised_address != "":
            host, _ = parse_address(self.advertised_address, "broker.advertised_address")
            if host in WILDCARD_HOSTS:
                raise ConfigError("broker.advertised_address must be an address clients can connect to, "
                                  f"not the wildcard {self.advertised_address!r}")
        for position, address in enumerate(self.namesrv):
            parse_address(address, f"broker.namesrv[{position}]")
        for member, address in self.peer_addresses.items():
            parse_address(address, f"broker.peer_addresses.{member}")
        if self.grpc_address != "":
            host, _ = parse_address(self.grpc_address, "broker.grpc_address")
            if host in WILDCARD_HOSTS:
                raise ConfigError("broker.grpc_address is also the address 5.x clients are given: it must be one "
                                  f"they can connect to, not the wildcard {self.grpc_address!r}")
        for member, address in self.peer_grpc_addresses.items():
            parse_address(address, f"broker.peer_grpc_addresses.{member}")
        _check_int(self, "grpc_in_flight_requests_max", 1, 1 << 20)
        if self.http_address != "":
            parse_address(self.http_address, "broker.http_address")
        if self.front_address != "":
            host, _ = parse_address(self.front_address, "broker.front_address")
            if host in WILDCARD_HOSTS:
                raise ConfigError("broker.front_address is the address clients are given: it must be one they "
                                  f"can connect to, not the wildcard {self.front_address!r}")
        _check_int(self, "forward_in_flight_max", 1, 1 << 20)
        try:
            front_host_set(self.follower_front_hosts)
        except ValueError as exc:
            raise ConfigError(f"broker.{exc}") from None
        forward_timeout = self.forward_timeout_seconds
        if (not isinstance(forward_timeout, int | float) or isinstance(forward_timeout, bool)
                or not (math.isfinite(forward_timeout) and 0 < forward_timeout <= 600)):
            raise ConfigError(f"broker.forward_timeout_seconds must be a number of seconds in (0, 600], "
                              f"got {forward_timeout!r}")
        for name, value in (("broker_name", self.broker_name), ("cluster_name", self.cluster_name)):
            if not value or not value.replace("-", "").replace("_", "").isalnum():
                raise ConfigError(f"broker.{name} must be letters, digits, '-' or '_', got {value!r}")
        _check_int(self, "broker_id", 1, 1 << 20)
        _check_int(self, "default_topic_queue_nums", 1, 1024)
        _check_int(self, "long_polling_max_ms", 0, 600_000)
        _check_int(self, "pull_messages_max", 1, 1024)
        _check_int(self, "pull_bytes_max", 1024, 64 << 20)
        _check_int(self, "max_reconsume_times", 0, 1000)
        _check_int(self, "transaction_timeout_ms", 0, 86_400_000)
        _check_int(self, "transaction_check_interval_ms", 100, 86_400_000)
        _check_int(self, "transaction_check_max", 0, 10_000)
        _check_int(self, "file_reserved_seconds", 0, 10 * 365 * 86_400)
        retention_check = self.retention_check_seconds
        if (not isinstance(retention_check, int | float) or isinstance(retention_check, bool)
                or not 0.1 <= retention_check <= 86_400):
            raise ConfigError(f"broker.retention_check_seconds must be in 0.1..86400, got {retention_check!r}")
        for name in ("register_interval_seconds", "client_expiry_seconds", "queue_lock_seconds"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or isinstance(value, bool) or not 0 < value <= 86_400:
                raise ConfigError(f"broker.{name} must be a number of seconds in (0, 86400], got {value!r}")
        levels = self.delay_levels_seconds
        if not levels or len(levels) > 64 or any(
            not isinstance(level, int) or isinstance(level, bool) or not 0 < level <= 30 * 86_400 for level in levels
        ):
            raise ConfigError("broker.delay_levels_seconds must be 1..64 delays of 1 s .. 30 days")
        if not isinstance(self.auto_create_topic, bool):
            raise ConfigError("broker.auto_create_topic must be true or false")
        for name in ("acl_file", "tls_cert_file", "tls_key_file"):
            if not isinstance(getattr(self, name), str):
                raise ConfigError(f"broker.{name} must be a file name")
        if bool(self.tls_cert_file) != bool(self.tls_key_file):
            raise ConfigError("broker.tls_cert_file and broker.tls_key_file go together (set both, or neither)")
        if self.event_loop not in EVENT_LOOPS:
            raise ConfigError(f"broker.event_loop must be one of {', '.join(EVENT_LOOPS)}, got {self.event_loop!r}")
        _check_int(self, "remoting_connections_max", 1, 1 << 20)
        _check_int(self, "remoting_in_flight_requests_max", 1, 1 << 20)
        idle = self.remoting_idle_timeout_seconds
        if not isinstance(idle, int | float) or isinstance(idle, bool) or not (math.isfinite(idle) and 0 < idle <= 86_400):
            raise ConfigError(f"broker.remoting_idle_timeout_seconds must be a number of seconds in (0, 86400], got {idle!r}")
        return self

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> BrokerConfig:
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - names)
        if unknown:
            raise ConfigError(f"unknown key(s) in broker: {', '.join(unknown)}")
        if not isinstance(values.get("listen_address"), str):
            raise ConfigError("broker.listen_address is required and must be 'host:port'")
        if "advertised_address" in values and values["advertised_address"] == "":
            raise ConfigError("broker.advertised_address must be 'host:port' (leave it out to advertise "
                              "listen_address)")
        arguments = dict(values)
        for name in ("namesrv", "delay_levels_seconds", "follower_front_hosts"):
            if name in arguments:
                value = arguments[name]
                if isinstance(value, str):
                    value = [value]
                if not isinstance(value, list):
                    raise ConfigError(f"broker.{name} must be a list")
                arguments[name] = tuple(value)
        for name in ("peer_addresses", "peer_grpc_addresses"):
            peers = arguments.get(name, {})
            if not isinstance(peers, dict) or not all(isinstance(v, str) for v in peers.values()):
                raise ConfigError(f"broker.{name} must map member ids to 'host:port'")
        for name in ("grpc_address", "http_address", "front_address"):
            if not isinstance(arguments.get(name, ""), str):
                raise ConfigError(f"broker.{name} must be 'host:port'")
        for name in ("broker_name", "cluster_name"):
            if name in arguments and not isinstance(arguments[name], str):
                raise ConfigError(f"broker.{name} must be a string")
        return cls(**arguments).validate()


def load_node_file(path: Path) -> tuple[NodeConfig, BrokerConfig]:
    """Read a node's TOML file: the Raft member's settings and the broker's."""
    document = read_toml(path)
    broker_values = document.pop("broker", None)
    if not isinstance(broker_values, dict):
        raise ConfigError(f"{path}: a [broker] table is required")
    node = NodeConfig.from_mapping(document, base=path.parent)
    broker = BrokerConfig.from_mapping(broker_values)
    unknown_members = sorted((set(broker.peer_addresses) | set(broker.peer_grpc_addresses))
                             - {peer.id for peer in node.peers})
    if unknown_members:
        raise ConfigError(f"broker.peer_addresses or peer_grpc_addresses names non-members: {', '.join(unknown_members)}")
    broker = _resolve_files(broker, path.parent)
    return node, broker


def _resolve_files(broker: BrokerConfig, base: Path) -> BrokerConfig:
    """File names relative to the node file's directory; the ACL file and TLS pair checked now, so a bad
    one stops the node at start with a clear message."""
    def resolved(name: str) -> str:
        return str(base / value) if (value := getattr(broker, name)) else ""

    broker = dataclasses.replace(broker, acl_file=resolved("acl_file"), tls_cert_file=resolved("tls_cert_file"),
                                 tls_key_file=resolved("tls_key_file"))
    if broker.acl_file:
        try:
            load_acl_file(Path(broker.acl_file))
        except AclConfigError as exc:
            raise ConfigError(f"broker.acl_file: {exc}") from None
    if broker.tls_cert_file:
        try:
            ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(broker.tls_cert_file, broker.tls_key_file)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"broker.tls_cert_file / tls_key_file cannot be used: {exc}") from None
    return broker


def _check_int(config: BrokerConfig, name: str, low: int, high: int) -> None:
    value = getattr(config, name)
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise ConfigError(f"broker.{name} must be an integer in {low}..{high}, got {value!r}")
