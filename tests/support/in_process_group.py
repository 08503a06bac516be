"""Group members in the test's own process (``dledger.member.GroupMember``), always stopped."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path

from dledger.config import NodeConfig
from dledger.member import GroupMember

__all__ = ["running_members"]


@contextlib.contextmanager
def running_members(configs: Sequence[Path]) -> Iterator[list[GroupMember]]:
    """A member per TOML file, started in order; on leaving, however the block ends, every started member
    is stopped (its Raft threads, sockets and store closed)."""
    members: list[GroupMember] = []
    try:
        for config in configs:
            members.append(GroupMember(NodeConfig.from_toml(config)))
        yield members
    finally:
        for member in members:
            member.stop()
