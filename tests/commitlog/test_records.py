"""Prepared records (commitlog.records): the leader lays messages out as records once; a replica storing
them must end up with exactly the files that storing the messages gives."""

from __future__ import annotations

from pathlib import Path

import pytest

from commitlog.message import MessageInput
from commitlog.outcomes import AppendStatus
from commitlog.records import (
    META,
    PreparedRecords,
    RecordBuilder,
    check_layout,
    meta_list,
    pack_metas,
    uniq_key_of,
)
from commitlog.store import MessageStore
from commitlog.sys_flags import TRANSACTION_COMMIT_TYPE, TRANSACTION_PREPARED_TYPE, TRANSACTION_ROLLBACK_TYPE
from tests.commitlog.helpers import data_bytes, message, small_config
from tests.support.apply_paths import both_apply_paths  # noqa: F401  (a fixture)

STAMP = 1_700_000_200_000
V6_HOST = bytes(range(16)) + (40123).to_bytes(4, "big")  # IPv6 address + port



pytestmark = pytest.mark.usefixtures("both_apply_paths")

def builder(directory: Path, excluded: tuple[str, ...] = ()) -> RecordBuilder:
    config = small_config(directory)
    return RecordBuilder(config.store_host_bytes, config.segment_size_bytes, config.body_size_max_bytes, excluded)


def varied(count: int, start: int = 0) -> list[MessageInput]:
    """Several topics and queues, tags or none, several keys, IPv4 and IPv6 born hosts, sizes that make
    records cross the small test segments."""
    messages = []
    for number in range(start, start + count):
        messages.append(message(
            number,
            topic=("TopicTest", "Other_topic-2", "%RETRY%g")[number % 3],
            queue_id=number % 4,
            body=bytes([number % 251]) * (40 + number * 97 % 9000),
            tags=None if number % 5 == 0 else f"Tag{number % 3}",
            keys=" ".join(f"k{number}-{j}" for j in range(number % 4)) or "",
            born_host=V6_HOST if number % 7 == 0 else message(0).born_host,
            sys_flag=TRANSACTION_COMMIT_TYPE if number % 11 == 0 else 0,
        )._replace(reconsume_times=number % 2, flag=number))
    return messages


def test_stored_records_are_byte_identical_to_stored_messages(tmp_path: Path) -> None:
    plain = MessageStore(small_config(tmp_path / "plain"))
    prepared = MessageStore(small_config(tmp_path / "prepared"))
    build = builder(tmp_path)
    for index in range(1, 31):
        batch = varied(12, start=index * 12)
        store_timestamp = STAMP + index
        records = build.build(batch, store_timestamp)
        assert records is not None and check_layout(records) is None
        expected = plain.append(index, batch, store_timestamp)
        got = prepared.append_records(index, records)
        assert got.results == expected.results
    assert prepared.commit_log.end_offset > 3 * prepared.config.segment_size_bytes  # fillers were written
    for store in (plain, prepared):
        store.flush()
        store.close()
    assert data_bytes(tmp_path / "plain") == data_bytes(tmp_path / "prepared")


def test_skipped_positions_and_a_raised_stamp_match_the_messages_path(tmp_path: Path) -> None:
    plain = MessageStore(small_config(tmp_path / "plain"))
    prepared = MessageStore(small_config(tmp_path / "prepared"))
    batch = varied(20)
    records = builder(tmp_path).build(batch, STAMP)
    assert records is not None
    skip = {0, 7, 19}
    raised = STAMP + 5_000
    expected = plain.append(1, [m for n, m in enumerate(batch) if n not in skip], raised)
    got = prepared.append_records(1, records, skip=skip, store_timestamp=raised)
    assert got.results == expected.results and len(got.results) == 17
    assert prepared.read_message(got.results[0].physical_offset).store_timestamp == raised
    assert prepared.append_records(1, records).applied is False  # idempotent by Raft index
    # a follower asks for no results: the same files
    quiet = MessageStore(small_config(tmp_path / "quiet"))
    assert quiet.append_records(1, records, skip=skip, store_timestamp=raised, want_results=False).results == ()
    for store in (plain, prepared, quiet):
        store.flush()
        store.close()
    assert data_bytes(tmp_path / "plain") == data_bytes(tmp_path / "prepared") == data_bytes(tmp_path / "quiet")


def test_what_the_store_treats_specially_is_not_prepared(tmp_path: Path) -> None:
    build = builder(tmp_path, excluded=("TIMER_TOPIC",))
    fine = message(1)
    assert build.build([fine], STAMP) is not None
    refused = [
        message(2, sys_flag=TRANSACTION_PREPARED_TYPE),
        message(3, sys_flag=TRANSACTION_ROLLBACK_TYPE),
        message(4, topic="TIMER_TOPIC"),
        message(5, topic="bad topic"),
        message(6, body=b"x" * (32 * 1024 + 1)),
        fine._replace(properties=fine.properties + b"TAGS\x01again\x02"),  # a property named twice
        fine._replace(born_host=b"\x00" * 5),
        fine._replace(flag=2**31),
        fine._replace(queue_id=-1),
    ]
    for odd in refused:
        assert build.build([fine, odd], STAMP) is None, odd


def test_uniq_key_of_reads_the_key_back(tmp_path: Path) -> None:
    batch = [message(1), message(2, born_host=V6_HOST), message(3)._replace(properties=b"TAGS\x01a\x02")]
    records = builder(tmp_path).build(batch, STAMP)
    assert records is not None
    start = 0
    keys = []
    for meta in meta_list(records):
        keys.append(uniq_key_of(records, start, meta[2]))
        start += meta[0]
    assert keys == [b"C0A8000A9CB3" + f"{1:020X}".encode(), b"C0A8000A9CB3" + f"{2:020X}".encode(), None]


def test_inconsistent_layouts_are_named(tmp_path: Path) -> None:
    records = builder(tmp_path).build([message(1), message(2)], STAMP)
    assert records is not None and check_layout(records) is None
    first, second = meta_list(records)
    (size, topic, flags, queue, tag, reconsume, keys) = first
    cases = {
        "runs past": records._replace(metas=pack_metas([first, (second[0] + 10, *second[1:])])),
        "does not match": records._replace(metas=pack_metas([(size - 4, topic, flags, queue, tag, reconsume, keys),
                                                             second])),
        "names topic": records._replace(metas=pack_metas([(size, 9, flags, queue, tag, reconsume, keys), second])),
        "flags": records._replace(metas=pack_metas([(size, topic, 0x80, queue, tag, reconsume, keys), second])),
        "key hashes": records._replace(key_hashes=records.key_hashes[:-4]),
        "not whole": records._replace(key_hashes=records.key_hashes[:-1]),
        "too small": records._replace(metas=pack_metas([(40, topic, flags, queue, tag, reconsume, keys), second])),
        "past the last": records._replace(records=records.records + b"\x00" * 8),
        "store host": records._replace(store_host=b"\x00" * 4),
        "magic": records._replace(records=records.records[:4] + b"\x00\x00\x00\x00" + records.records[8:]),
    }
    for words, broken in cases.items():
        problem = check_layout(broken)
        expected = {"magic": "does not match", "too small": "runs past"}.get(words, words)
        assert problem is not None and expected in problem, (words, problem)


def test_a_topic_the_store_refuses_is_rejected_per_record(tmp_path: Path) -> None:
    """A hand-made batch (no builder makes one) naming an invalid topic: that record is refused with a
    reason and takes no offset; the others are stored."""
    store = MessageStore(small_config(tmp_path / "s"))
    records = builder(tmp_path).build([message(1), message(2, topic="Other")], STAMP)
    assert records is not None
    broken = PreparedRecords(records.store_timestamp, records.store_host, ("TopicTest", "bad topic"), records.metas,
                             records.key_hashes, records.records)
    outcome = store.append_records(1, broken)
    assert [r.status for r in outcome.results] == [AppendStatus.OK, AppendStatus.REJECTED]
    assert outcome.results[1].reason is not None and "characters" in outcome.results[1].reason
    assert store.commit_log.end_offset == meta_list(records)[0][0]
    store.close()


@pytest.mark.parametrize("count", [0, 1, 300])
def test_meta_layout_is_fixed(count: int, tmp_path: Path) -> None:
    records = builder(tmp_path).build([message(n, body=b"b") for n in range(count)], STAMP)
    assert records is not None and records.record_count == count == len(meta_list(records))
    assert META.size == 25 and len(records.metas) == 25 * count
