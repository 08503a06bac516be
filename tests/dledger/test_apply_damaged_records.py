"""Apply decides nothing from local bytes it has not verified: a damaged stored record that a timer release
or a retry lookup reads is found before anything is written, and is put back from a peer's copy (or the
member stops). Two replicas fed the same entries, one with a flipped byte in its store, end byte-identical."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from commitlog.errors import DamagedRecordError, StoreError
from commitlog.message import MessageInput
from commitlog.records import RecordBuilder
from commitlog.store import MessageStore
from dledger.apply import StateMachine
from dledger.command import Command, Messages, TimerRelease, encode_command, encode_records_command
from dledger.state import ReplicatedState
from dledger.timers import schedule, timer_key
from protocol.topics import TIMER_TOPIC
from tests.commitlog.helpers import data_bytes, message, small_config
from tests.support.apply_paths import both_apply_paths  # noqa: F401  (a fixture)

pytestmark = pytest.mark.usefixtures("both_apply_paths")

BASE_MS = 1_700_000_000_000
DUE_SECOND = BASE_MS // 1000 + 60
#: where a record's body starts (IPv4 born host): the fixed head and the body length
BODY_AT = 88


def machine(directory: Path) -> StateMachine:
    state = ReplicatedState()
    store = MessageStore(small_config(directory), extension_provider=lambda: state.encode())
    return StateMachine(store, state)


def written(root: Path) -> dict[str, bytes]:
    """The data files holding anything (a segment preallocated in the background holds zeros only)."""
    return {name: data for name, data in data_bytes(root).items() if data.count(0) != len(data)}


def appended(store: MessageStore, since: int) -> bytes:
    """What the entries applied after the commit log ended at ``since`` wrote to it."""
    return store.read_committed(since, store.max_physical_offset - since)


def flip_byte(store: MessageStore, physical_offset: int) -> None:
    """A bit gone bad on the disk: one byte of the record's body, written to its segment file."""
    start = store.commit_log.segment_start(physical_offset)
    path = store.commit_log.segments[start].path
    at = physical_offset - start + BODY_AT + 3
    descriptor = os.open(path, os.O_RDWR)
    try:
        (byte,) = os.pread(descriptor, 1, at)
        os.pwrite(descriptor, bytes([byte ^ 0x10]), at)
    finally:
        os.close(descriptor)


def timer_log() -> tuple[list[bytes], bytes]:
    """Two timed messages, due in DUE_SECOND, stored by one command each, and the command that releases them."""
    timers = [schedule(message(n)._replace(store_timestamp=BASE_MS + n), (DUE_SECOND - 1) * 1000 + 1)
              for n in (1, 2)]
    stored = [encode_command(Command((Messages((timer,)),))) for timer in timers]
    release = encode_command(Command((TimerRelease(DUE_SECOND),)))
    return stored, release


def timer_offsets(store: MessageStore) -> list[int]:
    """Where the timers due in DUE_SECOND are stored, in commit-log order."""
    return sorted(found.physical_offset for found in store.query_by_key(TIMER_TOPIC, timer_key(DUE_SECOND), 5))


def test_a_damaged_timer_is_repaired_before_it_is_released(tmp_path: Path) -> None:
    healthy, damaged = machine(tmp_path / "a"), machine(tmp_path / "b")
    stored, release = timer_log()
    for sm in (healthy, damaged):
        for index, command in enumerate(stored, start=1):
            sm.apply(index, command)
    timer_offset = timer_offsets(damaged.store)[0]
    flip_byte(damaged.store, timer_offset)
    asked: list[int] = []

    def repair(physical_offset: int) -> None:
        asked.append(physical_offset)
        damaged.store.repair_record(physical_offset, healthy.store.read_record(physical_offset))

    damaged.repair = repair
    since = healthy.store.max_physical_offset
    for sm in (healthy, damaged):
        sm.apply(3, release)
        sm.store.flush()
    assert healthy.store.max_queue_offset("TopicTest", 0) == 2  # both timers released
    assert appended(damaged.store, since) == appended(healthy.store, since)  # the released messages
    assert data_bytes(tmp_path / "a") == data_bytes(tmp_path / "b")
    assert asked == [timer_offset]


def test_a_damaged_timer_without_a_repair_stops_apply_before_anything_is_written(tmp_path: Path) -> None:
    healthy, damaged = machine(tmp_path / "a"), machine(tmp_path / "b")
    stored, release = timer_log()
    for sm in (healthy, damaged):
        for index, command in enumerate(stored, start=1):
            sm.apply(index, command)
    offsets = timer_offsets(damaged.store)
    flip_byte(damaged.store, offsets[0])
    end, before = damaged.store.max_physical_offset, written(tmp_path / "b")
    with pytest.raises(DamagedRecordError) as raised:
        damaged.apply(3, release)
    assert f"commit-log offset {offsets[0]}" in str(raised.value)
    assert damaged.applied_index == 2 and damaged.store.max_physical_offset == end
    assert damaged.state.timer_progress == healthy.state.timer_progress  # nothing released, not even in state
    assert written(tmp_path / "b") == before
    # the scrubber (or the restarted member) puts the record back: the entry then applies as everywhere else
    damaged.store.repair_record(offsets[0], healthy.store.read_record(offsets[0]))
    for sm in (healthy, damaged):
        sm.apply(3, release)
        sm.store.flush()
    assert data_bytes(tmp_path / "a") == data_bytes(tmp_path / "b")


def test_a_repair_that_fails_stops_apply(tmp_path: Path) -> None:
    damaged = machine(tmp_path / "b")
    stored, release = timer_log()
    for index, command in enumerate(stored, start=1):
        damaged.apply(index, command)
    flip_byte(damaged.store, timer_offsets(damaged.store)[0])

    def unreachable(physical_offset: int) -> None:
        raise StoreError("no peer answered")

    damaged.repair = unreachable
    with pytest.raises(DamagedRecordError, match="no peer answered"):
        damaged.apply(3, release)
    assert damaged.applied_index == 2


def retried(stored: MessageInput, as_records: bool, tmp_path: Path) -> bytes:
    """A client's retry of ``stored`` (same UNIQ_KEY and content, later), as a follower receives it."""
    retry = stored._replace(store_timestamp=BASE_MS + 1000, queue_id=1)
    if not as_records:
        return encode_command(Command((Messages((retry,)),)))
    config = small_config(tmp_path)
    records = RecordBuilder(config.store_host_bytes, config.segment_size_bytes,
                            config.body_size_max_bytes).build([retry], BASE_MS + 1000)
    assert records is not None
    return encode_records_command(records)


@pytest.mark.parametrize("as_records", [False, True], ids=["messages", "records"])
def test_a_retry_of_a_damaged_message_is_decided_from_the_groups_bytes(tmp_path: Path, as_records: bool) -> None:
    healthy, damaged = machine(tmp_path / "a"), machine(tmp_path / "b")
    first = message(1)._replace(store_timestamp=BASE_MS)
    for sm in (healthy, damaged):
        sm.apply(1, encode_command(Command((Messages((first,)),))))
    flip_byte(damaged.store, 0)
    asked: list[int] = []

    def repair(physical_offset: int) -> None:
        asked.append(physical_offset)
        damaged.store.repair_record(physical_offset, healthy.store.read_record(physical_offset))

    damaged.repair = repair
    retry = retried(first, as_records, tmp_path)
    since = healthy.store.max_physical_offset
    for sm in (healthy, damaged):
        sm.apply(2, retry)
        sm.store.flush()
    assert healthy.store.max_queue_offset("TopicTest", 1) == 0  # the retry was not stored again
    assert appended(damaged.store, since) == appended(healthy.store, since) == b""  # nor on the damaged one
    assert data_bytes(tmp_path / "a") == data_bytes(tmp_path / "b")
    assert asked == [0] and damaged.key_collisions == healthy.key_collisions == 0


@pytest.mark.parametrize("as_records", [False, True], ids=["messages", "records"])
def test_a_retry_of_a_damaged_message_without_a_repair_stops_apply(tmp_path: Path, as_records: bool) -> None:
    damaged = machine(tmp_path / "b")
    first = message(1)._replace(store_timestamp=BASE_MS)
    damaged.apply(1, encode_command(Command((Messages((first,)),))))
    flip_byte(damaged.store, 0)
    end = damaged.store.max_physical_offset
    with pytest.raises(DamagedRecordError):
        damaged.apply(2, retried(first, as_records, tmp_path))
    assert damaged.applied_index == 1 and damaged.store.max_physical_offset == end
