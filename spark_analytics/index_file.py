"""Read one key-index file without its configuration: pure functions over bytes, no Spark.

The file (commitlog/key_index.py) is a 64-byte header, ``slot_count`` 4-byte slots and ``entry_capacity``
20-byte entries; neither number is stored, only their sum is the file size. The slot count is inferred:
slots hold entry numbers (at most the entry count) and the entries after them start with a CRC32 key
hash, so the slot table ends where a word first exceeds the count, give or take the rare small hash;
each candidate that fits the file size is confirmed against the entries themselves (an entry's slot
chain must lead to it).
"""

from __future__ import annotations

from typing import Final, NamedTuple

from commitlog.key_index import (
    ENTRY,
    HEADER,
    HEADER_BYTES,
    INDEX_MAGIC,
    INDEX_VERSION,
    INDEX_VERSION_UNCHECKED,
    SLOT,
)

#: slot-count candidates tried below the first large word (each costs a check of a few entries)
SLOT_CANDIDATES_MAX: Final = 64
#: entries checked per candidate
ENTRIES_CHECKED: Final = 64


class IndexFileContents(NamedTuple):
    """The entries of one file as columns (entry ``i`` is element ``i`` of each list)."""

    begin_physical: int
    entry_count: int
    slot_count: int
    key_hashes: list[int]
    physical_offsets: list[int]
    timestamps_seconds: list[int]
    previous: list[int]
    #: whether a lookup reaches the entry: its slot's chain of previous entries passes through it
    reachable: list[bool]


class IndexFileError(ValueError):
    """The file is not a readable key-index file (bad header, no slot count fits)."""


def read_index_file(data: bytes) -> IndexFileContents:
    if len(data) < HEADER_BYTES:
        raise IndexFileError(f"{len(data)} bytes: shorter than the header")
    magic, version, _, begin_physical, _, begin_timestamp, _, count = HEADER.unpack_from(data, 0)
    if magic != INDEX_MAGIC or version not in (INDEX_VERSION, INDEX_VERSION_UNCHECKED):
        raise IndexFileError(f"bad magic {magic:#010x} or version {version}")
    slot_count = infer_slot_count(data, count)
    base = HEADER_BYTES + slot_count * SLOT.size
    if count == 0:
        return IndexFileContents(begin_physical, 0, slot_count, [], [], [], [], [])
    # columns straight from iter_unpack: a tuple per entry, never an object per entry
    key_hashes, physical_offsets, time_differences, previous = (
        list(column) for column in zip(*ENTRY.iter_unpack(data[base : base + count * ENTRY.size]), strict=True))
    reachable = [False] * count
    for (number,) in SLOT.iter_unpack(data[HEADER_BYTES:base]):
        while 0 < number <= count and not reachable[number - 1]:
            reachable[number - 1] = True
            before = previous[number - 1]
            if before >= number:  # chains only point backwards; anything else is damage
                break
            number = before
    begin_seconds = begin_timestamp // 1000
    timestamps = [begin_seconds + difference for difference in time_differences]
    return IndexFileContents(begin_physical, count, slot_count, key_hashes, physical_offsets, timestamps,
                             previous, reachable)


def infer_slot_count(data: bytes, count: int) -> int:
    """The slot count of an index file holding ``count`` entries (see the module docstring)."""
    if count == 0:
        return 0
    size = len(data)
    position = HEADER_BYTES
    while position + SLOT.size <= size and SLOT.unpack_from(data, position)[0] <= count:
        position += SLOT.size
    first_large = (position - HEADER_BYTES) // SLOT.size
    tried = 0
    for slot_count in range(first_large, 0, -1):
        entries_bytes = size - HEADER_BYTES - slot_count * SLOT.size
        if entries_bytes % ENTRY.size or entries_bytes // ENTRY.size < count:
            continue
        if _consistent(data, slot_count, count):
            return slot_count
        tried += 1
        if tried >= SLOT_CANDIDATES_MAX:
            break
    raise IndexFileError(f"no slot count fits {size} bytes and {count} entries")


def _consistent(data: bytes, slot_count: int, count: int) -> bool:
    """Every checked entry's slot holds an entry number at or after it, and chains point backwards."""
    base = HEADER_BYTES + slot_count * SLOT.size
    for number in range(min(count, ENTRIES_CHECKED)):
        key_hash, _, _, previous = ENTRY.unpack_from(data, base + number * ENTRY.size)
        (newest,) = SLOT.unpack_from(data, HEADER_BYTES + (key_hash % slot_count) * SLOT.size)
        if not number + 1 <= newest <= count or not 0 <= previous <= number:
            return False
    return True
