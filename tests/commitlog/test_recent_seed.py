"""The recent-keys filter seeded from the key index at open: "no" is exact for the first dedupe window
after a restart, never denies a key a lookup can find, and leaves older times to the index."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import numpy as np
import pytest

from commitlog.key_index import key_hash
from commitlog.recent_keys import SEED_SPAN_MS
from commitlog.store import MessageStore
from tests.commitlog.helpers import message, retry_of, small_config

TOPIC = "TopicTest"
BASE_MS = 1_700_000_000_000  # a whole second


def uniq_key(number: int) -> bytes:
    return b"C0A8000A9CB3" + b"%020X" % number


def uniq_hash(number: int) -> int:
    return key_hash(TOPIC, uniq_key(number).decode())


def store_at(store: MessageStore, raft_index: int, number: int, store_timestamp: int) -> None:
    store.append(raft_index, [message(number)._replace(store_timestamp=store_timestamp)])


def test_a_reopened_store_answers_no_exactly_for_the_last_window(tmp_path: Path) -> None:
    # one message every 500 ms for 300 s: 1200 index entries (UNIQ_KEY and KEYS) over ~5 files of 256
    stamps = {number: BASE_MS + number * 500 for number in range(600)}
    # the boundary second of the seeded span (newest - 120 s is BASE + 179_500): its first millisecond, a
    # stamp before and one after the span's start, its last millisecond; and the second before's last
    stamps.update({1001: BASE_MS + 178_999, 1002: BASE_MS + 179_000, 1003: BASE_MS + 179_400,
                   1004: BASE_MS + 179_600, 1005: BASE_MS + 179_999})
    order = sorted(stamps, key=lambda number: (stamps[number], number))
    config = small_config(tmp_path)
    store = MessageStore(config)
    for raft_index, number in enumerate(order, start=1):
        store_at(store, raft_index, number, stamps[number])
    newest = max(stamps.values())
    floor = (newest - SEED_SPAN_MS) // 1000 * 1000 - 1
    assert floor == BASE_MS + 178_999
    asked_times = [floor, floor + 1, BASE_MS + 179_500, BASE_MS + 179_999, BASE_MS + 180_000, newest, newest + 1]
    before = {since: store.find_recent_sends([retry_of(message(n)) for n in order], since) for since in asked_times}
    assert len(store.index.files) > 3
    store.close()

    store = MessageStore(config)
    try:
        stored = np.array([uniq_hash(n) for n in order], dtype=np.uint32)
        probes = np.array(random.Random(3).sample(range(1 << 32), 500), dtype=np.uint32)
        # at floor + 1 (the first millisecond of the boundary second) the filter answers exactly: every key
        # stamped since is "maybe", every other key and never-sent hash "no"
        answers = store.recently_stored_mask(stored, floor + 1).tolist()
        assert answers == [stamps[n] >= floor + 1 for n in order]
        assert answers[order.index(1002)] and not answers[order.index(1001)]
        assert not store.recently_stored_mask(probes, floor + 1).any()
        # the index answers as before the restart, for every time asked
        for since in asked_times:
            sends = [retry_of(message(n)) for n in order]
            assert store.find_recent_sends(sends, since) == before[since], since
        assert store.find_recent_send(TOPIC, b"never-sent", 0, b"", floor + 1) is None
    finally:
        store.close()

    store = MessageStore(config)
    try:
        # a time not after floor (the second before the span, older still) is "maybe" for every key
        for since in (floor, BASE_MS + 100_000, 0):
            assert store.recently_stored_mask(probes, since).all()
            assert store.recently_stored_mask(stored, since).all()
    finally:
        store.close()


def test_the_boundary_second_is_taken_whole(tmp_path: Path) -> None:
    # a 2.5 s span from newest 10_700 reaches 8_200: all of second 8 is seeded, second 7 is not
    span_ms = 2_500
    stamps = {1: 7_000, 2: 7_999, 3: 8_000, 4: 8_100, 5: 8_200, 6: 8_999, 7: 9_500, 8: 10_700}
    config = small_config(tmp_path)
    store = MessageStore(config)
    for raft_index, (number, store_timestamp) in enumerate(stamps.items(), start=1):
        store_at(store, raft_index, number, store_timestamp)
    store.close()
    store = MessageStore(config, recent_keys_seed_span_ms=span_ms)
    try:
        hashes = np.array([uniq_hash(n) for n in stamps], dtype=np.uint32)
        # floor is 7_999: 7_999 itself is "maybe" for every key (stamp 7_999 is not in the filter)
        assert store.recently_stored_mask(hashes, 7_999).all()
        # from 8_000 on, exact: keys of second 8 stamped before newest - span (8_000, 8_100) included
        assert store.recently_stored_mask(hashes, 8_000).tolist() == [False, False, True, True, True, True, True, True]
        assert store.find_recent_send(*retry_of(message(3)), 8_000) is not None
        assert store.find_recent_send(*retry_of(message(2)), 8_000) is None
        assert store.find_recent_send(*retry_of(message(2)), 7_999) is not None
    finally:
        store.close()


def test_a_file_beginning_in_the_boundary_second_does_not_hide_the_file_before(tmp_path: Path) -> None:
    # two entries a message, 16 a file: messages 1-8 fill file 0, message 9 begins file 1; messages 7 and 8
    # (file 0) share second 8, the span's first, with message 9
    span_ms = 2_500
    stamps = {1: 5_000, 2: 5_500, 3: 6_000, 4: 6_500, 5: 7_000, 6: 7_500, 7: 8_100, 8: 8_200, 9: 8_300,
              10: 9_000, 11: 9_500, 12: 10_000, 13: 10_700}
    config = small_config(tmp_path, index_entry_capacity=16)
    store = MessageStore(config)
    for raft_index, (number, store_timestamp) in enumerate(stamps.items(), start=1):
        store_at(store, raft_index, number, store_timestamp)
    assert [f.begin_timestamp for f in store.index.files] == [5_000, 8_300]
    store.close()
    store = MessageStore(config, recent_keys_seed_span_ms=span_ms)
    try:
        hashes = np.array([uniq_hash(n) for n in stamps], dtype=np.uint32)
        assert store.recently_stored_mask(hashes, 8_000).tolist() == [store_timestamp >= 8_000 for store_timestamp in stamps.values()]
        assert store.find_recent_send(*retry_of(message(7)), 8_000) is not None
    finally:
        store.close()


def test_only_the_files_of_the_span_are_read(tmp_path: Path) -> None:
    config = small_config(tmp_path, index_entry_capacity=16)
    store = MessageStore(config)
    for number in range(200):  # 400 entries, 25 files, two entries per second
        store_at(store, number + 1, number, 1_000_000 + number * 500)
    index = store.index
    files = len(index.files)
    # second 1_050 begins at entry 200 (message 100): in file 12 (entries 192..207), which begins before
    # it, so files 12..24 are read and none older
    read = list(index.entries_from_second(1_050))
    assert files == 25 and len(read) == 13
    assert sum(len(columns) for columns in read) == 400 - 200
    assert min(int(columns.timestamps.min()) for columns in read) == 1_050_000
    # a span starting exactly at a file's first second still reads the file before it (a lookup would:
    # its last entries may share that second), and stops there
    read = list(index.entries_from_second(1_048))
    assert len(read) == 14 and sum(len(columns) for columns in read) == 400 - 192
    # read in chunks smaller than a file: the same entries
    chunked = list(index.entries_from_second(1_048, chunk_entries=5))
    for column in ("hashes", "physicals", "timestamps"):
        assert np.concatenate([getattr(c, column) for c in chunked]).tolist() == np.concatenate(
            [getattr(c, column) for c in read]).tolist()
    store.close()


def test_answers_after_reopen_equal_a_brute_force_model(tmp_path: Path) -> None:
    rng = random.Random(20240611)
    config = small_config(tmp_path, index_entry_capacity=64)
    records: list[tuple[int, int, int]] = []  # (UNIQ_KEY number, stamp, physical offset) in log order
    store_timestamp = 5_000_000_000
    raft_index = 0

    def append_some(store: MessageStore, count: int) -> None:
        nonlocal store_timestamp, raft_index
        for _ in range(count):
            store_timestamp += rng.choice((0, 0, 1, 13, 400, 999, 1_000, 1_001, 7_000, 60_000))
            # a number sent before (a retry, or a reused key) now and then
            numbers = [rng.randrange(len(records)) if records and rng.random() < 0.2 else 10_000 + len(records) + n
                       for n in range(rng.randint(1, 4))]
            raft_index += 1
            outcome = store.append(raft_index, [message(n) for n in numbers], store_timestamp)
            records.extend((n, store_timestamp, result.physical_offset) for n, result in zip(numbers, outcome.results, strict=True))

    def check(store: MessageStore, times: int, exact_from: int | None = None) -> None:
        """find_recent_sends against the model for random times; from ``exact_from`` on, never-sent keys
        must be denied by the filter (it answers without the index)."""
        never_sent = [9_999_999 - n for n in range(20)]
        numbers = sorted({n for n, _, _ in records}) + never_sent
        sends = [retry_of(message(n)) for n in numbers]
        hashes = np.array([uniq_hash(n) for n in numbers], dtype=np.uint32)
        newest = records[-1][1]
        denied = 0
        for _ in range(times):
            # half of the times within the last window, where the seeded filter answers
            since = rng.randint(records[0][1] - 1_000 if rng.random() < 0.5 else newest - 150_000, newest + 2_000)
            newest_physical: dict[int, int] = {}
            for n, record_stamp, physical in records:
                if record_stamp >= since:
                    newest_physical[n] = physical  # the newest wins: lookups run newest first
            found = store.find_recent_sends(sends, since)
            assert [None if result is None else result.physical_offset for result in found] == [
                newest_physical.get(n) for n in numbers], since
            maybe = store.recently_stored_mask(hashes, since).tolist()
            for n, answer in zip(numbers, maybe, strict=True):
                assert answer or n not in newest_physical, (n, since)  # "no" is exact
            if exact_from is not None and since >= exact_from:
                assert not any(maybe[-len(never_sent):]), since
                denied += 1
        assert exact_from is None or denied > times // 10, denied

    def seeded_exact_from() -> int:
        """After a reopen, the filter answers for times after the oldest seeded stamp's second, whatever
        order the questions come in: the first question past it rotates the seeded bitmap to the previous
        one and raises floor to that second's last millisecond."""
        begin_second = (records[-1][1] - SEED_SPAN_MS) // 1000
        oldest_seeded = min(record_stamp for _, record_stamp, _ in records if record_stamp // 1000 >= begin_second)
        return oldest_seeded // 1000 * 1000 + 1_000

    store = MessageStore(config)
    append_some(store, 250)
    store.close()
    store = MessageStore(config)
    try:
        check(store, 100, exact_from=seeded_exact_from())
        append_some(store, 120)  # after the reopen: the seeded bitmap rotates out as times move on
        check(store, 100)
    finally:
        store.close()
    store = MessageStore(config)
    try:
        check(store, 100, exact_from=seeded_exact_from())
    finally:
        store.close()


def assert_exact_over_the_window(store: MessageStore, stamps: dict[int, int]) -> None:
    """Every key stored at or after a time of the last window is "maybe" and found; the others not found
    (each number is stored once)."""
    newest = max(stamps.values())
    numbers = list(stamps)
    hashes = np.array([uniq_hash(n) for n in numbers], dtype=np.uint32)
    for since in range(newest - SEED_SPAN_MS - 1_000, newest + 2, 250):
        maybe = store.recently_stored_mask(hashes, since).tolist()
        found = store.find_recent_sends([retry_of(message(n)) for n in numbers], since)
        for n, answer, result in zip(numbers, maybe, found, strict=True):
            assert (result is not None) == (stamps[n] >= since), (n, since)
            assert answer or stamps[n] < since, (n, since)


@pytest.mark.parametrize("path", ["crashed-tail", "rebuilt-index", "ingested-after-reopen"])
def test_recovery_paths_leave_no_indexed_key_denied(tmp_path: Path, path: str) -> None:
    # 80 messages over 160 s: the last window holds flushed keys and the tail's
    stamps = {number: BASE_MS + number * 2_000 for number in range(1, 81)}
    config = small_config(tmp_path / "store")
    store = MessageStore(config)
    for number in range(1, 41):
        store_at(store, number, number, stamps[number])
    store.flush()
    if path == "ingested-after-reopen":
        # a follower reopened with the first half (its filter seeded), then copies the rest from a peer
        store.close()
        source = MessageStore(small_config(tmp_path / "source"))
        for number in stamps:
            store_at(source, number, number, stamps[number])
        store = MessageStore(config)
        start, end = store.max_physical_offset, source.max_physical_offset
        store.ingest_raw(start, source.read_committed(start, end - start))
        store.finish_ingest(80)
        source.close()
    else:
        for number in range(41, 81):
            store_at(store, number, number, stamps[number])
        if path == "crashed-tail":
            store.abandon()  # a crash: the index tail past the checkpoint is undone and re-dispatched
        else:
            store.close()
            shutil.rmtree(tmp_path / "store" / "index")  # rebuilt from the commit log at open
        store = MessageStore(config)
    try:
        assert store.applied_raft_index == 80
        assert_exact_over_the_window(store, stamps)
    finally:
        store.close()
