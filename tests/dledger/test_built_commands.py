"""The leader's commands for its own entries (dledger.member.BuiltCommands): found by the very bytes object
proposed, in proposal order, and what decoding the entry gives."""

from __future__ import annotations

from pathlib import Path

from commitlog.records import RecordBuilder
from dledger.command import Command, LeaderStamp, decode_command, encode_command, encode_records_command
from dledger.member import BuiltCommands
from dledger.raft_node import RAW_COMMAND_PREFIX
from tests.commitlog.helpers import message, small_config


def entry(number: int) -> tuple[bytes, Command]:
    command = Command((LeaderStamp(number, "n1", number),))
    return RAW_COMMAND_PREFIX + encode_command(command), command


def test_an_entry_is_found_by_the_object_proposed_not_by_equal_bytes() -> None:
    built = BuiltCommands()
    data, command = entry(1)
    built.remember(data, command)
    assert built.take(bytes(bytearray(data))) is None  # equal bytes, another object: another leader's entry
    assert built.take(data) is command
    assert built.take(data) is None  # taken once


def test_entries_before_the_one_applied_are_let_go_and_others_kept() -> None:
    built = BuiltCommands()
    entries = [entry(number) for number in range(4)]
    for data, command in entries:
        built.remember(data, command)
    assert built.take(entries[2][0]) is entries[2][1]  # 0 and 1 were never appended (failed proposals)
    assert built.take(entries[0][0]) is None and built.take(entries[1][0]) is None
    assert built.take(entry(9)[0]) is None  # not ours: what is held stays
    assert built.take(entries[3][0]) is entries[3][1]
    built.remember(*entries[0])
    built.clear()
    assert built.take(entries[0][0]) is None


def test_the_bound_lets_the_oldest_go() -> None:
    built = BuiltCommands(entries_max=2)
    entries = [entry(number) for number in range(3)]
    for data, command in entries:
        built.remember(data, command)
    assert built.take(entries[0][0]) is None
    assert built.take(entries[1][0]) is entries[1][1]


def test_a_built_records_command_is_what_its_entry_decodes_to(tmp_path: Path) -> None:
    config = small_config(tmp_path)
    builder = RecordBuilder(config.store_host_bytes, config.segment_size_bytes, config.body_size_max_bytes)
    records = builder.build([message(n, keys=f"k{n}") for n in range(100)], 1_700_000_000_000)
    assert records is not None
    for compress in (False, True):
        data = encode_records_command(records, compress=compress, prefix=RAW_COMMAND_PREFIX)
        assert decode_command(data[len(RAW_COMMAND_PREFIX):]) == Command((records,))
