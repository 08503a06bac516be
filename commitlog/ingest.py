"""Catch-up from a peer: raw commit-log bytes copied from a peer are written past the end, then validated
record by record and dispatched like recovery's tail; a replica behind the peer's retention point first
drops everything and continues at a segment start."""

from __future__ import annotations

import shutil
from collections.abc import Mapping

from commitlog.dispatch import dispatch_records
from commitlog.errors import CorruptionError
from commitlog.flush import flush
from commitlog.queue_starts import QueueKey, continuation_problem
from commitlog.state import StoreState
from protocol.invariant import invariant


def reset_to(state: StoreState, start_offset: int) -> None:
    """Drop everything and continue at ``start_offset`` (a segment start): a replica that is behind a
    peer's retention point cannot append that peer's bytes to its own."""
    with state.lock:
        invariant(start_offset % state.config.segment_size_bytes == 0, "reset to a segment start")
        state.commit_log.truncate(state.commit_log.min_offset)
        for start in list(state.commit_log.starts):
            state.commit_log.segments.pop(start).delete()
        state.commit_log.starts.clear()
        state.commit_log.end_offset = start_offset
        for queue in state.queues.values():
            queue.delete()
        state.queues.clear()
        state.dirty_queues.clear()
        shutil.rmtree(state.root / "consumequeue", ignore_errors=True)
        state.index.close()
        shutil.rmtree(state.root / "index", ignore_errors=True)
        state.index = state.new_key_index()
        state.next_queue_offsets = {}
        state.min_offset = start_offset
        state.flushed_end = start_offset
        state.apply_position.write(state.applied_raft_index, start_offset)
    flush(state)


def ingest_raw(state: StoreState, offset: int, data: bytes) -> None:
    """Append raw commit-log bytes copied from a peer at ``offset`` (== the current end). They are not
    visible until :func:`finish_ingest` validates and dispatches them."""
    with state.lock:
        invariant(offset == _ingest_end(state), "raw bytes must continue the commit log")
        segment_size = state.config.segment_size_bytes
        position = 0
        while position < len(data):
            start = state.commit_log.segment_start(offset + position)
            state.commit_log.ensure_segment(start)
            take = min(len(data) - position, start + segment_size - (offset + position))
            state.commit_log.write(offset + position, data[position : position + take])
            position += take
        state.ingested_end = offset + len(data)


def discard_ingest(state: StoreState) -> None:
    """Forget raw bytes ingested but not finished (a copy that failed half-way); they lie past the end
    and are overwritten by whatever comes next."""
    with state.lock:
        state.ingested_end = -1


def _ingest_end(state: StoreState) -> int:
    return state.ingested_end if state.ingested_end >= 0 else state.commit_log.end_offset


def queue_starts(state: StoreState, physical_offset: int) -> dict[QueueKey, int] | None:
    """Each queue's offset of its first unit at or after ``physical_offset`` (its end when it has none
    there): where a replica that copies the commit log from ``physical_offset`` continues it. None when
    ``physical_offset`` is not in [min_offset, end]."""
    with state.lock:
        if not state.min_offset <= physical_offset <= state.commit_log.end_offset:
            return None
        return {key: queue.first_at_or_after(physical_offset) for key, queue in state.queues.items()}


def finish_ingest(state: StoreState, raft_index: int, queue_starts: Mapping[QueueKey, int] | None = None) -> None:
    """Validate the ingested bytes record by record, dispatch them, and mark ``raft_index`` applied.
    ``queue_starts``: where each queue continues, from the peer, when the copy begins past its retention
    point (:mod:`commitlog.queue_starts`). CorruptionError (and nothing made visible) when the bytes do not
    form valid records or do not continue the queues."""
    with state.lock:
        start, end = state.commit_log.end_offset, _ingest_end(state)
        messages = list(state.commit_log.scan(start, end))
        if state.commit_log.scan_end != end:
            state.ingested_end = -1
            raise CorruptionError(f"copied bytes are not valid records at {state.commit_log.scan_end}")
        problem = continuation_problem(messages, state.next_queue_offsets, queue_starts)
        if problem is not None:
            state.ingested_end = -1
            raise CorruptionError(f"copied records do not continue the queues: {problem}")
        for key, queue_start in (queue_starts or {}).items():
            queue = state.queue(*key)
            if queue.max_offset < queue_start:
                queue.restore_empty_at(queue_start)
            state.dirty_queues.add(queue)
            state.next_queue_offsets[key] = queue_start
        pending_index, written = dispatch_records(state, messages)
        for queue in written:
            state.next_queue_offsets[(queue.topic, queue.queue_id)] = queue.max_offset
        state.dirty_queues.update(written)
        state.index.prepare(pending_index)
        state.index.insert_many(pending_index)
        state.recent_keys.add(pending_index)
        for queue in state.dirty_queues:  # a queue first seen after a reset starts mid-way
            queue.prune_below(state.min_offset)
        state.ingested_end = -1
        state.mark_applied(max(state.applied_raft_index, raft_index), end)
    flush(state)
