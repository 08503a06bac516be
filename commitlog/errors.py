"""The two kinds of error (house style 5): operating errors are exceptions callers handle; a broken
invariant stops the process loudly through :func:`invariant`, which ``python -O`` cannot strip."""

from __future__ import annotations

from typing import NoReturn


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


class DiskFullError(StoreError):
    """A write failed for lack of space; nothing was reported appended."""
