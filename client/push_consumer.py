"""The push consumer (Java's ``DefaultMQPushConsumer``): the client pulls with long polling and calls
your listener.

- Concurrently (:meth:`AsyncPushConsumer.register_listener`): up to ``consume_concurrency`` listener
  calls at once, ``consume_batch_max`` messages each. A batch that returns RECONSUME_LATER (or raises)
  is sent back to the broker (CONSUMER_SEND_MSG_BACK), which redelivers it through the group's retry
  topic after a delay and to the dead-letter queue after ``max_reconsume_times``; if sending back
  fails, the batch is consumed again locally a little later. Broadcasting consumers cannot send back:
  a failed broadcast batch is logged and skipped, as in Java.
- Orderly (:meth:`AsyncPushConsumer.register_orderly_listener`): one batch at a time per queue, in
  queue order; a clustering consumer first locks the queue on the broker (LOCK_BATCH_MQ) and renews the
  lock, so no two members consume one queue at once. SUSPEND_CURRENT_QUEUE_A_MOMENT retries the same
  batch after ``suspend_current_queue_seconds``; after ``max_reconsume_times`` it goes to the
  dead-letter queue.

A listener is a plain function (run in a thread pool of ``consume_concurrency`` threads) or a
coroutine function (awaited on the event loop). It receives the messages and a context; it returns a
status (``True``/``None`` mean success, ``False`` means later).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import enum
import inspect
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Final

from client.config import ClientConfig, ConsumerConfig
from client.consumer_api import send_message_back
from client.consumer_base import LOCK_TRUST_SECONDS, ConsumerBase
from client.errors import MQClientError
from client.message import MessageExt, MessageQueue
from client.process_queue import ProcessQueue

logger = logging.getLogger(__name__)

#: a batch whose send-back failed is consumed again after this long (Java: 5 s)
LOCAL_RETRY_SECONDS: Final = 5.0
#: ``delayLevel`` asking the broker for the dead-letter queue at once
DEAD_LETTER_DELAY_LEVEL: Final = -1


class ConsumeConcurrentlyStatus(enum.Enum):
    CONSUME_SUCCESS = "CONSUME_SUCCESS"
    RECONSUME_LATER = "RECONSUME_LATER"


class ConsumeOrderlyStatus(enum.Enum):
    SUCCESS = "SUCCESS"
    SUSPEND_CURRENT_QUEUE_A_MOMENT = "SUSPEND_CURRENT_QUEUE_A_MOMENT"


@dataclass(slots=True)
class ConsumeContext:
    """What a listener learns about its batch; ``delay_level_when_next_consume`` (concurrent: 0 lets
    the broker choose, -1 sends straight to the dead-letter queue) applies to RECONSUME_LATER."""

    message_queue: MessageQueue
    delay_level_when_next_consume: int = 0


ListenerResult = ConsumeConcurrentlyStatus | ConsumeOrderlyStatus | bool | None
MessageListener = Callable[[list[MessageExt], ConsumeContext], ListenerResult | Awaitable[ListenerResult]]


def _succeeded(result: object) -> bool:
    if result is None or result is True:
        return True
    return result in (ConsumeConcurrentlyStatus.CONSUME_SUCCESS, ConsumeOrderlyStatus.SUCCESS)


class AsyncPushConsumer(ConsumerBase):
    """``subscribe`` topics, register one listener, then ``await start()``."""

    consume_type = "CONSUME_PASSIVELY"

    def __init__(
        self,
        namesrv: str | ClientConfig,
        config: ConsumerConfig | None = None,
        *,
        listener: MessageListener | None = None,
        orderly: bool = False,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        super().__init__(namesrv, config, clock=clock, rng=rng)
        self._listener: MessageListener | None = None
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._slots: asyncio.Semaphore | None = None
        self._consume_tasks: set[asyncio.Task[None]] = set()
        #: batches waiting to be consumed again locally (cancelled at close: not committed, redelivered)
        self._later_tasks: set[asyncio.Task[None]] = set()
        self._orderly_tasks: dict[MessageQueue, asyncio.Task[None]] = {}
        if listener is not None:
            self._listener = listener
            self._orderly = orderly

    def register_listener(self, listener: MessageListener) -> None:
        """Consume concurrently with ``listener``."""
        self._listener = listener
        self._orderly = False

    def register_orderly_listener(self, listener: MessageListener) -> None:
        """Consume each queue in order with ``listener`` (queue locks in clustering mode)."""
        self._listener = listener
        self._orderly = True

    async def start(self) -> AsyncPushConsumer:
        if self._listener is None:
            raise MQClientError(1, "register a listener before starting the consumer")
        if not self._subscriptions:
            raise MQClientError(1, "subscribe to at least one topic before starting the consumer")
        self._slots = asyncio.Semaphore(self.config.consume_concurrency)
        if not inspect.iscoroutinefunction(self._listener):
            self._executor = concurrent.futures.ThreadPoolExecutor(
                max_workers=self.config.consume_concurrency, thread_name_prefix=f"consume-{self.group}"
            )
        await super().start()
        return self

    async def close(self) -> None:
        try:
            await super().close()
        finally:
            if self._executor is not None:
                self._executor.shutdown(wait=False, cancel_futures=True)

    async def _drain_consumers(self, timeout_seconds: float) -> None:
        for task in self._later_tasks:
            task.cancel()
        running = [*self._consume_tasks, *self._orderly_tasks.values()]
        if running:
            _, pending = await asyncio.wait(running, timeout=timeout_seconds)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)

    def _spawn(self, coroutine: Awaitable[None], name: str) -> asyncio.Task[None]:
        async def run() -> None:
            await coroutine

        task = asyncio.get_running_loop().create_task(run(), name=name)
        self._consume_tasks.add(task)
        task.add_done_callback(self._consume_tasks.discard)
        return task

    async def _call_listener(self, messages: list[MessageExt], context: ConsumeContext) -> object:
        listener = self._listener
        assert listener is not None
        try:
            if self._executor is None:
                result = listener(messages, context)
                return await result if inspect.isawaitable(result) else result
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(self._executor, listener, messages, context)
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception("%s: the listener failed on %d messages of %s", self.group, len(messages), context.message_queue)
            return ConsumeConcurrentlyStatus.RECONSUME_LATER

    async def _listen(self, process_queue: ProcessQueue, messages: list[MessageExt], context: ConsumeContext) -> object:
        """One listener call, counted for running info (its time, and whether it succeeded)."""
        process_queue.last_consume_ms = time.time_ns() // 1_000_000
        started = self.instance.now()
        result = await self._call_listener(messages, context)
        self.stats.consumed(process_queue.queue.topic, len(messages), _succeeded(result),
                            (self.instance.now() - started) * 1000)
        return result

    def _deliver(self, process_queue: ProcessQueue, messages: list[MessageExt]) -> None:
        if self._orderly:
            self._wake_orderly(process_queue)
            return
        size = self.config.consume_batch_max
        for start in range(0, len(messages), size):
            batch = messages[start : start + size]
            self._spawn(self._consume_concurrently(process_queue, batch), f"consume {process_queue.queue}")

    # -------------------------------------------------------------------------------- concurrent

    async def _consume_concurrently(self, process_queue: ProcessQueue, messages: list[MessageExt]) -> None:
        assert self._slots is not None
        context = ConsumeContext(process_queue.queue)
        async with self._slots:
            if process_queue.is_dropped() or self._closing:
                return  # not consumed, not committed: delivered again after a restart or rebalance
            result = await self._listen(process_queue, messages, context)
        if process_queue.is_dropped():
            return  # the queue moved to another member: it consumes these again
        done = messages
        if not _succeeded(result):
            if self.is_broadcasting:
                logger.warning("%s: broadcast batch of %d failed and is dropped", self.group, len(messages))
            else:
                failed = await self._send_back(messages, context.delay_level_when_next_consume)
                if failed:
                    done = [message for message in messages if message not in failed]
                    later = asyncio.get_running_loop().create_task(
                        self._consume_later(process_queue, failed), name="consume later"
                    )
                    self._later_tasks.add(later)
                    later.add_done_callback(self._later_tasks.discard)
        self._commit_local(process_queue.queue, process_queue.remove(done))

    async def _consume_later(self, process_queue: ProcessQueue, messages: list[MessageExt]) -> None:
        await asyncio.sleep(LOCAL_RETRY_SECONDS)
        if not process_queue.is_dropped():
            await self._consume_concurrently(process_queue, messages)

    async def _send_back(self, messages: list[MessageExt], delay_level: int) -> list[MessageExt]:
        """Send each message back for a later retry; returns those that could not be."""
        failed: list[MessageExt] = []
        deadline = self.instance.now() + self.instance.config.request_timeout_seconds * 2
        for message in messages:
            try:
                await send_message_back(
                    self.instance,
                    self.group,
                    message,
                    delay_level=delay_level,
                    max_reconsume_times=self.config.max_reconsume_times,
                    deadline=deadline,
                )
            except MQClientError as error:
                logger.info("%s: sending %s back failed: %s", self.group, message.msg_id, error)
                failed.append(message)
        return failed

    # ----------------------------------------------------------------------------------- orderly

    def _on_locked(self, process_queue: ProcessQueue) -> None:
        if process_queue.has_messages():
            self._wake_orderly(process_queue)

    def _wake_orderly(self, process_queue: ProcessQueue) -> None:
        queue = process_queue.queue
        task = self._orderly_tasks.get(queue)
        if task is not None and not task.done():
            return
        task = asyncio.get_running_loop().create_task(self._consume_orderly(process_queue), name=f"orderly {queue}")
        self._orderly_tasks[queue] = task

        def forget(done: asyncio.Task[None]) -> None:
            if self._orderly_tasks.get(queue) is done:
                del self._orderly_tasks[queue]

        task.add_done_callback(forget)

    def _may_consume_orderly(self, process_queue: ProcessQueue) -> bool:
        if process_queue.is_dropped() or self._closing:
            return False
        if self.is_broadcasting:
            return True
        return process_queue.locked and self.instance.now() - process_queue.last_lock_time < LOCK_TRUST_SECONDS

    async def _consume_orderly(self, process_queue: ProcessQueue) -> None:
        """One batch at a time from the head of the queue, while it is held."""
        while self._may_consume_orderly(process_queue):
            async with process_queue.consume_lock:
                if not self._may_consume_orderly(process_queue):
                    return
                messages = process_queue.take(self.config.consume_batch_max)
                if not messages:
                    return
                context = ConsumeContext(process_queue.queue)
                assert self._slots is not None
                async with self._slots:
                    result = await self._listen(process_queue, messages, context)
                if process_queue.is_dropped():
                    process_queue.rollback()
                    return
                if _succeeded(result):
                    self._commit_local(process_queue.queue, process_queue.commit())
                    continue
                exhausted = [
                    message
                    for message in messages
                    if max(message.reconsume_times, process_queue.reconsume_counts.get(message.queue_offset, 0))
                    >= self.config.max_reconsume_times
                ]
                # retried enough: to the dead-letter queue (a broadcast batch can only be skipped)
                if len(exhausted) == len(messages) and (
                    self.is_broadcasting or not await self._send_back(messages, DEAD_LETTER_DELAY_LEVEL)
                ):
                    logger.warning(
                        "%s: %d messages of %s gave up after %d attempts",
                        self.group,
                        len(messages),
                        process_queue.queue,
                        self.config.max_reconsume_times,
                    )
                    self._commit_local(process_queue.queue, process_queue.commit())
                    continue
                for message in messages:
                    offset = message.queue_offset
                    process_queue.reconsume_counts[offset] = process_queue.reconsume_counts.get(offset, 0) + 1
                process_queue.rollback()
            await asyncio.sleep(self.config.suspend_current_queue_seconds)
