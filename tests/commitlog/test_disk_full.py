"""A store on a real, tiny file system (tmpfs): filling it gives DiskFullError, nothing half-written,
everything acknowledged intact, and appends resume once retention frees space."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from commitlog import reaper
from commitlog.errors import DiskFullError
from commitlog.store import MessageStore
from tests.commitlog.helpers import message, small_config


@pytest.fixture
def tiny_filesystem(tmp_path: Path) -> Iterator[Path]:
    mount_point = tmp_path / "tiny"
    mount_point.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a size-limited tmpfs needs root")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mount_point)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount tmpfs here: {mounted.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def test_full_disk_is_a_clean_error_and_recoverable(tiny_filesystem: Path) -> None:
    config = small_config(tiny_filesystem / "s", segment_size_bytes=256 * 1024, index_entry_capacity=4096,
                          index_slot_count=256, consume_queue_units_per_file=1024)
    store = MessageStore(config)
    acknowledged: list[int] = []
    raft_index = 0
    with pytest.raises(DiskFullError):
        for raft_index in range(1, 1000):  # 3 MiB cannot hold 1000 x 8 KiB
            outcome = store.append(raft_index, [message(raft_index, body=os.urandom(8000))])
            acknowledged.extend(r.physical_offset for r in outcome.results)
    failed_index = raft_index
    assert store.applied_raft_index == failed_index - 1
    end = store.max_physical_offset
    # the failed command left no trace and can be retried: still full, still clean
    with pytest.raises(DiskFullError):
        store.append(failed_index, [message(failed_index, body=os.urandom(8000))])
    assert store.max_physical_offset == end
    assert not any(p.name.endswith(".allocating") for p in tiny_filesystem.rglob("*"))
    for offset in acknowledged:
        assert store.read_message(offset).body
    # retention frees whole segments; the same command now applies
    store.delete_below(failed_index, end - 256 * 1024)
    reaper.drain()  # deleted segments give their blocks back on the reaper's thread
    outcome = store.append(failed_index + 1, [message(failed_index, body=os.urandom(8000))])
    assert outcome.applied
    store.close()
    reopened = MessageStore(config)
    assert reopened.applied_raft_index == failed_index + 1
    reopened.close()


def test_a_segment_whose_background_allocation_failed_on_a_full_disk_is_made_once_space_is_back(
        tiny_filesystem: Path) -> None:
    """The next segment is allocated in the background; when that attempt found the disk full, the append
    that needs the segment after retention freed space makes it then, instead of repeating the old error."""
    config = small_config(tiny_filesystem / "s", segment_size_bytes=256 * 1024, index_entry_capacity=4096,
                          index_slot_count=256, consume_queue_units_per_file=1024)
    store = MessageStore(config)
    raft_index = 0
    with pytest.raises(DiskFullError):
        for raft_index in range(1, 1000):
            store.append(raft_index, [message(raft_index, body=os.urandom(8000))])
    end = store.max_physical_offset
    # an append into the current segment starts the next one's allocation in the background: on a full disk
    # it fails; wait until it has
    small = store.append(raft_index, [message(raft_index, body=b"x")])
    assert small.applied
    for pending in list(store.commit_log._allocating.values()):
        assert isinstance(pending.exception(timeout=30), DiskFullError)
    store.delete_below(raft_index + 1, end - 3 * 256 * 1024)  # room for the next segment and its indexes
    reaper.drain()  # deleted segments give their blocks back on the reaper's thread
    outcome = store.append(raft_index + 2, [message(raft_index + 2, body=os.urandom(8000))])  # the next segment
    assert outcome.applied and outcome.results[0].physical_offset >= end
    store.close()
