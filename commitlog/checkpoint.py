"""Durable positions of the store.

Two files, each with a magic, a format version and a CRC:

``checkpoint``: replaced atomically (temp, fsync, rename, fsync dir) after a flush. Everything below
``commit_log_end`` (records, consume-queue units, index entries) was msync'ed before it was written, and
``applied_raft_index`` is the Raft index of the last command whose effects end there. It survives power loss.

``apply.pos``: two memory-mapped slots written alternately after every apply, never fsynced by itself.
After a process crash (the page cache survives) it says exactly which Raft index the commit log's end
belongs to, so nothing that was reported appended is cut. After a power loss it may be stale or ahead of
durable data; recovery then validates the tail and falls back to ``checkpoint``.
"""

from __future__ import annotations

import logging
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from commitlog.errors import CorruptionError
from commitlog.mapped_file import MappedFile, atomic_write
from protocol.invariant import invariant

log = logging.getLogger(__name__)

CHECKPOINT_MAGIC: Final = 0x524D4350  # "RMCP"
CHECKPOINT_VERSION: Final = 1
CHECKPOINT: Final = struct.Struct(">IHHqqqII")
QUEUE_ENTRY: Final = struct.Struct(">iqq")
INDEX_FILE_ENTRY: Final = struct.Struct(">qI")
EXTENSION_LENGTH: Final = struct.Struct(">I")
CRC: Final = struct.Struct(">I")
invariant(CHECKPOINT.size == 40, "checkpoint head must be 40 bytes")
CHECKPOINT_BYTES_MAX: Final = 64 << 20

APPLY_MAGIC: Final = 0x524D4150  # "RMAP"
APPLY_VERSION: Final = 1
APPLY_SLOT: Final = struct.Struct(">IHHqqq")
APPLY_SLOT_BYTES: Final = 64
invariant(APPLY_SLOT.size + CRC.size <= APPLY_SLOT_BYTES, "apply slot must fit")


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """What was durable at the last flush.

    ``queue_offsets`` holds (topic, queue id, min offset, max offset) of every queue, and ``index_files`` the
    key-index files (begin physical offset, entry count): recovery compares them with the files it finds,
    and rebuilds a derived file that is missing or shorter from the commit log.
    """

    applied_raft_index: int
    commit_log_end: int
    min_offset: int
    queue_offsets: tuple[tuple[str, int, int, int], ...] = ()
    index_files: tuple[tuple[int, int], ...] = ()
    #: opaque bytes a layer above persists atomically with the positions (the replicated state that is
    #: not in the commit log, with its own applied index)
    extension: bytes = b""


def encode_checkpoint(checkpoint: Checkpoint) -> bytes:
    parts = [
        CHECKPOINT.pack(
            CHECKPOINT_MAGIC,
            CHECKPOINT_VERSION,
            0,
            checkpoint.applied_raft_index,
            checkpoint.commit_log_end,
            checkpoint.min_offset,
            len(checkpoint.queue_offsets),
            len(checkpoint.index_files),
        )
    ]
    for topic, queue_id, min_offset, max_offset in checkpoint.queue_offsets:
        encoded = topic.encode()
        parts.append(bytes((len(encoded),)) + encoded + QUEUE_ENTRY.pack(queue_id, min_offset, max_offset))
    parts.extend(INDEX_FILE_ENTRY.pack(begin, count) for begin, count in checkpoint.index_files)
    parts.append(EXTENSION_LENGTH.pack(len(checkpoint.extension)))
    parts.append(checkpoint.extension)
    body = b"".join(parts)
    return body + CRC.pack(zlib.crc32(body))


def decode_checkpoint(raw: bytes) -> Checkpoint:
    if len(raw) < CHECKPOINT.size + CRC.size:
        raise CorruptionError(f"checkpoint has {len(raw)} bytes, too short")
    body, (crc,) = raw[: -CRC.size], CRC.unpack_from(raw, len(raw) - CRC.size)
    if zlib.crc32(body) != crc:
        raise CorruptionError("checkpoint CRC mismatch")
    magic, version, _, applied, end, min_offset, queue_count, index_count = CHECKPOINT.unpack_from(body)
    if magic != CHECKPOINT_MAGIC:
        raise CorruptionError(f"checkpoint magic {magic:#x} is not {CHECKPOINT_MAGIC:#x}")
    if version != CHECKPOINT_VERSION:
        raise CorruptionError(f"checkpoint version {version} is not supported")
    if applied < 0 or end < 0 or not 0 <= min_offset <= end:
        raise CorruptionError(f"checkpoint values out of range: {applied} {end} {min_offset}")
    position = CHECKPOINT.size
    queues = []
    try:
        for _ in range(queue_count):
            length = body[position]
            topic = body[position + 1 : position + 1 + length].decode()
            position += 1 + length
            queue_id, queue_min, queue_max = QUEUE_ENTRY.unpack_from(body, position)
            position += QUEUE_ENTRY.size
            queues.append((topic, queue_id, queue_min, queue_max))
        index_files = []
        for _ in range(index_count):
            index_files.append(INDEX_FILE_ENTRY.unpack_from(body, position))
            position += INDEX_FILE_ENTRY.size
        (extension_length,) = EXTENSION_LENGTH.unpack_from(body, position)
        position += EXTENSION_LENGTH.size
        extension = body[position : position + extension_length]
        position += extension_length
    except (IndexError, struct.error, UnicodeDecodeError) as exc:
        raise CorruptionError(f"checkpoint body is malformed: {exc}") from exc
    if position != len(body):
        raise CorruptionError("checkpoint has trailing or missing bytes")
    return Checkpoint(applied, end, min_offset, tuple(queues), tuple(index_files), extension)


def read_checkpoint(path: Path) -> Checkpoint | None:
    """The checkpoint at ``path``, None when there is none; CorruptionError when it is damaged."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    return decode_checkpoint(raw)


def write_checkpoint(path: Path, checkpoint: Checkpoint) -> None:
    atomic_write(path, encode_checkpoint(checkpoint))


@dataclass(frozen=True, slots=True)
class ApplyPosition:
    sequence: int
    applied_raft_index: int
    commit_log_end: int


class ApplyPositionFile:
    """The two-slot apply marker (see module docstring)."""

    def __init__(self, path: Path) -> None:
        create = not path.exists()
        if not create and (size := path.stat().st_size) != 2 * APPLY_SLOT_BYTES:
            # cut short on disk (the member refused to start on it): a marker with no valid slot, so recovery
            # falls back to the checkpoint and Raft applies the rest again, as after a power loss
            log.warning("apply marker %s has %d bytes, not %d: starting a new one", path, size, 2 * APPLY_SLOT_BYTES)
            path.unlink()
            create = True
        self.file = MappedFile(path, 2 * APPLY_SLOT_BYTES, create)
        self.last = self._read_latest()

    def _read_slot(self, slot: int) -> ApplyPosition | None:
        base = slot * APPLY_SLOT_BYTES
        view = self.file.map
        (crc,) = CRC.unpack_from(view, base + APPLY_SLOT.size)
        if zlib.crc32(view[base : base + APPLY_SLOT.size]) != crc:
            return None
        magic, version, _, sequence, applied, end = APPLY_SLOT.unpack_from(view, base)
        if magic != APPLY_MAGIC or version != APPLY_VERSION:
            return None
        return ApplyPosition(sequence, applied, end)

    def _read_latest(self) -> ApplyPosition | None:
        slots = [p for p in (self._read_slot(0), self._read_slot(1)) if p is not None]
        return max(slots, key=lambda p: p.sequence) if slots else None

    def write(self, applied_raft_index: int, commit_log_end: int) -> None:
        sequence = (self.last.sequence + 1) if self.last else 1
        base = (sequence % 2) * APPLY_SLOT_BYTES
        body = APPLY_SLOT.pack(APPLY_MAGIC, APPLY_VERSION, 0, sequence, applied_raft_index, commit_log_end)
        self.file.map[base : base + APPLY_SLOT.size] = body
        CRC.pack_into(self.file.map, base + APPLY_SLOT.size, zlib.crc32(body))
        self.last = ApplyPosition(sequence, applied_raft_index, commit_log_end)

    def flush(self) -> None:
        self.file.flush(0, 2 * APPLY_SLOT_BYTES)

    def close(self) -> None:
        self.file.close()
