"""Where replicas keep their files: discovery and listing on the driver, before any Spark job.

A cluster directory holds one directory per node (``n0``, ``n1``, ...), each with its store at
``<node>/store/``: commit-log segments in ``commitlog/``, consume queues in
``consumequeue/<topic>/<queue id>/`` and key-index files in ``index/``, every data file named by its
20-digit start offset. Listing is metadata only (names and sizes); reading the bytes is the executors' job.

Anything unreadable is a :class:`LayoutError` (a usage error for ``verify``): a check that silently skipped
an unreadable file would vouch for bytes nobody looked at.
"""

from __future__ import annotations

import collections
import contextlib
import mmap
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

FILE_NAME: Final = re.compile(r"^\d{20}$")
#: what a live group's cut starts with when it stands for a cluster directory (spark_analytics.remote)
CUT_PREFIX: Final = "raftmq-cut:"
STORE_DIRECTORY: Final = "store"
COMMIT_LOG_DIRECTORY: Final = "commitlog"
CONSUME_QUEUE_DIRECTORY: Final = "consumequeue"
INDEX_DIRECTORY: Final = "index"


class LayoutError(Exception):
    """The directory given is not a readable raftmq cluster, replica or store (a usage error)."""


@dataclass(frozen=True, slots=True)
class SegmentFile:
    """One commit-log segment file of one replica; ``start`` is its first physical offset."""

    replica: str
    start: int
    path: str
    size_bytes: int


@dataclass(frozen=True, slots=True)
class QueueFile:
    """One consume-queue file; ``start_byte`` is its name: the byte offset of its first unit in the queue."""

    replica: str
    topic: str
    queue_id: int
    start_byte: int
    path: str
    size_bytes: int


@dataclass(frozen=True, slots=True)
class IndexFileEntry:
    """One key-index file; ``begin_physical`` is its name."""

    replica: str
    begin_physical: int
    path: str
    size_bytes: int


@dataclass(frozen=True, slots=True)
class Replica:
    """One replica's files, each list in offset order."""

    name: str
    store_dir: str
    segments: tuple[SegmentFile, ...]
    queue_files: tuple[QueueFile, ...]
    index_files: tuple[IndexFileEntry, ...]

    @property
    def min_offset(self) -> int:
        """The first physical offset this replica holds (retention deletes whole segments below it)."""
        return self.segments[0].start if self.segments else 0


def natural_key(name: str) -> tuple[tuple[int, int | str], ...]:
    """Sort ``n2`` before ``n10``."""
    return tuple((0, int(part)) if part.isdigit() else (1, part) for part in re.split(r"(\d+)", name) if part)


def find_stores(path: Path) -> list[tuple[str, Path]]:
    """(replica name, store directory) for ``path``: a cluster directory (nodes below it), one node's
    directory (with ``store/``) or a store directory itself (with ``commitlog/``)."""
    if not path.exists():
        raise LayoutError(f"{path} does not exist")
    if not path.is_dir():
        raise LayoutError(f"{path} is not a directory")
    if (path / COMMIT_LOG_DIRECTORY).is_dir():
        name = path.parent.name if path.name == STORE_DIRECTORY else path.name
        return [(name, path)]
    if (path / STORE_DIRECTORY).is_dir():
        return [(path.name, path / STORE_DIRECTORY)]
    stores = [(child.name, child / STORE_DIRECTORY) for child in _list_directory(path)
              if child.is_dir() and (child / STORE_DIRECTORY).is_dir()]
    if not stores:
        raise LayoutError(f"{path} holds no replica (no <node>/{STORE_DIRECTORY}/ directory)")
    return sorted(stores, key=lambda item: natural_key(item[0]))


def list_replicas(path: Path, names: frozenset[str] | None = None) -> list[Replica]:
    """Every replica under ``path`` (optionally only those named), with its files. ``path`` may also be a
    live group's cut (:meth:`spark_analytics.remote.RemoteCut.encode`): its members that answered."""
    if str(path).startswith(CUT_PREFIX):
        return remote_replicas(str(path), names)
    stores = find_stores(path)
    if names is not None:
        unknown = sorted(names - {name for name, _ in stores})
        if unknown:
            raise LayoutError(f"no replica named {', '.join(unknown)} under {path}")
        stores = [(name, store) for name, store in stores if name in names]
    return [_list_replica(name, store) for name, store in stores]


def remote_replicas(cut_text: str, names: frozenset[str] | None = None) -> list[Replica]:
    """The replicas of a live group's cut, as their members listed them at the cut: segments and key-index
    files that begin below the cut, every consume-queue file (reads leave out what lies past the cut)."""
    from broker.replica_files import KIND_COMMIT_LOG, KIND_CONSUME_QUEUE, KIND_INDEX, FileName
    from spark_analytics.remote import RemoteCut, RemotePath, member_files, store_path

    cut = RemoteCut.decode(cut_text)
    members = [member for member in cut.answered if names is None or member.name in names]
    if not members:
        raise LayoutError("no member of the group answered: nothing to read")
    replicas = []
    for member in members:
        def path(file: FileName, address: str = member.address, name: str = member.name) -> str:
            return RemotePath(address, name, file, cut.cut).text()

        segments = tuple(
            SegmentFile(member.name, start, path(FileName(KIND_COMMIT_LOG, f"{start:020d}")), size)
            for start, size in member_files(member, KIND_COMMIT_LOG)
            if start < cut.cut and start + size > cut.since)
        queue_files = tuple(
            QueueFile(member.name, topic, queue_id, start, path(FileName(KIND_CONSUME_QUEUE, f"{start:020d}", topic,
                                                                         queue_id)), size)
            for topic, queue_id, start, size in member_files(member, KIND_CONSUME_QUEUE))
        index_files = tuple(
            IndexFileEntry(member.name, begin, path(FileName(KIND_INDEX, f"{begin:020d}")), size)
            for begin, size in member_files(member, KIND_INDEX) if begin < cut.cut)
        replicas.append(Replica(member.name, store_path(member), segments, queue_files, index_files))
    return sorted(replicas, key=lambda replica: natural_key(replica.name))


def segment_size_bytes(replicas: list[Replica]) -> int:
    """The segment size the group was configured with: the most common segment file size (every segment is
    preallocated to it, so a different size is damage, not configuration). Ties go to the larger size."""
    sizes = collections.Counter(segment.size_bytes for replica in replicas for segment in replica.segments)
    if not sizes:
        return 0
    return max(sizes.items(), key=lambda item: (item[1], item[0]))[0]


def _list_replica(name: str, store: Path) -> Replica:
    segments = tuple(
        SegmentFile(name, int(path.name), str(path), _size(path))
        for path in _data_files(store / COMMIT_LOG_DIRECTORY)
    )
    queue_files: list[QueueFile] = []
    queue_root = store / CONSUME_QUEUE_DIRECTORY
    if queue_root.is_dir():
        for topic_dir in sorted(_list_directory(queue_root)):
            if not topic_dir.is_dir():
                continue
            for queue_dir in sorted(_list_directory(topic_dir), key=lambda p: natural_key(p.name)):
                if queue_dir.is_dir() and queue_dir.name.isdigit():
                    queue_files.extend(
                        QueueFile(name, topic_dir.name, int(queue_dir.name), int(path.name), str(path), _size(path))
                        for path in _data_files(queue_dir)
                    )
    index_files = tuple(
        IndexFileEntry(name, int(path.name), str(path), _size(path)) for path in _data_files(store / INDEX_DIRECTORY)
    )
    return Replica(name, str(store), segments, tuple(queue_files), index_files)


def _data_files(directory: Path) -> list[Path]:
    """Files named by a 20-digit offset, in offset order (others, such as files being allocated, are not
    data), each checked readable."""
    if not directory.is_dir():
        return []
    files = sorted(path for path in _list_directory(directory) if FILE_NAME.match(path.name) and path.is_file())
    for path in files:
        if not os.access(path, os.R_OK):
            raise LayoutError(f"{path} is not readable")
    return files


def _list_directory(directory: Path) -> list[Path]:
    try:
        return list(directory.iterdir())
    except OSError as exc:
        raise LayoutError(f"cannot list {directory}: {exc.strerror}") from exc


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError as exc:
        raise LayoutError(f"cannot read {path}: {exc.strerror}") from exc


def read_file(path: str) -> bytes:
    """A file's bytes; a replica file over the network (``raftmq://``) as :func:`spark_analytics.remote.read_path`
    gives it."""
    if path.startswith("raftmq://"):
        from spark_analytics.remote import read_path

        return read_path(path)
    with open(path, "rb") as handle:
        return handle.read()


@contextlib.contextmanager
def map_file(path: str) -> Iterator[bytes | mmap.mmap]:
    """A read-only mapping of ``path`` (an empty file gives b"": mmap refuses zero lengths). A replica
    file over the network is read below the cut (:func:`spark_analytics.remote.mapped_path`)."""
    if path.startswith("raftmq://"):
        from spark_analytics.remote import mapped_path

        with mapped_path(path) as data:
            yield data
        return
    with open(path, "rb") as handle:
        size = handle.seek(0, os.SEEK_END)
        if size == 0:
            yield b""
            return
        mapped = mmap.mmap(handle.fileno(), size, access=mmap.ACCESS_READ)
        try:
            yield mapped
        finally:
            # a memoryview still exported (held by an exception's traceback) makes close() fail; the mapping
            # is then released with the last reference, which is all closing would do
            with contextlib.suppress(BufferError):
                mapped.close()
