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

import os
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Final

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


def write_snapshot(path: Path, snapshot: Snapshot) -> None:
    """Write and fsync (pysyncobj renames the file into place afterwards)."""
    with open(path, "wb") as handle:
        handle.write(encode_snapshot(snapshot))
        handle.flush()
        os.fsync(handle.fileno())


def read_snapshot(path: Path) -> Snapshot:
    size = path.stat().st_size
    if size > SNAPSHOT_BYTES_MAX:
        raise SnapshotError(f"snapshot of {size} bytes is larger than any we write")
    return decode_snapshot(path.read_bytes())
