"""Send coalescing: plain sends to one queue issued in the same event-loop turn leave as one
SEND_BATCH_MESSAGE, and each caller still gets its own :class:`SendResult`.

A producer with many sends outstanding (``send_async``, or many tasks awaiting ``send``) otherwise puts
one frame per message on the wire, and the broker decodes, checks and answers each on its own. Here a
send is parked until the loop turn ends (``call_soon``: no timer, no linger), then the sends parked for
the same (topic, queue) go as one batch: a lone send goes as the plain SEND_MESSAGE_V2 it always was, so
a producer with one send at a time sees no change. Batches form only because work arrived while earlier
sends were in flight (the broker's group commit works the same way).

What a caller can observe stays as it was:

- the queue: every send is given the queue round-robin gives it before it is parked, so messages spread
  over the queues exactly as without coalescing, and a batch holds only sends of one queue;
- the stored message: a batch record carries the same body, flag and properties (UNIQ_KEY included) as
  the single send, and only sends stored as they are (no compression, no delay, no transaction, not a
  retry topic, ``wait_store_msg_ok``) are coalesced;
- the result: the broker stores a batch in one queue, in order, with consecutive queue offsets; each
  caller's result has its own UNIQ_KEY as ``msg_id``, its own offset message id and queue offset;
- failures: a batch is stored whole or not at all. A broker error for a batch (a rejection, or retries
  used up) sends each of its messages again on its own, so each gets its own verdict; the UNIQ_KEY every
  attempt carries lets the broker deduplicate one that was stored after all. Any other error (a timeout:
  the outcome is unknown) is each caller's error, as for a single send.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Final, Generic, TypeVar

from client.errors import MQBrokerError
from client.message import MessageQueue, SendResult

logger = logging.getLogger(__name__)

#: the batch header's properties (the batch as a whole waits for the store, as each of its messages)
BATCH_PROPERTIES: Final = "WAIT\x01true\x02"


@dataclass(frozen=True, slots=True)
class CoalesceLimits:
    """How large a coalesced batch may grow: ``messages_max`` sends and ``bytes_max`` bytes of batch
    records (well below the broker's largest message and its group-commit entry)."""

    messages_max: int = 128
    bytes_max: int = 256 * 1024


#: the producer's own form of one send (what it sends when the send goes alone)
Single = TypeVar("Single")


class ParkedSend(Generic[Single]):
    """One send waiting for the end of the loop turn: its batch record, the send as the producer would
    send it alone, and its caller's future."""

    __slots__ = ("future", "record", "single", "unique_id")

    def __init__(self, record: bytes, unique_id: str, single: Single, future: asyncio.Future[SendResult]) -> None:
        self.record = record
        self.unique_id = unique_id
        self.single = single
        self.future = future


#: send_batch(topic, queue, batch body, unique ids) -> the batch's result (retried as the producer retries)
SendBatch = Callable[[str, MessageQueue, bytes, tuple[str, ...]], Awaitable[SendResult]]
#: send_alone(single, queue) -> that send's own result: first to ``queue``, retried as the producer retries
SendAlone = Callable[[Single, MessageQueue], Awaitable[SendResult]]


class SendCoalescer(Generic[Single]):
    """Parks sends per (topic, queue) until the loop turn ends, then sends each group: one send alone,
    several as batches of at most ``limits``. Runs on one event loop."""

    def __init__(self, send_batch: SendBatch, send_alone: SendAlone[Single],
                 limits: CoalesceLimits | None = None) -> None:
        self._send_batch = send_batch
        self._send_alone = send_alone
        self.limits = limits or CoalesceLimits()
        self._parked: dict[tuple[str, MessageQueue], list[ParkedSend[Single]]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        #: batches sent (of two or more sends) and the sends they carried: what coalescing saved
        self.batches = 0
        self.batched_sends = 0

    def park(self, topic: str, queue: MessageQueue, record: bytes, unique_id: str,
             single: Single) -> asyncio.Future[SendResult]:
        """Park one send; its future resolves with its own result."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[SendResult] = loop.create_future()
        if not self._parked:
            loop.call_soon(self._flush)
        key = (topic, queue)
        group = self._parked.get(key)
        if group is None:
            self._parked[key] = [ParkedSend(record, unique_id, single, future)]
        else:
            group.append(ParkedSend(record, unique_id, single, future))
        return future

    def _flush(self) -> None:
        parked, self._parked = self._parked, {}
        messages_max, bytes_max = self.limits.messages_max, self.limits.bytes_max
        for (topic, queue), group in parked.items():
            start = 0
            while start < len(group):
                end = start + 1
                size = len(group[start].record)
                while end < len(group) and end - start < messages_max and size + len(group[end].record) <= bytes_max:
                    size += len(group[end].record)
                    end += 1
                self._start(self._send(topic, queue, group[start:end]))
                start = end

    def _start(self, work: Awaitable[None]) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _send(self, topic: str, queue: MessageQueue, sends: list[ParkedSend[Single]]) -> None:
        if len(sends) == 1:
            await self._alone(sends[0], queue)
            return
        try:
            result = await self._send_batch(topic, queue, b"".join([send.record for send in sends]),
                                            tuple(send.unique_id for send in sends))
        except MQBrokerError as error:
            # nothing of the batch is known to be stored: each goes on its own (UNIQ_KEYs dedupe the rest)
            logger.info("a batch of %d coalesced sends to %s failed (%s): sending them one by one", len(sends), queue,
                        error)
            await asyncio.gather(*[self._alone(send, queue) for send in sends])
            return
        except BaseException as error:
            for send in sends:
                _fail(send.future, error)
            if not isinstance(error, Exception):
                raise
            return
        self.batches += 1
        self.batched_sends += len(sends)
        offset_ids = result.offset_msg_id.split(",")
        if len(offset_ids) != len(sends):
            offset_ids = [""] * len(sends)
        for index, send in enumerate(sends):
            if not send.future.done():
                send.future.set_result(SendResult(
                    status=result.status, msg_id=send.unique_id, message_queue=result.message_queue,
                    queue_offset=result.queue_offset + index, offset_msg_id=offset_ids[index],
                    broker_address=result.broker_address,
                ))

    async def _alone(self, send: ParkedSend[Single], queue: MessageQueue) -> None:
        try:
            result = await self._send_alone(send.single, queue)
        except BaseException as error:
            _fail(send.future, error)
            if not isinstance(error, Exception):
                raise
            return
        if not send.future.done():
            send.future.set_result(result)

    async def close(self) -> None:
        """Wait for the batches in flight (their callers hold their futures)."""
        if self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)


def _fail(future: asyncio.Future[SendResult], error: BaseException) -> None:
    if future.done():
        return
    if isinstance(error, asyncio.CancelledError):
        future.cancel()
    else:
        future.set_exception(error)
