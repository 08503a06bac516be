"""The key index: on-disk hash index by ``topic#key`` (KEYS and UNIQ_KEY), like RocketMQ's IndexFile.

Each file: a 64-byte header, ``slot_count`` 4-byte slots, ``entry_capacity`` 20-byte entries::

    header: magic u32 | version u16 | pad u16 | begin_physical i64 | end_physical i64 |
            begin_timestamp i64 | end_timestamp i64 | entry_count u32 | checksum u32 | zeros
    slot:   entry number + 1 of the newest entry in the bucket (0 = empty)
    entry:  key_hash u32 | physical_offset i64 | time_difference_s i32 | previous entry number + 1 u32

Memory stays bounded: everything is in mapped files; a full file is followed by a new one named by the
physical offset of its first entry. Lookups return candidate offsets; callers confirm each against the
record itself (hashes collide, and bytes go bad). The hash is CRC32 of the UTF-8 key: the same on every
replica.

The checksum (format 2) is the CRC-32 of the entries the file holds followed by the header's first 44 bytes
(:func:`header_checksum`): it covers every byte a lookup reads but the slots, which change in place and are
checked against the entries instead (each slot holds the newest entry of its bucket, each entry links to the
one before it in its bucket: :func:`image_problem`). Format 1 files (written before the checksum) still open,
but nothing trusts one until it is rebuilt from the commit log (as format 2). A file is *checked* once
:func:`commitlog.key_index_checks.file_problem` found nothing wrong with it; the store checks a file before it
decides anything from it, and a file found damaged is rebuilt from the commit log
(:meth:`commitlog.key_index_files.KeyIndex.replace_file`). The set of files is
:class:`commitlog.key_index_files.KeyIndex`.

Write order per entry: entry, then the header (count, tail and checksum in one write), then slot. Undoing
entries newest first (recovery after a cut tail) restores each slot to its previous value.
"""

from __future__ import annotations

import logging
import mmap
import re
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt

from commitlog.mapped_file import MappedFile
from protocol.invariant import invariant

log = logging.getLogger(__name__)

INDEX_MAGIC: Final = 0x524D4958  # "RMIX"
#: the current format: the header carries a checksum
INDEX_VERSION: Final = 2
#: the first format (stores written before the checksum): opened, never trusted until rebuilt
INDEX_VERSION_UNCHECKED: Final = 1
HEADER: Final = struct.Struct(">IHHqqqqI")
CHECKSUM: Final = struct.Struct(">I")
CHECKSUM_POSITION: Final = HEADER.size
HEADER_BYTES: Final = 64
invariant(CHECKSUM_POSITION + CHECKSUM.size <= HEADER_BYTES, "index header must fit")
SLOT: Final = struct.Struct(">I")
ENTRY: Final = struct.Struct(">Iqii")
invariant(ENTRY.size == 20, "an index entry is 20 bytes")
COUNT_POSITION: Final = HEADER.size - 4
END_POSITION: Final = 16  # end_physical, end_timestamp (two i64) at bytes 16..23 and 32..39
TAIL: Final = struct.Struct(">q")
FILE_NAME = re.compile(r"^\d{20}$")
#: a file being rebuilt is written under its name with this suffix, then renamed over it
REBUILD_SUFFIX: Final = ".rebuild"
#: entries a column-wise read of a file converts at once (about 40 MiB of int64 columns and temporaries)
READ_CHUNK_ENTRIES: Final = 1 << 20

IndexEntry = tuple[int, int, int]  # (key hash, physical offset, store timestamp ms)
#: :data:`ENTRY` and :data:`SLOT` as numpy types: a batch of entries is inserted column-wise
ENTRY_DTYPE: Final = np.dtype([("hash", ">u4"), ("physical", ">i8"), ("seconds", ">i4"), ("previous", ">i4")])
SLOT_DTYPE: Final = np.dtype(">u4")
invariant(ENTRY_DTYPE.itemsize == ENTRY.size, "the entry dtype is the entry struct")

Column = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class IndexColumns:
    """Index entries as columns (key hash, physical offset, store timestamp ms), in insertion order."""

    hashes: Column
    physicals: Column
    timestamps: Column

    def __len__(self) -> int:
        return len(self.hashes)

    def since(self, start: int, end: int) -> IndexColumns:
        return IndexColumns(self.hashes[start:end], self.physicals[start:end], self.timestamps[start:end])


def index_columns(entries: Sequence[IndexEntry]) -> IndexColumns:
    table = np.array(entries, dtype=np.int64).reshape(-1, 3)
    return IndexColumns(table[:, 0], table[:, 1], table[:, 2])


def concatenated(parts: Sequence[IndexColumns]) -> IndexColumns:
    if not parts:
        return index_columns([])
    return IndexColumns(np.concatenate([part.hashes for part in parts]),
                        np.concatenate([part.physicals for part in parts]),
                        np.concatenate([part.timestamps for part in parts]))


def key_hash(topic: str, key: str) -> int:
    return zlib.crc32(f"{topic}#{key}".encode())


def header_checksum(header: bytes | memoryview, entries_crc: int) -> int:
    """The checksum a file's header carries: the CRC-32 of its entries (``entries_crc``, continued as entries
    are appended) followed by the header's first :data:`CHECKSUM_POSITION` bytes."""
    return zlib.crc32(header[:CHECKSUM_POSITION], entries_crc)


def image_problem(data: bytes | bytearray | memoryview | mmap.mmap, slot_count: int, entry_capacity: int, name_begin: int,
                  last: bool, links: bool = True) -> tuple[str | None, int]:
    """What is wrong with the bytes of an index file named ``name_begin`` (at least its header, slots and the
    entries it counts), ``last`` when no newer file follows it; with the CRC-32 of its entries. Pure: reads
    only ``data``. Checks what appends keep true: the header (magic, format, padding, name, count, a newer file
    only after a full one), the checksum, and with ``links`` the entries in commit-log order from the file's
    name (the first stamped with its begin), each entry's previous the newest earlier entry of its bucket, each slot the newest entry
    of its bucket (a crash in the middle of an append leaves the links of its entries behind: recovery checks
    them after it undid those)."""
    with memoryview(data) as view:
        if len(view) < HEADER_BYTES:
            return "shorter than its header", 0
        magic, version, pad, begin_physical, _, _, _, count = HEADER.unpack_from(view, 0)
        if magic != INDEX_MAGIC:
            return f"bad magic {magic:#010x}", 0
        if version == INDEX_VERSION_UNCHECKED:
            return f"format {version} carries no checksum", 0
        if version != INDEX_VERSION:
            return f"unknown format {version}", 0
        if pad or any(view[CHECKSUM_POSITION + CHECKSUM.size : HEADER_BYTES]):
            return "its header padding is not zeros", 0
        if begin_physical != name_begin:
            return f"its header begins at commit-log offset {begin_physical}, its name at {name_begin}", 0
        if count > entry_capacity:
            return f"it counts {count} entries, more than the {entry_capacity} it holds", 0
        if not last and count != entry_capacity:
            return f"it holds {count} of {entry_capacity} entries though a newer file follows it", 0
        base = HEADER_BYTES + slot_count * SLOT.size
        if len(view) < base + count * ENTRY.size:
            return "shorter than its entries", 0
        entries_crc = zlib.crc32(view[base : base + count * ENTRY.size])
        (stored,) = CHECKSUM.unpack_from(view, CHECKSUM_POSITION)
        if header_checksum(view, entries_crc) != stored:
            return "its checksum does not match its header and entries", entries_crc
        if not links:
            return None, entries_crc
        table = np.frombuffer(view, ENTRY_DTYPE, count=count, offset=base)
        slots = np.frombuffer(view, SLOT_DTYPE, count=slot_count, offset=HEADER_BYTES).astype(np.int64)
        problem = _entries_problem(table, slots, begin_physical)
        del table  # no export of the view may outlive it
        return problem, entries_crc


def _entries_problem(table: npt.NDArray[np.void], slots: Column, begin_physical: int) -> str | None:
    count = len(table)
    slot_count = len(slots)
    if count == 0:
        return "a slot names an entry the file does not hold" if slots.any() else None
    physicals = table["physical"].astype(np.int64)
    seconds = table["seconds"][:1].astype(np.int64)
    if physicals[0] != begin_physical or (count > 1 and bool((np.diff(physicals) < 0).any())):
        return "its entries are not in commit-log order from its name"
    if seconds[0] != 0:
        return "its first entry is not stamped with the file's begin"
    buckets = table["hash"].astype(np.int64) % slot_count
    order = np.argsort(buckets, kind="stable")  # within a bucket, still in entry order
    ordered = buckets[order]
    numbers = np.arange(1, count + 1, dtype=np.int64)
    starts_run = np.ones(count, dtype=bool)
    starts_run[1:] = ordered[1:] != ordered[:-1]
    ends_run = np.ones(count, dtype=bool)
    ends_run[:-1] = starts_run[1:]
    previous = np.empty(count, dtype=np.int64)
    previous[order] = np.where(starts_run, 0, numbers[order[np.maximum(np.arange(count) - 1, 0)]])
    wrong = np.flatnonzero(table["previous"].astype(np.int64) != previous)
    if len(wrong):
        return f"entry {int(wrong[0])} links to the wrong entry of its bucket"
    expected = np.zeros(slot_count, dtype=np.int64)
    expected[ordered[ends_run]] = numbers[order[ends_run]]
    wrong = np.flatnonzero(slots != expected)
    if len(wrong):
        return f"slot {int(wrong[0])} does not name the newest entry of its bucket"
    return None


@dataclass(slots=True)
class IndexFile:
    file: MappedFile
    slot_count: int
    entry_capacity: int
    begin_physical: int
    begin_timestamp: int
    entry_count: int
    version: int = INDEX_VERSION
    #: CRC-32 of the entries held (None: not read yet); appends continue it
    entries_crc: int | None = 0
    #: :func:`~commitlog.key_index_checks.file_problem` found nothing wrong, and no lookup met anything wrong since
    checked: bool = True
    #: a lookup's doubt about it was logged (once, until it is checked again)
    doubted: bool = False

    @property
    def entries_base(self) -> int:
        return HEADER_BYTES + self.slot_count * SLOT.size

    @property
    def name_begin(self) -> int:
        """The commit-log offset the file is named by: where its first entry points."""
        return int(self.file.path.name)

    def entry(self, number: int) -> tuple[int, int, int, int]:
        result: tuple[int, int, int, int] = ENTRY.unpack_from(self.file.map, self.entries_base + number * ENTRY.size)
        return result

    def write_header(self, end_physical: int, end_timestamp: int, count: int, entries_crc: int) -> None:
        """The header with ``count`` entries and the tail, checksum included, in one write."""
        header = HEADER.pack(INDEX_MAGIC, INDEX_VERSION, 0, self.begin_physical, end_physical, self.begin_timestamp,
                             end_timestamp, count)
        self.file.map[: CHECKSUM_POSITION + CHECKSUM.size] = header + CHECKSUM.pack(header_checksum(header, entries_crc))
        self.entry_count = count
        self.entries_crc = entries_crc

    def tail(self) -> tuple[int, int]:
        """(end_physical, end_timestamp) as the header says."""
        mapped = self.file.map
        return TAIL.unpack_from(mapped, END_POSITION)[0], TAIL.unpack_from(mapped, END_POSITION + 16)[0]

    def stored_columns(self) -> IndexColumns:
        """The entries the file counts, with their stamps in whole seconds (as ms)."""
        table = np.frombuffer(self.file.map, ENTRY_DTYPE, count=self.entry_count, offset=self.entries_base)
        try:
            return IndexColumns(table["hash"].astype(np.int64), table["physical"].astype(np.int64),
                                (table["seconds"].astype(np.int64) + self.begin_timestamp // 1000) * 1000)
        finally:
            del table  # a live export would stop the file from being unmapped

    def doubt(self, reason: str) -> None:
        """A lookup met something in this file that its checks rule out (or an entry that does not match
        the commit log): nothing is decided from the file until it is checked again. Logged once."""
        self.checked = False
        if not self.doubted:
            self.doubted = True
            log.warning("key-index file %s: %s: it is checked again before anything is decided from it",
                        self.file.path, reason)
