"""One configuration of the bytes, at apply: the first BYTE_CONFIG applied is the group's for good, and a
member whose own settings differ stops before it writes anything (no StateMachine applies with settings
other than the group's)."""

from __future__ import annotations

import dataclasses
import struct
import zlib
from pathlib import Path
from typing import Any

import pytest

from commitlog.config import StoreConfig
from commitlog.hosts import encode_host
from commitlog.records import RecordBuilder
from commitlog.store import MessageStore
from dledger.apply import ByteConfigMismatchError, StateMachine, check_byte_config
from dledger.command import (
    BYTE_SETTINGS,
    ByteConfig,
    Command,
    CommandError,
    Messages,
    OpType,
    decode_command,
    encode_command,
    encode_records_command,
)
from dledger.state import ReplicatedState
from tests.commitlog.helpers import data_bytes, message, small_config

#: one setting at a time, changed on one member: each changes the stored bytes or the derived files
OTHER_SETTINGS: list[tuple[str, Any]] = [
    ("segment_size_bytes", 256 * 1024),
    ("store_host", "10.9.9.9:10911"),
    ("body_size_max_bytes", 16 * 1024),
    ("consume_queue_units_per_file", 128),
    ("index_slot_count", 128),
    ("index_entry_capacity", 512),
]


def machine(directory: Path, **overrides: Any) -> StateMachine:
    state = ReplicatedState()
    store = MessageStore(small_config(directory, **overrides), extension_provider=lambda: state.encode())
    return StateMachine(store, state)


def written(root: Path) -> dict[str, bytes]:
    """The data files holding anything (a segment preallocated in the background holds zeros only)."""
    return {name: data for name, data in data_bytes(root).items() if data.count(0) != len(data)}


def group_config(directory: Path) -> ByteConfig:
    return ByteConfig.of(small_config(directory))


def test_every_byte_setting_is_covered() -> None:
    assert {name for name, _ in OTHER_SETTINGS} == set(BYTE_SETTINGS)
    # the settings that are each member's own are not part of it
    own = ByteConfig.of(small_config(Path("/x"), flush_policy="sync", flush_interval_ms=1, page_cache_keep_bytes=0))
    assert own == ByteConfig.of(small_config(Path("/y")))


@pytest.mark.parametrize(("setting", "value"), OTHER_SETTINGS)
def test_a_member_with_another_setting_stops_at_the_groups_configuration_before_writing(
        tmp_path: Path, setting: str, value: Any) -> None:
    group = group_config(tmp_path)
    ours = machine(tmp_path / "same")
    other = machine(tmp_path / "other", **{setting: value})
    before = written(tmp_path / "other")
    # the configuration and messages in one command: nothing of it may be written with the other setting
    command = encode_command(Command((group, Messages((message(1),)))))
    assert ours.apply(1, command).message_results[0][0].physical_offset == 0
    assert ours.state.byte_config == group
    with pytest.raises(ByteConfigMismatchError) as raised:
        other.apply(1, command)
    shown = dict(group.settings)[setting]
    mine = dict(ByteConfig.of(other.store.config).settings)[setting]
    assert f"{setting}: ours {mine}, the group's {shown}" in str(raised.value)
    assert other.state.byte_config is None and other.applied_index == 0
    assert other.store.max_physical_offset == 0 and written(tmp_path / "other") == before
    # and it refuses again when the entry comes again (a restart replays it)
    with pytest.raises(ByteConfigMismatchError):
        other.apply(1, command)


def test_the_first_configuration_applied_is_the_groups(tmp_path: Path) -> None:
    group = group_config(tmp_path)
    later = ByteConfig.of(small_config(tmp_path, segment_size_bytes=256 * 1024))
    sm = machine(tmp_path / "a")
    sm.apply(1, encode_command(Command((group,))))
    # a leader that had not applied the first proposes its own: it changes nothing, and this member goes on
    assert sm.apply(2, encode_command(Command((later,)))).noop_reason is None
    assert sm.state.byte_config == group
    sm.apply(3, encode_command(Command((Messages((message(3),)),))))
    assert sm.store.max_queue_offset("TopicTest", 0) == 1
    # a member with the later one's settings stops at the first
    other = machine(tmp_path / "b", segment_size_bytes=256 * 1024)
    with pytest.raises(ByteConfigMismatchError, match="segment_size_bytes: ours 262144, the group's 131072"):
        other.apply(1, encode_command(Command((group,))))


def test_an_existing_state_without_a_configuration_gets_one_and_keeps_it(tmp_path: Path) -> None:
    directory = tmp_path / "a"
    sm = machine(directory)
    sm.apply(1, encode_command(Command((Messages((message(1), message(2))),))))
    before = sm.state.byte_config  # none: data from before the configuration existed
    group = group_config(tmp_path)
    sm.apply(2, encode_command(Command((group,))))
    assert before is None and sm.state.byte_config == group
    sm.apply(3, encode_command(Command((Messages((message(3),)),))))
    assert sm.store.max_queue_offset("TopicTest", 0) == 3
    sm.store.close()
    reopened = MessageStore(small_config(directory))
    try:
        assert ReplicatedState.decode(reopened.extension).byte_config == group
    finally:
        reopened.close()


def test_state_versions_before_the_configuration_stay_readable() -> None:
    state = ReplicatedState(applied_index=4, acl_document=b"{}")
    encoded = state.encode()
    body = encoded[:-4]
    assert body.endswith(struct.pack(">II", 0, 0))  # no configuration, no pop state: empty sections
    body = body[:4] + struct.pack(">H", 4) + body[6:-8]  # as version 4 wrote it
    decoded = ReplicatedState.decode(body + struct.pack(">I", zlib.crc32(body)))
    assert decoded == state and decoded.byte_config is None
    configured = ReplicatedState(byte_config=ByteConfig.of(small_config(Path("/x"))))
    assert ReplicatedState.decode(configured.encode()) == configured


def test_the_configuration_travels_by_name_and_canonically() -> None:
    config = ByteConfig.of(small_config(Path("/x"), store_host="010.001.002.003:10911"))
    assert dict(config.settings)["store_host"] == "10.1.2.3:10911"
    assert config == ByteConfig.of(small_config(Path("/y")))  # the same address, spelled otherwise
    assert config.store_host_bytes == encode_host("10.1.2.3", 10911)
    (decoded,) = decode_command(encode_command(Command((config,)))).operations
    assert decoded == config and decoded.store_host_bytes == config.store_host_bytes
    assert hash(decoded) == hash(config) and dataclasses.asdict(config) == {"settings": config.settings}
    assert ByteConfig((("store_host", "not an address"),)).store_host_bytes is None
    # a setting one side lacks is a difference too (a later version's setting)
    newer = ByteConfig((*config.settings, ("zeta_bytes", "1")))
    assert config.differences(newer) == [("zeta_bytes", None, "1")]
    with pytest.raises(ByteConfigMismatchError, match=r"zeta_bytes: ours \(none\), the group's 1"):
        check_byte_config(config, newer)
    check_byte_config(config, None)  # no group configuration yet: nothing to compare
    unsorted = ByteConfig(tuple(reversed(config.settings)))
    payload = encode_command(Command((unsorted,)), compress=False)
    assert payload[6] == OpType.BYTE_CONFIG
    with pytest.raises(CommandError, match="sorted"):
        decode_command(payload)


def test_records_with_a_store_host_other_than_the_groups_are_a_noop_on_every_replica(tmp_path: Path) -> None:
    group = group_config(tmp_path)
    foreign: StoreConfig = small_config(tmp_path, store_host="10.9.9.9:10911")
    builder = RecordBuilder(foreign.store_host_bytes, foreign.segment_size_bytes, foreign.body_size_max_bytes)
    records = builder.build([message(1)], 1_700_000_000_000)
    assert records is not None
    follower, leader = machine(tmp_path / "a"), machine(tmp_path / "b")
    for sm in (follower, leader):
        sm.apply(1, encode_command(Command((group,))))
    assert "store host" in (follower.apply(2, encode_records_command(records)).noop_reason or "")
    assert "store host" in (leader.apply(2, b"", Command((records,))).noop_reason or "")
    assert follower.store.max_physical_offset == leader.store.max_physical_offset == 0


def test_an_ipv6_store_host_is_compared_canonically_and_carried_by_every_replica(tmp_path: Path) -> None:
    """Members that spell the group's IPv6 store host differently have one configuration; records of an IPv6
    group carry it (sysFlag 0x20) on every replica, and an IPv4 address is another group's."""
    from commitlog.hosts import encode_address
    from commitlog.record_codec import decode_record
    from commitlog.sys_flags import SYSFLAG_STOREHOST_V6

    config = ByteConfig.of(small_config(Path("/x"), store_host="[FD00:0:0::3]:10911"))
    assert dict(config.settings)["store_host"] == "[fd00::3]:10911"
    assert config == ByteConfig.of(small_config(Path("/y"), store_host="[fd00::0:3]:10911"))
    assert config.store_host_bytes == encode_address("[fd00::3]:10911") and len(config.store_host_bytes) == 20
    assert config.differences(group_config(Path("/z"))) == [("store_host", "[fd00::3]:10911", "10.1.2.3:10911")]
    check_byte_config(config, config)
    with pytest.raises(ByteConfigMismatchError, match=r"store_host: ours \[fd00::3\]:10911, the group's 10.1.2.3"):
        check_byte_config(config, group_config(Path("/z")))
    (decoded,) = decode_command(encode_command(Command((config,)))).operations
    assert decoded == config and decoded.store_host_bytes == config.store_host_bytes
    assert hash(decoded) == hash(config) and dataclasses.asdict(config) == {"settings": config.settings}
    assert ByteConfig((("store_host", "not an address"),)).store_host_bytes is None

    follower = machine(tmp_path / "a", store_host="[fd00::3]:10911")
    leader = machine(tmp_path / "b", store_host="[FD00::0:3]:10911")
    for sm in (follower, leader):
        sm.apply(1, encode_command(Command((config,))))
    store = leader.store.config
    builder = RecordBuilder(store.store_host_bytes, store.segment_size_bytes, store.body_size_max_bytes)
    records = builder.build([message(n) for n in range(5)], 1_700_000_000_000)
    assert records is not None
    assert follower.apply(2, encode_records_command(records)).noop_reason is None
    mine = leader.apply(2, b"", Command((records,)))
    assert mine.noop_reason is None and len(mine.message_results[0][0].msg_id) == 56
    raw = leader.store.read_record(mine.message_results[0][0].physical_offset)
    assert decode_record(raw).sys_flag & SYSFLAG_STOREHOST_V6
    foreign = RecordBuilder(encode_address("10.1.2.3:10911"), store.segment_size_bytes, store.body_size_max_bytes)
    other = foreign.build([message(9)], 1_700_000_000_001)
    assert other is not None
    assert "store host" in (follower.apply(3, encode_records_command(other)).noop_reason or "")
    for sm in (follower, leader):
        sm.store.close()
    assert written(tmp_path / "a") == written(tmp_path / "b")
