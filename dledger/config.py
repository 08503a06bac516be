"""One TOML file per node: identity, peers, ports, data directory, timeouts, batch limits.

Example::

    [node]
    id = "n0"
    raft_address = "raftmq-0.example:20010"     # IPv4, a host name, or [IPv6]:port
    catchup_address = "raftmq-0.example:20011"
    data_dir = "/var/lib/raftmq/n0"
    secret_file = "/etc/raftmq/group.secret"     # or: secret = "..." (at least 16 characters)
    preferred_leader = "n0"                      # optional, the same on every member: it leads
                                                 # again once back and within 64 entries of the log's
                                                 # end (new writes wait the moment it takes to catch up)

    [[peers]]
    id = "n1"
    raft_address = "127.0.0.1:20020"
    catchup_address = "127.0.0.1:20021"

    [raft]                # every key optional
    election_timeout_min_ms = 1000

    [group_commit]        # every key optional
    batch_messages_max = 512

    [store]               # StoreConfig keys except data_dir (it is <data_dir>/store)
    flush_policy = "async"

Every value is checked; an unknown key or a bad value is a :class:`ConfigError` naming it.
"""

from __future__ import annotations

import dataclasses
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from commitlog.config import ConfigError, StoreConfig
from dledger.addresses import AddressError, split_host_port

SECRET_LENGTH_MIN = 16
JOURNAL_FLUSH_POLICIES = ("durable", "page_cache")
#: the threads that may propose group commit's entries (GroupCommitSettings.proposer)
PROPOSERS = ("tick", "thread")
SettingsT = TypeVar("SettingsT", "RaftSettings", "GroupCommitSettings")


def read_toml(path: Path) -> dict[str, Any]:
    """A TOML file as a dict; ConfigError naming the file when it cannot be read or parsed."""
    try:
        return tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path} is not valid TOML: {exc}") from exc


def parse_address(value: object, name: str) -> tuple[str, int]:
    """``host:port`` (an IPv4 address, a host name, or ``[IPv6]:port``) as (host without brackets, port);
    ConfigError naming the setting when malformed. Names are not resolved here: that happens at connect
    time (dledger.addresses); ``raftmq broker --check`` tells whether they resolve now."""
    try:
        address = split_host_port(value)
    except AddressError as exc:
        raise ConfigError(f"{name} {exc}") from None
    return address.host, address.port


@dataclass(frozen=True, slots=True)
class Peer:
    id: str
    raft_address: str
    catchup_address: str


@dataclass(frozen=True, slots=True)
class RaftSettings:
    #: elections start this long after a leader goes silent; a leader cut off from the majority for the
    #: max timeout steps down (dledger.tuning explains the margins needed on 2 shared cores)
    election_timeout_min_ms: int = 1000
    election_timeout_max_ms: int = 2000
    append_entries_period_ms: int = 5
    #: the longest the Raft thread sleeps with nothing to do (its timers: heartbeats, elections). Work wakes
    #: it at once whatever this is: a proposal, a peer's message, a finished flush
    tick_period_ms: int = 5
    #: the leader's heartbeat period once the group is quiet (every follower holds the whole log and nothing
    #: committed for a while): heartbeats every ``append_entries_period_ms`` were half of an idle member's
    #: CPU (3.4-4.0% of a core with this, 6.3-8.8% without). At most a fifth of ``election_timeout_min_ms``
    #: is used, and never less than ``append_entries_period_ms`` (which paces all but a quiet group)
    idle_heartbeat_period_ms: int = 100
    #: the longest the Raft thread sleeps once this member is quiet (a leader whose heartbeats slowed down; a
    #: follower that received no entry and saw no commit for 10 append-entries periods) instead of
    #: ``tick_period_ms``: 200 ticks a second were most of what an idle member still spent. Never past a
    #: follower's election deadline or a leader's next heartbeat; at most a tenth of
    #: ``election_timeout_min_ms``, and never less than ``tick_period_ms``. Work still wakes it at once
    idle_tick_period_ms: int = 50
    #: compact the Raft log after this many entries, or this many bytes of entries, or this long (pysyncobj
    #: keeps every entry in memory until then: the bytes bound what large entries of random payloads cost).
    #: A compaction flushes the store (fdatasync), now off the Raft thread (dledger.snapshot); when it ran on
    #: it, compacting every few hundred small entries stalled every member again and again, and those stalls
    #: made most of the commit latency's tail. This many small entries stay within the bytes bound.
    log_compaction_entries: int = 10_000
    log_compaction_bytes: int = 32 << 20
    log_compaction_seconds: int = 60
    #: when a Raft entry counts as held by this member (toward a majority, and before it is applied here):
    #: "durable", once the journal is flushed to the disk (msync) with it; "page_cache", once it is written to
    #: the journal's pages (faster; a power loss of a majority can lose acknowledged messages). README.md,
    #: "Flush policy", says what each survives.
    journal_flush: str = "durable"

    @property
    def quiet_heartbeat_period_ms(self) -> int:
        """The heartbeat period of a quiet group: ``idle_heartbeat_period_ms`` within its bounds."""
        return max(self.append_entries_period_ms,
                   min(self.idle_heartbeat_period_ms, self.election_timeout_min_ms // 5))

    @property
    def quiet_tick_period_ms(self) -> int:
        """The longest sleep of a quiet member's Raft thread: ``idle_tick_period_ms`` within its bounds."""
        return max(self.tick_period_ms, min(self.idle_tick_period_ms, self.election_timeout_min_ms // 10))

    def validate(self) -> None:
        _check_range(self, "election_timeout_min_ms", 50, 60_000)
        _check_range(self, "election_timeout_max_ms", self.election_timeout_min_ms + 1, 120_000)
        _check_range(self, "append_entries_period_ms", 2, min(10, self.election_timeout_min_ms // 3 - 1))
        _check_range(self, "tick_period_ms", 1, self.append_entries_period_ms)
        _check_range(self, "idle_heartbeat_period_ms", 1, 60_000)
        _check_range(self, "idle_tick_period_ms", 1, 60_000)
        _check_range(self, "log_compaction_entries", 2, 10_000_000)
        _check_range(self, "log_compaction_bytes", 1 << 20, 1 << 34)
        _check_range(self, "log_compaction_seconds", 1, 86_400)
        if self.journal_flush not in JOURNAL_FLUSH_POLICIES:
            raise ConfigError(f"RaftSettings.journal_flush must be one of {', '.join(JOURNAL_FLUSH_POLICIES)}, "
                              f"got {self.journal_flush!r}")


@dataclass(frozen=True, slots=True)
class GroupCommitSettings:
    """Bounds of one Raft entry and of what waits for one."""

    #: against 256, the leader and each follower spent less per single send (per-entry costs amortised over
    #: more messages); 1,024 did no better than 512
    batch_messages_max: int = 512
    batch_bytes_max: int = 1 << 20
    #: how long a batch waits to fill once work is there (to within a tick when the tick thread proposes); 0 (no wait, Nagle-free): an entry
    #: leaves as soon as an in-flight slot is free, and batches form from what arrived while the slots were
    #: taken. Any linger adds its whole length to a lone send's latency, and it bought no throughput with
    #: many sends in flight (bench/broker_bench.py --variant)
    linger_ms: int = 0
    #: entries proposed but not yet applied on the leader (a few entries' worth of bytes in flight gave the
    #: best throughput: enough to keep every member busy, not so much that it waits in buffers)
    in_flight_entries_max: int = 4
    #: bytes waiting to be proposed; beyond it appends are refused as busy (SYSTEM_BUSY)
    pending_bytes_max: int = 64 << 20
    #: how long a caller waits for its entry to apply before the outcome is reported unknown
    apply_timeout_ms: int = 10_000
    #: an applied entry of at most this many sends is completed on the Raft thread that applied it (the
    #: callbacks only queue each answer for the event loop); a larger one is handed to the completion thread.
    #: The hand-off cost a thread wake-up and GIL hand-overs per entry, and its wake-up waited for the rest of
    #: the tick: completing in place gave 7-22% more one-frame sends at in-flight 1, 32 and 256, in each of
    #: three rounds, for 8-15% less leader CPU per send (``bench/broker_bench.py --rounds 3 --variant
    #: handoff:group_commit.complete_inline_requests_max=0``). The default covers every entry of
    #: ``batch_messages_max``; 0 hands every entry over
    complete_inline_requests_max: int = 512
    #: which thread takes waiting sends, encodes them and proposes the entry: ``"tick"``, pysyncobj's tick
    #: thread itself, on each tick right before it appends and sends what was proposed; or ``"thread"``, a
    #: batcher thread of its own, which hands each entry to the tick thread (a wake-up through a pipe). On
    #: the tick thread an entry leaves in the tick that freed its in-flight slot, with no thread hand-off:
    #: more one-frame sends at in-flight 1 and 256 for less leader CPU, about as many at 32
    #: (``bench/broker_bench.py --rounds 3 --variant batcher:group_commit.proposer=thread``)
    proposer: str = "tick"

    def validate(self) -> None:
        _check_range(self, "batch_messages_max", 1, 65_536)
        _check_range(self, "batch_bytes_max", 1024, 16 << 20)
        _check_range(self, "linger_ms", 0, 1000)
        _check_range(self, "in_flight_entries_max", 1, 1024)
        _check_range(self, "pending_bytes_max", self.batch_bytes_max, 1 << 34)
        _check_range(self, "apply_timeout_ms", 10, 3_600_000)
        _check_range(self, "complete_inline_requests_max", 0, 65_536)
        if self.proposer not in PROPOSERS:
            raise ConfigError(f"GroupCommitSettings.proposer must be one of {', '.join(PROPOSERS)}, "
                              f"got {self.proposer!r}")


@dataclass(frozen=True, slots=True)
class NodeConfig:
    id: str
    raft_address: str
    catchup_address: str
    data_dir: Path
    secret: bytes
    peers: tuple[Peer, ...]
    raft: RaftSettings = field(default_factory=RaftSettings)
    group_commit: GroupCommitSettings = field(default_factory=GroupCommitSettings)
    store: StoreConfig | None = None
    #: a member that takes leadership back whenever it is connected and caught up (planned placement)
    preferred_leader: str | None = None

    @property
    def store_config(self) -> StoreConfig:
        return self.store if self.store is not None else StoreConfig(data_dir=self.data_dir / "store")

    @property
    def members(self) -> tuple[Peer, ...]:
        """Every member, this node included, sorted by id."""
        return tuple(sorted((Peer(self.id, self.raft_address, self.catchup_address), *self.peers),
                            key=lambda peer: peer.id))

    def validate(self) -> NodeConfig:
        if not self.id or not self.id.replace("-", "").replace("_", "").isalnum():
            raise ConfigError(f"node.id must be letters, digits, '-' or '_', got {self.id!r}")
        if len(self.secret) < SECRET_LENGTH_MIN:
            raise ConfigError(f"the group secret must have at least {SECRET_LENGTH_MIN} bytes")
        seen_ids = {self.id}
        seen_addresses = set()
        for peer in self.members:
            for name, address in (("raft_address", peer.raft_address), ("catchup_address", peer.catchup_address)):
                parse_address(address, f"{peer.id}.{name}")
                if address in seen_addresses:
                    raise ConfigError(f"address {address} is used twice")
                seen_addresses.add(address)
        for peer in self.peers:
            if peer.id in seen_ids:
                raise ConfigError(f"member id {peer.id!r} appears twice")
            seen_ids.add(peer.id)
        if not self.peers:
            raise ConfigError("a group needs peers (at least 2 for a 3-member group)")
        if self.preferred_leader is not None and self.preferred_leader not in seen_ids:
            raise ConfigError(f"node.preferred_leader {self.preferred_leader!r} is not a member")
        self.raft.validate()
        self.group_commit.validate()
        self.store_config.validate()
        return self

    @classmethod
    def from_toml(cls, path: Path) -> NodeConfig:
        return cls.from_mapping(read_toml(path), base=path.parent)

    @classmethod
    def from_mapping(cls, document: Mapping[str, Any], base: Path = Path(".")) -> NodeConfig:
        _reject_unknown(document, {"node", "peers", "raft", "group_commit", "store"}, "top level")
        node = _table(document, "node")
        _reject_unknown(node, {"id", "raft_address", "catchup_address", "data_dir", "secret", "secret_file",
                               "preferred_leader"}, "node")
        preferred = node.get("preferred_leader")
        if preferred is not None and not isinstance(preferred, str):
            raise ConfigError("node.preferred_leader must be a member id")
        for required in ("id", "raft_address", "catchup_address", "data_dir"):
            if not isinstance(node.get(required), str):
                raise ConfigError(f"node.{required} is required and must be a string")
        secret = _secret(node, base)
        data_dir = (base / node["data_dir"]).resolve()
        peers_raw = document.get("peers", [])
        if not isinstance(peers_raw, list):
            raise ConfigError("peers must be an array of tables")
        peers = []
        for position, peer in enumerate(peers_raw):
            if not isinstance(peer, dict):
                raise ConfigError(f"peers[{position}] must be a table")
            _reject_unknown(peer, {"id", "raft_address", "catchup_address"}, f"peers[{position}]")
            for required in ("id", "raft_address", "catchup_address"):
                if not isinstance(peer.get(required), str):
                    raise ConfigError(f"peers[{position}].{required} is required and must be a string")
            peers.append(Peer(peer["id"], peer["raft_address"], peer["catchup_address"]))
        raft = _dataclass_from(RaftSettings, document.get("raft", {}), "raft")
        group_commit = _dataclass_from(GroupCommitSettings, document.get("group_commit", {}), "group_commit")
        store_values = dict(_table(document, "store", required=False))
        if "data_dir" in store_values:
            raise ConfigError("store.data_dir is derived from node.data_dir; remove it")
        store = StoreConfig.from_mapping({**store_values, "data_dir": str(data_dir / "store")})
        return cls(node["id"], node["raft_address"], node["catchup_address"], data_dir, secret, tuple(peers),
                   raft, group_commit, store, preferred).validate()


def _secret(node: Mapping[str, Any], base: Path) -> bytes:
    if ("secret" in node) == ("secret_file" in node):
        raise ConfigError("node needs exactly one of secret and secret_file")
    if "secret" in node:
        if not isinstance(node["secret"], str):
            raise ConfigError("node.secret must be a string")
        return node["secret"].encode()
    try:
        return (base / str(node["secret_file"])).read_bytes().strip()
    except OSError as exc:
        raise ConfigError(f"cannot read node.secret_file: {exc}") from exc


def _table(document: Mapping[str, Any], name: str, required: bool = True) -> Mapping[str, Any]:
    value = document.get(name)
    if value is None and not required:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"[{name}] must be a table")
    return value


def _reject_unknown(values: Mapping[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(set(values) - allowed)
    if unknown:
        raise ConfigError(f"unknown key(s) in {where}: {', '.join(unknown)}")


def _dataclass_from(kind: type[SettingsT], values: object, where: str) -> SettingsT:
    if not isinstance(values, dict):
        raise ConfigError(f"[{where}] must be a table")
    textual = {f.name for f in dataclasses.fields(kind) if isinstance(f.default, str)}
    _reject_unknown(values, {f.name for f in dataclasses.fields(kind)}, where)
    for key, value in values.items():
        if key in textual:
            if not isinstance(value, str):
                raise ConfigError(f"{where}.{key} must be a string, got {value!r}")
        elif not isinstance(value, int) or isinstance(value, bool):
            raise ConfigError(f"{where}.{key} must be an integer, got {value!r}")
    return kind(**values)


def _check_range(settings: object, name: str, low: int, high: int) -> None:
    value = getattr(settings, name)
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        section = type(settings).__name__
        raise ConfigError(f"{section}.{name} must be an integer in {low}..{high}, got {value!r}")
