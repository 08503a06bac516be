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
:meth:`KeyIndex.problem` found nothing wrong with it; the store checks a file before it decides anything from
it, and a file found damaged is rebuilt from the commit log (:meth:`KeyIndex.replace_file`).

Write order per entry: entry, then the header (count, tail and checksum in one write), then slot. Undoing
entries newest first (recovery after a cut tail) restores each slot to its previous value.
"""

from __future__ import annotations

import logging
import mmap
import re
import struct
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import numpy as np
import numpy.typing as npt

from commitlog import reaper
from commitlog.errors import CorruptionError, DiskFullError
from commitlog.mapped_file import MappedFile, ensure_directory, fsync_directory
from commitlog.records import columnwise
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
    #: :meth:`KeyIndex.problem` found nothing wrong, and no lookup met anything wrong since
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


class KeyIndex:
    def __init__(self, directory: Path, slot_count: int, entry_capacity: int) -> None:
        self.directory = directory
        self.slot_count = slot_count
        self.entry_capacity = entry_capacity
        self.file_bytes = HEADER_BYTES + slot_count * SLOT.size + entry_capacity * ENTRY.size
        ensure_directory(directory)
        self.files: list[IndexFile] = []
        for path in sorted(directory.iterdir()):
            if FILE_NAME.match(path.name):
                try:
                    self.files.append(self._open(path))
                except CorruptionError as exc:
                    # cut short or its header damaged on disk: the member refused to start on it. The index is
                    # derived from the commit log, and the store's recovery rebuilds it when a file it counts
                    # on is missing
                    log.warning("%s: deleting it (the key index is rebuilt from the commit log)", exc)
                    path.unlink()
            elif FILE_NAME.match(path.name.split(".", 1)[0]) and REBUILD_SUFFIX in path.name:
                path.unlink()  # a rebuild the process did not finish: the file it was to replace is still there

    def _open(self, path: Path) -> IndexFile:
        size = path.stat().st_size
        if size != self.file_bytes:
            raise CorruptionError(f"index file {path} has {size} bytes, not {self.file_bytes}")
        mapped = MappedFile(path, self.file_bytes, create=False)
        magic, version, _, begin_physical, _, begin_ts, _, count = HEADER.unpack_from(mapped.map, 0)
        if (magic != INDEX_MAGIC or version not in (INDEX_VERSION, INDEX_VERSION_UNCHECKED)
                or count > self.entry_capacity):
            mapped.close()
            raise CorruptionError(f"index file {path} has a bad header")
        # not checked yet: the store checks a file (problem()) before it decides anything from it
        return IndexFile(mapped, self.slot_count, self.entry_capacity, begin_physical, begin_ts, count, version,
                         entries_crc=None, checked=False)

    def _create(self, begin_physical: int, begin_timestamp: int) -> IndexFile:
        path = self.directory / f"{begin_physical:020d}"
        if path.exists():  # an empty file left by an earlier, undone attempt
            path.unlink()
        mapped = MappedFile(path, self.file_bytes, create=True)
        index_file = IndexFile(mapped, self.slot_count, self.entry_capacity, begin_physical, begin_timestamp, 0)
        index_file.write_header(begin_physical, begin_timestamp, 0, 0)
        self.files.append(index_file)
        return index_file

    def prepare(self, entries: IndexColumns | Sequence[IndexEntry]) -> None:
        """Create the files ``entries`` will need. May raise DiskFullError; writes no entry."""
        free = (self.entry_capacity - self.files[-1].entry_count) if self.files else 0
        position = free
        while position < len(entries):
            if isinstance(entries, IndexColumns):
                self._create(int(entries.physicals[position]), int(entries.timestamps[position]))
            else:
                _, physical, timestamp = entries[position]
                self._create(physical, timestamp)
            position += self.entry_capacity

    def insert_many(self, entries: IndexColumns | Sequence[IndexEntry]) -> None:
        """Append ``entries`` (files prepared). Per file: all entries as one write, then the header (count,
        tail and checksum), then the slots; a crash between leaves either unreachable entries past the count
        or entries whose slot still holds the previous value, both of which :meth:`undo_from` handles.
        Column-wise for many entries, one by one for a few (:func:`commitlog.records.columnwise`)."""
        if not isinstance(entries, IndexColumns) and columnwise(len(entries)):
            entries = index_columns(entries)
        # entries go to the files after the last full one: the one filling and those prepare() made
        fill = len(self.files)
        while fill > 0 and self.files[fill - 1].entry_count < self.entry_capacity:
            fill -= 1
        position = 0
        while position < len(entries):
            index_file = next((f for f in self.files[fill:] if f.entry_count < self.entry_capacity), None)
            invariant(index_file is not None, "prepare must run before insert")
            assert index_file is not None
            invariant(index_file.version == INDEX_VERSION and index_file.entries_crc is not None,
                      "entries are appended only to a checked file of the current format")
            take = min(len(entries) - position, self.entry_capacity - index_file.entry_count)
            if isinstance(entries, IndexColumns):
                self._insert_into(index_file, entries.since(position, position + take))
            else:
                self._insert_each(index_file, entries[position : position + take])
            position += take

    def _insert_each(self, index_file: IndexFile, entries: Sequence[IndexEntry]) -> None:
        """:meth:`_insert_into` entry by entry (the same bytes)."""
        mapped = index_file.file.map
        slot_count = self.slot_count
        begin_seconds = index_file.begin_timestamp // 1000
        count = index_file.entry_count
        new_slots: dict[int, int] = {}
        packed = []
        pack = ENTRY.pack
        for hash_value, physical, timestamp in entries:
            slot_position = HEADER_BYTES + (hash_value % slot_count) * 4
            previous = new_slots.get(slot_position)
            if previous is None:
                (previous,) = SLOT.unpack_from(mapped, slot_position)
            packed.append(pack(hash_value, physical, timestamp // 1000 - begin_seconds, previous))
            count += 1
            new_slots[slot_position] = count
        base = index_file.entries_base + index_file.entry_count * ENTRY.size
        blob = b"".join(packed)
        mapped[base : base + len(blob)] = blob
        _, last_physical, last_timestamp = entries[-1]
        index_file.write_header(last_physical, last_timestamp, count, zlib.crc32(blob, index_file.entries_crc or 0))
        for slot_position, number in new_slots.items():
            SLOT.pack_into(mapped, slot_position, number)

    def _insert_into(self, index_file: IndexFile, entries: IndexColumns) -> None:
        """Column-wise: an entry's previous is the newest earlier entry of its slot in this batch, else what
        the slot held; each slot written ends at the newest entry of its bucket."""
        mapped = index_file.file.map
        count = index_file.entry_count
        taken = len(entries)
        slots = entries.hashes % self.slot_count
        order = np.argsort(slots, kind="stable")  # within a slot, still in insertion order
        ordered = slots[order]
        numbers = count + 1 + np.arange(taken, dtype=np.int64)  # each entry's number + 1, as slots hold
        starts_run = np.ones(taken, dtype=bool)
        starts_run[1:] = ordered[1:] != ordered[:-1]
        ends_run = np.ones(taken, dtype=bool)
        ends_run[:-1] = starts_run[1:]
        slot_table = np.frombuffer(mapped, SLOT_DTYPE, count=self.slot_count, offset=HEADER_BYTES)
        try:
            previous_ordered = np.where(starts_run, slot_table[ordered], numbers[order[np.maximum(
                np.arange(taken) - 1, 0)]])
            previous = np.empty(taken, dtype=np.int64)
            previous[order] = previous_ordered
            packed = np.empty(taken, dtype=ENTRY_DTYPE)
            packed["hash"] = entries.hashes
            packed["physical"] = entries.physicals
            packed["seconds"] = entries.timestamps // 1000 - index_file.begin_timestamp // 1000
            packed["previous"] = previous
            base = index_file.entries_base + count * ENTRY.size
            blob = packed.tobytes()
            mapped[base : base + len(blob)] = blob
            index_file.write_header(int(entries.physicals[-1]), int(entries.timestamps[-1]), count + taken,
                                    zlib.crc32(blob, index_file.entries_crc or 0))
            slot_table[ordered[ends_run]] = numbers[order[ends_run]]
        finally:
            del slot_table  # a live export would stop the file from being unmapped

    # ------------------------------------------------------------------ checks

    def holds_newest(self, index_file: IndexFile) -> bool:
        """Whether no later file holds entries: ``index_file`` is the one filling (files made for an append
        that a full disk stopped are still empty)."""
        position = next(number for number, each in enumerate(self.files) if each is index_file)
        return all(later.entry_count == 0 for later in self.files[position + 1 :])

    def problem(self, index_file: IndexFile) -> str | None:
        """What is wrong with one of this index's files (:func:`image_problem`), None when nothing is: the
        file is checked from then on, and its entries' checksum known (appends continue it)."""
        problem, entries_crc = image_problem(index_file.file.map, self.slot_count, self.entry_capacity,
                                             index_file.name_begin, self.holds_newest(index_file))
        if problem is None:
            index_file.entries_crc = entries_crc
            index_file.checked = True
            index_file.doubted = False
        return problem

    def doubt(self, index_file: IndexFile, reason: str) -> None:
        """A lookup met something in ``index_file`` that its checks rule out (or an entry that does not match
        the commit log): nothing is decided from the file until it is checked again. Logged once."""
        index_file.checked = False
        if not index_file.doubted:
            index_file.doubted = True
            log.warning("key-index file %s: %s: it is checked again before anything is decided from it",
                        index_file.file.path, reason)

    def first_mismatch(self, expected: Sequence[IndexEntry]) -> tuple[IndexFile, str] | None:
        """Where the entries ``expected`` of consecutive records (in commit-log order, as dispatch made them)
        differ from what the files hold: the file that should hold the first entry that differs, and how.
        None when they all match (entries of records before the first file are not looked for)."""
        files = self.files
        if not files:
            return None
        first_begin = files[0].name_begin
        wanted = [entry for entry in expected if entry[1] >= first_begin]
        if not wanted:
            return None
        first = wanted[0][1]
        position, number = self._entries_start(files, first)
        index_file = files[position]
        if number is None:
            return index_file, f"no entry points at the record at commit-log offset {first}"
        for hash_value, physical, timestamp in wanted:
            while number >= index_file.entry_count:
                if position + 1 == len(files):
                    return index_file, f"its entries end before those of the record at commit-log offset {physical}"
                position += 1
                index_file, number = files[position], 0
            entry_hash, entry_physical, seconds, _ = index_file.entry(number)
            found = (entry_hash, entry_physical, index_file.begin_timestamp // 1000 + seconds)
            if found != (hash_value, physical, timestamp // 1000):
                return index_file, (f"entry {number} holds (hash, offset, second) {found}, the commit log says "
                                    f"{(hash_value, physical, timestamp // 1000)}")
            number += 1
        return None

    def _entries_start(self, files: list[IndexFile], first: int) -> tuple[int, int | None]:
        """Where the entries of the record at commit-log offset ``first`` begin: the file's position in
        ``files`` and the entry's number in it (None: no entry there points at that record)."""
        position = max(number for number, index_file in enumerate(files) if index_file.name_begin <= first)
        if position > 0 and files[position].name_begin == first:
            before = files[position - 1]  # a record's entries may begin at the end of the file before
            if before.entry_count and before.entry(before.entry_count - 1)[1] == first:
                position -= 1
        return position, self._first_entry_at(files[position], first)

    def entries_match(self, hashes: npt.NDArray[np.uint32], physicals: npt.NDArray[np.int64],
                      timestamps: npt.NDArray[np.int64]) -> bool:
        """Whether :meth:`first_mismatch` finds nothing for the entries given as columns (hash, physical offset,
        store timestamp), compared a file's run of entries at a time: the scrubber's check, which asks
        :meth:`first_mismatch` what differs only when something does."""
        files = self.files
        if not files:
            return True
        wanted = physicals >= files[0].name_begin
        if not wanted.all():
            hashes, physicals, timestamps = hashes[wanted], physicals[wanted], timestamps[wanted]
        if not len(physicals):
            return True
        position, number = self._entries_start(files, int(physicals[0]))
        index_file = files[position]
        if number is None:
            return False
        seconds = timestamps // 1000
        done = 0
        while done < len(physicals):
            if number >= index_file.entry_count:
                if position + 1 == len(files):
                    return False
                position += 1
                index_file, number = files[position], 0
                continue
            take = min(index_file.entry_count - number, len(physicals) - done)
            found = np.frombuffer(index_file.file.map, ENTRY_DTYPE, count=take,
                                  offset=index_file.entries_base + number * ENTRY.size)
            same = (np.array_equal(found["hash"], hashes[done : done + take])
                    and np.array_equal(found["physical"], physicals[done : done + take])
                    and np.array_equal(found["seconds"].astype(np.int64) + index_file.begin_timestamp // 1000,
                                       seconds[done : done + take]))
            del found  # (a view of the mapping: the file may be unmapped once this returns)
            if not same:
                return False
            done += take
            number += take
        return True

    @staticmethod
    def _first_entry_at(index_file: IndexFile, physical: int) -> int | None:
        """The number of the first entry of ``index_file`` pointing at ``physical`` (entries are in commit-log
        order: a binary search), None when there is none."""
        low, high = 0, index_file.entry_count
        while low < high:
            middle = (low + high) // 2
            if index_file.entry(middle)[1] < physical:
                low = middle + 1
            else:
                high = middle
        return low if low < index_file.entry_count and index_file.entry(low)[1] == physical else None

    # ------------------------------------------------------------------ lookups

    def files_from(self, begin_timestamp: int) -> list[IndexFile]:
        """The files a lookup of keys stored at or after ``begin_timestamp`` reads, newest first: back to the
        first that begins before its second. Older files hold only older entries (entries go in store-time
        order), so a lookup of recent keys reads only recent files."""
        chosen: list[IndexFile] = []
        newer_begin_seconds: int | None = None  # the begin of the file after this one
        for index_file in reversed(self.files):
            if newer_begin_seconds is not None and newer_begin_seconds < begin_timestamp // 1000:
                break
            newer_begin_seconds = index_file.begin_timestamp // 1000
            chosen.append(index_file)
        return chosen

    def lookup(self, hash_value: int, max_count: int, begin_timestamp: int = 0,
               end_timestamp: int = 2**63 - 1) -> list[int]:
        """Physical offsets of entries with ``hash_value``, newest first, at most ``max_count``."""
        return [physical for physical, _, _ in self.lookup_entries(hash_value, max_count, begin_timestamp,
                                                                   end_timestamp)]

    def lookup_entries(self, hash_value: int, max_count: int, begin_timestamp: int = 0,
                       end_timestamp: int = 2**63 - 1) -> list[tuple[int, int, IndexFile]]:
        """(physical offset, store second, file) of the entries with ``hash_value``, newest first, at most
        ``max_count``. A chain that meets what appends never write (a slot past the entries, an entry of
        another bucket, a link forward) stops there, and its file is doubted (:meth:`doubt`)."""
        found: list[tuple[int, int, IndexFile]] = []
        begin_second = begin_timestamp // 1000
        bucket = hash_value % self.slot_count
        for index_file in self.files_from(begin_timestamp):
            if index_file.begin_timestamp > end_timestamp:
                continue
            (number,) = SLOT.unpack_from(index_file.file.map, HEADER_BYTES + bucket * SLOT.size)
            if number > index_file.entry_count:
                self.doubt(index_file, f"slot {bucket} names entry {number - 1} of {index_file.entry_count}")
                continue
            begin_seconds = index_file.begin_timestamp // 1000
            while number > 0 and len(found) < max_count:
                entry_hash, physical, time_difference, previous = index_file.entry(number - 1)
                if entry_hash % self.slot_count != bucket:
                    self.doubt(index_file, f"entry {number - 1} in the chain of slot {bucket} is of another slot")
                    break
                timestamp_seconds = begin_seconds + time_difference
                if timestamp_seconds < begin_second:
                    break  # a chain runs newest first, in store-time order: the rest is older still
                if entry_hash == hash_value and timestamp_seconds <= end_timestamp // 1000:
                    found.append((physical, timestamp_seconds, index_file))
                if previous >= number:  # chains only point backwards
                    self.doubt(index_file, f"entry {number - 1} links forward to entry {previous - 1}")
                    break
                number = previous
            if len(found) >= max_count:
                break
        return found

    def entries_from_second(self, begin_second: int, chunk_entries: int = READ_CHUNK_ENTRIES) -> Iterator[IndexColumns]:
        """The entries stamped in second ``begin_second`` or later, newest file first, each file read
        column-wise in chunks of ``chunk_entries`` (memory stays bounded whatever a file holds). An entry
        keeps its stamp in whole seconds, so the timestamps are truncated to the second (``second * 1000``,
        at or before the stamp stored).

        It reads the files :meth:`lookup` reads for any time in ``begin_second`` or later
        (:meth:`files_from`): whatever a lookup from that second can return is among the entries yielded."""
        invariant(chunk_entries > 0, "chunks hold entries")
        for index_file in self.files_from(begin_second * 1000):
            file_begin_second = index_file.begin_timestamp // 1000
            for start in range(0, index_file.entry_count, chunk_entries):
                count = min(chunk_entries, index_file.entry_count - start)
                table = np.frombuffer(index_file.file.map, ENTRY_DTYPE, count=count,
                                      offset=index_file.entries_base + start * ENTRY.size)
                try:
                    seconds = table["seconds"].astype(np.int64) + file_begin_second
                    chosen = np.flatnonzero(seconds >= begin_second)
                    columns = IndexColumns(table["hash"][chosen].astype(np.int64),
                                           table["physical"][chosen].astype(np.int64), seconds[chosen] * 1000)
                finally:
                    del table  # a live export would stop the file from being unmapped
                yield columns

    def newest_timestamp(self) -> int | None:
        """The store timestamp (ms) of the newest entry, from its file's header (None: no entries). Undone
        entries leave it as it was, so it never understates."""
        for index_file in reversed(self.files):
            if index_file.entry_count:
                return index_file.tail()[1]
        return None

    # ------------------------------------------------------------------ undo, repair, retention

    def undo_from(self, physical_offset: int) -> tuple[IndexFile, str] | None:
        """Remove entries pointing at or after ``physical_offset``, newest first (recovery of a cut tail):
        files named at or after it go whole. The file whose tail it undoes is read only if its checksum holds
        (its entries and header are what was appended): otherwise nothing of it is undone and it is returned
        with what is wrong, for the caller to rebuild from the commit log. Its tail in the header is left as
        it was."""
        while self.files:
            index_file = self.files[-1]
            if index_file.name_begin >= physical_offset:
                self.files.pop().file.delete()
                continue
            problem, entries_crc = image_problem(index_file.file.map, self.slot_count, self.entry_capacity,
                                                 index_file.name_begin, last=True, links=False)
            if problem is not None:
                return index_file, problem
            mapped = index_file.file.map
            count = index_file.entry_count
            while count > 0:
                entry_hash, physical, _, previous = index_file.entry(count - 1)
                if physical < physical_offset:
                    break
                slot_position = HEADER_BYTES + (entry_hash % self.slot_count) * 4
                (current,) = SLOT.unpack_from(mapped, slot_position)
                if current == count:
                    SLOT.pack_into(mapped, slot_position, previous)
                count -= 1
            if count < index_file.entry_count:
                # a crash before this header write leaves the slots partly restored: undoing again restores
                # the rest (a slot that no longer names the entry undone is left alone)
                entries_crc = zlib.crc32(mapped[index_file.entries_base : index_file.entries_base + count * ENTRY.size])
                index_file.write_header(*index_file.tail(), count, entries_crc)
            else:
                index_file.entries_crc = entries_crc
            if count > 0:
                return None
            self.files.pop().file.delete()
        return None

    def replace_file(self, index_file: IndexFile, entries: IndexColumns, begin_timestamp: int) -> IndexFile | None:
        """Replace ``index_file`` by a file holding ``entries`` from ``begin_timestamp`` on, laid out as appends
        lay them out (the same bytes), atomically: built under a temporary name, made durable and renamed over
        it. Without entries (the last file, all of whose entries were cut) the file is deleted. May raise
        DiskFullError, with nothing replaced."""
        position = next(number for number, each in enumerate(self.files) if each is index_file)
        if not len(entries):
            invariant(position == len(self.files) - 1, "only the last key-index file can be left empty")
            self.files.pop().file.delete()
            return None
        invariant(len(entries) <= self.entry_capacity, "a rebuilt key-index file holds what a file can")
        path = index_file.file.path
        temp = path.with_name(path.name + REBUILD_SUFFIX)
        temp.unlink(missing_ok=True)
        try:
            mapped = MappedFile(temp, self.file_bytes, create=True)
        except DiskFullError:
            # no room for a second copy: written over the damaged one instead. A crash meanwhile leaves a file
            # that fails its checks (its checksum), which is then rebuilt again
            log.warning("no space for a new copy of key-index file %s: rebuilding it in place", path)
            mapped = index_file.file
            for start in range(0, self.file_bytes, READ_CHUNK_ENTRIES):
                mapped.map[start : min(start + READ_CHUNK_ENTRIES, self.file_bytes)] = bytes(
                    min(READ_CHUNK_ENTRIES, self.file_bytes - start))
        rebuilt = IndexFile(mapped, self.slot_count, self.entry_capacity, index_file.name_begin, begin_timestamp, 0)
        rebuilt.write_header(index_file.name_begin, begin_timestamp, 0, 0)
        for start in range(0, len(entries), READ_CHUNK_ENTRIES):
            self._insert_into(rebuilt, entries.since(start, start + READ_CHUNK_ENTRIES))
        mapped.flush(0, self.file_bytes)
        if mapped is not index_file.file:
            index_file.file.close()
            reaper.replace(temp, path)
            fsync_directory(self.directory)
            mapped.path = path
        self.files[position] = rebuilt
        return rebuilt

    def prune_below(self, physical_offset: int) -> None:
        """Retention: drop whole files whose successor starts at or below ``physical_offset``."""
        while len(self.files) > 1 and self.files[1].begin_physical <= physical_offset:
            self.files.pop(0).file.delete()

    def recent_paths(self) -> list[Path]:
        """The files appends touch: the last two (the one that filled up, the one filling)."""
        return [index_file.file.path for index_file in self.files[-2:]]

    def flush(self) -> None:
        for index_file in self.files[-2:]:
            index_file.file.flush(0, self.file_bytes)

    def close(self) -> None:
        for index_file in self.files:
            index_file.file.close()
