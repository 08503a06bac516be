"""The segmented Raft journal (dledger.journal): pysyncobj's journal interface with MemoryJournal's results,
recovery that cuts a torn tail silently and reports damage, atomic truncation, compaction and clearing (a
crash at every file operation of each leaves the state before or after it), the import of pysyncobj's
journal file, group fsync concurrent with appends, fatal sync failures, and real pysyncobj nodes on it."""

from __future__ import annotations

import errno
import inspect
import os
import random
import re
import shutil
import sys
import tempfile
import threading
import time
from collections import Counter as CallCounter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

import pysyncobj.syncobj
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from pysyncobj import SyncObj, SyncObjConf, replicated
from pysyncobj.journal import FileJournal, MemoryJournal
from pysyncobj.node import TCPNode
from pysyncobj.transport import Transport

from cli.cluster import free_ports
from commitlog import reaper
from commitlog.errors import EXIT_SYNC_FAILED, DiskFullError
from dledger.journal import (
    MANIFEST_NAME,
    META_NAME,
    RECORD_HEAD_BYTES,
    LogEntry,
    SegmentedJournal,
    create_journal,
    segment_name,
)
from tests.commitlog.test_sync_errors import Stopped, stops  # noqa: F401  (a fixture, used by name)

#: small files and a small cache, so that tests roll segments and read entries back from them
SEGMENT_BYTES = 1024
CACHE_BYTES = 600
CACHE_ENTRIES = 4


def open_journal(directory: Path, **options: Any) -> SegmentedJournal:
    options = {"segment_size_bytes": SEGMENT_BYTES, "cache_bytes": CACHE_BYTES,
               "cache_entries_max": CACHE_ENTRIES, **options}
    return SegmentedJournal(directory, **options)


def command_for(index: int, size: int) -> bytes:
    return random.Random(index * 7919 + size).randbytes(size)


def entries_of(journal: SegmentedJournal | Any) -> list[LogEntry]:
    return [journal[position] for position in range(len(journal))]


def fill(journal: SegmentedJournal, first: int, last: int, term: int = 1, size: int = 100,
         durable_each: bool = True) -> list[LogEntry]:
    if journal.getCurrentTerm() < term:  # as Raft does: a term is stored before entries of it arrive
        journal.setCurrentTerm(term, None)
    added = []
    for index in range(first, last + 1):
        entry = (command_for(index, size), index, term)
        journal.add(*entry)
        added.append(entry)
        if durable_each:
            journal.make_durable()
    return added


def segment_files(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.seg"))


# ------------------------------------------------------------------------------- interface parity


def reference_get_entries(log: list[LogEntry], from_index: int, count: int | None,
                          size_max: int | None) -> list[LogEntry]:
    """pysyncobj 0.3.17's ``SyncObj.__getEntries`` on a list."""
    first = log[0][1]
    if from_index < first:
        return []
    diff = from_index - first
    result = log[diff:] if count is None else log[diff:diff + count]
    if size_max is None:
        return result
    total = 0
    kept = 0
    for entry in result:
        total += len(entry[0])
        kept += 1
        if total >= size_max:
            break
    return result[:max(kept, 1)]


class JournalAgainstMemoryJournal(RuleBasedStateMachine):
    """Random operations on both journals, reopening ours now and then (cleanly, or killed after a
    make_durable); every step they must hold the same entries, term and vote."""

    def __init__(self) -> None:
        super().__init__()
        self.root = Path(tempfile.mkdtemp(prefix="journal-parity-"))
        self.journal = open_journal(self.root / "journal.d")
        self.model = MemoryJournal()

    def teardown(self) -> None:
        self.journal.abandon()
        shutil.rmtree(self.root, ignore_errors=True)

    @rule(data=st.data(), size=st.sampled_from([0, 1, 60, 700, 2500]))
    def add(self, data: st.DataObject, size: int) -> None:
        if len(self.model) == 0:
            index, term = data.draw(st.integers(1, 1000)), data.draw(st.integers(0, 5))
        else:
            index, term = self.model[-1][1] + 1, self.model[-1][2] + data.draw(st.integers(0, 1))
        if self.model.getCurrentTerm() < term:  # as Raft does: the term is stored before entries of it
            self.set_term(term, None)
        command = command_for(index, size)
        self.journal.add(command, index, term)
        self.model.add(command, index, term)
        assert self.journal[-1][0] is command  # the very object: the leader's apply finds its batch by it

    @rule(data=st.data())
    def delete_from(self, data: st.DataObject) -> None:
        position = data.draw(st.integers(-3, len(self.model) + 2))
        self.journal.deleteEntriesFrom(position)
        self.model.deleteEntriesFrom(position)

    @rule(data=st.data())
    def delete_to(self, data: st.DataObject) -> None:
        position = data.draw(st.integers(-3, len(self.model) + 2))
        self.journal.deleteEntriesTo(position)
        self.model.deleteEntriesTo(position)

    @rule()
    def clear(self) -> None:
        self.journal.clear()
        self.model.clear()

    @rule()
    def make_durable(self) -> None:
        self.journal.make_durable()
        assert self.journal.durable_index == max(self.journal.last_index, 0) or len(self.journal) == 0

    @rule(step=st.integers(0, 3), vote=st.sampled_from([None, "10.0.0.1:4321", "ñode"]))
    def new_term(self, step: int, vote: str | None) -> None:
        """As Raft does: a term never goes back (a meta file's term below its log's last term is damage)."""
        self.set_term(self.model.getCurrentTerm() + step, vote)

    def set_term(self, term: int, vote: str | None) -> None:
        self.journal.setCurrentTerm(term, vote)
        self.model.setCurrentTerm(term, vote)

    @rule()
    def reopen(self) -> None:
        self.journal.close()
        self.journal = open_journal(self.root / "journal.d")

    @rule()
    def killed_after_make_durable(self) -> None:
        self.journal.make_durable()
        self.journal.abandon()
        self.journal = open_journal(self.root / "journal.d")

    @invariant()
    def same_entries(self) -> None:
        journal, model = self.journal, self.model
        expected = [model[position] for position in range(len(model))]
        assert len(journal) == len(model)
        assert journal[:] == expected
        assert entries_of(journal) == expected
        assert journal[::2] == expected[::2] and journal[-3:] == expected[-3:] and journal[1:-1] == expected[1:-1]
        assert journal.damage is None
        assert (journal.getCurrentTerm(), journal.getVotedForNodeId()) == \
            (model.getCurrentTerm(), model.getVotedForNodeId())
        if expected:
            assert journal[0] == expected[0] and journal[-1] == expected[-1] and journal[-len(expected)] == expected[0]
            first, last = expected[0][1], expected[-1][1]
            for from_index in {first - 1, first, (first + last) // 2, last, last + 1}:
                for count in (None, 1, 3):
                    for size_max in (None, 1, 1000):
                        assert journal.get_entries(from_index, count, size_max) == \
                            reference_get_entries(expected, from_index, count, size_max)
        else:
            with pytest.raises(IndexError):
                journal[-1]


TestJournalAgainstMemoryJournal = JournalAgainstMemoryJournal.TestCase
TestJournalAgainstMemoryJournal.settings = settings(derandomize=True, max_examples=100, stateful_step_count=40,
                                                    deadline=None, suppress_health_check=[HealthCheck.too_slow])


def test_reopen_returns_entries_term_vote_and_commit_index(tmp_path: Path) -> None:
    journal = open_journal(tmp_path / "journal.d")
    added = fill(journal, 1, 40, durable_each=False) + fill(journal, 41, 45, term=3, size=3000)
    journal.setCurrentTerm(3, "10.0.0.2:5000")
    journal.setRaftCommitIndex(44)
    journal.close()
    reopened = open_journal(tmp_path / "journal.d")
    assert entries_of(reopened) == added and reopened[:] == added
    assert (reopened.getCurrentTerm(), reopened.getVotedForNodeId(), reopened.getRaftCommitIndex()) == \
        (3, "10.0.0.2:5000", 44)
    assert reopened.damage is None and reopened.durable_index == 45 and len(segment_files(tmp_path / "journal.d")) > 5
    reopened.close()


def test_a_cached_entry_is_the_object_added_and_an_evicted_one_is_read_back(tmp_path: Path) -> None:
    journal = open_journal(tmp_path / "journal.d", cache_bytes=1 << 20, cache_entries_max=8)
    commands = [command_for(index, 50) for index in range(1, 21)]
    for index, command in enumerate(commands, start=1):
        journal.add(command, index, 1)
    assert all(journal[position][0] is commands[position] for position in range(14, 20))
    assert journal[2][0] == commands[2] and journal[2][0] is not commands[2]
    journal.close()


def test_get_entries_reads_no_further_than_it_returns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """pysyncobj slices the journal to its end before it keeps a batch's worth: get_entries reads one batch."""
    journal = open_journal(tmp_path / "journal.d", segment_size_bytes=1 << 20)
    fill(journal, 1, 200, size=1000, durable_each=False)
    read: list[int] = []
    real_pread = os.pread

    def counting_pread(fd: int, size: int, offset: int) -> bytes:
        read.append(size)
        return real_pread(fd, size, offset)

    monkeypatch.setattr(os, "pread", counting_pread)
    batch = journal.get_entries(10, None, 5_000)
    assert [index for _, index, _ in batch] == [10, 11, 12, 13, 14] and sum(read) < 6_000
    journal.close()


# ------------------------------------------------------------------------------- recovery


def torn_tail_fixture(directory: Path) -> tuple[list[LogEntry], int, int]:
    """Entries 1-5 durable (and the meta watermark says so), entry 6 written, never made durable; the process
    dies. Returns the durable entries and where record 6 starts and ends in the last segment."""
    journal = open_journal(directory, segment_size_bytes=1 << 20)
    durable = fill(journal, 1, 5, size=90)
    journal.setCurrentTerm(1, None)
    journal.onOneSecondTimer()
    journal.add(command_for(6, 90), 6, 1)
    segment = journal._segments[-1]
    start, end = segment.offsets[-1], segment.end
    journal.abandon()
    return durable, start, end


def test_a_torn_tail_at_every_byte_of_the_last_record_is_cut_silently(tmp_path: Path) -> None:
    original = tmp_path / "original"
    durable, start, end = torn_tail_fixture(original)
    for length in range(start, end):
        for damage_kind in ("short", "zeros", "garbage"):
            case = tmp_path / f"{length}-{damage_kind}"
            shutil.copytree(original, case)
            path = segment_files(case)[-1]
            data = bytearray(path.read_bytes())
            if damage_kind == "short":
                del data[length:]
            elif damage_kind == "zeros":
                data[length:] = bytes(end - length)
            else:
                data[length:] = random.Random(length).randbytes(end - length)
            path.write_bytes(bytes(data))
            journal = open_journal(case)
            assert entries_of(journal) == durable, (length, damage_kind)
            assert journal.damage is None, (length, damage_kind, journal.damage)
            journal.add(command_for(6, 10), 6, 1)  # the journal goes on after the cut
            journal.close()
            reopened = open_journal(case)
            assert reopened.last_index == 6 and reopened.damage is None
            reopened.close()
            shutil.rmtree(case)


def test_a_torn_older_segment_behind_a_newer_one_is_a_torn_tail(tmp_path: Path) -> None:
    """A power cut may write back a new segment's pages and not the tail of the one before: none of those
    entries was durable (their stamps say so), so the cut is silent."""
    journal = open_journal(tmp_path / "journal.d", segment_size_bytes=1000)
    durable = fill(journal, 1, 3, size=200)
    fill(journal, 4, 12, size=200, durable_each=False)  # rolls into new segments, never synced
    journal.abandon()
    first_segment = segment_files(tmp_path / "journal.d")[0]
    data = bytearray(first_segment.read_bytes())
    data[-50:] = bytes(50)  # the unsynced tail of the first segment lost
    first_segment.write_bytes(bytes(data))
    reopened = open_journal(tmp_path / "journal.d")
    assert entries_of(reopened)[:3] == durable and reopened.damage is None
    assert len(segment_files(tmp_path / "journal.d")) == 1
    reopened.close()


def test_losing_a_record_the_meta_watermark_covers_is_damage(tmp_path: Path) -> None:
    journal = open_journal(tmp_path / "journal.d", segment_size_bytes=1 << 20)
    fill(journal, 1, 6, size=90)
    journal.onOneSecondTimer()  # the watermark: 6 on disk
    journal.abandon()
    path = segment_files(tmp_path / "journal.d")[-1]
    path.write_bytes(path.read_bytes()[:-30])
    reopened = open_journal(tmp_path / "journal.d")
    assert reopened.last_index == 5 and reopened.damage is not None and "entry 6" in reopened.damage
    assert (reopened.damaged_after_index, reopened.refetch_index) == (5, 6)
    reopened.close()


def flip_bit(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x10
    path.write_bytes(bytes(data))


def test_a_bit_flip_in_a_middle_record_is_damage_and_the_prefix_is_kept(tmp_path: Path) -> None:
    directory = tmp_path / "journal.d"
    journal = open_journal(directory, segment_size_bytes=1 << 20)
    added = fill(journal, 1, 20, size=90)
    offset = journal._segments[0].offsets[9] + RECORD_HEAD_BYTES + 5  # inside entry 10's command
    journal.close()
    flip_bit(segment_files(directory)[0], offset)
    reopened = open_journal(directory)
    assert entries_of(reopened) == added[:9]
    assert reopened.damage is not None and "entry 10" in reopened.damage
    assert (reopened.damaged_after_index, reopened.refetch_index) == (9, 20)
    reopened.setCurrentTerm(2, None)  # the new leader's term, stored before its entries
    reopened.add(command_for(10, 5), 10, 2)  # refilled from the leader
    reopened.close()
    again = open_journal(directory)  # the damage stays recorded across restarts until the member clears it
    assert again.damage is not None and again.damaged_after_index == 9 and again.last_index == 10
    again.clear_damage()
    again.close()
    cleared = open_journal(directory)
    assert cleared.damage is None and cleared.last_index == 10
    cleared.close()


def test_a_missing_middle_segment_is_damage(tmp_path: Path) -> None:
    directory = tmp_path / "journal.d"
    journal = open_journal(directory)
    added = fill(journal, 1, 30, size=150)
    journal.close()
    segments = segment_files(directory)
    assert len(segments) >= 4
    missing_first = int(segments[2].name.split(".")[0])
    segments[2].unlink()
    reopened = open_journal(directory)
    assert entries_of(reopened) == added[:missing_first - 1]
    assert reopened.damage is not None and "missing" in reopened.damage
    assert reopened.damaged_after_index == missing_first - 1 and reopened.refetch_index == 30
    assert len(segment_files(directory)) == 2
    reopened.close()


def test_a_valid_record_that_does_not_follow_is_damage(tmp_path: Path) -> None:
    directory = tmp_path / "journal.d"
    journal = open_journal(directory, segment_size_bytes=1 << 20)
    added = fill(journal, 1, 8, size=90, durable_each=False)
    offsets = list(journal._segments[0].offsets)
    journal.close()
    path = segment_files(directory)[0]
    data = bytearray(path.read_bytes())
    record = RECORD_HEAD_BYTES + 90
    data[offsets[5]:offsets[5] + record] = data[offsets[4]:offsets[4] + record]  # entry 5 again where 6 was
    path.write_bytes(bytes(data))
    reopened = open_journal(directory)
    assert entries_of(reopened) == added[:5]
    assert reopened.damage is not None and "does not follow" in reopened.damage
    reopened.close()


@pytest.mark.parametrize("damage", ["bit flip", "empty", "missing"])
def test_a_damaged_meta_file_is_damage_not_a_blank_vote(tmp_path: Path, damage: str) -> None:
    directory = tmp_path / "journal.d"
    journal = open_journal(directory)
    fill(journal, 1, 3, term=5)
    journal.setCurrentTerm(5, "10.0.0.3:5000")
    journal.close()
    meta = directory / META_NAME
    if damage == "bit flip":
        flip_bit(meta, 20)
    elif damage == "empty":
        meta.write_bytes(b"")
    else:
        meta.unlink()
    reopened = open_journal(directory)
    assert reopened.damage is not None and "meta file" in reopened.damage
    assert reopened.last_index == 3  # the log itself is whole
    reopened.close()


def test_a_meta_file_rolled_back_to_an_older_term_is_damage(tmp_path: Path) -> None:
    """A valid but older meta (term 4, vote for another member) under entries of term 5: the member may have
    voted in term 5 already; taking the old meta as is would let it vote again."""
    directory = tmp_path / "journal.d"
    journal = open_journal(directory)
    journal.setCurrentTerm(4, "10.0.0.2:5000")
    older = (directory / META_NAME).read_bytes()
    journal.setCurrentTerm(5, "10.0.0.3:5000")
    fill(journal, 1, 3, term=5)
    journal.close()
    (directory / META_NAME).write_bytes(older)
    reopened = open_journal(directory)
    assert reopened.damage is not None and "older than the log's last term 5" in reopened.damage
    reopened.close()


def test_no_meta_file_is_normal_for_a_new_journal(tmp_path: Path) -> None:
    journal = open_journal(tmp_path / "journal.d")
    journal.add(b"\x01", 1, 0)  # pysyncobj's first no-op, term 0: no term was ever stored
    journal.close()
    reopened = open_journal(tmp_path / "journal.d")
    assert reopened.damage is None and (reopened.getCurrentTerm(), reopened.getVotedForNodeId()) == (0, None)
    reopened.close()


@pytest.mark.parametrize("damage", ["bit flip", "missing"])
def test_an_unreadable_manifest_is_damage(tmp_path: Path, damage: str) -> None:
    directory = tmp_path / "journal.d"
    journal = open_journal(directory)
    added = fill(journal, 1, 10)
    journal.close()
    if damage == "bit flip":
        flip_bit(directory / MANIFEST_NAME, 12)
    else:
        (directory / MANIFEST_NAME).unlink()
    reopened = open_journal(directory)
    assert reopened.damage is not None and "manifest" in reopened.damage
    assert entries_of(reopened) == added
    reopened.close()


# ------------------------------------------------------------------------------- crash at every step


class Crash(BaseException):
    """The process dies here: the file operation is not made, nothing after it runs (page cache kept)."""


#: file operations that change what is on disk, counted when made on behalf of dledger.journal
MUTATIONS = ("pwrite", "pwritev", "write", "ftruncate", "fsync", "fdatasync", "unlink", "remove", "rmdir",
             "replace", "rename", "mkdir")


def _from_journal() -> bool:
    frame: FrameType | None = sys._getframe(2)
    for _ in range(12):
        if frame is None:
            return False
        if frame.f_globals.get("__name__") == "dledger.journal":
            return True
        frame = frame.f_back
    return False


@contextmanager
def crash_at(step: int, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Raise Crash instead of making the ``step``-th file operation the journal asks for (creating a file
    counts; opening one does not)."""
    made: list[str] = []

    def counted(name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def operation(*args: Any, **kwargs: Any) -> Any:
            if name == "open" and not args[1] & os.O_CREAT:
                return real(*args, **kwargs)
            if _from_journal():
                made.append(name)
                if len(made) == step:
                    raise Crash(f"before {name} #{step}")
            return real(*args, **kwargs)
        return operation

    with monkeypatch.context() as patch:
        for name in (*MUTATIONS, "open"):
            patch.setattr(os, name, counted(name, getattr(os, name)))
        yield made


def build_journal(directory: Path) -> tuple[SegmentedJournal, list[LogEntry]]:
    journal = open_journal(directory, segment_size_bytes=700)
    added = fill(journal, 1, 30, term=1, size=120, durable_each=False) + fill(journal, 31, 33, term=2, size=120)
    journal.setCurrentTerm(2, "10.0.0.1:1")
    assert len(journal._segments) >= 6
    return journal, added


def truncate_op(journal: SegmentedJournal, added: list[LogEntry]) -> list[LogEntry]:
    journal.deleteEntriesFrom(7)  # several segments later than the one that keeps entry 7
    return added[:7]


def compact_op(journal: SegmentedJournal, added: list[LogEntry]) -> list[LogEntry]:
    journal.deleteEntriesTo(20)
    return added[20:]


def compact_all_op(journal: SegmentedJournal, added: list[LogEntry]) -> list[LogEntry]:
    journal.deleteEntriesTo(len(added))
    return []


def clear_op(journal: SegmentedJournal, added: list[LogEntry]) -> list[LogEntry]:
    journal.clear()
    return []


def roll_op(journal: SegmentedJournal, added: list[LogEntry]) -> list[LogEntry]:
    entry = (command_for(34, 650), 34, 2)  # does not fit the active segment: a new one
    journal.add(*entry)
    journal.make_durable()
    return [*added, entry]


def start_after_clear_op(journal: SegmentedJournal, added: list[LogEntry]) -> list[LogEntry]:
    """The entry pysyncobj adds after a clear (from a snapshot): its index is anyone's."""
    entry = (command_for(5000, 90), 5000, 2)  # of the journal's current term, as a leader's snapshot is
    journal.add(*entry)
    journal.make_durable()
    return [entry]


OPERATIONS: dict[str, Callable[[SegmentedJournal, list[LogEntry]], list[LogEntry]]] = {
    "deleteEntriesFrom": truncate_op, "deleteEntriesTo": compact_op, "deleteEntriesTo all": compact_all_op,
    "clear": clear_op, "segment roll": roll_op, "first add after clear": start_after_clear_op,
}


def prepare(directory: Path, operation: str) -> tuple[SegmentedJournal, list[LogEntry]]:
    journal, added = build_journal(directory)
    if operation == "first add after clear":
        journal.clear()
        added = []
    return journal, added


@pytest.mark.parametrize("operation", OPERATIONS)
def test_a_crash_at_every_step_leaves_the_state_before_or_after(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                operation: str) -> None:
    run = OPERATIONS[operation]
    reference, before = prepare(tmp_path / "reference" / "journal.d", operation)
    after = run(reference, list(before))
    reference.close()
    for step in range(1, 200):
        directory = tmp_path / f"step-{step}" / "journal.d"
        journal, _ = prepare(directory, operation)
        with crash_at(step, monkeypatch) as made:
            try:
                run(journal, list(before))
                completed = True
            except Crash:
                completed = False
        if completed:
            journal.close()
        else:
            journal.abandon()
        reopened = open_journal(directory)
        state = entries_of(reopened)
        assert state in (before, after), (operation, step, made, [index for _, index, _ in state])
        assert reopened.damage is None, (operation, step, made, reopened.damage)
        assert (reopened.getCurrentTerm(), reopened.getVotedForNodeId()) == (2, "10.0.0.1:1")
        # the journal goes on from there, and what it adds survives another restart
        following = (command_for(9999, 30), state[-1][1] + 1 if state else 9000, max([3] + [term for _, _, term in state]))
        reopened.add(*following)
        reopened.make_durable()
        reopened.abandon()
        again = open_journal(directory)
        assert entries_of(again) == [*state, following], (operation, step, made)
        again.close()
        shutil.rmtree(directory.parent)
        if completed:
            assert state == after
            assert step > 1, "the operation made no file operation at all"
            return
    raise AssertionError(f"{operation} did not complete within 200 steps")


@pytest.mark.parametrize("damaged", [False, True])
def test_a_crash_during_recovery_neither_loses_entries_nor_forgets_damage(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, damaged: bool) -> None:
    for step in range(1, 100):
        directory = tmp_path / f"step-{step}" / "journal.d"
        journal, added = build_journal(directory)
        segment = journal._segments[2]
        flipped_index = segment.first_index
        offset = segment.offsets[0] + RECORD_HEAD_BYTES + 3
        journal.add(command_for(34, 100), 34, 2)  # a torn tail: never made durable
        journal.abandon()
        path = directory / segment_name(flipped_index)
        if damaged:
            flip_bit(path, offset)
        last = segment_files(directory)[-1]
        last.write_bytes(last.read_bytes()[:-10])
        expected = added[:flipped_index - 1] if damaged else added
        with crash_at(step, monkeypatch):
            try:
                open_journal(directory).close()
                completed = True
            except Crash:
                completed = False
        reopened = open_journal(directory)
        assert entries_of(reopened) == expected, (step, damaged)
        assert (reopened.damage is not None) == damaged, (step, reopened.damage)
        reopened.close()
        if completed:
            return
    raise AssertionError("recovery did not complete within 100 steps")


# ------------------------------------------------------------------------------- pysyncobj's journal file


def legacy_journal(path: Path) -> tuple[list[LogEntry], int]:
    """A journal written by pysyncobj's own FileJournal: entries, a truncation, a compaction, a term."""
    rng = random.Random(3)
    stock = FileJournal(str(path))
    for index in range(1, 60):
        stock.add(rng.randbytes(rng.choice((1, 700, 5_000, 300_000))), index, 1 + index // 20)
    stock.deleteEntriesFrom(50)
    for index in range(51, 70):
        stock.add(rng.randbytes(rng.choice((3, 40_000))), index, 4)
    stock.deleteEntriesTo(10)
    stock.setRaftCommitIndex(61)
    stock.setCurrentTerm(4, "10.0.0.9:7000")
    stock.onOneSecondTimer()
    held = [stock[position] for position in range(len(stock))]
    stock._destroy()
    return held, 61


@pytest.mark.parametrize("legacy", ["empty", "header only", "torn header"])
def test_an_unreadable_pysyncobj_journal_is_imported_as_damage(tmp_path: Path, legacy: str) -> None:
    """pysyncobj never synced its journal or meta file: after a power cut either can be empty or torn. The
    import keeps what it can and reports damage (the member then waits to re-fetch), instead of failing the
    start for good."""
    old = tmp_path / "journal"
    if legacy == "header only":
        FileJournal(str(old))._destroy()
    else:
        old.write_bytes(b"" if legacy == "empty" else b"PYSYNC")
    (tmp_path / "journal.meta").write_bytes(b"")
    journal = create_journal(str(old))
    assert journal.damage is not None and len(journal) == 0
    journal.close()
    again = create_journal(str(old))
    assert again.damage is not None and not old.exists()  # imported once, the damage remembered
    again.close()


def test_pysyncobj_journal_file_is_imported_once(tmp_path: Path) -> None:
    path = tmp_path / "raft" / "journal"
    path.parent.mkdir()
    held, commit_index = legacy_journal(path)
    journal = create_journal(str(path))
    assert entries_of(journal) == held and held[0][1] == 11 and held[-1][1] == 69
    assert (journal.getCurrentTerm(), journal.getVotedForNodeId(), journal.getRaftCommitIndex()) == \
        (4, "10.0.0.9:7000", commit_index)
    assert journal.damage is None and not path.exists() and not Path(f"{path}.meta").exists()
    journal.add(b"new", 70, 4)
    journal.close()
    reopened = create_journal(str(path))
    assert entries_of(reopened) == [*held, (b"new", 70, 4)]
    reopened.close()


def test_a_crash_at_every_step_of_the_import_keeps_the_old_journal_or_the_new_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    original = tmp_path / "original"
    original.mkdir()
    held, _ = legacy_journal(original / "journal")
    for step in range(1, 400):
        raft = tmp_path / f"step-{step}"
        shutil.copytree(original, raft)
        with crash_at(step, monkeypatch):
            try:
                create_journal(str(raft / "journal")).close()
                completed = True
            except Crash:
                completed = False
        reaper.drain()
        journal = create_journal(str(raft / "journal"))
        assert entries_of(journal) == held and journal.getCurrentTerm() == 4, step
        assert journal.damage is None and not (raft / "journal").exists(), step
        journal.close()
        shutil.rmtree(raft)
        if completed:
            return
    raise AssertionError("the import did not complete within 400 steps")


# ------------------------------------------------------------------------------- durability and errors


def test_make_durable_runs_on_another_thread_while_entries_are_added(tmp_path: Path) -> None:
    journal = open_journal(tmp_path / "journal.d", segment_size_bytes=4096, cache_bytes=1 << 16,
                           cache_entries_max=64)
    stop = threading.Event()
    seen: list[tuple[int, int]] = []  # (durable index, last index written before it was read)

    def flusher() -> None:
        while not stop.is_set():
            written = journal.last_index
            journal.make_durable()
            seen.append((journal.durable_index, written))

    thread = threading.Thread(target=flusher)
    thread.start()
    added: list[LogEntry] = []
    try:
        for index in range(1, 5001):
            added += fill(journal, index, index, size=index % 300, durable_each=False)
            if index % 1000 == 0:
                journal.deleteEntriesTo(len(journal) - 100)  # compaction deletes segments the flusher syncs
                added = added[-100:]
    finally:
        stop.set()
        thread.join()
    journal.make_durable()
    durable = [durable for durable, _ in seen]
    assert durable == sorted(durable) and all(durable >= written for durable, written in seen)
    assert journal.durable_index == 5000 and journal.syncs > 10
    journal.abandon()  # killed right after: every entry was made durable
    reopened = open_journal(tmp_path / "journal.d")
    assert entries_of(reopened) == added and reopened.damage is None
    reopened.close()


def failing(error: int) -> Callable[..., Any]:
    def operation(*args: Any, **kwargs: Any) -> Any:
        raise OSError(error, os.strerror(error))
    return operation


@pytest.mark.usefixtures("stops")
@pytest.mark.parametrize("operation", ["make_durable", "setCurrentTerm", "write", "truncate"])
def test_a_failed_sync_or_write_stops_the_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  operation: str) -> None:
    journal = open_journal(tmp_path / "journal.d")
    fill(journal, 1, 5, durable_each=False)
    try:
        with pytest.raises(Stopped) as stopped:
            if operation == "make_durable":
                monkeypatch.setattr(os, "fdatasync", failing(errno.EIO))
                journal.make_durable()
            elif operation == "setCurrentTerm":
                monkeypatch.setattr(os, "fsync", failing(errno.EIO))
                journal.setCurrentTerm(2, "10.0.0.1:1")
            elif operation == "write":
                monkeypatch.setattr(os, "pwritev", failing(errno.EIO))
                journal.add(b"x", 6, 1)
            else:
                monkeypatch.setattr(os, "ftruncate", failing(errno.EIO))
                journal.deleteEntriesFrom(2)
        assert stopped.value.code == EXIT_SYNC_FAILED
    finally:
        monkeypatch.undo()
        journal.abandon()


def test_a_full_disk_on_append_raises_and_adds_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    journal = open_journal(tmp_path / "journal.d")
    added = fill(journal, 1, 5)
    real_pwritev = os.pwritev

    def half_then_full(fd: int, buffers: list[bytes], offset: int) -> int:
        real_pwritev(fd, [buffers[0]], offset)  # a torn record on the disk, then no space
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "pwritev", half_then_full)
    with pytest.raises(DiskFullError):
        journal.add(command_for(6, 100), 6, 1)
    monkeypatch.undo()
    assert entries_of(journal) == added and journal.last_index == 5
    added += fill(journal, 6, 7)  # space again: it goes on
    journal.abandon()
    reopened = open_journal(tmp_path / "journal.d")
    assert entries_of(reopened) == added and reopened.damage is None
    reopened.close()


# ------------------------------------------------------------------------------- real pysyncobj nodes

#: every method of pysyncobj's Journal interface SyncObj calls, as we implement them
INTERFACE = ("add", "clear", "deleteEntriesFrom", "deleteEntriesTo", "__getitem__", "__len__", "_destroy",
             "setRaftCommitIndex", "getRaftCommitIndex", "setCurrentTerm", "getCurrentTerm", "getVotedForNodeId",
             "onOneSecondTimer")


def test_pinned_pysyncobj_still_uses_the_journal_as_we_implement_it() -> None:
    """SyncObj builds its journal through the module-level createJournal (the lead patches that name), calls
    only methods we implement (each one of them), and its __getEntries is the one get_entries mirrors."""
    assert callable(pysyncobj.syncobj.createJournal)
    source = inspect.getsource(SyncObj)
    assert "self.__raftLog = createJournal(self.__conf.journalFile)" in source
    called = set(re.findall(r"self\.__raftLog\.(\w+)\(", source))
    assert called <= set(INTERFACE), called - set(INTERFACE)
    assert called == set(INTERFACE) - {"__getitem__", "__len__"}
    assert "self.__raftLog[" in source and "len(self.__raftLog)" in source
    get_entries = inspect.getsource(SyncObj._SyncObj__getEntries)
    for line in ("result = self.__raftLog[diff:]", "result = self.__raftLog[diff:diff + count]",
                 "if totalSize >= maxSizeBytes:", "return result[:i + 1]"):
        assert line in get_entries


def recording_journal_class(calls: CallCounter[str]) -> type[SegmentedJournal]:
    """SegmentedJournal counting the interface calls made from outside dledger.journal (pysyncobj's)."""
    def recorded(name: str) -> Callable[..., Any]:
        base = getattr(SegmentedJournal, name)

        def method(self: SegmentedJournal, *args: Any) -> Any:
            if sys._getframe(1).f_globals.get("__name__") != "dledger.journal":
                calls[name] += 1
            return base(self, *args)
        return method

    return type("RecordingJournal", (SegmentedJournal,), {name: recorded(name) for name in INTERFACE})


@pytest.fixture
def recorded_calls(monkeypatch: pytest.MonkeyPatch) -> CallCounter[str]:
    """pysyncobj builds our journal (as the member will have it), with every interface call counted."""
    calls: CallCounter[str] = CallCounter()
    journal_class = recording_journal_class(calls)

    def create(journal_file: str | None) -> Any:
        assert journal_file is not None
        return journal_class(Path(journal_file + ".d"), segment_size_bytes=4096, legacy_journal=Path(journal_file))

    monkeypatch.setattr(pysyncobj.syncobj, "createJournal", create)
    return calls


class Counter(SyncObj):  # type: ignore[misc]  # pysyncobj ships no type hints
    def __init__(self, address: str, partners: list[str], conf: SyncObjConf, **options: Any) -> None:
        super().__init__(address, partners, conf=conf, **options)
        self.value = 0

    @replicated  # type: ignore[untyped-decorator]
    def increment(self, amount: int) -> int:
        self.value += amount
        return int(self.value)


def counter_conf(directory: Path, auto_tick: bool) -> SyncObjConf:
    directory.mkdir(parents=True, exist_ok=True)
    return SyncObjConf(autoTick=auto_tick, journalFile=str(directory / "journal"),
                       fullDumpFile=str(directory / "dump"), logCompactionMinEntries=25, logCompactionMinTime=0.3,
                       raftMinTimeout=0.2, raftMaxTimeout=0.4, appendEntriesPeriod=0.01, connectionRetryTime=0.2)


def applied(node: Counter, total: int) -> Callable[[], bool]:
    return lambda: bool(node.value == total)


def test_a_single_syncobj_runs_and_restarts_on_the_journal(tmp_path: Path, recorded_calls: CallCounter[str]) -> None:
    (port,) = free_ports(1)
    address = f"127.0.0.1:{port}"

    def run_until(node: Counter, condition: Callable[[], bool]) -> None:
        deadline = time.monotonic() + 20
        while not condition():
            assert time.monotonic() < deadline, "the node did not get there"
            node.doTick(0.005)

    node = Counter(address, [], counter_conf(tmp_path / "node", auto_tick=False))
    run_until(node, node._isLeader)
    for total in range(20, 161, 20):
        for _ in range(20):
            node.increment(1)
        run_until(node, applied(node, total))
        time.sleep(0.05)  # let compaction's time threshold pass now and then
    run_until(node, lambda: node._SyncObj__raftLog.first_index > 1)  # compacted
    # no new compaction, and the one in flight finished: stock pysyncobj, stopped between writing a dump and
    # compacting the journal to it, clears the journal at its next start (our RaftNode does not: fix 10)
    node._SyncObj__conf.logCompactionMinEntries = node._SyncObj__conf.logCompactionMinTime = 1 << 30
    run_until(node, lambda: node._SyncObj__serializer._Serializer__pid == 0)
    node.destroy()  # without autoTick: closes the journal at once
    restarted = Counter(address, [], counter_conf(tmp_path / "node", auto_tick=False))
    run_until(restarted, lambda: restarted.value == 160 and restarted._isLeader())
    restarted.increment(5)
    run_until(restarted, lambda: restarted.value == 165)
    journal = restarted._SyncObj__raftLog
    assert isinstance(journal, SegmentedJournal) and journal.damage is None
    restarted.destroy()
    used = {"add", "__getitem__", "__len__", "_destroy", "setRaftCommitIndex", "getRaftCommitIndex",
            "setCurrentTerm", "getCurrentTerm", "getVotedForNodeId", "onOneSecondTimer", "deleteEntriesTo"}
    assert used <= set(recorded_calls), used - set(recorded_calls)


class SilentTransport(Transport):  # type: ignore[misc]  # pysyncobj ships no type hints
    """No network: messages are handed in by the test."""

    def send(self, node: Any, message: Any) -> bool:
        return True


def test_a_syncobj_follower_truncates_a_conflicting_tail_on_the_journal(tmp_path: Path,
                                                                         recorded_calls: CallCounter[str]) -> None:
    leader = "127.0.0.1:2"
    conf = counter_conf(tmp_path / "follower", auto_tick=False)
    follower = SyncObj("127.0.0.1:1", [leader, "127.0.0.1:3"], conf=conf, transportClass=SilentTransport)
    noop = b"\x01"

    def deliver(prev: tuple[int, int], sent: list[LogEntry], term: int) -> None:
        follower._SyncObj__onMessageReceived(TCPNode(leader), {
            "type": "append_entries", "term": term, "commit_index": 1, "prevLogIdx": prev[0],
            "prevLogTerm": prev[1], "entries": sent})

    deliver((1, 0), [(noop, index, 1) for index in range(2, 11)], term=1)
    deliver((5, 1), [(noop, index, 2) for index in range(6, 8)], term=2)  # a new leader's conflicting tail
    journal = follower._SyncObj__raftLog
    assert [(index, term) for _, index, term in journal[:]] == \
        [(1, 0), (2, 1), (3, 1), (4, 1), (5, 1), (6, 2), (7, 2)]
    follower.destroy()
    assert recorded_calls["deleteEntriesFrom"] == 1 and recorded_calls["setCurrentTerm"] == 2
    reopened = open_journal(tmp_path / "follower" / "journal.d")
    assert [(index, term) for _, index, term in reopened[:]] == [(1, 0), *[(i, 1) for i in range(2, 6)], (6, 2),
                                                                 (7, 2)]
    assert (reopened.getCurrentTerm(), reopened.damage) == (2, None)
    reopened.close()


@pytest.mark.slow
def test_three_syncobj_nodes_replicate_and_a_wiped_one_catches_up_by_snapshot(
        tmp_path: Path, recorded_calls: CallCounter[str]) -> None:
    addresses = [f"127.0.0.1:{port}" for port in free_ports(3)]

    def start(number: int) -> Counter:
        partners = [address for address in addresses if address != addresses[number]]
        conf = counter_conf(tmp_path / f"node{number}", auto_tick=True)
        # no elections from a busy machine's pauses: a leader change would drop proposals in flight
        conf.raftMinTimeout, conf.raftMaxTimeout = 1.5, 3.0
        return Counter(addresses[number], partners, conf)

    def wait(condition: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + 60
        while not condition():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            time.sleep(0.02)

    def increment_all(node: Counter, count: int, total: int) -> None:
        """Propose ``count`` increments at once (pysyncobj's sync calls wait ~0.1 s each) and wait for
        every node to apply them, each confirmed by its callback."""
        done: list[int] = []
        for _ in range(count):
            node.increment(1, callback=lambda result, error: done.append(error))
        wait(lambda: len(done) == count, f"{count} increments to commit")
        assert set(done) == {0}, done  # pysyncobj's FAIL_REASON.SUCCESS
        wait(lambda: all(node.value == total for node in nodes), f"every node to apply {total}")

    nodes = [start(number) for number in range(3)]
    try:
        wait(lambda: any(node._isLeader() for node in nodes), "a leader")
        leader = next(node for node in nodes if node._isLeader())
        for total in range(30, 151, 30):
            increment_all(leader, 30, total)
            time.sleep(0.35)  # compaction runs at most every logCompactionMinTime
        wiped = nodes.index(next(node for node in nodes if not node._isLeader()))
        nodes[wiped].destroy_synchronous()
        shutil.rmtree(tmp_path / f"node{wiped}")
        nodes.remove(nodes[wiped])
        for total in range(180, 211, 30):
            increment_all(leader, 30, total)
            time.sleep(0.35)
        nodes.append(start(wiped))  # an empty data directory: it gets the leader's snapshot (clear)
        increment_all(leader, 20, 230)
        for node in nodes:
            journal = node._SyncObj__raftLog
            assert isinstance(journal, SegmentedJournal) and journal.damage is None
    finally:
        for node in nodes:
            node.destroy_synchronous()
    assert {"clear", "deleteEntriesTo", "add", "setCurrentTerm"} <= set(recorded_calls)
