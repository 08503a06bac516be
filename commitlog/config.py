"""Store configuration: a frozen dataclass that validates itself and rejects unknown keys."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from commitlog.hosts import encode_address
from commitlog.message import TOPIC_BYTES_MAX
from protocol.properties import PROPERTIES_BYTES_MAX

FlushPolicy = Literal["async", "sync"]
GIB = 1 << 30
#: the most a record adds to its body: fixed head with IPv6 hosts, topic, properties, and a filler header
RECORD_OVERHEAD_MAX_BYTES = 128 + TOPIC_BYTES_MAX + PROPERTIES_BYTES_MAX + 8
MIB = 1 << 20


class ConfigError(ValueError):
    """A configuration value is missing, unknown or out of range; the message names the field."""


@dataclass(frozen=True, slots=True)
class StoreConfig:
    """Everything the local store needs.

    ``store_host`` is the group's stable address (``ip:port`` or ``[ipv6]:port``, an IP literal: a record
    holds its bytes, so a host name cannot be one), written into every record and message id, the same on
    every replica. An IPv6 store host makes records 12 bytes longer (sysFlag 0x20) and
    message ids 56 hex characters instead of 32, as RocketMQ writes them. ``flush_policy``: ``sync`` msyncs the commit log, its
    derived files and the checkpoint before :meth:`MessageStore.append` returns; ``async`` leaves them to
    the page cache and msyncs when ``flush_interval_ms`` has passed since the last flush (checked on append
    and by :meth:`MessageStore.flush_if_due`).

    ``page_cache_keep_bytes``: how much of the commit log below the flushed end stays in the page cache.
    Older flushed pages are dropped from it (``posix_fadvise(DONTNEED)``) so that new writes reuse their
    memory instead of growing the cache into memory not touched lately, which on a VM the host may have
    taken back (writing an entry into such memory cost many times the CPU of writing it into reused
    pages). Reads of older data go to the disk.
    """

    data_dir: Path
    store_host: str = "127.0.0.1:10911"
    segment_size_bytes: int = GIB
    consume_queue_units_per_file: int = 300_000
    index_slot_count: int = 1_000_000
    index_entry_capacity: int = 4_000_000
    body_size_max_bytes: int = 4 * MIB
    flush_policy: FlushPolicy = "async"
    flush_interval_ms: int = 500
    page_cache_keep_bytes: int = 256 * MIB

    def validate(self) -> StoreConfig:
        if not isinstance(self.data_dir, Path):
            raise ConfigError(f"data_dir must be a path, got {self.data_dir!r}")
        if not isinstance(self.store_host, str):
            raise ConfigError(f"store_host must be a string, got {self.store_host!r}")
        try:
            encode_address(self.store_host)
        except ValueError as exc:
            raise ConfigError(f"store_host must be IPv4:port or [IPv6]:port, got {self.store_host!r}: {exc}") from exc
        positive = {
            "segment_size_bytes": (self.segment_size_bytes, 4096, 1 << 40),
            "consume_queue_units_per_file": (self.consume_queue_units_per_file, 16, 1 << 26),
            "index_slot_count": (self.index_slot_count, 16, 1 << 28),
            "index_entry_capacity": (self.index_entry_capacity, 16, 1 << 30),
            "body_size_max_bytes": (self.body_size_max_bytes, 1, 64 * MIB),
            "flush_interval_ms": (self.flush_interval_ms, 1, 3_600_000),
            "page_cache_keep_bytes": (self.page_cache_keep_bytes, 0, 1 << 50),
        }
        for name, (value, low, high) in positive.items():
            if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
                raise ConfigError(f"{name} must be an integer in {low}..{high}, got {value!r}")
        if self.segment_size_bytes % 4096:
            raise ConfigError("segment_size_bytes must be a multiple of 4096")
        if self.body_size_max_bytes + RECORD_OVERHEAD_MAX_BYTES > self.segment_size_bytes:
            raise ConfigError(
                "segment_size_bytes must hold the largest record "
                f"(body_size_max_bytes + {RECORD_OVERHEAD_MAX_BYTES} bytes of head, topic and properties)"
            )
        if self.flush_policy not in ("async", "sync"):
            raise ConfigError(f"flush_policy must be 'async' or 'sync', got {self.flush_policy!r}")
        return self

    @property
    def store_host_bytes(self) -> bytes:
        """The store host as records carry it: 8 bytes (IPv4 + port) or 20 (IPv6 + port)."""
        return encode_address(self.store_host)

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> StoreConfig:
        """Build from a parsed TOML table: unknown keys and wrong types are errors."""
        names = {field.name for field in dataclasses.fields(cls)}
        unknown = sorted(set(values) - names)
        if unknown:
            raise ConfigError(f"unknown store settings: {', '.join(unknown)}")
        if "data_dir" not in values:
            raise ConfigError("data_dir is required")
        arguments = dict(values)
        arguments["data_dir"] = Path(str(arguments["data_dir"]))
        return cls(**arguments).validate()
