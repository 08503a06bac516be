"""The key index: on-disk hash index by ``topic#key`` (KEYS and UNIQ_KEY), like RocketMQ's IndexFile.

Each file: a 64-byte header, ``slot_count`` 4-byte slots, ``entry_capacity`` 20-byte entries::

    header: magic u32 | version u16 | pad u16 | begin_physical i64 | end_physical i64 |
            begin_timestamp i64 | end_timestamp i64 | entry_count u32
    slot:   entry number + 1 of the newest entry in the bucket (0 = empty)
    entry:  key_hash u32 | physical_offset i64 | time_difference_s i32 | previous entry number + 1 u32

Memory stays bounded: everything is in mapped files; a full file is followed by a new one named by the
physical offset of its first entry. Lookups return candidate offsets; callers confirm each against the
record itself (hashes collide). The hash is CRC32 of the UTF-8 key: the same on every replica.

Write order per entry: entry, then header count, then slot. Undoing entries newest first (recovery after
a cut tail) restores each slot to its previous value.
"""

from __future__ import annotations

import logging
import re
import struct
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import numpy as np
import numpy.typing as npt

from commitlog.errors import CorruptionError, invariant
from commitlog.mapped_file import MappedFile, ensure_directory
from commitlog.records import columnwise

log = logging.getLogger(__name__)

INDEX_MAGIC: Final = 0x524D4958  # "RMIX"
INDEX_VERSION: Final = 1
HEADER: Final = struct.Struct(">IHHqqqqI")
HEADER_BYTES: Final = 64
invariant(HEADER.size <= HEADER_BYTES, "index header must fit")
SLOT: Final = struct.Struct(">I")
ENTRY: Final = struct.Struct(">Iqii")
invariant(ENTRY.size == 20, "an index entry is 20 bytes")
COUNT_POSITION: Final = HEADER.size - 4
END_POSITION: Final = 16  # end_physical, end_timestamp (two i64) at bytes 16..31 and 32..39
TAIL: Final = struct.Struct(">q")
FILE_NAME = re.compile(r"^\d{20}$")
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


def key_hash(topic: str, key: str) -> int:
    return zlib.crc32(f"{topic}#{key}".encode())


@dataclass(slots=True)
class IndexFile:
    file: MappedFile
    slot_count: int
    entry_capacity: int
    begin_physical: int
    begin_timestamp: int
    entry_count: int

    @property
    def entries_base(self) -> int:
        return HEADER_BYTES + self.slot_count * SLOT.size

    def entry(self, number: int) -> tuple[int, int, int, int]:
        result: tuple[int, int, int, int] = ENTRY.unpack_from(self.file.map, self.entries_base + number * ENTRY.size)
        return result


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

    def _open(self, path: Path) -> IndexFile:
        size = path.stat().st_size
        if size != self.file_bytes:
            raise CorruptionError(f"index file {path} has {size} bytes, not {self.file_bytes}")
        mapped = MappedFile(path, self.file_bytes, create=False)
        magic, version, _, begin_physical, _, begin_ts, _, count = HEADER.unpack_from(mapped.map, 0)
        if magic != INDEX_MAGIC or version != INDEX_VERSION or count > self.entry_capacity:
            mapped.close()
            raise CorruptionError(f"index file {path} has a bad header")
        return IndexFile(mapped, self.slot_count, self.entry_capacity, begin_physical, begin_ts, count)

    def _create(self, begin_physical: int, begin_timestamp: int) -> IndexFile:
        path = self.directory / f"{begin_physical:020d}"
        if path.exists():  # an empty file left by an earlier, undone attempt
            path.unlink()
        mapped = MappedFile(path, self.file_bytes, create=True)
        HEADER.pack_into(mapped.map, 0, INDEX_MAGIC, INDEX_VERSION, 0, begin_physical, begin_physical,
                         begin_timestamp, begin_timestamp, 0)
        index_file = IndexFile(mapped, self.slot_count, self.entry_capacity, begin_physical, begin_timestamp, 0)
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
        """Append ``entries`` (files prepared). Per file: all entries as one write, then the header count
        and tail, then the slots; a crash between leaves either unreachable entries past the count or
        entries whose slot still holds the previous value, both of which :meth:`undo_from` handles.
        Column-wise for many entries, one by one for a few (:func:`commitlog.records.columnwise`)."""
        if not isinstance(entries, IndexColumns) and columnwise(len(entries)):
            entries = index_columns(entries)
        position = 0
        while position < len(entries):
            index_file = next((f for f in self.files if f.entry_count < self.entry_capacity), None)
            invariant(index_file is not None, "prepare must run before insert")
            assert index_file is not None
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
        TAIL.pack_into(mapped, END_POSITION, last_physical)
        TAIL.pack_into(mapped, END_POSITION + 16, last_timestamp)
        SLOT.pack_into(mapped, COUNT_POSITION, count)
        for slot_position, number in new_slots.items():
            SLOT.pack_into(mapped, slot_position, number)
        index_file.entry_count = count

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
            mapped[base : base + taken * ENTRY.size] = packed.tobytes()
            TAIL.pack_into(mapped, END_POSITION, int(entries.physicals[-1]))
            TAIL.pack_into(mapped, END_POSITION + 16, int(entries.timestamps[-1]))
            SLOT.pack_into(mapped, COUNT_POSITION, count + taken)
            slot_table[ordered[ends_run]] = numbers[order[ends_run]]
        finally:
            del slot_table  # a live export would stop the file from being unmapped
        index_file.entry_count = count + taken

    def lookup(self, hash_value: int, max_count: int, begin_timestamp: int = 0,
               end_timestamp: int = 2**63 - 1) -> list[int]:
        """Physical offsets of entries with ``hash_value``, newest first, at most ``max_count``."""
        found: list[int] = []
        newer_begin_seconds: int | None = None  # the begin of the file after this one
        for index_file in reversed(self.files):
            if newer_begin_seconds is not None and newer_begin_seconds < begin_timestamp // 1000:
                # This file's entries are no newer than the next file's first (entries go in store-time
                # order), so all are before the window: the walk below would stop at each one's first
                # entry. So would it in every older file: a lookup of recent keys reads only recent files.
                break
            newer_begin_seconds = index_file.begin_timestamp // 1000
            if index_file.begin_timestamp > end_timestamp:
                continue
            mapped = index_file.file.map
            (number,) = SLOT.unpack_from(mapped, HEADER_BYTES + (hash_value % self.slot_count) * 4)
            begin_seconds = index_file.begin_timestamp // 1000
            steps = 0
            while 0 < number <= index_file.entry_count and steps <= index_file.entry_count and len(found) < max_count:
                entry_hash, physical, time_difference, previous = index_file.entry(number - 1)
                timestamp_seconds = begin_seconds + time_difference
                if timestamp_seconds < begin_timestamp // 1000:
                    break  # a chain runs newest first, in store-time order: the rest is older still
                if entry_hash == hash_value and timestamp_seconds <= end_timestamp // 1000:
                    found.append(physical)
                if previous >= number:  # chains only point backwards; anything else is damage
                    break
                number = previous
                steps += 1
            if len(found) >= max_count:
                break
        return found

    def entries_from_second(self, begin_second: int, chunk_entries: int = READ_CHUNK_ENTRIES) -> Iterator[IndexColumns]:
        """The entries stamped in second ``begin_second`` or later, newest file first, each file read
        column-wise in chunks of ``chunk_entries`` (memory stays bounded whatever a file holds). An entry
        keeps its stamp in whole seconds, so the timestamps are truncated to the second (``second * 1000``,
        at or before the stamp stored).

        It reads the files :meth:`lookup` reads for any time in ``begin_second`` or later, and stops where
        every such lookup stops: after the first file that begins before ``begin_second`` (entries go in
        store-time order, so older files hold only older entries). Whatever a lookup from that second can
        return is therefore among the entries yielded."""
        invariant(chunk_entries > 0, "chunks hold entries")
        for index_file in reversed(self.files):
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
            if file_begin_second < begin_second:
                break

    def newest_timestamp(self) -> int | None:
        """The store timestamp (ms) of the newest entry, from its file's header (None: no entries). Undone
        entries leave it as it was, so it never understates."""
        for index_file in reversed(self.files):
            if index_file.entry_count:
                (timestamp,) = TAIL.unpack_from(index_file.file.map, END_POSITION + 16)
                return int(timestamp)
        return None

    def undo_from(self, physical_offset: int) -> None:
        """Remove entries pointing at or after ``physical_offset``, newest first (recovery of a cut tail)."""
        while self.files:
            index_file = self.files[-1]
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
                SLOT.pack_into(mapped, COUNT_POSITION, count)
            index_file.entry_count = count
            if count > 0:
                return
            self.files.pop().file.delete()

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
