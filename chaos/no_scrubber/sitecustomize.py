"""Members started with this directory first on PYTHONPATH run without their scrubber: a fault injected into
their files stays there until something else finds it (the live audit's test and ``make audit-cluster``
flip a byte and show that ``verify`` names it; the scrubber would put the byte back from a peer within a
second or so, before the audit reads it).

The scrubber thread starts but waits for :data:`PAUSE_SECONDS` before its first step (it reads the module's
pause on every step). Another ``sitecustomize`` further down PYTHONPATH (``make test-at``'s clock) is still
imported, first.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys

PAUSE_SECONDS = 1e9
_HERE = os.path.dirname(os.path.abspath(__file__))


def _import_next_sitecustomize() -> None:
    later = [entry for entry in sys.path if os.path.abspath(entry or os.curdir) != _HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", later)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


_import_next_sitecustomize()

import dledger.member  # noqa: E402 - after the other sitecustomize (it may move the clock first)

dledger.member.SCRUB_PAUSE_SECONDS = PAUSE_SECONDS
