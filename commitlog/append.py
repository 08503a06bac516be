"""Apply's append of plain messages: plan every position first and create every file the append will need (a
full disk fails there, with nothing written), then write the records, dispatch them to the consume queues and
the key index, and last record the Raft index in the apply marker. The prepared-records paths
(:mod:`commitlog.append_records`) end the same way (:func:`allocate`, :func:`finish_append`)."""

from __future__ import annotations

import struct
from collections.abc import Sequence

from commitlog.dispatch import (
    NOT_INDEXED,
    NOT_QUEUED,
    PackedRun,
    QueueRuns,
    dispatch_fields,
    dispatch_runs,
    index_hashes,
    packed_runs,
)
from commitlog.key_index import IndexColumns, IndexEntry
from commitlog.message import MessageInput, validate_input
from commitlog.outcomes import AppendOutcome, AppendResult, AppendStatus, StoredRecords, new_result
from commitlog.record_codec import FILLER_HEADER_BYTES, pack_record, stored_size
from commitlog.state import StoreState
from commitlog.sys_flags import TRANSACTION_TYPE_MASK
from protocol.properties import PROPERTIES_BYTES_MAX


def allocate(state: StoreState, last_record_offset: int, new_offsets: dict[tuple[str, int], int],
              index_entries: IndexColumns | list[IndexEntry]) -> None:
    """Create every file an append will write, before it writes anything: a DiskFullError (raised
    here) leaves nothing written."""
    segment_size = state.config.segment_size_bytes
    first = state.commit_log.segment_start(state.commit_log.end_offset)
    last = state.commit_log.segment_start(last_record_offset)
    for start in range(first, last + 1, segment_size):
        state.commit_log.ensure_segment(start)
    for (topic, queue_id), next_offset in new_offsets.items():
        first_offset = state.next_queue_offsets.get((topic, queue_id), 0)
        state.queue(topic, queue_id).ensure_capacity(first_offset, next_offset - 1)
    state.index.prepare(index_entries)


def append_messages(state: StoreState, raft_index: int, messages: Sequence[MessageInput],
                    store_timestamp: int | None) -> AppendOutcome:
    """Store ``messages`` as the effect of Raft entry ``raft_index``, encoding each record
    (:meth:`commitlog.store.MessageStore.append`). Store lock held."""
    segment_size = state.config.segment_size_bytes
    body_max = state.config.body_size_max_bytes
    store_host = state.store_host
    position = state.commit_log.end_offset
    new_offsets: dict[tuple[str, int], int] = {}
    results: list[AppendResult] = []
    # the plan, made as each message is placed: the records to write, as (commit-log offset, records back to
    # back from there), one per contiguous run; each queue's consume-queue units
    chunks: list[tuple[int, list[bytes]]] = []
    chunk_end = last_record_offset = -1
    runs: QueueRuns = {}
    index_entries: list[IndexEntry] = []
    fillers: list[int] = []
    ok = AppendStatus.OK
    for message in messages:
        topic_entry = state.topic_entry(message.topic)
        if isinstance(topic_entry, str):
            results.append(AppendResult(AppendStatus.REJECTED, reason=topic_entry))
            continue
        topic_segment, prefix_crc = topic_entry
        body = message.body
        properties = message.properties
        born_length = len(message.born_host)
        if (len(body) > body_max or len(properties) > PROPERTIES_BYTES_MAX or born_length not in (8, 20)
                or not 0 <= message.queue_id < 2**31):
            reason = validate_input(message, body_max) or "invalid message"
            results.append(AppendResult(AppendStatus.REJECTED, reason=reason))
            continue
        size = stored_size(born_length, len(store_host), len(body), len(topic_segment), len(properties))
        if size + FILLER_HEADER_BYTES > segment_size:
            results.append(AppendResult(AppendStatus.REJECTED, reason=f"record of {size} bytes exceeds a segment"))
            continue
        segment_end = position - position % segment_size + segment_size
        filler = position + size + FILLER_HEADER_BYTES > segment_end
        record_offset = segment_end if filler else position
        tags, keys, uniq_key = dispatch_fields(properties)
        queue_key = (message.topic, message.queue_id)
        tag_code: int | None
        # the dispatch rule's sets, tested without a call to its functions: this loop is apply's hot path
        transaction = message.sys_flag & TRANSACTION_TYPE_MASK
        if transaction in NOT_QUEUED:
            queue_offset, tag_code = 0, None
        else:
            queue_offset = new_offsets.get(queue_key, -1)
            if queue_offset < 0:
                queue_offset = state.next_queue_offsets.get(queue_key, 0)
            tag_code = state.tag_code(tags)
        timestamp = message.store_timestamp if store_timestamp is None else store_timestamp
        try:
            record = pack_record(message, topic_segment, size, queue_offset, record_offset, store_host, timestamp)
        except (struct.error, OverflowError):
            reason = validate_input(message, body_max) or "a field does not fit its stored width"
            results.append(AppendResult(AppendStatus.REJECTED, reason=reason))
            continue
        if filler:
            fillers.append(position)
        if record_offset == chunk_end:
            chunks[-1][1].append(record)
        else:
            chunks.append((record_offset, [record]))
        chunk_end = record_offset + size
        last_record_offset = record_offset
        if tag_code is not None:
            new_offsets[queue_key] = queue_offset + 1
            run = runs.get(queue_key)
            if run is None:
                runs[queue_key] = (queue_offset, [(record_offset, size, tag_code)])
            else:  # queue offsets of one queue are consecutive within an append
                run[1].append((record_offset, size, tag_code))
        if transaction not in NOT_INDEXED and (keys or uniq_key):
            for hash_value in index_hashes(prefix_crc, keys, uniq_key):
                index_entries.append((hash_value, record_offset, timestamp))
        results.append(new_result((ok, record_offset, queue_offset, size, store_host, None)))
        position = record_offset + size

    if chunks:
        allocate(state, last_record_offset, new_offsets, index_entries)

    # write the records, one contiguous chunk per segment, then dispatch
    for filler_offset in fillers:
        state.commit_log.write_filler(filler_offset)
    for chunk_start, chunk in chunks:
        state.commit_log.write(chunk_start, b"".join(chunk))
    return finish_append(state, raft_index, position, packed_runs(runs), new_offsets, index_entries, results)


def finish_append(state: StoreState, raft_index: int, end: int, runs: list[PackedRun],
                  new_offsets: dict[tuple[str, int], int], index_entries: IndexColumns | list[IndexEntry],
                  results: Sequence[AppendResult]) -> AppendOutcome:
    """The end of an append, once its records are written: consume-queue runs, key index, the new
    ends, and last the apply marker that vouches for all of it."""
    dispatch_runs(state, runs, index_entries)
    state.next_queue_offsets.update(new_offsets)
    state.mark_applied(raft_index, end)
    return AppendOutcome(raft_index, True, results if isinstance(results, StoredRecords) else tuple(results))
