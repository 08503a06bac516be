"""The deterministic, total, idempotent apply: ``apply(raft_index, command_bytes) -> ApplyResult``.

Rules (what keeps every replica byte-identical):

* It reads nothing but its arguments, the store and the replicated state: no clock, no randomness.
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
import itertools
import logging
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Final, TypeVar

import numpy as np

from commitlog.errors import DiskFullError
from commitlog.message import MessageInput, RecordError, StoredMessage, decode_record
from commitlog.records import (
    HAS_UNIQ_KEY,
    HASH_DTYPE,
    PreparedRecords,
    check_layout,
    columnwise,
    hash_list,
    layout_of,
    meta_list,
    uniq_key_of,
)
from commitlog.retries import KeyCollision, retry_digest
from commitlog.store import AppendOutcome, AppendResult, DamagedRecordError, MessageStore
from dledger.command import (
    AclDocument,
    ByteConfig,
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
    TopicConfig,
    TransactionAction,
    TransactionOp,
    decode_command,
)
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
from dledger.timers import TIMER_PROGRESS_KEY, release, timer_due_second, timer_key
from protocol.properties import encode_properties
from protocol.topics import DLQ_PREFIX, TIMER_TOPIC, TRANS_HALF_TOPIC

log = logging.getLogger(__name__)

#: the leader's own entry: the messages it proposed and the store timestamp it stamped them with, or the
#: records it laid them out as
OwnBatch = tuple[Sequence[MessageInput], int] | PreparedRecords
#: how many no-op reasons are kept for status pages
NOOP_HISTORY_MAX = 100
DISK_FULL_RETRY_SECONDS = 1.0
#: the topic of transaction half messages (queue 0); its queue offsets name the halves
#: a send whose topic, UNIQ_KEY, reconsume count and content (commitlog.retries) match a message stored this
#: recently is a client's retry and is not stored again (its answer is the stored message's). Part of apply:
#: every member must use the same value, so it is a constant of the command format, not a setting.
UNIQ_KEY_WINDOW_MS = 120_000
#: TimerProgress(TIMER_DELIVER_KEY, second * TIMER_CURSOR_SCALE + start) releases due timers (dledger.timers)
TIMER_DELIVER_KEY = "timer-deliver"
TIMER_CURSOR_SCALE = 1_000_000
#: timers one operation releases at most, and timers one second may hold at most
TIMER_RELEASE_MAX = 256
TIMER_SECOND_MAX = TIMER_CURSOR_SCALE - 1
#: seconds one operation may cover (an idle stretch is covered in steps)
TIMER_SPAN_MAX_SECONDS = 3600
_UNIQ_KEY_PROPERTY = re.compile(rb"(?:^|\x02)UNIQ_KEY\x01([^\x02]+)")
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

    def apply(self, raft_index: int, data: bytes, own: OwnBatch | None = None) -> ApplyResult:
        """Apply the command at ``raft_index``. Never raises for anything a command can contain.

        ``own`` is the leader's shortcut for an entry it proposed itself: the messages and the store
        timestamp it encoded into ``data``, so the command need not be decoded again. It must describe
        exactly the entry (one Messages operation, every message stamped with the timestamp): the result
        is then byte for byte what decoding gives on the followers. ``data`` is not read then.

        Raises only to stop the member, before anything of the entry is written: :class:`ByteConfigMismatchError`
        (a BYTE_CONFIG that makes the group's settings other than ours) and :class:`DamagedRecordError` (a
        stored record it must read is damaged and could not be repaired)."""
        if raft_index <= self.store.applied_raft_index and raft_index <= self.state.applied_index:
            return ApplyResult(raft_index, already_applied=True)
        timer_advance: int | None = None
        timer_start: int | None = None
        if isinstance(own, PreparedRecords):
            problem = self._records_problem(own)  # as the followers check it: every replica takes the same branch
            if problem is not None:
                return self._noop(raft_index, f"inconsistent records: {problem}")
            return self._apply_records(raft_index, own, want_results=True)
        if own is not None:
            messages, stamp = own
            command = None
            message_ops = [len(messages)]
        else:
            try:
                command = decode_command(data)
            except CommandError as exc:
                return self._noop(raft_index, f"undecodable command: {exc}")
            if any(isinstance(operation, PreparedRecords) for operation in command.operations):
                (batch, *others) = command.operations
                if others or not isinstance(batch, PreparedRecords):
                    return self._noop(raft_index, "records travel alone in a command")
                problem = self._records_problem(batch)
                if problem is not None:
                    return self._noop(raft_index, f"inconsistent records: {problem}")
                return self._apply_records(raft_index, batch, want_results=False)
            if raft_index > self.state.applied_index:
                for operation in command.operations:
                    if isinstance(operation, ByteConfig):
                        # the first one applied is the group's; ours must be the same, or nothing is written
                        group = self.state.byte_config if self.state.byte_config is not None else operation
                        check_byte_config(self.byte_config, group)
            messages = []
            message_ops = []
            for operation in command.operations:
                if (isinstance(operation, TransactionOp) and operation.action != TransactionAction.CHECK
                        and raft_index > self.state.applied_index
                        and not self.state.transaction_pending(
                            operation.half_offset, self.store.max_queue_offset(TRANS_HALF_TOPIC, 0))):
                    # a second END_TRANSACTION (or a check-back racing a commit): the whole command is a no-op
                    resolved = self.state.transactions_resolved.get(operation.half_offset)
                    return self._noop(raft_index, f"transaction half {operation.half_offset} is not pending"
                                                  + (f" (resolved: {resolved})" if resolved else ""))
                if isinstance(operation, Messages):
                    message_ops.append(len(operation.messages))
                    messages.extend(operation.messages)
                elif (isinstance(operation, TimerProgress) and operation.timer_key == TIMER_DELIVER_KEY
                      and raft_index > self.state.applied_index):
                    released, timer_advance = self._release_timers(operation.delivered_up_to)
                    message_ops.append(len(released))
                    messages.extend(released)
                elif isinstance(operation, PopAck | PopRevive) and raft_index > self.state.applied_index:
                    dead = self._dead_letter_messages(operation)
                    message_ops.append(len(dead))
                    messages.extend(dead)
            stamp = None
        floor = self.state.last_store_timestamp
        if stamp is not None:
            stamp = max(stamp, floor)
        elif any(message.store_timestamp < floor for message in messages):
            # store timestamps never decrease in log order, whatever clocks past leaders had
            messages = [m if m.store_timestamp >= floor else m._replace(store_timestamp=floor) for m in messages]
        if messages and raft_index > self.state.applied_index:
            timer_start, messages = self._release_late_timers(messages, stamp)
        results: tuple[Sequence[AppendResult], ...] = ()
        if messages and raft_index > self.store.applied_raft_index:
            window_end = stamp if stamp is not None else max(message.store_timestamp for message in messages)
            fresh, duplicates = self._split_duplicates(messages, window_end - UNIQ_KEY_WINDOW_MS)
            if duplicates:
                outcome = self._append(raft_index, fresh, stamp)
                flat: Sequence[AppendResult] = self._merge(outcome.results, duplicates, len(messages))
            else:
                flat = self._append(raft_index, messages, stamp).results
            split = []
            position = 0
            for count in message_ops:
                split.append(flat[position : position + count])
                position += count
            results = tuple(split)
        pop_results: list[PopOutcome] = []
        if raft_index > self.state.applied_index:
            if command is not None:
                for operation in command.operations:
                    if isinstance(operation, Retention) and raft_index > self.store.applied_raft_index:
                        # a commit-log effect: outside the state lock (it takes the store's locks)
                        self.store.delete_below(raft_index, operation.min_physical_offset)
            with self.state_lock:
                if timer_start is not None:
                    self.state.apply_timer_progress(TIMER_PROGRESS_KEY, timer_start)
                if timer_advance is not None:
                    self.state.apply_timer_progress(TIMER_PROGRESS_KEY, timer_advance)
                if command is not None:
                    for operation in command.operations:
                        if isinstance(operation, PopReceive | PopAck | PopChangeInvisible | PopRevive):
                            pop_results.append(self._apply_pop(raft_index, operation))
                        else:
                            self._apply_state(operation)
                if messages:
                    newest = stamp if stamp is not None else max(message.store_timestamp for message in messages)
                    self.state.last_store_timestamp = max(self.state.last_store_timestamp, newest)
                self.state.applied_index = raft_index
        return ApplyResult(raft_index, results, pop_results=tuple(pop_results))

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
        stamp = operation.now if isinstance(operation, PopRevive) else operation.timestamp
        copies = []
        for grant in dead:
            stored = self._read_verified(functools.partial(self._read_pop_message, operation.topic,
                                                           operation.queue_id, grant.offset))
            if stored is not None:
                copies.append(dead_letter_copy(stored, operation.group, grant, stamp))
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
        """A Records operation (plain messages laid out by the leader: no timers, no transactions). Only the
        leader's own entries need per-message results."""
        stamp = max(batch.stamp, self.state.last_store_timestamp)
        results: tuple[Sequence[AppendResult], ...] = ()
        if batch.record_count and raft_index > self.store.applied_raft_index:
            duplicates = self._record_duplicates(batch, stamp - UNIQ_KEY_WINDOW_MS)
            outcome = self._append_records(raft_index, batch, duplicates, stamp, want_results)
            if want_results:
                results = (self._merge(outcome.results, duplicates, batch.record_count) if duplicates
                           else outcome.results,)
        if raft_index > self.state.applied_index:
            with self.state_lock:
                if batch.record_count:
                    if self.state.timer_progress.get(TIMER_PROGRESS_KEY) is None:
                        # as _release_late_timers: the first messages ever start the timer progress
                        self.state.apply_timer_progress(TIMER_PROGRESS_KEY, stamp // 1000 - 1)
                    self.state.last_store_timestamp = max(self.state.last_store_timestamp, stamp)
                self.state.applied_index = raft_index
        return ApplyResult(raft_index, results)

    def _record_duplicates(self, batch: PreparedRecords, since_timestamp: int) -> dict[int, AppendResult | int]:
        """:meth:`_split_duplicates` for prepared records: the same answers, found from the UNIQ_KEY hashes
        the records carry. Keys are read from a record only when hashes alone cannot decide: a second
        send of a hash in this command, or a hash the store may have stored lately. Column-wise for a large
        batch (:func:`commitlog.records.columnwise`), record by record for a small one."""
        if not columnwise(batch.record_count):
            return self._record_duplicates_each(batch, since_timestamp)
        layout = layout_of(batch)
        metas = layout.metas
        (positions,) = (metas["flags"] & HAS_UNIQ_KEY).nonzero()
        if not len(positions):
            return {}
        hashes = np.frombuffer(batch.key_hashes, HASH_DTYPE)[layout.key_starts[positions]]

        def uniq_key(position: int) -> bytes:
            return uniq_key_of(batch, int(layout.starts[position]), int(metas["flags"][position])) or b""

        def digest(position: int) -> bytes:
            return _record_digest(batch, int(layout.starts[position]))

        duplicates: dict[int, AppendResult | int] = {}
        collided: dict[int, tuple[str, bytes]] = {}
        ordered = hashes.copy()
        ordered.sort()
        if (ordered[1:] == ordered[:-1]).any():
            # equal hashes: equal keys, or (rarely) a CRC collision of two distinct keys
            first: dict[tuple[int, int, int], int] = {}  # (topic index, UNIQ_KEY hash, reconsume count)
            again: list[tuple[int, tuple[int, int, int]]] = []
            identities = zip(metas["topic"][positions].tolist(), hashes.tolist(),
                             metas["reconsume"][positions].tolist(), strict=True)
            for position, identity in zip(positions.tolist(), identities, strict=True):
                if first.setdefault(identity, position) != position:
                    again.append((position, identity))
            self._repeated_sends(batch.topics, first, again, uniq_key, digest, duplicates, collided)
            sent_first = np.array([position not in duplicates for position in positions.tolist()], dtype=np.bool_)
            positions, hashes = positions[sent_first], hashes[sent_first]
        candidates = positions[self.store.recently_stored_mask(hashes, since_timestamp)].tolist()
        if candidates:
            sends = [(batch.topics[int(metas["topic"][position])], uniq_key(position), int(metas["reconsume"][position]),
                      digest(position)) for position in candidates]
            self._stored_sends(candidates, sends, since_timestamp, duplicates, collided)
        self._count_collisions(collided, duplicates)
        return duplicates

    def _repeated_sends(self, topics: Sequence[str], first: dict[tuple[int, int, int], int],
                        again: list[tuple[int, tuple[int, int, int]]], uniq_key: Callable[[int], bytes],
                        digest: Callable[[int], bytes], duplicates: dict[int, AppendResult | int],
                        collided: dict[int, tuple[str, bytes]]) -> list[tuple[int, int]]:
        """Of the sends in ``again``, whose (topic, UNIQ_KEY hash, reconsume count) an earlier send of the
        command has (``first``: identity -> its first position): those whose key and content are an earlier
        one's too go into ``duplicates`` (position -> that earlier position); the others (a CRC collision of
        distinct keys, or a key collision of distinct contents) are first sends after all and are returned
        as (position, hash); of those, a key collision goes into ``collided`` (position -> topic, UNIQ_KEY)."""
        exact: dict[tuple[int, bytes, int, bytes], int] = {}
        digests: dict[tuple[int, bytes, int], set[bytes]] = {}  # (topic, UNIQ_KEY, reconsume count) -> contents
        distinct = []
        for position, identity in again:
            earlier = first[identity]
            key, content = (identity[0], uniq_key(earlier), identity[2]), digest(earlier)
            exact.setdefault((*key, content), earlier)
            digests.setdefault(key, set()).add(content)
            key, content = (identity[0], uniq_key(position), identity[2]), digest(position)
            found = exact.setdefault((*key, content), position)
            if found != position:
                duplicates[position] = found
            else:
                distinct.append((position, identity[1]))
                contents = digests.setdefault(key, set())
                if contents:
                    collided[position] = (topics[key[0]], key[1])
                contents.add(content)
        return distinct

    def _stored_sends(self, positions: Sequence[int], sends: Sequence[tuple[str, bytes, int, bytes]],
                      since_timestamp: int, duplicates: dict[int, AppendResult | int],
                      collided: dict[int, tuple[str, bytes]]) -> None:
        """Look ``sends`` (topic, UNIQ_KEY, reconsume count, digest; of the sends at ``positions``) up among
        the messages stored since ``since_timestamp``: retries go into ``duplicates``, key collisions into
        ``collided``."""
        found = self._read_verified(functools.partial(self.store.find_recent_sends, sends, since_timestamp))
        for position, send, stored in zip(positions, sends, found, strict=True):
            if isinstance(stored, KeyCollision):
                collided[position] = (send[0], send[1])
            elif stored is not None:
                duplicates[position] = stored

    def _count_collisions(self, collided: dict[int, tuple[str, bytes]], duplicates: dict[int, AppendResult | int]) -> None:
        """Count and log the sends stored as new messages though their UNIQ_KEY matched a recent message's
        (those in ``collided`` that are not a retry of another message after all)."""
        for position, (topic, uniq_key) in collided.items():
            if position not in duplicates:
                self.key_collisions += 1
                log.warning("UNIQ_KEY %s of topic %s is a recent message's too, with other content: stored as a "
                            "new message (%d such sends)", uniq_key.decode("utf-8", "replace"), topic,
                            self.key_collisions)

    def _record_duplicates_each(self, batch: PreparedRecords, since_timestamp: int) -> dict[int, AppendResult | int]:
        """:meth:`_record_duplicates` record by record."""
        hashes = hash_list(batch)
        metas = meta_list(batch)
        first: dict[tuple[int, int, int], int] = {}  # (topic index, UNIQ_KEY hash, reconsume count) -> position
        again: list[tuple[int, tuple[int, int, int]]] = []
        uniq_hashes: dict[int, int] = {}  # position of a first send -> its UNIQ_KEY hash
        key_position = 0
        for position, (_, topic_index, flags, _, _, reconsume_times, key_count) in enumerate(metas):
            if flags & HAS_UNIQ_KEY:
                hashed = hashes[key_position]
                identity = (topic_index, hashed, reconsume_times)
                if first.setdefault(identity, position) == position:
                    uniq_hashes[position] = hashed
                else:
                    again.append((position, identity))
            key_position += key_count
        if not first:
            return {}
        starts: list[int] = []

        def record_start(position: int) -> int:
            if not starts:
                starts.extend(itertools.accumulate((meta[0] for meta in metas), initial=0))
            return starts[position]

        def uniq_key(position: int) -> bytes:
            return uniq_key_of(batch, record_start(position), metas[position][2]) or b""

        def digest(position: int) -> bytes:
            return _record_digest(batch, record_start(position))

        duplicates: dict[int, AppendResult | int] = {}
        collided: dict[int, tuple[str, bytes]] = {}
        if again:  # equal hashes: equal keys, or (rarely) a CRC collision of two distinct keys
            uniq_hashes.update(self._repeated_sends(batch.topics, first, again, uniq_key, digest, duplicates, collided))
        candidates = self.store.recently_stored(uniq_hashes, since_timestamp)
        if candidates:
            candidates.sort()
            sends = [(batch.topics[metas[position][1]], uniq_key(position), metas[position][5], digest(position))
                     for position in candidates]
            self._stored_sends(candidates, sends, since_timestamp, duplicates, collided)
        self._count_collisions(collided, duplicates)
        return duplicates

    def _append_records(self, raft_index: int, batch: PreparedRecords, duplicates: dict[int, AppendResult | int],
                        stamp: int, want_results: bool) -> AppendOutcome:
        while True:
            try:
                return self.store.append_records(raft_index, batch, duplicates, stamp, want_results)
            except DiskFullError as exc:
                log.error("disk full applying index %d, retrying in %.0f s: %s", raft_index,
                          DISK_FULL_RETRY_SECONDS, exc)
                self.sleep(DISK_FULL_RETRY_SECONDS)

    def _release_late_timers(self, messages: Sequence[MessageInput], stamp: int | None
                             ) -> tuple[int | None, Sequence[MessageInput]]:
        """Timed messages already due by the replicated timer progress become their real messages now
        (dledger.timers). Returns the progress to start from when there was none yet (the first
        messages ever: the second before this command's store time) and the messages to store."""
        progress = self.state.timer_progress.get(TIMER_PROGRESS_KEY)
        start = None
        if progress is None:
            newest = stamp if stamp is not None else max(message.store_timestamp for message in messages)
            progress = start = newest // 1000 - 1
        if not any(message.topic == TIMER_TOPIC for message in messages):
            return start, messages
        released: list[MessageInput] = []
        for message in messages:
            if message.topic == TIMER_TOPIC:
                due = timer_due_second(message.properties)
                if due is not None and due <= progress:
                    real = release(message, message.store_timestamp)
                    if real is not None:
                        message = real
            released.append(message)
        return start, released

    def _release_timers(self, value: int) -> tuple[list[MessageInput], int | None]:
        """A TimerProgress(TIMER_DELIVER_KEY, second * TIMER_CURSOR_SCALE + start) operation: the real
        messages of the timers due after the progress and at or before ``second`` (in commit-log order,
        from position ``start``, at most TIMER_RELEASE_MAX), and the new progress when that was the rest.
        Reads only the store and the replicated state: the same on every replica."""
        second, start = divmod(value, TIMER_CURSOR_SCALE)
        progress = self.state.timer_progress.get(TIMER_PROGRESS_KEY)
        if progress is None or second <= progress or second - progress > TIMER_SPAN_MAX_SECONDS:
            return [], None
        due: list[StoredMessage] = []
        for each in range(progress + 1, second + 1):
            # verified: a timer's stored bytes become a new message here, and decide whether it is one
            due.extend(self._read_verified(functools.partial(self.store.query_by_key, TIMER_TOPIC, timer_key(each),
                                                             TIMER_SECOND_MAX, verified=True)))
        due.sort(key=lambda stored: stored.physical_offset)
        chunk = due[start : start + TIMER_RELEASE_MAX]
        stamp = max(self.state.last_store_timestamp, second * 1000)
        released = []
        for stored in chunk:
            real = release(MessageInput(stored.topic, stored.queue_id, stored.flag, stored.sys_flag,
                                        stored.born_timestamp, stored.born_host, stamp, stored.reconsume_times,
                                        stored.prepared_transaction_offset, stored.body, stored.properties), stamp)
            if real is not None:
                released.append(real)
        return released, (second if start + TIMER_RELEASE_MAX >= len(due) else None)

    def _split_duplicates(self, messages: Sequence[MessageInput], since_timestamp: int
                          ) -> tuple[list[MessageInput], dict[int, AppendResult | int]]:
        """Messages to store, and for each retried send (same topic, UNIQ_KEY, reconsume count and content as a
        message stored within UNIQ_KEY_WINDOW_MS, or earlier in this command) its position mapped to the
        stored message's result (or to the position of the earlier message of this command)."""
        duplicates: dict[int, AppendResult | int] = {}
        collided: dict[int, tuple[str, bytes]] = {}
        first: dict[tuple[str, bytes, int, bytes], int] = {}  # identity -> position of its first send here
        keys: set[tuple[str, bytes, int]] = set()
        for position, message in enumerate(messages):
            match = _UNIQ_KEY_PROPERTY.search(message.properties)
            if match is not None:
                key = (message.topic, match.group(1), message.reconsume_times)
                identity = (*key, retry_digest(message.flag, message.body, message.properties))
                earlier = first.setdefault(identity, position)
                if earlier != position:
                    duplicates[position] = earlier
                elif key in keys:
                    collided[position] = (key[0], key[1])
                keys.add(key)
        if first:
            self._stored_sends(list(first.values()), list(first), since_timestamp, duplicates, collided)
            self._count_collisions(collided, duplicates)
        if not duplicates:
            return list(messages), duplicates
        return [message for position, message in enumerate(messages) if position not in duplicates], duplicates

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

    def _append(self, raft_index: int, messages: Sequence[MessageInput], stamp: int | None) -> AppendOutcome:
        while True:
            try:
                return self.store.append(raft_index, messages, stamp)
            except DiskFullError as exc:
                # Skipping would diverge from the other replicas: wait for space (an operator, or retention
                # once this node can apply again). The group keeps going on the other members.
                log.error("disk full applying index %d, retrying in %.0f s: %s", raft_index,
                          DISK_FULL_RETRY_SECONDS, exc)
                self.sleep(DISK_FULL_RETRY_SECONDS)

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


def dead_letter_copy(stored: StoredMessage, group: str, grant: PopGrant, stamp: int) -> MessageInput:
    """The message a popped one becomes in ``group``'s dead-letter queue after ``grant.attempt`` deliveries
    (as a 4.x consumer's send-back to the dead-letter queue stores it)."""
    properties = stored.property_map
    properties.setdefault("RETRY_TOPIC", stored.topic)
    properties.setdefault("ORIGIN_MESSAGE_ID", properties.get("UNIQ_KEY") or stored.msg_id)
    properties["DLQ_ORIGIN_TOPIC"] = stored.topic
    properties["DLQ_ORIGIN_MESSAGE_ID"] = properties["ORIGIN_MESSAGE_ID"]
    for name in ("DELAY", "REAL_TOPIC", "REAL_QID"):
        properties.pop(name, None)
    return MessageInput(f"{DLQ_PREFIX}{group}", 0, stored.flag, stored.sys_flag & ~0x30, stored.born_timestamp,
                        stored.born_host, stamp, stored.reconsume_times + grant.attempt,
                        stored.prepared_transaction_offset, stored.body, encode_properties(properties))


def _record_digest(batch: PreparedRecords, start: int) -> bytes:
    """The :func:`retry_digest` of the record at ``start`` of a batch."""
    record = decode_record(batch.records, start, check_crc=False)
    return retry_digest(record.flag, record.body, record.properties)
