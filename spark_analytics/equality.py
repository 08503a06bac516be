"""Byte equality on the driver: the majority vote over block digests, and pinning a difference down to its
first byte and the record holding it. The executors hash; only differing blocks (and the one block the
common range ends in) are read here, so the driver's work does not grow with the data."""

from __future__ import annotations

import hashlib
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass

from commitlog.record_codec import FILLER_HEADER_BYTES, StoredMessage
from protocol.properties import PROPERTY_UNIQ_KEY
from spark_analytics.layout import Replica, map_file
from spark_analytics.results import RecordLocation
from spark_analytics.walker import KIND_FILLER, KIND_MESSAGE, entry_at

#: the digest of a block a replica does not have at all (its file is short or missing)
MISSING: tuple[int, bytes] = (-1, b"")
#: bytes compared at a time when looking for the first difference inside a block
COMPARE_CHUNK_BYTES = 4096


@dataclass(frozen=True, slots=True)
class Vote:
    """The outcome for one block: the replicas with the majority's bytes (empty when no group has more
    than half) and, for each other replica, the replicas it is compared with."""

    majority: tuple[str, ...]
    odd: tuple[str, ...]

    @property
    def differs(self) -> bool:
        return bool(self.odd)


def vote(digests: Mapping[str, Hashable], replicas: Sequence[str]) -> Vote:
    """Group ``replicas`` by their (bytes hashed, digest) for a block (or by any comparable value: the
    derived-state checks vote on consume-queue units and state entries the same way). A group of more than half the
    replicas is the majority and the rest are odd; without one, every replica that differs from the first
    is odd (with two replicas nobody can be outvoted, but the difference is still found)."""
    groups: dict[Hashable, list[str]] = {}
    for replica in replicas:
        groups.setdefault(digests.get(replica, MISSING), []).append(replica)
    if len(groups) == 1:
        return Vote(tuple(replicas), ())
    largest = max(groups.values(), key=len)
    if 2 * len(largest) > len(replicas):
        return Vote(tuple(largest), tuple(r for r in replicas if r not in largest))
    first_group = groups[digests.get(replicas[0], MISSING)]
    return Vote((), tuple(r for r in replicas if r not in first_group))


def segment_path(replica: Replica, segment_start: int) -> str | None:
    for segment in replica.segments:
        if segment.start == segment_start:
            return segment.path
    return None


def read_range(replica: Replica, segment_size: int, start: int, end: int) -> bytes:
    """The replica's bytes of ``[start, end)`` (inside one segment); shorter when its file is short, empty
    when the segment file is missing."""
    segment_start = start - start % segment_size
    path = segment_path(replica, segment_start)
    if path is None:
        return b""
    if path.startswith("raftmq://"):  # over the network: only the range
        from spark_analytics.remote import read_path

        return read_path(path, start - segment_start, end - segment_start)
    with map_file(path) as data:
        return bytes(data[start - segment_start : end - segment_start])


def range_digest(data: bytes) -> tuple[int, bytes]:
    """What the blocks source would report for these bytes, for blocks compared on the driver."""
    from spark_analytics.sources import DIGEST_NAME

    return len(data), hashlib.new(DIGEST_NAME, data).digest()


def first_difference(expected: bytes, actual: bytes) -> int | None:
    """Index of the first byte where the two differ (a shorter one differs where it ends); None if equal."""
    if expected == actual:
        return None
    common = min(len(expected), len(actual))
    low = 0
    while low < common:
        high = min(common, low + COMPARE_CHUNK_BYTES)
        if expected[low:high] != actual[low:high]:
            return next(index for index in range(low, high) if expected[index] != actual[index])
        low = high
    return common


def record_field(message: StoredMessage, offset_in_record: int) -> str:
    """The name of the stored-record field that byte ``offset_in_record`` belongs to."""
    born = len(message.born_host)
    store = len(message.store_host)
    topic = len(message.topic.encode())
    spans = [
        ("total_size", 4), ("magic", 4), ("body_crc", 4), ("queue_id", 4), ("flag", 4), ("queue_offset", 8),
        ("physical_offset", 8), ("sys_flag", 4), ("born_timestamp", 8), ("born_host", born),
        ("store_timestamp", 8), ("store_host", store), ("reconsume_times", 4),
        ("prepared_transaction_offset", 8), ("body_length", 4), ("body", len(message.body)),
        ("topic_length", 1), ("topic", topic), ("properties_length", 2), ("properties", len(message.properties)),
    ]
    position = 0
    for name, width in spans:
        if offset_in_record < position + width:
            return name
        position += width
    return "past the record"


def locate(replica: Replica, segment_size: int, physical_offset: int) -> RecordLocation:
    """What the replica holds at ``physical_offset``: the walk of its segment up to there, decoded."""
    segment_start = physical_offset - physical_offset % segment_size
    path = segment_path(replica, segment_start)
    if path is None:
        return RecordLocation(replica.name, physical_offset, "missing")
    with map_file(path) as data:
        entry = entry_at(data, segment_start, segment_size, physical_offset - segment_start)
    if entry is None:
        return RecordLocation(replica.name, physical_offset, "missing")
    record_offset = segment_start + entry.offset
    within = physical_offset - record_offset
    message = entry.message
    if entry.kind != KIND_MESSAGE or message is None:
        field = None
        if entry.kind == KIND_FILLER:
            field = "filler header" if within < FILLER_HEADER_BYTES else "filler padding"
        return RecordLocation(replica.name, physical_offset, entry.kind, record_offset, entry.length,
                              field=field, byte_in_record=within)
    return RecordLocation(
        replica.name, physical_offset, entry.kind, record_offset, entry.length, message.topic, message.queue_id,
        message.queue_offset, message.property_map.get(PROPERTY_UNIQ_KEY), record_field(message, within), within,
    )

