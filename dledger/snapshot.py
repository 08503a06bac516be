"""The Raft snapshot file that pysyncobj's log compaction writes through our serializer.

It does not copy the store: the store is flushed (so its checkpoint covers the snapshot's index) and
the file records only where the commit log ended, the replicated state, and the two log entries
pysyncobj keeps. Its size does not grow with the data held. A follower that receives it and is behind
copies the missing commit-log bytes from a peer (``dledger.catchup``).

Layout: ``magic u32 | version u16 | last (index i64, term i64, command bytes) | previous (same) |
commit_log_min i64 | commit_log_end i64 | members (count u16, each u16 length + utf-8 address) |
state bytes | crc u32``; bytes fields are ``u32 length + bytes``.
"""

from __future__ import annotations

import logging
import struct
import threading
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from pysyncobj.config import SERIALIZER_STATE

from commitlog.mapped_file import atomic_write

log = logging.getLogger(__name__)

SNAPSHOT_MAGIC: Final = 0x524D534E  # "RMSN"
SNAPSHOT_VERSION: Final = 1
HEAD = struct.Struct(">IH")
ENTRY = struct.Struct(">qq")
RANGE = struct.Struct(">qq")
U16 = struct.Struct(">H")
U32 = struct.Struct(">I")
#: a snapshot holds two log entries and small state; anything larger is damage
SNAPSHOT_BYTES_MAX: Final = 256 << 20
#: a snapshot's first bytes, up to its last entry's index and term (see peek_last_entry)
SNAPSHOT_HEAD_BYTES: Final = HEAD.size + ENTRY.size

LogEntry = tuple[bytes, int, int]  # pysyncobj's (command, index, term)


class SnapshotError(ValueError):
    """A snapshot file that is damaged or of an unknown version."""


@dataclass(frozen=True, slots=True)
class Snapshot:
    last_entry: LogEntry
    previous_entry: LogEntry
    commit_log_min: int
    commit_log_end: int
    members: tuple[str, ...]
    state: bytes

    @property
    def index(self) -> int:
        return self.last_entry[1]


def encode_snapshot(snapshot: Snapshot) -> bytes:
    parts = [HEAD.pack(SNAPSHOT_MAGIC, SNAPSHOT_VERSION)]
    for command, index, term in (snapshot.last_entry, snapshot.previous_entry):
        parts += (ENTRY.pack(index, term), U32.pack(len(command)), command)
    parts.append(RANGE.pack(snapshot.commit_log_min, snapshot.commit_log_end))
    parts.append(U16.pack(len(snapshot.members)))
    for member in snapshot.members:
        encoded = member.encode()
        parts += (U16.pack(len(encoded)), encoded)
    parts += (U32.pack(len(snapshot.state)), snapshot.state)
    body = b"".join(parts)
    return body + U32.pack(zlib.crc32(body))


def decode_snapshot(data: bytes) -> Snapshot:
    if len(data) < HEAD.size + U32.size:
        raise SnapshotError("snapshot too short")
    body, (crc,) = data[:-4], U32.unpack_from(data, len(data) - 4)
    if zlib.crc32(body) != crc:
        raise SnapshotError("snapshot CRC mismatch")
    magic, version = HEAD.unpack_from(body)
    if magic != SNAPSHOT_MAGIC or version != SNAPSHOT_VERSION:
        raise SnapshotError(f"not a raftmq snapshot (magic {magic:#x}, version {version})")
    position = HEAD.size
    try:
        entries = []
        for _ in range(2):
            index, term = ENTRY.unpack_from(body, position)
            (length,) = U32.unpack_from(body, position + ENTRY.size)
            start = position + ENTRY.size + U32.size
            entries.append((body[start : start + length], index, term))
            position = start + length
        commit_log_min, commit_log_end = RANGE.unpack_from(body, position)
        position += RANGE.size
        (count,) = U16.unpack_from(body, position)
        position += U16.size
        members = []
        for _ in range(count):
            (length,) = U16.unpack_from(body, position)
            members.append(body[position + 2 : position + 2 + length].decode())
            position += 2 + length
        (length,) = U32.unpack_from(body, position)
        state = body[position + 4 : position + 4 + length]
        position += 4 + length
    except (struct.error, UnicodeDecodeError) as exc:
        raise SnapshotError(f"snapshot is malformed: {exc}") from exc
    if position != len(body):
        raise SnapshotError("snapshot has trailing or missing bytes")
    return Snapshot(entries[0], entries[1], commit_log_min, commit_log_end, tuple(members), state)


def peek_last_entry(head: bytes) -> tuple[int, int]:
    """(index, term) of a snapshot's last entry from its first SNAPSHOT_HEAD_BYTES bytes: a snapshot still
    arriving from the leader, not yet checked by its CRC."""
    if len(head) < SNAPSHOT_HEAD_BYTES:
        raise SnapshotError("snapshot too short")
    magic, version = HEAD.unpack_from(head)
    if magic != SNAPSHOT_MAGIC or version != SNAPSHOT_VERSION:
        raise SnapshotError(f"not a raftmq snapshot (magic {magic:#x}, version {version})")
    index, term = ENTRY.unpack_from(head, HEAD.size)
    return index, term


def replace_snapshot(path: Path, snapshot: Snapshot) -> None:
    """Put ``snapshot`` at ``path`` atomically: a temp file, fsync, rename, fsync of the directory."""
    atomic_write(path, encode_snapshot(snapshot))


class _Compaction:
    """One snapshot being made durable: the log index it covers and how it ended."""

    def __init__(self, entry_id: int) -> None:
        self.entry_id = entry_id
        self.succeeded = False
        #: a snapshot from the leader was installed meanwhile: this one must not shorten the log
        self.cancelled = False
        self.thread: threading.Thread | None = None


class BackgroundSnapshots:
    """pysyncobj's ``Serializer`` (the object its log compaction and snapshot transfers go through), with
    our snapshots made durable off the Raft thread.

    pysyncobj calls :meth:`serialize` on its tick thread, then polls :meth:`checkSerializing` on every
    tick, and deletes the log entries a snapshot covers only once that reports SUCCESS. ``serialize``
    captures the snapshot there (``capture``: the state, where the commit log ends, the two entries: quick)
    and a thread then makes the store durable (``make_durable``: a flush, whose fdatasync is long at full
    load and, on the Raft thread, stalled every member at once) and only after it writes and
    renames the snapshot file. So a snapshot on disk always has on disk the store data it stands for,
    and a member restarted alone after a power loss can start from its own files.

    Snapshot transfers to lagging followers, and the install of one from the leader, go to pysyncobj's
    serializer (``base``) unchanged. An install first waits for a compaction in flight (whose rename must
    not land after the installed file's) and cancels its log deletion."""

    def __init__(self, base: Any, path: Path, capture: Callable[[Any], Snapshot],
                 make_durable: Callable[[], None]) -> None:
        self._base = base
        self._path = path
        self._capture = capture
        self._make_durable = make_durable
        self._compaction: _Compaction | None = None  # the tick thread's, like everything here

    def serialize(self, data: Any, entry_id: int) -> None:
        """``data`` is pysyncobj's (state, last applied entry, previous entry, cluster)."""
        if self._compaction is not None:
            return
        snapshot = self._capture(data[1:])
        compaction = _Compaction(entry_id)
        compaction.thread = threading.Thread(target=self._write, args=(compaction, snapshot),
                                             name="snapshot", daemon=True)
        self._compaction = compaction
        compaction.thread.start()

    def _write(self, compaction: _Compaction, snapshot: Snapshot) -> None:
        try:
            self._make_durable()
            replace_snapshot(self._path, snapshot)
            compaction.succeeded = True
        except Exception:
            log.warning("snapshot at index %d not written (the log keeps its entries; retried later)",
                        snapshot.index, exc_info=True)

    def checkSerializing(self) -> tuple[int, int | None]:  # pysyncobj's names, from here on
        compaction = self._compaction
        if compaction is None:
            return SERIALIZER_STATE.NOT_SERIALIZING, None
        assert compaction.thread is not None
        if compaction.thread.is_alive():
            return SERIALIZER_STATE.SERIALIZING, compaction.entry_id
        self._compaction = None
        if compaction.cancelled:
            return SERIALIZER_STATE.NOT_SERIALIZING, None
        state = SERIALIZER_STATE.SUCCESS if compaction.succeeded else SERIALIZER_STATE.FAILED
        return state, compaction.entry_id

    def settle(self, cancel: bool = False) -> None:
        """Wait for a compaction in flight to finish; with ``cancel``, the log keeps what it covers."""
        compaction = self._compaction
        if compaction is not None and compaction.thread is not None:
            compaction.thread.join()
            compaction.cancelled = compaction.cancelled or cancel

    def setTransmissionData(self, data: Any) -> bool:
        self.settle(cancel=True)
        return bool(self._base.setTransmissionData(data))

    def deserialize(self) -> Any:
        self.settle(cancel=True)
        return self._base.deserialize()

    def getTransmissionData(self, transmission_id: Any) -> Any:
        return self._base.getTransmissionData(transmission_id)

    def cancelTransmisstion(self, transmission_id: Any) -> None:  # sic: pysyncobj's spelling
        self._base.cancelTransmisstion(transmission_id)


def read_snapshot(path: Path) -> Snapshot:
    size = path.stat().st_size
    if size > SNAPSHOT_BYTES_MAX:
        raise SnapshotError(f"snapshot of {size} bytes is larger than any we write")
    return decode_snapshot(path.read_bytes())
