"""Delay-level delivery (RocketMQ's ScheduleMessageService), leader-only, through Raft.

A message sent with DELAY level L is stored in SCHEDULE_TOPIC_XXXX queue L-1 with REAL_TOPIC / REAL_QID.
The leader walks each level's queue from the replicated progress offset; a message whose store time plus
the level's delay has passed is delivered by proposing one command that holds both the real message and
the new progress (``TimerProgress("level:L", next offset)``), so delivery and progress apply together:
a new leader continues from exactly where the old one stopped, with nothing lost or delivered twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Final

from broker.context import BrokerContext
from broker.requests import RequestError
from commitlog.message import MessageInput
from commitlog.record_codec import StoredMessage, decode_record
from dledger.command import Command, Messages, TimerProgress
from protocol.properties import (
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    decode_properties,
    encode_properties_text,
)
from protocol.topics import SCHEDULE_TOPIC

log = logging.getLogger(__name__)

#: messages one delivery command carries at most
DELIVERY_BATCH_MAX: Final = 64
#: the longest the service sleeps without looking (a safety net; applies and role changes wake it)
IDLE_SECONDS: Final = 1.0
RETRY_SECONDS: Final = 0.5


def level_key(level: int) -> str:
    return f"level:{level}"


def delivered_message(stored: StoredMessage, store_timestamp: int) -> MessageInput | None:
    """The real message a scheduled one stands for, or None when it names no real topic."""
    properties = decode_properties(stored.properties)
    topic = properties.pop(PROPERTY_REAL_TOPIC, None)
    queue_text = properties.pop(PROPERTY_REAL_QUEUE_ID, None)
    if not topic or queue_text is None or not queue_text.isdigit():
        return None
    properties.pop(PROPERTY_DELAY_TIME_LEVEL, None)
    # RocketMQ keeps REAL_TOPIC / REAL_QID on the delivered message (clients read them for retries)
    properties[PROPERTY_REAL_TOPIC] = topic
    properties[PROPERTY_REAL_QUEUE_ID] = queue_text
    return MessageInput(
        topic=topic, queue_id=int(queue_text), flag=stored.flag, sys_flag=stored.sys_flag,
        born_timestamp=stored.born_timestamp, born_host=stored.born_host, store_timestamp=store_timestamp,
        reconsume_times=stored.reconsume_times, prepared_transaction_offset=stored.prepared_transaction_offset,
        body=stored.body, properties=encode_properties_text(properties).encode("utf-8", "surrogatepass"),
    )


class DelayService:
    def __init__(self, broker: BrokerContext, wall_clock_ms: Callable[[], int] | None = None) -> None:
        self.broker = broker
        # the group's time, as every leader-only service: not this member's own clock (broker.context)
        self.wall_clock_ms = wall_clock_ms or broker.wall_clock_ms
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        #: messages delivered by this member while leader (status, tests)
        self.delivered = 0
        #: what the levels' queues held when an apply last woke the service (see applied)
        self._scheduled_seen = -1

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="delay-delivery")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def applied(self) -> None:
        """Something applied: worth a look only on the leader, and only when a level's queue grew. Sends to
        other topics, the bulk of the traffic, wake nothing (a wake-up is a pass over every level); what a
        delivery of ours applied is seen by the pass that proposed it."""
        broker = self.broker
        if not broker.member.is_leader:
            return
        scheduled = self._scheduled_count()
        if scheduled != self._scheduled_seen:
            self._scheduled_seen = scheduled
            self._wake.set()

    def wanted(self) -> bool:
        """Whether an apply gives the service something to look at (:meth:`applied` would wake it), asked on
        the Raft thread before it wakes the loop: on the leader, when a level's queue grew."""
        return self.broker.member.is_leader and self._scheduled_count() != self._scheduled_seen

    def _scheduled_count(self) -> int:
        """Messages ever stored in the levels' queues (their max offsets): grows with every delayed send."""
        store = self.broker.store
        return sum([store.max_queue_offset(SCHEDULE_TOPIC, queue_id)
                    for queue_id in range(len(self.broker.config.delay_levels_seconds))])

    def role_changed(self) -> None:
        self._wake.set()

    async def _run(self) -> None:
        while True:
            self._wake.clear()
            sleep_seconds = IDLE_SECONDS
            if self.broker.member.is_leader:
                try:
                    sleep_seconds = await self.deliver_due()
                except RequestError as exc:
                    log.info("delay delivery paused: %s", exc.remark)
                    sleep_seconds = RETRY_SECONDS
                except Exception:
                    log.exception("delay delivery failed")
                    sleep_seconds = RETRY_SECONDS
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), max(0.001, sleep_seconds))

    async def deliver_due(self) -> float:
        """Deliver every due message of every level; return how long until the next one is due."""
        broker = self.broker
        store = broker.store
        next_due_seconds = IDLE_SECONDS
        for level, delay_seconds in enumerate(broker.config.delay_levels_seconds, start=1):
            queue_id = level - 1
            while True:
                progress = max(broker.state.timer_progress.get(level_key(level), 0),
                               store.min_queue_offset(SCHEDULE_TOPIC, queue_id))
                if progress >= store.max_queue_offset(SCHEDULE_TOPIC, queue_id):
                    break
                result = store.get_messages(SCHEDULE_TOPIC, queue_id, progress, DELIVERY_BATCH_MAX)
                now = self.wall_clock_ms()
                batch: list[MessageInput] = []
                next_offset = progress
                for offset, raw in zip(result.queue_offsets, result.messages, strict=True):
                    stored = decode_record(raw, check_crc=False)
                    due = stored.store_timestamp + delay_seconds * 1000
                    if due > now:
                        next_due_seconds = min(next_due_seconds, (due - now) / 1000)
                        break
                    message = delivered_message(stored, now)
                    if message is not None:
                        batch.append(message)
                    next_offset = offset + 1
                else:
                    if not result.messages:
                        next_offset = max(next_offset, result.next_begin_offset)
                if next_offset == progress:
                    break
                operations: tuple[Messages | TimerProgress, ...] = (TimerProgress(level_key(level), next_offset),)
                if batch:
                    operations = (Messages(tuple(batch)), *operations)
                await broker.propose(Command(operations))
                self.delivered += len(batch)
        return next_due_seconds
