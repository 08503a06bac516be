"""Client configuration: frozen dataclasses that validate themselves and reject unknown keys, so a
mistyped setting fails at once instead of being ignored. Units are last in names.

- :class:`ClientConfig`: what every producer, consumer and admin shares: the name servers, timeouts
  and the background periods (route refresh, heartbeat, offset persistence).
- :class:`ProducerConfig`, :class:`ConsumerConfig`: one producer or consumer group.
- :func:`load_credentials`: an ACL access key / secret key from options, the environment
  (``RAFTMQ_ACCESS_KEY`` / ``RAFTMQ_SECRET_KEY``) or a credentials file (TOML ``access_key`` /
  ``secret_key``; ``RAFTMQ_CREDENTIALS_FILE``).
"""

from __future__ import annotations

import enum
import math
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Final, Self, TypeVar

from protocol.topics import AUTO_CREATE_TOPIC

#: ``MixAll.DEFAULT_PRODUCER_GROUP`` / ``DEFAULT_CONSUMER_GROUP``
DEFAULT_PRODUCER_GROUP: Final = "DEFAULT_PRODUCER"
DEFAULT_CONSUMER_GROUP: Final = "DEFAULT_CONSUMER"
#: where broadcasting consumers keep their offsets by default (Java: ~/.rocketmq_offsets)
DEFAULT_OFFSET_STORE_DIR: Final = Path.home() / ".raftmq_offsets"
_GROUP_MAX_CHARS: Final = 255
ACCESS_KEY_ENV: Final = "RAFTMQ_ACCESS_KEY"
SECRET_KEY_ENV: Final = "RAFTMQ_SECRET_KEY"
CREDENTIALS_FILE_ENV: Final = "RAFTMQ_CREDENTIALS_FILE"
_Config = TypeVar("_Config")


class ConfigError(ValueError):
    """A configuration value out of range, of the wrong type, or unknown."""


class MessageModel(enum.Enum):
    """``MessageModel``: the name is what Java-style heartbeats carry."""

    CLUSTERING = "CLUSTERING"
    BROADCASTING = "BROADCASTING"


class ConsumeFromWhere(enum.Enum):
    """Where a group with no committed offset starts (``ConsumeFromWhere``)."""

    CONSUME_FROM_LAST_OFFSET = "CONSUME_FROM_LAST_OFFSET"
    CONSUME_FROM_FIRST_OFFSET = "CONSUME_FROM_FIRST_OFFSET"
    CONSUME_FROM_TIMESTAMP = "CONSUME_FROM_TIMESTAMP"


class AllocateStrategy(enum.Enum):
    AVERAGELY = "AVERAGELY"
    CONSISTENT_HASH = "CONSISTENT_HASH"


def parse_namesrv_addresses(text: str) -> tuple[str, ...]:
    """``"host:port;host:port"`` (Java's separator; commas are accepted too) as a tuple."""
    addresses = tuple(part.strip() for part in text.replace(",", ";").split(";") if part.strip())
    for address in addresses:
        _check_address(address, "name server address")
    if not addresses:
        raise ConfigError(f"no name server address in {text!r}")
    return addresses


def _check_address(address: str, what: str) -> None:
    host, separator, port = address.rpartition(":")
    if not separator or not host or not port.isdigit() or not 1 <= int(port) <= 65_535:
        raise ConfigError(f"{what} must be host:port, got {address!r}")


def _check_positive_seconds(config: object, *names: str) -> None:
    for name in names:
        value = getattr(config, name)
        if type(value) not in (int, float) or not math.isfinite(value) or value <= 0:
            raise ConfigError(f"{name} must be a positive finite number of seconds, got {value!r}")


def _check_ints(config: object, minimum: int, *names: str) -> None:
    for name in names:
        value = getattr(config, name)
        if type(value) is not int or value < minimum:
            raise ConfigError(f"{name} must be an int >= {minimum}, got {value!r}")


def _check_group(group: object) -> None:
    if (
        not isinstance(group, str)
        or not 1 <= len(group) <= _GROUP_MAX_CHARS
        or not all(ch.isalnum() or ch in "%|-_" for ch in group)
    ):
        raise ConfigError(
            f"group must be 1 to {_GROUP_MAX_CHARS} characters of [A-Za-z0-9%|_-], got {group!r}"
        )


def _from_mapping(cls: type[_Config], values: Mapping[str, Any]) -> _Config:
    known = {each.name for each in fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(values) - known)
    if unknown:
        raise ConfigError(f"unknown {cls.__name__} keys: {', '.join(unknown)} (known: {', '.join(sorted(known))})")
    return cls(**values)


@dataclass(frozen=True, slots=True)
class ClientConfig:
    """What every client object shares.

    - ``namesrv_addresses``: the name servers, asked in turn until one answers.
    - ``request_timeout_seconds``: one request's wait for its answer (a long-polling pull adds its
      suspend time); ``connect_timeout_seconds``: one TCP connect.
    - ``route_refresh_interval_seconds``: routes are refreshed this often, and at once after a
      connection failure or a not-leader answer (Java: 30 s, and only periodically).
    - ``heartbeat_interval_seconds``: HEART_BEAT to every broker (Java: 30 s); also sent at once to a
      broker address seen for the first time.
    - ``suspect_address_seconds``: an address that failed is avoided for this long, unless nothing
      else is left.
    - ``leader_hint_ttl_seconds``: how long a follower's ``leaderAddress`` answer is trusted over the
      name server's routes.
    - ``failover_backoff_min_seconds`` / ``failover_backoff_max_seconds``: the wait between attempts
      while a group has no reachable leader (doubling, with seeded jitter).
    - ``instance_name``: part of the client id; ``None`` makes every client object unique
      (process id and a counter), as Java's default does.
    - ``client_ip``: what the client id and born host carry (``None``: found from the route to the
      first name server).
    - ``access_key`` / ``secret_key``: ACL credentials; with them every request is signed as
      RocketMQ's ``AclClientRPCHook`` signs it (both, or neither).
    - ``tls``: connect to brokers with TLS (name servers stay plain), verifying their certificate
      against ``tls_ca_file`` (``None``: the system's certificate authorities).
    """

    namesrv_addresses: tuple[str, ...]
    request_timeout_seconds: float = 3.0
    connect_timeout_seconds: float = 3.0
    route_refresh_interval_seconds: float = 30.0
    heartbeat_interval_seconds: float = 30.0
    suspect_address_seconds: float = 3.0
    leader_hint_ttl_seconds: float = 30.0
    failover_backoff_min_seconds: float = 0.05
    failover_backoff_max_seconds: float = 1.0
    instance_name: str | None = None
    client_ip: str | None = None
    outbound_requests_max: int = 65_536
    access_key: str | None = None
    secret_key: str | None = None
    tls: bool = False
    tls_ca_file: str | None = None

    def __post_init__(self) -> None:
        given: object = self.namesrv_addresses  # a str or list is accepted too
        if isinstance(given, str):
            object.__setattr__(self, "namesrv_addresses", parse_namesrv_addresses(given))
        elif isinstance(given, list):
            object.__setattr__(self, "namesrv_addresses", tuple(given))
        self.validate()

    def validate(self) -> Self:
        if not isinstance(self.namesrv_addresses, tuple) or not self.namesrv_addresses:
            raise ConfigError("namesrv_addresses must name at least one name server")
        for address in self.namesrv_addresses:
            if not isinstance(address, str):
                raise ConfigError(f"name server address must be a string, got {address!r}")
            _check_address(address, "name server address")
        _check_positive_seconds(
            self,
            "request_timeout_seconds",
            "connect_timeout_seconds",
            "route_refresh_interval_seconds",
            "heartbeat_interval_seconds",
            "suspect_address_seconds",
            "leader_hint_ttl_seconds",
            "failover_backoff_min_seconds",
            "failover_backoff_max_seconds",
        )
        if self.failover_backoff_min_seconds > self.failover_backoff_max_seconds:
            raise ConfigError("failover_backoff_min_seconds cannot exceed failover_backoff_max_seconds")
        _check_ints(self, 1, "outbound_requests_max")
        for name in ("instance_name", "client_ip"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value or "@" in value):
                raise ConfigError(f"{name} must be a non-empty string without '@', got {value!r}")
        _check_credentials(self.access_key, self.secret_key)
        if not isinstance(self.tls, bool):
            raise ConfigError(f"tls must be true or false, got {self.tls!r}")
        if self.tls_ca_file is not None and (not isinstance(self.tls_ca_file, str) or not self.tls_ca_file):
            raise ConfigError(f"tls_ca_file must be a file name, got {self.tls_ca_file!r}")
        return self

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> ClientConfig:
        return _from_mapping(cls, values)

    @classmethod
    def of(cls, namesrv: str | ClientConfig) -> ClientConfig:
        """A config from ``"host:port;..."``, or the config itself."""
        return namesrv if isinstance(namesrv, ClientConfig) else cls(parse_namesrv_addresses(namesrv))


def _check_credentials(access_key: object, secret_key: object) -> None:
    if (access_key is None) != (secret_key is None):
        raise ConfigError("access_key and secret_key go together (give both, or neither)")
    for name, value in (("access_key", access_key), ("secret_key", secret_key)):
        if value is not None and (not isinstance(value, str) or not value):
            raise ConfigError(f"{name} must be a non-empty string")


def load_credentials(
    access_key: str | None = None,
    secret_key: str | None = None,
    credentials_file: str | os.PathLike[str] | None = None,
    environ: Mapping[str, str] | None = None,
) -> tuple[str, str] | None:
    """ACL credentials, first found of: the arguments, ``RAFTMQ_ACCESS_KEY`` / ``RAFTMQ_SECRET_KEY``, the
    credentials file (the argument, else ``RAFTMQ_CREDENTIALS_FILE``: TOML with ``access_key`` and
    ``secret_key``). None when there are none. An access key without its secret key (or the reverse)
    at any level is a :class:`ConfigError`, not a fall-through."""
    environment = os.environ if environ is None else environ
    if access_key is not None or secret_key is not None:
        _check_credentials(access_key, secret_key)
        assert access_key is not None and secret_key is not None
        return access_key, secret_key
    from_environment = environment.get(ACCESS_KEY_ENV), environment.get(SECRET_KEY_ENV)
    if from_environment != (None, None):
        try:
            _check_credentials(*from_environment)
        except ConfigError as error:
            raise ConfigError(f"{ACCESS_KEY_ENV} / {SECRET_KEY_ENV}: {error}") from None
        return from_environment[0] or "", from_environment[1] or ""
    path = credentials_file if credentials_file is not None else environment.get(CREDENTIALS_FILE_ENV)
    if not path:
        return None
    try:
        document = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as error:
        raise ConfigError(f"cannot read the credentials file {path}: {error}") from None
    unknown = sorted(set(document) - {"access_key", "secret_key"})
    if unknown:
        raise ConfigError(f"credentials file {path}: unknown key(s) {', '.join(unknown)}")
    found = document.get("access_key"), document.get("secret_key")
    try:
        _check_credentials(*found)
    except ConfigError as error:
        raise ConfigError(f"credentials file {path}: {error}") from None
    if found == (None, None):
        return None
    return str(found[0]), str(found[1])


@dataclass(frozen=True, slots=True)
class ProducerConfig:
    """One producer group.

    - ``send_timeout_seconds``: the whole send, retries and failover included (Java: 3 s, but Java
      does not ride out a leader election; a raftmq failover takes a few seconds).
    - ``retry_times_when_send_failed``: extra attempts after a broker error that is not a failover
      (SYSTEM_BUSY, ...), each on another queue when there is one (Java: 2). Failover errors (not
      leader, connection lost, timeout) are retried until the deadline. Every attempt carries the same
      UNIQ_KEY.
    - ``compress_body_over_bytes``: bodies above this are zlib-compressed (sysFlag 0x1), as Java's
      ``compressMsgBodyOverHowmuch`` (4096); 0 disables compression.
    - ``message_size_max_bytes``: the largest body (Java's ``maxMessageSize``, 4 MiB).
    - ``default_topic_queue_nums``: queues of an auto-created topic, as asked of the broker.
    - ``inflight_sends_max``: asynchronous sends not yet answered; more wait (back-pressure).
    - ``coalesce_sends``: plain sends to one queue issued in the same event-loop turn go as one batch
      request, each with its own result (:mod:`client.coalesce`); at most ``coalesce_messages_max``
      sends and ``coalesce_bytes_max`` bytes per batch.
    """

    group: str = DEFAULT_PRODUCER_GROUP
    send_timeout_seconds: float = 10.0
    retry_times_when_send_failed: int = 2
    compress_body_over_bytes: int = 4096
    compress_level: int = 5
    message_size_max_bytes: int = 4 * 1024 * 1024
    default_topic_queue_nums: int = 4
    create_topic_key: str = AUTO_CREATE_TOPIC
    inflight_sends_max: int = 10_000
    coalesce_sends: bool = True
    coalesce_messages_max: int = 128
    coalesce_bytes_max: int = 256 * 1024

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> Self:
        _check_group(self.group)
        _check_positive_seconds(self, "send_timeout_seconds")
        _check_ints(self, 0, "retry_times_when_send_failed", "compress_body_over_bytes")
        _check_ints(self, 1, "message_size_max_bytes", "default_topic_queue_nums", "inflight_sends_max",
                    "coalesce_messages_max", "coalesce_bytes_max")
        if type(self.coalesce_sends) is not bool:
            raise ConfigError(f"coalesce_sends must be true or false, got {self.coalesce_sends!r}")
        if self.coalesce_bytes_max > self.message_size_max_bytes:
            raise ConfigError(f"coalesce_bytes_max ({self.coalesce_bytes_max}) must not exceed message_size_max_bytes "
                              f"({self.message_size_max_bytes}): a batch is bounded like one message")
        if type(self.compress_level) is not int or not 0 <= self.compress_level <= 9:
            raise ConfigError(f"compress_level must be in [0, 9], got {self.compress_level!r}")
        if not isinstance(self.create_topic_key, str) or not self.create_topic_key:
            raise ConfigError("create_topic_key must be a non-empty string")
        return self

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> ProducerConfig:
        return _from_mapping(cls, values)


@dataclass(frozen=True, slots=True)
class ConsumerConfig:
    """One consumer group.

    - ``message_model``: clustering (each message to one member; offsets on the broker) or
      broadcasting (every member gets everything; offsets in ``offset_store_dir``).
    - ``consume_from_where`` / ``consume_timestamp_ms``: where a group with no committed offset starts.
    - ``allocate_strategy``: how a clustering group's members split the queues.
    - ``pull_batch_size``: messages per PULL; ``pull_threshold_per_queue``: messages cached per queue
      before pulling pauses (flow control).
    - ``consume_batch_max``: messages per listener call; ``consume_concurrency``: listener calls at
      once (a concurrent consumer).
    - ``max_reconsume_times``: deliveries before a message goes to the dead-letter queue (Java: 16).
    - ``suspend_timeout_seconds``: how long the broker holds a PULL with nothing new (long polling,
      Java: 15 s); ``pull_backoff_seconds``: the wait after a pull error.
    - ``rebalance_interval_seconds``: periodic rebalance (also done at once on
      NOTIFY_CONSUMER_IDS_CHANGED); ``persist_offsets_interval_seconds``: offsets committed this often
      (and when a queue is dropped, and at shutdown); ``lock_interval_seconds``: an orderly consumer
      renews its queue locks this often (Java: 20 s; brokers expire them after 60 s).
    - ``suspend_current_queue_seconds``: an orderly listener's SUSPEND waits this long.
    """

    group: str = DEFAULT_CONSUMER_GROUP
    message_model: MessageModel = MessageModel.CLUSTERING
    consume_from_where: ConsumeFromWhere = ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET
    consume_timestamp_ms: int = 0
    allocate_strategy: AllocateStrategy = AllocateStrategy.AVERAGELY
    pull_batch_size: int = 32
    pull_threshold_per_queue: int = 1000
    consume_batch_max: int = 1
    consume_concurrency: int = 20
    max_reconsume_times: int = 16
    suspend_timeout_seconds: float = 15.0
    pull_backoff_seconds: float = 1.0
    rebalance_interval_seconds: float = 10.0
    persist_offsets_interval_seconds: float = 5.0
    lock_interval_seconds: float = 20.0
    suspend_current_queue_seconds: float = 1.0
    offset_store_dir: Path = field(default=DEFAULT_OFFSET_STORE_DIR)

    def __post_init__(self) -> None:
        for name, kind in (
            ("message_model", MessageModel),
            ("consume_from_where", ConsumeFromWhere),
            ("allocate_strategy", AllocateStrategy),
        ):
            value = getattr(self, name)
            if isinstance(value, str):
                try:
                    object.__setattr__(self, name, kind(value.upper()))
                except ValueError:
                    raise ConfigError(
                        f"{name} must be one of {', '.join(each.value for each in kind)}, got {value!r}"
                    ) from None
        directory: object = self.offset_store_dir  # a str is accepted too
        if isinstance(directory, str):
            object.__setattr__(self, "offset_store_dir", Path(directory))
        self.validate()

    def validate(self) -> Self:
        _check_group(self.group)
        if not isinstance(self.message_model, MessageModel):
            raise ConfigError(f"message_model must be a MessageModel, got {self.message_model!r}")
        if not isinstance(self.consume_from_where, ConsumeFromWhere):
            raise ConfigError(f"consume_from_where must be a ConsumeFromWhere, got {self.consume_from_where!r}")
        if not isinstance(self.allocate_strategy, AllocateStrategy):
            raise ConfigError(f"allocate_strategy must be an AllocateStrategy, got {self.allocate_strategy!r}")
        _check_ints(self, 0, "consume_timestamp_ms", "max_reconsume_times")
        _check_ints(
            self, 1, "pull_batch_size", "pull_threshold_per_queue", "consume_batch_max", "consume_concurrency"
        )
        if self.pull_batch_size > 1024:
            raise ConfigError(f"pull_batch_size must be at most 1024, got {self.pull_batch_size}")
        if self.pull_threshold_per_queue < self.pull_batch_size:
            raise ConfigError("pull_threshold_per_queue cannot be below pull_batch_size")
        _check_positive_seconds(
            self,
            "suspend_timeout_seconds",
            "pull_backoff_seconds",
            "rebalance_interval_seconds",
            "persist_offsets_interval_seconds",
            "lock_interval_seconds",
            "suspend_current_queue_seconds",
        )
        if not isinstance(self.offset_store_dir, os.PathLike):
            raise ConfigError(f"offset_store_dir must be a path, got {self.offset_store_dir!r}")
        return self

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> ConsumerConfig:
        return _from_mapping(cls, values)
