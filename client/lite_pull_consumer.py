"""The lite pull consumer (Java's ``DefaultLitePullConsumer``): the client pulls in the background
(long polling, flow control, rebalance) and your code calls :meth:`AsyncLitePullConsumer.poll`.

Queues come from rebalance (:meth:`subscribe`) or from the caller (:meth:`assign`).

Offsets: what ``poll`` returned is treated as consumed when ``poll`` is called again (auto-commit,
the default: offsets are then committed every ``persist_offsets_interval_seconds`` and at close), or
when :meth:`commit` says so. A crash between a poll and the next one redelivers that poll's messages:
at least once, like Kafka's consumer, rather than Java's commit-at-poll.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Iterable, Mapping

from client.config import ClientConfig, ConsumerConfig
from client.consumer_base import ConsumerBase
from client.message import MessageExt, MessageQueue
from client.process_queue import ProcessQueue


class AsyncLitePullConsumer(ConsumerBase):
    consume_type = "CONSUME_ACTIVELY"

    def __init__(
        self,
        namesrv: str | ClientConfig,
        config: ConsumerConfig | None = None,
        *,
        auto_commit: bool = True,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        super().__init__(namesrv, config, clock=clock, rng=rng)
        self.auto_commit = auto_commit
        self._buffer: asyncio.Queue[tuple[ProcessQueue, list[MessageExt]]] = asyncio.Queue()
        #: offsets up to which poll() returned messages, per queue
        self._polled: dict[MessageQueue, int] = {}
        self._last_poll: dict[MessageQueue, int] = {}

    def assign(self, queues: Iterable[MessageQueue]) -> None:
        """Pull exactly these queues (no rebalance, no group membership needed)."""
        self._assigned = set(queues)
        if self._started:
            self._request_rebalance()

    def _consume_threads(self) -> int:
        return 0  # no listener: the caller's poll() consumes

    def _deliver(self, process_queue: ProcessQueue, messages: list[MessageExt]) -> None:
        self._buffer.put_nowait((process_queue, messages))

    def _advance_idle_offset(self, queue: MessageQueue, offset: int) -> None:
        # with manual commits only commit() moves offsets: an idle queue may hold polled messages
        # the caller has not committed yet
        if self.auto_commit and not self._last_poll.get(queue):
            super()._advance_idle_offset(queue, offset)

    async def poll(self, timeout_seconds: float = 5.0) -> list[MessageExt]:
        """Up to ``pull_batch_size`` messages (a little more when a pulled chunk is larger), waiting at
        most ``timeout_seconds`` for the first; an empty list when nothing arrived."""
        self._check_running()
        if self.auto_commit:
            for queue, offset in self._last_poll.items():
                self._commit_local(queue, offset)
        self._last_poll = {}
        messages: list[MessageExt] = []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_seconds
        while len(messages) < self.config.pull_batch_size:
            try:
                if messages:
                    process_queue, chunk = self._buffer.get_nowait()
                else:
                    async with asyncio.timeout(max(0.0, deadline - loop.time())):
                        process_queue, chunk = await self._buffer.get()
            except (asyncio.QueueEmpty, TimeoutError):
                break
            if process_queue.is_dropped():
                continue  # the queue moved or was sought: its pull restarts elsewhere
            next_offset = process_queue.remove(chunk)
            if next_offset is not None:
                self._polled[process_queue.queue] = next_offset
                self._last_poll[process_queue.queue] = next_offset
            messages.extend(chunk)
        return messages

    async def commit(self, offsets: Mapping[MessageQueue, int] | None = None) -> None:
        """Commit ``offsets`` (queue -> next offset to consume), or everything polled so far, to the
        broker now."""
        self._check_running()
        for queue, offset in (self._polled if offsets is None else offsets).items():
            self._commit_local(queue, offset, increase_only=offsets is None)
        await self.persist_offsets()

    async def committed(self, queue: MessageQueue) -> int | None:
        """The offset the broker (or the local file) holds for ``queue``."""
        self._check_running()
        return await self._offset_store.read_store(queue)

    async def seek(self, queue: MessageQueue, offset: int) -> None:
        """Pull ``queue`` from ``offset`` on; what was buffered for it is discarded. The committed
        offset changes with the next commit (auto or :meth:`commit`), not here."""
        self._check_running()
        if queue not in self._process_queues:
            raise ValueError(f"{queue} is not assigned to this consumer")
        await self._drop_queue(queue)
        self._polled.pop(queue, None)
        self._last_poll.pop(queue, None)
        self._add_queue(queue, offset)

    async def close(self) -> None:
        if self._started and not self._closed and self.auto_commit:
            for queue, offset in self._last_poll.items():
                self._commit_local(queue, offset)
        await super().close()
