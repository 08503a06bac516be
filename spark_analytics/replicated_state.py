"""The replicated state each replica's checkpoint carries, read and compared on the driver (the files are
small: no Spark).

A replica's ``store/checkpoint`` holds its store positions and, as its extension, the state dledger
replicates besides messages (:class:`dledger.state.ReplicatedState`: consumer offsets, topic configs,
subscription groups, the leader stamp, the last store timestamp, timer and transaction progress), with
the Raft index it reflects. Replicas at rest may have applied different indexes (a follower that had
not heard of the last commit index yet), so only replicas at the same index must agree on everything; a
replica at another index is reported as lagging (or ahead), and only what cannot go backwards (timer
progress) is compared with it.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from commitlog.checkpoint import Checkpoint, decode_checkpoint, read_checkpoint
from commitlog.errors import CorruptionError
from dledger.state import ReplicatedState, StateError
from spark_analytics.equality import vote
from spark_analytics.layout import Replica
from spark_analytics.results import ReplicaStateSummary, ReplicatedStateResult, StateDifference

CHECKPOINT_NAME: Final = "checkpoint"
#: the timer-progress key of a delay level (broker/delay.py's level_key): ``level:<L>``
LEVEL_KEY_PREFIX: Final = "level:"
#: differences listed in the result (all are counted)
DIFFERENCES_MAX: Final = 20


@dataclass(frozen=True, slots=True)
class ReplicaCheckpoint:
    """What one replica's checkpoint says: ``problem`` when it cannot be read, ``state`` None when it
    carries no replicated state (a store written without dledger)."""

    replica: str
    checkpoint: Checkpoint | None
    state: ReplicatedState | None
    problem: str | None = None


def read_replica_checkpoint(replica: Replica) -> ReplicaCheckpoint:
    if replica.store_dir.startswith("raftmq://"):  # a live member's, over the network
        return _remote_checkpoint(replica)
    path = Path(replica.store_dir) / CHECKPOINT_NAME
    try:
        checkpoint = read_checkpoint(path)
    except CorruptionError as exc:
        return ReplicaCheckpoint(replica.name, None, None, f"{path} is damaged: {exc}")
    except OSError as exc:
        return ReplicaCheckpoint(replica.name, None, None, f"cannot read {path}: {exc.strerror}")
    if checkpoint is None or not checkpoint.extension:
        return ReplicaCheckpoint(replica.name, checkpoint, None)
    try:
        state = ReplicatedState.decode(checkpoint.extension)
    except StateError as exc:
        return ReplicaCheckpoint(replica.name, checkpoint, None, f"the replicated state in {path} is damaged: {exc}")
    return ReplicaCheckpoint(replica.name, checkpoint, state)


def _remote_checkpoint(replica: Replica) -> ReplicaCheckpoint:
    from spark_analytics.remote import RemoteError, read_path, state_path

    path = state_path(replica.store_dir, CHECKPOINT_NAME)
    try:
        raw = read_path(path)
    except RemoteError as exc:
        return ReplicaCheckpoint(replica.name, None, None, f"cannot read {path}: {exc}")
    try:
        checkpoint = decode_checkpoint(raw)
    except CorruptionError as exc:
        return ReplicaCheckpoint(replica.name, None, None, f"{path} is damaged: {exc}")
    if not checkpoint.extension:
        return ReplicaCheckpoint(replica.name, checkpoint, None)
    try:
        state = ReplicatedState.decode(checkpoint.extension)
    except StateError as exc:
        return ReplicaCheckpoint(replica.name, checkpoint, None, f"the replicated state in {path} is damaged: {exc}")
    return ReplicaCheckpoint(replica.name, checkpoint, state)


def covers_log(checkpoint: ReplicaCheckpoint, data_end: int) -> bool:
    """Whether the checkpoint's state describes the replica's whole commit log: the checkpoint ends where
    the data ends, and the state has applied at least the store's last index (apply updates the state
    after the store, and a flush may fall in between; a state ahead only applied state-only commands)."""
    return (checkpoint.checkpoint is not None and checkpoint.state is not None
            and checkpoint.checkpoint.commit_log_end == data_end
            and checkpoint.state.applied_index >= checkpoint.checkpoint.applied_raft_index)


def state_entries(state: ReplicatedState) -> dict[tuple[str, str], str]:
    """The state as (section, key) -> value text: one entry per consumer offset, topic, group, timer,
    transaction, and one for each single value. Fields are taken from the dataclass, so sections the
    state gains later are compared without changes here."""
    entries: dict[tuple[str, str], str] = {}
    for item in dataclasses.fields(state):
        if item.name == "applied_index":
            continue
        value = getattr(state, item.name)
        if isinstance(value, dict):
            for key, entry in value.items():
                entries[(item.name, _key_text(key))] = _value_text(entry)
        else:
            entries[(item.name, "")] = _value_text(value)
    return entries


def _key_text(key: Any) -> str:
    return "/".join(str(part) for part in key) if isinstance(key, tuple) else str(key)


def _value_text(value: Any) -> str:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return json.dumps(dataclasses.asdict(value), sort_keys=True)
    return json.dumps(value) if value is None or isinstance(value, bool | int | float | str) else repr(value)


def compare_states(checkpoints: Sequence[ReplicaCheckpoint],
                   differences_max: int = DIFFERENCES_MAX) -> ReplicatedStateResult:
    """Replicas at the same applied index must hold the same state: per entry, a majority vote among them
    names the odd replica. Timer progress never moves backwards, so a replica at a lower index must not be
    ahead of one at a higher index on any timer."""
    names = [checkpoint.replica for checkpoint in checkpoints]
    notes: list[str] = []
    differences: list[StateDifference] = []
    with_state = [c for c in checkpoints if c.state is not None]
    for checkpoint in checkpoints:
        if checkpoint.problem is None and checkpoint.state is None:
            notes.append(f"{checkpoint.replica} has no checkpoint" if checkpoint.checkpoint is None
                         else f"{checkpoint.replica}'s checkpoint carries no replicated state")
    by_index: dict[int, list[ReplicaCheckpoint]] = {}
    for checkpoint in with_state:
        assert checkpoint.state is not None
        by_index.setdefault(checkpoint.state.applied_index, []).append(checkpoint)
    groups = [tuple(c.replica for c in group) for _, group in sorted(by_index.items(), reverse=True)]
    if len(by_index) > 1:
        at = "; ".join(f"{', '.join(c.replica for c in group)} at {index}"
                       for index, group in sorted(by_index.items(), reverse=True))
        notes.append(f"the replicas' states are at different applied indexes ({at}): each is compared only with "
                     f"replicas at its index, and with the others on timer progress (which never goes back)")
    for group in by_index.values():
        if len(group) < 2:
            continue
        entries = {c.replica: state_entries(c.state) for c in group if c.state is not None}
        members = [c.replica for c in group]
        for section_key in sorted(set().union(*entries.values())):
            values: dict[str, Hashable] = {name: entries[name].get(section_key) for name in members}
            outcome = vote(values, members)
            for odd_replica in outcome.odd:
                reference = outcome.majority or (members[0],)
                differences.append(StateDifference(
                    section=section_key[0], key=section_key[1] or None, replica=odd_replica,
                    reference_replicas=reference, expected=entries[reference[0]].get(section_key),
                    actual=entries[odd_replica].get(section_key),
                    applied_index=group[0].state.applied_index if group[0].state is not None else 0))
    differences.extend(_timer_regressions(with_state))
    problems = {c.replica: c.problem for c in checkpoints if c.problem is not None}
    odd = tuple(name for name in names if name in problems or any(d.replica == name for d in differences))
    summaries = tuple(_summary(c) for c in checkpoints)
    return ReplicatedStateResult(
        ok=not differences and not problems, replicas=summaries, groups_compared=tuple(g for g in groups if len(g) > 1),
        odd_replicas=odd, differences_found=len(differences), differences=tuple(differences[:differences_max]),
        notes=tuple(notes))


def _timer_regressions(checkpoints: Sequence[ReplicaCheckpoint]) -> list[StateDifference]:
    found: list[StateDifference] = []
    states = [(c.replica, c.state) for c in checkpoints if c.state is not None]
    for behind_name, behind in states:
        for ahead_name, ahead in states:
            if behind.applied_index >= ahead.applied_index:
                continue
            for key, offset in sorted(behind.timer_progress.items()):
                later = ahead.timer_progress.get(key, 0)
                if offset > later:
                    found.append(StateDifference(
                        section="timer_progress", key=key, replica=behind_name, reference_replicas=(ahead_name,),
                        expected=f"at most {later} (as at index {ahead.applied_index})", actual=str(offset),
                        applied_index=behind.applied_index))
    return found


def _summary(checkpoint: ReplicaCheckpoint) -> ReplicaStateSummary:
    state, stored = checkpoint.state, checkpoint.checkpoint
    return ReplicaStateSummary(
        replica=checkpoint.replica,
        problem=checkpoint.problem,
        checkpoint_applied_index=stored.applied_raft_index if stored is not None else None,
        checkpoint_commit_log_end=stored.commit_log_end if stored is not None else None,
        state_applied_index=state.applied_index if state is not None else None,
        consumer_offsets=len(state.consumer_offsets) if state is not None else 0,
        topics=len(state.topics) if state is not None else 0,
        timers=len(state.timer_progress) if state is not None else 0,
    )


def read_checkpoints(replicas: Sequence[Replica]) -> list[ReplicaCheckpoint]:
    return [read_replica_checkpoint(replica) for replica in replicas]


def check_replicated_state(replicas: Sequence[Replica]) -> ReplicatedStateResult:
    return compare_states(read_checkpoints(replicas))


def delay_progress_of(timer_progress: Mapping[str, int]) -> dict[int, int]:
    """Delay levels' progress from a replicated state's timer progress (other timers are left out)."""
    levels: dict[int, int] = {}
    for key, offset in timer_progress.items():
        if key.startswith(LEVEL_KEY_PREFIX) and key[len(LEVEL_KEY_PREFIX):].isdigit():
            levels[int(key[len(LEVEL_KEY_PREFIX):])] = offset
    return levels


def delay_progress(checkpoints: Sequence[ReplicaCheckpoint], data_ends: Mapping[str, int]) -> dict[str, dict[int, int]]:
    """Delay levels' progress of the replicas whose checkpoint covers their whole log."""
    return {c.replica: delay_progress_of(c.state.timer_progress) for c in checkpoints
            if c.state is not None and c.replica in data_ends and covers_log(c, data_ends[c.replica])}
