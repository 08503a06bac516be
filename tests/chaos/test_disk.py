"""Disk faults: a member's directory moved onto its own tmpfs, filled and freed, and given back; a byte
flipped inside a committed record's body."""

from __future__ import annotations

import asyncio
import errno
import random
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest

from chaos import disk
from chaos import faults as faults_module
from chaos.cluster import ChaosCluster
from chaos.faults import Faults
from chaos.history import NoteEvent
from chaos.monitor import LeaderMonitor
from chaos.workload import Recorder
from commitlog.record_codec import RecordError, decode_record
from commitlog.store import MessageStore
from tests.commitlog.helpers import message, small_config

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


@needs_tmpfs
def test_a_tmpfs_its_member_filled_grows_its_headroom_back(tmp_path: Path) -> None:
    member = tmp_path / "n1"
    member.mkdir()
    assert disk.ensure_free(member, 1 << 20) is None  # not on a tmpfs: nothing to grow
    try:
        disk.mount_tmpfs(member, 1 << 20)
        assert disk.ensure_free(member, 512 << 10) is None  # room enough
        (member / "data").write_bytes(b"x" * (900 << 10))  # what the member wrote since
        assert disk.free_bytes(member) < 200 << 10
        assert disk.ensure_free(member, 512 << 10, grow_below=100 << 10) is None  # not yet below that
        size = disk.ensure_free(member, 512 << 10, grow_below=300 << 10)
        assert size is not None and size % 4096 == 0 and size >= (1 << 20) + (300 << 10)
        assert disk.free_bytes(member) >= 512 << 10
        assert (member / "data").read_bytes() == b"x" * (900 << 10)  # a remount keeps the contents
        assert disk.ensure_free(member, 512 << 10) is None
    finally:
        disk.release_mounts(tmp_path)
    assert (member / "data").stat().st_size == 900 << 10


def test_filling_stops_at_the_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(disk, "FILL_MAX_BYTES", 3 << 20)
    assert disk.fill(tmp_path) == 3 << 20
    disk.unfill(tmp_path)
    assert not (tmp_path / disk.FILLER_NAME).exists()


def test_a_flipped_byte_lands_in_a_committed_record_body(tmp_path: Path) -> None:
    store = MessageStore(small_config(tmp_path / "store"), background_flush=False)
    for number in range(1, 201):
        store.append(number, [message(number)])
    store.flush()
    durable_end = store.max_physical_offset
    store.close()
    corruption = disk.corrupt_record(tmp_path / "store", random.Random(3))
    assert corruption is not None
    assert corruption.record_offset < durable_end // 2 + 1
    assert disk.byte_at(corruption.segment, corruption.file_offset) == corruption.flipped == corruption.original ^ 0xFF
    data = corruption.segment.read_bytes()
    start = corruption.record_offset - int(corruption.segment.name)
    with pytest.raises(RecordError, match="CRC"):
        decode_record(data, start)
    record = decode_record(data, start, check_crc=False)  # the head, topic and properties are intact
    assert record.physical_offset == corruption.record_offset
    assert corruption.uniq_key.startswith("C0A8000A9CB3")
    assert disk.byte_at(tmp_path / "missing", 0) is None


def test_nothing_to_corrupt_without_a_checkpoint(tmp_path: Path) -> None:
    (tmp_path / "store" / "commitlog").mkdir(parents=True)
    assert disk.corrupt_record(tmp_path / "store", random.Random(1)) is None


def test_the_report_names_each_corruption_outcome() -> None:
    from chaos.history import FaultEvent, History
    from chaos.runner import corruption_outcomes

    history = History.of([FaultEvent("corrupt", "n2", 1.0, 5.0, "unnoticed: 00000000000000000000 byte 9: 0x01 -> 0xfe"),
                          FaultEvent("kill", "n1", 6.0, 8.0, "SIGKILL"),
                          FaultEvent("corrupt", "n1", 9.0, 12.0, "repaired: 00000000000000000000 byte 5")])
    assert corruption_outcomes(history) == [
        {"node": "n2", "outcome": "unnoticed", "corruption": "00000000000000000000 byte 9: 0x01 -> 0xfe"},
        {"node": "n1", "outcome": "repaired", "corruption": "00000000000000000000 byte 5"},
    ]


@needs_tmpfs
def test_the_headroom_keeper_grows_a_members_tmpfs_unless_it_is_being_filled(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Between disk-full faults a member keeps writing; its tmpfs gets its headroom back every few seconds,
    except while the disk-full fault fills it on purpose."""
    monkeypatch.setattr(faults_module, "TMPFS_HEADROOM_BYTES", 512 << 10)
    monkeypatch.setattr(faults_module, "TMPFS_CHECK_SECONDS", 0.01)
    member = tmp_path / "n1"
    member.mkdir()
    (member / "node.toml").write_text("")
    node = SimpleNamespace(config=str(member / "node.toml"))
    cluster = SimpleNamespace(node_ids=["n1"], local=SimpleNamespace(info=SimpleNamespace(node=lambda _: node)))
    events: list[object] = []
    recorder = SimpleNamespace(now=lambda: 0.0, record=events.append)
    faults = Faults(cast(ChaosCluster, cluster), cast(LeaderMonitor, None), cast(Recorder, recorder))
    try:
        disk.mount_tmpfs(member, 1 << 20)
        (member / "data").write_bytes(b"x" * (900 << 10))  # what the member wrote since it was moved
        faults.filling.add("n1")
        asyncio.run(faults.keep_headroom_once())
        assert disk.free_bytes(member) < 200 << 10 and events == []  # filled on purpose: left full
        faults.filling.clear()
        asyncio.run(faults.keep_headroom_once())
        assert disk.free_bytes(member) >= 512 << 10
        assert [event.what for event in events if isinstance(event, NoteEvent)] == ["tmpfs"]

        async def keeper_at_work() -> None:
            faults.start()
            try:
                (member / "more").write_bytes(b"y" * disk.free_bytes(member))
                deadline = asyncio.get_running_loop().time() + 30
                while disk.free_bytes(member) < 512 << 10:
                    assert asyncio.get_running_loop().time() < deadline, "the keeper never grew the tmpfs"
                    await asyncio.sleep(0.01)  # polling the condition the keeper brings about
            finally:
                await faults.stop()

        asyncio.run(keeper_at_work())
        assert (member / "data").read_bytes() == b"x" * (900 << 10)
    finally:
        disk.release_mounts(tmp_path)
