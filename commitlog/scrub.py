"""Scrub and repair: the scrubber validates the commit log's records (recovery validates only the tail past
the checkpoint) and checks the consume-queue units and key-index entries made of them, putting back what
went bad in a derived file from the commit log; a damaged record is put back from a peer's copy."""

from __future__ import annotations

import logging
from typing import Final

import numpy as np
import numpy.typing as npt

from commitlog.dispatch import dispatch_fields, to_consume_queue
from commitlog.errors import DamagedRecordError, StoreError
from commitlog.index_upkeep import check_index_entries, rebuild_index_file
from commitlog.key_index import ENTRY, image_problem
from commitlog.key_index_checks import entries_match, file_problem, holds_newest
from commitlog.record_codec import StoredMessage, decode_record
from commitlog.scrub_walk import KEY_ENTRY_DTYPE, RECORD_FACTS_DTYPE
from commitlog.state import CQ_UNIT_DTYPE, StoreState

log = logging.getLogger(__name__)

#: commit-log bytes the scrubber validates (and whose derived files it checks) per hold of the store lock: a
#: scrub call takes the lock once per this much, so that apply waits behind it for a short hold at most
SCRUB_LOCK_BYTES: Final = 256 << 10


def scrub(state: StoreState, start: int, max_bytes: int) -> tuple[int | None, int]:
    """Validate the records (CRC) from ``start`` for about ``max_bytes``: returns (offset of the first
    damaged record or None, where to continue). Catches what recovery cannot: recovery validates only
    the tail past the checkpoint, so a byte that went bad on disk deeper in a segment is found here.
    The consume-queue unit and the key-index entries of each valid record are checked too
    (:func:`check_walked_queue_units`, :func:`check_index_entries`).

    The records are walked by :func:`commitlog.scrub_walk.walk_segment` (in C when it is built) and the
    derived files compared a run at a time; the store lock is held for :data:`SCRUB_LOCK_BYTES` of the
    commit log at a time, not for the whole call, so that apply waits for a short hold at most."""
    with state.lock:
        start = max(start, state.commit_log.min_offset)
        end = min(state.commit_log.end_offset, start + max_bytes)
        if start >= end:
            return None, state.commit_log.min_offset  # wrap around
    position = start
    while True:
        with state.lock:  # (taken again per chunk: retention or a truncation may have moved the ends)
            position = max(position, state.commit_log.min_offset)
            stop = min(end, state.commit_log.end_offset)
            if position >= stop:
                return None, position
            chunk_end = min(stop, position + SCRUB_LOCK_BYTES)
            reached, walks = state.commit_log.walk(position, chunk_end, state.tag_codes)
            expected: list[npt.NDArray[np.void]] = []
            for walked in walks:
                check_walked_queue_units(state, np.frombuffer(walked.facts, RECORD_FACTS_DTYPE), walked.topics)
                expected.append(np.frombuffer(walked.entries, KEY_ENTRY_DTYPE))
            entries = np.concatenate(expected) if expected else np.empty(0, KEY_ENTRY_DTYPE)
            if not entries_match(state.index, entries["hash"], entries["physical"], entries["store_timestamp"]):
                check_index_entries(state, list(zip(entries["hash"].tolist(), entries["physical"].tolist(),
                                                   entries["store_timestamp"].tolist(), strict=True)))
            if reached < chunk_end and reached < state.commit_log.end_offset:
                return reached, reached  # a damaged record
            if reached >= end or reached >= state.commit_log.end_offset:
                return None, reached
            position = reached


def check_walked_queue_units(state: StoreState, facts: npt.NDArray[np.void], topics: tuple[str, ...]) -> None:
    """:func:`check_queue_unit` of the records a walk validated (``facts``, :data:`RECORD_FACTS_DTYPE`),
    a queue's run of units at a time: each queue's units for the records' queue offsets are read in one
    slice and compared with what the records say. A record whose unit differs, or a queue whose records'
    offsets do not run one after the other, goes through :func:`check_queue_unit` itself, which decides
    (and repairs) as it always did. Store lock held."""
    facts = facts[facts["queue_check"] == 1]
    if not len(facts):
        return
    keys = facts["topic"].astype(np.int64) << 32 | facts["queue_id"].astype(np.int64) & 0xFFFFFFFF
    order = np.argsort(keys, kind="stable")  # (stable: each queue's records stay in commit-log order)
    bounds = np.flatnonzero(np.diff(keys[order])) + 1
    for members in np.split(order, bounds):
        records = facts[members]
        queue = state.queues.get((topics[int(records["topic"][0])], int(records["queue_id"][0])))
        if queue is None:
            continue
        queue_offsets = records["queue_offset"]
        inside = (queue_offsets >= queue.min_offset) & (queue_offsets < queue.max_offset)
        if not inside.all():
            records = records[inside]
            queue_offsets = records["queue_offset"]
        if not len(records):
            continue
        doubtful = records
        if (np.diff(queue_offsets) == 1).all():
            found = queue.packed_units(int(queue_offsets[0]), len(records))
            if found is not None:
                units = np.frombuffer(found, CQ_UNIT_DTYPE)
                differs = ((units["offset"] != records["physical"]) | (units["size"] != records["size"])
                           | (units["tag"] != records["tag_code"]))
                doubtful = records[differs]
        for physical in doubtful["physical"].tolist():
            check_queue_unit(state, state.commit_log.read_message(physical, check_crc=True))


def check_queue_unit(state: StoreState, message: StoredMessage) -> None:
    """Put back the consume-queue unit of a record the scrubber validated when it does not point at that
    record (a byte gone bad in the queue's file, which carries no checksum: it went unnoticed, pulls from
    this replica read the wrong bytes or none, and the replicas' queue files stayed different). The unit
    is rewritten from the record, as recovery's dispatch writes it, and made durable. A unit beyond the
    queue's end is recovery's to rebuild (a damaged end shows as a short queue). Store lock held."""
    if not to_consume_queue(message.sys_flag):
        return
    queue = state.queues.get((message.topic, message.queue_id))
    if queue is None or not queue.min_offset <= message.queue_offset < queue.max_offset:
        return
    expected = (message.physical_offset, message.total_size,
                state.tag_code(dispatch_fields(message.properties)[0]))
    found = queue.unit(message.queue_offset)
    if found == expected:
        return
    if unit_holds_together(state, message.topic, message.queue_id, message.queue_offset, found):
        # the unit names a valid record that is this queue offset's: it is the scanned record's head that is
        # wrong (only its body has a CRC), and the unit is left alone
        log.critical("the record at commit-log offset %d claims queue offset %d of %s/%d, which the record at "
                     "%d holds: its head may be damaged", message.physical_offset, message.queue_offset,
                     message.topic, message.queue_id, found[0])
        return
    log.critical("consume queue %s/%d: the unit at queue offset %d is damaged (%s, the record says %s): "
                 "putting it back from the commit log", message.topic, message.queue_id, message.queue_offset,
                 found, expected)
    queue.put(message.queue_offset, *expected)
    queue.flush_unit(message.queue_offset)


def unit_holds_together(state: StoreState, topic: str, queue_id: int, queue_offset: int, unit: tuple[int, int, int]) -> bool:
    """Whether a consume-queue unit names a valid record (body CRC, its own offset) of that very queue and
    queue offset, with the record's size and tag code. Store lock held."""
    physical, size, tag_code = unit
    if not state.commit_log.min_offset <= physical < state.commit_log.end_offset or size <= 0:
        return False
    try:
        record = state.commit_log.read_message(physical, check_crc=True)
    except StoreError:
        return False
    return (record.physical_offset == physical and record.total_size == size and record.topic == topic
            and record.queue_id == queue_id and record.queue_offset == queue_offset
            and state.tag_code(dispatch_fields(record.properties)[0]) == tag_code)


def scrub_index(state: StoreState, max_bytes: int) -> int | None:
    """Check key-index files (:func:`commitlog.key_index.image_problem`: header, checksum, entries' order,
    links and slots), round-robin from where the last call stopped, about ``max_bytes`` of them and each
    file at most once per call. A file's used part is copied under the store lock and checked without it;
    a damaged one is checked again and rebuilt from the commit log under the lock. Returns the offset of a
    damaged record a rebuild needs (the caller puts it back; the file is rebuilt on a later call), else
    None. From the scrubber's thread."""
    done = 0
    seen = 0
    while done < max_bytes:
        with state.lock:
            files = state.index.files
            if seen >= len(files):
                return None
            index_file = next((f for f in files if f.name_begin >= state.index_scrub_next), files[0])
            last = holds_newest(state.index, index_file)
            image = index_file.file.map[: index_file.entries_base + index_file.entry_count * ENTRY.size]
            state.index_scrub_next = 0 if index_file is files[-1] else index_file.name_begin + 1
        seen += 1
        done += len(image)
        problem, _ = image_problem(image, state.index.slot_count, state.index.entry_capacity, index_file.name_begin,
                                   last)
        if problem is None:
            continue
        with state.lock:
            if any(each is index_file for each in state.index.files):
                problem = file_problem(state.index, index_file)
                if problem is not None:
                    try:
                        rebuild_index_file(state, index_file, problem)
                    except DamagedRecordError as exc:
                        log.warning("%s: key-index file %s is rebuilt once that record is put back", exc,
                                    index_file.file.path)
                        return exc.physical_offset
    return None


def record_extent(state: StoreState, physical_offset: int) -> int:
    """The size field of the record at ``physical_offset`` (which may itself be damaged)."""
    with state.lock:
        return int.from_bytes(state.commit_log.read(physical_offset, 4), "big", signed=True)


def repair_record(state: StoreState, physical_offset: int, data: bytes) -> None:
    """Put back a damaged committed record from a peer's copy: ``data`` must be one valid record (CRC)
    claiming this very offset; the consume queues and the key index already point at it."""
    record = decode_record(data, 0, check_crc=True)
    if record.total_size != len(data) or record.physical_offset != physical_offset:
        raise StoreError(f"the copy of the record at {physical_offset} is not that record")
    with state.lock:
        if physical_offset < state.commit_log.min_offset or physical_offset + len(data) > state.commit_log.end_offset:
            raise StoreError(f"no committed record at {physical_offset}")
        state.commit_log.write(physical_offset, data)
    log.warning("repaired the record at commit-log offset %d from a peer's copy", physical_offset)
