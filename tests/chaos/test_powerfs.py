"""powerfs: the page cache model on its own (no mount), then real FUSE mounts cut with processes using them.

What a power cut must leave on the backing directory: what was fsynced (or msynced, or fsynced through a
directory) and nothing else, whatever the kernel wrote back to the daemon on the way down. Every mount
a test makes is released at its end, on failure too (the ``mounts`` fixture checks none is left).

Where FUSE cannot be used: a missing package (fusermount3, libfuse3, mfusepy) fails every mount test and
names it (``make test`` installs them, so a missing one is a broken setup); a machine that has them but
cannot mount (no /dev/fuse, no permission) skips them with the reason, as the tmpfs tests do.
"""

from __future__ import annotations

import mmap
import os
import random
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chaos import powerfs
from chaos.powerfs import PAGE_SIZE, PowerFS, PowerLossMount, cut_power
from tests.support.waiting import wait_for

# --------------------------------------------------------------------------- the model, without a mount


def model_fs(tmp_path: Path) -> tuple[PowerFS, Path]:
    fs = PowerFS(tmp_path / "disk", tmp_path / "trash")
    fs.prepare()
    return fs, tmp_path / "disk"


operations = st.lists(st.one_of(
    st.tuples(st.just("write"), st.integers(0, 5 * PAGE_SIZE), st.binary(min_size=1, max_size=2 * PAGE_SIZE + 7)),
    st.tuples(st.just("truncate"), st.integers(0, 6 * PAGE_SIZE), st.just(b"")),
    st.tuples(st.just("fallocate"), st.integers(0, 7 * PAGE_SIZE), st.just(b"")),
    st.tuples(st.just("fsync"), st.just(0), st.just(b"")),
    st.tuples(st.just("commit"), st.just(0), st.just(b"")),
), max_size=25)


@settings(max_examples=150, deadline=None)
@given(operations)
def test_the_page_cache_reads_what_was_written_and_the_disk_holds_what_was_synced(
        tmp_path_factory: pytest.TempPathFactory, steps: list[tuple[str, int, bytes]]) -> None:
    """Against two bytearrays: what a reader sees (every write, truncate and extension) and what the disk
    holds (the reader's view as of the last fsync, resized by the truncates and fallocates a later
    directory fsync committed). A power cut leaves exactly the second."""
    fs, disk = model_fs(tmp_path_factory.mktemp("model"))
    initial = random.Random(len(steps)).randbytes(3 * PAGE_SIZE + 11)
    (disk / "f").write_bytes(initial)
    seen, durable = bytearray(initial), bytes(initial)
    sizes: list[int] = []  # explicit size changes since the last fsync, in order
    handle = fs.open("/f", os.O_RDWR)
    for serial, (kind, number, data) in enumerate(steps):
        if kind == "write":
            fs.write("/f", data, number, handle)
            if len(seen) < number:
                seen.extend(bytes(number - len(seen)))
            seen[number:number + len(data)] = data
        elif kind == "truncate":
            fs.truncate("/f", number)
            del seen[number:]
            seen.extend(bytes(number - len(seen)))
            sizes.append(number)
        elif kind == "fallocate":
            fs.fallocate("/f", 0, 0, number, handle)
            if number > len(seen):
                seen.extend(bytes(number - len(seen)))
                sizes.append(number)
        elif kind == "commit":  # a namespace change after them, made durable: they are too
            fs.release(f"/x{serial}", fs.create(f"/x{serial}", 0o644, os.O_WRONLY))
            fs.fsyncdir("/", 0, 0)
            for size in sizes:
                durable = durable[:size] + bytes(max(0, size - len(durable)))
            sizes.clear()
        else:
            fs.fsync("/f", 0, handle)
            durable = bytes(seen)
            sizes.clear()
        assert fs.getattr("/f")["st_size"] == len(seen)
        assert fs.read("/f", len(seen) + 100, 0, handle) == bytes(seen)
        assert fs.read("/f", 5000, 4093, handle) == bytes(seen[4093:9093])
    fs.release("/f", handle)
    fs.power_off()
    assert (disk / "f").read_bytes() == durable


def test_the_model_takes_back_namespace_changes_newer_than_the_last_directory_fsync(tmp_path: Path) -> None:
    fs, disk = model_fs(tmp_path)
    (disk / "kept").write_bytes(b"old")
    (disk / "doomed").write_bytes(b"doomed")
    fs.mkdir("/d", 0o755)
    handle = fs.create("/d/new", 0o644, os.O_WRONLY)
    fs.write("/d/new", b"new", 0, handle)
    fs.fsync("/d/new", 0, handle)
    fs.release("/d/new", handle)
    fs.fsyncdir("/", 0, 0)  # mkdir d durable; d/new was created after it: not
    fs.rename("/d/new", "/kept")  # over the old file
    fs.unlink("/doomed")
    assert sorted(os.listdir(disk)) == ["d", "kept"]
    assert (disk / "kept").read_bytes() == b"new"
    report = fs.power_off()
    assert report["undone_changes"] == 3 and report["undo_failures"] == 0
    assert sorted(os.listdir(disk)) == ["d", "doomed", "kept"]
    assert os.listdir(disk / "d") == []
    assert (disk / "kept").read_bytes() == b"old" and (disk / "doomed").read_bytes() == b"doomed"
    assert os.listdir(tmp_path / "trash") == []
    with pytest.raises(OSError, match="powered off"):
        fs.getattr("/kept")


def test_a_directory_fsync_commits_its_latest_change_and_everything_before_it(tmp_path: Path) -> None:
    fs, disk = model_fs(tmp_path)
    fs.mkdir("/a", 0o755)
    fs.mkdir("/b", 0o755)
    fs.release("/a/x", fs.create("/a/x", 0o644, os.O_WRONLY))
    fs.release("/b/y", fs.create("/b/y", 0o644, os.O_WRONLY))
    fs.release("/a/z", fs.create("/a/z", 0o644, os.O_WRONLY))
    fs.unlink("/a/x")
    fs.fsyncdir("/b", 0, 0)  # commits through b/y (and a/x's creation before it), not a/z nor the unlink
    assert fs.status()["pending_changes"] == 2
    fs.power_off()
    assert sorted(os.listdir(disk)) == ["a", "b"]
    assert os.listdir(disk / "a") == ["x"] and os.listdir(disk / "b") == ["y"]


def test_a_preallocated_file_renamed_into_place_keeps_its_size_once_the_name_is_durable(tmp_path: Path) -> None:
    """commitlog.mapped_file's pattern: create a temporary name, posix_fallocate, rename into place, no
    fsync of the file. A journaling file system commits the size before the rename: never the name alone."""
    fs, disk = model_fs(tmp_path)
    handle = fs.create("/segment.allocating", 0o644, os.O_RDWR)
    fs.fallocate("/segment.allocating", 0, 0, 1 << 20, handle)
    fs.write("/segment.allocating", b"unsynced", 0, handle)
    fs.rename("/segment.allocating", "/segment")
    fs.release("/segment", handle)
    fs.fsyncdir("/", 0, 0)
    fs.power_off()
    assert os.listdir(disk) == ["segment"]
    assert (disk / "segment").read_bytes() == bytes(1 << 20)


def test_in_linux_mode_a_file_fsync_makes_its_own_name_durable(tmp_path: Path) -> None:
    fs = PowerFS(tmp_path / "disk", tmp_path / "trash", namespace="linux")
    fs.prepare()
    handle = fs.create("/tmp", 0o644, os.O_WRONLY)
    fs.write("/tmp", b"data", 0, handle)
    fs.rename("/tmp", "/final")
    fs.fsync("/final", 0, handle)
    fs.release("/final", handle)
    fs.release("/other", fs.create("/other", 0o644, os.O_WRONLY))
    fs.power_off()
    assert os.listdir(tmp_path / "disk") == ["final"]
    assert (tmp_path / "disk" / "final").read_bytes() == b"data"


def test_a_clean_shutdown_writes_everything(tmp_path: Path) -> None:
    fs, disk = model_fs(tmp_path)
    handle = fs.create("/f", 0o644, os.O_WRONLY)
    fs.write("/f", b"unsynced", 0, handle)
    fs.release("/f", handle)
    fs.destroy("/")
    assert (disk / "f").read_bytes() == b"unsynced"
    assert not (tmp_path / "trash").exists()


def test_write_through_files_reach_the_disk_at_once(tmp_path: Path) -> None:
    fs = PowerFS(tmp_path / "disk", tmp_path / "trash", write_through=["broker.log"])
    fs.prepare()
    (tmp_path / "disk" / "broker.log").write_bytes(b"")
    handle = fs.open("/broker.log", os.O_WRONLY | os.O_APPEND)
    fs.write("/broker.log", b"last words\n", 0, handle)
    fs.power_off()
    assert (tmp_path / "disk" / "broker.log").read_bytes() == b"last words\n"


# ------------------------------------------------------------------------------------------ real mounts


@pytest.fixture(scope="session")
def fuse_ready() -> None:
    missing = powerfs.fuse_missing_packages()
    if missing:
        pytest.fail(f"powerfs needs these packages, missing here: {', '.join(missing)} "
                    "(`make test` installs them through scripts/system-packages.sh)")
    reason = powerfs.powerfs_unavailable()
    if reason is not None:
        pytest.skip(f"no FUSE mounts here: {reason}")


@pytest.fixture
def mounts(fuse_ready: None, tmp_path: Path) -> Iterator[list[PowerLossMount]]:
    """The mounts a test makes (append them); each is stopped afterwards, and none may be left."""
    made: list[PowerLossMount] = []
    try:
        yield made
    finally:
        for mount in made:
            mount.stop()
        assert powerfs.mounted_powerfs(tmp_path) == []


def mounted(mounts: list[PowerLossMount], tmp_path: Path, name: str = "m") -> PowerLossMount:
    mount = PowerLossMount(tmp_path / f"{name}-disk", tmp_path / name)
    mounts.append(mount)
    return mount.start()


def fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def durable_file(mount: PowerLossMount, name: str, data: bytes) -> Path:
    """A file written, fsynced, and its name made durable (the mount's root fsynced)."""
    path = mount.mountpoint / name
    with open(path, "wb") as file:
        file.write(data)
        file.flush()
        os.fsync(file.fileno())
    fsync_path(mount.mountpoint)
    return path


def test_unsynced_writes_are_lost_and_fsynced_ones_survive_a_cut(mounts: list[PowerLossMount],
                                                                  tmp_path: Path) -> None:
    mount = mounted(mounts, tmp_path)
    synced = durable_file(mount, "synced", b"a" * 10_000)
    unsynced = durable_file(mount, "unsynced", b"old")
    with open(unsynced, "r+b") as file:
        file.write(b"NEW and longer")
    assert unsynced.read_bytes() == b"NEW and longer"  # the page cache shows it
    assert (mount.backing / "unsynced").read_bytes() == b"old"  # the disk does not
    with open(synced, "ab") as file:
        file.write(b"b" * 5000)
        file.flush()
        os.fdatasync(file.fileno())
    report = mount.cut_power()
    assert not mount.mounted and report["dropped_files"] == 1
    assert (mount.backing / "synced").read_bytes() == b"a" * 10_000 + b"b" * 5000
    assert (mount.backing / "unsynced").read_bytes() == b"old"
    mount.start()  # the machine boots: the mount shows the disk
    assert unsynced.read_bytes() == b"old"


def test_a_write_after_an_fsync_is_lost_and_the_synced_part_stays(mounts: list[PowerLossMount],
                                                                   tmp_path: Path) -> None:
    mount = mounted(mounts, tmp_path)
    path = durable_file(mount, "f", b"")
    with open(path, "r+b") as file:
        file.write(b"x" * 6000)
        file.flush()
        os.fsync(file.fileno())
        file.seek(3000)
        file.write(b"y" * 6000)  # overwrites part of the synced range and extends the file
        file.flush()
        assert path.read_bytes() == b"x" * 3000 + b"y" * 6000
    mount.cut_power()
    assert (mount.backing / "f").read_bytes() == b"x" * 6000


def test_truncating_and_extending_are_volatile_until_fsynced(mounts: list[PowerLossMount], tmp_path: Path) -> None:
    mount = mounted(mounts, tmp_path)
    shrunk = durable_file(mount, "shrunk", bytes(range(256)) * 40)
    grown = durable_file(mount, "grown", b"g" * 100)
    shrunk_synced = durable_file(mount, "shrunk-synced", b"s" * 9000)
    grown_then_shrunk = durable_file(mount, "grown-then-shrunk", b"t" * 5000)
    os.truncate(shrunk, 10)
    os.truncate(grown, 1 << 20)
    fd = os.open(grown_then_shrunk, os.O_RDWR)
    os.posix_fallocate(fd, 0, 3 * PAGE_SIZE)
    os.ftruncate(fd, 100)
    os.ftruncate(fd, 2 * PAGE_SIZE)  # the bytes past 100 now read as zeros, not as the disk's 't's
    assert os.pread(fd, 2 * PAGE_SIZE, 0) == b"t" * 100 + bytes(2 * PAGE_SIZE - 100)
    os.close(fd)
    with open(shrunk_synced, "r+b") as file:
        file.truncate(4000)
        os.fsync(file.fileno())
    assert shrunk.stat().st_size == 10 and grown.stat().st_size == 1 << 20
    with open(mount.mountpoint / "opened-with-o-trunc", "wb") as file:  # created: not durable at all
        file.write(b"z")
    mount.cut_power()
    assert (mount.backing / "shrunk").read_bytes() == bytes(range(256)) * 40
    assert (mount.backing / "grown").read_bytes() == b"g" * 100
    assert (mount.backing / "grown-then-shrunk").read_bytes() == b"t" * 5000
    assert (mount.backing / "shrunk-synced").read_bytes() == b"s" * 4000
    assert not (mount.backing / "opened-with-o-trunc").exists()


MMAP_WRITER = textwrap.dedent("""
    import mmap, os, sys, time
    path, size = sys.argv[1], int(sys.argv[2])
    fd = os.open(path, os.O_RDWR)
    mapped = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    os.close(fd)
    mapped[0:4096] = b"F" * 4096      # flushed: msync(MS_SYNC)
    mapped[10000:10005] = b"fluSH"
    mapped.flush()
    mapped[4096:8192] = b"U" * 4096   # never flushed: dirty in the page cache when the power goes
    mapped[20000:20003] = b"end"
    print("ready", flush=True)
    time.sleep(60)
""")


def test_an_msynced_mapping_survives_and_an_unflushed_one_is_lost(mounts: list[PowerLossMount],
                                                                   tmp_path: Path) -> None:
    """A process maps a preallocated file (MAP_SHARED, as the commit log and the Raft journal do), writes,
    msyncs, writes more and is still running, its pages dirty, when the power goes: the cut kills it, and
    whatever the kernel writes back as it dies or at the unmount is dropped."""
    mount = mounted(mounts, tmp_path)
    path = mount.mountpoint / "segment"
    size = 64 * PAGE_SIZE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    os.posix_fallocate(fd, 0, size)
    os.fsync(fd)
    os.close(fd)
    fsync_path(mount.mountpoint)
    writer = subprocess.Popen([sys.executable, "-c", MMAP_WRITER, str(path), str(size)], stdout=subprocess.PIPE,
                              cwd=mount.mountpoint)
    try:
        assert writer.stdout is not None and writer.stdout.readline() == b"ready\n"
        data = path.read_bytes()  # this process's view: the page cache, mapped pages included
        assert data[4096:8192] == b"U" * 4096 and data[20000:20003] == b"end"
        assert mount.users() == [writer.pid]
        report = mount.cut_power()
        assert report["killed"] == [writer.pid]
        assert writer.wait(10) == -9
    finally:
        if writer.poll() is None:
            writer.kill()
            writer.wait()
    disk = (mount.backing / "segment").read_bytes()
    assert len(disk) == size
    assert disk[0:4096] == b"F" * 4096 and disk[10000:10005] == b"fluSH"
    assert disk[4096:8192] == bytes(4096) and disk[20000:20003] == bytes(3)


def test_a_mapping_flushed_in_this_process_is_durable_and_its_later_writes_are_not(
        mounts: list[PowerLossMount], tmp_path: Path) -> None:
    mount = mounted(mounts, tmp_path)
    path = durable_file(mount, "journal", bytes(4 * PAGE_SIZE))
    with open(path, "r+b") as file:
        mapped = mmap.mmap(file.fileno(), 4 * PAGE_SIZE)
    mapped[:6] = b"entry1"
    mapped.flush()
    mapped[PAGE_SIZE:PAGE_SIZE + 6] = b"entry2"
    mapped.close()  # unmapped, dirty page left in the page cache: no sync
    mount.cut_power()
    disk = (mount.backing / "journal").read_bytes()
    assert disk[:6] == b"entry1" and disk[PAGE_SIZE:PAGE_SIZE + 6] == bytes(6)


def test_a_rename_is_lost_without_a_directory_fsync_and_kept_with_one(mounts: list[PowerLossMount],
                                                                       tmp_path: Path) -> None:
    """The atomic replace (temp file, fsync, rename, fsync of the directory) as commitlog.checkpoint does
    it: without the last step the power cut brings the old file back."""
    mount = mounted(mounts, tmp_path)
    (mount.mountpoint / "sub").mkdir()
    fsync_path(mount.mountpoint)
    for name in ("lost", "kept"):
        durable_file(mount, f"sub/{name}", b"old")
        temp = mount.mountpoint / "sub" / f"{name}.tmp"
        with open(temp, "wb") as file:
            file.write(b"new")
            file.flush()
            os.fsync(file.fileno())
        os.rename(temp, mount.mountpoint / "sub" / name)
    fsync_path(mount.mountpoint / "sub")  # commits "kept"'s rename, and "lost"'s before it
    os.unlink(mount.mountpoint / "sub" / "kept")
    (mount.mountpoint / "sub" / "late").write_bytes(b"late")
    mount.cut_power()
    assert sorted(os.listdir(mount.backing / "sub")) == ["kept", "lost"]
    assert (mount.backing / "sub" / "kept").read_bytes() == b"new"
    assert (mount.backing / "sub" / "lost").read_bytes() == b"new"
    mount.start()
    (mount.mountpoint / "sub" / "x.tmp").write_bytes(b"x")
    os.rename(mount.mountpoint / "sub" / "x.tmp", mount.mountpoint / "sub" / "kept")
    mount.cut_power()
    assert sorted(os.listdir(mount.backing / "sub")) == ["kept", "lost"]
    assert (mount.backing / "sub" / "kept").read_bytes() == b"new"
    assert not list(tmp_path.glob(".m-disk.trash/*"))


def test_cutting_several_mounts_kills_every_user_and_a_clean_stop_keeps_everything(
        mounts: list[PowerLossMount], tmp_path: Path) -> None:
    first, second = mounted(mounts, tmp_path, "a"), mounted(mounts, tmp_path, "b")
    sleepers = [subprocess.Popen(["sleep", "60"], cwd=mount.mountpoint) for mount in (first, second)]
    try:
        durable_file(first, "f", b"1")
        (second.mountpoint / "g").write_bytes(b"2")
        reports = cut_power([first, second])
        assert [report["killed"] for report in reports] == [[sleepers[0].pid], [sleepers[1].pid]]
        assert [sleeper.wait(10) for sleeper in sleepers] == [-9, -9]
    finally:
        for sleeper in sleepers:
            if sleeper.poll() is None:
                sleeper.kill()
                sleeper.wait()
    assert os.listdir(first.backing) == ["f"] and os.listdir(second.backing) == []
    first.start()
    (first.mountpoint / "unsynced").write_bytes(b"kept by a clean shutdown")
    first.stop()
    assert (first.backing / "unsynced").read_bytes() == b"kept by a clean shutdown"
    assert not first.trash.exists()


def test_a_directory_moved_onto_powerfs_comes_back_after_release(fuse_ready: None, tmp_path: Path) -> None:
    member = tmp_path / "cluster" / "n0"
    (member / "store").mkdir(parents=True)
    (member / "store" / "segment").write_bytes(b"s" * 5000)
    try:
        mount = powerfs.mount_directory(member)
        assert powerfs.mounted_powerfs(tmp_path) == [member]
        assert (member / "store" / "segment").read_bytes() == b"s" * 5000
        (member / "broker.log").write_bytes(b"a line\n")  # written through
        (member / "store" / "late").write_bytes(b"lost")  # never synced
        mount.cut_power()
        mount.start()
        assert sorted(os.listdir(member)) == ["store"]  # the log's creation was not durable: gone with it
        (member / "store" / "segment").write_bytes(b"t" * 10)
        powerfs.sync_mounts(tmp_path)
        wait_for(lambda: mount.status()["volatile_files"] == 0, "the sync", timeout_seconds=5)
    finally:
        released = powerfs.release_mounts(tmp_path / "cluster")
    assert released == [member] and powerfs.mounted_powerfs(tmp_path) == []
    assert sorted(os.listdir(tmp_path / "cluster")) == [".n0.powerfs.log", "n0"]
    assert (member / "store" / "segment").read_bytes() == b"t" * 10
    assert sorted(os.listdir(member / "store")) == ["segment"]


def test_past_the_dirty_limit_the_largest_file_is_written_back(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(powerfs, "VOLATILE_BYTES_MAX", 4 * PAGE_SIZE)
    fs, disk = model_fs(tmp_path)
    (disk / "big").write_bytes(b"")
    (disk / "small").write_bytes(b"")
    big, small = fs.open("/big", os.O_RDWR), fs.open("/small", os.O_RDWR)
    fs.write("/small", b"s" * 10, 0, small)
    fs.write("/big", b"b" * 4 * PAGE_SIZE, 0, big)  # five dirty pages: big goes to the disk
    assert fs.status()["writebacks"] == 1 and fs.status()["volatile_files"] == 1
    fs.power_off()
    assert (disk / "big").read_bytes() == b"b" * 4 * PAGE_SIZE and (disk / "small").read_bytes() == b""
