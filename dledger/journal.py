"""The Raft journal behind pysyncobj: segment files of checksummed records, a manifest that makes truncation,
compaction and clearing atomic, a checksummed meta file for term and vote, and a recovery that tells a torn
tail (what a power cut leaves: normal) from damage (the member must re-fetch its log before it votes again).

pysyncobj's FileJournal kept every entry in a Python list, wrote one mmapped file with 32-bit offsets and no
checksum, compacted by clearing the file and writing the kept entries back, and replaced its meta file
without an fsync. This journal implements the same interface (``pysyncobj.journal.Journal`` as SyncObj
0.3.17 uses it) on files written with ``pwritev`` and made durable with one ``fdatasync`` per segment for
everything appended since the last call (group fsync).

On disk, in one directory (``raft/journal.d``); every integer is little-endian:

``manifest`` (replaced atomically: temp file, fsync, rename, fsync of the directory)
    magic ``RMQJMAN1`` | version u16 | flags u16 | epoch u64 | clear_epoch u64 | first_index u64 |
    limit_index u64 | damaged_after_index u64 | refetch_index u64 | reason length u32 | reason (utf-8) | crc u32.
    ``first_index``: the first entry held (entries below it are ignored; unset right after ``clear``).
    ``epoch`` counts truncations and clears; ``clear_epoch`` is the epoch of the last clear: segments made in
    an earlier epoch are leftovers of an interrupted clear. ``limit_index`` (flag): entries above it written
    in an earlier epoch were cut by the last truncation. The damage fields (flag) stay until
    :meth:`SegmentedJournal.clear_damage`.
``meta`` (replaced atomically)
    magic ``RMQJMET1`` | version u16 | flags u16 | term u64 | commit_index u64 | epoch u64 |
    durable_index u64 | vote length u32 | vote (utf-8) | crc u32. ``durable_index`` is a watermark: every
    entry up to it was on disk (in that epoch) when the file was written.
``<first index, 20 digits>.seg``
    header: magic ``RMQJSEG1`` | version u16 | reserved u16 | epoch u64 | first_index u64 | durable_index u64 |
    crc u32 (40 bytes); then records: magic u32 | length u32 | index u64 | term u64 | durable_index u64 |
    epoch u32 | crc u32 (40 bytes) | command (length bytes). A record's crc covers its first 36 bytes and
    the command. ``durable_index`` is the highest index known durable when the record was written: a valid
    record stamped at or above an index proves that entry had been on disk.

Recovery keeps the longest valid chain (each record's index one more than the one before, terms and epochs
never decreasing) and cuts the rest. What it cut is *damage* when the cut lost an entry that was provably
durable (a later valid record or segment header stamped at or above it, or the meta watermark), when a
valid record does not follow (wrong index, term or epoch), when a segment header is inconsistent, or when
the manifest or meta file is unreadable. Otherwise the cut is a torn tail: bytes that never were durable,
and a power cut may leave them anywhere past the last fdatasync (also in an older segment when writeback
reached a new segment first). Damage is recorded in the manifest before anything is cut, so a crash during
recovery, or a restart, does not forget it.

Threads: every method but :meth:`SegmentedJournal.make_durable` runs on one thread (pysyncobj's tick thread).
``make_durable`` may run on another thread at the same time as ``add`` (a flusher): ``add`` writes the
record, then publishes it under a small lock; ``make_durable`` takes the list of written segments under that
lock and fdatasyncs outside it. Truncation, compaction, clearing and closing wait for a running
``make_durable`` (they close and delete files it may be syncing). ``durable_index`` and ``last_index`` may
be read from any thread.
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
import errno
import logging
import mmap
import os
import re
import shutil
import struct
import threading
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, overload

from isal import isal_zlib
from pysyncobj.journal import MemoryJournal
from pysyncobj.pickle import loads as pysyncobj_loads

from commitlog import reaper
from commitlog.errors import CorruptionError, DiskFullError, StoreError, stop_on_sync_error
from commitlog.mapped_file import atomic_write, fsync_directory
from protocol.invariant import invariant

log = logging.getLogger(__name__)

#: CRC-32 (zlib's polynomial) by ISA-L: the same values as ``zlib.crc32``, many times faster on large entries
crc32: Final = isal_zlib.crc32

LogEntry = tuple[bytes, int, int]  # pysyncobj's (command, index, term)

FORMAT_VERSION: Final = 1
SEGMENT_MAGIC: Final = b"RMQJSEG1"
MANIFEST_MAGIC: Final = b"RMQJMAN1"
META_MAGIC: Final = b"RMQJMET1"
RECORD_MAGIC: Final = 0x0A4C4A52  # b"RJL\n"
RECORD_MAGIC_BYTES: Final = struct.pack("<I", RECORD_MAGIC)

_CRC = struct.Struct("<I")
SEGMENT_HEADER_BODY: Final = struct.Struct("<8sHHQQQ")  # magic, version, reserved, epoch, first, durable
SEGMENT_HEADER_BYTES: Final = SEGMENT_HEADER_BODY.size + _CRC.size
RECORD_HEAD_BODY: Final = struct.Struct("<IIQQQI")  # magic, length, index, term, durable, epoch
RECORD_HEAD: Final = struct.Struct("<IIQQQII")  # the same, then the crc
RECORD_HEAD_BYTES: Final = RECORD_HEAD.size
MANIFEST_BODY: Final = struct.Struct("<8sHHQQQQQQI")
META_BODY: Final = struct.Struct("<8sHHQQQQI")
assert SEGMENT_HEADER_BYTES == 40 and RECORD_HEAD_BYTES == 40 and RECORD_HEAD_BODY.size == 36
assert MANIFEST_BODY.size == 64 and META_BODY.size == 48

_MANIFEST_FIRST_SET: Final = 1
_MANIFEST_LIMIT_SET: Final = 2
_MANIFEST_DAMAGED: Final = 4
_MANIFEST_MIGRATED: Final = 8
_META_VOTED: Final = 1

#: a record longer than this is damage at recovery, and a programmer error in ``add`` (entries are ~1 MB)
COMMAND_SIZE_MAX_BYTES: Final = 64 << 20
#: the active segment is closed once a record would take it past this (a single larger record still fits)
SEGMENT_SIZE_BYTES_DEFAULT: Final = 64 << 20
#: the most recent entries kept in memory as the very objects given to ``add`` (followers are sent them,
#: the leader applies them); at least the last entry is always kept
RECENT_CACHE_BYTES_DEFAULT: Final = 64 << 20
RECENT_CACHE_ENTRIES_MAX: Final = 65_536
#: an uncached range is read with one pread per window of about this many bytes
READ_WINDOW_BYTES: Final = 4 << 20
#: a manifest's damage text is cut to this many bytes
DAMAGE_REASON_BYTES_MAX: Final = 2_000
EPOCH_MAX: Final = (1 << 32) - 1

MANIFEST_NAME: Final = "manifest"
META_NAME: Final = "meta"
SEGMENT_SUFFIX: Final = ".seg"
_SEGMENT_NAME = re.compile(r"^(\d{20})\.seg$")

# why a scan stopped before the end of a segment's data
STOP_INVALID: Final = "invalid"  # bytes that are no valid record (torn, or damaged)
STOP_MISPLACED: Final = "misplaced"  # a valid record that does not follow: damage
STOP_LIMIT: Final = "limit"  # a record cut by the last truncation (the manifest's limit): not damage
STOP_GAP: Final = "gap"  # the next segment does not start where the one before ended


class FormatError(ValueError):
    """Bytes of a manifest, meta file or segment header that fail validation."""


# ------------------------------------------------------------------------------------------ pure codecs


@dataclass(frozen=True, slots=True)
class Manifest:
    epoch: int = 0
    clear_epoch: int = 0
    #: None right after a clear: the next entry added sets it
    first_index: int | None = None
    #: entries above it written before ``epoch`` were cut by the last truncation
    limit_index: int | None = None
    damage: str | None = None
    damaged_after_index: int = 0
    refetch_index: int = 0
    #: made from pysyncobj's journal file: a leftover of that file can go
    migrated: bool = False


def encode_manifest(manifest: Manifest) -> bytes:
    flags = ((_MANIFEST_FIRST_SET if manifest.first_index is not None else 0)
             | (_MANIFEST_LIMIT_SET if manifest.limit_index is not None else 0)
             | (_MANIFEST_DAMAGED if manifest.damage is not None else 0)
             | (_MANIFEST_MIGRATED if manifest.migrated else 0))
    reason = (manifest.damage or "").encode()[:DAMAGE_REASON_BYTES_MAX]
    body = MANIFEST_BODY.pack(MANIFEST_MAGIC, FORMAT_VERSION, flags, manifest.epoch, manifest.clear_epoch,
                              manifest.first_index or 0, manifest.limit_index or 0,
                              manifest.damaged_after_index, manifest.refetch_index, len(reason)) + reason
    return body + _CRC.pack(crc32(body))


def decode_manifest(data: bytes) -> Manifest:
    if len(data) < MANIFEST_BODY.size + _CRC.size:
        raise FormatError(f"manifest too short ({len(data)} bytes)")
    (magic, version, flags, epoch, clear_epoch, first_index, limit_index, damaged_after, refetch,
     reason_length) = MANIFEST_BODY.unpack_from(data)
    if magic != MANIFEST_MAGIC:
        raise FormatError("not a journal manifest")
    if version != FORMAT_VERSION:
        raise FormatError(f"unknown manifest version {version}")
    if len(data) != MANIFEST_BODY.size + reason_length + _CRC.size:
        raise FormatError("manifest length does not match its reason length")
    if _CRC.unpack_from(data, len(data) - _CRC.size)[0] != crc32(data[:-_CRC.size]):
        raise FormatError("manifest crc mismatch")
    reason = data[MANIFEST_BODY.size:MANIFEST_BODY.size + reason_length].decode(errors="replace")
    return Manifest(epoch=epoch, clear_epoch=clear_epoch,
                    first_index=first_index if flags & _MANIFEST_FIRST_SET else None,
                    limit_index=limit_index if flags & _MANIFEST_LIMIT_SET else None,
                    damage=reason if flags & _MANIFEST_DAMAGED else None,
                    damaged_after_index=damaged_after, refetch_index=refetch,
                    migrated=bool(flags & _MANIFEST_MIGRATED))


@dataclass(frozen=True, slots=True)
class Meta:
    term: int = 0
    voted_for: str | None = None
    #: pysyncobj's default before any commit index was stored
    commit_index: int = 1
    #: the manifest epoch ``durable_index`` refers to
    epoch: int = 0
    durable_index: int = 0


def encode_meta(meta: Meta) -> bytes:
    vote = meta.voted_for.encode() if meta.voted_for is not None else b""
    body = META_BODY.pack(META_MAGIC, FORMAT_VERSION, _META_VOTED if meta.voted_for is not None else 0,
                          meta.term, meta.commit_index, meta.epoch, meta.durable_index, len(vote)) + vote
    return body + _CRC.pack(crc32(body))


def decode_meta(data: bytes) -> Meta:
    if len(data) < META_BODY.size + _CRC.size:
        raise FormatError(f"meta file too short ({len(data)} bytes)")
    magic, version, flags, term, commit_index, epoch, durable_index, vote_length = META_BODY.unpack_from(data)
    if magic != META_MAGIC:
        raise FormatError("not a journal meta file")
    if version != FORMAT_VERSION:
        raise FormatError(f"unknown meta version {version}")
    if len(data) != META_BODY.size + vote_length + _CRC.size:
        raise FormatError("meta length does not match its vote length")
    if _CRC.unpack_from(data, len(data) - _CRC.size)[0] != crc32(data[:-_CRC.size]):
        raise FormatError("meta crc mismatch")
    vote = data[META_BODY.size:META_BODY.size + vote_length].decode() if flags & _META_VOTED else None
    return Meta(term=term, voted_for=vote, commit_index=commit_index, epoch=epoch, durable_index=durable_index)


@dataclass(frozen=True, slots=True)
class SegmentHeader:
    epoch: int
    first_index: int
    durable_index: int


def encode_segment_header(header: SegmentHeader) -> bytes:
    body = SEGMENT_HEADER_BODY.pack(SEGMENT_MAGIC, FORMAT_VERSION, 0, header.epoch, header.first_index,
                                    header.durable_index)
    return body + _CRC.pack(crc32(body))


def decode_segment_header(data: bytes | memoryview) -> SegmentHeader:
    if len(data) < SEGMENT_HEADER_BYTES:
        raise FormatError("segment shorter than its header")
    magic, version, _, epoch, first_index, durable_index = SEGMENT_HEADER_BODY.unpack_from(data)
    if magic != SEGMENT_MAGIC or version != FORMAT_VERSION:
        raise FormatError("not a journal segment header")
    if _CRC.unpack_from(data, SEGMENT_HEADER_BODY.size)[0] != crc32(data[:SEGMENT_HEADER_BODY.size]):
        raise FormatError("segment header crc mismatch")
    return SegmentHeader(epoch=epoch, first_index=first_index, durable_index=durable_index)


def encode_record_head(command: bytes, index: int, term: int, epoch: int, durable_index: int) -> bytes:
    """The 40 bytes written before ``command`` (written as is, from the caller's object: no copy)."""
    body = RECORD_HEAD_BODY.pack(RECORD_MAGIC, len(command), index, term, durable_index, epoch)
    return body + _CRC.pack(crc32(command, crc32(body)))


def record_at(data: bytes, offset: int) -> tuple[int, int, int, int, int] | None:
    """(length, index, term, durable_index, epoch) of a whole, valid record at ``offset``, else None."""
    if len(data) - offset < RECORD_HEAD_BYTES:
        return None
    magic, length, index, term, durable, epoch, crc = RECORD_HEAD.unpack_from(data, offset)
    end = offset + RECORD_HEAD_BYTES + length
    if magic != RECORD_MAGIC or length > COMMAND_SIZE_MAX_BYTES or end > len(data):
        return None
    view = memoryview(data)
    try:
        if crc32(view[offset + RECORD_HEAD_BYTES:end], crc32(view[offset:offset + RECORD_HEAD_BODY.size])) != crc:
            return None
    finally:
        view.release()
    return length, index, term, durable, epoch


@dataclass(slots=True)
class ScanResult:
    """The valid records of one segment's data, from a start offset."""

    offsets: array[int]
    #: where the valid records end (the cut offset when ``stop`` is set)
    end: int
    next_index: int
    last_term: int
    last_epoch: int
    #: None: the data ends right after a valid record; else why the scan stopped at ``end``
    stop: str | None


def scan_records(data: bytes, start: int, expected_index: int, last_term: int, last_epoch: int,
                 epoch_max: int, limit: tuple[int, int] | None) -> ScanResult:
    """Walk the records of ``data`` from ``start`` while each is valid and follows the one before (index one
    more, term and epoch not less, epoch at most ``epoch_max``). ``limit`` is (index, epoch): a record above
    that index written before that epoch was cut by a truncation that a crash interrupted."""
    offsets = array("Q")
    offset = start
    stop: str | None = None
    while offset < len(data):
        record = record_at(data, offset)
        if record is None:
            stop = STOP_INVALID
            break
        length, index, term, _, epoch = record
        if limit is not None and index > limit[0] and epoch < limit[1]:
            stop = STOP_LIMIT
            break
        if index != expected_index or term < last_term or epoch < last_epoch or epoch > epoch_max:
            stop = STOP_MISPLACED
            break
        offsets.append(offset)
        expected_index, last_term, last_epoch = index + 1, term, epoch
        offset += RECORD_HEAD_BYTES + length
    return ScanResult(offsets, offset, expected_index, last_term, last_epoch, stop)


def durable_evidence(data: bytes, start: int, cut_index: int) -> tuple[bool, int]:
    """Look through ``data`` from ``start`` for valid records anywhere (not only at record boundaries): whether
    one was stamped durable at or above ``cut_index`` (then the entry at ``cut_index`` had been on disk), and
    the highest index of a valid record found (0 if none)."""
    found = False
    highest = 0
    position = data.find(RECORD_MAGIC_BYTES, start)
    while position >= 0:
        record = record_at(data, position)
        if record is None:
            position = data.find(RECORD_MAGIC_BYTES, position + 1)
            continue
        length, index, _, durable, _ = record
        highest = max(highest, index)
        found = found or durable >= cut_index
        position = data.find(RECORD_MAGIC_BYTES, position + RECORD_HEAD_BYTES + length)
    return found, highest


def segment_name(first_index: int) -> str:
    return f"{first_index:020d}{SEGMENT_SUFFIX}"


# ------------------------------------------------------------------------------------------ the journal


class _Segment:
    """One segment file: its descriptor (read and write), and where each record starts."""

    __slots__ = ("end", "fd", "first_index", "offsets", "path", "unsynced")

    def __init__(self, path: Path, fd: int, first_index: int, offsets: array[int], end: int) -> None:
        self.path = path
        self.fd = fd
        self.first_index = first_index
        self.offsets = offsets
        #: where the next record goes (the file's size)
        self.end = end
        #: written since the last fdatasync (in the journal's list of segments to sync)
        self.unsynced = False

    @property
    def next_index(self) -> int:
        return self.first_index + len(self.offsets)

    def record_end(self, position: int) -> int:
        return self.offsets[position + 1] if position + 1 < len(self.offsets) else self.end


@dataclass(slots=True)
class _SegmentFile:
    """A segment as recovery finds it: its data is read when scanned (one segment in memory at a time)."""

    path: Path
    first_index: int
    header: SegmentHeader | None

    def read(self) -> bytes:
        return self.path.read_bytes()


class SegmentedJournal:
    """pysyncobj's ``Journal`` on segment files; see the module docstring for the format and the threads.

    Positions given to ``__getitem__``, ``deleteEntriesFrom`` and ``deleteEntriesTo`` are list positions
    (0 = the first entry held), as in pysyncobj. An entry still in the recent cache is returned as the very
    ``bytes`` object given to ``add`` (the leader's apply finds its own decoded batch by that object's
    identity); an older one is read from its segment and checked against its crc.

    Durability: ``add`` only writes; :meth:`make_durable` makes every entry added so far durable. Term and
    vote are durable before ``setCurrentTerm`` returns; the commit index is stored with them and by
    ``onOneSecondTimer``. Truncation, compaction and clearing are durable and atomic when they return."""

    #: make_durable may run on a thread of its own, concurrently with add (dledger.member's flusher)
    concurrent_sync: Final = True

    def __init__(self, directory: Path, *, segment_size_bytes: int = SEGMENT_SIZE_BYTES_DEFAULT,
                 cache_bytes: int = RECENT_CACHE_BYTES_DEFAULT, cache_entries_max: int = RECENT_CACHE_ENTRIES_MAX,
                 legacy_journal: Path | None = None) -> None:
        invariant(segment_size_bytes > SEGMENT_HEADER_BYTES, "segment size must exceed the segment header")
        invariant(cache_entries_max >= 1, "the recent cache holds at least the last entry")
        self.directory = directory
        self.segment_size_bytes = segment_size_bytes
        self.cache_bytes_max = cache_bytes
        self.cache_entries_max = cache_entries_max
        #: False for the "page_cache" journal policy: make_durable does nothing
        self.sync_enabled = True
        #: fdatasyncs made by make_durable (status, benchmarks)
        self.syncs = 0
        #: entries were added since the last make_durable
        self.unsynced = False
        #: why this member's journal cannot be trusted (entries it may have acknowledged are lost, or its
        #: term and vote are unknown): it must not vote until it re-fetched the log up to ``refetch_index``
        self.damage: str | None = None
        #: the last index before the damage (entries after it were cut)
        self.damaged_after_index: int | None = None
        #: the highest index this member may have held before the damage
        self.refetch_index: int | None = None

        self._lock = threading.Lock()  # the handover from add to make_durable
        self._sync_lock = threading.Lock()  # make_durable against closing and deleting files
        self._segments: list[_Segment] = []
        self._segment_firsts: list[int] = []  # each segment's first index, for bisect
        self._unsynced_segments: list[_Segment] = []
        self._directory_unsynced = False
        self._written_index = 0
        self._durable_index = 0
        self._first_index = 0  # with _last_index: the entries held are [first, last]
        self._last_index = -1
        self._manifest = Manifest()
        self._term = 0
        self._voted_for: str | None = None
        self._commit_index = 1
        self._stored_meta: Meta | None = None
        #: entries [_cache_first, _last_index] as given to add (or read back at open)
        self._cache: list[LogEntry] = []
        self._cache_first = 0
        self._cache_bytes = 0
        self._first_entry: LogEntry | None = None
        self._closed = False
        self._directory_fd = -1
        self._open(legacy_journal)

    # ------------------------------------------------------------------ pysyncobj's Journal interface

    def add(self, command: bytes, idx: int, term: int) -> None:  # pysyncobj's names
        """Write one entry after the last (any index when the journal is empty). Not durable until
        :meth:`make_durable`. A full disk raises :class:`DiskFullError` and adds nothing."""
        invariant(not self._closed, "the journal is closed")
        length = len(command)
        invariant(length <= COMMAND_SIZE_MAX_BYTES, f"journal entry of {length} bytes is too large")
        if self._last_index < self._first_index:
            if self._manifest.first_index is None:
                self._start_at(idx)
            elif idx != self._first_index:
                self.clear()  # pysyncobj's MemoryJournal takes any index when empty: so do we, atomically
                self._start_at(idx)
        else:
            invariant(idx == self._last_index + 1, f"journal entry {idx} does not follow {self._last_index}")
            invariant(term >= self._cache[-1][2], f"journal entry {idx} has a term below the one before it")
        segment = self._segments[-1] if self._segments else None
        if segment is None or (segment.offsets and segment.end + RECORD_HEAD_BYTES + length > self.segment_size_bytes):
            segment = self._roll(idx)
        invariant(segment.next_index == idx, "the active segment does not end before the new entry")
        offset = segment.end
        self._write(segment.fd, (encode_record_head(command, idx, term, self._manifest.epoch, self._durable_index),
                                 command), offset)
        segment.offsets.append(offset)
        segment.end = offset + RECORD_HEAD_BYTES + length
        with self._lock:
            self._last_index = idx
            self._written_index = idx
            if not segment.unsynced:
                segment.unsynced = True
                self._unsynced_segments.append(segment)
            self.unsynced = True
        entry = (command, idx, term)
        if not self._cache:
            self._cache_first = idx
        self._cache.append(entry)
        self._cache_bytes += length
        if self._cache_bytes > self.cache_bytes_max or len(self._cache) > self.cache_entries_max:
            self._evict()

    def clear(self) -> None:
        """Drop every entry (pysyncobj installs a snapshot next). Atomic: a new manifest (next epoch, no first
        index) makes every existing segment a leftover, then they are deleted."""
        invariant(not self._closed, "the journal is closed")
        with self._sync_lock:
            epoch = self._next_epoch()
            self._store_manifest(dataclasses.replace(self._manifest, epoch=epoch, clear_epoch=epoch,
                                                     first_index=None, limit_index=None), "clearing")
            self._remove_segments(list(self._segments), "clearing")
            with self._lock:
                self._first_index, self._last_index = 0, -1
                self._written_index = self._durable_index = 0
            self._cache, self._cache_first, self._cache_bytes = [], 0, 0
            self._first_entry = None

    def deleteEntriesFrom(self, entryFrom: int) -> None:  # pysyncobj's names
        """Drop the entries from position ``entryFrom`` on (a conflict with a new leader). Atomic: a new manifest
        (next epoch, limit = the last index kept) makes the cut happen at recovery if a crash interrupts the
        deletion of later segments and the truncation of the one that keeps the last entry."""
        invariant(not self._closed, "the journal is closed")
        start = slice(entryFrom, None).indices(len(self))[0]
        if start >= len(self):
            return
        if start == 0:
            self.clear()
            return
        cut_index = self._first_index + start  # the first index dropped
        with self._sync_lock:
            epoch = self._next_epoch()
            self._store_manifest(dataclasses.replace(self._manifest, epoch=epoch, limit_index=cut_index - 1),
                                 "truncating")
            later = [segment for segment in self._segments if segment.first_index >= cut_index]
            self._remove_segments(later, "truncating")
            segment = self._segments[-1]
            kept = cut_index - segment.first_index
            if kept < len(segment.offsets):
                end = segment.offsets[kept]
                try:
                    os.ftruncate(segment.fd, end)
                    os.fdatasync(segment.fd)
                except OSError as exc:
                    stop_on_sync_error("truncating the Raft journal", exc)
                del segment.offsets[kept:]
                segment.end = end
            with self._lock:
                self._last_index = cut_index - 1
                self._written_index = min(self._written_index, cut_index - 1)
                self._durable_index = min(self._durable_index, cut_index - 1)
            kept = cut_index - self._cache_first
            if kept > 0:
                self._cache_bytes -= sum(len(command) for command, _, _ in self._cache[kept:])
                del self._cache[kept:]
            else:  # the cache held only dropped entries: the last one kept is read back (it is often wanted)
                self._cache, self._cache_first, self._cache_bytes = [], cut_index, 0
                last = self._read_range(cut_index - 1, cut_index)[0]
                self._cache, self._cache_first, self._cache_bytes = [last], cut_index - 1, len(last[0])

    def deleteEntriesTo(self, entryTo: int) -> None:  # pysyncobj's names
        """Drop the entries before position ``entryTo`` (log compaction, once the snapshot is durable). Atomic: a
        new manifest names the new first index, then the segments wholly below it are deleted; its cost does
        not grow with the entries held. A segment partly below stays (recovery ignores what is below)."""
        invariant(not self._closed, "the journal is closed")
        start = slice(entryTo, None).indices(len(self))[0]
        if start == 0:
            return
        first = self._first_index + start
        with self._sync_lock:
            self._store_manifest(dataclasses.replace(self._manifest, first_index=first), "compacting")
            below = [segment for position, segment in enumerate(self._segments[:-1])
                     if self._segments[position + 1].first_index <= first]
            self._remove_segments(below, "compacting")
            with self._lock:
                self._first_index = first
            self._first_entry = None
            if self._cache_first < first:
                dropped = min(first - self._cache_first, len(self._cache))
                self._cache_bytes -= sum(len(command) for command, _, _ in self._cache[:dropped])
                del self._cache[:dropped]
                self._cache_first += dropped

    @overload
    def __getitem__(self, item: int) -> LogEntry: ...

    @overload
    def __getitem__(self, item: slice) -> list[LogEntry]: ...

    def __getitem__(self, item: int | slice) -> LogEntry | list[LogEntry]:
        count = self._last_index - self._first_index + 1
        if isinstance(item, slice):
            positions = range(count)[item]
            if positions.step == 1:
                return self._read_range(self._first_index + positions.start, self._first_index + positions.stop)
            return [self[position] for position in positions]
        position = item + count if item < 0 else item
        if not 0 <= position < count:
            raise IndexError("journal position out of range")
        index = self._first_index + position
        if index >= self._cache_first:
            return self._cache[index - self._cache_first]
        if position == 0:
            if self._first_entry is None:
                self._first_entry = self._read_range(index, index + 1)[0]
            return self._first_entry
        return self._read_range(index, index + 1)[0]

    def __len__(self) -> int:
        return self._last_index - self._first_index + 1

    def __iter__(self) -> Iterator[LogEntry]:
        for position in range(len(self)):
            yield self[position]

    def _destroy(self) -> None:  # pysyncobj's name: on SyncObj.destroy
        self.close()

    def setRaftCommitIndex(self, raftCommitIndex: int) -> None:  # pysyncobj's names
        """Remembered; stored with the next term change or by onOneSecondTimer (pysyncobj calls this often)."""
        self._commit_index = raftCommitIndex

    def getRaftCommitIndex(self) -> int:  # pysyncobj's name
        return self._commit_index

    def setCurrentTerm(self, term: int, votedForNodeId: str | None) -> None:  # pysyncobj's names
        """Durable before it returns: pysyncobj sends the vote (or the request for votes) right after."""
        invariant(votedForNodeId is None or isinstance(votedForNodeId, str), "a vote names a node id string")
        self._term, self._voted_for = term, votedForNodeId
        self._store_meta(required=True)

    def getCurrentTerm(self) -> int:  # pysyncobj's name
        return self._term

    def getVotedForNodeId(self) -> str | None:  # pysyncobj's name
        return self._voted_for

    def onOneSecondTimer(self) -> None:  # pysyncobj's name
        """Store the commit index and the durable watermark if they moved (as pysyncobj's FileJournal does)."""
        stored = self._stored_meta
        if (stored is None or stored.commit_index != self._commit_index or stored.durable_index != self._durable_index
                or stored.epoch != self._manifest.epoch):
            self._store_meta(required=False)

    # ------------------------------------------------------------------ durability

    @property
    def durable_index(self) -> int:
        """The highest index known to be on disk (any thread). It only moves back when entries are cut."""
        return self._durable_index

    @property
    def last_index(self) -> int:
        """The last index held (first index - 1 when empty; any thread)."""
        return self._last_index

    @property
    def first_index(self) -> int:
        return self._first_index

    def make_durable(self) -> None:
        """fdatasync every segment written since the last call, and the directory if a segment was created:
        then every entry added before the call is on disk (``durable_index``). May run on another thread
        than ``add``, at the same time. A failed fdatasync stops the process (never retried)."""
        if not self.sync_enabled:
            return
        with self._sync_lock:
            self._make_durable_locked()

    def make_durable_unless_busy(self) -> bool:
        """:meth:`make_durable` on the calling thread, unless a flush is running on another thread: then
        False at once (that flush, or the next, covers what was added)."""
        if not self.sync_enabled:
            return True
        if not self._sync_lock.acquire(blocking=False):
            return False
        try:
            self._make_durable_locked()
        finally:
            self._sync_lock.release()
        return True

    def _make_durable_locked(self) -> None:
        """The body of :meth:`make_durable`, with ``_sync_lock`` held."""
        if self._closed:
            return
        with self._lock:
            if not self._unsynced_segments and not self._directory_unsynced:
                return
            segments, self._unsynced_segments = self._unsynced_segments, []
            for segment in segments:
                segment.unsynced = False
            directory, self._directory_unsynced = self._directory_unsynced, False
            target = self._written_index
        try:
            for segment in segments:
                os.fdatasync(segment.fd)
                self.syncs += 1
            if directory:
                os.fsync(self._directory_fd)
        except OSError as exc:
            stop_on_sync_error("making the Raft journal durable", exc)
        with self._lock:
            self._durable_index = max(self._durable_index, target)
            self.unsynced = bool(self._unsynced_segments)

    def get_entries(self, from_index: int | None, count: int | None = None,
                    size_max_bytes: int | None = None) -> list[LogEntry]:
        """pysyncobj's ``SyncObj.__getEntries`` without reading past what it returns: pysyncobj slices the
        journal to its end and then keeps entries up to ``size_max_bytes`` (the first entry that reaches it
        included), which for a lagging follower would read the whole journal from disk on every send."""
        if from_index is None or from_index < self._first_index or from_index > self._last_index:
            return []
        stop = self._last_index + 1 if count is None else min(self._last_index + 1, from_index + count)
        if size_max_bytes is not None:
            total = 0
            for index in range(from_index, stop):
                total += self._entry_length(index)
                if total >= size_max_bytes:
                    stop = index + 1
                    break
        return self._read_range(from_index, stop)

    def clear_damage(self) -> None:
        """The member re-fetched its log (committed by a leader up to ``refetch_index``): forget the damage."""
        with self._sync_lock:
            self._store_manifest(dataclasses.replace(self._manifest, damage=None, damaged_after_index=0,
                                                     refetch_index=0), "clearing the damage record of")
            self.damage = self.damaged_after_index = self.refetch_index = None

    def close(self) -> None:
        """Store the meta if it moved, make everything durable (whatever the policy, as pysyncobj flushed its
        journal when it stopped), close the files. Idempotent."""
        if self._closed:
            return
        self.onOneSecondTimer()
        enabled, self.sync_enabled = self.sync_enabled, True
        self.make_durable()
        self.sync_enabled = enabled
        self.abandon()

    def abandon(self) -> None:
        """Close the files without writing anything (what a killed process leaves; tests)."""
        with self._sync_lock:
            if self._closed:
                return
            self._closed = True
            for segment in self._segments:
                os.close(segment.fd)
            if self._directory_fd >= 0:
                os.close(self._directory_fd)

    # ------------------------------------------------------------------ writes

    def _write(self, fd: int, parts: Sequence[bytes], offset: int) -> None:
        """Write ``parts`` at ``offset``; on a full disk cut back what was written and raise DiskFullError."""
        total = sum(len(part) for part in parts)
        try:
            written = os.pwritev(fd, parts, offset)
            if written < total:  # short writes of a regular file are rare: finish one piece at a time
                data = memoryview(b"".join(parts))
                while written < total:
                    written += os.pwrite(fd, data[written:], offset + written)
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                with contextlib.suppress(OSError):  # else a torn record past the end: written over, or cut
                    os.ftruncate(fd, offset)
                raise DiskFullError("no space left for the Raft journal") from exc
            stop_on_sync_error("writing the Raft journal", exc)

    def _roll(self, first_index: int) -> _Segment:
        """Create the next segment, named by its first index. Its directory entry is made durable by the next
        make_durable (with its records)."""
        path = self.directory / segment_name(first_index)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise DiskFullError(f"no space to create {path}") from exc
            raise StoreError(f"cannot create {path}: {exc.strerror}") from exc
        try:
            self._write(fd, (encode_segment_header(SegmentHeader(self._manifest.epoch, first_index,
                                                                 self._durable_index)),), 0)
        except DiskFullError:
            os.close(fd)
            path.unlink(missing_ok=True)
            raise
        segment = _Segment(path, fd, first_index, array("Q"), SEGMENT_HEADER_BYTES)
        with self._lock:
            self._segments.append(segment)
            self._segment_firsts.append(first_index)
            self._directory_unsynced = True
            segment.unsynced = True
            self._unsynced_segments.append(segment)
        return segment

    def _start_at(self, index: int) -> None:
        """The first entry after a clear: the manifest names it before its segment exists, so a segment found
        without a first index in the manifest is damage, and a missing first segment is seen."""
        self._store_manifest(dataclasses.replace(self._manifest, first_index=index), "starting")
        with self._lock:
            self._first_index, self._last_index = index, index - 1
        self._cache_first = index

    def _next_epoch(self) -> int:
        epoch = self._manifest.epoch + 1
        invariant(epoch <= EPOCH_MAX, "journal epoch overflow")
        return epoch

    def _store_manifest(self, manifest: Manifest, what: str) -> None:
        """Replace the manifest atomically. A full disk raises DiskFullError (nothing changed: every caller
        writes the manifest before it touches anything else); any other failure stops the process."""
        try:
            atomic_write(self.directory / MANIFEST_NAME, encode_manifest(manifest))
        except DiskFullError:
            raise
        except OSError as exc:
            stop_on_sync_error(f"{what} the Raft journal (manifest)", exc)
        self._manifest = manifest

    def _store_meta(self, required: bool) -> None:
        meta = Meta(term=self._term, voted_for=self._voted_for, commit_index=self._commit_index,
                    epoch=self._manifest.epoch, durable_index=self._durable_index)
        try:
            atomic_write(self.directory / META_NAME, encode_meta(meta))
        except DiskFullError as exc:
            if required:  # a vote that cannot be stored must not be sent
                stop_on_sync_error("storing the Raft term and vote", exc)
            log.warning("no space to store the Raft commit index: tried again in a second")
            return
        except OSError as exc:
            stop_on_sync_error("storing the Raft term and vote", exc)
        self._stored_meta = meta

    def _remove_segments(self, segments: list[_Segment], what: str) -> None:
        """Close and delete ``segments`` (oldest first, or newest first when they are the tail: a crash leaves
        a chain either way), then make the directory durable. Called under the sync lock."""
        if not segments:
            return
        tail = segments[-1] is self._segments[-1]
        with self._lock:
            removed = {id(segment) for segment in segments}
            self._segments = [segment for segment in self._segments if id(segment) not in removed]
            self._segment_firsts = [segment.first_index for segment in self._segments]
            self._unsynced_segments = [segment for segment in self._unsynced_segments if id(segment) not in removed]
        for segment in reversed(segments) if tail else segments:
            os.close(segment.fd)
            try:
                reaper.unlink(segment.path)
            except OSError as exc:
                stop_on_sync_error(f"{what} the Raft journal (deleting {segment.path.name})", exc)
        try:
            os.fsync(self._directory_fd)
        except OSError as exc:
            stop_on_sync_error(f"{what} the Raft journal (directory)", exc)

    def _evict(self) -> None:
        """Drop the oldest cached entries down to three quarters of the limits (one list move per batch),
        keeping the last entry."""
        bytes_goal, entries_goal = self.cache_bytes_max * 3 // 4, self.cache_entries_max * 3 // 4
        dropped = 0
        total = self._cache_bytes
        while dropped < len(self._cache) - 1 and (total > bytes_goal or len(self._cache) - dropped > entries_goal):
            total -= len(self._cache[dropped][0])
            dropped += 1
        del self._cache[:dropped]
        self._cache_first += dropped
        self._cache_bytes = total

    # ------------------------------------------------------------------ reads

    def _entry_length(self, index: int) -> int:
        if index >= self._cache_first:
            return len(self._cache[index - self._cache_first][0])
        segment = self._segment_of(index)
        position = index - segment.first_index
        return segment.record_end(position) - segment.offsets[position] - RECORD_HEAD_BYTES

    def _segment_of(self, index: int) -> _Segment:
        return self._segments[bisect.bisect_right(self._segment_firsts, index) - 1]

    def _read_range(self, start: int, stop: int) -> list[LogEntry]:
        """Entries [start, stop) (indexes, all held): cached ones as they are, the others read from their
        segments in windows of about READ_WINDOW_BYTES and checked against their crc."""
        entries: list[LogEntry] = []
        index = start
        while index < min(stop, self._cache_first):
            segment = self._segment_of(index)
            first = position = index - segment.first_index
            last = min(min(stop, self._cache_first) - segment.first_index, len(segment.offsets))
            window_start = segment.offsets[position]
            while position < last and (position == first
                                         or segment.record_end(position) - window_start <= READ_WINDOW_BYTES):
                position += 1
            data = self._pread(segment, window_start, segment.record_end(position - 1) - window_start)
            offset = 0
            for expected in range(index, segment.first_index + position):
                record = record_at(data, offset)
                if record is None or record[1] != expected:
                    raise CorruptionError(f"journal entry {expected} in {segment.path} fails its check on reading")
                length, _, term, _, _ = record
                entries.append((data[offset + RECORD_HEAD_BYTES:offset + RECORD_HEAD_BYTES + length], expected,
                                term))
                offset += RECORD_HEAD_BYTES + length
            index = segment.first_index + position
        if index < stop:
            entries.extend(self._cache[index - self._cache_first:stop - self._cache_first])
        return entries

    @staticmethod
    def _pread(segment: _Segment, offset: int, size: int) -> bytes:
        data = os.pread(segment.fd, size, offset)
        while len(data) < size:
            more = os.pread(segment.fd, size - len(data), offset + len(data))
            if not more:
                raise CorruptionError(f"{segment.path} ends before its record at {offset + len(data)}")
            data += more
        return data

    # ------------------------------------------------------------------ open, create, migrate, recover

    def _open(self, legacy_journal: Path | None) -> None:
        self.directory.parent.mkdir(parents=True, exist_ok=True)
        if not self.directory.exists():
            if legacy_journal is not None and legacy_journal.exists():
                _migrate(legacy_journal, self.directory, self.segment_size_bytes)
            else:
                _create_directory(self.directory, Manifest(epoch=1, clear_epoch=1))
        self._directory_fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            self._recover()
        except BaseException:
            self.abandon()
            raise
        if legacy_journal is not None and self._manifest.migrated:
            for leftover in (legacy_journal, legacy_journal.with_name(legacy_journal.name + ".meta")):
                if leftover.exists():  # the rename of the new journal was durable, the removal was not
                    log.info("removing %s: its entries are in %s", leftover, self.directory)
                    reaper.unlink(leftover)
                    fsync_directory(leftover.parent)

    def _recover(self) -> None:
        """Read the manifest and the meta file, scan the segments, keep the longest valid chain, record damage
        (before cutting anything), cut the rest, and make what stays durable. Each rule is commented."""
        damage: list[str] = []
        manifest = self._read_manifest(damage)
        meta, meta_missing = self._read_meta(damage)
        files = self._find_segment_files()
        rewrite_manifest = False
        if manifest is None:
            # rebuild what we can; the member re-fetches anyway (the damage is recorded below)
            manifest = Manifest(epoch=max((file.header.epoch for file in files if file.header is not None),
                                          default=0), clear_epoch=0)
            rewrite_manifest = True
        # segments of an epoch before the last clear: that clear was interrupted before it deleted them
        current: list[_SegmentFile] = []
        for file in files:
            if file.header is not None and file.header.epoch < manifest.clear_epoch:
                log.info("removing %s: left over from a clear of the Raft journal", file.path.name)
                self._unlink(file.path)
            else:
                current.append(file)
        first = manifest.first_index
        if first is None and current and not rewrite_manifest:
            damage.append("segments exist that the manifest does not know (no first index)")
        if first is not None:
            # segments wholly below the first index: a compaction was interrupted before it deleted them
            while len(current) > 1 and current[1].first_index <= first:
                log.info("removing %s: left over from a compaction of the Raft journal", current[0].path.name)
                self._unlink(current.pop(0).path)
        start = first if first is not None else (current[0].first_index if current else None)

        # the chain: each segment starts where the one before ended, each record follows the one before
        limit = (manifest.limit_index, manifest.epoch) if manifest.limit_index is not None else None
        if current and (first is None or current[0].first_index <= first):
            expected = current[0].first_index
        else:
            expected = start if start is not None else 0
        last_term, last_epoch = 0, manifest.clear_epoch
        scans: list[ScanResult] = []
        cut: tuple[int, int | None, str] | None = None  # (segment position, offset or None: whole, why)
        for position, file in enumerate(current):
            if file.first_index != expected:  # a segment missing, or one that overlaps the one before
                cut = (position, None, STOP_MISPLACED if file.first_index < expected else STOP_GAP)
                break
            header = file.header
            if header is None:
                cut = (position, None, STOP_INVALID)
                break
            if header.first_index != file.first_index or header.epoch > manifest.epoch:
                cut = (position, None, STOP_MISPLACED)
                break
            scan = scan_records(file.read(), SEGMENT_HEADER_BYTES, expected, last_term, last_epoch,
                                manifest.epoch, limit)
            scans.append(scan)
            expected, last_term, last_epoch = scan.next_index, scan.last_term, scan.last_epoch
            if scan.stop is not None:
                cut = (position, scan.end, scan.stop)
                break
        held_first = start if start is not None else expected
        # the chain ends below the first index: nothing held is left, the journal starts again at ``start``
        remove_all = start is not None and expected < start
        if remove_all and cut is None:
            cut = (0, None, STOP_LIMIT)  # what was lost had been compacted: not damage
        highest_seen = expected - 1

        if cut is not None:
            position, offset, why = cut
            lost = max(expected, held_first)  # the first entry held that the cut loses
            name = current[position].path.name if current else "-"
            if why == STOP_MISPLACED:
                damage.append(f"entry {expected} in {name} does not follow the entry before it")
            if why in (STOP_INVALID, STOP_GAP, STOP_MISPLACED) and current:
                proven, seen = self._evidence(current[position:], offset, lost, meta, manifest)
                highest_seen = max(highest_seen, seen)
                if proven and why != STOP_MISPLACED:
                    damage.append(f"entry {lost} ({name}) had been on disk and is now "
                                  + ("missing" if why == STOP_GAP else "invalid"))
                elif why != STOP_MISPLACED:
                    log.warning("cutting a torn tail of the Raft journal at entry %d (%s, %s): it was never "
                                "made durable", expected, name,
                                "whole segment" if offset is None else f"from offset {offset}")
            elif why == STOP_LIMIT and not remove_all:
                log.info("completing a truncation of the Raft journal after entry %d", expected - 1)
        if meta_missing and last_term > 0:
            damage.append("the meta file (term and vote) is missing")
        elif meta is not None and meta.term < last_term:
            # the term is stored (durably) before any entry of it is written here: an older one was rolled
            # back, and the vote of a later term may be forgotten with it (a second vote in one term)
            damage.append(f"the meta file's term {meta.term} is older than the log's last term {last_term}")

        if damage or manifest.damage is not None:
            after = max(expected, held_first, 1) - 1
            watermark = meta.durable_index if meta is not None and meta.epoch == manifest.epoch else 0
            refetch = max(highest_seen, after, watermark)
            if manifest.damage is not None:  # found at an earlier open, or by the import
                after = min(after, manifest.damaged_after_index)
                refetch = max(refetch, manifest.refetch_index)
                damage.insert(0, manifest.damage)
            if len(damage) > 1 or manifest.damage is None:
                manifest = dataclasses.replace(manifest, damage="; ".join(damage), damaged_after_index=after,
                                               refetch_index=refetch)
                rewrite_manifest = True
            self.damage, self.damaged_after_index, self.refetch_index = manifest.damage, after, refetch
            log.critical("the Raft journal is damaged: %s (kept up to entry %d; must re-fetch up to %d)",
                         manifest.damage, after, refetch)

        # which segments stay: all scanned ones, less those the cut empties
        kept_files = len(scans)
        if cut is not None:
            position, offset, _ = cut
            if remove_all:
                kept_files = 0
            elif offset is None or not scans[position].offsets:
                kept_files = position
        if first is None and kept_files > 0:
            manifest = dataclasses.replace(manifest, first_index=held_first)
            rewrite_manifest = True
        if rewrite_manifest:
            self._store_manifest(manifest, "recovering")  # before anything is cut: the damage is not forgotten
        self._manifest = manifest

        # cut: later segments first (newest first), then the segment holding the last entry kept
        for file in reversed(current[kept_files:]):
            log.info("removing %s from the Raft journal", file.path.name)
            self._unlink(file.path)
        # what stays is made durable now: after a crash it may have been in the page cache only
        for position, (file, scan) in enumerate(zip(current[:kept_files], scans, strict=False)):
            fd = os.open(file.path, os.O_RDWR | os.O_CLOEXEC)
            self._segments.append(_Segment(file.path, fd, file.first_index, scan.offsets, scan.end))
            self._segment_firsts.append(file.first_index)
            try:
                if cut is not None and cut[0] == position:
                    os.ftruncate(fd, scan.end)
                os.fdatasync(fd)
            except OSError as exc:
                stop_on_sync_error("recovering the Raft journal", exc)
        try:
            os.fsync(self._directory_fd)
        except OSError as exc:
            stop_on_sync_error("recovering the Raft journal (directory)", exc)

        if remove_all or kept_files > 0:
            self._first_index = held_first
            self._last_index = held_first - 1 if remove_all else max(expected - 1, held_first - 1)
        elif manifest.first_index is not None:
            self._first_index, self._last_index = manifest.first_index, manifest.first_index - 1
        self._written_index = self._durable_index = max(self._last_index, 0)
        self._cache_first = self._last_index + 1  # empty: what follows reads from the segments
        if len(self) > 0:
            last = self._read_range(self._last_index, self._last_index + 1)[0]
            self._cache, self._cache_first, self._cache_bytes = [last], self._last_index, len(last[0])
        if meta is not None:
            self._term, self._voted_for, self._commit_index = meta.term, meta.voted_for, meta.commit_index
            self._stored_meta = meta

    def _evidence(self, files: list[_SegmentFile], offset: int | None, lost: int, meta: Meta | None,
                  manifest: Manifest) -> tuple[bool, int]:
        """Whether entry ``lost`` had been on disk (so losing it is damage), and the highest index seen on disk
        past the cut: the meta watermark, and the stamps of valid records and segment headers past the cut
        (``files[0]`` from ``offset``, or whole when ``offset`` is None)."""
        proven = meta is not None and meta.epoch == manifest.epoch and meta.durable_index >= lost
        highest = 0
        for number, file in enumerate(files):
            whole = number > 0 or offset is None
            if whole and file.header is not None:
                proven = proven or file.header.durable_index >= lost
                highest = max(highest, file.header.first_index - 1)
            found, seen = durable_evidence(file.read(), 0 if whole else offset or 0, lost)
            proven, highest = proven or found, max(highest, seen)
        return proven, highest

    def _read_manifest(self, damage: list[str]) -> Manifest | None:
        path = self.directory / MANIFEST_NAME
        try:
            return decode_manifest(path.read_bytes())
        except FileNotFoundError:
            damage.append("the manifest is missing")
        except (OSError, FormatError) as exc:
            damage.append(f"the manifest is unreadable ({exc})")
        return None

    def _read_meta(self, damage: list[str]) -> tuple[Meta | None, bool]:
        """(the meta, whether the file is missing): missing is normal for a journal whose entries all have
        term 0 (checked by the caller); damaged is damage, never "term 0, voted for nobody"."""
        path = self.directory / META_NAME
        try:
            return decode_meta(path.read_bytes()), False
        except FileNotFoundError:
            return None, True
        except (OSError, FormatError, UnicodeDecodeError) as exc:
            damage.append(f"the meta file (term and vote) is unreadable ({exc})")
        return None, False

    def _find_segment_files(self) -> list[_SegmentFile]:
        files: list[_SegmentFile] = []
        for path in sorted(self.directory.iterdir()):
            if path.name.endswith(".tmp"):  # an atomic_write a crash interrupted
                self._unlink(path)
                continue
            match = _SEGMENT_NAME.match(path.name)
            if match is None:
                if path.name not in (MANIFEST_NAME, META_NAME):
                    log.warning("ignoring %s in the Raft journal directory", path.name)
                continue
            with open(path, "rb") as handle:
                head = handle.read(SEGMENT_HEADER_BYTES)
            try:
                header: SegmentHeader | None = decode_segment_header(head)
            except FormatError:
                header = None
            files.append(_SegmentFile(path, int(match.group(1)), header))
        files.sort(key=lambda file: file.first_index)
        return files

    def _unlink(self, path: Path) -> None:
        reaper.unlink(path)
        fsync_directory(self.directory)


def _create_directory(directory: Path, manifest: Manifest) -> None:
    """A new journal directory holding ``manifest``, made under a temporary name and renamed into place: a
    journal directory without a manifest is damage, never a half-made journal."""
    temporary = directory.with_name(directory.name + ".tmp")
    shutil.rmtree(temporary, ignore_errors=True)
    temporary.mkdir()
    atomic_write(temporary / MANIFEST_NAME, encode_manifest(manifest))
    os.replace(temporary, directory)
    fsync_directory(directory.parent)


# pysyncobj's journal file: header (name 24 bytes, version 8, format u32, end of the last record u32), then
# records u32 size | u64 index | u64 term | command | u32 size, little-endian, with size = 16 + command length
_LEGACY_HEADER_BYTES: Final = 40
_LEGACY_END_OFFSET: Final = 36
_LEGACY_HEAD = struct.Struct("<IQQ")
_LEGACY_SIZE = struct.Struct("<I")


def read_legacy_journal(path: Path) -> Iterator[LogEntry]:
    """The entries of pysyncobj's file journal, up to its recorded end, read through a read-only mapping (the
    file can hold up to 4 GiB: one entry is copied at a time). A record that does not hold together ends
    them, with a warning: that journal was never synced, so a torn end is what a power cut left."""
    with open(path, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        if size < _LEGACY_HEADER_BYTES:
            raise CorruptionError(f"{path} is too short for a pysyncobj journal")
        with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
            if data[:9] != b"PYSYNCOBJ":
                raise CorruptionError(f"{path} is not a pysyncobj journal")
            end = min(_LEGACY_SIZE.unpack_from(data, _LEGACY_END_OFFSET)[0], size)
            offset = _LEGACY_HEADER_BYTES
            previous: int | None = None
            while end - offset >= _LEGACY_HEAD.size + _LEGACY_SIZE.size:
                record_size, index, term = _LEGACY_HEAD.unpack_from(data, offset)
                tail = offset + 4 + record_size
                if (record_size < 16 or tail + 4 > end or _LEGACY_SIZE.unpack_from(data, tail)[0] != record_size
                        or (previous is not None and index != previous + 1)):
                    break
                yield data[offset + 4 + 16:tail], index, term
                previous = index
                offset = tail + 4
            if offset < end:
                log.warning("pysyncobj's journal %s holds %d bytes past its last whole record: not imported",
                            path, end - offset)


def _migrate(legacy_journal: Path, directory: Path, segment_size_bytes: int) -> None:
    """Import pysyncobj's journal file and meta file once: the new journal is built under a temporary name,
    made durable and renamed into place, then the old files are removed."""
    temporary = directory.with_name(directory.name + ".import")
    shutil.rmtree(temporary, ignore_errors=True)
    meta_path = legacy_journal.with_name(legacy_journal.name + ".meta")
    meta: dict[str, Any] | None = None
    meta_damage: str | None = None
    if meta_path.exists():
        try:
            loaded = pysyncobj_loads(meta_path.read_bytes())
            if not isinstance(loaded, dict):
                raise TypeError(f"a {type(loaded).__name__}")
            meta = loaded
        except Exception as exc:  # unpickling damaged bytes raises anything
            meta_damage = f"pysyncobj's meta file was unreadable at import ({exc})"
    journal = SegmentedJournal(temporary, segment_size_bytes=segment_size_bytes)
    try:
        count = 0
        try:
            for command, index, term in read_legacy_journal(legacy_journal):
                journal.add(command, index, term)
                count += 1
        except CorruptionError as exc:  # pysyncobj never synced it: a power cut can leave it empty or torn
            meta_damage = f"pysyncobj's journal was unreadable at import after {count} entries ({exc})"
        if meta is not None:
            journal._commit_index = int(meta.get("raftCommitIndex", 1))
            vote = meta.get("votedForNodeId")
            journal.setCurrentTerm(int(meta.get("currentTerm", 0)), None if vote is None else str(vote))
        manifest = dataclasses.replace(journal._manifest, migrated=True)
        if meta_damage is not None:
            held = max(journal.last_index, 0)  # -1 when nothing was imported
            manifest = dataclasses.replace(manifest, damage=meta_damage, damaged_after_index=held,
                                           refetch_index=held)
        with journal._sync_lock:
            journal._store_manifest(manifest, "importing")
        journal.close()
    except BaseException:
        journal.abandon()
        raise
    os.replace(temporary, directory)
    fsync_directory(directory.parent)
    log.info("imported %d entries of pysyncobj's journal %s into %s", count, legacy_journal, directory)
    for old in (legacy_journal, meta_path):
        if old.exists():
            reaper.unlink(old)
    fsync_directory(directory.parent)


@overload
def create_journal(journal_file: str, **options: int) -> SegmentedJournal: ...


@overload
def create_journal(journal_file: None, **options: int) -> Any: ...


def create_journal(journal_file: str | None, **options: int) -> Any:
    """pysyncobj's ``createJournal`` for ``pysyncobj.syncobj``: ``<journal_file>.d`` as a segmented journal
    (pysyncobj's own ``<journal_file>`` and ``.meta`` imported once if they exist), or pysyncobj's memory
    journal without a file. ``options``: SegmentedJournal's ``segment_size_bytes``, ``cache_bytes``,
    ``cache_entries_max``."""
    if journal_file is None:
        return MemoryJournal()
    return SegmentedJournal(Path(journal_file + ".d"), legacy_journal=Path(journal_file), **options)
