"""powerfs: a FUSE file system that models a machine's page cache, so that chaos runs can cut the power.

A pass-through mount over a backing directory (the "disk"), with the semantics of LazyFS: what a process
writes stays in the daemon's memory until that file is fsynced, and a power cut drops it all, leaving the
backing directory holding exactly what a real disk would hold afterwards.

What is volatile, and what makes it durable
-------------------------------------------
* **File data** (write, and pages a process dirtied through a shared mapping, which the kernel writes
  back to the daemon as WRITE requests) is kept per file, as 4 KiB pages keyed by the backing inode, and
  reaches the backing file only on FSYNC of that file: ``fsync``, ``fdatasync``, and ``msync(MS_SYNC)``
  (the kernel writes the dirty pages back, then sends FSYNC). Reads see the volatile pages (the page
  cache). Size changes (truncate, writes past the end, ``posix_fallocate``) are volatile the same way. A
  file opened with ``O_SYNC``/``O_DSYNC`` is synced after every write. Close (FLUSH, RELEASE) is no sync,
  and neither is the kernel's own write-back: only FSYNC is. (Past :data:`VOLATILE_BYTES_MAX` of dirty
  pages the file with the most is written back, as a kernel would, so the daemon's memory stays bounded.)
* **Namespace changes** (create, mkdir, mknod, symlink, link, unlink, rmdir, rename) happen on the backing
  directory at once, so the mount always shows them, but each is also kept in an undo log until it is
  durable. ``fsync`` of a directory (FSYNCDIR) makes the latest change in that directory durable together
  with every change before it (a file system journal commits in order), never a later one. With
  ``namespace="linux"``, an fsync of a file does the same for the latest change that names the file (its
  creation or rename), which is what ext4, XFS and btrfs do; the default, ``"posix"``, asks for the
  directory fsync POSIX requires. An unlinked or overwritten entry waits in a trash directory next to the
  backing directory (not inside it) until its removal is durable.
* **Explicit size changes** (truncate, ``posix_fallocate``) are metadata as well as volatile: an fsync of
  the file makes one durable, and so does a later namespace commit (journal order: a segment preallocated
  and then renamed into place never comes back with its name but without its size, on ext4 or XFS either).
  A size grown by writing past the end is data: fsync only.
* **Attributes** (chmod, chown, utimens) are durable at once: nothing here depends on losing them.

Power cut, in this order (:func:`cut_power`); nothing unsynced survives it:
1. **Power off** (the ``cut`` control command): under the lock that every file system operation holds,
   the daemon drops every volatile page and size, takes back every namespace change that is not durable
   (newest first: each undo finds the backing exactly as that change left it), and goes dark: from then on
   every request fails with EIO, so nothing the kernel or a process sends afterwards (the write-back of
   dirty mmapped pages at exit, at release or at unmount, a late fsync) can reach the backing directory.
   The disk dies first, as it does in a real power loss; anything durable before that instant stays.
2. **SIGKILL** every process that uses the mount (its working directory, an open file or a mapping under
   the mount point), and wait until none is left. Until they die they only see EIO (reads of mapped pages
   not yet cached: SIGBUS); a failed fsync acknowledges nothing, so no process can act on data the cut lost.
3. **Unmount** (``fusermount3 -u``, lazily if still busy) and wait for the daemon to exit: the dark daemon
   writes nothing on its way out. The backing directory is now the disk after the power loss; mount it
   again (:meth:`PowerLossMount.start`) to boot the machine.

A clean stop (:meth:`PowerLossMount.stop`) is a normal shutdown instead: the kernel writes the remaining
dirty pages back at unmount, and the daemon then writes everything it holds to the backing directory.

The backing directory is never fsynced itself: the host under the model does not lose power, only the
modelled machine does. Files named in ``write_through`` (a member's log, as if it went to a log server)
have their data written to the backing file at once, so a post-mortem can read a log's last lines.

The daemon runs ``python -m chaos.powerfs serve BACKING MOUNTPOINT`` (libfuse 3 through ``mfusepy``, the
Debian packages ``fuse3`` and ``libfuse3-3``) and answers a control socket named after its mount point
(Linux abstract namespace, one JSON line per request); :class:`PowerLossMount` drives it from Python and
``python -m chaos.powerfs {mount,status,sync,cut,unmount}`` from a shell.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes.util
import errno
import functools
import hashlib
import importlib
import importlib.util
import json
import logging
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Concatenate, Final, Literal, ParamSpec, TypeVar

PAGE_SIZE: Final = 4096
#: pwritev takes at most this many buffers (IOV_MAX on Linux)
IOV_MAX: Final = 1024
FSTYPE: Final = "fuse.powerfs"
SUBTYPE: Final = "powerfs"
CONTROL_PREFIX: Final = "raftmq-powerfs-"
MOUNT_TIMEOUT_SECONDS: Final = 20.0
UNMOUNT_TIMEOUT_SECONDS: Final = 20.0
KILL_TIMEOUT_SECONDS: Final = 10.0
CONTROL_TIMEOUT_SECONDS: Final = 10.0
CONTROL_LINE_MAX_BYTES: Final = 1 << 16
POLL_SECONDS: Final = 0.02
#: the page cache's dirty limit: past it, the file with the most dirty pages is written back (made
#: durable, as the kernel's write-back would), so the daemon's memory stays bounded whatever its users do
VOLATILE_BYTES_MAX: Final = 1 << 30
#: what a member's directory keeps writing through (see the module doc)
MEMBER_WRITE_THROUGH: Final = ("broker.log",)
#: the Debian packages the daemon needs, by what is missing without them
FUSE_PACKAGES: Final = "fuse3 libfuse3-3"

Namespace = Literal["posix", "linux"]
NAMESPACE_MODES: Final[tuple[Namespace, ...]] = ("posix", "linux")

log = logging.getLogger("powerfs")


class PowerFsError(RuntimeError):
    """A powerfs mount that cannot be started, reached, cut or stopped."""


# ------------------------------------------------------------------------------------- the page cache


@dataclass(slots=True)
class _Volatile:
    """What the page cache holds of one backing inode beyond the backing file.

    Bytes below ``zero_from`` that no page covers come from the backing file; bytes at or past it read as
    zeros (a truncation since the last sync hid them: the backing file still has them until the next
    sync). ``zero_from <= size`` always. The state owns ``fd`` (read-write on the backing inode), so it can
    be written at a clean shutdown whatever became of the file's names."""

    fd: int
    size: int
    zero_from: int
    pages: dict[int, bytearray] = field(default_factory=dict)

    @classmethod
    def of(cls, fd: int) -> _Volatile:
        size = os.fstat(fd).st_size
        return cls(fd, size, size)

    def base_page(self, index: int) -> bytearray:
        """Page ``index`` as the disk has it, zeros past ``zero_from``."""
        start = index * PAGE_SIZE
        page = bytearray(PAGE_SIZE)
        if start < self.zero_from:
            data = os.pread(self.fd, min(PAGE_SIZE, self.zero_from - start), start)
            page[:len(data)] = data
        return page

    def read(self, offset: int, size: int) -> bytes:
        end = min(offset + size, self.size)
        if end <= offset:
            return b""
        durable_end = min(end, self.zero_from)
        buffer = bytearray(os.pread(self.fd, durable_end - offset, offset)) if durable_end > offset else bytearray()
        if len(buffer) < end - offset:
            buffer.extend(bytes(end - offset - len(buffer)))
        first, last = offset // PAGE_SIZE, (end - 1) // PAGE_SIZE
        pages = self.pages
        if pages:
            indices: Iterable[int] = (range(first, last + 1) if last - first < len(pages)
                                      else sorted(index for index in pages if first <= index <= last))
            for index in indices:
                page = pages.get(index)
                if page is None:
                    continue
                page_start = index * PAGE_SIZE
                low, high = max(offset, page_start), min(end, page_start + PAGE_SIZE)
                buffer[low - offset:high - offset] = page[low - page_start:high - page_start]
        return bytes(buffer)

    def write(self, offset: int, data: bytes) -> None:
        view = memoryview(data)
        end = offset + len(data)
        position = offset
        while position < end:
            index = position // PAGE_SIZE
            page_start = index * PAGE_SIZE
            low, high = position - page_start, min(PAGE_SIZE, end - page_start)
            page = self.pages.get(index)
            if page is None:
                page = bytearray(PAGE_SIZE) if low == 0 and high == PAGE_SIZE else self.base_page(index)
                self.pages[index] = page
            page[low:high] = view[position - offset:position - offset + high - low]
            position = page_start + high
        self.size = max(self.size, end)

    def truncate(self, length: int) -> None:
        if length < self.size:
            for index in [index for index in self.pages if index * PAGE_SIZE >= length]:
                del self.pages[index]
            tail = self.pages.get(length // PAGE_SIZE)
            if tail is not None and length % PAGE_SIZE:
                tail[length % PAGE_SIZE:] = bytes(PAGE_SIZE - length % PAGE_SIZE)
            self.zero_from = min(self.zero_from, length)
        self.size = length

    def persist(self) -> int:
        """Write the volatile pages and size to the backing file (an fsync); the bytes written."""
        if self.zero_from < os.fstat(self.fd).st_size:
            os.ftruncate(self.fd, self.zero_from)
        written = 0
        run: list[bytes | bytearray | memoryview] = []
        run_start = previous = -2
        for index in sorted(self.pages):
            if index != previous + 1 or len(run) >= IOV_MAX:
                written += _pwrite_all(self.fd, run, run_start * PAGE_SIZE)
                run, run_start = [], index
            page = self.pages[index]
            visible = min(PAGE_SIZE, self.size - index * PAGE_SIZE)
            run.append(page if visible == PAGE_SIZE else memoryview(page)[:visible])
            previous = index
        written += _pwrite_all(self.fd, run, run_start * PAGE_SIZE)
        if os.fstat(self.fd).st_size != self.size:
            os.ftruncate(self.fd, self.size)
        self.pages.clear()
        self.zero_from = self.size
        return written


def _pwrite_all(fd: int, buffers: list[bytes | bytearray | memoryview], offset: int) -> int:
    """pwritev every byte of ``buffers`` at ``offset`` (retrying after a short write)."""
    total = sum(len(buffer) for buffer in buffers)
    done = 0
    while done < total:
        if done:  # a short write: the rest, as one buffer
            rest = b"".join(bytes(buffer) for buffer in buffers)[done:]
            done += os.pwrite(fd, rest, offset + done)
        else:
            done += os.pwritev(fd, buffers, offset)
    return total


# --------------------------------------------------------------------------------- namespace changes


@dataclass(frozen=True, slots=True)
class _Change:
    """A metadata change not durable yet: a namespace change made on the backing directory, and how to take
    it back, or a size set explicitly, to apply to the backing file once durable.

    ``kind``: ``create`` (undo: remove ``path``), ``remove`` (undo: move ``trash`` back to ``path``),
    ``rename`` (undo: move ``path`` back to ``old_path``, then ``trash``, the entry it replaced, back to
    ``path``), ``resize`` (truncate or fallocate of ``subject`` to ``size``: nothing to undo; applied to the
    backing file when committed, unless an fsync of the file came first). ``directories``: the inodes of
    the directories whose entries changed (an FSYNCDIR of one makes the change durable); ``subject``: the
    inode it names."""

    kind: Literal["create", "remove", "rename", "resize"]
    path: str
    directories: frozenset[int]
    subject: int
    old_path: str = ""
    trash: str = ""
    size: int = 0


# ------------------------------------------------------------------------------------- the operations

P = ParamSpec("P")
R = TypeVar("R")


def _operation(method: Callable[Concatenate[PowerFS, P], R]) -> Callable[Concatenate[PowerFS, P], R]:
    """Run a file system operation under the daemon's lock; after the power cut, fail it with EIO."""

    def locked(self: PowerFS, /, *args: P.args, **kwargs: P.kwargs) -> R:
        with self.mutex:
            if self.dark:
                raise OSError(errno.EIO, "powered off")
            return method(self, *args, **kwargs)

    # mfusepy reads the signature (through __wrapped__) to learn whether create takes the open flags
    functools.update_wrapper(locked, method)
    return locked


@dataclass(slots=True)
class _Handle:
    fd: int
    ino: int
    write_through: bool
    sync_writes: bool


@dataclass(slots=True)
class _Counters:
    writes: int = 0
    writebacks: int = 0
    fsyncs: int = 0
    synced_bytes: int = 0
    namespace_commits: int = 0


class PowerFS:
    """The file system's operations, as ``mfusepy`` calls them (paths relative to the mount, starting
    with ``/``); usable without a mount too. Every operation runs under :attr:`mutex`: one at a time, and
    :meth:`power_off` between two of them, never inside one."""

    use_ns = True  # times as integer nanoseconds (mfusepy)

    def __init__(self, backing: Path, trash: Path, write_through: Iterable[str] = (),
                 namespace: Namespace = "posix") -> None:
        if namespace not in NAMESPACE_MODES:
            raise ValueError(f"namespace must be one of {NAMESPACE_MODES}, not {namespace!r}")
        self.backing = backing.resolve()
        self.trash = trash.resolve()
        if self.trash == self.backing or self.backing in self.trash.parents:
            raise ValueError("the trash directory must lie outside the backing directory")
        self.write_through = frozenset(write_through)
        self.namespace = namespace
        self.mutex = threading.RLock()
        self.dark = False
        self._root = str(self.backing)
        self._files: dict[int, _Volatile] = {}
        self._handles: dict[int, _Handle] = {}
        self._next_handle = 1
        self._changes: list[_Change] = []
        self._trash_serial = 0
        self.counters = _Counters()

    def prepare(self) -> None:
        """Create the backing and an empty trash directory (a trash left by a daemon that died holds
        removals nobody can take back any more: they stand)."""
        self.backing.mkdir(parents=True, exist_ok=True)
        if self.trash.exists():
            shutil.rmtree(self.trash)
        self.trash.mkdir(parents=True)

    # ---------------------------------------------------------------------------------- helpers

    def _real(self, path: str) -> str:
        return self._root + path if path != "/" else self._root

    def _parent_ino(self, real: str) -> int:
        return os.lstat(os.path.dirname(real)).st_ino

    def _state(self, ino: int, fd: int) -> _Volatile:
        state = self._files.get(ino)
        if state is None:
            state = self._files[ino] = _Volatile.of(os.dup(fd))
        return state

    def _state_at(self, real: str) -> tuple[int, _Volatile]:
        ino = os.lstat(real).st_ino
        state = self._files.get(ino)
        if state is None:
            state = self._files[ino] = _Volatile.of(os.open(real, os.O_RDWR | os.O_CLOEXEC))
        return ino, state

    def _sync_file(self, ino: int) -> None:
        state = self._files.pop(ino, None)
        if state is not None:
            try:
                self.counters.synced_bytes += state.persist()
            except BaseException:
                self._files[ino] = state  # still volatile: a later sync may succeed
                raise
            os.close(state.fd)
            # the file's size is durable as of now: an older size committed later would undo it
            self._changes = [change for change in self._changes
                             if change.kind != "resize" or change.subject != ino]

    def _resized(self, path: str, ino: int, state: _Volatile) -> None:
        """An explicit size change (truncate, fallocate) is metadata: a journal commits it in order with the
        namespace changes around it, so a file renamed into place after its fallocate never comes back
        shorter while its new name survives (ext4, XFS). Sizes grown by writes are data: fsync only."""
        self._changes.append(_Change("resize", path, frozenset(), ino, size=state.size))

    def _forget_if_unreachable(self, ino: int) -> None:
        """Drop the volatile state of an inode no name and no handle reaches any more."""
        state = self._files.get(ino)
        if state is None or any(handle.ino == ino for handle in self._handles.values()):
            return
        if os.fstat(state.fd).st_nlink == 0:
            del self._files[ino]
            os.close(state.fd)

    def _is_write_through(self, path: str) -> bool:
        return os.path.basename(path) in self.write_through

    def _new_handle(self, fd: int, path: str, flags: int) -> int:
        number = self._next_handle
        self._next_handle += 1
        self._handles[number] = _Handle(fd, os.fstat(fd).st_ino, self._is_write_through(path),
                                        bool(flags & (os.O_SYNC | os.O_DSYNC)))
        return number

    def _to_trash(self, real: str) -> str:
        self._trash_serial += 1
        name = str(self.trash / str(self._trash_serial))
        os.rename(real, name)
        return name

    def _purge(self, trashed: str) -> None:
        info = os.lstat(trashed)
        if stat.S_ISDIR(info.st_mode):
            shutil.rmtree(trashed)
        else:
            os.unlink(trashed)
            self._forget_if_unreachable(info.st_ino)

    def _commit_through(self, last: int) -> None:
        """Changes [0, last] are durable: their trash goes for good."""
        committed, self._changes = self._changes[:last + 1], self._changes[last + 1:]
        for change in committed:
            if change.trash:
                self._purge(change.trash)
            elif change.kind == "resize" and (state := self._files.get(change.subject)) is not None:
                os.ftruncate(state.fd, change.size)
        self.counters.namespace_commits += len(committed)

    def _commit_latest(self, matches: Callable[[_Change], bool]) -> None:
        for index in range(len(self._changes) - 1, -1, -1):
            if matches(self._changes[index]):
                self._commit_through(index)
                return

    def _undo(self, change: _Change) -> None:
        real = self._real(change.path)
        if change.kind == "create":
            if os.path.isdir(real) and not os.path.islink(real):
                shutil.rmtree(real)
            else:
                os.unlink(real)
        elif change.kind == "remove":
            os.rename(change.trash, real)
        elif change.kind == "rename":
            os.rename(real, self._real(change.old_path))
            if change.trash:
                os.rename(change.trash, real)

    # -------------------------------------------------------------------------- power and syncing

    def power_off(self) -> dict[str, int]:
        """The power cut: drop every volatile page and size, take back every namespace change that is not
        durable (newest first), and fail every later request with EIO. Idempotent."""
        with self.mutex:
            if self.dark:
                return {"dropped_files": 0, "dropped_bytes": 0, "undone_changes": 0, "undo_failures": 0}
            dropped_bytes = sum(len(state.pages) * PAGE_SIZE for state in self._files.values())
            dropped_files = len(self._files)
            for state in self._files.values():
                os.close(state.fd)
            self._files.clear()
            failures = 0
            for change in reversed(self._changes):
                try:
                    self._undo(change)
                except OSError as exc:  # cannot happen while only this daemon changes the backing
                    failures += 1
                    log.error("cannot take back %s: %s", change, exc)
            undone = len(self._changes)
            self._changes.clear()
            self.dark = True
            return {"dropped_files": dropped_files, "dropped_bytes": dropped_bytes, "undone_changes": undone,
                    "undo_failures": failures}

    def sync_all(self) -> dict[str, int]:
        """``sync(1)``: every volatile file written, every metadata change durable."""
        with self.mutex:
            if self.dark:
                raise OSError(errno.EIO, "powered off")
            files = len(self._files)
            for ino in list(self._files):
                self._sync_file(ino)
            changes = len(self._changes)
            self._commit_through(len(self._changes) - 1)
            return {"synced_files": files, "committed_changes": changes}

    def status(self) -> dict[str, Any]:
        with self.mutex:
            return {"pid": os.getpid(), "backing": self._root, "powered": not self.dark,
                    "namespace": self.namespace, "volatile_files": len(self._files),
                    "volatile_bytes": sum(len(state.pages) * PAGE_SIZE for state in self._files.values()),
                    "pending_changes": len(self._changes), "open_handles": len(self._handles),
                    "writes": self.counters.writes, "fsyncs": self.counters.fsyncs,
                    "writebacks": self.counters.writebacks,
                    "synced_bytes": self.counters.synced_bytes,
                    "namespace_commits": self.counters.namespace_commits}

    def destroy(self, path: str) -> None:
        """The session ended (unmounted): a clean shutdown writes everything; after a power cut, nothing."""
        with self.mutex:
            if not self.dark:
                self.sync_all()
            for state in self._files.values():
                os.close(state.fd)
            self._files.clear()
            for handle in self._handles.values():
                os.close(handle.fd)
            self._handles.clear()
            self.dark = True
        with contextlib.suppress(OSError):
            self.trash.rmdir()

    # --------------------------------------------------------------------------------- attributes

    @_operation
    def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
        handle = self._handles.get(fh) if fh else None
        info = os.fstat(handle.fd) if handle is not None else os.lstat(self._real(path))
        attributes = {"st_mode": info.st_mode, "st_ino": info.st_ino, "st_nlink": info.st_nlink,
                      "st_uid": info.st_uid, "st_gid": info.st_gid, "st_size": info.st_size,
                      "st_blocks": info.st_blocks, "st_blksize": info.st_blksize, "st_rdev": info.st_rdev,
                      "st_atime": info.st_atime_ns, "st_mtime": info.st_mtime_ns, "st_ctime": info.st_ctime_ns}
        state = self._files.get(info.st_ino)
        if state is not None:
            attributes["st_size"] = state.size
            attributes["st_blocks"] = max(info.st_blocks, -(-state.size // 512))
        return attributes

    @_operation
    def access(self, path: str, amode: int) -> int:
        if not os.access(self._real(path), amode):
            raise OSError(errno.EACCES, "access denied")
        return 0

    @_operation
    def readlink(self, path: str) -> str:
        return os.readlink(self._real(path))

    @_operation
    def statfs(self, path: str) -> dict[str, int]:
        info = os.statvfs(self._real(path))
        return {key: getattr(info, key) for key in ("f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail",
                                                    "f_files", "f_ffree", "f_favail", "f_flag", "f_namemax")}

    @_operation
    def chmod(self, path: str, mode: int) -> int:
        os.chmod(self._real(path), mode)
        return 0

    @_operation
    def chown(self, path: str, uid: int, gid: int) -> int:
        os.lchown(self._real(path), uid, gid)
        return 0

    @_operation
    def utimens(self, path: str, times: tuple[int, int] | None = None) -> int:
        real = self._real(path)
        if times is None:
            os.utime(real, follow_symlinks=False)
            return 0
        current = os.lstat(real)
        now = time.time_ns()
        resolved = []
        for value, old in zip(times, (current.st_atime_ns, current.st_mtime_ns), strict=True):
            nanoseconds = value % 1_000_000_000
            resolved.append(now if nanoseconds == _UTIME_NOW else old if nanoseconds == _UTIME_OMIT else value)
        os.utime(real, ns=(resolved[0], resolved[1]), follow_symlinks=False)
        return 0

    # ------------------------------------------------------------------------------------ namespace

    def _created(self, path: str, real: str) -> None:
        self._changes.append(_Change("create", path, frozenset({self._parent_ino(real)}), os.lstat(real).st_ino))

    @_operation
    def mkdir(self, path: str, mode: int) -> int:
        real = self._real(path)
        os.mkdir(real, mode)
        self._created(path, real)
        return 0

    @_operation
    def mknod(self, path: str, mode: int, dev: int) -> int:
        real = self._real(path)
        os.mknod(real, mode, dev)
        self._created(path, real)
        return 0

    @_operation
    def symlink(self, target: str, source: str) -> int:
        """``target`` (in the mount) becomes a symbolic link to ``source``."""
        real = self._real(target)
        os.symlink(source, real)
        self._created(target, real)
        return 0

    @_operation
    def link(self, target: str, source: str) -> int:
        """``target`` becomes another name of ``source``."""
        real = self._real(target)
        os.link(self._real(source), real, follow_symlinks=False)
        self._created(target, real)
        return 0

    def _remove(self, path: str, directory: bool) -> None:
        real = self._real(path)
        info = os.lstat(real)
        if directory:
            if not stat.S_ISDIR(info.st_mode):
                raise OSError(errno.ENOTDIR, "not a directory")
            if os.listdir(real):
                raise OSError(errno.ENOTEMPTY, "directory not empty")
        elif stat.S_ISDIR(info.st_mode):
            raise OSError(errno.EISDIR, "is a directory")
        parent = self._parent_ino(real)
        self._changes.append(_Change("remove", path, frozenset({parent}), info.st_ino, trash=self._to_trash(real)))

    @_operation
    def unlink(self, path: str) -> int:
        self._remove(path, directory=False)
        return 0

    @_operation
    def rmdir(self, path: str) -> int:
        self._remove(path, directory=True)
        return 0

    @_operation
    def rename(self, old: str, new: str) -> int:
        real_old, real_new = self._real(old), self._real(new)
        moving = os.lstat(real_old)
        try:
            replaced: os.stat_result | None = os.lstat(real_new)
        except FileNotFoundError:
            replaced = None
        if replaced is not None and replaced.st_ino == moving.st_ino:
            return 0  # two names of one file: POSIX says do nothing
        if replaced is not None:
            if stat.S_ISDIR(moving.st_mode) and not stat.S_ISDIR(replaced.st_mode):
                raise OSError(errno.ENOTDIR, "not a directory")
            if not stat.S_ISDIR(moving.st_mode) and stat.S_ISDIR(replaced.st_mode):
                raise OSError(errno.EISDIR, "is a directory")
            if stat.S_ISDIR(replaced.st_mode) and os.listdir(real_new):
                raise OSError(errno.ENOTEMPTY, "directory not empty")
        directories = frozenset({self._parent_ino(real_old), self._parent_ino(real_new)})
        trash = self._to_trash(real_new) if replaced is not None else ""
        try:
            os.rename(real_old, real_new)
        except OSError:
            if trash:
                os.rename(trash, real_new)
            raise
        self._changes.append(_Change("rename", new, directories, moving.st_ino, old_path=old, trash=trash))
        return 0

    @_operation
    def opendir(self, path: str) -> int:
        if not os.path.isdir(self._real(path)):
            raise OSError(errno.ENOTDIR, "not a directory")
        return 0

    @_operation
    def readdir(self, path: str, fh: int) -> list[tuple[str, dict[str, int], int]]:
        """Each entry with its inode number: with ``use_ino`` libfuse passes ours on, and an entry whose
        inode is 0 is one readdir(3) skips."""
        real = self._real(path)
        parent = os.path.dirname(real) if path != "/" else real
        entries = [(".", {"st_ino": os.lstat(real).st_ino, "st_mode": stat.S_IFDIR}, 0),
                   ("..", {"st_ino": os.lstat(parent).st_ino, "st_mode": stat.S_IFDIR}, 0)]
        with os.scandir(real) as scan:
            for entry in scan:
                if entry.is_symlink():
                    mode = stat.S_IFLNK
                elif entry.is_dir(follow_symlinks=False):
                    mode = stat.S_IFDIR
                elif entry.is_file(follow_symlinks=False):
                    mode = stat.S_IFREG
                else:
                    mode = stat.S_IFMT(entry.stat(follow_symlinks=False).st_mode)
                entries.append((entry.name, {"st_ino": entry.inode(), "st_mode": mode}, 0))
        return entries

    def releasedir(self, path: str, fh: int) -> int:
        return 0

    @_operation
    def fsyncdir(self, path: str, datasync: int, fh: int) -> int:
        directory = os.lstat(self._real(path)).st_ino
        self._commit_latest(lambda change: directory in change.directories)
        return 0

    # ---------------------------------------------------------------------------------- file data

    @staticmethod
    def _backing_flags(flags: int) -> int:
        # our own descriptor: always read-write (syncs write through it; the kernel enforced the caller's
        # mode already), never O_APPEND (pwrite would append), O_TRUNC (volatile) or O_SYNC (ours to do)
        return os.O_RDWR | os.O_CLOEXEC | (flags & os.O_NOFOLLOW)

    def _open_backing(self, real: str, flags: int, extra: int = 0, mode: int = 0o644) -> int:
        try:
            return os.open(real, self._backing_flags(flags) | extra, mode)
        except PermissionError:  # not root and a read-only file: the caller's own access mode
            return os.open(real, (flags & os.O_ACCMODE) | os.O_CLOEXEC | extra, mode)

    @_operation
    def create(self, path: str, mode: int, flags: int) -> int:
        real = self._real(path)
        try:
            fd = self._open_backing(real, flags, os.O_CREAT | os.O_EXCL, mode)
            created = True
        except FileExistsError:
            if flags & os.O_EXCL:
                raise
            fd, created = self._open_backing(real, flags), False
        if created:
            self._created(path, real)
        handle = self._new_handle(fd, path, flags)
        if not created and flags & os.O_TRUNC:
            self._truncate_handle(path, self._handles[handle], 0)
        return handle

    @_operation
    def open(self, path: str, flags: int) -> int:
        fd = self._open_backing(self._real(path), flags)
        handle = self._new_handle(fd, path, flags)
        if flags & os.O_TRUNC:
            self._truncate_handle(path, self._handles[handle], 0)
        return handle

    def _truncate_handle(self, path: str, handle: _Handle, length: int) -> None:
        if handle.write_through:
            os.ftruncate(handle.fd, length)
        else:
            state = self._state(handle.ino, handle.fd)
            state.truncate(length)
            self._resized(path, handle.ino, state)

    @_operation
    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        handle = self._handles[fh]
        state = self._files.get(handle.ino)
        if state is None:
            return os.pread(handle.fd, size, offset)
        return state.read(offset, size)

    @_operation
    def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
        handle = self._handles[fh]
        self.counters.writes += 1
        if handle.write_through:
            return os.pwrite(handle.fd, data, offset)
        self._state(handle.ino, handle.fd).write(offset, data)
        if handle.sync_writes:
            self._sync_file(handle.ino)
        elif sum(len(state.pages) for state in self._files.values()) * PAGE_SIZE > VOLATILE_BYTES_MAX:
            self.counters.writebacks += 1
            self._sync_file(max(self._files, key=lambda ino: len(self._files[ino].pages)))
        return len(data)

    @_operation
    def truncate(self, path: str, length: int, fh: int | None = None) -> int:
        handle = self._handles.get(fh) if fh else None
        if handle is not None:
            self._truncate_handle(path, handle, length)
        elif self._is_write_through(path):
            os.truncate(self._real(path), length)
        else:
            ino, state = self._state_at(self._real(path))
            state.truncate(length)
            self._resized(path, ino, state)
        return 0

    @_operation
    def fallocate(self, path: str, mode: int, offset: int, size: int, fh: int) -> int:
        """posix_fallocate: the file's size grows (volatile like a truncate: see :meth:`_resized`); the
        space is not reserved on the backing file system. Other modes (punching holes) are not supported."""
        if mode & ~_FALLOC_FL_KEEP_SIZE:
            raise OSError(errno.EOPNOTSUPP, "only plain fallocate is supported")
        handle = self._handles[fh]
        if mode & _FALLOC_FL_KEEP_SIZE:
            return 0
        if handle.write_through:
            if os.fstat(handle.fd).st_size < offset + size:
                os.ftruncate(handle.fd, offset + size)
            return 0
        state = self._state(handle.ino, handle.fd)
        if state.size < offset + size:
            state.truncate(offset + size)
            self._resized(path, handle.ino, state)
        return 0

    @_operation
    def flush(self, path: str, fh: int) -> int:
        return 0  # close(2) is no sync

    def release(self, path: str, fh: int) -> int:
        with self.mutex:
            handle = self._handles.pop(fh, None)
            if handle is not None:
                os.close(handle.fd)
                if not self.dark:
                    self._forget_if_unreachable(handle.ino)
        return 0

    @_operation
    def fsync(self, path: str, datasync: int, fh: int) -> int:
        handle = self._handles[fh]
        self.counters.fsyncs += 1
        self._sync_file(handle.ino)
        if self.namespace == "linux":
            self._commit_latest(lambda change: change.subject == handle.ino)
        return 0


_UTIME_NOW: Final = (1 << 30) - 1
_UTIME_OMIT: Final = (1 << 30) - 2
_FALLOC_FL_KEEP_SIZE: Final = 0x01


# ---------------------------------------------------------------------------------- control channel


def control_name(mountpoint: Path) -> str:
    """The abstract socket a mount's daemon answers on (no file, no path length limit)."""
    digest = hashlib.sha256(str(_absolute(mountpoint)).encode()).hexdigest()[:32]
    return CONTROL_PREFIX + digest


def _absolute(path: Path) -> Path:
    """``path`` made absolute without touching the path itself (it may be a mount whose daemon is gone)."""
    path = Path(os.path.abspath(path))
    return path.parent.resolve() / path.name


def _serve_control(fs: PowerFS, name: str) -> socket.socket:
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind("\0" + name)
    server.listen(8)
    threading.Thread(target=_control_loop, args=(server, fs), name="powerfs-control", daemon=True).start()
    return server


def _control_loop(server: socket.socket, fs: PowerFS) -> None:
    while True:
        connection, _ = server.accept()
        with connection:
            try:
                command = _read_line(connection)
                reply: dict[str, Any]
                if command == "status":
                    reply = fs.status()
                elif command == "cut":
                    reply = fs.power_off()
                    log.warning("power cut: %s", reply)
                elif command == "sync":
                    reply = fs.sync_all()
                else:
                    reply = {"error": f"unknown command {command!r}"}
            except OSError as exc:
                reply = {"error": str(exc)}
            with contextlib.suppress(OSError):
                connection.sendall(json.dumps(reply).encode() + b"\n")


def _read_line(connection: socket.socket) -> str:
    data = b""
    while not data.endswith(b"\n") and len(data) < CONTROL_LINE_MAX_BYTES:
        chunk = connection.recv(4096)
        if not chunk:
            break
        data += chunk
    return data.decode().strip()


def control(mountpoint: Path, command: str, timeout_seconds: float = CONTROL_TIMEOUT_SECONDS) -> dict[str, Any]:
    """Send ``command`` (status, sync, cut) to the daemon of ``mountpoint``; its JSON answer."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
        connection.settimeout(timeout_seconds)
        try:
            connection.connect("\0" + control_name(mountpoint))
            connection.sendall(command.encode() + b"\n")
            reply = json.loads(_read_line(connection) or "null")
        except (OSError, ValueError) as exc:
            raise PowerFsError(f"no powerfs daemon answers for {mountpoint}: {exc}") from exc
    if not isinstance(reply, dict) or "error" in reply:
        raise PowerFsError(f"powerfs {command} on {mountpoint} failed: {reply}")
    return reply


# --------------------------------------------------------------------------------------- the daemon


def serve(backing: Path, mountpoint: Path, trash: Path, write_through: Sequence[str], namespace: Namespace) -> int:
    """Mount and serve in the foreground until unmounted (libfuse's own signal handlers unmount on
    SIGTERM/SIGINT: a clean stop)."""
    os.umask(0)  # the kernel applied the caller's umask already
    os.environ.setdefault("FUSE_LIBRARY_NAME", "fuse3")  # mfusepy prefers libfuse 2 when both are there
    mfusepy = importlib.import_module("mfusepy")
    fs = PowerFS(backing, trash, write_through, namespace)
    fs.prepare()
    server = _serve_control(fs, control_name(mountpoint))
    try:
        # kernel_cache: nothing but this mount changes the files, so the kernel may keep pages across opens;
        # auto_unmount: a daemon that dies (SIGKILL) takes its mount along instead of leaving it dead
        mfusepy.FUSE(fs, str(_absolute(mountpoint)), foreground=True, fsname="powerfs", subtype=SUBTYPE,
                     hard_remove=True, use_ino=True, kernel_cache=True, auto_unmount=True,
                     max_idle_threads=8)  # libfuse 3.14 warns about its own default
    finally:
        server.close()
    return 0


# --------------------------------------------------------------------------------- mounts from Python


def _unescape_mount_field(text: str) -> str:
    for code, character in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        text = text.replace(code, character)
    return text


def mounted_powerfs(root: Path) -> list[Path]:
    """The powerfs mount points at or under ``root`` (deepest first)."""
    root = _absolute(root)
    found = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        fields = line.split()
        if len(fields) >= 3 and fields[2] == FSTYPE:
            point = Path(_unescape_mount_field(fields[1]))
            if point == root or root in point.parents:
                found.append(point)
    return sorted(found, key=lambda point: len(point.parts), reverse=True)


def is_mounted(mountpoint: Path) -> bool:
    return _absolute(mountpoint) in mounted_powerfs(mountpoint)


def _under(target: str, mountpoint: str) -> bool:
    return target == mountpoint or target.startswith(mountpoint + "/")


def users(mountpoints: Iterable[Path]) -> list[int]:
    """Processes using any of ``mountpoints``: working or root directory, an open file, or a mapping under
    it (what ``fuser -m`` finds). Neither this process nor a powerfs daemon is ever listed."""
    points = [str(_absolute(point)) for point in mountpoints]
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        base = f"/proc/{entry.name}"
        targets: list[str] = []
        for link in ("cwd", "root"):
            with contextlib.suppress(OSError):
                targets.append(os.readlink(f"{base}/{link}"))
        with contextlib.suppress(OSError):
            targets.extend(os.readlink(f"{base}/fd/{fd}") for fd in os.listdir(f"{base}/fd"))
        with contextlib.suppress(OSError), open(f"{base}/maps") as maps:
            targets.extend(line.split(None, 5)[5].strip() for line in maps if line.count(" ") >= 5
                           and len(line.split(None, 5)) == 6)
        if any(_under(target, point) for target in targets for point in points):
            found.append(int(entry.name))
    return found


def _process_gone(pid: int) -> bool:
    """True once ``pid`` has exited; a zombie counts as gone (its files and mappings are released), and it is
    left for its parent to reap (a ``Popen`` of ours keeps its exit status)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state in ("Z", "X")


def _poll(condition: Callable[[], bool], timeout_seconds: float) -> bool:
    """Poll ``condition`` until it holds or the deadline passes; whether it held."""
    deadline = time.monotonic() + timeout_seconds
    while not condition():
        if time.monotonic() >= deadline:
            return False
        time.sleep(POLL_SECONDS)
    return True


def kill_users(mountpoints: Iterable[Path], timeout_seconds: float = KILL_TIMEOUT_SECONDS) -> list[int]:
    """SIGKILL every process using ``mountpoints`` until none is left; the pids killed."""
    points = list(mountpoints)
    killed: list[int] = []
    deadline = time.monotonic() + timeout_seconds
    while found := users(points):
        for pid in found:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            if pid not in killed:
                killed.append(pid)
        _poll(lambda: all(_process_gone(pid) for pid in found), max(0.0, deadline - time.monotonic()))
        if time.monotonic() >= deadline:
            left = users(points)
            if left:
                raise PowerFsError(f"processes still use {', '.join(map(str, points))}: {left}")
            break
    return killed


def fuse_missing_packages() -> list[str]:
    """What this machine lacks to run powerfs that a package install brings, by package name."""
    missing = []
    if shutil.which("fusermount3") is None:
        missing.append("fuse3 (Debian: fusermount3)")
    if ctypes.util.find_library("fuse3") is None:
        missing.append("libfuse3-3 (Debian: libfuse3.so.3)")
    if importlib.util.find_spec("mfusepy") is None:
        missing.append("mfusepy (PyPI, a raftmq dependency: pip install -e .)")
    return missing


@functools.cache
def powerfs_unavailable() -> str | None:
    """Why a powerfs mount cannot be made here, or None when it can (tried on a scratch directory).
    Missing packages are named (:func:`fuse_missing_packages`); else /dev/fuse or the mount itself."""
    missing = fuse_missing_packages()
    if missing:
        return f"missing packages: {', '.join(missing)}"
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse (the fuse kernel module, or a container without the device)"
    with tempfile.TemporaryDirectory(prefix="raftmq-powerfs-probe-") as scratch:
        try:
            with PowerLossMount(Path(scratch) / "disk", Path(scratch) / "mount"):
                pass
        except PowerFsError as exc:
            return f"a powerfs mount failed: {exc}"
    return None


def describe_log(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


class PowerLossMount:
    """One powerfs mount of ``backing`` at ``mountpoint``, driven from this process.

    ``start`` mounts (a daemon in a new session, waited for in ``/proc/self/mounts``), ``cut_power`` cuts the
    power (see the module doc for the order) and leaves it unmounted, ``start`` again boots it, ``stop``
    shuts it down cleanly. As a context manager it is started and always stopped, on failure too. A mount
    found already (``start`` by another process) is driven through its control socket all the same."""

    def __init__(self, backing: Path, mountpoint: Path, *, write_through: Iterable[str] = (),
                 namespace: Namespace = "posix", trash: Path | None = None, log_path: Path | None = None) -> None:
        self.backing = _absolute(backing)
        self.mountpoint = _absolute(mountpoint)
        self.write_through = tuple(write_through)
        self.namespace = namespace
        self.trash = trash if trash is not None else self.backing.with_name(f".{self.backing.name}.trash")
        self.log_path = log_path if log_path is not None else self.backing.with_name(f".{self.backing.name}.log")
        self._process: subprocess.Popen[bytes] | None = None

    @classmethod
    def for_directory(cls, directory: Path, write_through: Iterable[str] = MEMBER_WRITE_THROUGH,
                      namespace: Namespace = "posix") -> PowerLossMount:
        """The mount that puts ``directory`` itself on powerfs: its disk is ``.NAME.powerfs/disk`` beside it
        (with the trash and the daemon's log), so :func:`release_mounts` can find and give it back."""
        directory = _absolute(directory)
        state = directory.parent / f".{directory.name}.powerfs"
        return cls(state / "disk", directory, write_through=write_through, namespace=namespace,
                   trash=state / "trash", log_path=state / "daemon.log")

    @property
    def mounted(self) -> bool:
        return is_mounted(self.mountpoint)

    def __enter__(self) -> PowerLossMount:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def command(self) -> list[str]:
        arguments = [sys.executable, "-m", "chaos.powerfs", "serve", str(self.backing), str(self.mountpoint),
                     "--trash", str(self.trash), "--namespace", self.namespace]
        for name in self.write_through:
            arguments += ["--write-through", name]
        return arguments

    def start(self) -> PowerLossMount:
        """Mount (a no-op when mounted already); wait until the mount shows and its daemon answers."""
        if is_mounted(self.mountpoint):
            return self
        self.backing.mkdir(parents=True, exist_ok=True)
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        environment = {**os.environ, "FUSE_LIBRARY_NAME": "fuse3", "PYTHONUNBUFFERED": "1",
                       "PYTHONPATH": os.pathsep.join(filter(None, (str(Path(__file__).resolve().parents[1]),
                                                                   os.environ.get("PYTHONPATH"))))}
        with open(self.log_path, "ab") as log_file:
            self._process = subprocess.Popen(self.command(), stdout=log_file, stderr=subprocess.STDOUT,
                                             stdin=subprocess.DEVNULL, cwd="/", start_new_session=True,
                                             env=environment)
        process = self._process
        if (not _poll(lambda: is_mounted(self.mountpoint) or process.poll() is not None, MOUNT_TIMEOUT_SECONDS)
                or not is_mounted(self.mountpoint)):
            self._abandon()
            raise PowerFsError(f"powerfs did not mount {self.mountpoint} within {MOUNT_TIMEOUT_SECONDS:g} s "
                               f"(exit {process.poll()}); its log:\n{describe_log(self.log_path)}")
        try:
            self.status()
        except PowerFsError:
            self._abandon()
            raise
        return self

    def _abandon(self) -> None:
        """Take down a daemon that failed to start properly (and its mount, if it made one)."""
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._process.wait(UNMOUNT_TIMEOUT_SECONDS)
        if self.mounted:
            subprocess.run(["fusermount3", "-uz", str(self.mountpoint)], capture_output=True, check=False,
                           timeout=UNMOUNT_TIMEOUT_SECONDS)
        self._process = None

    def status(self) -> dict[str, Any]:
        return control(self.mountpoint, "status")

    def sync(self) -> dict[str, Any]:
        """``sync(1)`` on the modelled machine: everything it holds becomes durable."""
        return control(self.mountpoint, "sync")

    def power_off(self) -> dict[str, Any]:
        """Step 1 of a power cut (the daemon drops everything unsynced and goes dark); the mount stays."""
        return control(self.mountpoint, "cut")

    def users(self) -> list[int]:
        return users([self.mountpoint])

    def cut_power(self) -> dict[str, Any]:
        """Cut the power: see :func:`cut_power`. The mount is gone afterwards; :meth:`start` boots it."""
        return cut_power([self])[0]

    def _daemon_pid(self) -> int | None:
        if self._process is not None:
            return self._process.pid
        try:
            return int(self.status()["pid"])
        except PowerFsError:
            return None

    def _daemon_gone(self, pid: int | None) -> bool:
        if pid is None:
            return True
        if self._process is not None and self._process.pid == pid:
            return self._process.poll() is not None
        return _process_gone(pid)

    def unmount(self) -> None:
        """Unmount and wait for the daemon to exit (after a clean unmount it has written everything)."""
        pid = self._daemon_pid() if self.mounted else None
        if self.mounted:
            failure = ""
            if not _poll(lambda: self._fusermount("-u") or not self.mounted, UNMOUNT_TIMEOUT_SECONDS / 2):
                failure = "busy"
                self._fusermount("-uz")  # lazy: gone from the namespace now, the daemon ends once unused
            if not _poll(lambda: not self.mounted, UNMOUNT_TIMEOUT_SECONDS / 2):
                raise PowerFsError(f"cannot unmount {self.mountpoint} ({failure or 'fusermount3 failed'})")
        if not _poll(lambda: self._daemon_gone(pid), UNMOUNT_TIMEOUT_SECONDS):
            assert pid is not None
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            _poll(lambda: self._daemon_gone(pid), UNMOUNT_TIMEOUT_SECONDS)
            raise PowerFsError(f"the powerfs daemon {pid} of {self.mountpoint} did not exit after the unmount; "
                               f"killed. Its log:\n{describe_log(self.log_path)}")
        self._process = None

    def _fusermount(self, option: str) -> bool:
        done = subprocess.run(["fusermount3", option, str(self.mountpoint)], capture_output=True, check=False,
                              timeout=UNMOUNT_TIMEOUT_SECONDS)
        return done.returncode == 0

    def stop(self, kill_remaining: bool = True) -> None:
        """A clean shutdown: the processes still using the mount are killed (they should have been stopped
        before), the mount is unmounted and the daemon writes everything it holds. Idempotent."""
        if kill_remaining and self.mounted:
            kill_users([self.mountpoint])
        self.unmount()


def cut_power(mounts: Sequence[PowerLossMount]) -> list[dict[str, Any]]:
    """Cut the power of every mount in ``mounts`` at once, in the order the module doc gives: every daemon
    goes dark (dropping what was not synced), then every process using any of them is SIGKILLed, then each
    is unmounted. Per mount, what its daemon dropped."""
    reports: list[dict[str, Any]] = []
    for mount in mounts:  # first, all of them: the disks die before anyone can react
        reports.append(mount.power_off() if mount.mounted else {"dropped_files": 0, "dropped_bytes": 0,
                                                                 "undone_changes": 0, "undo_failures": 0})
    using = {mount.mountpoint: set(mount.users()) for mount in mounts}
    killed = kill_users([mount.mountpoint for mount in mounts])
    for mount, report in zip(mounts, reports, strict=True):
        report["killed"] = [pid for pid in killed if pid in using[mount.mountpoint]]
    for mount in mounts:
        mount.unmount()
    return reports


# --------------------------------------------------------------------------------- chaos directories


def mount_directory(directory: Path, write_through: Iterable[str] = MEMBER_WRITE_THROUGH,
                    namespace: Namespace = "posix") -> PowerLossMount:
    """Put ``directory`` (nothing using it) on its own powerfs mount, keeping its contents (moved to the
    mount's disk first, as durable)."""
    mount = PowerLossMount.for_directory(directory, write_through, namespace)
    if mount.mounted:
        return mount
    mount.mountpoint.mkdir(parents=True, exist_ok=True)
    mount.backing.mkdir(parents=True, exist_ok=True)
    for child in list(mount.mountpoint.iterdir()):
        os.rename(child, mount.backing / child.name)
    return mount.start()


def powered_off(mount: PowerLossMount) -> bool:
    """True when ``mount`` has a disk (its backing directory exists) but is not mounted: cut and not booted."""
    return mount.backing.is_dir() and not mount.mounted


def _state_directories(root: Path) -> Iterator[Path]:
    root = _absolute(root)
    for parent in (root, *(child for child in root.iterdir() if child.is_dir() and not child.is_symlink())):
        yield from (path for path in parent.glob(".*.powerfs") if path.is_dir())


def release_mounts(root: Path) -> list[Path]:
    """Stop every powerfs mount at or under ``root`` cleanly and give each directory put on powerfs by
    :func:`mount_directory` its contents back (also after a power cut that was not followed by a restart:
    the disk as the cut left it); the daemon's log is kept beside it as ``.NAME.powerfs.log``. The
    directories given back."""
    for point in mounted_powerfs(root):
        PowerLossMount.for_directory(point).stop()
    released: list[Path] = []
    if not _absolute(root).is_dir():
        return released
    for state in list(_state_directories(root)):
        directory = state.parent / state.name[1:-len(".powerfs")]
        disk = state / "disk"
        if is_mounted(directory):
            continue  # not ours to give back (stopped above unless it is under another root)
        directory.mkdir(exist_ok=True)
        if disk.is_dir():
            for child in list(disk.iterdir()):
                target = directory / child.name
                if target.is_dir() and not target.is_symlink():
                    shutil.rmtree(target)
                elif target.exists() or target.is_symlink():
                    target.unlink()
                os.rename(child, target)
        if (state / "daemon.log").exists():
            os.replace(state / "daemon.log", state.with_name(state.name + ".log"))
        shutil.rmtree(state)
        released.append(directory)
    return released


def sync_mounts(root: Path) -> None:
    """``sync(1)`` on every powerfs mount under ``root``."""
    for point in mounted_powerfs(root):
        control(point, "sync")


# --------------------------------------------------------------------------------------------- CLI


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m chaos.powerfs", description=__doc__.split("\n\n")[0]
                                     if __doc__ else None)
    commands = parser.add_subparsers(dest="command", required=True)
    serve_parser = commands.add_parser("serve", help="run the daemon in the foreground (mounts BACKING at MOUNTPOINT)")
    mount_parser = commands.add_parser("mount", help="mount in the background and wait until it shows")
    for sub in (serve_parser, mount_parser):
        sub.add_argument("backing", type=Path)
        sub.add_argument("mountpoint", type=Path)
        sub.add_argument("--trash", type=Path, default=None)
        sub.add_argument("--write-through", action="append", default=[], metavar="NAME")
        sub.add_argument("--namespace", choices=NAMESPACE_MODES, default="posix")
    for name, text in (("status", "what the daemon holds"), ("sync", "make everything durable"),
                       ("cut", "cut the power: drop everything unsynced, SIGKILL every user, unmount"),
                       ("unmount", "a clean stop (kills processes still using it)")):
        commands.add_parser(name, help=text).add_argument("mountpoint", type=Path, nargs="+")
    arguments = parser.parse_args(argv)
    if arguments.command == "serve":
        logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
        trash = arguments.trash or arguments.backing.with_name(f".{arguments.backing.name}.trash")
        return serve(arguments.backing, arguments.mountpoint, trash, arguments.write_through, arguments.namespace)
    try:
        if arguments.command == "mount":
            PowerLossMount(arguments.backing, arguments.mountpoint, write_through=arguments.write_through,
                           namespace=arguments.namespace, trash=arguments.trash).start()
        elif arguments.command in ("status", "sync"):
            for point in arguments.mountpoint:
                print(json.dumps({"mountpoint": str(point), **control(point, arguments.command)}))
        elif arguments.command == "cut":
            mounts = [PowerLossMount(Path(control(point, "status")["backing"]), point)
                      for point in arguments.mountpoint]
            for point, report in zip(arguments.mountpoint, cut_power(mounts), strict=True):
                print(json.dumps({"mountpoint": str(point), **report}))
        else:
            for point in arguments.mountpoint:
                PowerLossMount.for_directory(point).stop()
    except PowerFsError as exc:
        print(f"powerfs: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
