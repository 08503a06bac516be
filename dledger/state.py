"""Replicated state that is not in the commit log: consumer offsets, topic configuration, subscription
groups, the last leader stamp, the group's byte configuration, pop consumption (``dledger.pop``: per queue
a cursor and the in-flight table). Derived only from applied commands, identical on every replica.

It is persisted as the store checkpoint's extension (atomically with the store's positions) and inside
Raft snapshots, each time with :attr:`ReplicatedState.applied_index`, the Raft index it reflects.

Snapshot layout: ``magic u32 | version u16 | applied_index i64 | last_store_timestamp i64 | sections |
crc u32`` where each section is
a count followed by its entries (strings as u16 length + UTF-8).
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass, field
from typing import Final

from dledger.command import ByteConfig, ConsumerOffset, LeaderStamp, SubscriptionGroup, TopicConfig
from dledger.pop import PopEntry, PopKey, PopQueue, forget

STATE_MAGIC: Final = 0x524D5354  # "RMST"
#: 2 added the timer progress section, 3 the transaction sections, 4 the ACL document, 5 the byte configuration,
#: 6 the pop consumption section and the groups' consume_orderly flag
STATE_VERSION: Final = 6
#: the timer-progress key of the transaction half queue: every half below it is resolved
TRANSACTION_PROGRESS_KEY: Final = "transaction"
#: resolved halves below the progress whose resolution is still remembered
RESOLVED_KEPT: Final = 10_000
HEAD = struct.Struct(">IHqq")
COUNT = struct.Struct(">I")
CRC = struct.Struct(">I")
OFFSET_ENTRY = struct.Struct(">iq")
TOPIC_ENTRY = struct.Struct(">iiiiB")
GROUP_ENTRY = struct.Struct(">BBiq")
STAMP = struct.Struct(">qq")
I64 = struct.Struct(">q")
U8 = struct.Struct(">B")
HALF_ENTRY = struct.Struct(">qi")
POP_QUEUE_HEAD = struct.Struct(">iqI")  # queue id, cursor, entry count
POP_ENTRY = struct.Struct(">qqiq")  # offset, invisible_until, attempt, handle_id


class StateError(ValueError):
    """Snapshot bytes that are damaged or of an unknown version."""


@dataclass
class ReplicatedState:
    applied_index: int = 0
    #: (group, topic, queue id) -> committed consume offset
    consumer_offsets: dict[tuple[str, str, int], int] = field(default_factory=dict)
    topics: dict[str, TopicConfig] = field(default_factory=dict)
    groups: dict[str, SubscriptionGroup] = field(default_factory=dict)
    leader_stamp: LeaderStamp | None = None
    #: the highest store timestamp applied: a new leader never stamps below it
    last_store_timestamp: int = 0
    #: delay / timer delivery progress: timer key (e.g. "level:3") -> next queue offset to deliver
    timer_progress: dict[str, int] = field(default_factory=dict)
    #: half queue offset -> how it was resolved (TransactionAction), for halves at or past the progress
    transactions_resolved: dict[int, int] = field(default_factory=dict)
    #: half queue offset -> check-backs so far, for unresolved halves
    transaction_checks: dict[int, int] = field(default_factory=dict)
    #: the access-control rules every member enforces (broker.acl's canonical document; empty: none)
    acl_document: bytes = b""
    #: the settings that shape stored bytes, as the group fixed them (the first BYTE_CONFIG applied); None
    #: until then (a new group, or a data directory from before the setting existed)
    byte_config: ByteConfig | None = None
    #: pop consumption (dledger.pop): (group, topic, queue id) -> cursor and in-flight table
    pop_queues: dict[PopKey, PopQueue] = field(default_factory=dict)

    # ------------------------------------------------------------------ apply (deterministic)

    def apply_offsets(self, offsets: tuple[ConsumerOffset, ...]) -> None:
        for entry in offsets:
            self.consumer_offsets[(entry.group, entry.topic, entry.queue_id)] = entry.offset

    def apply_topic(self, config: TopicConfig) -> None:
        if config.deleted:
            self.topics.pop(config.topic, None)
            for key in [k for k in self.consumer_offsets if k[1] == config.topic]:
                del self.consumer_offsets[key]
            forget(self.pop_queues, topic=config.topic)
        else:
            self.topics[config.topic] = config

    def apply_group(self, group: SubscriptionGroup) -> None:
        if group.deleted:
            self.groups.pop(group.group, None)
            forget(self.pop_queues, group=group.group)
        else:
            self.groups[group.group] = group

    def apply_timer_progress(self, key: str, delivered_up_to: int) -> None:
        self.timer_progress[key] = max(self.timer_progress.get(key, 0), delivered_up_to)
        if key == TRANSACTION_PROGRESS_KEY:
            progress = self.timer_progress[key]
            for half in [half for half in self.transaction_checks if half < progress]:
                del self.transaction_checks[half]
            # how recent halves were resolved is kept a while, to answer a repeated END_TRANSACTION
            for half in [half for half in self.transactions_resolved if half < progress - RESOLVED_KEPT]:
                del self.transactions_resolved[half]

    @property
    def transaction_progress(self) -> int:
        return self.timer_progress.get(TRANSACTION_PROGRESS_KEY, 0)

    def transaction_pending(self, half: int, half_queue_end: int) -> bool:
        """Whether the half message at queue offset ``half`` exists and is not resolved yet."""
        return (self.transaction_progress <= half < half_queue_end
                and half not in self.transactions_resolved)

    def apply_byte_config(self, config: ByteConfig) -> bool:
        """The first configuration applied is the group's for good (a later one, proposed by a leader that
        had not applied the first yet, changes nothing): whether ``config`` became the group's."""
        if self.byte_config is not None:
            return False
        self.byte_config = config
        return True

    def resolve_transaction(self, half: int, action: int) -> None:
        self.transactions_resolved[half] = action
        self.transaction_checks.pop(half, None)

    def count_transaction_check(self, half: int) -> None:
        if half >= self.transaction_progress and half not in self.transactions_resolved:
            self.transaction_checks[half] = self.transaction_checks.get(half, 0) + 1

    # ------------------------------------------------------------------ queries

    def consumer_offset(self, group: str, topic: str, queue_id: int) -> int | None:
        return self.consumer_offsets.get((group, topic, queue_id))

    # ------------------------------------------------------------------ snapshot

    def encode(self) -> bytes:
        parts = [HEAD.pack(STATE_MAGIC, STATE_VERSION, self.applied_index, self.last_store_timestamp)]
        parts.append(COUNT.pack(len(self.consumer_offsets)))
        for (group, topic, queue_id), offset in sorted(self.consumer_offsets.items()):
            parts += (_string(group), _string(topic), OFFSET_ENTRY.pack(queue_id, offset))
        parts.append(COUNT.pack(len(self.topics)))
        for name, config in sorted(self.topics.items()):
            parts += (_string(name), TOPIC_ENTRY.pack(config.read_queue_nums, config.write_queue_nums, config.perm,
                                                     config.topic_sys_flag, config.order))
        parts.append(COUNT.pack(len(self.groups)))
        for name, subscription in sorted(self.groups.items()):
            parts += (_string(name), GROUP_ENTRY.pack(subscription.consume_enable,
                                                     subscription.consume_broadcast_enable,
                                                     subscription.retry_max_times, subscription.broker_id),
                      U8.pack(subscription.consume_orderly))
        if self.leader_stamp is None:
            parts.append(COUNT.pack(0))
        else:
            parts += (COUNT.pack(1), STAMP.pack(self.leader_stamp.term, self.leader_stamp.timestamp),
                      _string(self.leader_stamp.node))
        parts.append(COUNT.pack(len(self.timer_progress)))
        for key, offset in sorted(self.timer_progress.items()):
            parts += (_string(key), I64.pack(offset))
        for table in (self.transactions_resolved, self.transaction_checks):
            parts.append(COUNT.pack(len(table)))
            parts += [HALF_ENTRY.pack(half, value) for half, value in sorted(table.items())]
        parts += (COUNT.pack(len(self.acl_document)), self.acl_document)
        settings = self.byte_config.settings if self.byte_config is not None else ()
        parts.append(COUNT.pack(len(settings)))  # none is no settings: a configuration always has some
        for name, value in settings:
            parts += (_string(name), _string(value))
        parts.append(COUNT.pack(len(self.pop_queues)))
        for (group, topic, queue_id), queue in sorted(self.pop_queues.items()):
            parts += (_string(group), _string(topic), POP_QUEUE_HEAD.pack(queue_id, queue.cursor, len(queue.in_flight)))
            parts += [POP_ENTRY.pack(offset, entry.invisible_until, entry.attempt, entry.handle_id)
                      for offset, entry in sorted(queue.in_flight.items())]
        body = b"".join(parts)
        return body + CRC.pack(zlib.crc32(body))

    @classmethod
    def decode(cls, data: bytes) -> ReplicatedState:
        if len(data) < HEAD.size + CRC.size:
            raise StateError("state snapshot too short")
        body, (crc,) = data[:-4], CRC.unpack_from(data, len(data) - 4)
        if zlib.crc32(body) != crc:
            raise StateError("state snapshot CRC mismatch")
        magic, version, applied, last_store_timestamp = HEAD.unpack_from(body)
        if magic != STATE_MAGIC or version not in (1, 2, 3, 4, 5, STATE_VERSION):
            raise StateError(f"unknown state snapshot (magic {magic:#x}, version {version})")
        reader = _Reader(body, HEAD.size)
        state = cls(applied_index=applied, last_store_timestamp=last_store_timestamp)
        try:
            for _ in range(reader.count()):
                group, topic = reader.string(), reader.string()
                queue_id, offset = reader.unpack(OFFSET_ENTRY)
                state.consumer_offsets[(group, topic, queue_id)] = offset
            for _ in range(reader.count()):
                name = reader.string()
                read, write, perm, sys_flag, order = reader.unpack(TOPIC_ENTRY)
                state.topics[name] = TopicConfig(name, read, write, perm, sys_flag, bool(order))
            for _ in range(reader.count()):
                name = reader.string()
                enable, broadcast, retry, broker_id = reader.unpack(GROUP_ENTRY)
                orderly = reader.unpack(U8)[0] if version >= 6 else 0
                state.groups[name] = SubscriptionGroup(name, bool(enable), bool(broadcast), retry, broker_id,
                                                       consume_orderly=bool(orderly))
            if reader.count():
                term, timestamp = reader.unpack(STAMP)
                state.leader_stamp = LeaderStamp(term, reader.string(), timestamp)
            if version >= 2:
                for _ in range(reader.count()):
                    key = reader.string()
                    (offset,) = reader.unpack(I64)
                    state.timer_progress[key] = offset
            if version >= 3:
                for table in (state.transactions_resolved, state.transaction_checks):
                    for _ in range(reader.count()):
                        half, value = reader.unpack(HALF_ENTRY)
                        table[half] = value
            if version >= 4:
                state.acl_document = reader.blob()
            if version >= 5:
                settings = tuple((reader.string(), reader.string()) for _ in range(reader.count()))
                state.byte_config = ByteConfig(settings) if settings else None
            if version >= 6:
                for _ in range(reader.count()):
                    group, topic = reader.string(), reader.string()
                    queue_id, cursor, entries = reader.unpack(POP_QUEUE_HEAD)
                    if entries > len(body):
                        raise StateError(f"entry count {entries} exceeds the snapshot")
                    queue = state.pop_queues[(group, topic, queue_id)] = PopQueue(cursor)
                    for _ in range(entries):
                        offset, invisible_until, attempt, handle_id = reader.unpack(POP_ENTRY)
                        queue.in_flight[offset] = PopEntry(invisible_until, attempt, handle_id)
        except (struct.error, IndexError, UnicodeDecodeError) as exc:
            raise StateError(f"state snapshot is malformed: {exc}") from exc
        if reader.position != len(body):
            raise StateError("state snapshot has trailing bytes")
        return state


def _string(value: str) -> bytes:
    encoded = value.encode()
    return struct.pack(">H", len(encoded)) + encoded


class _Reader:
    def __init__(self, data: bytes, position: int) -> None:
        self.data = data
        self.position = position

    def unpack(self, layout: struct.Struct) -> tuple[int, ...]:
        values: tuple[int, ...] = layout.unpack_from(self.data, self.position)
        self.position += layout.size
        return values

    def count(self) -> int:
        (value,) = self.unpack(COUNT)
        if value > len(self.data):
            raise StateError(f"count {value} exceeds the snapshot")
        return value

    def blob(self) -> bytes:
        length = self.count()
        start = self.position
        self.position = start + length
        if self.position > len(self.data):
            raise StateError("bytes run past the snapshot")
        return bytes(self.data[start : self.position])

    def string(self) -> str:
        (length,) = struct.unpack_from(">H", self.data, self.position)
        start = self.position + 2
        self.position = start + length
        if self.position > len(self.data):
            raise StateError("string runs past the snapshot")
        return self.data[start : self.position].decode()
