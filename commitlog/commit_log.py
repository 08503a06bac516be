"""The commit log: contiguous fixed-size segments named by their 20-digit start offset.

Physical offsets are global; segment ``k`` covers ``[k * segment_size, (k + 1) * segment_size)``. A record
never spans two segments: where it does not fit (keeping :data:`FILLER_HEADER_BYTES` free) a filler record
covers the rest of the segment and the record starts the next one.
"""

from __future__ import annotations

import bisect
import contextlib
import re
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from commitlog.errors import CorruptionError, StoreError
from commitlog.mapped_file import MappedFile, ensure_directory
from commitlog.record_codec import (
    BLANK_MAGIC,
    FILLER,
    FILLER_HEADER_BYTES,
    HEAD_A,
    MESSAGE_MAGIC,
    RecordError,
    StoredMessage,
    decode_record,
)
from commitlog.scrub_walk import SegmentWalk, walk_segment
from protocol.invariant import invariant

SEGMENT_NAME = re.compile(r"^\d{20}$")
#: old segments kept mapped for readers besides the one being written; the rest are unmapped so the
#: process's resident memory does not grow with the data held
MAPPED_READ_SEGMENTS_MAX = 1
#: pages below the flushed end that stay mapped when the rest is released from the resident set
RELEASE_KEEP_BYTES = 1 << 20
RELEASE_STEP_BYTES = 16 << 20
#: flushed bytes dropped from the page cache at a time (see StoreConfig.page_cache_keep_bytes)
DROP_STEP_BYTES = 4 << 20
#: part of a segment to drop from the page cache: (path, start, end) in the segment
CacheDrop = tuple[Path, int, int]


def segment_name(start_offset: int) -> str:
    return f"{start_offset:020d}"


def _made(pending: Future[MappedFile]) -> MappedFile | None:
    """The segment a background allocation made, or None when it failed (waits for it to end)."""
    try:
        return pending.result()
    except Exception:  # its error is the one making it again would give now, if any still holds
        return None


class CommitLog:
    """Segments of one replica's commit log. Not thread-safe: the apply thread owns writes."""

    def __init__(self, directory: Path, segment_size_bytes: int, page_cache_keep_bytes: int = 256 << 20) -> None:
        self.directory = directory
        self.segment_size_bytes = segment_size_bytes
        self.page_cache_keep_bytes = page_cache_keep_bytes
        #: offsets below this were dropped from the page cache (or never written since the store opened)
        self._dropped_end = 0
        ensure_directory(directory)
        self.segments: dict[int, MappedFile] = {}
        self.starts: list[int] = []
        for path in sorted(directory.iterdir()):
            if not SEGMENT_NAME.match(path.name):
                continue
            start = int(path.name)
            if start % segment_size_bytes:
                raise CorruptionError(f"segment {path} does not start at a multiple of the segment size")
            size = path.stat().st_size
            if size != segment_size_bytes:  # segments are preallocated whole: it was cut short (or grown) on disk
                raise CorruptionError(
                    f"commit-log segment {path} has {size} bytes, expected {segment_size_bytes}: it was cut on disk and "
                    "what it held is lost here; wipe this replica's data directory to resync it from the group")
            segment = MappedFile(path, segment_size_bytes, create=False)
            segment.on_remap = self._note_mapped
            self.segments[start] = segment
            self.starts.append(start)
        for previous, current in zip(self.starts, self.starts[1:], strict=False):
            if current != previous + segment_size_bytes:
                raise CorruptionError(f"commit log has a hole between {previous} and {current}")
        #: the end of the data: the next record is written here (set by recovery)
        self.end_offset = self.starts[0] if self.starts else 0
        # RocketMQ's AllocateMappedFileService: the next segment is created (fallocate + populate, both
        # outside the GIL) by a worker while the current one fills, so apply never waits for it.
        self._allocator = ThreadPoolExecutor(max_workers=1, thread_name_prefix="segment-allocator")
        self._allocating: dict[int, Future[MappedFile]] = {}
        self._mapped_for_reading: list[MappedFile] = []
        self._released: dict[int, int] = {}
        for start in self.starts[:-1]:
            self.segments[start].unmap()

    def _note_mapped(self, segment: MappedFile) -> None:
        """An old segment is (again) mapped: keep the MAPPED_READ_SEGMENTS_MAX most recent mapped, never
        the same one twice, and never unmap the one just noted or the one being written."""
        if self.starts and segment is self.segments.get(self.starts[-1]):
            return
        if segment in self._mapped_for_reading:
            self._mapped_for_reading.remove(segment)
        self._mapped_for_reading.append(segment)
        while len(self._mapped_for_reading) > MAPPED_READ_SEGMENTS_MAX:
            self._mapped_for_reading.pop(0).unmap()

    @property
    def min_offset(self) -> int:
        return self.starts[0] if self.starts else self.end_offset

    def segment_start(self, offset: int) -> int:
        return offset - offset % self.segment_size_bytes

    def _create(self, start: int) -> MappedFile:
        return MappedFile(self.directory / segment_name(start), self.segment_size_bytes, create=True)

    def _create_in_background(self, start: int, created: Future[MappedFile]) -> None:
        """Runs on the allocator thread (fallocate of a large file takes a while)."""
        try:
            created.set_result(self._create(start))
        except Exception as exc:
            created.set_exception(exc)

    def preallocate(self, start: int) -> None:
        """Start creating the segment at ``start`` in the background if it does not exist yet."""
        if start not in self.segments and start not in self._allocating:
            created: Future[MappedFile] = Future()
            self._allocator.submit(self._create_in_background, start, created)
            self._allocating[start] = created

    def ensure_segment(self, start: int) -> MappedFile:
        """The segment starting at ``start``, created (preallocated) when missing. May raise DiskFullError.
        Starts creating the following segment in the background."""
        segment = self.segments.get(start)
        if segment is None:
            invariant(start % self.segment_size_bytes == 0, "segment start must be aligned")
            invariant(not self.starts or start == self.starts[-1] + self.segment_size_bytes,
                      "segments are created in order")
            pending = self._allocating.pop(start, None)
            made = _made(pending) if pending is not None else None
            # a background attempt that failed (the disk was full then) is made again now: space may be back
            segment = made if made is not None else self._create(start)
            segment.on_remap = self._note_mapped
            previous = self.segments[self.starts[-1]] if self.starts else None
            self.segments[start] = segment
            self.starts.append(start)
            if previous is not None:
                self._note_mapped(previous)  # still mapped for its filler and readers; unmapped when old
        self.preallocate(start + self.segment_size_bytes)
        return segment

    def _cancel_allocations(self) -> None:
        """Wait for background allocations and delete what they made (the data never reached it)."""
        for pending in self._allocating.values():
            # a failed preallocation (disk full) left nothing to delete
            with contextlib.suppress(StoreError):
                pending.result().delete()
        self._allocating.clear()

    def release_flushed(self, end: int) -> list[CacheDrop]:
        """Drop pages of the segment being written below ``end`` (flushed) from the resident set; and the
        page-cache drops the caller makes (outside its lock: each is a syscall of its own) for flushed data
        more than ``page_cache_keep_bytes`` below ``end``."""
        if not self.starts:
            return []
        start = self.starts[-1]
        released = self._released.get(start, 0)
        local_end = max(0, min(end - start, self.segment_size_bytes) - RELEASE_KEEP_BYTES)
        if local_end - released >= RELEASE_STEP_BYTES:
            self.segments[start].release_pages(released, local_end)
            self._released[start] = local_end
        return self._cache_drops(end - self.page_cache_keep_bytes)

    def _cache_drops(self, end: int) -> list[CacheDrop]:
        begin = max(self._dropped_end, self.min_offset)
        if end - begin < DROP_STEP_BYTES:
            return []
        drops = []
        size = self.segment_size_bytes
        for start in self.starts[max(0, bisect.bisect_right(self.starts, begin) - 1):]:
            if start >= end:
                break
            local_start, local_end = max(begin, start) - start, min(end, start + size) - start
            if local_end > local_start:
                drops.append((self.segments[start].path, local_start, local_end))
        self._dropped_end = end
        return drops

    def write(self, offset: int, data: bytes | bytearray | memoryview) -> None:
        """Write bytes that lie inside one existing segment. Written with pwrite, not through the mapping:
        on a machine whose page cache writes back at once, mapped writes kept faulting on pages cleaned
        and write-protected by writeback (mapped writes were markedly slower than pwrite, and slowed further
        as data accumulated). Readers use the mapping; Linux's unified page cache keeps the two coherent."""
        start = self.segment_start(offset)
        segment = self.segments[start]
        local = offset - start
        invariant(local + len(data) <= self.segment_size_bytes, "write crosses a segment end")
        segment.pwrite(local, data)

    def write_filler(self, offset: int) -> None:
        start = self.segment_start(offset)
        remaining = start + self.segment_size_bytes - offset
        invariant(remaining >= FILLER_HEADER_BYTES, "no room for a filler record")
        self.segments[start].pwrite(offset - start, FILLER.pack(remaining, BLANK_MAGIC))

    def read(self, offset: int, size: int) -> bytes:
        """``size`` bytes at ``offset`` (inside one segment). KeyError/IndexError-free: StoreError if absent."""
        start = self.segment_start(offset)
        segment = self.segments.get(start)
        local = offset - start
        if segment is None or size < 0 or local + size > self.segment_size_bytes or offset + size > self.end_offset:
            raise StoreError(f"no data at physical offset {offset} size {size}")
        return segment.map[local : local + size]

    def record_size_at(self, offset: int) -> int:
        """totalSize of the message record at ``offset``; StoreError when there is none."""
        head = self.read(offset, 8)
        size, magic = FILLER.unpack(head)
        if magic != MESSAGE_MAGIC or size <= HEAD_A.size:
            raise StoreError(f"no message record at physical offset {offset}")
        return int(size)

    def read_message(self, offset: int, check_crc: bool = True) -> StoredMessage:
        size = self.record_size_at(offset)
        try:
            return decode_record(self.read(offset, size), 0, check_crc)
        except RecordError as exc:
            raise CorruptionError(f"record at {offset}: {exc}") from exc

    def scan(self, start: int, stop: int) -> Iterator[StoredMessage]:
        """Validate and yield records from ``start`` until ``stop``, the first invalid record, or a zero.

        After it finishes, :attr:`scan_end` is the offset just past the last valid record (or filler). (The
        scrubber validates through :meth:`walk` instead, which makes no StoredMessage; this per-record
        validation is what its tests hold it to.)
        """
        offset = start
        self.scan_end = start
        while offset < stop:
            segment_start = self.segment_start(offset)
            segment = self.segments.get(segment_start)
            if segment is None:
                return
            local = offset - segment_start
            if local + FILLER_HEADER_BYTES > self.segment_size_bytes:
                return
            size, magic = FILLER.unpack_from(segment.map, local)
            if magic == BLANK_MAGIC:
                if size != self.segment_size_bytes - local:
                    return
                offset = segment_start + self.segment_size_bytes
                self.scan_end = offset
                continue
            if magic != MESSAGE_MAGIC or size <= 0 or local + size + FILLER_HEADER_BYTES > self.segment_size_bytes:
                return
            try:
                message = decode_record(segment.map[local : local + size], 0, check_crc=True)
            except RecordError:
                return
            if message.physical_offset != offset:
                return
            offset += size
            self.scan_end = offset
            yield message

    def walk(self, start: int, stop: int, tag_codes: dict[bytes, int]) -> tuple[int, list[SegmentWalk]]:
        """:meth:`scan`'s validation from ``start`` until ``stop``, the first invalid record or a zero, through
        the scrubber's record walk (:mod:`commitlog.scrub_walk`): (the offset just past the last valid record
        or filler, what each segment's walk found)."""
        offset = start
        walks: list[SegmentWalk] = []
        while offset < stop:
            segment_start = self.segment_start(offset)
            segment = self.segments.get(segment_start)
            if segment is None:
                break
            walked = walk_segment(segment.map, segment_start, offset - segment_start,
                                  min(stop - segment_start, self.segment_size_bytes), tag_codes)
            walks.append(walked)
            offset = segment_start + walked.end
            if walked.end < self.segment_size_bytes:
                break  # at stop, or at what is not a valid record (a filler takes the walk to the segment's end)
        return offset, walks

    def truncate(self, end_offset: int) -> None:
        """Forget data from ``end_offset`` on: later segments are deleted, the tail of its segment zeroed
        up to the old end so that no stale record lies behind the new end."""
        self._cancel_allocations()
        for start in list(self.starts):
            if start > end_offset or (start == end_offset and start > self.min_offset):
                self.segments.pop(start).delete()
                self.starts.remove(start)
        start = self.segment_start(end_offset)
        segment = self.segments.get(start)
        if segment is not None:
            local = end_offset - start
            stale_end = min(self.segment_size_bytes, max(local, self.end_offset - start))
            if stale_end > local:
                segment.pwrite(local, bytes(stale_end - local))
        self.end_offset = end_offset
        self._dropped_end = min(self._dropped_end, end_offset)

    def delete_below(self, offset: int) -> list[int]:
        """Delete whole segments that end at or below ``offset``, never the one holding the end."""
        deleted = []
        while self.starts and self.starts[0] + self.segment_size_bytes <= min(offset, self.end_offset):
            if self.starts[0] == self.segment_start(self.end_offset):
                break
            start = self.starts.pop(0)
            self.segments.pop(start).delete()
            deleted.append(start)
        return deleted

    def flush(self, start: int, end: int) -> None:
        """msync [start, end) across segments."""
        if end <= start:
            return
        first = bisect.bisect_right(self.starts, start) - 1
        for segment_start in self.starts[max(first, 0):]:
            if segment_start >= end:
                break
            segment = self.segments[segment_start]
            low = max(start, segment_start) - segment_start
            high = min(end, segment_start + self.segment_size_bytes) - segment_start
            segment.flush(low, high)

    def paths_between(self, start: int, end: int) -> list[Path]:
        """The files of the segments that hold bytes of [start, end)."""
        start = max(start, self.min_offset)
        if end <= start:
            return []
        first, last = self.segment_start(start), self.segment_start(end - 1)
        return [self.segments[s].path for s in self.starts if first <= s <= last]

    def close(self) -> None:
        self._cancel_allocations()
        self._allocator.shutdown(wait=True)
        for segment in self.segments.values():
            segment.close()
