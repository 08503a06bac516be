"""Group commit on the leader: concurrent appends packed into one Raft command.

Callers submit a list of messages (one send, or one batch send, which stays atomic) and get a future. The
proposing thread (pysyncobj's tick thread, on each tick: :meth:`GroupCommitter.take_ready`; or, with
``proposer = "thread"``, a batcher thread of the committer's own) takes waiting requests up to
``batch_messages_max`` messages and ``batch_bytes_max`` bytes as soon as fewer than ``in_flight_entries_max``
entries are in flight (batches form from what arrives while
entries are in flight, not by waiting; ``linger_ms``, 0 by default, adds a wait for a fuller batch), stamps
them with one store timestamp (``wall_clock_ms``: a member passes its group clock, so the stamp is what a
majority of the members' clocks say, not the leader's own clock; never lower than any earlier stamp,
whatever the clocks of past leaders said), encodes one command and proposes it. Beyond
``pending_bytes_max`` waiting bytes a submit is refused as busy.

Each future resolves with the caller's own results (offsets or per-message rejections), or fails with:
:class:`NotLeaderError` (nothing was proposed), :class:`BusyError` (nothing was proposed),
:class:`EntryTooLargeError` (nothing was proposed), or :class:`OutcomeUnknownError` (proposed, but the
leader changed or the apply timed out: the messages may or may not be stored; retry with the same
UNIQ_KEY, which is deduplicated).
"""

from __future__ import annotations

import functools
import logging
import operator
import queue
import struct
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from itertools import chain, repeat
from typing import Final

from commitlog.message import MessageInput, validate_input
from commitlog.outcomes import AppendResult
from commitlog.records import PreparedRecords
from dledger.apply import ApplyResult
from dledger.command import (
    COMPRESS_MIN_BYTES,
    FLAG_LZ4,
    Command,
    encode_messages_command,
    encode_records_command,
    stamped_messages_command,
)
from dledger.config import GroupCommitSettings
from dledger.future import PENDING, AppendFuture, Callbacks, set_results
from dledger.stages import StageHistograms

log = logging.getLogger(__name__)

#: bytes a message adds to its body and properties in a command
MESSAGE_OVERHEAD_BYTES = 64
#: after an entry that lz4 could not shrink, this many entries are sent without trying (random payloads:
#: a futile attempt costs the leader time on every message of the entry, for nothing) ...
COMPRESS_RETRY_ENTRIES = 16
#: ... and twice as many after each further futile attempt, up to this many; an entry that shrinks starts
#: over (incompressible payloads at full load: one attempt every 256 entries, not every 17, so futile
#: attempts cost next to nothing; data that turns compressible is noticed within 256 entries)
COMPRESS_RETRY_ENTRIES_MAX = 256
#: buckets of :attr:`GroupCommitter.entry_messages_counts`: entries of 1, 2, 3-4, ... messages, the last one
#: everything above 2 ** 14
ENTRY_MESSAGES_BUCKETS: Final = 16
#: how often the tick thread looks for entries that did not apply within ``apply_timeout_ms`` (take_ready)
EXPIRY_CHECK_SECONDS: Final = 0.1

# pysyncobj's FAIL_REASON values
FAIL_SUCCESS = 0
FAIL_QUEUE_FULL = 1
FAIL_MISSING_LEADER = 2
FAIL_DISCARDED = 3
FAIL_NOT_LEADER = 4
FAIL_LEADER_CHANGED = 5
FAIL_REQUEST_DENIED = 6

#: a batch as it is proposed: its messages and the store timestamp it stamped them with, or the records it laid
#: them out as
Batch = tuple[Sequence[MessageInput], int] | PreparedRecords
#: propose(command prefix + command bytes, callback, the command those bytes encode: what decoding them gives)
Propose = Callable[[bytes, Callable[[ApplyResult | None, int], None], Command], None]
#: prepare(messages, store timestamp): the messages laid out as records, or None to send them as messages
Prepare = Callable[[Sequence[MessageInput], int], PreparedRecords | None]


class AppendError(Exception):
    """An append that did not produce results."""


class NotLeaderError(AppendError):
    """This member is not the leader: nothing was proposed. ``leader`` names the leader when known."""

    def __init__(self, leader: str | None) -> None:
        super().__init__(f"not the leader (leader: {leader or 'unknown'})")
        self.leader = leader


class BusyError(AppendError):
    """Too much is waiting already: nothing was proposed (RocketMQ's SYSTEM_BUSY)."""


class InvalidMessageError(AppendError):
    """A message with a field that cannot be stored (size, host, range): nothing was proposed."""


class EntryTooLargeError(AppendError):
    """The messages do not fit in one Raft entry: nothing was proposed."""


class OutcomeUnknownError(AppendError):
    """Proposed, but no answer: the messages may or may not be stored."""


def request_bytes(messages: Sequence[MessageInput]) -> int:
    return sum(len(m.body) + len(m.properties) + len(m.topic) + MESSAGE_OVERHEAD_BYTES for m in messages)


class _Request(AppendFuture[tuple[AppendResult, ...]]):
    """One caller's messages, and the future the caller holds: one object per send, not two.

    The proposing thread drops ``messages`` once it has gathered a batch's messages (:func:`_drop_messages`): they are
    then freed on its thread, right after the record build read them, instead of on the completion thread
    an entry's round trip later, when they are cold in cache (on this 2-core host that freeing was a large
    share of the completion thread). ``count`` keeps their number."""

    __slots__ = ("count", "messages", "size", "submitted")

    def __init__(self, messages: Sequence[MessageInput], size: int,
                 callback: Callable[[AppendFuture[tuple[AppendResult, ...]]], object] | None) -> None:
        # AppendFuture.__init__'s fields, set here: one call less per send
        self._value: object = PENDING
        self._error: BaseException | None = None
        self._callbacks: Callbacks[tuple[AppendResult, ...]] = callback
        self._event: threading.Event | None = None
        self.messages: Sequence[MessageInput] = messages
        self.count = len(messages)
        self.size = size
        #: when it was submitted (monotonic seconds: the batch_wait stage)
        self.submitted = 0.0


_MESSAGES: Final = operator.attrgetter("messages")
_SUBMITTED: Final = operator.attrgetter("submitted")
_SIZE: Final = operator.attrgetter("size")
_NO_MESSAGES: Final[Sequence[MessageInput]] = ()


def _drop_messages(batch: list[_Request]) -> None:
    """Each request of ``batch`` lets go of its messages, at C level (no Python step per send)."""
    deque(map(setattr, batch, repeat("messages"), repeat(_NO_MESSAGES)), maxlen=0)


class GroupCommitter:
    def __init__(
        self,
        settings: GroupCommitSettings,
        propose: Propose,
        leader: Callable[[], tuple[bool, str | None]],
        entry_bytes_max: int,
        body_size_max_bytes: int = 4 << 20,
        wall_clock_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
        monotonic: Callable[[], float] = time.monotonic,
        prepare: Prepare | None = None,
        command_prefix: bytes = b"",
        stages: StageHistograms | None = None,
        wake: Callable[[], None] | None = None,
    ) -> None:
        self.settings = settings
        #: given, the thread that owns ``propose`` (pysyncobj's tick thread) takes batches itself, calling
        #: :meth:`take_ready` on each tick, and ``wake`` cuts its wait short when a submit finds work for it to
        #: do; none, a batcher thread of the committer's own takes them (``_run``)
        self._wake = wake
        #: what ``propose`` gets in front of each command (the bytes the member stores commands after)
        self.command_prefix = command_prefix
        self.prepare = prepare
        self.propose = propose
        self.leader = leader
        self.entry_bytes_max = entry_bytes_max
        self.body_size_max_bytes = body_size_max_bytes
        self.wall_clock_ms = wall_clock_ms
        self.monotonic = monotonic
        #: where the send path's time goes (dledger.stages): batch_wait, encode, complete
        self.stages = stages if stages is not None else StageHistograms()
        self._lock = threading.Lock()
        self._condition = threading.Condition(self._lock)
        self._waiting: deque[_Request] = deque()
        self._waiting_bytes = 0
        self._waiting_messages = 0
        # Futures of an entry of more than ``complete_inline_requests_max`` sends are resolved on this thread,
        # not on pysyncobj's tick thread, so that so many callbacks do not delay Raft (heartbeats, elections,
        # the next entries); smaller entries are completed where they were applied (_on_applied).
        self._completions: queue.SimpleQueue[tuple[list[_Request], ApplyResult | None, int, float] | None] = (
            queue.SimpleQueue())
        self._completer = threading.Thread(target=self._complete_loop, name="group-commit-complete", daemon=True)
        self._completer.start()
        self._in_flight: dict[int, tuple[float, list[_Request]]] = {}
        self._next_batch_id = 0
        self._last_store_timestamp_ms = 0
        self._compress_skips = 0  # entries left to send without trying lz4 (the proposing thread only)
        self._compress_pause = COMPRESS_RETRY_ENTRIES  # the skips after the next futile attempt (ditto)
        self._stopped = False
        self._paused = False
        #: entries and messages proposed so far (status and benchmarks)
        self.proposed_entries = 0
        self.proposed_messages = 0
        #: entries proposed by their messages: index i counts entries of (2 ** (i - 1), 2 ** i] messages
        #: (the proposing thread only; broker.metrics reads it)
        self.entry_messages_counts = [0] * ENTRY_MESSAGES_BUCKETS
        #: messages and request bytes acknowledged as stored (changed under ``_stored_lock``; broker.metrics)
        self._stored_lock = threading.Lock()
        self.stored_messages = 0
        self.stored_bytes = 0
        self._next_expiry_check = 0.0  # (take_ready only)
        self._thread: threading.Thread | None = None
        if wake is None:
            self._thread = threading.Thread(target=self._run, name="group-commit", daemon=True)
            self._thread.start()

    def raise_stamp_floor(self, stamp_ms: int) -> None:
        """Never stamp below ``stamp_ms`` (the last store timestamp applied, on becoming leader)."""
        with self._condition:
            self._last_store_timestamp_ms = max(self._last_store_timestamp_ms, stamp_ms)

    def submit(self, messages: Sequence[MessageInput],
               callback: Callable[[AppendFuture[tuple[AppendResult, ...]]], object] | None = None,
               ) -> AppendFuture[tuple[AppendResult, ...]]:
        """Queue ``messages`` for the next entry. ``callback``, if given, is the future's first done-callback,
        set before any other thread can see the future (``add_done_callback`` takes a lock for that). Callbacks
        may run on pysyncobj's tick thread (``complete_inline_requests_max``): they must return at once and
        never wait for another append."""
        is_leader, leader = self.leader()
        if not is_leader:
            raise NotLeaderError(leader)
        if not messages:
            raise InvalidMessageError("no messages to append")
        size = 0
        body_max = self.body_size_max_bytes
        for message in messages:  # anything that could not even be encoded is refused here, per caller
            reason = validate_input(message, body_max)
            if reason is not None:
                raise InvalidMessageError(reason)
            size += len(message.body) + len(message.properties) + len(message.topic) + MESSAGE_OVERHEAD_BYTES
        if size > self.entry_bytes_max:
            raise EntryTooLargeError(f"{size} bytes of messages exceed one entry ({self.entry_bytes_max} bytes)")
        request = _Request(messages, size, callback)
        request.submitted = self.monotonic()
        settings = self.settings
        with self._lock:  # the condition's lock, taken without Condition's Python-level __enter__
            if self._stopped:
                raise NotLeaderError(None)
            waiting_bytes = self._waiting_bytes
            if waiting_bytes + size > settings.pending_bytes_max:
                raise BusyError(f"{waiting_bytes} bytes are waiting for replication")
            waiting_messages = self._waiting_messages
            was_empty = not self._waiting
            self._waiting.append(request)
            self._waiting_bytes = waiting_bytes + size
            self._waiting_messages = waiting_messages + request.count
            # Wake the proposing thread only when it may act: work appeared, or a lingering batch just became
            # full (as _batch_is_full, inlined). Waking it on every submit cut its linger short and sent entries
            # of a few messages each; and while it waits for an in-flight slot, every submit woke it for nothing
            # (a thread wake-up per send, paid by the leader). The tick thread takes again by itself on the
            # tick that applies an entry, and frees its slot, so a wake-up is only for a free slot.
            messages_max = settings.batch_messages_max
            bytes_max = settings.batch_bytes_max
            act = was_empty or (waiting_messages < messages_max and waiting_bytes < bytes_max
                                and (waiting_messages + request.count >= messages_max
                                     or waiting_bytes + size >= bytes_max))
            if self._wake is None:
                if act:
                    self._condition.notify_all()
                return request
            act = act and not self._paused and len(self._in_flight) < settings.in_flight_entries_max
        if act:
            self._wake()
        return request

    def _take_batch(self) -> list[_Request]:
        """Called with the condition held and something waiting."""
        if (self._waiting_messages <= self.settings.batch_messages_max
                and self._waiting_bytes <= self.settings.batch_bytes_max):  # all of it, in one go
            batch = list(self._waiting)
            self._waiting.clear()
            self._waiting_bytes = self._waiting_messages = 0
            return batch
        if self._waiting_messages == len(self._waiting):  # single sends only (no request is empty)
            popleft = self._waiting.popleft
            batch = [popleft() for _ in range(min(len(self._waiting), self.settings.batch_messages_max))]
            size = sum([request.size for request in batch])
            while size > self.settings.batch_bytes_max and len(batch) > 1:
                request = batch.pop()  # back to the front of the queue, in order
                self._waiting.appendleft(request)
                size -= request.size
            self._waiting_bytes -= size
            self._waiting_messages -= len(batch)
            return batch
        batch = []
        count = size = 0
        while self._waiting:
            request = self._waiting[0]
            if batch and (count + request.count > self.settings.batch_messages_max
                          or size + request.size > self.settings.batch_bytes_max):
                break
            self._waiting.popleft()
            self._waiting_bytes -= request.size
            self._waiting_messages -= request.count
            batch.append(request)
            count += request.count
            size += request.size
        return batch

    def _batch_is_full(self) -> bool:
        return (self._waiting_messages >= self.settings.batch_messages_max
                or self._waiting_bytes >= self.settings.batch_bytes_max)

    def _run(self) -> None:
        """The batcher thread (no ``wake``): waits for work and a free in-flight slot, then proposes."""
        linger_seconds = self.settings.linger_ms / 1000
        timeout_seconds = self.settings.apply_timeout_ms / 1000
        while True:
            with self._condition:
                while not self._stopped and (
                    self._paused or not self._waiting or len(self._in_flight) >= self.settings.in_flight_entries_max
                ):
                    self._condition.wait(timeout=min(0.1, timeout_seconds))
                    self._expire(timeout_seconds)
                if self._stopped:
                    return
                if linger_seconds and not self._batch_is_full():
                    deadline = self.monotonic() + linger_seconds
                    while not self._stopped and not self._batch_is_full():
                        remaining = deadline - self.monotonic()
                        if remaining <= 0:
                            break
                        self._condition.wait(timeout=remaining)
                taken = self._take_locked()
            if taken is not None:
                self._propose_batch(*taken)

    def take_ready(self, leading: bool = True) -> None:
        """On the thread that owns ``propose`` (pysyncobj's tick thread, right before it appends what was
        proposed and sends it: each tick, after apply freed the slots of applied entries): fail entries that
        did not apply in time, whatever the role; and, ``leading``, propose what waits, entry after entry,
        while in-flight slots are free.

        No thread hand-off, no wake-up of another thread, and no GIL hand-over between taking a batch and
        sending it. ``linger_ms`` is kept from the oldest waiting send, to within one tick (``[raft]
        tick_period_ms``): the tick thread looks again on its next tick."""
        if not self._waiting and not self._in_flight:
            return
        now = self.monotonic()
        if now >= self._next_expiry_check:
            self._next_expiry_check = now + EXPIRY_CHECK_SECONDS
            with self._condition:
                self._expire(self.settings.apply_timeout_ms / 1000)
        if not leading:
            return
        linger_seconds = self.settings.linger_ms / 1000
        in_flight_max = self.settings.in_flight_entries_max
        while True:
            with self._lock:
                if self._stopped or self._paused or not self._waiting or len(self._in_flight) >= in_flight_max:
                    return
                if (linger_seconds and not self._batch_is_full()
                        and now - self._waiting[0].submitted < linger_seconds):
                    return
                taken = self._take_locked()
            if taken is not None:
                self._propose_batch(*taken)

    def _take_locked(self) -> tuple[list[_Request], int, float, int] | None:
        """With the lock held, a free in-flight slot and something waiting: the next batch, counted in flight
        with its id, when it was taken and its store timestamp."""
        batch = self._take_batch()
        if not batch:
            return None
        taken = self.monotonic()
        store_timestamp = max(self.wall_clock_ms(), self._last_store_timestamp_ms)
        self._last_store_timestamp_ms = store_timestamp
        batch_id = self._next_batch_id
        self._next_batch_id += 1
        self._in_flight[batch_id] = (taken, batch)
        return batch, batch_id, taken, store_timestamp

    def _propose_batch(self, batch: list[_Request], batch_id: int, taken: float, store_timestamp: int) -> None:
        """Encode a batch taken by :meth:`_take_locked` and propose it (without the lock)."""
        requests = len(batch)  # the mean wait, weighted by sends: C-level sum, no Python step per send
        self.stages.record("batch_wait", taken - sum(map(_SUBMITTED, batch)) / requests, requests)
        messages = list(chain.from_iterable(map(_MESSAGES, batch)))  # C-level: no Python step per send
        _drop_messages(batch)
        self.proposed_entries += 1
        self.proposed_messages += len(messages)
        self.entry_messages_counts[min((len(messages) - 1).bit_length(), ENTRY_MESSAGES_BUCKETS - 1)] += 1
        try:
            records = self.prepare(messages, store_timestamp) if self.prepare is not None else None
            proposal: Batch = (messages, store_timestamp) if records is None else records
            data = self._encode(proposal)
            if records is not None and len(data) > self.entry_bytes_max:
                # record heads and key hashes outgrew the size the batch was taken by: as messages
                proposal = (messages, store_timestamp)
                data = self._encode(proposal)
        except (struct.error, ValueError, OverflowError) as exc:  # submit validated: a programmer error
            log.error("could not encode a batch, failing it: %s", exc)
            with self._condition:
                self._in_flight.pop(batch_id, None)
            self._fail(batch, InvalidMessageError(f"cannot encode: {exc}"))
            return
        if isinstance(proposal, PreparedRecords):
            # the records carry what apply needs: the messages go now, on this thread (see _Request)
            del messages
            built = Command((proposal,))
        else:
            built = stamped_messages_command(*proposal)
        self.stages.record("encode", self.monotonic() - taken)
        self.propose(data, functools.partial(self._on_applied, batch_id), built)

    def _encode(self, proposal: Batch) -> bytes:
        compress = not self._compress_skips
        prefix = self.command_prefix
        if isinstance(proposal, PreparedRecords):
            data = encode_records_command(proposal, compress=compress, prefix=prefix)
        else:
            data = prefix + encode_messages_command(proposal[0], store_timestamp=proposal[1], compress=compress)
        if not compress:
            self._compress_skips -= 1
        elif data[len(prefix) + 1] & FLAG_LZ4:
            self._compress_pause = COMPRESS_RETRY_ENTRIES
        elif len(data) - len(prefix) >= COMPRESS_MIN_BYTES:  # tried, and it did not shrink enough
            self._compress_skips = self._compress_pause
            self._compress_pause = min(2 * self._compress_pause, COMPRESS_RETRY_ENTRIES_MAX)
        return data

    def _expire(self, timeout_seconds: float) -> None:
        now = self.monotonic()
        for batch_id, (started, batch) in list(self._in_flight.items()):
            if now - started > timeout_seconds:
                del self._in_flight[batch_id]
                self._fail(batch, OutcomeUnknownError(f"no apply within {timeout_seconds:.1f} s"))

    def _on_applied(self, batch_id: int, result: ApplyResult | None, reason: int) -> None:
        """pysyncobj's callback, on its tick thread: the entry's sends are completed here, or handed to the
        completion thread when there are more than ``complete_inline_requests_max`` of them."""
        with self._lock:
            entry = self._in_flight.pop(batch_id, None)
            if self._thread is not None:
                self._condition.notify_all()  # a free slot for the batcher thread
        if entry is None:  # already failed by a timeout
            return
        batch = entry[1]
        if len(batch) > self.settings.complete_inline_requests_max:
            self._completions.put((batch, result, reason, self.monotonic()))
            return
        self.stages.record("complete", 0.0)
        self._complete(batch, result, reason)

    def _complete_loop(self) -> None:
        while True:
            item = self._completions.get()
            if item is None:
                return
            batch, result, reason, applied = item
            self.stages.record("complete", self.monotonic() - applied)
            self._complete(batch, result, reason)
            del batch, result
            # The batch's requests, results and callbacks go now, while they are in cache, not when the next
            # entry wakes this thread (after the other threads' work has pushed them out of the cache, so the
            # leader pays for the misses)
            del item

    def _complete(self, batch: list[_Request], result: ApplyResult | None, reason: int) -> None:
        if reason == FAIL_SUCCESS and result is not None:
            if result.noop_reason is not None or not result.message_results:
                self._fail(batch, OutcomeUnknownError(f"applied as a no-op: {result.noop_reason}"))
                return
            # made into result objects once for the whole batch (StoredRecords makes them on demand)
            results = result.message_results[0][:]
            values: list[tuple[AppendResult, ...]]
            if len(results) == len(batch):  # one message per request: each gets a 1-tuple
                values = list(zip(results))
            else:
                values = []
                position = 0
                for request in batch:
                    count = request.count
                    values.append(tuple(results[position : position + count]))
                    position += count
            set_results(batch, values)
            stored_bytes = sum(map(_SIZE, batch))  # C-level: no Python step per send
            with self._stored_lock:  # entries are completed on the tick thread and on the completion thread
                self.stored_messages += len(results)
                self.stored_bytes += stored_bytes
        elif reason in (FAIL_QUEUE_FULL, FAIL_NOT_LEADER, FAIL_MISSING_LEADER, FAIL_REQUEST_DENIED):
            self._fail(batch, NotLeaderError(None) if reason != FAIL_QUEUE_FULL else BusyError("Raft queue full"))
        else:
            self._fail(batch, OutcomeUnknownError(f"leader changed before the entry applied (reason {reason})"))

    @staticmethod
    def _fail(batch: list[_Request], error: AppendError) -> None:
        for request in batch:
            if not request.done():
                request.set_exception(error)

    def pause(self) -> None:
        """Hold new entries back (a leadership transfer lets the target catch up); submits still queue."""
        with self._condition:
            self._paused = True

    def resume(self) -> None:
        with self._condition:
            self._paused = False
            self._condition.notify_all()
        if self._wake is not None:
            self._wake()

    def step_down(self) -> None:
        """Fail what waits (not proposed: NotLeaderError) when leadership is lost; in-flight entries get
        their outcome from pysyncobj's callbacks."""
        with self._condition:
            waiting = list(self._waiting)
            self._waiting.clear()
            self._waiting_bytes = self._waiting_messages = 0
        self._fail(waiting, NotLeaderError(None))

    def stop(self) -> None:
        with self._condition:
            self._stopped = True
            waiting = list(self._waiting)
            self._waiting.clear()
            in_flight = [request for _, batch in self._in_flight.values() for request in batch]
            self._in_flight.clear()
            self._condition.notify_all()
        self._fail(waiting, NotLeaderError(None))
        self._fail(in_flight, OutcomeUnknownError("member stopped"))
        self._completions.put(None)
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._completer.join(timeout=5)
