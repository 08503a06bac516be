"""Lookups by key through the key index: a client's query by key, and apply's search for the message a send
is a retry of. Every candidate the index names is confirmed against the commit log; apply's lookups first
check the index files they read (:mod:`commitlog.index_upkeep`) and verify the records, so that an answer
that decides apply is the same on every replica."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import numpy as np
import numpy.typing as npt

from commitlog.dispatch import dispatch_fields, record_index_entries
from commitlog.errors import DamagedRecordError, StoreError
from commitlog.index_upkeep import index_trusted, settle_doubts, trust_index
from commitlog.key_index import IndexFile, key_hash
from commitlog.outcomes import AppendResult, AppendStatus
from commitlog.recent_keys import RecentKeys
from commitlog.record_codec import StoredMessage, crc32
from commitlog.retries import KeyCollision, retry_digest
from commitlog.state import StoreState
from protocol.invariant import fail
from protocol.properties import KEY_SEPARATOR, PROPERTY_KEYS, PROPERTY_UNIQ_KEY

#: rounds of checking (and rebuilding) key-index files a lookup that decides apply makes at most: each round
#: either finds the index whole or rebuilds a damaged file, so a few are plenty
INDEX_CHECK_ROUNDS_MAX: Final = 8


def query_by_key(
    state: StoreState, topic: str, key: str, max_count: int, begin_timestamp: int = 0, end_timestamp: int = 2**63 - 1,
    verified: bool = False,
) -> list[StoredMessage]:
    """Messages of ``topic`` whose KEYS contain ``key`` or whose UNIQ_KEY is ``key``, newest first.

    Every candidate the key index names is confirmed against the commit log (:func:`indexed_record`): an
    entry that does not name the record it was made for is passed over, and its file doubted.
    ``verified`` (apply's lookups): the key-index files read are checked first (:func:`trust_index`), the
    records' bodies CRC-checked, and a mismatch settled before anything is returned: a damaged file is
    rebuilt from the commit log and the lookup made again, a damaged record raises
    :class:`DamagedRecordError`. A damaged byte can turn a match into a miss or the reverse. Otherwise (a
    client's query) records are not CRC-checked and what does not match is skipped."""
    hashed = key_hash(topic, key)
    with state.lock:
        if not verified:
            found, doubts = _query_once(state, topic, key, hashed, max_count, begin_timestamp, end_timestamp,
                                               verified)
            for index_file, damaged in doubts:
                index_file.doubt(f"an entry of key {key!r} of {topic} names no record of it ({damaged})")
            return found
        for _ in range(INDEX_CHECK_ROUNDS_MAX):
            trust_index(state, begin_timestamp)
            found, doubts = _query_once(state, topic, key, hashed, max_count, begin_timestamp, end_timestamp,
                                               verified)
            if doubts:
                settle_doubts(state, doubts)
            elif index_trusted(state, begin_timestamp):
                return found
        fail(f"the key index kept failing its checks for key {key!r} of {topic}")


def _query_once(state: StoreState, topic: str, key: str, hashed: int, max_count: int, begin_timestamp: int,
                end_timestamp: int, verified: bool
                ) -> tuple[list[StoredMessage], list[tuple[IndexFile, DamagedRecordError]]]:
    """:func:`query_by_key` once: the messages found, and the entries that named no record of theirs."""
    found: list[StoredMessage] = []
    doubts: list[tuple[IndexFile, DamagedRecordError]] = []
    seen: set[int] = set()
    candidates = state.index.lookup_entries(hashed, max_count * 4 + 16, begin_timestamp, end_timestamp)
    for physical, second, source in candidates:
        if physical in seen or physical < state.commit_log.min_offset:
            continue  # (below: deleted by retention)
        seen.add(physical)
        record = indexed_record(state, physical, second, hashed, verified)
        if isinstance(record, DamagedRecordError):
            doubts.append((source, record))
            continue
        if record.topic != topic:
            continue
        properties = record.property_map
        keys = properties.get(PROPERTY_KEYS, "").split(KEY_SEPARATOR)
        if key in keys or properties.get(PROPERTY_UNIQ_KEY) == key:
            found.append(record)
            if len(found) >= max_count:
                break
    return found, doubts


def find_recent_sends(state: StoreState, sends: Sequence[tuple[str, bytes, int, bytes]],
                      since_timestamp: int) -> list[AppendResult | KeyCollision | None]:
    """:meth:`commitlog.store.MessageStore.find_recent_send` for each (topic, UNIQ_KEY, reconsume count,
    digest), under one lock
    (apply asks for every send of a command at once)."""
    with state.lock:
        recent = state.recent_keys if state.recent_keys.authoritative(since_timestamp) else None
        for _ in range(INDEX_CHECK_ROUNDS_MAX):
            trust_index(state, since_timestamp)
            found, doubts = _find_once(state, sends, since_timestamp, recent)
            if doubts:
                settle_doubts(state, doubts)
            elif index_trusted(state, since_timestamp):
                return found
        fail("the key index kept failing its checks for the sends of a command")


def _find_once(state: StoreState, sends: Sequence[tuple[str, bytes, int, bytes]], since_timestamp: int,
               recent: RecentKeys | None
               ) -> tuple[list[AppendResult | KeyCollision | None], list[tuple[IndexFile, DamagedRecordError]]]:
    """:func:`find_recent_sends` once: the answers, and the entries that named no record of theirs."""
    found: list[AppendResult | KeyCollision | None] = []
    doubts: list[tuple[IndexFile, DamagedRecordError]] = []
    lookup = state.index.lookup_entries
    min_offset = state.commit_log.min_offset
    for topic, uniq_key, reconsume_times, digest in sends:
        found.append(None)
        if not uniq_key.isascii():
            try:
                uniq_key.decode()
            except UnicodeDecodeError:
                continue
        topic_entry = state.topic_entry(topic)
        if isinstance(topic_entry, str):
            continue
        # the index hashes ``topic#key``: continued from the topic prefix's CRC, as append does
        hashed = crc32(uniq_key, topic_entry[1])
        if recent is not None and not recent.maybe(hashed):
            continue  # not stored since since_timestamp: the lookup would find nothing
        for physical, second, source in lookup(hashed, 8, since_timestamp):
            if physical < min_offset:
                continue  # deleted by retention
            message = indexed_record(state, physical, second, hashed, verified=True)
            if isinstance(message, DamagedRecordError):
                doubts.append((source, message))
                continue
            if (message.topic == topic and message.reconsume_times == reconsume_times
                    and message.store_timestamp >= since_timestamp
                    and dispatch_fields(message.properties)[2] == uniq_key):
                if retry_digest(message.flag, message.body, message.properties) != digest:
                    found[-1] = KeyCollision(physical)  # unless an older match is the retried one
                    continue
                found[-1] = AppendResult(AppendStatus.OK, physical, message.queue_offset,
                                         message.total_size, message.store_host)
                break
    return found, doubts


def indexed_record(state: StoreState, physical: int, second: int, hashed: int, verified: bool) -> StoredMessage | DamagedRecordError:
    """The record a key-index entry names, if it is the record the entry was made for: inside the commit
    log, a message record that names its own offset (``verified``: its body CRC-checked too, as
    :func:`verified_message`), stored in the entry's second, carrying a key of the entry's hash. Otherwise
    the mismatch, as a :class:`DamagedRecordError` of that offset: the entry or the record went bad.
    Store lock held."""
    if physical >= state.commit_log.end_offset:
        return DamagedRecordError(physical, "a key-index entry names it, past the commit log's end")
    try:
        message = (verified_message(state, physical) if verified
                   else state.commit_log.read_message(physical, check_crc=False))
    except DamagedRecordError as exc:
        return exc
    except StoreError as exc:
        return DamagedRecordError(physical, str(exc))
    if message.physical_offset != physical:
        return DamagedRecordError(physical, f"it names commit-log offset {message.physical_offset}")
    if message.store_timestamp // 1000 != second or all(
            hash_value != hashed for hash_value, _, _ in record_index_entries(message)):
        return DamagedRecordError(physical, "it is not the record the key-index entry naming it was made for "
                                            "(another key or store second)")
    return message


def verified_message(state: StoreState, physical_offset: int) -> StoredMessage:
    """The record at ``physical_offset`` (inside the commit log, named by the key index), checked as the
    scrubber checks records: a message record whose layout holds together, whose body matches its CRC and
    which names this very offset. :class:`DamagedRecordError` otherwise. (The body CRC is the only
    checksum RocketMQ's layout has: the head, topic and properties are checked for consistency only.)
    Called with the store lock held."""
    try:
        message = state.commit_log.read_message(physical_offset, check_crc=True)
    except StoreError as exc:  # CorruptionError (not a valid record), or no message record head there
        raise DamagedRecordError(physical_offset, str(exc)) from exc
    if message.physical_offset != physical_offset:
        raise DamagedRecordError(physical_offset, f"it names commit-log offset {message.physical_offset}")
    return message


def recently_stored(state: StoreState, hashes: dict[int, int], since_timestamp: int) -> list[int]:
    """Of ``hashes`` (any name -> key-index hash), the names whose hash may have been indexed at or
    after ``since_timestamp``: those worth a lookup (:mod:`commitlog.recent_keys`). All of them when
    the filter cannot answer for that time."""
    with state.lock:
        if not state.recent_keys.authoritative(since_timestamp):
            return list(hashes)
        return state.recent_keys.maybe_many(hashes)


def recently_stored_mask(state: StoreState, hashes: npt.NDArray[np.uint32], since_timestamp: int) -> npt.NDArray[np.bool_]:
    """:func:`recently_stored` for many hashes: for each, whether it is worth a lookup."""
    with state.lock:
        if not state.recent_keys.authoritative(since_timestamp):
            return np.ones(len(hashes), dtype=np.bool_)
        return state.recent_keys.maybe_mask(hashes)
