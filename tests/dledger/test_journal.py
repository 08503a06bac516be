"""The member's Raft journal writes the records pysyncobj's own file journal writes."""

from __future__ import annotations

import random
from pathlib import Path

from pysyncobj.journal import FileJournal

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
    common = min(len(written), len(expected))  # the files grow at other points: only their sizes differ
    assert written[:common] == expected[:common]
    assert not written[common:].strip(b"\x00") and not expected[common:].strip(b"\x00")
    reopened = FileJournal(str(tmp_path / "ours"))  # read back by pysyncobj's own reader
    assert [reopened[position] for position in range(len(reopened))] == entries
    reopened._destroy()
