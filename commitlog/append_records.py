"""Apply's append of prepared records (:mod:`commitlog.records`, checked with ``check_layout``): the leader
laid them out already, so apply patches each record's queue and physical offsets, writes them as chunks and
dispatches from the batch's figures. The same bytes and derived entries :func:`commitlog.append.append_messages`
gives for the same messages (tested)."""

from __future__ import annotations

from collections.abc import Collection

import numpy as np

from commitlog.append import allocate, finish_append
from commitlog.consume_queue import UNIT_BYTES
from commitlog.dispatch import QueueRuns, packed_runs
from commitlog.key_index import IndexColumns, IndexEntry
from commitlog.outcomes import AppendOutcome, AppendResult, AppendStatus, StoredRecords
from commitlog.record_codec import FILLER_HEADER_BYTES
from commitlog.records import (
    HASH_DTYPE,
    OFFSETS,
    QUEUE_OFFSET_AT,
    Layout,
    PreparedRecords,
    columnwise,
    hash_list,
    layout_of,
    meta_list,
    restamp,
    scatter,
)
from commitlog.state import CQ_UNIT_DTYPE, StoreState


def append_records(state: StoreState, raft_index: int, batch: PreparedRecords, skip: Collection[int],
                   store_timestamp: int | None, want_results: bool) -> AppendOutcome:
    """Store prepared records as the effect of Raft entry ``raft_index``
    (:meth:`commitlog.store.MessageStore.append_records`). Store lock held."""
    layout = layout_of(batch) if columnwise(batch.record_count) else None
    records = bytearray(batch.records)
    if store_timestamp is not None and store_timestamp != batch.store_timestamp:
        restamp(records, layout or layout_of(batch), store_timestamp)
    else:
        store_timestamp = batch.store_timestamp
    topics = [state.topic_entry(topic) for topic in batch.topics]
    segment_size = state.config.segment_size_bytes
    position = state.commit_log.end_offset
    if (layout is not None and not skip and len(set(batch.topics)) == len(topics)
            and not any(isinstance(topic_entry, str) for topic_entry in topics)
            and position + len(records) <= position - position % segment_size + segment_size - FILLER_HEADER_BYTES):
        return _append_whole(state, raft_index, batch, layout, records, store_timestamp, want_results)
    return _append_each(state, raft_index, batch, records, topics, skip, store_timestamp, want_results)


def _append_whole(state: StoreState, raft_index: int, batch: PreparedRecords, layout: Layout, records: bytearray,
                  store_timestamp: int, want_results: bool) -> AppendOutcome:
    """The usual case, column-wise: every record is stored, back to back in the current segment, and
    their topics are distinct and valid. The same bytes and entries as :func:`_append_each`."""
    metas = layout.metas
    count = len(metas)
    position = state.commit_log.end_offset
    positions = position + layout.starts
    # queue offsets: each record's rank among the batch's records of its queue, after the queue's end
    queue_ids = metas["queue"].astype(np.int64)
    queue_codes = metas["topic"].astype(np.int64) << 32 | (queue_ids & 0xFFFFFFFF)
    # grouped by queue, in batch order within a queue (not np.unique: it lets go of the GIL, and the
    # Raft thread then waits to get it back behind the other threads)
    by_queue = queue_codes.argsort(kind="stable")
    grouped = queue_codes[by_queue]
    run_start = np.ones(count, dtype=np.bool_)
    np.not_equal(grouped[1:], grouped[:-1], out=run_start[1:])
    (run_starts,) = run_start.nonzero()
    counts = np.append(run_starts[1:], count) - run_starts
    groups = run_start.cumsum() - 1  # the group of each record in queue order
    inverse = np.empty(count, dtype=np.int64)
    inverse[by_queue] = groups
    ranks = np.empty(count, dtype=np.int64)
    ranks[by_queue] = np.arange(count, dtype=np.int64) - run_starts[groups]
    firsts = by_queue[run_starts]
    queue_keys = [(batch.topics[topic_index], queue_id) for topic_index, queue_id
                  in zip(metas["topic"][firsts].tolist(), queue_ids[firsts].tolist(), strict=True)]
    next_offsets = state.next_queue_offsets
    bases = np.array([next_offsets.get(queue_key, 0) for queue_key in queue_keys], dtype=np.int64)
    queue_offsets = bases[inverse] + ranks
    offsets = np.empty((count, 2), dtype=">i8")
    offsets[:, 0] = queue_offsets
    offsets[:, 1] = positions
    scatter(np.frombuffer(records, np.uint8), layout.starts + QUEUE_OFFSET_AT, offsets.view(np.uint8))
    new_offsets = {queue_key: base + run_count for queue_key, base, run_count
                   in zip(queue_keys, bases.tolist(), counts.tolist(), strict=True)}
    hashes = np.frombuffer(batch.key_hashes, HASH_DTYPE).astype(np.int64)
    index_entries = IndexColumns(hashes, positions.repeat(metas["keys"]),
                                 np.full(len(hashes), store_timestamp, dtype=np.int64))
    end = position + len(records)
    allocate(state, int(positions[-1]), new_offsets, index_entries)
    state.commit_log.write(position, records)  # not bytes(records): that would copy the whole batch once more
    units = np.empty(count, dtype=CQ_UNIT_DTYPE)
    units["offset"] = positions
    units["size"] = layout.sizes
    units["tag"] = metas["tag"]
    packed = units[by_queue].tobytes()
    runs = [(queue_key, base, packed[start * UNIT_BYTES : (start + run_count) * UNIT_BYTES])
            for queue_key, base, start, run_count
            in zip(queue_keys, bases.tolist(), run_starts.tolist(), counts.tolist(), strict=True)]
    results = StoredRecords(positions, queue_offsets, layout.sizes, batch.store_host) if want_results else ()
    return finish_append(state, raft_index, end, runs, new_offsets, index_entries, results)


def _append_each(state: StoreState, raft_index: int, batch: PreparedRecords, records: bytearray,
                 topics: list[tuple[bytes, int] | str], skip: Collection[int], store_timestamp: int,
                 want_results: bool) -> AppendOutcome:
    """Record by record: skipped and refused records, fillers at a segment's end."""
    segment_size = state.config.segment_size_bytes
    store_host = batch.store_host
    position = state.commit_log.end_offset
    next_offsets = state.next_queue_offsets
    results: list[AppendResult] = []
    # (commit-log offset, start in records, end in records) of each contiguous run of stored records
    chunks: list[list[int]] = []
    chunk_end = chunk_source_end = -1
    fillers: list[int] = []
    runs: QueueRuns = {}
    index_entries: list[IndexEntry] = []
    key_hashes = hash_list(batch)
    topic_names = batch.topics
    pack_offsets = OFFSETS.pack_into
    limit = segment_size - FILLER_HEADER_BYTES
    ok = AppendStatus.OK
    source = 0
    key_position = 0
    for number, (size, topic_index, _, queue_id, tag_code, _, key_count) in enumerate(meta_list(batch)):
        start = source
        source += size
        keys_from = key_position
        key_position += key_count
        if skip and number in skip:
            continue
        topic_entry = topics[topic_index]
        if isinstance(topic_entry, str) or size > limit:
            if want_results:
                reason = topic_entry if isinstance(topic_entry, str) else f"record of {size} bytes exceeds a segment"
                results.append(AppendResult(AppendStatus.REJECTED, reason=reason))
            continue
        if position + size > position - position % segment_size + limit:
            fillers.append(position)
            position += segment_size - position % segment_size
        queue_key = (topic_names[topic_index], queue_id)
        run = runs.get(queue_key)
        if run is None:
            queue_offset = next_offsets.get(queue_key, 0)
            runs[queue_key] = (queue_offset, [(position, size, tag_code)])
        else:  # queue offsets of one queue are consecutive within an append
            units = run[1]
            queue_offset = run[0] + len(units)
            units.append((position, size, tag_code))
        pack_offsets(records, start + QUEUE_OFFSET_AT, queue_offset, position)
        if position == chunk_end and start == chunk_source_end:
            chunks[-1][2] = source
        else:
            chunks.append([position, start, source])
        chunk_end = position + size
        chunk_source_end = source
        if key_count == 1:
            index_entries.append((key_hashes[keys_from], position, store_timestamp))
        elif key_count:
            index_entries.extend([(key_hashes[key_number], position, store_timestamp)
                                  for key_number in range(keys_from, key_position)])
        if want_results:
            results.append(AppendResult(ok, position, queue_offset, size, store_host))
        position += size
    new_offsets = {queue_key: first_offset + len(units) for queue_key, (first_offset, units) in runs.items()}

    if chunks:
        allocate(state, chunks[-1][0], new_offsets, index_entries)

    for filler_offset in fillers:
        state.commit_log.write_filler(filler_offset)
    with memoryview(records) as view:
        for offset, start, end in chunks:
            # as bytes: pwrite from the bytearray itself was measured slower than the copy
            state.commit_log.write(offset, bytes(view[start:end]))
    return finish_append(state, raft_index, position, packed_runs(runs), new_offsets, index_entries, results)
