"""Opening a store after a stop or a crash.

Recovery trusts the checkpoint (durable), validates the tail past it record by record, keeps what the apply
marker vouches for, cuts the rest, and re-dispatches the tail to the derived files. A derived file that is
missing or shorter than the checkpoint says is rebuilt from the commit log."""

from __future__ import annotations

import logging
import shutil

from commitlog.checkpoint import Checkpoint, read_checkpoint
from commitlog.dispatch import dispatch_records
from commitlog.errors import CorruptionError
from commitlog.flush import flush
from commitlog.index_upkeep import rebuild_index_file
from commitlog.key_index_checks import file_problem
from commitlog.state import CHECKPOINT_NAME, StoreState
from protocol.invariant import invariant

log = logging.getLogger(__name__)


def recover(state: StoreState) -> None:
    checkpoint_path = state.root / CHECKPOINT_NAME
    marker = state.apply_position.last
    try:
        checkpoint = read_checkpoint(checkpoint_path)
    except CorruptionError as exc:
        if marker is None:
            raise CorruptionError(
                f"{checkpoint_path} is damaged ({exc}) and there is no apply marker: the applied Raft "
                "index cannot be known; wipe this replica's data directory to resync it from the group"
            ) from exc
        log.warning("checkpoint damaged (%s): validating the whole commit log instead", exc)
        checkpoint = Checkpoint(0, state.commit_log.min_offset, state.commit_log.min_offset)
    if checkpoint is None:
        if state.commit_log.starts and marker is None:
            raise CorruptionError(f"{state.root} has commit-log segments but no checkpoint and no marker")
        checkpoint = Checkpoint(0, state.commit_log.min_offset, state.commit_log.min_offset)
    state.extension = checkpoint.extension
    durable_end = max(checkpoint.commit_log_end, state.commit_log.min_offset)
    state.commit_log.end_offset = max(durable_end, marker.commit_log_end if marker else 0)

    # 1. How far does valid data go past the durable point, and does the marker vouch for it?
    end, applied = durable_end, checkpoint.applied_raft_index
    if marker is not None and marker.applied_raft_index >= applied and marker.commit_log_end >= durable_end:
        for _ in state.commit_log.scan(durable_end, marker.commit_log_end):
            pass
        if state.commit_log.scan_end == marker.commit_log_end:
            end, applied = marker.commit_log_end, marker.applied_raft_index
        else:
            log.warning(
                "commit log is damaged at %d before the apply marker's end %d: "
                "falling back to the checkpoint at %d (index %d)",
                state.commit_log.scan_end, marker.commit_log_end, durable_end, applied,
            )
    state.commit_log.truncate(end)
    state.applied_raft_index = applied
    state.min_offset = max(checkpoint.min_offset, state.commit_log.min_offset)
    state.commit_log.delete_below(state.min_offset)

    # 2. Which derived data must be rebuilt, and from where?
    queue_from = durable_end
    for topic, queue_id, queue_min, queue_max in checkpoint.queue_offsets:
        key = (topic, queue_id)
        queue = state.queues.get(key)
        if queue_max == queue_min and queue_max > 0 and (queue is None or queue.max_offset < queue_max):
            state.queue(topic, queue_id).restore_empty_at(queue_max)  # emptied by retention
            continue
        if queue_max > queue_min and (queue is None or not queue.covers(queue_min, queue_max)):
            log.warning("consume queue %s/%d is missing or short: rebuilding consume queues", *key)
            queue_from = state.commit_log.min_offset
            break
    index_from = durable_end
    present = {f.name_begin: f.entry_count for f in state.index.files}
    for begin, count in checkpoint.index_files:
        if begin >= state.min_offset and present.get(begin, -1) < count:
            log.warning("key index file %020d is missing or short: rebuilding the key index", begin)
            index_from = state.commit_log.min_offset
            break
    if queue_from < durable_end:
        for queue in state.queues.values():
            queue.close()
        shutil.rmtree(state.root / "consumequeue", ignore_errors=True)
        state.queues.clear()
    else:
        for queue in state.queues.values():
            queue.truncate_physical(queue_from)
    whole_index = index_from < durable_end
    if not whole_index and not undo_index_from(state, index_from):
        log.warning("key index does not fit the commit log: rebuilding the key index")
        whole_index, index_from = True, state.commit_log.min_offset
    if whole_index:
        state.index.close()
        shutil.rmtree(state.root / "index", ignore_errors=True)
        state.index = state.new_key_index()

    # 3. Re-dispatch the tail (or everything, for a rebuild).
    start = min(queue_from, index_from)
    pending_index, _ = dispatch_records(state, state.commit_log.scan(start, end), queue_from, index_from)
    invariant(state.commit_log.scan_end == end or start == end, "validated data must re-scan cleanly")
    state.index.prepare(pending_index)
    state.index.insert_many(pending_index)
    for queue in state.queues.values():
        queue.prune_below(state.min_offset)
    if queue_from < durable_end:
        # a queue that retention emptied has no record left to be rebuilt from: it continues where the
        # checkpoint says it ended, as on every other replica (never at 0)
        for topic, queue_id, _, queue_max in checkpoint.queue_offsets:
            if queue_max > 0 and (topic, queue_id) not in state.queues:
                state.queue(topic, queue_id).restore_empty_at(queue_max)
    state.next_queue_offsets = {key: queue.max_offset for key, queue in state.queues.items()}
    state.apply_position.write(state.applied_raft_index, end)
    state.dirty_queues = set(state.queues.values())
    state.flushed_end = durable_end
    flush(state)
    # have the segment the next record goes to ready before the first append needs it
    state.commit_log.preallocate(state.commit_log.segment_start(end))


def undo_index_from(state: StoreState, index_from: int) -> bool:
    """Recovery: undo the key-index entries of records from ``index_from`` on (they are dispatched again),
    and check the file appends go on in. A file whose checksum fails before the undo, or that fails its
    checks after it, is rebuilt from the commit log up to ``index_from`` instead. False when such a file
    does not fit the files before it (the whole index must be rebuilt)."""
    damaged = state.index.undo_from(index_from)
    if damaged is not None and not rebuild_index_file(state, damaged[0], damaged[1], end=index_from):
        return False
    if state.index.files:
        last = state.index.files[-1]
        problem = file_problem(state.index, last)
        if problem is not None:
            return rebuild_index_file(state, last, problem, end=index_from)
    return True
