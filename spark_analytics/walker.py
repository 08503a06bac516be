"""Walk one commit-log segment record by record, surviving damage: pure functions over bytes, no Spark.

The store writes records back to back from the segment start, closes a segment with a filler record that
reaches its end, and leaves zeros after the last record of the newest segment. The walk yields one
:class:`Entry` per stretch of the segment, covering it without gaps:

* ``message``: a record with the message magic (decoding it is the caller's business);
* ``filler``: the filler record, which must reach the segment end;
* ``end``: the all-zero rest of the segment, where the data ends;
* ``invalid``: bytes that are none of these. Unlike recovery, which stops at the first bad record, the
  walk resynchronises at the next record whose stored physical offset is its own position (or at a filler
  that reaches the segment end, or at the all-zero tail), so one flipped byte costs one record, not the
  rest of the segment.

The walk trusts nothing it reads: every length is checked against the bytes present (a truncated file
ends in an ``invalid`` entry that runs to the end of the file).
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Iterator
from typing import Final, NamedTuple

from commitlog.record_codec import (
    BLANK_MAGIC,
    FILLER,
    FILLER_HEADER_BYTES,
    MESSAGE_MAGIC,
    POS_PHYSICAL_OFFSET,
    RecordError,
    StoredMessage,
    decode_record,
    record_size,
)

KIND_MESSAGE: Final = "message"
KIND_FILLER: Final = "filler"
KIND_END: Final = "end"
KIND_INVALID: Final = "invalid"

#: the smallest record the store can write (empty body and properties, a one-byte topic)
RECORD_BYTES_MIN: Final = record_size(0, 1, 0)
MESSAGE_MAGIC_BYTES: Final = struct.pack(">I", MESSAGE_MAGIC)
BLANK_MAGIC_BYTES: Final = struct.pack(">I", BLANK_MAGIC)
INT64: Final = struct.Struct(">q")
#: how much is compared at a time when looking for the all-zero tail
ZERO_SCAN_BYTES: Final = 1 << 20
_ZEROS: Final = bytes(ZERO_SCAN_BYTES)

Buffer = bytes | mmap.mmap


class Entry(NamedTuple):
    """A stretch of a segment: ``offset`` is local to the segment, ``length`` the bytes it covers."""

    kind: str
    offset: int
    length: int
    problem: str | None = None
    #: the decoded record of a ``message`` entry when the walk decodes (CRC not checked: a bad CRC is a
    #: fact to report about a record that is otherwise intact, not a reason to skip it)
    message: StoredMessage | None = None


def first_nonzero(data: Buffer, start: int, stop: int) -> int:
    """The position of the first non-zero byte in ``data[start:stop]``, or ``stop`` when all are zero."""
    position = start
    while position < stop:
        chunk = data[position : min(stop, position + ZERO_SCAN_BYTES)]
        if chunk != _ZEROS[: len(chunk)]:
            return position + len(chunk) - len(chunk.lstrip(b"\x00"))
        position += len(chunk)
    return stop


def walk_segment(data: Buffer, segment_start: int, segment_size: int, decode: bool = True) -> Iterator[Entry]:
    """Entries covering ``data`` (one segment file's bytes, possibly shorter than ``segment_size`` when
    the file was truncated) from its first byte to its last.

    With ``decode`` every message record is decoded, and one that does not decode is ``invalid`` (its
    total size is not trusted either). Without it only the chain of total sizes is followed: enough to find
    where the data ends, at a fraction of the cost."""
    limit = min(len(data), segment_size)
    position = 0
    while position < limit:
        if position + FILLER_HEADER_BYTES > limit:
            problem = "a record head runs past the end of the file"
            yield _zeros_or_invalid(data, position, limit, problem)
            return
        size, magic = FILLER.unpack_from(data, position)
        if magic == MESSAGE_MAGIC:
            if size < RECORD_BYTES_MIN:
                problem = f"message record with impossible total size {size}"
            elif position + size > limit:
                problem = (f"message record of {size} bytes runs past the end of the "
                           f"{'file' if limit < segment_size else 'segment'}")
            elif not decode:
                yield Entry(KIND_MESSAGE, position, size)
                position += size
                continue
            else:
                try:
                    message = decode_record(memoryview(data), position, check_crc=False)
                except RecordError as exc:
                    problem = str(exc)
                else:
                    yield Entry(KIND_MESSAGE, position, size, None, message)
                    position += size
                    continue
        elif magic == BLANK_MAGIC:
            if position + size == segment_size and size <= limit - position:
                yield Entry(KIND_FILLER, position, size)
                return
            problem = f"filler of {size} bytes does not reach the segment end at {segment_size}"
            if position + size == segment_size:
                problem = f"filler of {size} bytes runs past the end of the file"
        elif size == 0 and magic == 0:
            nonzero = first_nonzero(data, position, limit)
            if nonzero == limit:
                yield Entry(KIND_END, position, limit - position)
                return
            problem = f"zeros, then data again at local offset {nonzero}"
        else:
            problem = f"no record here (size {size}, magic {magic:#010x})"
        resume = resynchronise(data, segment_start, segment_size, position + 1, limit)
        yield Entry(KIND_INVALID, position, resume - position, problem)
        position = resume


def resynchronise(data: Buffer, segment_start: int, segment_size: int, start: int, limit: int) -> int:
    """Where the walk can continue after damage: the next message record whose stored physical offset is
    its own position, a filler that reaches the segment end, or the start of the all-zero tail; ``limit``
    when none is found."""
    tail = _zero_tail_start(data, start, limit)
    candidates = [tail]
    position = start
    while True:
        found = data.find(MESSAGE_MAGIC_BYTES, position + 4, tail)
        if found < 0:
            break
        record = found - 4
        if (record + POS_PHYSICAL_OFFSET + 8 <= limit
                and INT64.unpack_from(data, record + POS_PHYSICAL_OFFSET)[0] == segment_start + record):
            candidates.append(record)
            break
        position = found - 3
    position = start
    while True:
        found = data.find(BLANK_MAGIC_BYTES, position + 4, tail)
        if found < 0:
            break
        record = found - 4
        if FILLER.unpack_from(data, record)[0] == segment_size - record:
            candidates.append(record)
            break
        position = found - 3
    return min(candidates)


def _zero_tail_start(data: Buffer, start: int, limit: int) -> int:
    """The start of the all-zero run that ends the file (``limit`` when the last byte is not zero), never
    before ``start``. Searched backwards a chunk at a time: the tail is usually most of the newest segment."""
    position = limit
    while position > start:
        low = max(start, position - ZERO_SCAN_BYTES)
        chunk = data[low:position]
        stripped = chunk.rstrip(b"\x00")
        if stripped:
            return low + len(stripped)
        position = low
    return start


def _zeros_or_invalid(data: Buffer, position: int, limit: int, problem: str) -> Entry:
    if first_nonzero(data, position, limit) == limit:
        return Entry(KIND_END, position, limit - position)
    return Entry(KIND_INVALID, position, limit - position, problem)


def entry_at(data: Buffer, segment_start: int, segment_size: int, local_offset: int) -> Entry | None:
    """The (decoded) entry of the walk that covers ``local_offset``, None past the data."""
    for entry in walk_segment(data, segment_start, segment_size, decode=True):
        if entry.offset <= local_offset < entry.offset + entry.length:
            return entry
        if entry.offset > local_offset:
            return None
    return None
