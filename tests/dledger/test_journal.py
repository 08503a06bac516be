"""The member's Raft journal writes the records pysyncobj's own file journal writes."""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from pathlib import Path

import pytest
from pysyncobj.journal import FileJournal, ResizableFile

from commitlog import reaper
from dledger.member import _FileJournal


def fill(journal: FileJournal, rng: random.Random) -> None:
    for index in range(1, 60):
        journal.add(rng.randbytes(rng.choice((1, 700, 5_000, 300_000))), index, 1 + index // 20)
    journal.deleteEntriesFrom(50)  # a conflicting tail cut
    for index in range(50, 70):
        journal.add(rng.randbytes(rng.choice((3, 40_000))), index, 4)
    journal.deleteEntriesTo(30)  # compaction rewrites what stays


def test_records_and_reads_equal_pysyncobj_journal(tmp_path: Path) -> None:
    stock = FileJournal(str(tmp_path / "stock"))
    ours = FileJournal(str(tmp_path / "ours"))
    ours.__class__ = _FileJournal
    fill(stock, random.Random(5))
    fill(ours, random.Random(5))
    entries = [stock[position] for position in range(len(stock))]
    assert [ours[position] for position in range(len(ours))] == entries and len(entries) == 40
    stock._destroy()
    ours._destroy()
    written, expected = (tmp_path / "ours").read_bytes(), (tmp_path / "stock").read_bytes()
    # the same header and records; past the last record the files differ (their sizes grow at other points,
    # and pysyncobj's compaction leaves stale bytes behind where ours writes a new file)
    end = int.from_bytes(expected[36:40], "little")
    assert written[:end] == expected[:end] and int.from_bytes(written[36:40], "little") == end
    reopened = FileJournal(str(tmp_path / "ours"))  # read back by pysyncobj's own reader
    assert [reopened[position] for position in range(len(reopened))] == entries
    reopened._destroy()


class Crash(Exception):
    """A process killed at this point: nothing after it runs."""


def test_a_crash_anywhere_in_a_compaction_leaves_every_kept_entry_on_disk(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Compaction keeps the entries from position 30 on. A crash at the n-th file operation of it (for every
    n until one completes) leaves a journal that pysyncobj's reader reads with every kept entry: the old
    file whole or the new one whole. pysyncobj's own compaction cleared the file and wrote the entries back
    in place: a crash in between kept a prefix of them."""
    rng = random.Random(9)
    commands = [(rng.randbytes(rng.choice((5, 900, 20_000))), index, 1 + index // 25) for index in range(1, 60)]
    completed = False
    for crash_at in range(1, 200):
        path = tmp_path / f"journal-{crash_at}"
        journal = FileJournal(str(path))
        journal.__class__ = _FileJournal
        for entry in commands:
            journal.add(*entry)
        journal.make_durable()
        operations = 0

        def counted(original: Callable[..., object]) -> Callable[..., object]:
            def operation(*arguments: object) -> object:
                nonlocal operations
                operations += 1
                if operations == crash_at:  # noqa: B023  (each round's own crash point)
                    raise Crash()
                return original(*arguments)
            return operation

        with monkeypatch.context() as patch:
            patch.setattr(ResizableFile, "write", counted(ResizableFile.write))
            patch.setattr(reaper, "replace", counted(reaper.replace))
            patch.setattr(os, "fsync", counted(os.fsync))
            try:
                journal.deleteEntriesTo(29)
                completed = True
            except Crash:
                pass
        reopened = FileJournal(str(path))  # what the restarted member reads
        held = [reopened[position] for position in range(len(reopened))]
        assert held[-30:] == commands[29:], crash_at
        assert held in (commands, commands[29:]), crash_at
        reopened._destroy()
        if completed:
            break
    assert completed
