"""The scrubber's record walk: validate the records of one commit-log segment from an offset, as
:meth:`CommitLog.scan <commitlog.commit_log.CommitLog.scan>` and :func:`~commitlog.record_codec.decode_record`
do (framing, lengths, a UTF-8 topic, the body CRC, a record naming its own offset; a filler must run to the
segment's end), and hand back only what the scrubber's checks of the derived files need, packed: a
:data:`RECORD_FACTS` per valid record (its consume-queue unit as dispatch writes it, and where it goes) and a
:data:`KEY_ENTRY` per key-index entry dispatch makes of it.

:func:`walk_segment_python` is the reference, written with the store's own decoder and dispatch functions;
``commitlog._native.walk_records`` is its twin in C (tested against it on valid and damaged segments), which
:func:`walk_segment` uses when it is built: the scrubber then decodes no record in Python, makes no
StoredMessage, and reads each record's properties once.
"""

from __future__ import annotations

import mmap
import struct
from typing import Final, NamedTuple

import numpy as np

from commitlog.dispatch import dispatch_fields, record_index_entries, to_consume_queue
from commitlog.record_codec import (
    BLANK_MAGIC,
    FILLER,
    FILLER_HEADER_BYTES,
    MESSAGE_MAGIC,
    RecordError,
    crc32,
    decode_record,
)
from commitlog.tag_codes import cached_tag_code
from protocol.invariant import invariant

try:
    from commitlog import _native
except ImportError:  # not built (setup.py: the extension is optional): the Python walk does it all
    _native = None  # type: ignore[assignment]

#: per valid record: physical offset, queue offset, store timestamp, size, queue id, tag code, the number of
#: its topic in the walk's ``topics``, and 1 when its consume-queue unit is checked (0 for a prepared or
#: rolled-back transaction message, which has none). Little-endian: a buffer of this host, never stored.
RECORD_FACTS: Final = struct.Struct("<qqqiiiIB")
invariant(RECORD_FACTS.size == 41, "record facts are 41 bytes")
RECORD_FACTS_DTYPE: Final = np.dtype([
    ("physical", "<i8"), ("queue_offset", "<i8"), ("store_timestamp", "<i8"), ("size", "<i4"),
    ("queue_id", "<i4"), ("tag_code", "<i4"), ("topic", "<u4"), ("queue_check", "u1")])
invariant(RECORD_FACTS_DTYPE.itemsize == RECORD_FACTS.size, "the facts dtype is the facts struct")
#: per key-index entry: hash, physical offset, store timestamp (commitlog.key_index.IndexEntry)
KEY_ENTRY: Final = struct.Struct("<Iqq")
invariant(KEY_ENTRY.size == 20, "a walked key entry is 20 bytes")
KEY_ENTRY_DTYPE: Final = np.dtype([("hash", "<u4"), ("physical", "<i8"), ("store_timestamp", "<i8")])
invariant(KEY_ENTRY_DTYPE.itemsize == KEY_ENTRY.size, "the key-entry dtype is the key-entry struct")
invariant(_native is None or (RECORD_FACTS.size, KEY_ENTRY.size) == (_native.RECORD_FACTS_BYTES, _native.KEY_ENTRY_BYTES),
          "the C walk packs what this module unpacks")
#: whether :func:`walk_segment` walks in C (``commitlog._native`` is built)
NATIVE: bool = _native is not None

#: a segment's bytes: its mapping, or a copy
Segment = bytes | bytearray | memoryview | mmap.mmap


class SegmentWalk(NamedTuple):
    """What a walk over one segment found."""

    #: the local offset just past the last valid record, or the segment's size after a valid filler: where the
    #: walk stopped (at ``local_stop`` or past it, or at the first invalid record)
    end: int
    #: :data:`RECORD_FACTS` of each valid record, in commit-log order
    facts: bytes
    #: :data:`KEY_ENTRY` of each key-index entry of those records, in the order dispatch makes them
    entries: bytes
    #: the records' topics, by the number their facts carry (in order of first appearance)
    topics: tuple[str, ...]


def walk_segment_python(segment: Segment, segment_start: int, local_start: int, local_stop: int,
                        tag_codes: dict[bytes, int]) -> SegmentWalk:
    """The reference walk over ``segment`` (a whole segment's bytes, starting at commit-log offset
    ``segment_start``) from ``local_start`` while the offset is below ``local_stop``. ``tag_codes`` is the
    store's tag-code cache (:func:`~commitlog.tag_codes.cached_tag_code`)."""
    data = memoryview(segment)
    segment_size = len(data)
    facts: list[bytes] = []
    entries: list[bytes] = []
    topics: dict[str, int] = {}
    local = local_start
    while local < local_stop:
        if local + FILLER_HEADER_BYTES > segment_size:
            break
        size, magic = FILLER.unpack_from(data, local)
        if magic == BLANK_MAGIC:
            if size == segment_size - local:
                local = segment_size  # the filler ends the segment
            break
        if magic != MESSAGE_MAGIC or size <= 0 or local + size + FILLER_HEADER_BYTES > segment_size:
            break
        try:
            message = decode_record(data[local : local + size], 0, check_crc=True)
        except RecordError:
            break
        if message.physical_offset != segment_start + local:
            break
        tags, _, _ = dispatch_fields(message.properties)
        queue_check = to_consume_queue(message.sys_flag)
        facts.append(RECORD_FACTS.pack(message.physical_offset, message.queue_offset, message.store_timestamp,
                                       message.total_size, message.queue_id, cached_tag_code(tag_codes, tags),
                                       topics.setdefault(message.topic, len(topics)), queue_check))
        entries.extend(KEY_ENTRY.pack(*entry) for entry in record_index_entries(message))
        local += size
    return SegmentWalk(local, b"".join(facts), b"".join(entries), tuple(topics))


def walk_segment(segment: Segment, segment_start: int, local_start: int, local_stop: int,
                 tag_codes: dict[bytes, int]) -> SegmentWalk:
    """:func:`walk_segment_python`, in C when ``commitlog._native`` is built."""
    if NATIVE:
        return SegmentWalk(*_native.walk_records(segment, segment_start, local_start, local_stop, tag_codes,
                                                 cached_tag_code, crc32))
    return walk_segment_python(segment, segment_start, local_start, local_stop, tag_codes)
