"""The member's scrubber checks the key-index files too, through real members (three in this process): a slot
of a follower's index file gone bad while it runs (which no lookup meets: the bucket only looks empty) is found
and the file rebuilt from the commit log, byte for byte the leader's (issue #24)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from commitlog.key_index import HEADER_BYTES
from dledger import member as member_module
from tests.dledger.test_member_byte_config import leader_of, plain, write_configs
from tests.support.in_process_group import running_members
from tests.support.waiting import wait_for


def test_the_scrubber_rebuilds_a_key_index_file_a_byte_went_bad_in(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(member_module, "INDEX_SCRUB_INTERVAL_SECONDS", 0.25)  # every step, not every 10 s
    with running_members(write_configs(tmp_path)) as members:
        leader = leader_of(members)
        for number in range(1, 41):
            leader.append([plain(number)]).result(timeout=30)
        end = leader.store.max_physical_offset
        wait_for(lambda: all(member.store.max_physical_offset == end for member in members),
                 "the messages stored", timeout_seconds=30)
        follower = next(member for member in members if member is not leader)
        name = leader.store.index.files[0].file.path.name
        ours = follower.store.root / "index" / name
        theirs = leader.store.root / "index" / name
        wait_for(lambda: ours.read_bytes() == theirs.read_bytes() or None, "the index files alike",
                 timeout_seconds=30)
        slots = ours.read_bytes()[HEADER_BYTES : HEADER_BYTES + 4000]
        at = HEADER_BYTES + next(position for position in range(0, len(slots), 4) if slots[position : position + 4] != bytes(4))
        descriptor = os.open(ours, os.O_RDWR)
        try:
            os.pwrite(descriptor, bytes(4), at)  # a bucket emptied: its keys no longer found on this replica
        finally:
            os.close(descriptor)
        assert ours.read_bytes() != theirs.read_bytes()
        wait_for(lambda: ours.read_bytes() == theirs.read_bytes() or None,
                 "the scrubber to rebuild the damaged key-index file",
                 timeout_seconds=30)
