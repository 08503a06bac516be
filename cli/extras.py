"""Optional parts of the install: ``raftmq[spark]`` (the Spark checks) and ``raftmq[chaos]`` (fault injection).

The broker, the name server, the client and most commands need neither; a command that does says which
extra to install instead of failing with an ImportError.
"""

from __future__ import annotations

import importlib.util
from typing import Final

import click

#: extra -> the modules it brings that our code imports
EXTRAS: Final[dict[str, tuple[str, ...]]] = {
    "spark": ("pyspark", "pyarrow"),
    "chaos": ("toxiproxy", "matplotlib", "pyspark", "pyarrow"),
}


def missing_modules(extra: str) -> list[str]:
    """The modules of ``extra`` that cannot be imported here (found without importing them)."""
    return [module for module in EXTRAS[extra] if importlib.util.find_spec(module) is None]


class MissingExtraError(click.ClickException):
    """A command needs an extra that is not installed (exit 1, the message says what to install)."""

    def __init__(self, extra: str, missing: list[str], what: str) -> None:
        super().__init__(f"{what} needs {', '.join(missing)}, which come(s) with the {extra} extra: "
                         f"pip install 'raftmq[{extra}]'")


def require_extra(extra: str, what: str) -> None:
    """Raise :class:`MissingExtraError` naming ``extra`` when any of its modules is missing."""
    missing = missing_modules(extra)
    if missing:
        raise MissingExtraError(extra, missing, what)
