"""The scrubber's record walk (commitlog.scrub_walk) and the scrub built on it.

The walk in C gives exactly what the Python walk gives, on valid segments and on damaged ones; and
``MessageStore.scrub``, which walks records and compares the derived files a run at a time, finds and repairs
exactly what the per-record scrub did (each record decoded, its consume-queue unit and key-index entries
checked one by one: :func:`per_record_scrub` below, the scrub as it was written before the walk), for every
kind of damage, with the C walk and with the Python one."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import commitlog.scrub as scrub_module
import commitlog.scrub_walk as scrub_walk_module
from commitlog.consume_queue import UNIT_BYTES
from commitlog.dispatch import record_index_entries
from commitlog.index_upkeep import check_index_entries
from commitlog.key_index import ENTRY, IndexEntry
from commitlog.message import MessageInput
from commitlog.record_codec import MESSAGE_MAGIC, crc32, decode_record
from commitlog.scrub_walk import (
    KEY_ENTRY,
    RECORD_FACTS,
    SegmentWalk,
    walk_segment_python,
)
from commitlog.store import MessageStore
from commitlog.sys_flags import TRANSACTION_COMMIT_TYPE, TRANSACTION_PREPARED_TYPE, TRANSACTION_ROLLBACK_TYPE
from commitlog.tag_codes import cached_tag_code
from tests.commitlog.helpers import data_bytes, message, small_config
from tests.commitlog.key_index_damage import write_at
from tests.commitlog.test_records import V6_HOST, varied

try:
    from commitlog import _native
except ImportError:  # not built: the tests below say so
    _native = None  # type: ignore[assignment]

#: messages of every shape the walk reads differently: IPv6 born hosts, transaction halves (no unit, or no
#: unit and no key-index entry), a non-ASCII tag (its code through cached_tag_code), a property named twice
#: (the last wins), keys with empty pieces, an empty UNIQ_KEY, no properties at all
ODD_PROPERTIES = (b"TAGS\x01first\x02TAGS\x01second\x02KEYS\x01 a  b \x02UNIQ_KEY\x01\x02",
                  b"KEYS\x01k\x02XTAGS\x01no\x02UNIQ_KEY\x01u-1",
                  b"")


def odd(number: int) -> MessageInput:
    kind = number % 6
    plain = message(number, queue_id=number % 3, born_host=V6_HOST if number % 2 else message(0).born_host)
    if kind == 0:
        return plain._replace(sys_flag=TRANSACTION_PREPARED_TYPE)
    if kind == 1:
        return plain._replace(sys_flag=TRANSACTION_ROLLBACK_TYPE)
    if kind == 2:
        return message(number, tags="标签-ü", queue_id=1)
    return plain._replace(properties=ODD_PROPERTIES[kind - 3], sys_flag=TRANSACTION_COMMIT_TYPE * (number % 2))


def filled(directory: Path, store_host: str = "10.1.2.3:10911") -> MessageStore:
    """A store of varied and odd records over several small segments (each ended by a filler)."""
    store = MessageStore(small_config(directory, store_host=store_host), background_flush=False)
    for index in range(1, 41):
        store.append(index, [*varied(8, start=index * 8), odd(index), odd(index + 41)])
    store.flush()
    assert store.commit_log.end_offset > 4 * store.config.segment_size_bytes
    return store


def both_walks(segment: bytes, segment_start: int, local_start: int, local_stop: int) -> SegmentWalk:
    """The walk in C, checked against the Python walk (separate tag-code caches: neither sees the other's)."""
    native = _native
    assert native is not None, "commitlog._native was not built (setup.py): the scrubber walks in Python"
    expected = walk_segment_python(segment, segment_start, local_start, local_stop, {})
    got = SegmentWalk(*native.walk_records(segment, segment_start, local_start, local_stop, {}, cached_tag_code,
                                           crc32))
    assert got == expected
    return got


@pytest.fixture(scope="module")
def segments(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[int, bytes]]:
    """(start, bytes) of each segment of a filled store, and of one with an IPv6 store host."""
    found: list[tuple[int, bytes]] = []
    for number, host in enumerate(("10.1.2.3:10911", "[fd00::7]:10911")):
        store = filled(tmp_path_factory.mktemp(f"walk{number}") / "s", host)
        found.extend((start, bytes(store.commit_log.segments[start].map)) for start in store.commit_log.starts)
        store.close()
    return found


def test_the_c_walk_is_built_and_used() -> None:
    assert _native is not None and scrub_walk_module.NATIVE, "commitlog._native was not built (setup.py)"


def test_the_c_walk_gives_what_the_python_walk_gives_on_every_valid_segment(segments: list[tuple[int, bytes]]
                                                                             ) -> None:
    walked_records = 0
    for start, data in segments:
        walked = both_walks(data, start, 0, len(data))
        records = [RECORD_FACTS.unpack_from(walked.facts, at) for at in range(0, len(walked.facts), RECORD_FACTS.size)]
        walked_records += len(records)
        if walked.end != len(data):  # the last segment: the walk stops where the data ends
            assert data[walked.end : walked.end + 8] == bytes(8)
        # a walk may start at any record and stop anywhere: it goes on to the end of the record under its stop
        for physical, *_ in records[::7]:
            local = physical - start
            partial = both_walks(data, start, local, local + 1)
            assert len(partial.facts) == RECORD_FACTS.size
    assert walked_records == 2 * 40 * 10


def test_the_walk_reports_what_the_scrubber_checks(segments: list[tuple[int, bytes]]) -> None:
    """Queue checks skip the transaction halves, key entries the rolled-back ones; a named property is the
    last of its name; empty keys and an empty UNIQ_KEY make no entry; a non-ASCII tag has Java's code."""
    start, data = segments[0]
    walked = both_walks(data, start, 0, len(data))
    facts = [RECORD_FACTS.unpack_from(walked.facts, at) for at in range(0, len(walked.facts), RECORD_FACTS.size)]
    entries = [KEY_ENTRY.unpack_from(walked.entries, at) for at in range(0, len(walked.entries), KEY_ENTRY.size)]
    store_records = {fact[0]: fact for fact in facts}
    assert {walked.topics[fact[6]] for fact in facts} >= {"TopicTest", "Other_topic-2", "%RETRY%g"}
    for physical, fact in store_records.items():
        size = fact[3]
        record = decode_record(data[physical - start : physical - start + size])
        expected: list[IndexEntry] = record_index_entries(record)
        assert [entry for entry in entries if entry[1] == physical] == expected
        assert fact[7] == (record.sys_flag & 0xC not in (TRANSACTION_PREPARED_TYPE, TRANSACTION_ROLLBACK_TYPE))
    assert any(not fact[7] for fact in facts)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_the_c_walk_agrees_with_the_python_walk_on_damaged_segments(segments: list[tuple[int, bytes]],
                                                                   data: st.DataObject) -> None:
    start, original = data.draw(st.sampled_from(segments[:4]))
    damaged = bytearray(original)
    for _ in range(data.draw(st.integers(1, 3))):
        at = data.draw(st.integers(0, len(damaged) - 1))
        kind = data.draw(st.sampled_from(["flip", "byte", "zeros", "ff"]))
        if kind == "flip":
            damaged[at] ^= 1 << data.draw(st.integers(0, 7))
        elif kind == "byte":
            damaged[at] = data.draw(st.integers(0, 255))
        elif kind == "zeros":  # a tail rolled back: a record cut short
            damaged[at:] = bytes(len(damaged) - at)
        else:
            damaged[at : at + 4] = b"\xff" * len(damaged[at : at + 4])
    local_start = data.draw(st.sampled_from([0, data.draw(st.integers(0, len(damaged) - 1))]))
    both_walks(bytes(damaged), start, local_start, len(damaged))


def per_record_scrub(store: MessageStore, start: int, max_bytes: int) -> tuple[int | None, int]:
    """The scrub as it was before the record walk: every record decoded (``CommitLog.scan``), its consume-queue
    unit and key-index entries checked one record at a time, under one hold of the store lock."""
    with store.state.lock:
        start = max(start, store.commit_log.min_offset)
        end = min(store.commit_log.end_offset, start + max_bytes)
        if start >= end:
            return None, store.commit_log.min_offset
        expected: list[IndexEntry] = []
        for record in store.commit_log.scan(start, end):
            scrub_module.check_queue_unit(store.state, record)
            expected.extend(record_index_entries(record))
        reached = store.commit_log.scan_end
        check_index_entries(store.state, expected)
        if reached >= end or reached >= store.commit_log.end_offset:
            return None, reached
        return reached, reached


def scrub_to_damage(scrub: Callable[[int, int], tuple[int | None, int]], end: int) -> list[tuple[int | None, int]]:
    """Scrub calls of 64 KiB from the start until the end or the first damaged record: what each returned."""
    answers = []
    position = 0
    while True:
        damaged, position = scrub(position, 64 << 10)
        answers.append((damaged, position))
        if damaged is not None or position >= end:
            return answers


def a_plain_record(store: MessageStore) -> tuple[int, int, bytes]:
    """(physical offset, size, properties) of a record in the middle of the log with tags and keys."""
    walked = store.commit_log.walk(0, store.commit_log.end_offset, {})[1]
    facts = b"".join(each.facts for each in walked)
    for at in range(150 * RECORD_FACTS.size, len(facts), RECORD_FACTS.size):
        physical, _, _, size, *_ = RECORD_FACTS.unpack_from(facts, at)
        record = store.read_message(physical)
        if record.sys_flag == 0 and b"TAGS\x01Tag" in record.properties and b"KEYS\x01k" in record.properties:
            return physical, size, record.properties
    raise AssertionError("no plain record")


def first_filler(store: MessageStore) -> int:
    """The commit-log offset of the filler that ends the first segment."""
    segment = store.commit_log.segments[store.commit_log.starts[0]].map
    local = 0
    while int.from_bytes(segment[local + 4 : local + 8], "big") == MESSAGE_MAGIC:
        local += int.from_bytes(segment[local : local + 4], "big")
    return store.commit_log.starts[0] + local


def segment_path(store: MessageStore, physical: int) -> tuple[Path, int]:
    start = store.commit_log.segment_start(physical)
    return store.commit_log.segments[start].path, physical - start


def damage(store: MessageStore, kind: str) -> None:
    """Bytes gone bad on the disk, of one kind."""
    physical, size, properties = a_plain_record(store)
    path, local = segment_path(store, physical)
    properties_at = local + size - len(properties)
    if kind == "head: size":
        write_at(path, local + 2, b"\x7f")
    elif kind == "head: magic":
        write_at(path, local + 5, b"\x00")
    elif kind == "head: physical offset":
        write_at(path, local + 28 + 6, b"\x55")
    elif kind == "head: queue offset":  # no checksum: the unit it names is left alone
        write_at(path, local + 20 + 7, b"\x55")
    elif kind == "body":
        write_at(path, local + 120, b"\x00\x01\x02")
    elif kind == "properties: length":
        write_at(path, properties_at - 2, b"\x7f")
    elif kind == "properties: a KEYS value":  # no checksum: the key index follows what the record says
        write_at(path, properties_at + properties.index(b"KEYS\x01") + 5, b"Z")
    elif kind == "properties: the TAGS value":  # likewise its unit's tag code
        write_at(path, properties_at + properties.index(b"TAGS\x01") + 5, b"Q")
    elif kind == "truncated record":
        write_at(path, local + size // 2, bytes(size - size // 2))
    elif kind == "filler at a segment's end":
        filler = first_filler(store)
        write_at(store.commit_log.segments[store.commit_log.segment_start(filler)].path,
                 filler - store.commit_log.segment_start(filler) + 1, b"\x01")
    elif kind == "consume-queue unit":
        queue = store.queues[("TopicTest", 1)]
        write_at(queue.files[0].path, 3 * UNIT_BYTES + 4, b"\x3f")
        write_at(queue.files[0].path, 7 * UNIT_BYTES + 8, bytes(4))
        write_at(queue.files[0].path, 9 * UNIT_BYTES + 16, b"\x01")
    elif kind == "key-index entry missing":
        index_file = store.index.files[1]
        write_at(index_file.file.path, index_file.entries_base + 17 * ENTRY.size, bytes(12))
    else:
        raise AssertionError(kind)


DAMAGE_KINDS = ("head: size", "head: magic", "head: physical offset", "head: queue offset", "body",
                "properties: length", "properties: a KEYS value", "properties: the TAGS value", "truncated record",
                "filler at a segment's end", "consume-queue unit", "key-index entry missing")
#: the kinds the scrub's answer names as a damaged record (the others it repairs or leaves, as before)
FOUND_AS_DAMAGED = {"head: size", "head: magic", "head: physical offset", "body", "properties: length",
                    "truncated record", "filler at a segment's end"}


@contextmanager
def walking_in(native: bool) -> Iterator[None]:
    saved = scrub_walk_module.NATIVE
    scrub_walk_module.NATIVE = native
    try:
        yield
    finally:
        scrub_walk_module.NATIVE = saved


@pytest.mark.parametrize("lock_bytes", [4096, scrub_module.SCRUB_LOCK_BYTES], ids=["small-holds", "default-holds"])
@pytest.mark.parametrize("kind", DAMAGE_KINDS)
def test_the_scrub_finds_and_repairs_what_the_per_record_scrub_did(tmp_path: Path, kind: str, lock_bytes: int,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scrub_module, "SCRUB_LOCK_BYTES", lock_bytes)
    reference, in_c, in_python = (filled(tmp_path / name) for name in ("reference", "c", "python"))
    healthy = data_bytes(tmp_path / "reference")
    for store in (reference, in_c, in_python):
        damage(store, kind)
    damaged_bytes = data_bytes(tmp_path / "reference")
    assert damaged_bytes != healthy
    expected = scrub_to_damage(lambda start, size: per_record_scrub(reference, start, size), reference.max_physical_offset)
    with walking_in(native=True):
        got_in_c = scrub_to_damage(in_c.scrub, in_c.max_physical_offset)
    with walking_in(native=False):
        got_in_python = scrub_to_damage(in_python.scrub, in_python.max_physical_offset)
    # the same damaged record named (none for damage a scrub repairs itself), the same files after the repairs
    assert [damaged for damaged, _ in got_in_c] == [damaged for damaged, _ in got_in_python]
    assert got_in_c[-1] == got_in_python[-1] == expected[-1]
    for store in (reference, in_c, in_python):
        store.flush()
    assert data_bytes(tmp_path / "c") == data_bytes(tmp_path / "python") == data_bytes(tmp_path / "reference")
    if kind in FOUND_AS_DAMAGED:
        assert expected[-1][0] is not None
    elif kind in ("consume-queue unit", "key-index entry missing"):
        assert expected[-1][0] is None and data_bytes(tmp_path / "c") == healthy  # put back as it was
    for store in (reference, in_c, in_python):
        store.close()


class CountingLock:
    """A store's lock that counts the record walks made in each of its holds."""

    def __init__(self, lock: AbstractContextManager[object]) -> None:
        self.lock = lock
        self.depth = 0
        self.walks_per_hold: list[int] = []

    def __enter__(self) -> None:
        self.lock.__enter__()
        self.depth += 1
        if self.depth == 1:
            self.walks_per_hold.append(0)

    def __exit__(self, *exc: Any) -> None:
        self.depth -= 1
        self.lock.__exit__(*exc)


def test_a_scrub_call_holds_the_store_lock_for_a_chunk_at_a_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                                  ) -> None:
    """Apply waits for the scrubber's hold of the store lock: a call over the whole log takes it once per
    SCRUB_LOCK_BYTES of records walked, not once for everything."""
    monkeypatch.setattr(scrub_module, "SCRUB_LOCK_BYTES", 32 << 10)
    store = filled(tmp_path / "s")
    lock = CountingLock(store.state.lock)
    spans: list[int] = []
    walk = store.commit_log.walk

    def counted_walk(start: int, stop: int, tag_codes: dict[bytes, int]) -> tuple[int, list[SegmentWalk]]:
        assert lock.depth == 1
        lock.walks_per_hold[-1] += 1
        spans.append(stop - start)
        return walk(start, stop, tag_codes)

    monkeypatch.setattr(store.commit_log, "walk", counted_walk)
    monkeypatch.setattr(store.state, "lock", lock)
    assert store.scrub(0, 1 << 30) == (None, store.max_physical_offset)
    assert len(spans) > store.max_physical_offset // (64 << 10)
    assert max(spans) <= 32 << 10 and max(lock.walks_per_hold) == 1
    monkeypatch.undo()
    store.close()
