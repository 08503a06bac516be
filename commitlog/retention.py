"""Retention as a replicated command: whole commit-log segments below an offset the leader chose are
deleted, and the derived files pruned to match."""

from __future__ import annotations

from commitlog.flush import flush_or_stop
from commitlog.outcomes import AppendOutcome
from commitlog.state import StoreState


def delete_below(state: StoreState, raft_index: int, physical_offset: int) -> AppendOutcome:
    """Retention as a replicated command: delete whole segments below ``physical_offset`` (chosen by the
    leader, never by a local clock) and prune the derived files to match. Idempotent by Raft index."""
    with state.lock:
        if raft_index <= state.applied_raft_index:
            return AppendOutcome(raft_index, False)
        state.commit_log.delete_below(physical_offset)
        state.min_offset = max(state.min_offset, state.commit_log.min_offset)
        for queue in state.queues.values():
            queue.prune_below(state.min_offset)
        state.index.prune_below(state.min_offset)
        state.mark_applied(raft_index, state.commit_log.end_offset)
    flush_or_stop(state, "flush after apply")
    return AppendOutcome(raft_index, True)
