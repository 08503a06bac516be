"""Builders for the key-index damage tests: a store whose key index spans several files (records with one to
four keys, so that a record's entries straddle two files), where each entry of a key lies, and bytes gone bad
in an index file, written to it as the disk would return them."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from commitlog.key_index import ENTRY, HEADER_BYTES, SLOT, IndexFile, key_hash
from commitlog.key_index_files import KeyIndex
from commitlog.message import MessageInput
from tests.commitlog.helpers import message

TOPIC = "TopicTest"
#: messages stored: with small_config's 256 entries per file, 2 or 3 entries each fill three files
MESSAGES = 300
#: (kind of damage, what it does), each to one key's entry, its bucket's slot, or the link to it
DAMAGES = ("entry offset", "entry hash", "slot head", "next pointer")


def stored_message(number: int) -> MessageInput:
    """Message ``number`` as stored: its UNIQ_KEY and one KEY, every fourth two (so that two records' entries
    straddle files)."""
    keys = f"a-{number} b-{number}" if number % 4 == 0 else None
    return message(number, keys=keys)


def uniq_key(number: int) -> str:
    return f"C0A8000A9CB3{number:020X}"


@dataclass(frozen=True, slots=True)
class EntryAt:
    path: Path
    number: int
    #: where the entry's fields and its bucket's slot are in the file
    entry_at: int
    slot_at: int
    hash_value: int
    physical: int


def entry_of(index: KeyIndex, key: str, topic: str = TOPIC) -> EntryAt:
    """The newest entry of ``key``."""
    hashed = key_hash(topic, key)
    for index_file in reversed(index.files):
        for number in range(index_file.entry_count - 1, -1, -1):
            if index_file.entry(number)[0] == hashed:
                return _at(index, index_file, number)
    raise AssertionError(f"no entry of {key}")


def _at(index: KeyIndex, index_file: IndexFile, number: int) -> EntryAt:
    entry_hash, physical, _, _ = index_file.entry(number)
    return EntryAt(index_file.file.path, number, index_file.entries_base + number * ENTRY.size,
                   HEADER_BYTES + (entry_hash % index.slot_count) * SLOT.size, entry_hash, physical)


def linked_entry(index: KeyIndex, number: int) -> tuple[EntryAt, EntryAt]:
    """For message ``number``'s UNIQ_KEY: (its entry, the newer entry of its bucket in the same file that links
    to it); AssertionError when nothing newer shares its bucket."""
    ours = entry_of(index, uniq_key(number))
    index_file = next(f for f in index.files if f.file.path == ours.path)
    for later in range(ours.number + 1, index_file.entry_count):
        if index_file.entry(later)[3] == ours.number + 1:
            return ours, _at(index, index_file, later)
    raise AssertionError(f"nothing links to the entry of message {number}")


def write_at(path: Path, at: int, data: bytes) -> None:
    descriptor = os.open(path, os.O_RDWR)
    try:
        os.pwrite(descriptor, data, at)
    finally:
        os.close(descriptor)


def read_at(path: Path, at: int, size: int) -> bytes:
    descriptor = os.open(path, os.O_RDONLY)
    try:
        return os.pread(descriptor, size, at)
    finally:
        os.close(descriptor)


def damage(index: KeyIndex, number: int, kind: str) -> Path:
    """Damage the key index's lookup of message ``number``'s UNIQ_KEY (``kind`` of :data:`DAMAGES`); the file
    damaged. An entry offset is moved into the middle of a record (no record there), a hash's high byte
    flipped (its bucket stays the same: 64 slots), a slot emptied, a link cut."""
    if kind == "next pointer":
        _, newer = linked_entry(index, number)
        write_at(newer.path, newer.entry_at + 16, bytes(4))  # its previous: "first of its bucket"
        return newer.path
    ours = entry_of(index, uniq_key(number))
    if kind == "entry offset":
        write_at(ours.path, ours.entry_at + 4, (ours.physical + 40).to_bytes(8, "big"))
    elif kind == "entry hash":
        write_at(ours.path, ours.entry_at, bytes([read_at(ours.path, ours.entry_at, 1)[0] ^ 0x80]))
    elif kind == "slot head":
        write_at(ours.path, ours.slot_at, bytes(4))
    else:
        raise ValueError(kind)
    return ours.path


def with_newer_in_bucket(index: KeyIndex) -> int:
    """A message number whose UNIQ_KEY entry has a newer entry in its bucket and file (for "next pointer")."""
    for number in range(MESSAGES // 2, MESSAGES):
        try:
            linked_entry(index, number)
        except AssertionError:
            continue
        return number
    raise AssertionError("no entry with a newer one in its bucket")
