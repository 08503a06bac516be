"""Damage on disk to the files derived from the commit log (consume queues, key index) and to the apply marker,
as the corrupt-minority chaos scenario makes it: a file cut short no longer stops the store from opening (it is
rebuilt, or for the marker replaced, and the store recovers from its checkpoint), and a consume-queue unit gone
bad below the checkpoint is put back by the scrubber from the record it should point at. A commit-log segment
cut short stops the store with a message that says what to do."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from commitlog.consume_queue import UNIT_BYTES
from commitlog.errors import CorruptionError
from commitlog.store import MessageStore
from tests.commitlog.helpers import message, small_config

QUEUE_FILE = Path("consumequeue/TopicTest/0/00000000000000000000")
INDEX_FILE = Path("index/00000000000000000000")


def filled_store(directory: Path, count: int = 40) -> MessageStore:
    store = MessageStore(small_config(directory), background_flush=False)
    for number in range(count):
        store.append(number + 1, [message(number, queue_id=number % 2)], 1_000_000 + number)
    store.flush()
    return store


def contents(store: MessageStore) -> list[list[bytes]]:
    return [store.get_messages("TopicTest", queue_id, 0, 100).messages for queue_id in (0, 1)]


def cut(path: Path, size: int) -> None:
    with path.open("r+b") as stream:
        stream.truncate(size)


def test_a_consume_queue_file_cut_short_is_rebuilt_at_open(tmp_path: Path) -> None:
    store = filled_store(tmp_path / "s")
    expected = contents(store)
    store.close()
    cut(tmp_path / "s" / QUEUE_FILE, 7 * UNIT_BYTES + 3)
    reopened = MessageStore(small_config(tmp_path / "s"), background_flush=False)
    assert contents(reopened) == expected and [len(queue) for queue in expected] == [20, 20]
    assert (tmp_path / "s" / QUEUE_FILE).stat().st_size == 64 * UNIT_BYTES
    reopened.close()


def test_a_key_index_file_cut_short_or_with_a_bad_header_is_rebuilt_at_open(tmp_path: Path) -> None:
    store = filled_store(tmp_path / "s")
    expected = {key: [found.physical_offset for found in store.query_by_key("TopicTest", key, 5)]
                for key in ("key-0", "key-7", "key-39")}
    assert all(len(offsets) == 1 for offsets in expected.values())
    store.close()
    index_path = tmp_path / "s" / INDEX_FILE
    for damage in ("cut", "header"):
        if damage == "cut":
            cut(index_path, 100)
        else:
            with index_path.open("r+b") as stream:
                stream.write(b"XXXX")  # its magic
        reopened = MessageStore(small_config(tmp_path / "s"), background_flush=False)
        assert {key: [found.physical_offset for found in reopened.query_by_key("TopicTest", key, 5)]
                for key in expected} == expected, damage
        assert index_path.stat().st_size == reopened.index.file_bytes
        reopened.close()


def test_an_apply_marker_cut_short_is_replaced_and_the_store_recovers_from_its_checkpoint(tmp_path: Path) -> None:
    store = filled_store(tmp_path / "s")
    expected = contents(store)
    store.close()
    cut(tmp_path / "s" / "apply.pos", 50)
    reopened = MessageStore(small_config(tmp_path / "s"), background_flush=False)
    assert reopened.applied_raft_index == 40 and contents(reopened) == expected
    assert (tmp_path / "s" / "apply.pos").stat().st_size == 128
    reopened.close()


def test_the_scrubber_puts_back_a_damaged_consume_queue_unit(tmp_path: Path) -> None:
    store = filled_store(tmp_path / "s")
    expected = contents(store)
    path = tmp_path / "s" / QUEUE_FILE
    original = path.read_bytes()
    descriptor = os.open(path, os.O_RDWR)
    try:  # unit 5's commit-log offset and unit 9's size, gone bad on the disk
        os.pwrite(descriptor, b"\x3f", 5 * UNIT_BYTES + 3)
        os.pwrite(descriptor, b"\x00\x00\x00\x00", 9 * UNIT_BYTES + 8)
    finally:
        os.close(descriptor)
    assert path.read_bytes() != original  # (a pull of unit 5 meanwhile reads outside the commit log)
    damaged, position = store.scrub(0, 1 << 20)
    assert damaged is None and position == store.commit_log.end_offset
    assert path.read_bytes() == original and contents(store) == expected
    store.close()
    reopened = MessageStore(small_config(tmp_path / "s"), background_flush=False)
    assert contents(reopened) == expected
    reopened.close()


def test_a_record_whose_queue_offset_went_bad_does_not_overwrite_a_good_unit(tmp_path: Path) -> None:
    """Only a record's body has a CRC: a record whose queue-offset field went bad names another record's unit,
    and that unit, which names a valid record of that offset, is left alone."""
    store = filled_store(tmp_path / "s")
    path = tmp_path / "s" / QUEUE_FILE
    original = path.read_bytes()
    victim = store.get_messages("TopicTest", 0, 3, 1)
    physical = store.query_by_key("TopicTest", "key-6", 1)[0].physical_offset  # queue 0, queue offset 3
    assert victim.messages and store.read_message(physical).queue_offset == 3
    segment = tmp_path / "s" / "commitlog" / f"{0:020d}"
    descriptor = os.open(segment, os.O_RDWR)
    try:
        os.pwrite(descriptor, (2).to_bytes(8, "big"), physical + 20)  # its queueOffset field: 3 -> 2
    finally:
        os.close(descriptor)
    assert store.scrub(0, 1 << 20)[0] is None  # (not noticed: the head has no checksum)
    assert path.read_bytes() == original
    store.close()


def test_a_commit_log_segment_cut_short_stops_the_store_with_what_to_do(tmp_path: Path) -> None:
    filled_store(tmp_path / "s").close()
    cut(tmp_path / "s" / "commitlog" / f"{0:020d}", 5000)
    with pytest.raises(CorruptionError, match=r"has 5000 bytes, expected .*wipe this replica's data directory"):
        MessageStore(small_config(tmp_path / "s"), background_flush=False)
