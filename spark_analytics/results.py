"""Typed results of the checks: frozen dataclasses that turn into plain JSON for the report."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class RecordLocation:
    """What lies at a physical offset of one replica: the record (or filler, zero tail, damaged stretch)
    covering it, and for a message the field the byte belongs to."""

    replica: str
    physical_offset: int
    #: ``message``, ``filler``, ``end`` (the zero tail), ``invalid`` or ``missing`` (no such byte: the file is short)
    kind: str
    record_offset: int | None = None
    record_size: int | None = None
    topic: str | None = None
    queue_id: int | None = None
    queue_offset: int | None = None
    uniq_key: str | None = None
    field: str | None = None
    byte_in_record: int | None = None


@dataclass(frozen=True, slots=True)
class ByteDifference:
    """The first byte of a block where an outvoted replica differs from the majority (or, without a
    majority, from the first replica)."""

    physical_offset: int
    segment: int
    block_offset: int
    replica: str
    reference_replicas: tuple[str, ...]
    #: the reference's byte and the replica's (None when that replica's file ends before it)
    expected_byte: int | None
    actual_byte: int | None
    expected: RecordLocation | None
    actual: RecordLocation | None


@dataclass(frozen=True, slots=True)
class SegmentComparison:
    segment: int
    blocks_compared: int
    blocks_differing: int
    odd_replicas: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ReplicaExtent:
    """The physical range a replica holds: ``[min_offset, data_end)``."""

    replica: str
    min_offset: int
    data_end: int
    segment_files: int


@dataclass(frozen=True, slots=True)
class ByteEqualityResult:
    """Byte equality of the replicas' commit logs over ``[common_start, common_end)``, the range every
    replica holds. ``odd_replicas`` were outvoted in at least one block; blocks where no replica group had
    a majority are counted in ``blocks_without_majority`` (then every replica differing from the first is
    listed). ``hashed_by``: ``executors`` (the job read every byte and hashed it) or ``members`` (a live
    group's members each hashed their own blocks, read from their files when asked; the job read the bytes
    of differing blocks only, to find the first differing byte and its record)."""

    ok: bool
    replicas: tuple[str, ...]
    common_start: int
    common_end: int
    block_size_bytes: int
    bytes_compared_per_replica: int
    segments_compared: int
    segments_differing: int
    blocks_compared: int
    blocks_differing: int
    blocks_without_majority: int
    odd_replicas: tuple[str, ...]
    extents: tuple[ReplicaExtent, ...]
    differing_segments: tuple[SegmentComparison, ...]
    differences: tuple[ByteDifference, ...]
    notes: tuple[str, ...] = ()
    hashed_by: str = "executors"


@dataclass(frozen=True, slots=True)
class Violation:
    """One breach of an invariant, located as precisely as the invariant allows."""

    invariant: str
    replica: str
    physical_offset: int | None
    topic: str | None
    queue_id: int | None
    queue_offset: int | None
    detail: str


@dataclass(frozen=True, slots=True)
class InvariantResult:
    name: str
    description: str
    ok: bool
    violations: int
    examples: tuple[Violation, ...]


@dataclass(frozen=True, slots=True)
class ReplicaIntegrity:
    replica: str
    ok: bool
    messages: int
    fillers: int
    invalid_stretches: int
    data_end: int
    queues: int
    consume_queue_units: int
    invariants: tuple[InvariantResult, ...]

    def invariant(self, name: str) -> InvariantResult:
        return next(result for result in self.invariants if result.name == name)


@dataclass(frozen=True, slots=True)
class IntegrityResult:
    ok: bool
    replicas: tuple[ReplicaIntegrity, ...]
    #: what could not be checked, and why (e.g. a checkpoint that does not cover the log)
    notes: tuple[str, ...] = ()

    def replica(self, name: str) -> ReplicaIntegrity:
        return next(result for result in self.replicas if result.replica == name)


@dataclass(frozen=True, slots=True)
class UnitDifference:
    """A consume-queue position where a replica's unit differs from the majority's (``None``: no unit)."""

    topic: str
    queue_id: int
    queue_offset: int
    replica: str
    reference_replicas: tuple[str, ...]
    #: "physical offset P, size S, tag hash H"
    expected: str | None
    actual: str | None


@dataclass(frozen=True, slots=True)
class ConsumeQueueComparison:
    """The replicas' consume queues compared unit by unit for the records of ``[common_start, common_end)``
    (the commit-log range every replica holds): each replica must have the same unit at the same queue
    offset. Units are first compared as digests of ``bucket_units`` consecutive queue offsets; only
    differing buckets are read unit by unit."""

    ok: bool
    replicas: tuple[str, ...]
    common_start: int
    common_end: int
    queues_compared: int
    units_compared_per_replica: tuple[tuple[str, int], ...]
    bucket_units: int
    buckets_compared: int
    buckets_differing: int
    odd_replicas: tuple[str, ...]
    differences: tuple[UnitDifference, ...]
    notes: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class StateDifference:
    """A replicated-state entry (``section`` is the state's field, ``key`` the entry's key in it) on which
    ``replica`` differs from ``reference_replicas``, all at ``applied_index``; values as JSON text (None:
    the replica has no such entry)."""

    section: str
    key: str | None
    replica: str
    reference_replicas: tuple[str, ...]
    expected: str | None
    actual: str | None
    applied_index: int


@dataclass(frozen=True, slots=True)
class ReplicaStateSummary:
    replica: str
    #: why the checkpoint or its state cannot be read
    problem: str | None
    checkpoint_applied_index: int | None
    checkpoint_commit_log_end: int | None
    state_applied_index: int | None
    consumer_offsets: int
    topics: int
    timers: int


@dataclass(frozen=True, slots=True)
class ReplicatedStateResult:
    """The replicated state in the replicas' checkpoints: replicas at the same applied index (each group
    in ``groups_compared``) must agree entry by entry."""

    ok: bool
    replicas: tuple[ReplicaStateSummary, ...]
    groups_compared: tuple[tuple[str, ...], ...]
    odd_replicas: tuple[str, ...]
    differences_found: int
    differences: tuple[StateDifference, ...]
    notes: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class DerivedStateResult:
    """Cross-replica comparison of what is derived from the commit log or replicated beside it."""

    ok: bool
    consume_queues: ConsumeQueueComparison
    replicated_state: ReplicatedStateResult


@dataclass(frozen=True, slots=True)
class HistoryReplica:
    """One replica against the client history: a check per kind of finding (``lost``, ``duplicated``,
    ``offset_mismatch``, ``reordered``, ``delivered_not_stored``), each with its count and first examples."""

    replica: str
    ok: bool
    checks: tuple[InvariantResult, ...]

    def check(self, name: str) -> InvariantResult:
        return next(result for result in self.checks if result.name == name)


@dataclass(frozen=True, slots=True)
class HistoryResult:
    ok: bool
    history_file: str
    acknowledged_sends: int
    unknown_sends: int
    deliveries: int
    replicas: tuple[HistoryReplica, ...]

    def replica(self, name: str) -> HistoryReplica:
        return next(result for result in self.replicas if result.replica == name)


def to_json(result: Any) -> Any:
    """A dataclass result as JSON-ready dicts and lists."""
    return dataclasses.asdict(result)
