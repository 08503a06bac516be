"""commitlog.reaper: the name goes at once; the file's last reference is dropped on the reaper's thread."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from commitlog import reaper
from commitlog.mapped_file import MappedFile, atomic_write


@pytest.fixture
def closes(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[str, int]]]:
    """Every descriptor the reaper closes: (the closing thread's name, the file's link count then)."""
    seen: list[tuple[str, int]] = []
    def release(fd: int) -> None:
        seen.append((threading.current_thread().name, os.fstat(fd).st_nlink))
        os.close(fd)

    monkeypatch.setattr(reaper, "_release", release)
    yield seen
    reaper.drain()


def test_unlink_removes_the_name_at_once_and_frees_the_file_on_the_reaper_thread(
        tmp_path: Path, closes: list[tuple[str, int]]) -> None:
    path = tmp_path / "segment"
    path.write_bytes(b"x" * 8192)
    reaper.unlink(path)
    assert not path.exists()
    reaper.drain()
    assert closes == [("file-reaper", 0)]  # the deleted inode's last descriptor, closed there


def test_unlink_of_a_missing_file(tmp_path: Path, closes: list[tuple[str, int]]) -> None:
    reaper.unlink(tmp_path / "absent")  # missing_ok by default, as the store's deletes need
    with pytest.raises(FileNotFoundError):
        reaper.unlink(tmp_path / "absent", missing_ok=False)
    reaper.drain()
    assert closes == []


def test_replace_swaps_the_content_at_once_and_frees_the_old_file_on_the_reaper_thread(
        tmp_path: Path, closes: list[tuple[str, int]]) -> None:
    target = tmp_path / "meta"
    target.write_bytes(b"old")
    source = tmp_path / "meta.tmp"
    source.write_bytes(b"new")
    reaper.replace(source, target)
    assert target.read_bytes() == b"new" and not source.exists()
    reaper.drain()
    assert closes == [("file-reaper", 0)]


def test_replace_onto_a_new_name_hands_nothing_over(tmp_path: Path, closes: list[tuple[str, int]]) -> None:
    source = tmp_path / "meta.tmp"
    source.write_bytes(b"new")
    reaper.replace(source, tmp_path / "meta")
    reaper.drain()
    assert (tmp_path / "meta").read_bytes() == b"new" and closes == []


def test_a_failed_replace_leaves_both_files_and_no_descriptor(tmp_path: Path, closes: list[tuple[str, int]]) -> None:
    target = tmp_path / "meta"
    target.write_bytes(b"old")
    with pytest.raises(FileNotFoundError):
        reaper.replace(tmp_path / "no-such-temp", target)
    assert target.read_bytes() == b"old"
    reaper.drain()
    assert closes == [("MainThread", 1)]  # the descriptor it had opened, closed again by the caller


def test_past_the_limit_the_caller_frees_its_own(tmp_path: Path, closes: list[tuple[str, int]],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reaper, "PENDING_MAX", 0)
    path = tmp_path / "segment"
    path.write_bytes(b"x")
    reaper.unlink(path)
    assert not path.exists() and closes == [("MainThread", 0)]


def test_store_files_go_through_it(tmp_path: Path, closes: list[tuple[str, int]]) -> None:
    """A deleted mapped file (retention, truncation) and a replaced checkpoint-style file."""
    mapped = MappedFile(tmp_path / "00000000000000000000", 1 << 16, create=True)
    mapped.pwrite(0, b"record")
    mapped.delete()
    atomic_write(tmp_path / "checkpoint", b"one")
    atomic_write(tmp_path / "checkpoint", b"two")
    reaper.drain()
    assert sorted(path.name for path in tmp_path.iterdir()) == ["checkpoint"]
    assert (tmp_path / "checkpoint").read_bytes() == b"two"
    assert closes == [("file-reaper", 0), ("file-reaper", 0)]
