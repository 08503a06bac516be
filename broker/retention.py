"""Retention (RocketMQ's fileReservedTime), leader-only, through Raft.

Every ``retention_check_seconds`` the leader looks at the oldest commit-log segments: a segment whose
records are all older than ``file_reserved_seconds`` may go, unless something still needs it: a delayed
message not yet delivered, a transaction half not yet resolved, a timer not yet released. The leader
proposes ``Retention(min_physical_offset)`` (the start of the first segment to keep) and every replica
deletes the same whole segments at the same Raft index (``MessageStore.delete_below``), pruning its
consume queues and key index to match. Consumers whose offsets fall below are moved forward, as RocketMQ
moves them (PULL_OFFSET_MOVED).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Final

from broker.context import BrokerContext
from broker.delay import level_key
from broker.requests import RequestError
from broker.topics import SCHEDULE_TOPIC, TRANS_HALF_TOPIC
from commitlog.message import decode_record
from commitlog.store import MessageStore
from dledger.command import Command, Retention
from dledger.timers import TIMER_PROGRESS_KEY, TIMER_TOPIC, timer_due_second

log = logging.getLogger(__name__)

#: timer-queue units looked at per check when looking for the oldest pending timer
TIMER_SCAN_MAX: Final = 100_000


def first_physical(store: MessageStore, topic: str, queue_id: int, queue_offset: int) -> int | None:
    """The commit-log offset of a queue's unit, or None when the queue does not reach it."""
    if queue_offset >= store.max_queue_offset(topic, queue_id):
        return None
    result = store.get_messages(topic, queue_id, max(queue_offset, store.min_queue_offset(topic, queue_id)), 1)
    if not result.messages:
        return None
    return int.from_bytes(result.messages[0][28:36], "big", signed=True)


class RetentionService:
    def __init__(self, broker: BrokerContext, wall_clock_ms: Callable[[], int] | None = None) -> None:
        self.broker = broker
        self.wall_clock_ms = wall_clock_ms or broker.wall_clock_ms
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self.broker.config.file_reserved_seconds > 0:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="retention")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.broker.config.retention_check_seconds)
            if not self.broker.member.is_leader:
                continue
            try:
                await self.check()
            except RequestError as exc:
                log.info("retention paused: %s", exc.remark)
            except Exception:
                log.exception("retention check failed")

    def pins(self) -> list[int]:
        """Commit-log offsets still needed: undelivered delays, unresolved halves, unreleased timers."""
        broker = self.broker
        store = broker.store
        state = broker.state
        needed: list[int] = []
        for level in range(1, len(broker.config.delay_levels_seconds) + 1):
            physical = first_physical(store, SCHEDULE_TOPIC, level - 1, state.timer_progress.get(level_key(level), 0))
            if physical is not None:
                needed.append(physical)
        physical = first_physical(store, TRANS_HALF_TOPIC, 0, state.transaction_progress)
        if physical is not None:
            needed.append(physical)
        timer_progress = state.timer_progress.get(TIMER_PROGRESS_KEY)
        offset = store.min_queue_offset(TIMER_TOPIC, 0)
        end = min(store.max_queue_offset(TIMER_TOPIC, 0), offset + TIMER_SCAN_MAX)
        while offset < end:
            result = store.get_messages(TIMER_TOPIC, 0, offset, 64)
            if not result.messages:
                break
            pending = None
            for raw in result.messages:
                stored = decode_record(raw, check_crc=False)
                due = timer_due_second(stored.properties)
                if timer_progress is None or due is None or due > timer_progress:
                    pending = stored.physical_offset
                    break
            if pending is not None:
                needed.append(pending)
                break
            offset = result.next_begin_offset
        if offset >= end and end < store.max_queue_offset(TIMER_TOPIC, 0):
            needed.append(first_physical(store, TIMER_TOPIC, 0, end) or 0)  # not scanned yet: keep it
        return needed

    async def check(self) -> int | None:
        """Propose the retention point if it moves; return it (None when nothing can go)."""
        broker = self.broker
        store = broker.store
        starts = list(store.commit_log.starts)
        if len(starts) < 2:
            return None
        cutoff = self.wall_clock_ms() - broker.config.file_reserved_seconds * 1000
        keep_from = starts[0]
        for next_start in starts[1:]:
            if next_start >= store.max_physical_offset:
                break
            # the first record of the next segment was stored after every record of the one before
            if store.store_timestamp_at(next_start) >= cutoff:
                break
            keep_from = next_start
        pins = self.pins()
        if pins:
            lowest = min(pins)
            while keep_from > starts[0] and keep_from > lowest:
                keep_from = max(start for start in starts if start <= lowest)
        if keep_from <= store.commit_log.min_offset:
            return None
        await broker.propose(Command((Retention(keep_from),)))
        log.info("retention: commit log now starts at %d", keep_from)
        return keep_from
