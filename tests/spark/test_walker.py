"""The segment walk on its own: clean segments, damage, resynchronisation, truncated files (no Spark)."""

from __future__ import annotations

from pathlib import Path

from commitlog.record_codec import BLANK_MAGIC, FILLER, encode_record
from spark_analytics.equality import first_difference, record_field, vote
from spark_analytics.walker import walk_segment
from tests.commitlog.helpers import message

SEGMENT = 8192
STORE_HOST = bytes((10, 1, 2, 3)) + (10911).to_bytes(4, "big")


def segment_with(records: int, filler: bool) -> tuple[bytearray, list[int]]:
    """A segment of ``records`` records from offset 0, then a filler to the end or zeros."""
    data = bytearray(SEGMENT)
    offsets = []
    position = 0
    for number in range(records):
        record = encode_record(message(number, body=b"x" * 100), number, position, STORE_HOST)
        data[position : position + len(record)] = record
        offsets.append(position)
        position += len(record)
    if filler:
        FILLER.pack_into(data, position, SEGMENT - position, BLANK_MAGIC)
    return data, offsets


def kinds(data: bytes | bytearray) -> list[tuple[str, int]]:
    return [(entry.kind, entry.offset) for entry in walk_segment(bytes(data), 0, SEGMENT)]


def test_clean_segments_end_in_a_filler_or_the_zero_tail() -> None:
    data, offsets = segment_with(5, filler=True)
    walked = kinds(data)
    assert walked[:5] == [("message", offset) for offset in offsets]
    assert walked[5][0] == "filler" and len(walked) == 6
    data, offsets = segment_with(5, filler=False)
    assert kinds(data) == [*(("message", offset) for offset in offsets), ("end", offsets[-1] + offsets[1])]
    entries = list(walk_segment(bytes(data), 0, SEGMENT))
    assert entries[0].message is not None and entries[0].message.queue_offset == 0
    assert list(walk_segment(bytes(SEGMENT), 0, SEGMENT)) == [("end", 0, SEGMENT, None, None)]


def test_damage_costs_one_record_and_the_walk_resynchronises() -> None:
    data, offsets = segment_with(6, filler=False)
    data[offsets[2] + 1] ^= 0xFF  # total size of record 2
    walked = list(walk_segment(bytes(data), 0, SEGMENT))
    assert [(entry.kind, entry.offset) for entry in walked][:5] == [
        ("message", offsets[0]), ("message", offsets[1]), ("invalid", offsets[2]), ("message", offsets[3]),
        ("message", offsets[4])]
    assert walked[2].length == offsets[3] - offsets[2] and walked[2].problem


def test_a_record_that_does_not_decode_is_invalid_even_if_its_size_fits() -> None:
    data, offsets = segment_with(3, filler=False)
    data[offsets[1] + 84] ^= 0x01  # body length
    walked = kinds(data)
    assert walked[1] == ("invalid", offsets[1]) and walked[2] == ("message", offsets[2])


def test_a_filler_that_misses_the_segment_end_and_a_truncated_file_are_invalid() -> None:
    data, offsets = segment_with(3, filler=True)
    filler_offset = offsets[2] + offsets[1]
    FILLER.pack_into(data, filler_offset, 16, BLANK_MAGIC)
    assert kinds(data)[-2:] == [("invalid", filler_offset), ("end", filler_offset + 8)]
    data, offsets = segment_with(3, filler=False)
    walked = list(walk_segment(bytes(data[: offsets[2] + 50]), 0, SEGMENT))
    assert walked[-1].kind == "invalid" and walked[-1].offset == offsets[2]
    assert walked[-1].problem is not None and "file" in walked[-1].problem


def test_vote_names_the_outvoted_replica_or_none() -> None:
    same, other = (10, b"a"), (10, b"b")
    assert vote({"n0": same, "n1": same, "n2": same}, ["n0", "n1", "n2"]).odd == ()
    outcome = vote({"n0": same, "n1": other, "n2": same}, ["n0", "n1", "n2"])
    assert outcome.majority == ("n0", "n2") and outcome.odd == ("n1",)
    outcome = vote({"n0": same, "n1": other}, ["n0", "n1"])
    assert outcome.majority == () and outcome.odd == ("n1",)
    assert vote({"n0": same, "n1": same}, ["n0", "n1", "n2"]).odd == ("n2",)  # n2 lacks the block


def test_first_difference_and_record_fields(tmp_path: Path) -> None:
    assert first_difference(b"abc" * 5000, b"abc" * 5000) is None
    changed = bytearray(b"abc" * 5000)
    changed[9000] = 0
    assert first_difference(b"abc" * 5000, bytes(changed)) == 9000
    assert first_difference(b"abcdef", b"abc") == 3
    stored = next(entry.message for entry in walk_segment(bytes(segment_with(1, False)[0]), 0, SEGMENT))
    assert stored is not None
    assert record_field(stored, 0) == "total_size" and record_field(stored, 20) == "queue_offset"
    assert record_field(stored, 88) == "body" and record_field(stored, stored.total_size - 1) == "properties"
