"""Disk faults on one member's data directory, without touching anyone else's.

A full disk: the member's directory is moved onto its own small ``tmpfs`` (``mount -t tmpfs -o size=``,
which needs root or a user namespace with a mount of its own; :func:`tmpfs_unavailable` says why not),
then :func:`fill` writes a filler file until the file system answers ENOSPC and :func:`unfill` deletes it.
Filling the file system the data directory lives on instead would fill every member's (and the host's).

The mount outlives the member's processes: :func:`release_mounts` copies each tmpfs's contents back to
the real disk and unmounts it (after the run, so the replicas can be compared and kept).

A corrupted follower: :func:`corrupt_record` flips one byte inside the body of a committed record of a
stopped member's commit-log segment (one the checkpoint vouches for) and :func:`byte_at` tells afterwards
whether the member put it right.

Everything here is blocking; the faults run it in a worker thread.
"""

from __future__ import annotations

import errno
import os
import random
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from commitlog.checkpoint import read_checkpoint
from commitlog.record_codec import RecordError, StoredMessage, decode_record
from protocol.properties import PROPERTY_UNIQ_KEY, decode_properties

FILLER_NAME: Final = "chaos-filler"
FILL_CHUNK_BYTES: Final = 1 << 20
#: a fill stops here even if the file system still takes more (a tmpfs larger than we meant)
FILL_MAX_BYTES: Final = 1 << 30
MOUNT_TIMEOUT_SECONDS: Final = 10.0


class DiskFaultError(RuntimeError):
    """A disk fault that cannot be set up here (no mount permission, a mount that failed)."""


def _run(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, capture_output=True, text=True, timeout=MOUNT_TIMEOUT_SECONDS, check=False)


def tmpfs_unavailable() -> str | None:
    """Why a size-limited tmpfs cannot be mounted here, or None when it can (tried on a scratch directory)."""
    if shutil.which("mount") is None or shutil.which("umount") is None:
        return "no mount/umount commands"
    with tempfile.TemporaryDirectory(prefix="raftmq-tmpfs-probe-") as scratch:
        mounted = _run("mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", scratch)
        if mounted.returncode != 0:
            return f"mount -t tmpfs failed: {mounted.stderr.strip() or mounted.returncode}"
        _run("umount", scratch)
    return None


def mounted_tmpfs(root: Path) -> list[Path]:
    """The tmpfs mount points at or under ``root`` (deepest first)."""
    root = root.resolve()
    found = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        fields = line.split()
        if len(fields) >= 3 and fields[2] == "tmpfs":
            point = Path(fields[1].replace("\\040", " "))
            if point == root or root in point.parents:
                found.append(point)
    return sorted(found, key=lambda point: len(point.parts), reverse=True)


def directory_bytes(directory: Path) -> int:
    """Bytes the files under ``directory`` occupy (allocated blocks: preallocated segments count fully)."""
    return sum(path.lstat().st_blocks * 512 for path in directory.rglob("*") if path.is_file())


def _move_contents(source: Path, target: Path) -> None:
    for child in list(source.iterdir()):
        if child.is_dir() and not child.is_symlink():
            shutil.copytree(child, target / child.name, symlinks=True)
            shutil.rmtree(child)
        else:
            shutil.copy2(child, target / child.name, follow_symlinks=False)
            child.unlink()


def mount_tmpfs(directory: Path, size_bytes: int) -> None:
    """Put ``directory`` (its owner stopped) on a tmpfs of ``size_bytes``, keeping its contents."""
    if directory.resolve() in mounted_tmpfs(directory):
        return
    size_bytes = -(-size_bytes // 4096) * 4096
    staging = Path(tempfile.mkdtemp(prefix=f".{directory.name}-staging-", dir=directory.parent))
    _move_contents(directory, staging)
    mounted = _run("mount", "-t", "tmpfs", "-o", f"size={size_bytes}", "tmpfs", str(directory))
    if mounted.returncode != 0:
        _move_contents(staging, directory)
        staging.rmdir()
        raise DiskFaultError(f"mount -t tmpfs on {directory} failed: {mounted.stderr.strip()}")
    _move_contents(staging, directory)
    staging.rmdir()


def ensure_free(directory: Path, free_wanted: int, grow_below: int | None = None) -> int | None:
    """Grow the tmpfs mounted at ``directory`` (``mount -o remount,size=``) until ``free_wanted`` bytes are
    free: its member keeps writing for as long as the run lasts, and a tmpfs sized once would run full for
    good in a long soak. With ``grow_below``, only once less than that is free. The new size, or None when
    it had the room already or is not a tmpfs."""
    if directory.resolve() not in mounted_tmpfs(directory):
        return None
    stats = os.statvfs(directory)
    free = stats.f_bavail * stats.f_frsize
    if free >= (free_wanted if grow_below is None else min(grow_below, free_wanted)):
        return None
    size = -(-(stats.f_blocks * stats.f_frsize + free_wanted - free) // 4096) * 4096
    grown = _run("mount", "-o", f"remount,size={size}", str(directory))
    if grown.returncode != 0:
        raise DiskFaultError(f"mount -o remount,size={size} on {directory} failed: {grown.stderr.strip()}")
    return size


def release_mounts(root: Path) -> list[Path]:
    """Unmount every tmpfs under ``root``, its contents copied back to the directory underneath; the
    mount points released. Call it once no process uses them."""
    released = []
    for point in mounted_tmpfs(root):
        staging = Path(tempfile.mkdtemp(prefix=f".{point.name}-staging-", dir=point.parent))
        (point / FILLER_NAME).unlink(missing_ok=True)
        _move_contents(point, staging)
        unmounted = _run("umount", str(point))
        if unmounted.returncode != 0:
            unmounted = _run("umount", "-l", str(point))
        if unmounted.returncode != 0:
            raise DiskFaultError(f"umount {point} failed: {unmounted.stderr.strip()}")
        _move_contents(staging, point)
        staging.rmdir()
        released.append(point)
    return released


def free_bytes(directory: Path) -> int:
    stats = os.statvfs(directory)
    return stats.f_bavail * stats.f_frsize


def fill(directory: Path) -> int:
    """Write a filler file in ``directory`` until the file system is full; the bytes written."""
    written = 0
    chunk = b"\0" * FILL_CHUNK_BYTES
    with open(directory / FILLER_NAME, "ab", buffering=0) as filler:
        while written < FILL_MAX_BYTES:
            size = min(len(chunk), max(4096, free_bytes(directory)))
            try:
                written += filler.write(chunk[:size])
            except OSError as exc:
                if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                    raise
                if size == 4096:
                    break
                chunk = chunk[:4096]  # the last few blocks, a page at a time
    return written


def unfill(directory: Path) -> None:
    (directory / FILLER_NAME).unlink(missing_ok=True)


# ------------------------------------------------------------------------------------ corruption


@dataclass(frozen=True, slots=True)
class Corruption:
    """One byte flipped inside a record's body in a commit-log segment."""

    segment: Path
    #: the byte's position in the segment file, and the record's commit-log offset
    file_offset: int
    record_offset: int
    uniq_key: str
    original: int
    flipped: int

    def describe(self) -> str:
        return (f"{self.segment.name} byte {self.file_offset} (body of the record at commit-log offset "
                f"{self.record_offset}, UNIQ_KEY {self.uniq_key}): {self.original:#04x} -> {self.flipped:#04x}")


def corrupt_record(store_dir: Path, rng: random.Random) -> Corruption | None:
    """Flip one byte in the body of a record the checkpoint vouches for (so recovery does not re-validate it
    as part of the tail), in the first half of the durable commit log; None when there is no such record.
    The store must not be running."""
    checkpoint = read_checkpoint(store_dir / "checkpoint")
    if checkpoint is None:
        return None
    segments = sorted((store_dir / "commitlog").glob("[0-9]" * 20))
    durable_end = checkpoint.commit_log_end
    candidates: list[tuple[Path, int, StoredMessage]] = []
    for segment in segments:
        start = int(segment.name)
        if start >= durable_end:
            break
        data = segment.read_bytes()
        position = 0
        while start + position < durable_end // 2 + 1 and position < len(data):
            try:
                record = decode_record(data, position)
            except RecordError:
                break  # the segment's filler or its end
            if record.body:
                candidates.append((segment, position, record))
            position += record.total_size
    if not candidates:
        return None
    segment, position, record = rng.choice(candidates)
    topic_bytes = len(record.topic.encode())
    body_start = position + record.total_size - 2 - len(record.properties) - topic_bytes - 1 - len(record.body)
    target = body_start + rng.randrange(len(record.body))
    with open(segment, "r+b") as file:
        file.seek(target)
        original = file.read(1)[0]
        flipped = original ^ 0xFF
        file.seek(target)
        file.write(bytes((flipped,)))
        file.flush()
        os.fsync(file.fileno())
    uniq_key = decode_properties(record.properties).get(PROPERTY_UNIQ_KEY, "")
    return Corruption(segment, target, record.physical_offset, uniq_key, original, flipped)


def byte_at(path: Path, offset: int) -> int | None:
    """The byte at ``offset`` of ``path``; None when the file is gone or shorter."""
    try:
        with open(path, "rb") as file:
            file.seek(offset)
            found = file.read(1)
    except FileNotFoundError:
        return None
    return found[0] if found else None
