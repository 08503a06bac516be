"""Pop consumption on the leader: receive, acknowledge, change of invisibility, dead-lettering, and the
revive service. Every change is a replicated command (``dledger.pop`` holds the state and its rules);
this module only chooses what to propose, with the group's time, and reads the committed messages back.

- A receive reads the queue from the replicated cursor (the group's committed 4.x offset, else the queue's
  first offset, for a queue never popped), keeps what the tag filter selects, and proposes a POP_RECEIVE of
  the revived entries first and then those offsets. Apply decides what is handed out (another receive may
  have taken them first): only the offsets it granted are returned.
- The revive service (leader-only, like the delay service) proposes POP_REVIVE for in-flight entries whose
  invisible time passed: they become receivable again with one attempt more, or, after the group's maximum
  (its retry max + 1 deliveries), go to its dead-letter queue ``%DLQ%group`` in the same command.
- Auto-renewed receives (5.x push consumers, as the proxy's receipt-handle manager does): the leader keeps
  extending the invisible time of what it handed out (POP_CHANGE_INVISIBLE keeping the handle) until it is
  acknowledged, its handle changes, or :data:`RENEW_MAX_MS` passed. The list of what to renew is this
  leader's memory: after a failover, such messages simply come back at the end of their invisible time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Final

from broker.context import BrokerContext
from broker.requests import RequestError
from broker.subscription_groups import check_consume_enabled
from commitlog.outcomes import GetStatus
from commitlog.record_codec import StoredMessage, decode_record
from dledger.command import Command, PopAck, PopChangeInvisible, PopReceive, PopRevive
from dledger.pop import POP_RECEIVE_BATCH_MAX, PopOutcome, due_entries
from protocol.codes import ResponseCode
from protocol.properties import PROPERTY_TAGS
from protocol.route_data import PERM_WRITE
from protocol.topics import dlq_topic

log = logging.getLogger(__name__)

#: offsets one revive command names at most
REVIVE_BATCH_MAX: Final = 256
#: the longest the revive service sleeps without looking (applies and role changes wake it)
REVIVE_IDLE_SECONDS: Final = 1.0
REVIVE_RETRY_SECONDS: Final = 0.5
#: an auto-renewed message is renewed when less than this is left of its invisible time, by RENEW_INVISIBLE_MS
RENEW_AHEAD_MS: Final = 20_000
RENEW_INVISIBLE_MS: Final = 60_000
#: the longest a message is kept invisible by renewals
RENEW_MAX_MS: Final = 3_600_000
#: auto-renewed messages tracked at once (more are simply not renewed)
RENEWALS_MAX: Final = 100_000


@dataclass(frozen=True, slots=True)
class PoppedMessage:
    message: StoredMessage
    queue_offset: int
    attempt: int
    handle_id: int
    invisible_until: int


class PopService:
    def __init__(self, broker: BrokerContext, wall_clock_ms: Callable[[], int] | None = None) -> None:
        self.broker = broker
        self.wall_clock_ms = wall_clock_ms or broker.wall_clock_ms
        #: set on every apply (long-polling receives wait on it), replaced once woken
        self._applied = asyncio.Event()
        #: auto-renewed messages: (group, topic, queue id, offset) -> (handle id, renew until, ms)
        self.renewals: dict[tuple[str, str, int, int], tuple[int, int]] = {}
        #: receives inside :meth:`long_poll` (read by the Raft thread: while there are any, an apply wakes the
        #: loop for them; otherwise it need not)
        self.polling = 0

    def applied(self) -> None:
        self._applied.set()

    @contextlib.contextmanager
    def long_poll(self) -> Iterator[None]:
        """Around a receive's looks at its queues and its waits between them: an apply after the receive came
        in sets :meth:`wait_applied`'s event (the looks see what applied before)."""
        self.polling += 1
        try:
            yield
        finally:
            self.polling -= 1

    async def wait_applied(self, timeout_seconds: float) -> None:
        """Until something applies (or the timeout): the moment to look at a queue again."""
        event = self._applied
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), max(0.0, timeout_seconds))
        if event.is_set():
            self._applied = asyncio.Event()

    # ---------------------------------------------------------------------------------- group settings

    def max_attempts(self, group: str) -> int:
        """Deliveries before a message goes to the dead-letter queue: the group's retry max + 1."""
        subscription = self.broker.state.groups.get(group)
        retry_max = subscription.retry_max_times if subscription else self.broker.config.max_reconsume_times
        return max(1, retry_max + 1)

    def is_fifo(self, group: str) -> bool:
        subscription = self.broker.state.groups.get(group)
        return subscription is not None and subscription.consume_orderly

    # ---------------------------------------------------------------------------------- operations

    def _start_offset(self, group: str, topic: str, queue_id: int) -> int:
        store = self.broker.store
        committed = self.broker.state.consumer_offset(group, topic, queue_id)
        low = store.min_queue_offset(topic, queue_id)
        return low if committed is None else max(committed, low)

    async def receive(self, group: str, topic: str, queue_id: int, count: int, invisible_ms: int,
                      tag_codes: frozenset[int] | None, auto_renew: bool = False,
                      tags: frozenset[str] | None = None) -> list[PoppedMessage]:
        """One attempt to pop up to ``count`` messages of one queue (nothing when there is none now);
        ``auto_renew``: this leader keeps them invisible until acknowledged (at most RENEW_MAX_MS). ``tag_codes``
        select by the consume queue's tag hash codes; ``tags``, when given, check each match's tag exactly (two
        tags can share a hash code): a message that only shares the hash is passed over, as one of another tag."""
        broker = self.broker
        broker.require_leader()
        check_consume_enabled(broker.state.groups, group)
        count = max(1, min(count, POP_RECEIVE_BATCH_MAX))
        fifo = self.is_fifo(group)
        key = (group, topic, queue_id)
        queue = broker.state.pop_queues.get(key)
        in_flight = dict(queue.in_flight) if queue is not None else {}
        if fifo and any(not entry.revived for entry in in_flight.values()):
            return []
        cursor = queue.cursor if queue is not None else self._start_offset(group, topic, queue_id)
        offsets = sorted(offset for offset, entry in in_flight.items() if entry.revived)[:count]
        scan_end = cursor
        if len(offsets) < count:
            result = broker.store.get_messages(topic, queue_id, cursor, count - len(offsets),
                                               broker.config.pull_bytes_max, tag_codes)
            if result.status in (GetStatus.FOUND, GetStatus.NO_MATCHED_MESSAGE, GetStatus.OFFSET_TOO_SMALL):
                if tags is None:
                    offsets.extend(result.queue_offsets)
                else:
                    offsets.extend(offset for offset, record in zip(result.queue_offsets, result.messages, strict=True)
                                   if decode_record(record).property_map.get(PROPERTY_TAGS) in tags)
                scan_end = max(cursor, result.next_begin_offset)
        if not offsets and scan_end == cursor:
            return []
        now = self.wall_clock_ms()
        invisible_until = now + invisible_ms
        outcome = await self._propose_one(PopReceive(group, topic, queue_id, cursor, scan_end, tuple(offsets),
                                                     invisible_until, fifo))
        popped = []
        for grant in outcome.granted:
            message = self.read(topic, queue_id, grant.offset)
            if message is not None:
                popped.append(PoppedMessage(message, grant.offset, grant.attempt, outcome.handle_id, invisible_until))
            if auto_renew and len(self.renewals) < RENEWALS_MAX:
                self.renewals[(group, topic, queue_id, grant.offset)] = (outcome.handle_id, now + RENEW_MAX_MS)
        return popped

    def read(self, topic: str, queue_id: int, offset: int) -> StoredMessage | None:
        result = self.broker.store.get_messages(topic, queue_id, offset, 1)
        if not result.messages or result.queue_offsets[0] != offset:
            return None  # deleted by retention since
        return decode_record(result.messages[0])

    async def ack(self, group: str, topic: str, queue_id: int, offset: int, handle_id: int) -> PopOutcome:
        self.broker.require_leader()
        return await self._propose_one(PopAck(group, topic, queue_id, offset, handle_id))

    async def ack_many(self, group: str, topic: str, handles: list[tuple[int, int, int]]) -> tuple[PopOutcome, ...]:
        """Acknowledge (queue id, offset, handle id) each, in one command; one outcome each, in order."""
        self.broker.require_leader()
        acks = tuple(PopAck(group, topic, queue_id, offset, handle_id) for queue_id, offset, handle_id in handles)
        for queue_id, offset, _ in handles:
            self.renewals.pop((group, topic, queue_id, offset), None)
        result = await self.broker.propose(Command(acks))
        if result.noop_reason is not None or len(result.pop_results) != len(acks):
            raise RequestError(ResponseCode.SYSTEM_ERROR, f"pop command not applied: {result.noop_reason}")
        return result.pop_results

    async def change_invisible(self, group: str, topic: str, queue_id: int, offset: int, handle_id: int,
                               invisible_ms: int) -> PopOutcome:
        self.broker.require_leader()
        self.renewals.pop((group, topic, queue_id, offset), None)  # the consumer decides its time now
        until = self.wall_clock_ms() + invisible_ms
        return await self._propose_one(PopChangeInvisible(group, topic, queue_id, offset, handle_id, until))

    async def forward_to_dead_letter(self, group: str, topic: str, queue_id: int, offset: int,
                                     handle_id: int) -> PopOutcome:
        broker = self.broker
        broker.require_leader()
        self.renewals.pop((group, topic, queue_id, offset), None)
        await broker.ensure_topic(dlq_topic(group), 1, PERM_WRITE)
        return await self._propose_one(PopAck(group, topic, queue_id, offset, handle_id, True, self.wall_clock_ms()))

    async def _propose_one(self, operation: PopReceive | PopAck | PopChangeInvisible | PopRevive) -> PopOutcome:
        result = await self.broker.propose(Command((operation,)))
        if result.noop_reason is not None or len(result.pop_results) != 1:
            raise RequestError(ResponseCode.SYSTEM_ERROR, f"pop command not applied: {result.noop_reason}")
        return result.pop_results[0]

    # ---------------------------------------------------------------------------------- revive

    async def revive_due(self) -> tuple[int, float]:
        """Propose a revive for every queue with entries past their invisible time; returns (entries
        revived or dead-lettered, seconds until the next entry is due, at most REVIVE_IDLE_SECONDS)."""
        broker = self.broker
        now = self.wall_clock_ms()
        done = 0
        for (group, topic, queue_id), offsets in list(due_entries(broker.state.pop_queues, now)):
            max_attempts = self.max_attempts(group)
            queue = broker.state.pop_queues.get((group, topic, queue_id))
            if queue is not None and any(entry.attempt >= max_attempts for entry in dict(queue.in_flight).values()):
                await broker.ensure_topic(dlq_topic(group), 1, PERM_WRITE)
            for start in range(0, len(offsets), REVIVE_BATCH_MAX):
                outcome = await self._propose_one(PopRevive(group, topic, queue_id,
                                                            tuple(offsets[start : start + REVIVE_BATCH_MAX]), now,
                                                            max_attempts))
                done += len(outcome.granted) + len(outcome.dead_lettered)
                if outcome.dead_lettered:
                    log.info("%d messages of %s/%d went to %s after %d deliveries", len(outcome.dead_lettered),
                             topic, queue_id, dlq_topic(group), max_attempts)
        return done, self._next_due_seconds()

    async def renew_due(self) -> int:
        """Extend the invisible time of auto-renewed messages close to the end of it; forget those acknowledged,
        redelivered or renewed long enough. Returns how many were renewed."""
        broker = self.broker
        now = self.wall_clock_ms()
        changes: list[PopChangeInvisible] = []
        for key, (handle_id, renew_until) in list(self.renewals.items()):
            group, topic, queue_id, offset = key
            queue = broker.state.pop_queues.get((group, topic, queue_id))
            entry = queue.in_flight.get(offset) if queue is not None else None
            if entry is None or entry.handle_id != handle_id or now >= renew_until:
                del self.renewals[key]
            elif entry.invisible_until - now < RENEW_AHEAD_MS:
                until = min(now + RENEW_INVISIBLE_MS, renew_until)
                changes.append(PopChangeInvisible(group, topic, queue_id, offset, handle_id, until, keep_handle=True))
        for start in range(0, len(changes), REVIVE_BATCH_MAX):
            await broker.propose(Command(tuple(changes[start : start + REVIVE_BATCH_MAX])))
        return len(changes)

    def _next_due_seconds(self) -> float:
        now = self.wall_clock_ms()
        soonest = REVIVE_IDLE_SECONDS
        for queue in list(self.broker.state.pop_queues.values()):
            for entry in list(queue.in_flight.values()):
                if not entry.revived:
                    soonest = min(soonest, max(0.0, (entry.invisible_until - now) / 1000))
        return soonest


class ReviveService:
    """Leader-only: revives due in-flight entries (PopService.revive_due), woken by applies and role changes."""

    def __init__(self, pops: PopService) -> None:
        self.pops = pops
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        #: entries revived or dead-lettered by this member while leader (status, tests)
        self.revived = 0

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="pop-revive")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def wake(self) -> None:
        self._wake.set()
        if not self.pops.broker.member.is_leader:
            self.pops.renewals.clear()  # a later leader renews nothing of this one's

    async def _run(self) -> None:
        while True:
            self._wake.clear()
            sleep_seconds = REVIVE_IDLE_SECONDS
            if self.pops.broker.member.is_leader:
                try:
                    await self.pops.renew_due()
                    done, sleep_seconds = await self.pops.revive_due()
                    self.revived += done
                except RequestError as exc:
                    log.info("pop revive paused: %s", exc.remark)
                    sleep_seconds = REVIVE_RETRY_SECONDS
                except Exception:
                    log.exception("pop revive failed")
                    sleep_seconds = REVIVE_RETRY_SECONDS
            # an apply wakes it only to recompute the next due time: at least a short pause between sweeps
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), max(0.01, sleep_seconds))
