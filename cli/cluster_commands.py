"""``raftmq cluster ...``, ``raftmq broker`` and ``raftmq namesrv``: the processes of a group."""

from __future__ import annotations

import click

COMMANDS: list[click.Command] = []
