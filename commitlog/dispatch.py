"""Dispatch: what the files derived from the commit log (the consume queues and the key index) take of a
stored record. One rule: a prepared or rolled-back transaction half goes to no consume queue (RocketMQ), and
a rolled-back one to no key index either. The pure functions here are shared by apply's dispatch, recovery,
catch-up, the scrubber and the scrubber's record walk (:mod:`commitlog.scrub_walk`);
:func:`dispatch_records` puts scanned records into a store's derived files."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import TYPE_CHECKING, Final

from commitlog.consume_queue import CQ_UNIT, Unit
from commitlog.key_index import IndexColumns, IndexEntry
from commitlog.record_codec import StoredMessage, crc32
from commitlog.sys_flags import TRANSACTION_PREPARED_TYPE, TRANSACTION_ROLLBACK_TYPE, TRANSACTION_TYPE_MASK

if TYPE_CHECKING:
    from commitlog.consume_queue import ConsumeQueue
    from commitlog.state import StoreState

#: the (name, value) pairs of the properties dispatch reads (TAGS, KEYS, UNIQ_KEY), for ``findall``
DISPATCH_PROPERTY: Final = re.compile(rb"(?:^|\x02)(TAGS|KEYS|UNIQ_KEY)\x01([^\x02]*)")


#: the transaction types (``sys_flag & TRANSACTION_TYPE_MASK``) of records that take no consume-queue unit
#: (and no queue offset), and of those that take no key-index entries
NOT_QUEUED: Final = frozenset((TRANSACTION_PREPARED_TYPE, TRANSACTION_ROLLBACK_TYPE))
NOT_INDEXED: Final = frozenset((TRANSACTION_ROLLBACK_TYPE,))


def to_consume_queue(sys_flag: int) -> bool:
    """Whether a record with ``sys_flag`` takes a consume-queue unit (and a queue offset)."""
    return sys_flag & TRANSACTION_TYPE_MASK not in NOT_QUEUED


def to_key_index(sys_flag: int) -> bool:
    """Whether a record with ``sys_flag`` takes key-index entries."""
    return sys_flag & TRANSACTION_TYPE_MASK not in NOT_INDEXED


def dispatch_fields(properties: bytes) -> tuple[bytes | None, bytes | None, bytes | None]:
    """(TAGS, KEYS, UNIQ_KEY) as raw bytes from encoded properties, in one C-level pass."""
    found = dict(DISPATCH_PROPERTY.findall(properties))  # the last of a repeated name wins, as before
    return found.get(b"TAGS"), found.get(b"KEYS"), found.get(b"UNIQ_KEY")


def index_hashes(topic_prefix_crc: int, keys: bytes | None, uniq_key: bytes | None) -> list[int]:
    """Key-index hashes (CRC32 of ``topic#key``, continued from the topic prefix's CRC)."""
    hashes = [crc32(uniq_key, topic_prefix_crc)] if uniq_key else []
    if keys:
        for key in keys.split(b" "):  # (a loop, not a comprehension: apply's hot path calls this per message)
            if key:
                hashes.append(crc32(key, topic_prefix_crc))
    return hashes


def topic_prefix_crc(topic: str) -> int:
    return crc32(f"{topic}#".encode())


def record_index_entries(message: StoredMessage) -> list[IndexEntry]:
    """The key-index entries dispatch makes of a stored record, in order (none for a rolled-back half)."""
    if not to_key_index(message.sys_flag):
        return []
    _, keys, uniq_key = dispatch_fields(message.properties)
    return [(hash_value, message.physical_offset, message.store_timestamp)
            for hash_value in index_hashes(topic_prefix_crc(message.topic), keys, uniq_key)]


def dispatch_records(state: StoreState, messages: Iterable[StoredMessage], queue_from: int = 0,
                     index_from: int = 0) -> tuple[list[IndexEntry], set[ConsumeQueue]]:
    """Dispatch records read back from the commit log (recovery's tail, a peer's copied bytes): each one's
    consume-queue unit, from commit-log offset ``queue_from`` on, is put in place. Returns the key-index
    entries of the records from ``index_from`` on, in order (the caller inserts them), and the queues
    written. Store lock held."""
    pending_index: list[IndexEntry] = []
    written: set[ConsumeQueue] = set()
    for message in messages:
        offset = message.physical_offset
        tags, keys, uniq_key = dispatch_fields(message.properties)
        if offset >= queue_from and to_consume_queue(message.sys_flag):
            queue = state.queue(message.topic, message.queue_id)
            queue.ensure_capacity(message.queue_offset)
            queue.put(message.queue_offset, offset, message.total_size, state.tag_code(tags))
            written.add(queue)
        if offset >= index_from and to_key_index(message.sys_flag):
            prefix = topic_prefix_crc(message.topic)
            pending_index.extend((h, offset, message.store_timestamp) for h in index_hashes(prefix, keys, uniq_key))
    return pending_index, written


#: an append's units by queue: (topic, queue id) -> (its first queue offset in this append, its units in order)
QueueRuns = dict[tuple[str, int], tuple[int, list[Unit]]]
#: (queue, its first offset in this append, the append's units of it packed back to back)
PackedRun = tuple[tuple[str, int], int, bytes]


def packed_runs(runs: QueueRuns) -> list[PackedRun]:
    """Each queue's (first offset, units) of an append, its units packed as :data:`CQ_UNIT`."""
    return [(queue_key, first_offset, b"".join([CQ_UNIT.pack(*unit) for unit in units]))
            for queue_key, (first_offset, units) in runs.items()]


def dispatch_runs(state: StoreState, runs: list[PackedRun], index_entries: IndexColumns | list[IndexEntry]) -> None:
    """Dispatch an append's records, written already: each queue's run of units, then the key-index entries
    (into the index and the recent-keys filter). Store lock held."""
    for queue_key, first_offset, packed in runs:
        queue = state.queues[queue_key]
        queue.put_packed(first_offset, packed)
        state.dirty_queues.add(queue)
    state.index.insert_many(index_entries)
    state.recent_keys.add(index_entries)
