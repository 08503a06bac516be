"""BackgroundSnapshots: pysyncobj's log compaction with the store flush and the snapshot file off the Raft
thread, and a snapshot on disk only once the store data it stands for is."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from pysyncobj.config import SERIALIZER_STATE

from dledger.snapshot import BackgroundSnapshots, Snapshot, read_snapshot, replace_snapshot

DEADLINE_SECONDS = 30.0


def snapshot_at(index: int) -> Snapshot:
    return Snapshot((b"\x01last", index, 2), (b"\x01prev", index - 1, 2), 0, 100 * index, ("a:1", "b:2"), b"state")


class FakeBase:
    """pysyncobj's Serializer, as far as transfers go: records what it is handed."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.received: list[tuple[Any, int | None]] = []  # (data, index of our snapshot file then)
        self.cancelled: list[Any] = []

    def setTransmissionData(self, data: Any) -> bool:
        self.received.append((data, read_snapshot(self.path).index if self.path.exists() else None))
        return True

    def getTransmissionData(self, transmission_id: Any) -> Any:
        return (b"chunk", True, False)

    def cancelTransmisstion(self, transmission_id: Any) -> None:
        self.cancelled.append(transmission_id)

    def deserialize(self) -> Any:
        return (None, "loaded")


class Durability:
    """A store flush that blocks until released, and remembers what the snapshot file held when it ran."""

    def __init__(self, path: Path, fail: bool = False) -> None:
        self.path = path
        self.fail = fail
        self.started = threading.Event()
        self.release = threading.Event()
        self.file_seen: list[int | None] = []

    def __call__(self) -> None:
        self.file_seen.append(read_snapshot(self.path).index if self.path.exists() else None)
        self.started.set()
        assert self.release.wait(DEADLINE_SECONDS)
        if self.fail:
            raise OSError(28, "No space left on device")


def compactor(tmp_path: Path, fail: bool = False) -> tuple[BackgroundSnapshots, Durability, FakeBase, list[Any]]:
    path = tmp_path / "snapshot"
    durability = Durability(path, fail)
    base = FakeBase(path)
    captured: list[Any] = []

    def capture(data: Any) -> Snapshot:
        captured.append(data)
        return snapshot_at(data[0][1])

    return BackgroundSnapshots(base, path, capture, durability), durability, base, captured


def data_at(index: int) -> tuple[Any, ...]:
    return (None, (b"\x01last", index, 2), (b"\x01prev", index - 1, 2), frozenset())


def test_the_snapshot_is_written_only_after_the_store_is_durable_and_off_the_calling_thread(tmp_path: Path) -> None:
    snapshots, durability, _, captured = compactor(tmp_path)
    replace_snapshot(tmp_path / "snapshot", snapshot_at(5))
    snapshots.serialize(data_at(9), 9)  # returns while the flush is still blocked
    assert captured == [data_at(9)[1:]]  # captured on the calling (tick) thread
    assert durability.started.wait(DEADLINE_SECONDS)
    assert snapshots.checkSerializing() == (SERIALIZER_STATE.SERIALIZING, 9)
    snapshots.serialize(data_at(12), 12)  # pysyncobj never does this while serializing; it is ignored anyway
    assert len(captured) == 1
    assert read_snapshot(tmp_path / "snapshot").index == 5  # the old snapshot stays until the store is durable
    durability.release.set()
    snapshots.settle()
    assert durability.file_seen == [5]
    assert read_snapshot(tmp_path / "snapshot") == snapshot_at(9)
    assert not (tmp_path / "snapshot.tmp").exists()
    assert snapshots.checkSerializing() == (SERIALIZER_STATE.SUCCESS, 9)  # once: pysyncobj then compacts to 9
    assert snapshots.checkSerializing() == (SERIALIZER_STATE.NOT_SERIALIZING, None)


def test_a_failed_flush_keeps_the_old_snapshot_and_reports_failure_once(tmp_path: Path) -> None:
    snapshots, durability, _, _ = compactor(tmp_path, fail=True)
    replace_snapshot(tmp_path / "snapshot", snapshot_at(5))
    snapshots.serialize(data_at(9), 9)
    durability.release.set()
    snapshots.settle()
    assert read_snapshot(tmp_path / "snapshot").index == 5
    assert snapshots.checkSerializing() == (SERIALIZER_STATE.FAILED, 9)  # the log keeps its entries
    assert snapshots.checkSerializing() == (SERIALIZER_STATE.NOT_SERIALIZING, None)
    durability.fail = False
    snapshots.serialize(data_at(11), 11)  # the next compaction goes ahead
    snapshots.settle()
    assert snapshots.checkSerializing() == (SERIALIZER_STATE.SUCCESS, 11)
    assert read_snapshot(tmp_path / "snapshot").index == 11


def test_a_snapshot_arriving_from_the_leader_waits_for_a_compaction_and_cancels_its_log_deletion(
        tmp_path: Path) -> None:
    snapshots, durability, base, _ = compactor(tmp_path)
    snapshots.serialize(data_at(9), 9)
    assert durability.started.wait(DEADLINE_SECONDS)
    settling = threading.Event()
    settle = snapshots.settle

    def observed_settle(cancel: bool = False) -> None:
        settling.set()
        settle(cancel)

    snapshots.settle = observed_settle  # type: ignore[method-assign]
    def release_once_settling() -> None:
        assert settling.wait(DEADLINE_SECONDS)
        durability.release.set()

    releaser = threading.Thread(target=release_once_settling)
    releaser.start()
    assert snapshots.setTransmissionData((b"chunk", True, True))  # the flush is released once this waits
    releaser.join(DEADLINE_SECONDS)
    assert base.received == [((b"chunk", True, True), 9)]  # handed on only once the compaction was done
    # the compaction's file was renamed before the leader's could be; its log deletion is dropped
    assert snapshots.checkSerializing() == (SERIALIZER_STATE.NOT_SERIALIZING, None)


def test_transfers_and_loading_go_to_pysyncobjs_serializer(tmp_path: Path) -> None:
    snapshots, _, base, _ = compactor(tmp_path)
    assert snapshots.getTransmissionData("n1") == (b"chunk", True, False)
    snapshots.cancelTransmisstion("n1")
    assert base.cancelled == ["n1"]
    assert snapshots.deserialize() == (None, "loaded")
    assert snapshots.checkSerializing() == (SERIALIZER_STATE.NOT_SERIALIZING, None)
