"""The store's verified reads (apply's lookups): a record that fails its checks is reported as damaged,
never used and never passed over. A client's query goes on skipping what it cannot read."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from commitlog.errors import DamagedRecordError
from commitlog.store import MessageStore
from tests.commitlog.helpers import message, retry_of, small_config

BODY_AT = 88  # where a record's body starts (IPv4 born host)


def patch(store: MessageStore, at: int, data: bytes) -> None:
    """Bytes gone bad on the disk, written to the segment file."""
    start = store.commit_log.segment_start(at)
    descriptor = os.open(store.commit_log.segments[start].path, os.O_RDWR)
    try:
        os.pwrite(descriptor, data, at - start)
    finally:
        os.close(descriptor)


@pytest.fixture
def store(tmp_path: Path) -> MessageStore:
    opened = MessageStore(small_config(tmp_path / "s"), background_flush=False)
    opened.append(1, [message(1, keys="shared"), message(2, keys="shared other")], 1_000_000)
    return opened


def second_offset(store: MessageStore) -> int:
    return store.query_by_key("TopicTest", "other", 1)[0].physical_offset


def test_a_flipped_body_byte_is_reported_by_both_lookups(store: MessageStore) -> None:
    second = second_offset(store)
    original = store.read_record(second)
    patch(store, second + BODY_AT, b"\xff")
    with pytest.raises(DamagedRecordError) as raised:
        store.find_recent_send(*retry_of(message(2)), 0)
    assert raised.value.physical_offset == second and "CRC" in str(raised.value)
    with pytest.raises(DamagedRecordError):
        store.query_by_key("TopicTest", "shared", 5, verified=True)
    # the undamaged record is still found; a client's query reads what it can, unverified
    assert store.find_recent_send(*retry_of(message(1)), 0) is not None
    assert len(store.query_by_key("TopicTest", "shared", 5)) == 2
    store.repair_record(second, original)
    assert store.find_recent_send(*retry_of(message(2)), 0) is not None
    assert len(store.query_by_key("TopicTest", "shared", 5, verified=True)) == 2
    store.close()


def test_a_record_that_names_another_offset_is_damaged(store: MessageStore) -> None:
    second = second_offset(store)
    patch(store, second + 28, (second + 8).to_bytes(8, "big"))  # its physicalOffset field
    with pytest.raises(DamagedRecordError, match="names commit-log offset"):
        store.find_recent_send(*retry_of(message(2)), 0)
    store.close()


def test_a_record_whose_head_is_gone_is_damaged(store: MessageStore) -> None:
    second = second_offset(store)
    patch(store, second + 4, b"\x00\x00\x00\x00")  # its magic
    with pytest.raises(DamagedRecordError):
        store.query_by_key("TopicTest", "other", 5, verified=True)
    assert store.query_by_key("TopicTest", "other", 5) == []  # a client's query passes over it
    store.close()
