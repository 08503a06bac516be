"""A failed fsync, fdatasync or msync stops the process: never retried, never acknowledged on (a second
fdatasync can report success for data the kernel dropped after the first one failed)."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

import commitlog.flush as flush_module
from commitlog.errors import EXIT_SYNC_FAILED, StoreError, SyncError
from commitlog.mapped_file import MappedFile
from commitlog.store import MessageStore
from tests.commitlog.helpers import message, small_config


class Stopped(Exception):
    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


@pytest.fixture
def stops(monkeypatch: pytest.MonkeyPatch) -> None:
    def exit_now(code: int) -> None:
        raise Stopped(code)

    monkeypatch.setattr(os, "_exit", exit_now)


def failing_fdatasync(fd: int) -> None:
    raise OSError(errno.EIO, "Input/output error")


@pytest.mark.usefixtures("stops")
def test_sync_policy_stops_instead_of_acknowledging_after_a_failed_fdatasync(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = MessageStore(small_config(tmp_path, flush_policy="sync"))
    try:
        store.append(1, [message(1)])
        monkeypatch.setattr(os, "fdatasync", failing_fdatasync)
        with pytest.raises(Stopped) as stopped:
            store.append(2, [message(2)])  # its return would be the acknowledgement
        assert stopped.value.code == EXIT_SYNC_FAILED
    finally:
        monkeypatch.undo()
        store.abandon()


@pytest.mark.usefixtures("stops")
def test_the_background_flush_stops_on_a_failed_fdatasync_but_retries_a_full_disk(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = MessageStore(small_config(tmp_path), background_flush=False)
    try:
        store.append(1, [message(1)])
        flush = flush_module.flush
        monkeypatch.setattr(flush_module, "flush",
                            lambda state: (_ for _ in ()).throw(StoreError("no space for the checkpoint")))
        flush_module.flush_or_stop(store.state, "background flush")  # a full disk: logged, tried again next round
        monkeypatch.setattr(os, "fdatasync", failing_fdatasync)
        monkeypatch.setattr(flush_module, "flush", flush)
        with pytest.raises(Stopped) as stopped:
            flush_module.flush_or_stop(store.state, "background flush")
        assert stopped.value.code == EXIT_SYNC_FAILED
    finally:
        monkeypatch.undo()
        store.abandon()


def test_a_failed_msync_is_a_sync_error(tmp_path: Path) -> None:
    mapped = MappedFile(tmp_path / "file", 1 << 16, create=True)
    real = mapped.map
    try:
        real[0:100] = b"x" * 100
        mapped._map = _FailingFlush(real)  # type: ignore[assignment]
        with pytest.raises(SyncError, match="cannot sync"):
            mapped.flush(0, 100)
    finally:
        mapped._map = real
        real.close()


class _FailingFlush:
    """A mapping whose msync fails (an mmap object's methods cannot be patched)."""

    def __init__(self, wrapped: object) -> None:
        self._wrapped = wrapped
        self.closed = False

    def flush(self, offset: int = 0, size: int = 0) -> None:
        raise OSError(errno.EIO, "Input/output error")
