"""Pop consumption (RocketMQ 5.x): the replicated state and its pure transitions.

Per (group, topic, queue) the state holds a cursor (the next offset never handed out) and the in-flight
table: offset -> :class:`PopEntry` (invisible until, attempt, handle id). An offset below the cursor that
is not in the table is done (acknowledged, or dead-lettered). An entry whose ``handle_id`` is 0 was
revived: it is receivable again, with its attempt already counted.

The handle id of an entry is the Raft index of the command that gave it its current receipt handle (the
receive, or the last change of invisibility): every replica knows it, so after a failover a handle of the
old leader is honoured exactly when the entry still carries it, and is otherwise answered as invalid.

Every transition reads only its arguments and the table (no clock: times travel in the operations), and
is total: what cannot apply leaves the table as it was and says why (:attr:`PopOutcome.reason`).

Limits (constants of the command format: every member must apply the same ones):
:data:`POP_QUEUES_MAX` queues with pop state, :data:`POP_IN_FLIGHT_PER_QUEUE_MAX` entries per queue,
:data:`POP_RECEIVE_BATCH_MAX` offsets per receive.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Final

from dledger.command import PopAck, PopChangeInvisible, PopReceive, PopRevive

POP_QUEUES_MAX: Final = 65_536
POP_IN_FLIGHT_PER_QUEUE_MAX: Final = 1024
POP_RECEIVE_BATCH_MAX: Final = 64
#: the receipt handle's version prefix
HANDLE_PREFIX: Final = "rq1"

PopKey = tuple[str, str, int]  # (group, topic, queue id)


@dataclass(frozen=True, slots=True)
class PopEntry:
    invisible_until: int
    attempt: int
    #: Raft index of the command that issued the entry's current receipt handle; 0: revived (receivable)
    handle_id: int

    @property
    def revived(self) -> bool:
        return self.handle_id == 0


@dataclass
class PopQueue:
    cursor: int
    in_flight: dict[int, PopEntry] = field(default_factory=dict)

    def blocked(self) -> bool:
        """For a FIFO group: a message of the queue is in flight (handed out and not revived)."""
        return any(not entry.revived for entry in self.in_flight.values())


@dataclass(frozen=True, slots=True)
class PopGrant:
    offset: int
    attempt: int


@dataclass(frozen=True, slots=True)
class PopOutcome:
    """What a pop operation did: the receipt handle id it issued (receive, change of invisibility), the
    offsets it handed out, those it sent to the dead-letter queue; ``reason`` when it changed nothing."""

    handle_id: int = 0
    granted: tuple[PopGrant, ...] = ()
    dead_lettered: tuple[PopGrant, ...] = ()
    reason: str | None = None


PopQueues = dict[PopKey, PopQueue]


def encode_handle(queue_id: int, offset: int, handle_id: int) -> str:
    return f"{HANDLE_PREFIX}.{queue_id}.{offset}.{handle_id}"


def decode_handle(handle: str) -> tuple[int, int, int] | None:
    """(queue id, offset, handle id) of a receipt handle; None when it is not one of ours."""
    parts = handle.split(".")
    if len(parts) != 4 or parts[0] != HANDLE_PREFIX or not all(part.isdigit() for part in parts[1:]):
        return None
    queue_id, offset, handle_id = (int(part) for part in parts[1:])
    if queue_id >= 2**31 or offset >= 2**63 or not 0 < handle_id < 2**63:
        return None
    return queue_id, offset, handle_id


def _refused(reason: str) -> PopOutcome:
    return PopOutcome(reason=reason)


def apply_receive(queues: PopQueues, raft_index: int, operation: PopReceive) -> PopOutcome:
    key = (operation.group, operation.topic, operation.queue_id)
    offsets = operation.offsets
    if len(offsets) > POP_RECEIVE_BATCH_MAX:
        return _refused(f"{len(offsets)} offsets exceed the {POP_RECEIVE_BATCH_MAX} one receive may take")
    if any(later <= earlier for earlier, later in itertools.pairwise(offsets)):
        return _refused("receive offsets are not strictly ascending")
    if operation.start_offset < 0 or operation.scan_end < operation.start_offset:
        return _refused(f"bad scan [{operation.start_offset}, {operation.scan_end})")
    queue = queues.get(key)
    if queue is None:
        if len(queues) >= POP_QUEUES_MAX:
            return _refused(f"{POP_QUEUES_MAX} queues already have pop state")
        queue = PopQueue(operation.start_offset)
    if operation.fifo and queue.blocked():
        return _refused("FIFO queue blocked: a message of it is in flight")
    revived = sorted(offset for offset, entry in queue.in_flight.items() if entry.revived)
    # new offsets count only from the cursor the leader saw, and for FIFO only behind every revived one
    fresh = operation.start_offset == queue.cursor and not (
        operation.fifo and not set(revived).issubset(offsets))
    granted: list[PopGrant] = []
    cursor = operation.scan_end if fresh else queue.cursor
    for offset in offsets:
        entry = queue.in_flight.get(offset)
        if entry is not None:
            if entry.revived:
                granted.append(PopGrant(offset, entry.attempt))
            continue
        if not fresh or not operation.start_offset <= offset < operation.scan_end:
            continue
        if len(queue.in_flight) + sum(1 for grant in granted if grant.attempt == 1) >= POP_IN_FLIGHT_PER_QUEUE_MAX:
            cursor = offset  # the rest of the scan is read again once some are acknowledged
            break
        granted.append(PopGrant(offset, 1))
    if not granted and cursor == queue.cursor and key in queues:
        return _refused("nothing to hand out (taken by another receive, or in flight)")
    for grant in granted:
        queue.in_flight[grant.offset] = PopEntry(operation.invisible_until, grant.attempt, raft_index)
    queue.cursor = cursor
    queues[key] = queue
    return PopOutcome(raft_index, tuple(granted))


def _entry_for_handle(queues: PopQueues, key: PopKey, offset: int, handle_id: int) -> tuple[PopEntry | None, str]:
    queue = queues.get(key)
    entry = queue.in_flight.get(offset) if queue is not None else None
    if entry is None:
        return None, f"offset {offset} of {key} is not in flight (acknowledged, or never received)"
    if entry.revived or entry.handle_id != handle_id:
        return None, f"receipt handle {handle_id} of offset {offset} is stale (the message was redelivered)"
    return entry, ""


def apply_ack(queues: PopQueues, operation: PopAck) -> PopOutcome:
    key = (operation.group, operation.topic, operation.queue_id)
    entry, reason = _entry_for_handle(queues, key, operation.offset, operation.handle_id)
    if entry is None:
        return _refused(reason)
    del queues[key].in_flight[operation.offset]
    dead = (PopGrant(operation.offset, entry.attempt),) if operation.dead_letter else ()
    return PopOutcome(operation.handle_id, dead_lettered=dead)


def apply_change_invisible(queues: PopQueues, raft_index: int, operation: PopChangeInvisible) -> PopOutcome:
    key = (operation.group, operation.topic, operation.queue_id)
    entry, reason = _entry_for_handle(queues, key, operation.offset, operation.handle_id)
    if entry is None:
        return _refused(reason)
    handle_id = operation.handle_id if operation.keep_handle else raft_index
    queues[key].in_flight[operation.offset] = PopEntry(operation.invisible_until, entry.attempt, handle_id)
    return PopOutcome(handle_id, (PopGrant(operation.offset, entry.attempt),))


def plan_revive(queues: PopQueues, operation: PopRevive) -> tuple[list[PopGrant], list[PopGrant]]:
    """(entries to revive with their new attempt, entries to dead-letter) of a revive, changing nothing."""
    queue = queues.get((operation.group, operation.topic, operation.queue_id))
    revive: list[PopGrant] = []
    dead: list[PopGrant] = []
    if queue is None or operation.max_attempts < 1:
        return revive, dead
    for offset in operation.offsets:
        entry = queue.in_flight.get(offset)
        if entry is None or entry.revived or entry.invisible_until > operation.now:
            continue
        if entry.attempt >= operation.max_attempts:
            dead.append(PopGrant(offset, entry.attempt))
        else:
            revive.append(PopGrant(offset, entry.attempt + 1))
    return revive, dead


def plan_dead_letters(queues: PopQueues, operation: PopAck | PopRevive) -> list[PopGrant]:
    """The offsets an operation sends to the dead-letter queue, as applying it will decide (changing nothing)."""
    if isinstance(operation, PopRevive):
        return plan_revive(queues, operation)[1]
    if not operation.dead_letter:
        return []
    key = (operation.group, operation.topic, operation.queue_id)
    entry, _ = _entry_for_handle(queues, key, operation.offset, operation.handle_id)
    return [] if entry is None else [PopGrant(operation.offset, entry.attempt)]


def apply_revive(queues: PopQueues, operation: PopRevive) -> PopOutcome:
    if operation.max_attempts < 1:
        return _refused(f"max attempts {operation.max_attempts} is below 1")
    revive, dead = plan_revive(queues, operation)
    if not revive and not dead:
        return _refused("no entry to revive (acknowledged, revived, or still invisible)")
    queue = queues[(operation.group, operation.topic, operation.queue_id)]
    for grant in revive:
        queue.in_flight[grant.offset] = PopEntry(0, grant.attempt, 0)
    for grant in dead:
        del queue.in_flight[grant.offset]
    return PopOutcome(granted=tuple(revive), dead_lettered=tuple(dead))


def forget(queues: PopQueues, topic: str | None = None, group: str | None = None) -> None:
    """Drop the pop state of a deleted topic or group."""
    for key in [key for key in queues if key[1] == topic or key[0] == group]:
        del queues[key]


def due_entries(queues: PopQueues, now: int) -> Iterable[tuple[PopKey, list[int]]]:
    """(queue, in-flight offsets whose invisible time passed by ``now``) for the revive service; reads a
    copy of each table (the apply thread changes them)."""
    for key, queue in list(queues.items()):
        due = sorted(offset for offset, entry in dict(queue.in_flight).items()
                     if not entry.revived and entry.invisible_until <= now)
        if due:
            yield key, due
