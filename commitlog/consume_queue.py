"""Consume queues: per topic and queue, 20-byte units ``commitLogOffset i64 | size i32 | tagsHashCode i64``.

A unit lives at byte ``queue_offset * 20`` of the queue's logical space, split into files of
``units_per_file`` units named by their 20-digit start byte offset (RocketMQ's layout). Writes are
positional, so dispatching the same record twice writes the same bytes: rebuilding is idempotent. A unit
with size 0 is empty; the first empty unit after the last file's start marks the queue's end.
"""

from __future__ import annotations

import logging
import re
import struct
from pathlib import Path
from typing import Final

from commitlog.errors import CorruptionError
from commitlog.mapped_file import MappedFile, ensure_directory
from protocol.invariant import invariant

log = logging.getLogger(__name__)

CQ_UNIT: Final = struct.Struct(">qiq")
invariant(CQ_UNIT.size == 20, "a consume-queue unit is 20 bytes")
UNIT_BYTES: Final = CQ_UNIT.size
FILE_NAME = re.compile(r"^\d{20}$")

Unit = tuple[int, int, int]  # (commit-log offset, size, tags hash code)


class ConsumeQueue:
    """One queue's units. The apply thread writes; readers read units below :attr:`max_offset`."""

    def __init__(self, directory: Path, topic: str, queue_id: int, units_per_file: int) -> None:
        self.directory = directory
        self.topic = topic
        self.queue_id = queue_id
        self.units_per_file = units_per_file
        self.file_bytes = units_per_file * UNIT_BYTES
        ensure_directory(directory)
        self.files: dict[int, MappedFile] = {}  # keyed by first unit index
        for path in sorted(directory.iterdir()):
            if FILE_NAME.match(path.name):
                start_byte = int(path.name)
                if start_byte % self.file_bytes:
                    raise CorruptionError(f"consume-queue file {path} is not aligned to its size")
                size = path.stat().st_size
                if size != self.file_bytes:
                    # cut short on disk: the member refused to start on it. It is derived from the commit log,
                    # and the store's recovery rebuilds a queue that lacks a file the checkpoint counts on
                    log.warning("consume-queue file %s has %d bytes, not %d: deleting it (the queue is rebuilt "
                                "from the commit log)", path, size, self.file_bytes)
                    path.unlink()
                    continue
                self.files[start_byte // UNIT_BYTES] = MappedFile(path, self.file_bytes, create=False)
        self.min_offset = 0
        if self.files:
            first = min(self.files)
            _, size, _ = CQ_UNIT.unpack_from(self.files[first].map, 0)
            self.min_offset = first if size > 0 else first + min(self._first_used_unit(first), self.units_per_file)
        self.max_offset = self._find_end()
        self.min_offset = min(self.min_offset, self.max_offset)
        self._flushed_offset = self.max_offset

    def _first_used_unit(self, file_start: int) -> int:
        """Index (within the file) of its first non-empty unit; a queue that began mid-file (after a
        catch-up from a peer's retention point) has empty units before it. units_per_file if none."""
        raw = self.files[file_start].map[:]
        return (len(raw) - len(raw.lstrip(b"\x00"))) // UNIT_BYTES

    def _find_end(self) -> int:
        """Binary search for the first empty unit after the used run of the last file (units are written
        contiguously from the queue's first unit)."""
        if not self.files:
            return self.min_offset
        last = max(self.files)
        mapped = self.files[last].map
        _, size, _ = CQ_UNIT.unpack_from(mapped, 0)
        low = 0 if size > 0 else self._first_used_unit(last)
        high = self.units_per_file
        while low < high:
            middle = (low + high) // 2
            _, size, _ = CQ_UNIT.unpack_from(mapped, middle * UNIT_BYTES)
            if size > 0:
                low = middle + 1
            else:
                high = middle
        return last + low

    def covers(self, min_offset: int, max_offset: int) -> bool:
        """True when files exist, without a hole, for every unit in [min_offset, max_offset)."""
        if max_offset <= min_offset:
            return True
        needed = range(self.file_start(min_offset), self.file_start(max_offset - 1) + 1, self.units_per_file)
        return self.max_offset >= max_offset and all(start in self.files for start in needed)

    def restore_empty_at(self, offset: int) -> None:
        """An empty queue whose files are gone continues at ``offset`` (from the checkpoint)."""
        invariant(self.max_offset <= offset, "only an emptier queue is moved forward")
        for mapped in self.files.values():
            mapped.delete()
        self.files.clear()
        self.min_offset = self.max_offset = self._flushed_offset = offset

    def file_start(self, queue_offset: int) -> int:
        return queue_offset - queue_offset % self.units_per_file

    def ensure_capacity(self, queue_offset: int, last_offset: int | None = None) -> None:
        """Create the files that will hold units ``queue_offset`` .. ``last_offset`` (default: just the
        first). May raise DiskFullError; writes nothing."""
        last = queue_offset if last_offset is None else last_offset
        for start in range(self.file_start(queue_offset), self.file_start(last) + 1, self.units_per_file):
            if start not in self.files:
                path = self.directory / f"{start * UNIT_BYTES:020d}"
                self.files[start] = MappedFile(path, self.file_bytes, create=True)

    def _start_at_first_unit(self, queue_offset: int) -> None:
        """A queue without units whose first unit comes past its start begins there (rebuilt from, or
        copied from, a commit log whose first segments retention deleted): every offset in its range has a
        file, so searches and reads within [min_offset, max_offset) never look for one that was not made."""
        if self.min_offset == self.max_offset < queue_offset:
            self.min_offset = self.max_offset = queue_offset

    def put(self, queue_offset: int, physical_offset: int, size: int, tags_code: int) -> None:
        self._start_at_first_unit(queue_offset)
        start = self.file_start(queue_offset)
        CQ_UNIT.pack_into(
            self.files[start].map, (queue_offset - start) * UNIT_BYTES, physical_offset, size, tags_code
        )
        if queue_offset >= self.max_offset:
            self.max_offset = queue_offset + 1

    def put_run(self, first_offset: int, units: list[Unit]) -> None:
        """Write consecutive units starting at ``first_offset`` (files ensured), one write per file."""
        self.put_packed(first_offset, b"".join([CQ_UNIT.pack(*unit) for unit in units]))

    def put_packed(self, first_offset: int, packed: bytes) -> None:
        """:meth:`put_run` for units already packed back to back."""
        count = len(packed) // UNIT_BYTES
        self._start_at_first_unit(first_offset)
        position = 0
        while position < count:
            offset = first_offset + position
            start = self.file_start(offset)
            take = min(count - position, start + self.units_per_file - offset)
            local = (offset - start) * UNIT_BYTES
            self.files[start].map[local : local + take * UNIT_BYTES] = (
                packed[position * UNIT_BYTES : (position + take) * UNIT_BYTES])
            position += take
        if first_offset + count > self.max_offset:
            self.max_offset = first_offset + count

    def flush_unit(self, queue_offset: int) -> None:
        """msync the one unit at ``queue_offset`` (a unit put back by the scrubber, below what flush covers)."""
        start = self.file_start(queue_offset)
        local = (queue_offset - start) * UNIT_BYTES
        self.files[start].flush(local, local + UNIT_BYTES)

    def units(self, queue_offset: int, max_count: int) -> list[Unit]:
        """Up to ``max_count`` units from ``queue_offset`` (clamped to the queue's range)."""
        queue_offset = max(queue_offset, self.min_offset)
        result: list[Unit] = []
        while len(result) < max_count and queue_offset < self.max_offset:
            start = self.file_start(queue_offset)
            mapped = self.files[start].map
            count = min(max_count - len(result), self.max_offset - queue_offset, start + self.units_per_file - queue_offset)
            low = (queue_offset - start) * UNIT_BYTES
            result.extend(CQ_UNIT.iter_unpack(mapped[low : low + count * UNIT_BYTES]))
            queue_offset += count
        return result

    def packed_units(self, queue_offset: int, count: int) -> bytes | None:
        """The ``count`` units from ``queue_offset`` (inside the queue's range) as the files hold them, back to
        back (:data:`CQ_UNIT` each); None when a file that would hold one is missing."""
        invariant(self.min_offset <= queue_offset and queue_offset + count <= self.max_offset,
                  "units out of range")
        parts = []
        position = 0
        while position < count:
            offset = queue_offset + position
            start = self.file_start(offset)
            mapped = self.files.get(start)
            if mapped is None:
                return None
            take = min(count - position, start + self.units_per_file - offset)
            low = (offset - start) * UNIT_BYTES
            parts.append(mapped.map[low : low + take * UNIT_BYTES])
            position += take
        return b"".join(parts)

    def unit(self, queue_offset: int) -> Unit:
        invariant(self.min_offset <= queue_offset < self.max_offset, "unit offset out of range")
        start = self.file_start(queue_offset)
        result: Unit = CQ_UNIT.unpack_from(self.files[start].map, (queue_offset - start) * UNIT_BYTES)
        return result

    def first_at_or_after(self, physical_offset: int) -> int:
        """The first queue offset whose unit points at or after ``physical_offset`` (binary search)."""
        low, high = self.min_offset, self.max_offset
        while low < high:
            middle = (low + high) // 2
            if self.unit(middle)[0] < physical_offset:
                low = middle + 1
            else:
                high = middle
        return low

    def truncate_physical(self, physical_offset: int) -> None:
        """Remove units that point at or after ``physical_offset`` (their records were cut)."""
        cut = self.first_at_or_after(physical_offset)
        for offset in range(cut, self.max_offset):
            start = self.file_start(offset)
            local = (offset - start) * UNIT_BYTES
            self.files[start].map[local : local + UNIT_BYTES] = bytes(UNIT_BYTES)
        for start in [s for s in self.files if s > cut and s > self.min_offset]:
            self.files.pop(start).delete()
        self.max_offset = cut
        self._flushed_offset = min(self._flushed_offset, cut)

    def prune_below(self, physical_offset: int) -> None:
        """Retention: drop files whose units all point below ``physical_offset``; raise min_offset."""
        self.min_offset = self.first_at_or_after(physical_offset)
        # the file with the last unit stays, even when every unit is below the cut: it is what keeps the
        # queue's offsets across a restart (an emptied queue continues where it was, never at 0)
        last_file = self.file_start(max(self.max_offset - 1, 0))
        for start in sorted(self.files):
            if start + self.units_per_file <= self.min_offset and start != last_file:
                self.files.pop(start).delete()

    def take_unflushed_paths(self) -> list[Path]:
        """The files holding units written since the last call (the caller makes them durable)."""
        low = max(self._flushed_offset, self.min_offset)
        paths = [self.files[start].path for start in sorted(self.files)
                 if start + self.units_per_file > low and start < self.max_offset]
        self._flushed_offset = self.max_offset
        return paths

    def flush(self) -> None:
        offset = max(self._flushed_offset, self.min_offset)  # retention may have deleted what lay below
        while offset < self.max_offset:
            start = self.file_start(offset)
            end = min(self.max_offset, start + self.units_per_file)
            self.files[start].flush((offset - start) * UNIT_BYTES, (end - start) * UNIT_BYTES)
            offset = end
        self._flushed_offset = self.max_offset

    def close(self) -> None:
        for mapped in self.files.values():
            mapped.close()

    def delete(self) -> None:
        for mapped in self.files.values():
            mapped.delete()
        self.files.clear()
