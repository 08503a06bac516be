"""A fixed-size, preallocated, memory-mapped file (RocketMQ's MappedFile).

Space is reserved with ``posix_fallocate`` when the file is created, so a full disk fails there, with
:class:`DiskFullError`, before any record is written: writing into a sparse mapping on a full disk would
kill the process with SIGBUS instead.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
from collections.abc import Callable
from pathlib import Path

from commitlog import reaper
from commitlog.errors import DiskFullError, StoreError, SyncError
from protocol.invariant import invariant

PAGE_SIZE = mmap.PAGESIZE
#: suffix of a file being allocated; such a file is never opened as data and is replaced on the next try
ALLOCATING_SUFFIX = ".allocating"


def ensure_directory(path: Path) -> None:
    """``mkdir -p``, with a full disk reported as :class:`DiskFullError` (apply waits for space on it)."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise DiskFullError(f"no space to create {path}") from exc
        raise StoreError(f"cannot create {path}: {exc.strerror}") from exc


def fsync_directory(path: Path) -> None:
    """Make a rename or a new file in ``path`` durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` atomically: temp file, fsync, rename, fsync directory. The replaced
    file's blocks are freed on the reaper's thread (commitlog.reaper)."""
    temp = path.with_name(path.name + ".tmp")
    try:
        with open(temp, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        reaper.replace(temp, path)
    except OSError as exc:
        temp.unlink(missing_ok=True)
        if exc.errno == errno.ENOSPC:
            raise DiskFullError(f"no space left writing {path}") from exc
        raise
    fsync_directory(path.parent)


def drop_cached(path: Path, start: int, end: int) -> None:
    """Evict bytes [start, end) of ``path`` from the page cache. Only clean pages that no process maps are
    dropped (flush first); a file deleted meanwhile has nothing left to drop."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return
    try:
        os.posix_fadvise(fd, start, end - start, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


class MappedFile:
    """``size_bytes`` of ``path`` mapped read-write. Writes go to the page cache; :meth:`flush` msyncs."""

    def __init__(self, path: Path, size_bytes: int, create: bool) -> None:
        invariant(size_bytes > 0, "mapped file size must be positive")
        self.path = path
        self.size_bytes = size_bytes
        # A new file is allocated under a temporary name and renamed into place once fully allocated: a
        # crash during posix_fallocate must not leave a short file under a real name.
        if create and path.exists():
            raise StoreError(f"{path} exists already")
        self._deleted = False
        target = path.with_name(path.name + ALLOCATING_SUFFIX) if create else path
        flags = os.O_RDWR | (os.O_CREAT | os.O_TRUNC if create else 0)
        try:
            fd = os.open(target, flags, 0o644)
        except OSError as exc:
            raise StoreError(f"cannot open {target}: {exc.strerror}") from exc
        try:
            if create:
                try:
                    os.posix_fallocate(fd, 0, size_bytes)
                except OSError as exc:
                    target.unlink(missing_ok=True)
                    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                        raise DiskFullError(f"no space for {size_bytes} bytes at {path}") from exc
                    raise StoreError(f"cannot allocate {path}: {exc.strerror}") from exc
            else:
                actual = os.fstat(fd).st_size
                if actual != size_bytes:
                    raise StoreError(f"{path} has {actual} bytes, expected {size_bytes}")
            # mmap keeps its own duplicate of the descriptor
            self._map: mmap.mmap | None = mmap.mmap(fd, size_bytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        if create:
            os.rename(target, path)
        #: called whenever the file is mapped again after :meth:`unmap` (the owner's LRU bookkeeping)
        self.on_remap: Callable[[MappedFile], None] | None = None
        self._write_fd: int | None = None

    @property
    def map(self) -> mmap.mmap:
        """The mapping; mapped again (without populating) if :meth:`unmap` released it."""
        mapped = self._map
        if mapped is None or mapped.closed:
            invariant(not self._deleted, f"{self.path} was deleted")
            fd = os.open(self.path, os.O_RDWR)
            try:
                mapped = mmap.mmap(fd, self.size_bytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            finally:
                os.close(fd)
            self._map = mapped
            if self.on_remap is not None:
                self.on_remap(self)
        return mapped

    def pwrite(self, offset: int, data: bytes | bytearray | memoryview) -> None:
        """Write through the file (the page cache), not the mapping; the mapping sees the same pages."""
        invariant(offset >= 0 and offset + len(data) <= self.size_bytes, "pwrite outside the file")
        fd = self._write_fd
        if fd is None:
            fd = self._write_fd = os.open(self.path, os.O_RDWR)
        written = os.pwrite(fd, data, offset)
        invariant(written == len(data), "short pwrite into a preallocated file")

    @property
    def is_mapped(self) -> bool:
        return self._map is not None and not self._map.closed

    def unmap(self) -> None:
        """Release the mapping (and the pages it keeps resident in this process). Dirty pages stay in the
        page cache: the store's flush makes files durable with fdatasync, which needs no mapping."""
        mapped = self._map
        self._map = None
        if mapped is not None and not mapped.closed:
            # BufferError: a reader still holds a view of it (the scrubber's record walk, on another thread while
            # this one maps an old segment for a read); the mapping goes when that view does
            with contextlib.suppress(BufferError):
                mapped.close()

    def release_pages(self, start: int, end: int) -> None:
        """Drop the pages of [start, end) from this process's resident set (MADV_DONTNEED on a shared
        file mapping keeps their content, dirty or not, in the page cache; a later access refaults)."""
        mapped = self._map
        start = start - start % PAGE_SIZE
        end = min(end - end % PAGE_SIZE, self.size_bytes)
        if mapped is not None and not mapped.closed and end > start:
            mapped.madvise(mmap.MADV_DONTNEED, start, end - start)

    def flush(self, start: int, end: int) -> None:
        """msync bytes [start, end) (page aligned outward); an unmapped file has nothing unsynced here."""
        if end <= start or not self.is_mapped:
            return
        aligned = start - start % PAGE_SIZE
        try:
            self.map.flush(aligned, min(end, self.size_bytes) - aligned)
        except OSError as exc:
            raise SyncError(f"cannot sync {self.path}: {exc.strerror}") from exc

    def _close_write_fd(self) -> None:
        if self._write_fd is not None:
            os.close(self._write_fd)
            self._write_fd = None

    def close(self) -> None:
        self.unmap()
        self._close_write_fd()

    def delete(self) -> None:
        self._deleted = True
        self.unmap()
        self._close_write_fd()
        reaper.unlink(self.path)  # a segment's blocks are freed off this thread: the Raft thread in retention
