"""Disk faults: a member's directory moved onto its own tmpfs, filled and freed, and given back."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from chaos import disk

needs_tmpfs = pytest.mark.skipif(disk.tmpfs_unavailable() is not None,
                                 reason=f"no tmpfs mounts here: {disk.tmpfs_unavailable()}")


@needs_tmpfs
def test_a_directory_moves_onto_a_tmpfs_fills_frees_and_comes_back(tmp_path: Path) -> None:
    member = tmp_path / "n1"
    (member / "store").mkdir(parents=True)
    (member / "node.toml").write_text("[node]\n")
    (member / "store" / "segment").write_bytes(b"x" * 10_000)
    try:
        disk.mount_tmpfs(member, 1 << 20)
        assert disk.mounted_tmpfs(tmp_path) == [member.resolve()]
        disk.mount_tmpfs(member, 1 << 20)  # once only
        assert len(disk.mounted_tmpfs(tmp_path)) == 1
        assert (member / "store" / "segment").read_bytes() == b"x" * 10_000
        filled = disk.fill(member)
        assert filled > 900_000 and disk.free_bytes(member) < 4096
        with pytest.raises(OSError) as raised, open(member / "more", "wb", buffering=0) as more:
            more.write(b"y" * 8192)
        assert raised.value.errno == errno.ENOSPC
        (member / "more").unlink()
        disk.unfill(member)
        assert disk.free_bytes(member) > 900_000
        disk.fill(member)  # left full: release drops the filler
    finally:
        released = disk.release_mounts(tmp_path)
    assert released == [member.resolve()] and disk.mounted_tmpfs(tmp_path) == []
    assert sorted(path.name for path in member.iterdir()) == ["node.toml", "store"]
    assert (member / "store" / "segment").read_bytes() == b"x" * 10_000


def test_filling_stops_at_the_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(disk, "FILL_MAX_BYTES", 3 << 20)
    assert disk.fill(tmp_path) == 3 << 20
    disk.unfill(tmp_path)
    assert not (tmp_path / disk.FILLER_NAME).exists()
