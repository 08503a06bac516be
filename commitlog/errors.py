"""The two kinds of error: operating errors are exceptions callers handle; a broken
invariant stops the process loudly through :func:`invariant`, which ``python -O`` cannot strip."""

from __future__ import annotations

import logging
import os
from typing import Final, NoReturn

log = logging.getLogger(__name__)

#: the exit code of a process stopped by a failed fsync or msync (EX_IOERR)
EXIT_SYNC_FAILED: Final = 74


class InvariantError(AssertionError):
    """A programmer error: the process state can no longer be trusted."""


def invariant(condition: bool, message: str) -> None:
    if not condition:
        fail(message)


def fail(message: str) -> NoReturn:
    raise InvariantError(message)


class StoreError(Exception):
    """An operating error of the store (bad configuration, unreadable files, disk full)."""


class CorruptionError(StoreError):
    """Stored bytes fail validation somewhere recovery cannot repair by itself."""


class DamagedRecordError(CorruptionError):
    """A committed record a verified read needed fails its checks (body CRC, layout, its own offset): its
    bytes are not the group's. Deciding from them could make this replica diverge; the record must be put
    back from a peer's copy (``MessageStore.repair_record``) before the read is made again."""

    def __init__(self, physical_offset: int, reason: str) -> None:
        super().__init__(f"the record at commit-log offset {physical_offset} is damaged: {reason}")
        self.physical_offset = physical_offset


class DiskFullError(StoreError):
    """A write failed for lack of space; nothing was reported appended."""


class SyncError(StoreError):
    """An fsync, fdatasync or msync failed: what it was to make durable may be lost, and calling it again can
    report success for data the kernel already dropped (its error is reported once). Never retried."""


def stop_on_sync_error(what: str, exc: BaseException) -> NoReturn:
    """A failed sync is fatal: the process stops at once (a supervisor restarts it), and on restart it recovers
    from what is on the disk. Nothing acknowledged may rest on the write that failed."""
    log.critical("%s failed: %s: stopping", what, exc)
    logging.shutdown()
    os._exit(EXIT_SYNC_FAILED)
