"""Every member compacts its Raft log (writes a new snapshot) once a retention applied: a snapshot from before a
retention cannot be installed (dledger.catchup.fetch refuses it, the entries after it needing records retention
deleted), so a member that needs one must find a newer one. Three real members in this process."""

from __future__ import annotations

from pathlib import Path

from commitlog.hosts import encode_host
from commitlog.message import MessageInput
from dledger.command import Command, Retention
from dledger.member import GroupMember
from dledger.snapshot import read_snapshot
from tests.dledger.test_member_byte_config import STORE, leader_of, write_configs
from tests.support.in_process_group import running_members
from tests.support.waiting import wait_for

SEGMENT_BYTES = STORE["segment_size_bytes"]


def numbered(number: int) -> MessageInput:
    return MessageInput("Bytes", 0, 0, 0, number, encode_host("127.0.0.1", 1), 0, 0, 0, b"x" * 300,
                        b"UNIQ_KEY\x01retained-%d\x02" % number)


def snapshot_min(member: GroupMember) -> int | None:
    """Where the commit log began in the member's last snapshot (None before its first)."""
    if not member.snapshot_path.exists():
        return None
    return read_snapshot(member.snapshot_path).commit_log_min


def test_every_member_writes_a_snapshot_after_a_retention(tmp_path: Path) -> None:
    with running_members(write_configs(tmp_path)) as members:
        leader = leader_of(members)
        number = 0
        while len(leader.store.commit_log.starts) < 3:
            leader.append([numbered(number + offset) for offset in range(200)]).result(timeout=30)
            number += 200
        kept_from = max(leader.store.commit_log.starts)
        assert kept_from >= 2 * SEGMENT_BYTES
        end = leader.store.max_physical_offset
        wait_for(lambda: all(member.store.max_physical_offset == end for member in members), "every member's store",
                 timeout_seconds=30)
        assert all(snapshot_min(member) in (None, 0) for member in members)  # none after a retention yet
        leader.propose(Command((Retention(kept_from),)), timeout_seconds=30)
        wait_for(lambda: all(member.store.min_physical_offset == kept_from for member in members),
                 "the retention applied on every member", timeout_seconds=30)
        # the configured compaction is hours of entries away: only the retention makes these snapshots
        wait_for(lambda: all(snapshot_min(member) == kept_from for member in members),
                 "a snapshot taken after the retention on every member", timeout_seconds=20)
