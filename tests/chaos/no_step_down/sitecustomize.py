"""A control for the disk-full-leader chaos scenario, never on by itself: a Python process started with this
directory first on PYTHONPATH imports this module at startup, and a member among them no longer steps down
(nor holds back its candidacy) when its Raft journal finds the disk full: ``RaftNode._on_disk_full`` does
nothing. A leader whose disk fills then goes on leading, and the group is wedged until the disk is freed.
``tests/chaos/test_scenarios.py`` runs the scenario so (``RAFTMQ_CHAOS_CONTROLS=1``) to show that its verdict
reports the wedge.

It replaces ``tests/clock``'s sitecustomize (one is imported): not for ``make test-at``.
"""

from __future__ import annotations

import sys

from commitlog.errors import DiskFullError
from dledger.raft_node import RaftNode

#: written to stderr (a member's broker.log) by every process this module changed
DISABLED_TEXT = "control run: RaftNode._on_disk_full does nothing (tests/chaos/no_step_down)"


def _ignore_disk_full(self: RaftNode, exc: DiskFullError) -> None:
    """Neither step down nor keep out of elections: the append failed, and that is all."""


RaftNode._on_disk_full = _ignore_disk_full  # type: ignore[method-assign]
print(DISABLED_TEXT, file=sys.stderr, flush=True)
