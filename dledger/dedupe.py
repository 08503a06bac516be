"""Retried sends (UNIQ_KEY dedupe), one rule for every form of a command: which sends of a command apply must
not store again, because they are a client's retry of a message stored lately or of an earlier send of the
same command.

A send is a retry when its topic, UNIQ_KEY, reconsume count and content (``commitlog.retries.retry_digest``)
are those of a message stored within the dedupe window (``dledger.apply.UNIQ_KEY_WINDOW_MS``) or of an
earlier send of the command; one whose key matches but whose content does not is a key collision, stored as
a new message. :func:`find_retries` is that rule; a reader per form of a command gives it the sends
(:func:`message_sends` for messages, :func:`record_sends` for records laid out by the leader, which carry
the key-index hashes of their keys so that a key is read from a record only when hashes cannot decide). It
reads the store only through what it is given: every replica decides alike.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np

from commitlog.message import MessageInput
from commitlog.outcomes import AppendResult
from commitlog.record_codec import decode_record
from commitlog.records import (
    HAS_UNIQ_KEY,
    HASH_DTYPE,
    PreparedRecords,
    columnwise,
    hash_list,
    layout_of,
    meta_list,
    uniq_key_of,
)
from commitlog.retries import KeyCollision, retry_digest
from commitlog.store import MessageStore
from protocol.properties import find_uniq_key

#: (topic, UNIQ_KEY, reconsume count, content digest): a send as the store looks it up
Lookup = tuple[str, bytes, int, bytes]
#: ``find_recent_sends(lookups, since_timestamp)``: for each, the stored message's result, a key collision, or None
FindRecentSends = Callable[[list[Lookup], int], Sequence[AppendResult | KeyCollision | None]]


class KeyedSends(NamedTuple):
    """The sends of one command that carry a UNIQ_KEY, in order, as :func:`find_retries` reads them:
    one reader per form of a command (:func:`message_sends`, :func:`record_sends`), one rule."""

    #: topic names, by the indexes in ``topic_indexes``
    topics: Sequence[str]
    #: each keyed send's position in the command, and its topic index, UNIQ_KEY (or the key-index hash of it:
    #: records carry the hashes, and a record's key is read only when hashes cannot decide) and reconsume count
    positions: list[int]
    topic_indexes: list[int]
    keys: Sequence[bytes | int]
    reconsume_times: list[int]
    #: the UNIQ_KEY and the content digest (commitlog.retries) of the send at a position
    uniq_key: Callable[[int], bytes]
    digest: Callable[[int], bytes]
    #: of the given keyed sends (indexes into the lists above, in order; None for all of them), those the store
    #: may hold a message of, in order: the ones worth a look-up
    worth_lookup: Callable[[list[int] | None], list[int]]


def message_sends(messages: Sequence[MessageInput]) -> KeyedSends:
    """A Messages command's keyed sends, their UNIQ_KEYs read from their properties. Every one is looked up:
    the store filters them by its recent keys itself (``MessageStore.find_recent_sends``)."""
    topics: dict[str, int] = {}
    positions: list[int] = []
    topic_indexes: list[int] = []
    keys: list[bytes] = []
    reconsume_times: list[int] = []
    for position, message in enumerate(messages):
        key = find_uniq_key(message.properties)
        if key is not None:
            positions.append(position)
            topic_indexes.append(topics.setdefault(message.topic, len(topics)))
            keys.append(key)
            reconsume_times.append(message.reconsume_times)

    def digest(position: int) -> bytes:
        message = messages[position]
        return retry_digest(message.flag, message.body, message.properties)

    def worth_lookup(indexes: list[int] | None) -> list[int]:
        return list(range(len(positions))) if indexes is None else indexes

    return KeyedSends(list(topics), positions, topic_indexes, keys, reconsume_times,
                      dict(zip(positions, keys, strict=True)).__getitem__, digest, worth_lookup)


def record_sends(batch: PreparedRecords, store: MessageStore, since_timestamp: int) -> KeyedSends:
    """A Records operation's keyed sends, by the UNIQ_KEY hashes its records carry; those the store's recent
    keys rule out are not looked up. Column-wise for a large batch (:func:`commitlog.records.columnwise`),
    record by record for a small one."""
    if columnwise(batch.record_count):
        layout = layout_of(batch)
        metas = layout.metas
        (keyed,) = (metas["flags"] & HAS_UNIQ_KEY).nonzero()
        hashes = np.frombuffer(batch.key_hashes, HASH_DTYPE)[layout.key_starts[keyed]]

        def start_of(position: int) -> int:
            return int(layout.starts[position])

        def flags_of(position: int) -> int:
            return int(metas["flags"][position])

        def worth_lookup(indexes: list[int] | None) -> list[int]:
            looked_up: list[int]
            if indexes is None:
                looked_up = np.flatnonzero(store.recently_stored_mask(hashes, since_timestamp)).tolist()
            else:
                chosen = np.array(indexes, dtype=np.int64)
                looked_up = chosen[store.recently_stored_mask(hashes[chosen], since_timestamp)].tolist()
            return looked_up

        return KeyedSends(batch.topics, keyed.tolist(), metas["topic"][keyed].tolist(), hashes.tolist(),
                          metas["reconsume"][keyed].tolist(), functools.partial(_record_uniq_key, batch, start_of,
                                                                                flags_of),
                          functools.partial(_record_retry_digest, batch, start_of), worth_lookup)
    key_hashes = hash_list(batch)
    meta_tuples = meta_list(batch)
    positions: list[int] = []
    topic_indexes: list[int] = []
    keys: list[int] = []
    reconsume_times: list[int] = []
    key_position = 0
    for position, (_, topic_index, flags, _, _, reconsume, key_count) in enumerate(meta_tuples):
        if flags & HAS_UNIQ_KEY:
            positions.append(position)
            topic_indexes.append(topic_index)
            keys.append(key_hashes[key_position])
            reconsume_times.append(reconsume)
        key_position += key_count
    starts: list[int] = []

    def record_start(position: int) -> int:
        if not starts:
            starts.extend(itertools.accumulate((meta[0] for meta in meta_tuples), initial=0))
        return starts[position]

    def record_flags(position: int) -> int:
        return meta_tuples[position][2]

    def recently_stored(indexes: list[int] | None) -> list[int]:
        chosen = range(len(positions)) if indexes is None else indexes
        return sorted(store.recently_stored({index: keys[index] for index in chosen}, since_timestamp))

    return KeyedSends(batch.topics, positions, topic_indexes, keys, reconsume_times,
                      functools.partial(_record_uniq_key, batch, record_start, record_flags),
                      functools.partial(_record_retry_digest, batch, record_start), recently_stored)


def _record_uniq_key(batch: PreparedRecords, start_of: Callable[[int], int], flags_of: Callable[[int], int],
                     position: int) -> bytes:
    return uniq_key_of(batch, start_of(position), flags_of(position)) or b""


def _record_retry_digest(batch: PreparedRecords, start_of: Callable[[int], int], position: int) -> bytes:
    return _record_digest(batch, start_of(position))


def _record_digest(batch: PreparedRecords, start: int) -> bytes:
    """The :func:`retry_digest` of the record at ``start`` of a batch."""
    record = decode_record(batch.records, start, check_crc=False)
    return retry_digest(record.flag, record.body, record.properties)


def find_retries(sends: KeyedSends, since_timestamp: int, find_recent_sends: FindRecentSends
                 ) -> tuple[dict[int, AppendResult | int], list[tuple[str, bytes]]]:
    """The retried sends of a command, each mapped to the stored message's result or to the position of the
    earlier send of the command it repeats; and the key collisions stored as new messages, (topic, UNIQ_KEY)
    each. ``find_recent_sends`` looks sends up among the messages stored since ``since_timestamp``
    (``MessageStore.find_recent_sends``)."""
    keys = sends.keys
    if not keys:
        return {}, []
    duplicates: dict[int, AppendResult | int] = {}
    collided: dict[int, tuple[str, bytes]] = {}
    looked_up: list[int] | None = None  # of the keyed sends, those sent first (None: all of them)
    if len(set(keys)) < len(keys):  # equal keys (or hashes): maybe a send repeated in this command
        positions = sends.positions
        first: dict[tuple[int, bytes | int, int], int] = {}  # identity -> position of its first send
        again: list[tuple[int, tuple[int, bytes | int, int]]] = []
        for position, identity in zip(positions, zip(sends.topic_indexes, keys, sends.reconsume_times, strict=True),
                                      strict=True):
            if first.setdefault(identity, position) != position:
                again.append((position, identity))
        if again:
            _repeated_sends(sends, first, again, duplicates, collided)
            looked_up = [index for index, position in enumerate(positions) if position not in duplicates]
    candidates = sends.worth_lookup(looked_up)
    if candidates:
        positions = [sends.positions[index] for index in candidates]
        lookups = [(sends.topics[sends.topic_indexes[index]], sends.uniq_key(position), sends.reconsume_times[index],
                    sends.digest(position)) for index, position in zip(candidates, positions, strict=True)]
        found = find_recent_sends(lookups, since_timestamp)
        for position, lookup, stored in zip(positions, lookups, found, strict=True):
            if isinstance(stored, KeyCollision):
                collided[position] = (lookup[0], lookup[1])
            elif stored is not None:
                duplicates[position] = stored
    return duplicates, [collision for position, collision in collided.items() if position not in duplicates]


def _repeated_sends(sends: KeyedSends, first: dict[tuple[int, bytes | int, int], int],
                    again: list[tuple[int, tuple[int, bytes | int, int]]],
                    duplicates: dict[int, AppendResult | int], collided: dict[int, tuple[str, bytes]]) -> None:
    """Of the sends in ``again``, whose (topic, key or hash, reconsume count) an earlier send of the command
    has (``first``: identity -> its first position): those whose UNIQ_KEY and content are an earlier one's
    too go into ``duplicates`` (position -> that earlier position); the others (a CRC collision of distinct
    keys, or a key collision of distinct contents) are first sends after all; of those, a key collision goes
    into ``collided`` (position -> topic, UNIQ_KEY)."""
    uniq_key, digest = sends.uniq_key, sends.digest
    exact: dict[tuple[int, bytes, int, bytes], int] = {}
    digests: dict[tuple[int, bytes, int], set[bytes]] = {}  # (topic, UNIQ_KEY, reconsume count) -> contents
    for position, identity in again:
        earlier = first[identity]
        key, content = (identity[0], uniq_key(earlier), identity[2]), digest(earlier)
        exact.setdefault((*key, content), earlier)
        digests.setdefault(key, set()).add(content)
        key, content = (identity[0], uniq_key(position), identity[2]), digest(position)
        found = exact.setdefault((*key, content), position)
        if found != position:
            duplicates[position] = found
        else:
            contents = digests.setdefault(key, set())
            if contents:
                collided[position] = (sends.topics[key[0]], key[1])
            contents.add(content)
