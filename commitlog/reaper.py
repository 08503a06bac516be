"""Deleted files give their disk blocks back on a thread of their own, not on the thread that deletes them.

Unlinking a file, or replacing one by rename, frees its blocks in the calling thread when the last
reference to the inode goes. On ext4 mounted with ``discard`` (online discard, common on cloud disks and
this machine's root file system), freeing blocks waits for the device to discard them: tens to hundreds
of milliseconds for a segment, and even for one small file when a flush has queued megabytes of writes
ahead of the discard. When that thread is the Raft thread (pysyncobj replaces its meta file every second;
retention deletes segments in apply), every caller of the group waits, and the commit latency's tail
grows by as much.

So a file is opened first and then unlinked or replaced: only its name goes, the open descriptor keeps the
inode, and the descriptor is closed here, where the last reference goes and the blocks are freed. The
directory is exactly as a plain unlink or rename leaves it, at once. A process that dies meanwhile loses
nothing (the kernel closes its descriptors and frees the blocks then); a power loss in that window leaves
an orphan inode on a file system without a journal, as any deleted file still open does.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Final

#: descriptors waiting to be closed; past this the deleting thread closes its own (bounded, never lost)
PENDING_MAX: Final = 256

_lock = threading.Lock()
_pending: queue.Queue[int] = queue.Queue()
_thread: threading.Thread | None = None
_owner_pid = 0


def _release(fd: int) -> None:
    """Close a descriptor handed over: if it was the file's last reference, its blocks are freed here."""
    os.close(fd)


def _close_loop() -> None:
    while True:
        fd = _pending.get()
        try:
            _release(fd)
        except OSError:
            pass  # closed already: nothing left to free
        finally:
            _pending.task_done()


def _hand_over(fd: int) -> None:
    global _thread, _owner_pid
    with _lock:
        if _thread is None or _owner_pid != os.getpid():  # first use, or a forked child without the thread
            _thread = threading.Thread(target=_close_loop, name="file-reaper", daemon=True)
            _owner_pid = os.getpid()
            _thread.start()
    if _pending.qsize() >= PENDING_MAX:
        _release(fd)
        return
    _pending.put(fd)


def _freed_here(held: Path, operation: Callable[[], None]) -> None:
    """Run ``operation`` (which removes the name ``held``) with ``held`` open, and hand the descriptor over:
    its blocks are freed when the reaper closes it. A file that cannot be opened (gone, permissions, no
    descriptors left) is freed by the operation itself, as without the reaper."""
    try:
        fd: int | None = os.open(held, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        fd = None
    try:
        operation()
    except BaseException:
        if fd is not None:
            _release(fd)
        raise
    if fd is not None:
        _hand_over(fd)


def unlink(path: Path, missing_ok: bool = True) -> None:
    """``path.unlink()``, with the blocks freed on the reaper's thread."""
    _freed_here(path, lambda: path.unlink(missing_ok=missing_ok))


def replace(source: Path, target: Path) -> None:
    """``os.replace(source, target)``, with the blocks of the file ``target`` named before freed on the
    reaper's thread."""
    _freed_here(target, lambda: os.replace(source, target))


def drain() -> None:
    """Wait until every file handed over so far has been freed (tests, and callers that count free space)."""
    _pending.join()
