"""The messages of one assigned queue between pull and commit (Java's ``ProcessQueue``).

Offsets are committed as "everything below this is consumed": after a batch completes, the queue's
commit offset is the smallest offset still held (or one past the largest pulled when nothing is
held), so a message consumed out of order never lets an earlier one be skipped.

An orderly consumer takes messages from the head (:meth:`take`) and either :meth:`commit` s them or
puts them back in front (:meth:`rollback`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from client.message import MessageExt, MessageQueue


class ProcessQueue:
    """Not thread-safe: owned by one event loop."""

    def __init__(self, queue: MessageQueue, threshold: int) -> None:
        self.queue = queue
        self.threshold = threshold
        #: offset -> message, in offset order (pulls arrive in order)
        self._messages: dict[int, MessageExt] = {}
        #: orderly: taken for the running batch, not yet committed
        self._consuming: dict[int, MessageExt] = {}
        self._max_offset = -1
        self.next_offset: int | None = None
        self._dropped = False
        self.locked = False
        self.last_lock_time = 0.0
        #: wall-clock milliseconds of the last pull started and the last listener call started (running info)
        self.last_pull_ms = 0
        self.last_consume_ms = 0
        #: orderly: held while a batch runs, so a queue is unlocked only between batches
        self.consume_lock = asyncio.Lock()
        #: orderly: deliveries of a message that asked to be suspended, by offset
        self.reconsume_counts: dict[int, int] = {}
        self._space = asyncio.Event()
        self._space.set()

    def drop(self) -> None:
        """This member no longer owns the queue: stop pulling and committing it."""
        self._dropped = True

    def is_dropped(self) -> bool:
        # a method, not an attribute: it changes across awaits
        return self._dropped

    @property
    def count(self) -> int:
        return len(self._messages) + len(self._consuming)

    @property
    def max_offset(self) -> int:
        return self._max_offset

    def put(self, messages: Iterable[MessageExt]) -> None:
        for message in messages:
            if message.queue_offset not in self._messages and message.queue_offset not in self._consuming:
                self._messages[message.queue_offset] = message
            self._max_offset = max(self._max_offset, message.queue_offset)
        self._update_space()

    def commit_offset(self) -> int:
        """The offset that is safe to commit now."""
        held = [*self._consuming, *self._messages]
        return min(held) if held else self._max_offset + 1

    def remove(self, messages: Iterable[MessageExt]) -> int | None:
        """Drop consumed messages; the offset to commit, or None for a dropped queue or when nothing
        was pulled yet."""
        for message in messages:
            self._messages.pop(message.queue_offset, None)
            self.reconsume_counts.pop(message.queue_offset, None)
        self._update_space()
        if self.is_dropped() or self._max_offset < 0:
            return None
        return self.commit_offset()

    def take(self, count: int) -> list[MessageExt]:
        taken: list[MessageExt] = []
        for offset in sorted(self._messages)[:count]:
            message = self._messages.pop(offset)
            self._consuming[offset] = message
            taken.append(message)
        return taken

    def commit(self) -> int:
        """Orderly: the running batch is consumed; returns the offset to commit."""
        for offset in self._consuming:
            self.reconsume_counts.pop(offset, None)
        self._consuming.clear()
        self._update_space()
        return self.commit_offset()

    def rollback(self) -> None:
        """Orderly: put the running batch back in front, to be consumed again."""
        merged = {**self._consuming, **self._messages}
        self._messages = dict(sorted(merged.items()))
        self._consuming.clear()

    def clear(self) -> None:
        self._messages.clear()
        self._consuming.clear()
        self._update_space()

    def info(self, commit_offset: int, last_lock_ms: int) -> dict[str, object]:
        """Java's ``ProcessQueueInfo`` of this queue now (GET_CONSUMER_RUNNING_INFO)."""
        held = [*self._consuming.values(), *self._messages.values()]
        offsets = [message.queue_offset for message in held]
        return {
            "commitOffset": commit_offset,
            "cachedMsgMinOffset": min(offsets, default=0),
            "cachedMsgMaxOffset": max(offsets, default=0),
            "cachedMsgCount": len(held),
            "cachedMsgSizeInMiB": sum(len(message.body) for message in held) >> 20,
            "transactionMsgMinOffset": 0,
            "transactionMsgMaxOffset": 0,
            "transactionMsgCount": 0,
            "locked": self.locked,
            "tryUnlockTimes": 0,
            "lastLockTimestamp": last_lock_ms,
            "droped": self._dropped,  # sic: Java's field name
            "lastPullTimestamp": self.last_pull_ms,
            "lastConsumeTimestamp": self.last_consume_ms,
        }

    def has_messages(self) -> bool:
        return bool(self._messages)

    def _update_space(self) -> None:
        if self.count < self.threshold:
            self._space.set()
        else:
            self._space.clear()

    async def wait_for_space(self, timeout_seconds: float) -> bool:
        try:
            async with asyncio.timeout(timeout_seconds):
                await self._space.wait()
        except TimeoutError:
            return False
        return True
