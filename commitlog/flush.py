"""Durability: the flush that makes what was applied durable and writes the checkpoint vouching for it, and
the background thread that runs it under the async policy.

A flush fdatasyncs the commit log, the derived files and the apply marker, then writes the checkpoint. The
syncing runs without the store lock, so apply goes on meanwhile (and fdatasync releases the GIL); only
what was applied when the flush began is vouched for. Lock order: the flush lock, then the store lock;
callers must not hold the store lock."""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

from commitlog.checkpoint import Checkpoint, write_checkpoint
from commitlog.errors import StoreError, SyncError, stop_on_sync_error
from commitlog.mapped_file import drop_cached
from commitlog.state import APPLY_POSITION_NAME, CHECKPOINT_NAME, StoreState

log = logging.getLogger(__name__)


def flush(state: StoreState) -> None:
    """Make everything applied so far durable: fdatasync the commit log, the derived files and the apply
    marker, then write the checkpoint that vouches for them."""
    with state.flush_lock:
        with state.lock:
            end = state.commit_log.end_offset
            paths = state.commit_log.paths_between(state.flushed_end, end)
            for queue in state.dirty_queues:
                paths.extend(queue.take_unflushed_paths())
            state.dirty_queues.clear()
            paths.extend(state.index.recent_paths())
            # the marker is preallocated: synced after the data, it vouches for it even if no space is
            # left for the checkpoint's temp file
            paths.append(state.root / APPLY_POSITION_NAME)
            checkpoint = Checkpoint(
                state.applied_raft_index,
                end,
                state.min_offset,
                tuple((t, q, queue.min_offset, queue.max_offset) for (t, q), queue in sorted(state.queues.items())),
                tuple((f.begin_physical, f.entry_count) for f in state.index.files),
                state.extension_provider() if state.extension_provider else state.extension,
            )
        for path in paths:
            _fdatasync(path)
        write_checkpoint(state.root / CHECKPOINT_NAME, checkpoint)
        with state.lock:
            state.flushed_end = end
            state.last_flush = state.clock()
            drops = state.commit_log.release_flushed(end)
        for path, start, drop_end in drops:  # flushed, so clean: dropped, not written back
            drop_cached(path, start, drop_end)


def flush_if_due(state: StoreState) -> None:
    """Flush once ``flush_interval_ms`` passed since the last flush."""
    if state.clock() - state.last_flush >= state.config.flush_interval_ms / 1000:
        flush(state)


def flush_or_stop(state: StoreState, what: str) -> None:
    """Flush after an apply or from the background thread. No space for the checkpoint must not undo or
    hide the apply: the records and the marker are in place, and the next flush tries again. A failed sync
    stops the process (:class:`SyncError`): under ``flush_policy = "sync"`` the append would be acknowledged
    otherwise."""
    try:
        flush(state)
    except SyncError as exc:
        stop_on_sync_error(f"the store's {what}", exc)
    except StoreError as exc:
        log.warning("%s failed, will retry: %s", what, exc)
    except OSError as exc:  # the checkpoint's fsync or rename
        stop_on_sync_error(f"the store's {what}", exc)


class FlushThread:
    """The async policy's background flush, every ``flush_interval_ms``."""

    def __init__(self, state: StoreState) -> None:
        self._state = state
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="store-flush", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        interval = self._state.config.flush_interval_ms / 1000
        while not self._stop.wait(interval):
            flush_or_stop(self._state, "background flush")

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def _fdatasync(path: Path) -> None:
    """Write back a file's dirty pages, including those dirtied through a shared mapping. A file deleted
    meanwhile (retention) has nothing left to make durable."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return
    try:
        os.fdatasync(fd)
    except OSError as exc:
        raise SyncError(f"cannot sync {path}: {exc.strerror}") from exc
    finally:
        os.close(fd)
