"""One configuration of the bytes, through real members (three in this process, one in a child process):
the first leader proposes its byte configuration before anything else; a member started with other store
settings than the group's stops with a message naming them, before it writes anything; data directories
from before the configuration existed get one; a follower repairs a damaged timer from a peer before it
releases it.

New names are reached through their modules where the old code would fail to import them, so that each
test runs its members and fails on its assertions where the feature is missing."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import dledger.apply as apply_module
import dledger.command as command_module
from commitlog.checkpoint import read_checkpoint, write_checkpoint
from commitlog.hosts import encode_host
from commitlog.message import MessageInput
from commitlog.state import CHECKPOINT_NAME
from dledger.command import Command, Messages, TimerRelease, decode_command
from dledger.config import NodeConfig
from dledger.member import GroupMember
from dledger.raft_node import RAW_COMMAND_PREFIX
from dledger.state import ReplicatedState
from dledger.timers import due_second, schedule
from tests.dledger.group import SECRET
from tests.support.in_process_group import running_members
from tests.support.process_group import REPOSITORY_ROOT, member_configs, member_environment
from tests.support.waiting import wait_for

#: small files (the defaults preallocate a 1 GiB segment and large index files per member)
STORE: dict[str, Any] = {"store_host": "10.1.2.3:10911", "segment_size_bytes": 2 << 20, "body_size_max_bytes": 1 << 20,
                         "consume_queue_units_per_file": 1000, "index_slot_count": 1000, "index_entry_capacity": 4000}
BODY_AT = 88  # where a record's body starts (IPv4 born host)
#: a member process that starts and stops: what a restart with other settings does first
START_AND_STOP = """
import logging, sys
from pathlib import Path
from dledger.config import NodeConfig
from dledger.member import GroupMember
logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
member = GroupMember(NodeConfig.from_toml(Path(sys.argv[1])))
print("started", flush=True)
member.stop()
"""


def write_configs(root: Path, store: dict[str, Any] | None = None) -> list[Path]:
    return [config.path for config in member_configs(root, 3, secret=SECRET, sections={"store": store or STORE})]


def plain(number: int) -> MessageInput:
    return MessageInput("Bytes", 0, 0, 0, number, encode_host("127.0.0.1", 1), 0, 0, 0, bytes([number]) * 300,
                        b"UNIQ_KEY\x01bytes-%d\x02" % number)


def raw_operations(member: GroupMember) -> list[str]:
    """The operation types of this member's own commands in its Raft log, in log order."""
    journal = member.raft._SyncObj__raftLog
    return [type(operation).__name__ for command, _, _ in (journal[index] for index in range(len(journal)))
            if bytes(command[:2]) == RAW_COMMAND_PREFIX
            for operation in decode_command(bytes(command[2:])).operations]


def leader_of(members: list[GroupMember]) -> GroupMember:
    return wait_for(lambda: next((member for member in members if member.is_leader), None), "a leader",
                    timeout_seconds=60)


def files_of(root: Path) -> dict[str, tuple[int, bytes]]:
    """Every file under ``root``: modification time and content (a member that must not start writes nothing)."""
    return {str(path.relative_to(root)): (path.stat().st_mtime_ns, path.read_bytes())
            for path in sorted(root.rglob("*")) if path.is_file()}


@pytest.fixture(scope="module")
def established(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[Path], list[list[str]]]:
    """A group that stored a message, then stopped: its configurations and each member's own operations."""
    configs = write_configs(tmp_path_factory.mktemp("group"))
    with running_members(configs) as members:
        leader = leader_of(members)
        leader.append([plain(1)]).result(timeout=30)
        end = leader.store.max_physical_offset
        wait_for(lambda: all(member.store.max_physical_offset == end for member in members), "every member",
                 timeout_seconds=30)
        operations = [raw_operations(member) for member in members]
    return configs, operations


def test_a_new_group_records_its_byte_configuration_before_anything_else(
        established: tuple[list[Path], list[list[str]]]) -> None:
    configs, operations = established
    for member_operations in operations:
        assert member_operations[:1] == ["ByteConfig"] and "PreparedRecords" in member_operations
    expected = command_module.ByteConfig.of(NodeConfig.from_toml(configs[0]).store_config)
    for config in configs:
        checkpoint = read_checkpoint(NodeConfig.from_toml(config).store_config.data_dir / CHECKPOINT_NAME)
        assert checkpoint is not None
        assert ReplicatedState.decode(checkpoint.extension).byte_config == expected


@pytest.mark.parametrize(("setting", "value", "group_value"), [
    ("segment_size_bytes", 4 << 20, str(2 << 20)),
    ("store_host", "10.9.9.9:10911", "10.1.2.3:10911"),
    ("body_size_max_bytes", 1 << 19, str(1 << 20)),
])
def test_a_member_with_other_store_settings_refuses_to_start_and_writes_nothing(
        established: tuple[list[Path], list[list[str]]], tmp_path: Path, setting: str, value: Any,
        group_value: str) -> None:
    configs, _ = established
    node = NodeConfig.from_toml(configs[2])
    other = tmp_path / "n2-other.toml"
    other.write_text(configs[2].read_text().replace(f"{setting} = {STORE[setting]!r}".replace("'", '"'),
                                                    f"{setting} = {value!r}".replace("'", '"')))
    assert other.read_text() != configs[2].read_text()
    before = files_of(node.data_dir)
    finished = subprocess.run([sys.executable, "-c", START_AND_STOP, str(other)], cwd=REPOSITORY_ROOT,
                              env=member_environment(),
                              capture_output=True, text=True, timeout=120)
    assert "started" not in finished.stdout
    shown = str(value)
    assert f"{setting}: ours {shown}, the group's {group_value}" in finished.stderr, finished.stderr
    assert files_of(node.data_dir) == before  # nothing written, nothing created, nothing touched
    assert finished.returncode == apply_module.EXIT_BYTE_CONFIG_MISMATCH


def test_data_directories_without_a_byte_configuration_get_one(tmp_path: Path) -> None:
    configs = write_configs(tmp_path)
    with running_members(configs) as members:
        (first,) = leader_of(members).append([plain(1)]).result(timeout=30)
        wait_for(lambda: all(member.store.max_physical_offset > first.physical_offset for member in members),
                 "every member to store the message",
                 timeout_seconds=30)
    for config in configs:  # as a version before the configuration left them
        path = NodeConfig.from_toml(config).store_config.data_dir / CHECKPOINT_NAME
        checkpoint = read_checkpoint(path)
        assert checkpoint is not None
        state = ReplicatedState.decode(checkpoint.extension)
        state.byte_config = None
        write_checkpoint(path, dataclasses.replace(checkpoint, extension=state.encode()))
    expected = command_module.ByteConfig.of(NodeConfig.from_toml(configs[0]).store_config)
    with running_members(configs) as members:
        (second,) = leader_of(members).append([plain(2)]).result(timeout=30)
        wait_for(lambda: all(member.state.byte_config == expected for member in members),
                 "every member to apply the group's byte configuration",
                 timeout_seconds=30)
        wait_for(lambda: all(member.store.max_physical_offset > second.physical_offset for member in members),
                 "every member to store the second message",
                 timeout_seconds=30)
        for member in members:
            assert member.store.read_message(first.physical_offset).body == plain(1).body


def test_a_follower_repairs_a_damaged_timer_from_a_peer_before_releasing_it(tmp_path: Path) -> None:
    with running_members(write_configs(tmp_path)) as members:
        leader = leader_of(members)
        leader.append([plain(1)]).result(timeout=30)
        store_timestamp = leader.state.last_store_timestamp
        due_ms = store_timestamp + 3000
        stored = leader.propose(Command((Messages((schedule(plain(2)._replace(store_timestamp=store_timestamp), due_ms),)),)))
        timer_offset = stored.message_results[0][0].physical_offset
        end = leader.store.max_physical_offset
        wait_for(lambda: all(member.store.max_physical_offset == end for member in members),
                 "the timer stored", timeout_seconds=30)
        follower = next(member for member in members if member is not leader)
        follower._stop_scrubber.set()  # apply, not the scrubber, must meet the damage
        follower._scrubber.join(timeout=10)
        segment = follower.store.commit_log.segments[follower.store.commit_log.segment_start(timer_offset)]
        descriptor = os.open(segment.path, os.O_RDWR)
        try:
            at = timer_offset - follower.store.commit_log.segment_start(timer_offset) + BODY_AT + 5
            os.pwrite(descriptor, bytes([os.pread(descriptor, 1, at)[0] ^ 0x01]), at)
        finally:
            os.close(descriptor)
        released = leader.propose(Command((TimerRelease(due_second(due_ms)),)))
        assert [result.queue_offset for result in released.message_results[0]] == [1]  # the timer, released
        end = leader.store.max_physical_offset
        wait_for(lambda: all(member.store.max_physical_offset == end for member in members), "the release",
                 timeout_seconds=30)
        for member in members:
            assert member.store.read_committed(0, end) == leader.store.read_committed(0, end)


@pytest.mark.parametrize("damage", ["size field", "zeros"])
def test_a_record_whose_own_size_field_is_damaged_is_repaired_from_a_peer(tmp_path: Path, damage: str) -> None:
    """The size comes from the peer's copy: a flipped size byte, or a segment rolled back to zeros, left the
    scrubber retrying a repair it could not make, forever."""
    with running_members(write_configs(tmp_path)) as members:
        leader = leader_of(members)
        (stored,) = leader.append([plain(1)]).result(timeout=30)
        end = leader.store.max_physical_offset
        wait_for(lambda: all(member.store.max_physical_offset == end for member in members),
                 "the message stored", timeout_seconds=30)
        follower = next(member for member in members if member is not leader)
        follower._stop_scrubber.set()  # the repair is called here, not by the scrubber
        follower._scrubber.join(timeout=10)
        offset = stored.physical_offset
        segment = follower.store.commit_log.segments[follower.store.commit_log.segment_start(offset)]
        at = offset - follower.store.commit_log.segment_start(offset)
        descriptor = os.open(segment.path, os.O_RDWR)
        try:
            size = int.from_bytes(os.pread(descriptor, 4, at), "big")
            os.pwrite(descriptor, b"\x00\x7f\x00\x39" if damage == "size field" else bytes(size), at)
        finally:
            os.close(descriptor)
        assert follower.store.read_committed(offset, end) != leader.store.read_committed(offset, end)
        follower._repair(offset)
        assert follower.store.read_committed(0, end) == leader.store.read_committed(0, end)


def test_a_member_whose_snapshot_is_damaged_on_disk_catches_up_from_the_leaders(tmp_path: Path) -> None:
    """Its own snapshot fails its CRC at start, its journal is compacted past it: it applies nothing more
    until the leader's snapshot is installed (which it had refused as "not newer than our log")."""
    configs = write_configs(tmp_path)
    for config in configs:
        config.write_text(config.read_text() + "[raft]\nlog_compaction_entries = 5\nlog_compaction_seconds = 1\n")
    with running_members(configs) as members:
        leader = leader_of(members)
        for number in range(1, 40):
            leader.append([plain(number % 200 + 1)]).result(timeout=30)
        follower = next(member for member in members if member is not leader)
        wait_for(lambda: follower.raft.journal().first_index > 3 and follower.snapshot_path.exists(),
                 "the follower to compact its journal",
                 timeout_seconds=60)
        index = members.index(follower)
    members[index].stop()
    snapshot = NodeConfig.from_toml(configs[index]).data_dir / "raft" / "snapshot"
    data = bytearray(snapshot.read_bytes())
    data[len(data) // 2] ^= 0x40
    snapshot.write_bytes(bytes(data))
    with running_members(configs) as members:
        leader = leader_of(members)
        for number in range(40, 60):
            (last,) = leader.append([plain(number % 200 + 1)]).result(timeout=30)
        restarted = members[index]
        wait_for(lambda: restarted.store.max_physical_offset > last.physical_offset,
                 "the member with the damaged snapshot to catch up",
                 timeout_seconds=60)


def test_a_byte_gone_bad_outside_a_records_body_is_found_by_comparing_replicas_and_repaired(tmp_path: Path) -> None:
    """Only the body carries a CRC: a flipped byte in a record's properties passes validation. The scrubber
    compares each range's CRC-32 with the peers' and puts back the record that differs from both."""
    with running_members(write_configs(tmp_path)) as members:
        leader = leader_of(members)
        results = [leader.append([plain(number)]).result(timeout=30)[0] for number in range(1, 6)]
        end = leader.store.max_physical_offset
        wait_for(lambda: all(member.store.max_physical_offset == end for member in members),
                 "the messages stored", timeout_seconds=30)
        follower = next(member for member in members if member is not leader)
        target = results[2]
        segment = follower.store.commit_log.segments[follower.store.commit_log.segment_start(target.physical_offset)]
        at = target.physical_offset - follower.store.commit_log.segment_start(target.physical_offset)
        size = follower.store.record_extent(target.physical_offset)
        descriptor = os.open(segment.path, os.O_RDWR)
        try:
            last = at + size - 2  # inside the record's properties
            os.pwrite(descriptor, bytes([os.pread(descriptor, 1, last)[0] ^ 0x20]), last)
        finally:
            os.close(descriptor)
        assert follower.store.read_committed(0, end) != leader.store.read_committed(0, end)
        wait_for(lambda: follower.store.read_committed(0, end) == leader.store.read_committed(0, end) or None,
                 "the scrubber to find and repair the damaged properties",
                 timeout_seconds=30)
