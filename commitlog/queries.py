"""Reads: a consume queue's records for a pull, raw commit-log bytes and records by offset, and the queue
offset of a point in time. From any thread, under the store lock."""

from __future__ import annotations

from collections.abc import Iterable

from commitlog.errors import StoreError
from commitlog.outcomes import GetResult, GetStatus
from commitlog.record_codec import HEAD_A, StoredMessage
from commitlog.state import StoreState
from commitlog.sys_flags import SYSFLAG_BORNHOST_V6


def get_messages(
    state: StoreState,
    topic: str,
    queue_id: int,
    queue_offset: int,
    max_count: int,
    max_bytes: int = 4 << 20,
    tag_codes: Iterable[int] | None = None,
) -> GetResult:
    """Up to ``max_count`` records (and about ``max_bytes``) of a queue from ``queue_offset``, skipping
    records whose tag code is not in ``tag_codes`` (None = all), as RocketMQ's getMessage does."""
    wanted = None if tag_codes is None else frozenset(tag_codes)
    with state.lock:
        queue = state.queues.get((topic, queue_id))
        if queue is None:
            return GetResult(GetStatus.NO_MATCHED_LOGIC_QUEUE, 0, 0, 0)
        low, high = queue.min_offset, queue.max_offset
        if high == 0:
            return GetResult(GetStatus.NO_MESSAGE_IN_QUEUE, 0, low, high)
        if queue_offset < low:
            return GetResult(GetStatus.OFFSET_TOO_SMALL, low, low, high)
        if queue_offset == high:
            return GetResult(GetStatus.OFFSET_OVERFLOW_ONE, queue_offset, low, high)
        if queue_offset > high:
            return GetResult(GetStatus.OFFSET_OVERFLOW_BADLY, low if low == 0 else high, low, high)
        segment_size = state.config.segment_size_bytes
        segments = state.commit_log.segments
        min_physical = state.commit_log.min_offset
        messages: list[bytes] = []
        offsets: list[int] = []
        total = 0
        scanned = 0
        # scan at most a bounded number of units per call, like RocketMQ's maxFilterMessageCount
        for physical, size, tag_code in queue.units(queue_offset, max(max_count, 16) if wanted else max_count):
            if len(messages) >= max_count or (messages and total + size > max_bytes):
                break
            scanned += 1
            if physical < min_physical or (wanted is not None and tag_code not in wanted):
                continue
            start = physical - physical % segment_size
            local = physical - start
            messages.append(segments[start].map[local : local + size])
            offsets.append(queue_offset + scanned - 1)
            total += size
        status = GetStatus.FOUND if messages else GetStatus.NO_MATCHED_MESSAGE
        return GetResult(status, queue_offset + scanned, low, high, messages, offsets)


def read_committed(state: StoreState, offset: int, max_bytes: int) -> bytes:
    """Raw commit-log bytes from ``offset`` (records and fillers, across segments), at most
    ``max_bytes``, ending at the commit log's end: what a catching-up peer copies."""
    with state.lock:
        if offset < state.commit_log.min_offset or offset > state.commit_log.end_offset:
            raise StoreError(f"offset {offset} is outside [{state.commit_log.min_offset}, {state.commit_log.end_offset}]")
        end = min(state.commit_log.end_offset, offset + max_bytes)
        parts = []
        position = offset
        while position < end:
            segment_end = state.commit_log.segment_start(position) + state.config.segment_size_bytes
            take = min(end, segment_end) - position
            parts.append(state.commit_log.read(position, take))
            position += take
        return b"".join(parts)


def read_record(state: StoreState, physical_offset: int) -> bytes:
    """The raw record at ``physical_offset``; StoreError when there is no record there."""
    with state.lock:
        if physical_offset < state.commit_log.min_offset:
            raise StoreError(f"physical offset {physical_offset} was deleted by retention")
        size = state.commit_log.record_size_at(physical_offset)
        return state.commit_log.read(physical_offset, size)


def read_message(state: StoreState, physical_offset: int) -> StoredMessage:
    with state.lock:
        if physical_offset < state.commit_log.min_offset:
            raise StoreError(f"physical offset {physical_offset} was deleted by retention")
        return state.commit_log.read_message(physical_offset)


def store_timestamp_at(state: StoreState, physical_offset: int) -> int:
    head = state.commit_log.read(physical_offset, HEAD_A.size + 20)
    sys_flag = int.from_bytes(head[36:40], "big")
    position = HEAD_A.size + (20 if sys_flag & SYSFLAG_BORNHOST_V6 else 8)
    return int.from_bytes(head[position : position + 8], "big", signed=True)


def offset_by_timestamp(state: StoreState, topic: str, queue_id: int, timestamp: int) -> int:
    """The first queue offset whose store timestamp is at or after ``timestamp`` (max offset if none)."""
    with state.lock:
        queue = state.queues.get((topic, queue_id))
        if queue is None:
            return 0
        low = max(queue.min_offset, queue.first_at_or_after(state.commit_log.min_offset))
        high = queue.max_offset
        while low < high:
            middle = (low + high) // 2
            if store_timestamp_at(state, queue.unit(middle)[0]) < timestamp:
                low = middle + 1
            else:
                high = middle
        return low
