"""pysyncobj's meta file (term, vote, commit index) as the member writes it: pysyncobj's own format, the
replaced file freed on the reaper's thread, not on the Raft thread that stores it every second."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
from pysyncobj.journal import FileJournal, MetaStorer

from commitlog import reaper
from dledger.member import _MetaStorer


def test_meta_reads_back_through_pysyncobj_and_the_old_file_is_freed_off_the_storing_thread(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    closed_on: list[str] = []

    def release(fd: int) -> None:
        closed_on.append(threading.current_thread().name)
        os.close(fd)

    monkeypatch.setattr(reaper, "_release", release)
    path = tmp_path / "journal.meta"
    storer = _MetaStorer(str(path))
    storer.storeMeta({"currentTerm": 3, "votedForNodeId": "127.0.0.1:9001", "raftCommitIndex": 10})
    storer.storeMeta({"currentTerm": 4, "votedForNodeId": None, "raftCommitIndex": 12})
    reaper.drain()
    assert MetaStorer(str(path)).getMeta() == {"currentTerm": 4, "votedForNodeId": None, "raftCommitIndex": 12}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["journal.meta"]
    assert closed_on == ["file-reaper"]  # the first store replaced nothing; the second freed the first's file
    journal = FileJournal(str(tmp_path / "journal"))  # what a restarted member reads
    assert journal.getCurrentTerm() == 4 and journal.getRaftCommitIndex() == 12
