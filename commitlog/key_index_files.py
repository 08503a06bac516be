"""The key index as a set of files (:mod:`commitlog.key_index` has their format): opening them, creating the
next when one is full, inserting entries, looking keys up newest first, and undoing, replacing and pruning
files for recovery, repair and retention. Its checks are in :mod:`commitlog.key_index_checks`."""

from __future__ import annotations

import logging
import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from commitlog import reaper
from commitlog.errors import CorruptionError, DiskFullError
from commitlog.key_index import (
    ENTRY,
    ENTRY_DTYPE,
    FILE_NAME,
    HEADER,
    HEADER_BYTES,
    INDEX_MAGIC,
    INDEX_VERSION,
    INDEX_VERSION_UNCHECKED,
    READ_CHUNK_ENTRIES,
    REBUILD_SUFFIX,
    SLOT,
    SLOT_DTYPE,
    IndexColumns,
    IndexEntry,
    IndexFile,
    image_problem,
    index_columns,
)
from commitlog.mapped_file import MappedFile, ensure_directory, fsync_directory
from commitlog.records import columnwise
from protocol.invariant import invariant

log = logging.getLogger(__name__)


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
        another bucket, a link forward) stops there, and its file is doubted (:meth:`IndexFile.doubt`)."""
        found: list[tuple[int, int, IndexFile]] = []
        begin_second = begin_timestamp // 1000
        bucket = hash_value % self.slot_count
        for index_file in self.files_from(begin_timestamp):
            if index_file.begin_timestamp > end_timestamp:
                continue
            (number,) = SLOT.unpack_from(index_file.file.map, HEADER_BYTES + bucket * SLOT.size)
            if number > index_file.entry_count:
                index_file.doubt(f"slot {bucket} names entry {number - 1} of {index_file.entry_count}")
                continue
            begin_seconds = index_file.begin_timestamp // 1000
            while number > 0 and len(found) < max_count:
                entry_hash, physical, time_difference, previous = index_file.entry(number - 1)
                if entry_hash % self.slot_count != bucket:
                    index_file.doubt(f"entry {number - 1} in the chain of slot {bucket} is of another slot")
                    break
                timestamp_seconds = begin_seconds + time_difference
                if timestamp_seconds < begin_second:
                    break  # a chain runs newest first, in store-time order: the rest is older still
                if entry_hash == hash_value and timestamp_seconds <= end_timestamp // 1000:
                    found.append((physical, timestamp_seconds, index_file))
                if previous >= number:  # chains only point backwards
                    index_file.doubt(f"entry {number - 1} links forward to entry {previous - 1}")
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
