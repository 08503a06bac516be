"""Programmer errors: a broken invariant stops the process loudly through :func:`invariant`, which
``python -O`` cannot strip (an ``assert`` would be). Operating errors are exceptions of their own that
callers handle; they live beside the code that raises them (``commitlog.errors`` for the store).

Defined here, at the bottom of the layers, because every layer checks its invariants this one way: the
codec's struct sizes at import as much as the store's offsets."""

from __future__ import annotations

from typing import NoReturn


class InvariantError(AssertionError):
    """A programmer error: the process state can no longer be trusted."""


def invariant(condition: bool, message: str) -> None:
    if not condition:
        fail(message)


def fail(message: str) -> NoReturn:
    raise InvariantError(message)
