"""Key-index files with bytes gone bad (issue #24): nothing is decided from one before it is checked against
its checksum, its links and the commit log, and a damaged file is rebuilt from the commit log, byte for byte
what a healthy replica holds. The scrubber finds damage nothing read yet; a client's query passes over an
entry that names no record of its key; files of the first format (no checksum) still open."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import commitlog.key_index as key_index_module
from commitlog.errors import DamagedRecordError, DiskFullError
from commitlog.key_index import index_columns, key_hash
from commitlog.key_index_checks import file_problem
from commitlog.key_index_files import KeyIndex
from commitlog.mapped_file import MappedFile
from commitlog.store import MessageStore
from tests.commitlog.helpers import retry_of, small_config
from tests.commitlog.key_index_damage import (
    DAMAGES,
    MESSAGES,
    TOPIC,
    damage,
    entry_of,
    read_at,
    stored_message,
    uniq_key,
    with_newer_in_bucket,
    write_at,
)


def filled(directory: Path, **overrides: Any) -> MessageStore:
    store = MessageStore(small_config(directory, **overrides), background_flush=False)
    for number in range(MESSAGES):
        store.append(number + 1, [stored_message(number)])
    store.flush()
    return store


def index_bytes(store: MessageStore) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted((store.root / "index").iterdir())}


def answers(store: MessageStore) -> object:
    """What apply's dedupe lookups answer for a retry of every message."""
    return store.find_recent_sends([retry_of(stored_message(number)) for number in range(MESSAGES)], 0)


def test_the_fixture_spans_files_with_records_straddling_them(tmp_path: Path) -> None:
    store = filled(tmp_path / "s")
    files = store.index.files
    assert len(files) == 3
    straddles = [f for before, f in itertools.pairwise(files)
                 if before.entry(before.entry_count - 1)[1] == f.begin_physical]
    assert len(straddles) == 2  # a record's entries in two files: the rebuild must split them as appends did
    store.close()


@pytest.mark.parametrize("kind", [*DAMAGES, "entry stamp", "header count", "checksum", "padding"])
def test_the_scrubber_rebuilds_a_damaged_index_file_byte_for_byte(tmp_path: Path, kind: str) -> None:
    """Damage while the member runs, in a file no lookup has met yet: the scrubber's pass over the key-index
    files finds it (checksum, links, slots) and rebuilds the file from the commit log, as a healthy replica
    holds it."""
    healthy, damaged = filled(tmp_path / "a"), filled(tmp_path / "b")
    assert index_bytes(healthy) == index_bytes(damaged)
    number = with_newer_in_bucket(damaged.index) if kind == "next pointer" else 40
    ours = entry_of(damaged.index, uniq_key(number))
    if kind in DAMAGES:
        damage(damaged.index, number, kind)
    elif kind == "entry stamp":
        write_at(ours.path, ours.entry_at + 15, b"\x07")
    else:
        at = {"header count": 42, "checksum": 45, "padding": 60}[kind]
        write_at(ours.path, at, bytes([read_at(ours.path, at, 1)[0] ^ 0x21]))
    assert index_bytes(healthy) != index_bytes(damaged)
    assert damaged.scrub_index(1 << 30) is None  # (before: no such check)
    assert index_bytes(healthy) == index_bytes(damaged)
    assert answers(damaged) == answers(healthy)
    healthy.close()
    damaged.close()


@pytest.mark.parametrize("kind", ["entry offset", "entry hash", "entry stamp"])
def test_the_commit_log_scrub_checks_the_index_entries_of_the_records_it_validates(tmp_path: Path, kind: str) -> None:
    healthy, damaged = filled(tmp_path / "a"), filled(tmp_path / "b")
    ours = entry_of(damaged.index, uniq_key(40))
    if kind == "entry stamp":
        write_at(ours.path, ours.entry_at + 15, b"\x07")
    else:
        damage(damaged.index, 40, kind)
    assert damaged.scrub(0, 1 << 30) == (None, damaged.max_physical_offset)
    assert index_bytes(healthy) == index_bytes(damaged)
    healthy.close()
    damaged.close()


@pytest.mark.parametrize("file_number", [0, 1, 2])
def test_each_file_is_rebuilt_as_it_was_whichever_records_straddle_it(tmp_path: Path, file_number: int) -> None:
    """A file's first record may have entries in the file before, its last record in the file after: the
    rebuilt file splits them as appends did (the last file, which appends go on in, included)."""
    healthy, damaged = filled(tmp_path / "a"), filled(tmp_path / "b")
    path = damaged.index.files[file_number].file.path
    write_at(path, 45, bytes([read_at(path, 45, 1)[0] ^ 0x01]))  # its checksum
    damaged.scrub_index(1 << 30)
    assert index_bytes(healthy) == index_bytes(damaged)
    for number in (MESSAGES, MESSAGES + 1):  # appends go on as on the healthy replica
        for store in (healthy, damaged):
            store.append(number + 1, [stored_message(number)])
    assert index_bytes(healthy) == index_bytes(damaged)
    healthy.close()
    damaged.close()


@pytest.mark.parametrize("kind", DAMAGES)
def test_a_file_damaged_at_rest_is_rebuilt_before_a_reopened_store_answers(tmp_path: Path, kind: str) -> None:
    """The last file (recovery checks it before it undoes a cut tail) and an older one (checked before the
    first lookup that reads it, or the recent-keys filter is seeded from it)."""
    healthy = filled(tmp_path / "a")
    expected, healthy_index = answers(healthy), index_bytes(healthy)
    healthy.close()
    for number in (MESSAGES - 3, 40):  # in the last file, in the first
        directory = tmp_path / f"b{number}"
        damaged = filled(directory)
        if kind == "next pointer":
            number = with_newer_in_bucket(damaged.index)
        damaged.close()
        damage(damaged.index, number, kind)
        reopened = MessageStore(small_config(directory), background_flush=False)
        assert answers(reopened) == expected, number
        assert reopened.recently_stored_mask(np.array([key_hash(TOPIC, uniq_key(number))], dtype=np.uint32),
                                             0).all()
        assert index_bytes(reopened) == healthy_index
        reopened.close()


def test_a_client_query_passes_over_an_entry_that_names_no_record_and_apply_repairs_the_file(tmp_path: Path) -> None:
    healthy, damaged = filled(tmp_path / "a"), filled(tmp_path / "b")
    damage(damaged.index, 40, "entry offset")
    key = uniq_key(40)
    assert damaged.query_by_key(TOPIC, key, 5) == []  # not found here, and its file doubted
    name = entry_of(healthy.index, key).path.name
    assert not next(f for f in damaged.index.files if f.file.path.name == name).checked
    found = damaged.query_by_key(TOPIC, key, 5, verified=True)  # before: DamagedRecordError, no peer can repair
    assert [message.physical_offset for message in found] == [
        message.physical_offset for message in healthy.query_by_key(TOPIC, key, 5, verified=True)]
    assert index_bytes(healthy) == index_bytes(damaged)
    assert damaged.query_by_key(TOPIC, key, 5) == healthy.query_by_key(TOPIC, key, 5)
    healthy.close()
    damaged.close()


def test_a_damaged_record_is_still_reported_when_its_index_entry_holds(tmp_path: Path) -> None:
    """The index is checked first: when it holds, a record that does not match its entry is the damage, and
    apply puts it back from a peer (DamagedRecordError), as before."""
    store = filled(tmp_path / "s")
    physical = entry_of(store.index, uniq_key(40)).physical
    start = store.commit_log.segment_start(physical)
    write_at(store.commit_log.segments[start].path, physical - start + 88 + 3, b"\xee")  # its body
    with pytest.raises(DamagedRecordError) as raised:
        store.find_recent_send(*retry_of(stored_message(40)), 0)
    assert raised.value.physical_offset == physical
    store.close()


def test_files_of_the_first_format_open_and_are_rebuilt_before_they_are_trusted(tmp_path: Path) -> None:
    """Stores written before the checksum: their files say format 1 and carry none. They open, answer as
    before, and are rebuilt (as format 2) before anything is decided from them."""
    healthy = filled(tmp_path / "a")
    expected, current = answers(healthy), index_bytes(healthy)
    healthy.close()
    old = filled(tmp_path / "b")
    old.close()
    for path in sorted((tmp_path / "b" / "index").iterdir()):
        write_at(path, 4, key_index_module.INDEX_VERSION_UNCHECKED.to_bytes(2, "big"))
        write_at(path, 44, bytes(4))  # where format 1 had padding
    reopened = MessageStore(small_config(tmp_path / "b"), background_flush=False)
    assert answers(reopened) == expected
    assert index_bytes(reopened) == current
    reopened.close()


def test_a_file_that_begins_before_the_commit_log_keeps_the_entries_of_deleted_records(tmp_path: Path) -> None:
    """After retention, the first file may begin below the commit log's start: its entries of deleted records
    cannot be rebuilt, and are kept as the file holds them (no lookup uses them)."""
    overrides = {"segment_size_bytes": 64 * 1024, "body_size_max_bytes": 16 * 1024}
    healthy, damaged = filled(tmp_path / "a", **overrides), filled(tmp_path / "b", **overrides)
    for store in (healthy, damaged):
        store.delete_below(MESSAGES + 1, 64 * 1024)
        assert store.commit_log.min_offset == 64 * 1024
        assert store.index.files[0].begin_physical < store.commit_log.min_offset
    first = damaged.index.files[0]
    hashes = [first.entry(entry)[:2] for entry in range(first.entry_count)]
    number = next(n for n in range(MESSAGES) if any(hashed == key_hash(TOPIC, uniq_key(n)) and physical >= 64 * 1024
                                                    for hashed, physical in hashes))
    damage(damaged.index, number, "slot head")
    assert damaged.scrub_index(1 << 30) is None
    assert index_bytes(healthy) == index_bytes(damaged)
    healthy.close()
    damaged.close()


def test_rebuilt_entries_split_straddling_records_as_appends_did() -> None:
    """The pure choice of a rebuilt file's entries (commitlog.index_rebuild), with a file of 4 entries: records
    A (3 keys) at 100, B (1) at 200, C (2) at 300; the file before holds A's first entry."""
    from commitlog.index_rebuild import ScannedRecords, rebuilt_entries

    def entries(*rows: tuple[int, int]) -> Any:
        return index_columns([(hash_value, physical, physical * 1000) for hash_value, physical in rows])

    scanned = entries((1, 100), (2, 100), (3, 100), (4, 200), (5, 300), (6, 300))
    # not the last file: it ends inside C's entries (C names the next file), so it skips 1 of A's: 2 3 4 5
    middle = rebuilt_entries(ScannedRecords(scanned, 3, 2), entries(), 1, 4, False)
    assert middle is not None and middle.hashes.tolist() == [2, 3, 4, 5]
    # the last file: which of A's are in it is told by what it still holds, or else by the file before
    held = entries((2, 100), (3, 100), (4, 200))
    last = rebuilt_entries(ScannedRecords(scanned.since(0, 4), 3, None), held, 0, 4, False)
    assert last is not None and last.hashes.tolist() == [2, 3, 4]
    last = rebuilt_entries(ScannedRecords(scanned.since(0, 4), 3, None), entries((9, 9)), 1, 4, False)
    assert last is not None and last.hashes.tolist() == [2, 3, 4]
    # the sizes do not fit (the next file named by a record with no entries): the whole index is rebuilt
    assert rebuilt_entries(ScannedRecords(scanned.since(0, 4), 3, 0), entries(), 0, 4, False) is None


def test_a_lookup_doubts_a_file_whose_chain_breaks_what_appends_write(tmp_path: Path) -> None:
    index = KeyIndex(tmp_path, slot_count=4, entry_capacity=16)
    rows = [(key_hash("T", f"k{n % 3}"), n * 10, 1_000 + n) for n in range(10)]
    index.prepare(rows)
    index.insert_many(rows)
    (only,) = index.files
    assert file_problem(index, only) is None
    assert [f.checked for f in index.files] == [True]
    hashed = key_hash("T", "k1")
    slot_at = 64 + (hashed % 4) * 4
    write_at(only.file.path, slot_at, (99).to_bytes(4, "big"))  # a slot past the entries
    assert index.lookup(hashed, 10) == []  # (before: the same, unnoticed)
    assert [f.checked for f in index.files] == [False]
    assert file_problem(index, only) is not None
    index.close()


def test_a_rebuild_without_room_for_a_second_copy_writes_over_the_damaged_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    healthy, damaged = filled(tmp_path / "a"), filled(tmp_path / "b")
    damage(damaged.index, 40, "slot head")

    def no_room(path: Path, size_bytes: int, create: bool) -> object:
        if create and key_index_module.REBUILD_SUFFIX in path.name:
            raise DiskFullError(f"no space for {size_bytes} bytes at {path}")
        return MappedFile(path, size_bytes, create)

    monkeypatch.setattr(key_index_module, "MappedFile", no_room)
    assert damaged.scrub_index(1 << 30) is None
    assert index_bytes(healthy) == index_bytes(damaged)
    assert not list((tmp_path / "b" / "index").glob("*.rebuild*"))
    healthy.close()
    damaged.close()
