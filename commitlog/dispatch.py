"""What dispatch reads of a stored record besides its head: the TAGS, KEYS and UNIQ_KEY properties and the
key-index hashes made of them. Pure functions, shared by the store (apply's dispatch, recovery, the scrubber)
and the scrubber's record walk (:mod:`commitlog.scrub_walk`)."""

from __future__ import annotations

import re
from typing import Final

from commitlog.key_index import IndexEntry
from commitlog.message import TRANSACTION_ROLLBACK_TYPE, TRANSACTION_TYPE_MASK, StoredMessage, crc32

_DISPATCH_PROPERTY: Final = re.compile(rb"(?:^|\x02)(TAGS|KEYS|UNIQ_KEY)\x01([^\x02]*)")


def dispatch_fields(properties: bytes) -> tuple[bytes | None, bytes | None, bytes | None]:
    """(TAGS, KEYS, UNIQ_KEY) as raw bytes from encoded properties, in one C-level pass."""
    found = dict(_DISPATCH_PROPERTY.findall(properties))  # the last of a repeated name wins, as before
    return found.get(b"TAGS"), found.get(b"KEYS"), found.get(b"UNIQ_KEY")


def index_hashes(topic_prefix_crc: int, keys: bytes | None, uniq_key: bytes | None) -> list[int]:
    """Key-index hashes (CRC32 of ``topic#key``, continued from the topic prefix's CRC)."""
    hashes = []
    if uniq_key:
        hashes.append(crc32(uniq_key, topic_prefix_crc))
    if keys:
        hashes.extend(crc32(key, topic_prefix_crc) for key in keys.split(b" ") if key)
    return hashes


def topic_prefix_crc(topic: str) -> int:
    return crc32(f"{topic}#".encode())


def record_index_entries(message: StoredMessage) -> list[IndexEntry]:
    """The key-index entries dispatch makes of a stored record, in order (none for a rolled-back half)."""
    if message.sys_flag & TRANSACTION_TYPE_MASK == TRANSACTION_ROLLBACK_TYPE:
        return []
    _, keys, uniq_key = dispatch_fields(message.properties)
    return [(hash_value, message.physical_offset, message.store_timestamp)
            for hash_value in index_hashes(topic_prefix_crc(message.topic), keys, uniq_key)]
