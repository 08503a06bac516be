"""MessageStore: append, dispatch, reads, idempotency, rejection, retention, flush policy, disk full."""

from __future__ import annotations

import errno
import itertools
import os
from pathlib import Path

import pytest

import commitlog.commit_log as commit_log_module
import commitlog.flush as flush_module
from commitlog.config import ConfigError, StoreConfig
from commitlog.consume_queue import CQ_UNIT
from commitlog.errors import CorruptionError, DiskFullError, StoreError
from commitlog.hosts import encode_host
from commitlog.mapped_file import drop_cached
from commitlog.message import MessageInput
from commitlog.outcomes import AppendStatus, GetStatus
from commitlog.record_codec import BLANK_MAGIC, FILLER, decode_record
from commitlog.store import MessageStore
from commitlog.sys_flags import TRANSACTION_COMMIT_TYPE, TRANSACTION_PREPARED_TYPE, TRANSACTION_ROLLBACK_TYPE
from commitlog.tag_codes import java_string_hash
from protocol.properties import encode_properties
from tests.commitlog.helpers import data_bytes, message, small_config, tree_bytes


@pytest.fixture
def store(tmp_path: Path) -> MessageStore:
    return MessageStore(small_config(tmp_path / "store"))


def test_append_assigns_offsets_and_reads_back(store: MessageStore) -> None:
    outcome = store.append(1, [message(i, queue_id=i % 2) for i in range(6)])
    assert outcome.applied
    results = outcome.results
    assert [r.queue_offset for r in results] == [0, 0, 1, 1, 2, 2]
    assert results[0].physical_offset == 0
    for previous, current in itertools.pairwise(results):
        assert current.physical_offset == previous.physical_offset + previous.size
    got = store.get_messages("TopicTest", 1, 0, 10)
    assert got.status is GetStatus.FOUND
    assert got.queue_offsets == [0, 1, 2] and got.next_begin_offset == 3
    decoded = [decode_record(raw) for raw in got.messages]
    assert [d.body for d in decoded] == [message(i).body for i in (1, 3, 5)]
    assert [d.queue_offset for d in decoded] == [0, 1, 2]
    assert decoded[0].physical_offset == results[1].physical_offset
    assert decoded[0].store_host == encode_host("10.1.2.3", 10911)
    assert results[1].msg_id == decoded[0].msg_id
    assert store.max_queue_offset("TopicTest", 1) == 3 and store.min_queue_offset("TopicTest", 1) == 0


def test_same_commands_give_byte_identical_replicas(tmp_path: Path) -> None:
    replicas = [MessageStore(small_config(tmp_path / name)) for name in ("a", "b")]
    for replica in replicas:
        for index in range(1, 40):
            replica.append(index, [message(index * 10 + j, queue_id=j % 3, tags=f"T{j % 2}") for j in range(7)])
        replica.close()
    first, second = (tree_bytes(tmp_path / name) for name in ("a", "b"))
    assert first.keys() == second.keys()
    assert first == second


def test_append_is_idempotent_by_raft_index(store: MessageStore, tmp_path: Path) -> None:
    store.append(5, [message(1)])
    store.flush()
    before = tree_bytes(tmp_path / "store")
    for index in (5, 4, 1):
        outcome = store.append(index, [message(2)])
        assert not outcome.applied and outcome.results == ()
    store.flush()
    assert tree_bytes(tmp_path / "store") == before
    assert store.applied_raft_index == 5
    assert store.append(6, [message(2)]).results[0].queue_offset == 1


def test_bad_messages_are_rejected_individually(store: MessageStore) -> None:
    good = message(1)
    bad_topic = message(2, topic="bad topic!")
    too_big = message(3, body=b"x" * (32 * 1024 + 1))
    bad_host = message(4, born_host=b"abc")
    bad_flag = good._replace(flag=2**40)
    long_topic = message(5, topic="T" * 128)
    outcome = store.append(1, [bad_topic, good, too_big, bad_host, bad_flag, long_topic, message(6)])
    statuses = [r.status for r in outcome.results]
    assert statuses == [AppendStatus.REJECTED, AppendStatus.OK, AppendStatus.REJECTED, AppendStatus.REJECTED,
                        AppendStatus.REJECTED, AppendStatus.REJECTED, AppendStatus.OK]
    reasons = [r.reason for r in outcome.results]
    assert "characters" in str(reasons[0]) and "body length" in str(reasons[2])
    assert "born host" in str(reasons[3]) and "flag" in str(reasons[4]) and "topic length" in str(reasons[5])
    # only the two good messages took offsets, contiguous
    assert [r.queue_offset for r in outcome.results if r.status is AppendStatus.OK] == [0, 1]
    assert store.max_queue_offset("TopicTest", 0) == 2
    assert ("bad topic!", 0) not in store.queue_ids()


def test_records_never_span_segments_and_fillers_close_segments(store: MessageStore) -> None:
    segment = store.config.segment_size_bytes
    offsets: list[int] = []
    for index in range(1, 120):
        offsets.extend(r.physical_offset for r in store.append(index, [message(index, body=os.urandom(3000))]).results)
    assert store.max_physical_offset > 2 * segment
    sizes = [store.read_message(o).total_size for o in offsets]
    for offset, size in zip(offsets, sizes, strict=True):
        assert offset // segment == (offset + size - 1) // segment
    # every segment end is a filler record covering exactly the rest
    for next_offset, (offset, size) in zip(offsets[1:], zip(offsets, sizes, strict=True), strict=False):
        if next_offset != offset + size:
            end = offset + size
            assert next_offset == end - end % segment + segment
            total, magic = FILLER.unpack(store.commit_log.read(end, 8))
            assert magic == BLANK_MAGIC and total == next_offset - end
    names = sorted(p.name for p in (store.root / "commitlog").iterdir())
    assert names[:3] == [f"{k * segment:020d}" for k in range(3)]


def test_transaction_prepared_and_rollback_are_not_in_consume_queues(store: MessageStore) -> None:
    outcome = store.append(1, [
        message(1, sys_flag=TRANSACTION_PREPARED_TYPE),
        message(2, sys_flag=TRANSACTION_ROLLBACK_TYPE),
        message(3, sys_flag=TRANSACTION_COMMIT_TYPE),
        message(4),
    ])
    assert [r.queue_offset for r in outcome.results] == [0, 0, 0, 1]
    got = store.get_messages("TopicTest", 0, 0, 10)
    assert [decode_record(m).born_timestamp % 1000 for m in got.messages] == [3, 4]
    # the prepared message stays findable by key, the rollback one is not indexed
    assert [m.born_timestamp % 1000 for m in store.query_by_key("TopicTest", "key-1", 5)] == [1]
    assert store.query_by_key("TopicTest", "key-2", 5) == []


def test_tag_filter_and_consume_queue_units(store: MessageStore) -> None:
    store.append(1, [message(i, tags="TagA" if i % 3 == 0 else "TagB") for i in range(9)])
    unit = store.queues[("TopicTest", 0)].unit(0)
    assert unit[2] == java_string_hash("TagA")
    raw = store.commit_log.read(0, 40)
    assert CQ_UNIT.unpack(store.queues[("TopicTest", 0)].files[0].map[:20]) == (0, int.from_bytes(raw[:4], "big"), unit[2])
    got = store.get_messages("TopicTest", 0, 0, 32, tag_codes={java_string_hash("TagA")})
    assert got.status is GetStatus.FOUND
    assert got.queue_offsets == [0, 3, 6] and got.next_begin_offset == 9
    nothing = store.get_messages("TopicTest", 0, 0, 32, tag_codes={java_string_hash("Nope")})
    assert nothing.status is GetStatus.NO_MATCHED_MESSAGE and nothing.next_begin_offset == 9


def test_get_statuses_follow_rocketmq(store: MessageStore) -> None:
    assert store.get_messages("Nope", 0, 0, 1).status is GetStatus.NO_MATCHED_LOGIC_QUEUE
    store.append(1, [message(i) for i in range(3)])
    assert store.get_messages("TopicTest", 0, 3, 1).status is GetStatus.OFFSET_OVERFLOW_ONE
    bad = store.get_messages("TopicTest", 0, 9, 1)
    assert bad.status is GetStatus.OFFSET_OVERFLOW_BADLY and bad.next_begin_offset == 0
    limited = store.get_messages("TopicTest", 0, 0, 3, max_bytes=1)
    assert len(limited.messages) == 1 and limited.next_begin_offset == 1


def test_lookups_by_key_uniq_key_id_and_timestamp(store: MessageStore) -> None:
    results = store.append(1, [message(i, keys=f"order-{i % 4} shared") for i in range(12)]).results
    by_key = store.query_by_key("TopicTest", "order-1", 10)
    assert sorted(m.born_timestamp % 1000 for m in by_key) == [1, 5, 9]
    assert len(store.query_by_key("TopicTest", "shared", 5)) == 5
    uniq = message(7).properties.split(b"UNIQ_KEY\x01")[1].split(b"\x02")[0].decode()
    assert [m.physical_offset for m in store.query_by_key("TopicTest", uniq, 3)] == [results[7].physical_offset]
    assert store.query_by_key("OtherTopic", "order-1", 3) == []
    assert store.view_message_by_id(results[4].msg_id).body == message(4).body
    # store timestamps are 1_700_000_100_000 + 10 * i
    assert store.offset_by_timestamp("TopicTest", 0, 1_700_000_100_055) == 6
    assert store.offset_by_timestamp("TopicTest", 0, 0) == 0
    assert store.offset_by_timestamp("TopicTest", 0, 2**62) == 12


def test_index_spans_several_files(tmp_path: Path) -> None:
    store = MessageStore(small_config(tmp_path / "s", index_entry_capacity=16, index_slot_count=16))
    for index in range(1, 21):
        store.append(index, [message(index * 10 + j, keys=f"hot key-{index * 10 + j}") for j in range(5)])
    assert len(store.index.files) > 5
    assert len(store.query_by_key("TopicTest", "hot", 1000)) == 100
    assert [m.born_timestamp % 10000 for m in store.query_by_key("TopicTest", "key-53", 3)] == [53]


def test_retention_deletes_whole_segments_and_prunes_derived_files(tmp_path: Path) -> None:
    config = small_config(tmp_path / "s", index_entry_capacity=32)
    store = MessageStore(config)
    for index in range(1, 201):
        store.append(index, [message(index, body=os.urandom(2000), queue_id=index % 2)])
    assert store.max_physical_offset > 3 * config.segment_size_bytes
    segment = config.segment_size_bytes
    cut = 2 * segment + 100
    assert store.delete_below(201, cut).applied
    assert not store.delete_below(201, cut).applied
    assert store.commit_log.min_offset == 2 * segment
    assert sorted(p.name for p in (tmp_path / "s" / "commitlog").iterdir())[0] == f"{2 * segment:020d}"
    low = store.min_queue_offset("TopicTest", 0)
    assert low > 0
    too_small = store.get_messages("TopicTest", 0, 0, 5)
    assert too_small.status is GetStatus.OFFSET_TOO_SMALL and too_small.next_begin_offset == low
    first = store.get_messages("TopicTest", 0, low, 1)
    assert decode_record(first.messages[0]).physical_offset >= 2 * segment
    assert all(f.begin_physical >= 0 for f in store.index.files)
    assert store.query_by_key("TopicTest", "key-1", 5) == []
    store.close()
    reopened = MessageStore(config)
    assert reopened.min_queue_offset("TopicTest", 0) == low
    assert reopened.commit_log.min_offset == 2 * segment
    assert reopened.append(202, [message(500)]).applied


def test_sync_flush_writes_checkpoint_before_returning(tmp_path: Path) -> None:
    store = MessageStore(small_config(tmp_path / "s", flush_policy="sync"))
    store.append(1, [message(1)])
    checkpoint = (tmp_path / "s" / "checkpoint").read_bytes()
    store.append(2, [message(2)])
    assert (tmp_path / "s" / "checkpoint").read_bytes() != checkpoint


def test_async_flush_uses_injected_clock(tmp_path: Path) -> None:
    now = [0.0]
    store = MessageStore(small_config(tmp_path / "s", flush_interval_ms=1000), clock=lambda: now[0],
                         background_flush=False)
    path = tmp_path / "s" / "checkpoint"
    initial = path.read_bytes()
    store.append(1, [message(1)])
    assert path.read_bytes() == initial
    now[0] = 1.5
    store.append(2, [message(2)])
    assert path.read_bytes() != initial


def test_disk_full_writes_nothing_and_a_retry_succeeds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = MessageStore(small_config(tmp_path / "s"))
    store.append(1, [message(1)])
    store.commit_log._cancel_allocations()  # no segment prepared in the background either
    store.flush()
    before = tree_bytes(tmp_path / "s")
    end = store.max_physical_offset

    def no_space(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", no_space)
    with pytest.raises(DiskFullError):
        store.append(2, [message(i, body=os.urandom(4000)) for i in range(2, 60)])
    assert store.max_physical_offset == end and store.applied_raft_index == 1
    store.flush()
    assert tree_bytes(tmp_path / "s") == before
    assert store.max_queue_offset("TopicTest", 0) == 1
    monkeypatch.undo()
    outcome = store.append(2, [message(i, body=os.urandom(4000)) for i in range(2, 60)])
    assert outcome.applied and outcome.results[0].queue_offset == 1


def test_config_rejects_bad_values(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unknown store settings: colour"):
        StoreConfig.from_mapping({"data_dir": str(tmp_path), "colour": "red"})
    with pytest.raises(ConfigError, match="data_dir is required"):
        StoreConfig.from_mapping({})
    bad_values: list[dict[str, object]] = [
        {"segment_size_bytes": 1000},
        {"segment_size_bytes": 4097 * 4096 + 1},
        {"flush_policy": "sometimes"},
        {"store_host": "localhost"},
        {"flush_interval_ms": 0},
        {"body_size_max_bytes": True},
        {"segment_size_bytes": 64 * 1024, "body_size_max_bytes": 40 * 1024},
    ]
    for change in bad_values:
        with pytest.raises(ConfigError):
            StoreConfig.from_mapping({"data_dir": str(tmp_path), **change})
    config = StoreConfig.from_mapping({"data_dir": str(tmp_path), "flush_policy": "sync"})
    assert config.flush_policy == "sync" and config.segment_size_bytes == 1 << 30


def test_ipv6_born_host_round_trips(store: MessageStore) -> None:
    v6 = bytes(range(16)) + (1234).to_bytes(4, "big")
    result = store.append(1, [message(1, born_host=v6)]).results[0]
    stored = store.read_message(result.physical_offset)
    assert stored.born_host == v6 and stored.sys_flag & 0x10
    assert store.offset_by_timestamp("TopicTest", 0, 0) == 0


def test_properties_are_stored_exactly_as_sent(store: MessageStore) -> None:
    properties = encode_properties({"TAGS": "x", "CUSTOM": "ü\u00e9", "XTAGS": "decoy", "KEYS": "a  b"})
    sent = MessageInput("TopicTest", 0, 0, 0, 1, bytes(8), 2, 0, 0, b"\x00\xff" * 10, properties)
    result = store.append(1, [sent]).results[0]
    stored = store.read_message(result.physical_offset)
    assert stored.properties == properties and stored.body == sent.body
    assert store.queues[("TopicTest", 0)].unit(0)[2] == java_string_hash("x")
    assert [m.physical_offset for m in store.query_by_key("TopicTest", "b", 2)] == [result.physical_offset]


def test_catch_up_by_copying_raw_bytes_is_byte_identical(tmp_path: Path) -> None:
    source = MessageStore(small_config(tmp_path / "source"))
    for index in range(1, 150):
        source.append(index, [message(index * 10 + j, queue_id=j % 3, body=os.urandom(900)) for j in range(3)])
    target = MessageStore(small_config(tmp_path / "target"))
    end = source.max_physical_offset
    for offset in range(0, end, 50_000):  # chunks that cross segment ends
        target.ingest_raw(offset, source.read_committed(offset, 50_000))
    target.finish_ingest(149)
    assert target.applied_raft_index == 149 and target.max_physical_offset == end
    for queue_id in range(3):
        assert target.get_messages("TopicTest", queue_id, 0, 500).messages == source.get_messages("TopicTest", queue_id, 0, 500).messages
    source.close()
    target.close()
    assert data_bytes(tmp_path / "source") == data_bytes(tmp_path / "target")


def test_reset_then_catch_up_from_a_retained_peer(tmp_path: Path) -> None:
    source = MessageStore(small_config(tmp_path / "source"))
    for index in range(1, 200):
        source.append(index, [message(index, queue_id=index % 2, body=os.urandom(2000))])
    segment = source.config.segment_size_bytes
    source.delete_below(200, 2 * segment)
    target = MessageStore(small_config(tmp_path / "target"))
    target.append(1, [message(1)])  # some old data, behind the source's retention point
    target.reset_to(source.commit_log.min_offset)
    offset = source.commit_log.min_offset
    while offset < source.max_physical_offset:
        chunk = source.read_committed(offset, 70_000)
        target.ingest_raw(offset, chunk)
        offset += len(chunk)
    target.finish_ingest(200)
    for queue_id in range(2):
        low = source.min_queue_offset("TopicTest", queue_id)
        assert target.min_queue_offset("TopicTest", queue_id) == low
        assert target.max_queue_offset("TopicTest", queue_id) == source.max_queue_offset("TopicTest", queue_id)
        assert target.get_messages("TopicTest", queue_id, low, 100).messages == source.get_messages("TopicTest", queue_id, low, 100).messages
    assert target.append(201, [message(999)]).results[0].physical_offset == source.max_physical_offset
    expected = {q: (target.min_queue_offset("TopicTest", q), target.max_queue_offset("TopicTest", q)) for q in range(2)}
    target.close()
    reopened = MessageStore(small_config(tmp_path / "target"))  # queues that begin mid-file survive a restart
    assert {q: (reopened.min_queue_offset("TopicTest", q), reopened.max_queue_offset("TopicTest", q))
            for q in range(2)} == expected


def test_ingest_of_damaged_bytes_is_refused(tmp_path: Path) -> None:
    source = MessageStore(small_config(tmp_path / "source"))
    source.append(1, [message(i) for i in range(5)])
    data = bytearray(source.commit_log.read(0, source.max_physical_offset))
    data[150] ^= 0xFF
    target = MessageStore(small_config(tmp_path / "target"))
    target.ingest_raw(0, bytes(data))
    with pytest.raises(CorruptionError):
        target.finish_ingest(1)
    assert target.max_physical_offset == 0 and target.applied_raft_index == 0


def test_a_directory_cannot_be_opened_twice(tmp_path: Path) -> None:
    first = MessageStore(small_config(tmp_path / "s"))
    with pytest.raises(StoreError, match="in use by another store"):
        MessageStore(small_config(tmp_path / "s"))
    first.close()
    MessageStore(small_config(tmp_path / "s")).close()


def test_scrub_finds_a_damaged_record_and_a_peer_copy_repairs_it(tmp_path: Path) -> None:
    from commitlog.record_codec import RecordError
    from commitlog.store import MessageStore
    from tests.commitlog.helpers import message, small_config

    store = MessageStore(small_config(tmp_path / "a"), background_flush=False)
    results = store.append(1, [message(n) for n in range(20)]).results
    target = results[7]
    good = store.read_record(target.physical_offset)
    assert store.scrub(0, 1 << 20) == (None, store.max_physical_offset)
    store.commit_log.write(target.physical_offset + 100, b"\xff")  # a body byte gone bad on disk
    damaged, position = store.scrub(0, 1 << 20)
    assert damaged == position == target.physical_offset
    bad_copy = bytearray(good)
    bad_copy[100] ^= 0x01
    with pytest.raises(RecordError):
        store.repair_record(target.physical_offset, bytes(bad_copy))  # not a valid copy
    with pytest.raises(StoreError):
        store.repair_record(target.physical_offset + 1, good)  # another record's place
    store.repair_record(target.physical_offset, good)
    assert store.scrub(0, 1 << 20) == (None, store.max_physical_offset)
    store.close()


def test_flushed_data_past_the_page_cache_window_is_dropped_from_the_cache_and_still_reads_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Older flushed commit-log pages are evicted so that new writes reuse their memory
    (StoreConfig.page_cache_keep_bytes): every flushed byte more than the window below the flushed end is
    dropped once, within its segment, and never a byte inside the window; the data still reads back."""
    monkeypatch.setattr(commit_log_module, "DROP_STEP_BYTES", 64 * 1024)
    drops: list[tuple[str, int, int]] = []

    def recorded(path: Path, start: int, end: int) -> None:
        drops.append((path.name, start, end))
        drop_cached(path, start, end)

    monkeypatch.setattr(flush_module, "drop_cached", recorded)
    keep = 256 * 1024
    store = MessageStore(small_config(tmp_path / "store", page_cache_keep_bytes=keep))
    segment = store.config.segment_size_bytes
    ends = []
    for index in range(1, 41):
        store.append(index, [message(index * 100 + n, queue_id=n % 2, body=bytes([n]) * 1500) for n in range(40)])
        store.flush()
        ends.append(store.max_physical_offset)
    covered = 0
    for name, start, end in drops:
        assert 0 <= start < end <= segment
        assert int(name) + start == covered  # in order, no gap, no overlap
        covered = int(name) + end
    assert ends[-1] - keep - 64 * 1024 <= covered <= ends[-1] - keep
    assert covered > 10 * segment
    for queue_id in (0, 1):
        got = store.get_messages("TopicTest", queue_id, 0, 10_000, max_bytes=1 << 30)
        assert got.status is GetStatus.FOUND and len(got.messages) == 800
        assert [decode_record(raw).body for raw in got.messages] == [
            bytes([n]) * 1500 for _ in range(1, 41) for n in range(queue_id, 40, 2)]
    store.close()


def test_reading_an_old_segment_while_another_is_being_walked_unmaps_nothing_in_use(tmp_path: Path) -> None:
    """Old segments stay mapped for reading a few at a time: mapping one unmaps the least recently used. The
    scrubber's record walk holds a view of the segment it walks (and may let other threads run meanwhile), so
    a read of another old segment then (a pull, GET_BROKER_RUNTIME_INFO's earliest timestamp) unmapped a
    segment with a view on it: BufferError, and the request failed. Such a segment now stays mapped until the
    view goes."""
    store = MessageStore(small_config(tmp_path / "store"))
    sent = 0
    while len(store.commit_log.starts) < 4:
        sent += 1
        store.append(sent, [message(sent, body=b"x" * 2000)])
    first, second = store.commit_log.starts[0], store.commit_log.starts[1]
    walked = store.commit_log.segments[first].map  # mapped again for the walk
    with memoryview(walked) as view:  # the walk's view
        head = bytes(view[:8])
        for _ in range(3):  # each read maps its segment again, and pushes the walked one out of the few kept
            assert store.read_message(second).physical_offset == second
            assert store.store_timestamp_at(first) > 0
        assert bytes(view[:8]) == head  # the walk still reads its bytes
    assert store.read_message(first).physical_offset == first
    store.close()
