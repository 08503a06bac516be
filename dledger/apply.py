"""The deterministic, total, idempotent apply: ``apply(raft_index, command_bytes) -> ApplyResult``.

Rules (what keeps every replica byte-identical):

* It reads nothing but its arguments, the store and the replicated state: no clock, no randomness.
* One way in, on every member: the decoded command. The leader applies the command it built for its own
  entry (``dledger.member.BuiltCommands``), which is what the followers decode from the entry's bytes.
* It is idempotent by Raft index, per kind of effect: commit-log effects are skipped when the store has
  already applied the index (the store knows that exactly, even after a crash), state effects when the
  state has (it is persisted with the store's checkpoint, so after a crash it may lag the store, and
  replayed entries re-apply exactly what it lost).
* It is total: a command that cannot be decoded or applied is recorded as a no-op with a reason. It never
  raises into pysyncobj's tick thread, where an exception would stall the replica forever. A full disk
  blocks it (retrying) rather than skipping a command, which would make this replica diverge.
* One configuration of the bytes: the store settings that shape stored bytes (``dledger.command.ByteConfig``)
  are the group's, fixed by the first BYTE_CONFIG applied. A member whose own settings differ raises
  :class:`ByteConfigMismatchError` before it writes anything for that entry, and its member stops
  (:data:`EXIT_BYTE_CONFIG_MISMATCH`): it never applies with other settings than the group's.
* It decides nothing from local bytes it has not verified: the stored records it reads (timers it releases,
  messages a send may be a retry of) are checked first (``MessageStore.query_by_key(verified=True)``,
  ``find_recent_sends``). A damaged one is put back from a peer's copy (``repair``) and read again before
  anything is written; when that fails, :class:`commitlog.store.DamagedRecordError` stops the member
  (``EXIT_DAMAGED_RECORD``), and on restart the replayed entry tries the repair again. Those two errors are
  the only ones it raises: each stops the member rather than let it decide differently from the others.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Final, TypeVar

from commitlog.errors import DamagedRecordError, DiskFullError
from commitlog.message import MessageInput
from commitlog.outcomes import AppendOutcome, AppendResult
from commitlog.record_codec import RecordError, StoredMessage, decode_record
from commitlog.records import PreparedRecords, check_layout
from commitlog.retries import KeyCollision
from commitlog.store import MessageStore
from dledger.command import (
    TIMER_RELEASE_KEY,
    AclDocument,
    ByteConfig,
    Command,
    CommandError,
    ConsumerOffsets,
    LeaderStamp,
    Messages,
    PopAck,
    PopChangeInvisible,
    PopReceive,
    PopRevive,
    Retention,
    SubscriptionGroup,
    TimerProgress,
    TimerRelease,
    TopicConfig,
    TransactionAction,
    TransactionOp,
    decode_command,
)
from dledger.dedupe import KeyedSends, Lookup, find_retries, message_sends, record_sends
from dledger.pop import (
    PopGrant,
    PopOutcome,
    apply_ack,
    apply_change_invisible,
    apply_receive,
    apply_revive,
    plan_dead_letters,
)
from dledger.state import ReplicatedState
from dledger.timers import (
    TIMER_PROGRESS_KEY,
    TIMER_SECOND_MAX,
    release_due,
    release_late,
    starting_progress,
    timer_key,
)
from protocol.properties import (
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_DLQ_ORIGIN_MESSAGE_ID,
    PROPERTY_DLQ_ORIGIN_TOPIC,
    PROPERTY_ORIGIN_MESSAGE_ID,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_RETRY_TOPIC,
    PROPERTY_UNIQ_KEY,
    encode_properties,
)
from protocol.topics import DLQ_PREFIX, TIMER_TOPIC, TRANS_HALF_TOPIC

log = logging.getLogger(__name__)

#: how many no-op reasons are kept for status pages
NOOP_HISTORY_MAX = 100
DISK_FULL_RETRY_SECONDS = 1.0
#: the topic of transaction half messages (queue 0); its queue offsets name the halves
#: a send whose topic, UNIQ_KEY, reconsume count and content (commitlog.retries) match a message stored this
#: recently is a client's retry and is not stored again (its answer is the stored message's). Part of apply:
#: every member must use the same value, so it is a constant of the command format, not a setting.
UNIQ_KEY_WINDOW_MS = 120_000
#: the exit code of a member whose byte configuration is not the group's (EX_CONFIG)
EXIT_BYTE_CONFIG_MISMATCH: Final = 78
_Read = TypeVar("_Read")


class ByteConfigMismatchError(Exception):
    """This member's settings that shape stored bytes are not the group's: it must stop before it writes
    anything with them. The message names each setting that differs, ours and the group's."""

    def __init__(self, ours: ByteConfig, group: ByteConfig, source: str = "the group's configuration") -> None:
        differences = "; ".join(f"{name}: ours {_shown(mine)}, the group's {_shown(theirs)}"
                                for name, mine, theirs in ours.differences(group))
        super().__init__(f"this member's [store] settings differ from {source}: {differences}. They shape the "
                         "stored bytes, which must be the same on every member: this member stores nothing with "
                         "them. Set them to the group's values (the [store] table of its TOML file) and start it "
                         "again")
        self.ours = ours
        self.group = group


def _shown(value: str | None) -> str:
    return "(none)" if value is None else value


def check_byte_config(ours: ByteConfig, group: ByteConfig | None,
                      source: str = "the group's configuration") -> None:
    """:class:`ByteConfigMismatchError` when ``group`` (the group's byte configuration, if known) is not ours."""
    if group is not None and ours.differences(group):
        raise ByteConfigMismatchError(ours, group, source)


@dataclass(frozen=True, slots=True)
class ApplyResult:
    """What the leader hands back to the callers of a command."""

    raft_index: int
    #: one tuple of results per Messages operation, in order (empty when already applied)
    message_results: tuple[Sequence[AppendResult], ...] = ()
    #: why the command was a no-op, if it was
    noop_reason: str | None = None
    already_applied: bool = False
    #: one outcome per pop operation, in order (empty when already applied)
    pop_results: tuple[PopOutcome, ...] = ()


class StateMachine:
    def __init__(
        self,
        store: MessageStore,
        state: ReplicatedState,
        sleep: Callable[[float], None] = time.sleep,
        state_lock: AbstractContextManager[object] | None = None,
        repair: Callable[[int], None] | None = None,
    ) -> None:
        """``repair(physical_offset)`` puts a damaged committed record back from a peer's copy (raising
        when it cannot): a verified read that finds one calls it, then reads again. Without it a damaged
        record stops the member at once (:class:`DamagedRecordError` out of :meth:`apply`)."""
        self.store = store
        self.state = state
        self.sleep = sleep
        self.repair = repair
        #: this member's own settings that shape stored bytes: the group's must be the same
        self.byte_config = ByteConfig.of(store.config)
        #: held around every change to the state, and by whoever reads it from another thread (the store's
        #: flush encodes it into the checkpoint): a reader sees an index's state changes whole or not at all.
        #: Nothing that takes a store lock runs under it (a flush holds those while it encodes the state).
        self.state_lock: AbstractContextManager[object] = state_lock if state_lock is not None else threading.Lock()
        self.noops: deque[tuple[int, str]] = deque(maxlen=NOOP_HISTORY_MAX)
        #: sends whose UNIQ_KEY matched a recent message's but whose content did not, stored as new messages
        #: (commitlog.retries): ids that repeat by accident, which a dedupe by key alone would have lost
        self.key_collisions = 0

    @property
    def applied_index(self) -> int:
        return max(self.store.applied_raft_index, self.state.applied_index)

    def apply(self, raft_index: int, data: bytes, decoded: Command | None = None,
              want_results: bool = True) -> ApplyResult:
        """Apply the command at ``raft_index``. Never raises for anything a command can contain.

        ``decoded`` is ``decode_command(data)`` when the caller has it already: the leader keeps the commands
        it built for its own entries (``dledger.member.BuiltCommands``), so it need not decode them again;
        ``data`` is not read then. Either way the same decoded command goes the one way below, on the leader
        as on the followers. ``want_results``: make the per-message results of records (whoever proposed the
        entry waits for them; nobody waits for a follower's).

        Raises only to stop the member, before anything of the entry is written: :class:`ByteConfigMismatchError`
        (a BYTE_CONFIG that makes the group's settings other than ours) and :class:`DamagedRecordError` (a
        stored record it must read is damaged and could not be repaired)."""
        if raft_index <= self.store.applied_raft_index and raft_index <= self.state.applied_index:
            return ApplyResult(raft_index, already_applied=True)
        if decoded is None:
            try:
                decoded = decode_command(data)
            except CommandError as exc:
                return self._noop(raft_index, f"undecodable command: {exc}")
        return self._apply_command(raft_index, decoded, want_results)

    def _apply_command(self, raft_index: int, command: Command, want_results: bool) -> ApplyResult:
        if any(isinstance(operation, PreparedRecords) for operation in command.operations):
            (batch, *others) = command.operations
            if others or not isinstance(batch, PreparedRecords):
                return self._noop(raft_index, "records travel alone in a command")
            problem = self._records_problem(batch)
            if problem is not None:
                return self._noop(raft_index, f"inconsistent records: {problem}")
            return self._apply_records(raft_index, batch, want_results)
        state_due = raft_index > self.state.applied_index
        if state_due:
            for operation in command.operations:
                if isinstance(operation, ByteConfig):
                    # the first one applied is the group's; ours must be the same, or nothing is written
                    group = self.state.byte_config if self.state.byte_config is not None else operation
                    check_byte_config(self.byte_config, group)
        timer_advance: int | None = None
        timer_start: int | None = None
        messages: list[MessageInput] = []
        message_ops: list[int] = []
        for operation in command.operations:
            if (isinstance(operation, TransactionOp) and operation.action != TransactionAction.CHECK and state_due
                    and not self.state.transaction_pending(
                        operation.half_offset, self.store.max_queue_offset(TRANS_HALF_TOPIC, 0))):
                # a second END_TRANSACTION (or a check-back racing a commit): the whole command is a no-op
                resolved = self.state.transactions_resolved.get(operation.half_offset)
                return self._noop(raft_index, f"transaction half {operation.half_offset} is not pending"
                                              + (f" (resolved: {resolved})" if resolved else ""))
            if isinstance(operation, Messages):
                message_ops.append(len(operation.messages))
                messages.extend(operation.messages)
            elif isinstance(operation, TimerRelease) and state_due:
                released, timer_advance = release_due(
                    operation, self.state.timer_progress.get(TIMER_PROGRESS_KEY), self.state.last_store_timestamp,
                    self._stored_timers)
                message_ops.append(len(released))
                messages.extend(released)
            elif isinstance(operation, PopAck | PopRevive) and state_due:
                dead = self._dead_letter_messages(operation)
                message_ops.append(len(dead))
                messages.extend(dead)
        floor = self.state.last_store_timestamp
        to_store: Sequence[MessageInput] = messages
        if any(message.store_timestamp < floor for message in messages):
            # store timestamps never decrease in log order, whatever clocks past leaders had
            to_store = [m if m.store_timestamp >= floor else m._replace(store_timestamp=floor) for m in messages]
        newest = max(message.store_timestamp for message in to_store) if to_store else None
        if newest is not None and state_due:
            progress = self.state.timer_progress.get(TIMER_PROGRESS_KEY)
            if progress is None:  # the first messages ever
                progress = timer_start = starting_progress(newest)
            to_store = release_late(progress, to_store)
        results: tuple[Sequence[AppendResult], ...] = ()
        if newest is not None and raft_index > self.store.applied_raft_index:
            duplicates = self._retries(message_sends(to_store), newest - UNIQ_KEY_WINDOW_MS)
            fresh = [m for position, m in enumerate(to_store) if position not in duplicates] if duplicates else to_store
            outcome = self._until_space(raft_index, functools.partial(self.store.append, raft_index, fresh))
            flat = self._merge(outcome.results, duplicates, len(to_store)) if duplicates else outcome.results
            split = []
            position = 0
            for count in message_ops:
                split.append(flat[position : position + count])
                position += count
            results = tuple(split)
        pop_results: list[PopOutcome] = []
        if state_due:
            for operation in command.operations:
                if isinstance(operation, Retention) and raft_index > self.store.applied_raft_index:
                    # a commit-log effect: outside the state lock (it takes the store's locks)
                    self.store.delete_below(raft_index, operation.min_physical_offset)
            with self.state_lock:
                if timer_start is not None:
                    self.state.apply_timer_progress(TIMER_PROGRESS_KEY, timer_start)
                if timer_advance is not None:
                    self.state.apply_timer_progress(TIMER_PROGRESS_KEY, timer_advance)
                for operation in command.operations:
                    if isinstance(operation, PopReceive | PopAck | PopChangeInvisible | PopRevive):
                        pop_results.append(self._apply_pop(raft_index, operation))
                    else:
                        self._apply_state(operation)
                if newest is not None:
                    self.state.last_store_timestamp = max(self.state.last_store_timestamp, newest)
                self.state.applied_index = raft_index
        return ApplyResult(raft_index, results, pop_results=tuple(pop_results))

    def _stored_timers(self, second: int) -> list[StoredMessage]:
        """The stored timers due at ``second``, verified: a timer's stored bytes become a new message when it
        is released, and decide whether it is one."""
        return self._read_verified(functools.partial(self.store.query_by_key, TIMER_TOPIC, timer_key(second),
                                                     TIMER_SECOND_MAX, verified=True))

    def _apply_pop(self, raft_index: int, operation: PopReceive | PopAck | PopChangeInvisible | PopRevive
                   ) -> PopOutcome:
        """A pop operation's effect on the state (dledger.pop), under the state lock."""
        queues = self.state.pop_queues
        match operation:
            case PopReceive():
                return apply_receive(queues, raft_index, operation)
            case PopAck():
                return apply_ack(queues, operation)
            case PopChangeInvisible():
                return apply_change_invisible(queues, raft_index, operation)
            case PopRevive():
                return apply_revive(queues, operation)

    def _dead_letter_messages(self, operation: PopAck | PopRevive) -> list[MessageInput]:
        """The dead-letter copies of the messages ``operation`` will send to the group's dead-letter queue
        (decided from the state before the command, as applying it will decide). Read from the store, which
        holds the same committed records on every replica; a record retention already deleted has none."""
        dead = plan_dead_letters(self.state.pop_queues, operation)
        store_timestamp = operation.now if isinstance(operation, PopRevive) else operation.timestamp
        copies = []
        for grant in dead:
            stored = self._read_verified(functools.partial(self._read_pop_message, operation.topic,
                                                           operation.queue_id, grant.offset))
            if stored is not None:
                copies.append(dead_letter_copy(stored, operation.group, grant, store_timestamp))
        return copies

    def _read_pop_message(self, topic: str, queue_id: int, offset: int) -> StoredMessage | None:
        result = self.store.get_messages(topic, queue_id, offset, 1)
        if not result.messages or result.queue_offsets[0] != offset:
            return None
        raw = result.messages[0]
        try:
            return decode_record(raw, check_crc=True)
        except RecordError as exc:
            try:
                physical_offset = decode_record(raw, check_crc=False).physical_offset
            except RecordError:
                physical_offset = -1
            raise DamagedRecordError(physical_offset, f"the record of {topic}/{queue_id} at queue offset "
                                                      f"{offset}: {exc}") from exc

    def _records_problem(self, batch: PreparedRecords) -> str | None:
        """Why a Records operation cannot apply: its layout (``check_layout``), or a store host other than the
        group's (the records carry the leader's, which must be the group's). Read only from the command and the
        replicated state: every replica finds the same."""
        problem = check_layout(batch)
        if problem is None and self.state.byte_config is not None:
            group_host = self.state.byte_config.store_host_bytes
            if group_host is not None and batch.store_host != group_host:
                problem = f"store host {batch.store_host.hex()} is not the group's ({group_host.hex()})"
        return problem

    def _read_verified(self, read: Callable[[], _Read]) -> _Read:
        """``read()``, a store read that verifies the records it uses; each damaged record it meets is put
        back from a peer's copy, then the read is made again. It has written nothing, so making it again
        is safe. :class:`DamagedRecordError` when there is no repair, or the repair fails or does not hold."""
        repaired: set[int] = set()
        while True:
            try:
                return read()
            except DamagedRecordError as exc:
                offset = exc.physical_offset
                if self.repair is None or offset in repaired:
                    raise
                log.critical("%s: apply needs it, repairing it from a peer before deciding anything", exc)
                try:
                    self.repair(offset)
                except Exception as repair_error:
                    raise DamagedRecordError(offset, f"{exc} (and no peer could repair it: {repair_error})") \
                        from repair_error
                repaired.add(offset)

    def _apply_records(self, raft_index: int, batch: PreparedRecords, want_results: bool) -> ApplyResult:
        """A Records operation (plain messages laid out by the leader: no timers, no transactions)."""
        store_timestamp = max(batch.store_timestamp, self.state.last_store_timestamp)
        results: tuple[Sequence[AppendResult], ...] = ()
        if batch.record_count and raft_index > self.store.applied_raft_index:
            duplicates = self._retries(record_sends(batch, self.store, store_timestamp - UNIQ_KEY_WINDOW_MS),
                                       store_timestamp - UNIQ_KEY_WINDOW_MS)
            outcome = self._until_space(raft_index, functools.partial(
                self.store.append_records, raft_index, batch, duplicates, store_timestamp, want_results))
            if want_results:
                results = (self._merge(outcome.results, duplicates, batch.record_count) if duplicates
                           else outcome.results,)
        if raft_index > self.state.applied_index:
            with self.state_lock:
                if batch.record_count:
                    if self.state.timer_progress.get(TIMER_PROGRESS_KEY) is None:  # the first messages ever
                        self.state.apply_timer_progress(TIMER_PROGRESS_KEY, starting_progress(store_timestamp))
                    self.state.last_store_timestamp = max(self.state.last_store_timestamp, store_timestamp)
                self.state.applied_index = raft_index
        return ApplyResult(raft_index, results)

    def _retries(self, sends: KeyedSends, since_timestamp: int) -> dict[int, AppendResult | int]:
        """:func:`dledger.dedupe.find_retries` against this store (its reads verified), counting and logging
        the key collisions in :attr:`key_collisions`."""
        duplicates, collisions = find_retries(sends, since_timestamp, self._find_recent_sends)
        for topic, uniq_key in collisions:
            self.key_collisions += 1
            log.warning("UNIQ_KEY %s of topic %s is a recent message's too, with other content: stored as a "
                        "new message (%d such sends)", uniq_key.decode("utf-8", "replace"), topic,
                        self.key_collisions)
        return duplicates

    def _find_recent_sends(self, lookups: list[Lookup], since_timestamp: int
                           ) -> list[AppendResult | KeyCollision | None]:
        return self._read_verified(functools.partial(self.store.find_recent_sends, lookups, since_timestamp))

    def _until_space(self, raft_index: int, append: Callable[[], AppendOutcome]) -> AppendOutcome:
        """``append()`` (a store append of the entry at ``raft_index``), again and again while the disk is
        full. Skipping would diverge from the other replicas: wait for space (an operator, or retention once
        this node can apply again). The group keeps going on the other members."""
        while True:
            try:
                return append()
            except DiskFullError as exc:
                log.error("disk full applying index %d, retrying in %.0f s: %s", raft_index,
                          DISK_FULL_RETRY_SECONDS, exc)
                self.sleep(DISK_FULL_RETRY_SECONDS)

    @staticmethod
    def _merge(stored: Sequence[AppendResult], duplicates: dict[int, AppendResult | int],
               count: int) -> tuple[AppendResult, ...]:
        merged: list[AppendResult] = []
        fresh = iter(stored)
        for position in range(count):
            duplicate = duplicates.get(position)
            if duplicate is None:
                merged.append(next(fresh))
            elif isinstance(duplicate, int):
                merged.append(merged[duplicate])
            else:
                merged.append(duplicate)
        return tuple(merged)

    def _apply_state(self, operation: object) -> None:
        """The state effect of one operation (under the state lock; a Retention's effect is on the store)."""
        match operation:
            case ConsumerOffsets(offsets):
                self.state.apply_offsets(offsets)
            case TopicConfig():
                self.state.apply_topic(operation)
            case SubscriptionGroup():
                self.state.apply_group(operation)
            case LeaderStamp():
                self.state.leader_stamp = operation
            case Retention():
                pass
            case TimerProgress(key, delivered_up_to):
                self.state.apply_timer_progress(key, delivered_up_to)
            case TimerRelease():
                # the release's own effect is the timer progress (apply, above); replicas have always kept its
                # value under its wire key too, and the state's bytes must stay what they were
                self.state.apply_timer_progress(TIMER_RELEASE_KEY, operation.packed)
            case TransactionOp(half, action):
                if action == TransactionAction.CHECK:
                    self.state.count_transaction_check(half)
                else:
                    self.state.resolve_transaction(half, action)
            case AclDocument(document):
                self.state.acl_document = document
            case ByteConfig():
                if not self.state.apply_byte_config(operation) and self.state.byte_config != operation:
                    log.warning("a later byte configuration changes nothing (the group's is the first "
                                "applied): %s", operation.settings)
            case Messages():
                pass

    def _noop(self, raft_index: int, reason: str) -> ApplyResult:
        log.warning("index %d applied as a no-op: %s", raft_index, reason)
        self.noops.append((raft_index, reason))
        # the store records the index too: a refusal that depended on the state (a transaction half no longer
        # pending) cannot be decided again when the entry is replayed after a restart whose checkpoint has the
        # state at this index and the store before it; apply would then store the refused command's messages
        self.store.mark_applied(raft_index)
        if raft_index > self.state.applied_index:
            with self.state_lock:
                self.state.applied_index = raft_index
        return ApplyResult(raft_index, noop_reason=reason)


def dead_letter_copy(stored: StoredMessage, group: str, grant: PopGrant, store_timestamp: int) -> MessageInput:
    """The message a popped one becomes in ``group``'s dead-letter queue after ``grant.attempt`` deliveries
    (as a 4.x consumer's send-back to the dead-letter queue stores it)."""
    properties = stored.property_map
    properties.setdefault(PROPERTY_RETRY_TOPIC, stored.topic)
    properties.setdefault(PROPERTY_ORIGIN_MESSAGE_ID, properties.get(PROPERTY_UNIQ_KEY) or stored.msg_id)
    properties[PROPERTY_DLQ_ORIGIN_TOPIC] = stored.topic
    properties[PROPERTY_DLQ_ORIGIN_MESSAGE_ID] = properties[PROPERTY_ORIGIN_MESSAGE_ID]
    for name in (PROPERTY_DELAY_TIME_LEVEL, PROPERTY_REAL_TOPIC, PROPERTY_REAL_QUEUE_ID):
        properties.pop(name, None)
    return MessageInput(f"{DLQ_PREFIX}{group}", 0, stored.flag, stored.sys_flag & ~0x30, stored.born_timestamp,
                        stored.born_host, store_timestamp, stored.reconsume_times + grant.attempt,
                        stored.prepared_transaction_offset, stored.body, encode_properties(properties))
