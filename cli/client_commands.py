"""``raftmq topic|send|consume|msg|group|bench``: what users do with a running cluster, through client/."""

from __future__ import annotations

import click

COMMANDS: list[click.Command] = []
