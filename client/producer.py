"""The asyncio producer: sync-style ``await send``, futures, oneway, batch and orderly sends (Java's
``DefaultMQProducer``).

Every message gets a UNIQ_KEY (:mod:`client.unique_id`) before its first attempt and keeps it through
every retry, so a broker that stored an attempt whose answer was lost deduplicates the next one
(a send that was not acknowledged may or may not be stored; retries with the same UNIQ_KEY are
deduplicated).

Retries: a leader change (not-leader answer, lost connection, timeout) is ridden out inside
:meth:`ClientInstance.invoke_leader` until the send deadline; other retriable broker errors
(SYSTEM_BUSY, SYSTEM_ERROR, TOPIC_NOT_EXIST, NO_PERMISSION) are retried
``retry_times_when_send_failed`` times, on another broker group when there is one.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
import zlib
from collections.abc import Callable, Mapping, Sequence
from typing import Final, Self

from client.coalesce import BATCH_PROPERTIES, CoalesceLimits, SendCoalescer
from client.config import ClientConfig, ProducerConfig
from client.errors import (
    ClientNotRunningError,
    MessageValidationError,
    MQBrokerError,
    MQClientError,
    broker_error,
)
from client.instance import ClientInstance, int_field
from client.message import (
    Message,
    MessageQueue,
    SendResult,
    SendStatus,
    encode_batch_record,
    encode_wire_properties,
    join_ids,
)
from client.route import TopicRoute
from client.selector import MessageQueueSelector, RoundRobin
from client.unique_id import UniqueIdGenerator
from commitlog.sys_flags import SYSFLAG_COMPRESSED, TRANSACTION_PREPARED_TYPE
from protocol.batch import encode_batch_message
from protocol.codes import RequestCode, ResponseCode
from protocol.properties import PROPERTY_TRANSACTION_PREPARED, PROPERTY_WAIT_STORE_MSG_OK
from protocol.topics import RETRY_PREFIX

logger = logging.getLogger(__name__)

#: broker answers worth another attempt (Java's ``retryResponseCodes``, plus SYSTEM_BUSY)
RETRIABLE_CODES: Final = frozenset(
    {
        ResponseCode.SYSTEM_BUSY,
        ResponseCode.SYSTEM_ERROR,
        ResponseCode.TOPIC_NOT_EXIST,
        ResponseCode.NO_PERMISSION,
        ResponseCode.NO_BUYER_ID,
        ResponseCode.NOT_IN_CURRENT_UNIT,
    }
)
_STATUS_BY_CODE: Final[dict[int, SendStatus]] = {
    ResponseCode.SUCCESS: SendStatus.SEND_OK,
    ResponseCode.FLUSH_DISK_TIMEOUT: SendStatus.FLUSH_DISK_TIMEOUT,
    ResponseCode.FLUSH_SLAVE_TIMEOUT: SendStatus.FLUSH_SLAVE_TIMEOUT,
    ResponseCode.SLAVE_NOT_AVAILABLE: SendStatus.SLAVE_NOT_AVAILABLE,
}
#: SendMessageRequestHeaderV2's short names and the SendMessageRequestHeader fields they stand for
_V2_LONG_NAMES: Final = dict(
    zip(
        "abcdefghijklmn",
        (
            "producerGroup", "topic", "defaultTopic", "defaultTopicQueueNums", "queueId", "sysFlag",
            "bornTimestamp", "flag", "properties", "reconsumeTimes", "unitMode", "maxReconsumeTimes",
            "batch", "brokerName",
        ),
        strict=True,
    )
)
#: the whole batch body is bounded like one message (Java: ``maxMessageSize`` for the encoded batch)
_BATCH_SIZE_MAX_MULTIPLIER: Final = 1


def current_time_ms() -> int:
    return time.time_ns() // 1_000_000


class _Prepared:
    """One send, encoded once and reused for every attempt (same UNIQ_KEY, same body). ``coalescable``:
    a plain send that a batch record stores exactly as it is (see :mod:`client.coalesce`)."""

    __slots__ = ("batch", "body", "coalescable", "flag", "message_ids", "properties", "sys_flag", "topic")

    def __init__(
        self,
        topic: str,
        body: bytes,
        properties: str,
        sys_flag: int,
        flag: int,
        batch: bool,
        message_ids: tuple[str, ...],
        coalescable: bool = False,
    ) -> None:
        self.coalescable = coalescable
        self.topic = topic
        self.body = body
        self.properties = properties
        self.sys_flag = sys_flag
        self.flag = flag
        self.batch = batch
        self.message_ids = message_ids


class AsyncProducer:
    """A producer of one group. ``namesrv`` is ``"host:port;host:port"`` or a :class:`ClientConfig`.

    Use ``async with AsyncProducer(...) as producer:`` or :meth:`start` / :meth:`close`.
    """

    def __init__(
        self,
        namesrv: str | ClientConfig,
        config: ProducerConfig | None = None,
        *,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.monotonic,
        clock_ms: Callable[[], int] = current_time_ms,
        id_clock_ms: Callable[[], int] | None = None,
    ) -> None:
        """``clock_ms`` stamps born timestamps and, unless ``id_clock_ms`` is given, UNIQ_KEYs."""
        self.config = (config or ProducerConfig()).validate()
        self._rng = rng if rng is not None else random.Random()
        self.instance = ClientInstance(ClientConfig.of(namesrv), clock=clock, rng=self._rng)
        self._clock_ms = clock_ms
        self._ids = UniqueIdGenerator(self.instance.client_ip, rng=self._rng, clock_ms=id_clock_ms or clock_ms)
        self._round_robin = RoundRobin(self._rng.randrange(1 << 16))
        self._inflight: asyncio.Semaphore | None = None
        self._coalescer: SendCoalescer[_Prepared] | None = None
        if self.config.coalesce_sends:
            self._coalescer = SendCoalescer(
                self._send_coalesced_batch, self._send_coalesced_alone,
                CoalesceLimits(self.config.coalesce_messages_max, self.config.coalesce_bytes_max),
            )
        self._pending: set[asyncio.Task[SendResult]] = set()
        self._started = False
        self._closed = False

    @property
    def group(self) -> str:
        return self.config.group

    # ------------------------------------------------------------------------------- life cycle

    async def start(self) -> Self:
        if self._closed:
            raise ClientNotRunningError("the producer was closed")
        if not self._started:
            self._inflight = asyncio.Semaphore(self.config.inflight_sends_max)
            self.instance.add_heartbeat_source(self._heartbeat_data)
            await self.instance.start()
            self._started = True
        return self

    async def close(self) -> None:
        """Wait for asynchronous sends still running (up to the send timeout), unregister, close."""
        if self._closed:
            return
        self._closed = True
        if self._pending:
            await asyncio.wait(set(self._pending), timeout=self.config.send_timeout_seconds)
        if self._coalescer is not None:
            await asyncio.wait_for(self._coalescer.close(), timeout=self.config.send_timeout_seconds)
        if self._started:
            await self.instance.unregister_client(self.config.group, None)
        await self.instance.close()

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def _heartbeat_data(self) -> tuple[list[dict[str, object]], list[dict[str, object]]]:
        return [{"groupName": self.config.group}], []

    def _check_running(self) -> None:
        if not self._started or self._closed:
            raise ClientNotRunningError("the producer is not running (call start() first)")

    def new_unique_id(self) -> str:
        return self._ids.next_id()

    # ------------------------------------------------------------------------------------ routes

    async def _route(self, topic: str) -> TopicRoute:
        return await self.instance.publish_route(
            topic,
            create_topic_key=self.config.create_topic_key,
            queue_nums=self.config.default_topic_queue_nums,
        )

    async def fetch_publish_queues(self, topic: str) -> list[MessageQueue]:
        """The topic's writable queues (what selectors choose from)."""
        self._check_running()
        return list((await self._route(topic)).publish_queues)

    # ------------------------------------------------------------------------------------ encode

    def _prepare(self, message: Message, extra: Mapping[str, str] | None = None) -> _Prepared:
        message.validate(self.config.message_size_max_bytes)
        if message.unique_id is None:
            message.unique_id = self._ids.next_id()
        properties = message.wire_properties(extra)
        sys_flag = 0
        body = bytes(message.body)
        threshold = self.config.compress_body_over_bytes
        if threshold and len(body) > threshold:
            compressed = zlib.compress(body, self.config.compress_level)
            if len(compressed) < len(body):
                body = compressed
                sys_flag |= SYSFLAG_COMPRESSED
        if properties.get(PROPERTY_TRANSACTION_PREPARED) == "true":
            sys_flag |= TRANSACTION_PREPARED_TYPE
        coalescable = (
            extra is None and sys_flag == 0 and message.wait_store_msg_ok and not message.delay_level
            and message.deliver_at_ms is None and not message.topic.startswith(RETRY_PREFIX)
        )
        return _Prepared(
            message.topic,
            body,
            encode_wire_properties(properties),
            sys_flag,
            message.flag,
            False,
            (message.unique_id,),
            coalescable,
        )

    def _prepare_batch(self, messages: Sequence[Message]) -> _Prepared:
        """Java's ``DefaultMQProducer.batch``: one topic, no delay, no retry topic, one WAIT setting."""
        if not messages:
            raise MessageValidationError("a batch needs at least one message")
        first = messages[0]
        records: list[bytes] = []
        for message in messages:
            message.validate(self.config.message_size_max_bytes)
            if message.topic != first.topic:
                raise MessageValidationError("every message of a batch must have the same topic")
            if message.topic.startswith(RETRY_PREFIX):
                raise MessageValidationError("retry-group messages cannot be batched")
            if message.delay_level or message.deliver_at_ms is not None:
                raise MessageValidationError("delayed messages cannot be batched")
            if message.wait_store_msg_ok != first.wait_store_msg_ok:
                raise MessageValidationError("the messages of a batch must agree on wait_store_msg_ok")
            if message.unique_id is None:
                message.unique_id = self._ids.next_id()
            records.append(encode_batch_record(bytes(message.body), message.wire_properties(), message.flag))
        body = b"".join(records)
        if len(body) > self.config.message_size_max_bytes * _BATCH_SIZE_MAX_MULTIPLIER:
            raise MessageValidationError(
                f"the encoded batch is {len(body)} bytes, over the limit of {self.config.message_size_max_bytes}"
            )
        properties = {PROPERTY_WAIT_STORE_MSG_OK: "true" if first.wait_store_msg_ok else "false"}
        return _Prepared(
            first.topic,
            body,
            encode_wire_properties(properties),
            0,
            0,
            True,
            tuple(message.unique_id or "" for message in messages),
        )

    def _header(self, prepared: _Prepared, queue: MessageQueue) -> dict[str, str]:
        """``SendMessageRequestHeaderV2``: the short names ``a``..``n`` in Java's order.

        A batch carries the long names (``SendMessageRequestHeader``) as well: Java brokers read a
        SEND_BATCH_MESSAGE header as V2, the raftmq broker (for now) reads the long names; each
        ignores the other's fields."""
        header = {
            "a": self.config.group,
            "b": prepared.topic,
            "c": self.config.create_topic_key,
            "d": str(self.config.default_topic_queue_nums),
            "e": str(queue.queue_id),
            "f": str(prepared.sys_flag),
            "g": str(self._clock_ms()),
            "h": str(prepared.flag),
            "i": prepared.properties,
            "j": "0",
            "k": "false",
            "m": "true" if prepared.batch else "false",
            "n": queue.broker_name,
        }
        if prepared.batch:
            header.update({long: header[short] for short, long in _V2_LONG_NAMES.items() if short in header})
        return header

    # -------------------------------------------------------------------------------------- send

    async def send(
        self,
        message: Message,
        *,
        queue: MessageQueue | None = None,
        selector: MessageQueueSelector | None = None,
        arg: object = None,
        timeout_seconds: float | None = None,
        extra_properties: Mapping[str, str] | None = None,
    ) -> SendResult:
        """Send and wait for the broker's acknowledgement. ``queue`` pins the queue; ``selector``
        (with ``arg``) picks it (an orderly send); otherwise queues rotate. ``extra_properties`` may
        set system properties (the transactional producer's). Raises
        :class:`~client.errors.MQClientError` subclasses."""
        self._check_running()
        prepared = self._prepare(message, extra_properties)
        return await self._send_prepared(prepared, queue, selector, message, arg, timeout_seconds)

    async def send_orderly(
        self, message: Message, selector: MessageQueueSelector, arg: object = None, **options: float
    ) -> SendResult:
        """Send to the queue ``selector(queues, message, arg)`` picks: messages with the same
        selection stay in order (see :mod:`client.selector`)."""
        return await self.send(message, selector=selector, arg=arg, timeout_seconds=options.get("timeout_seconds"))

    async def send_batch(
        self,
        messages: Sequence[Message],
        *,
        queue: MessageQueue | None = None,
        timeout_seconds: float | None = None,
    ) -> SendResult:
        """Send messages of one topic as one SEND_BATCH_MESSAGE: stored together, in order, in one queue."""
        self._check_running()
        prepared = self._prepare_batch(messages)
        return await self._send_prepared(prepared, queue, None, messages[0], None, timeout_seconds)

    def send_async(
        self,
        message: Message,
        *,
        queue: MessageQueue | None = None,
        selector: MessageQueueSelector | None = None,
        arg: object = None,
        timeout_seconds: float | None = None,
    ) -> asyncio.Task[SendResult]:
        """Start a send; the task's result is the :class:`SendResult` (or the error). At most
        ``inflight_sends_max`` run at once; later ones wait their turn inside the task."""
        self._check_running()
        prepared = self._prepare(message)  # validation errors raise here, at the call
        semaphore = self._inflight
        assert semaphore is not None

        async def run() -> SendResult:
            async with semaphore:
                return await self._send_prepared(prepared, queue, selector, message, arg, timeout_seconds)

        task = asyncio.get_running_loop().create_task(run(), name=f"send {message.unique_id}")
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)
        return task

    async def send_oneway(self, message: Message, *, queue: MessageQueue | None = None) -> None:
        """Send without waiting for an answer (no retry, no result): the fastest and least safe."""
        self._check_running()
        prepared = self._prepare(message)
        route = await self._route(message.topic)
        target = queue or self._round_robin.select(route.publish_queues)
        candidates = self.instance.candidate_addresses(target.broker_name)
        if not candidates:
            raise MQClientError(ResponseCode.SERVICE_NOT_AVAILABLE, f"no address for {target.broker_name!r}")
        code = RequestCode.SEND_MESSAGE_V2
        await self.instance.oneway(candidates[0], code, self._header(prepared, target), prepared.body)

    async def _send_prepared(
        self,
        prepared: _Prepared,
        queue: MessageQueue | None,
        selector: MessageQueueSelector | None,
        message: Message | None,
        arg: object,
        timeout_seconds: float | None,
        first_target: MessageQueue | None = None,
    ) -> SendResult:
        """Send with retries: to ``queue``, or the one ``selector`` picks, or else ``first_target`` and then
        round-robin's queues (a coalescable send is parked for its loop turn's batch instead)."""
        coalescer = self._coalescer
        if (coalescer is not None and prepared.coalescable and queue is None and selector is None
                and timeout_seconds is None and first_target is None):
            route = await self._route(prepared.topic)
            target = self._round_robin.select(route.publish_queues)
            record = encode_batch_message(prepared.body, prepared.properties.encode("utf-8"), prepared.flag)
            return await coalescer.park(prepared.topic, target, record, prepared.message_ids[0], prepared)
        timeout = self.config.send_timeout_seconds if timeout_seconds is None else timeout_seconds
        deadline = self.instance.now() + timeout
        attempts = 1 + (0 if queue is not None or selector is not None else self.config.retry_times_when_send_failed)
        last_error: MQClientError | None = None
        failed_broker: str | None = None
        for attempt in range(attempts):
            route = await self._route(prepared.topic)
            if queue is not None:
                target = queue
            elif selector is not None:
                assert message is not None  # (a selector send passes its message)
                target = selector(route.publish_queues, message, arg)
            elif first_target is not None and attempt == 0:
                target = first_target
            else:
                target = self._round_robin.select(route.publish_queues, failed_broker)
            try:
                return await self._send_once(prepared, target, deadline)
            except MQBrokerError as error:
                if error.code not in RETRIABLE_CODES or attempt + 1 >= attempts:
                    raise
                last_error = error
                failed_broker = target.broker_name
                logger.info("send to %s failed (%s); retrying", target, error)
                if error.code == ResponseCode.TOPIC_NOT_EXIST:
                    self.instance.forget_topic(prepared.topic)
                    await self.instance.refresh_routes_now()
                if self.instance.now() >= deadline:
                    raise
        assert last_error is not None
        raise last_error

    async def _send_coalesced_batch(self, topic: str, queue: MessageQueue, body: bytes,
                                    unique_ids: tuple[str, ...]) -> SendResult:
        prepared = _Prepared(topic, body, BATCH_PROPERTIES, 0, 0, True, unique_ids)
        return await self._send_prepared(prepared, None, None, None, None, None, first_target=queue)

    async def _send_coalesced_alone(self, prepared: _Prepared, queue: MessageQueue) -> SendResult:
        return await self._send_prepared(prepared, None, None, None, None, None, first_target=queue)

    async def _send_once(self, prepared: _Prepared, queue: MessageQueue, deadline: float) -> SendResult:
        code = RequestCode.SEND_BATCH_MESSAGE if prepared.batch else RequestCode.SEND_MESSAGE_V2
        response, address = await self.instance.invoke_leader(
            queue.broker_name, code, self._header(prepared, queue), prepared.body, deadline=deadline
        )
        status = _STATUS_BY_CODE.get(response.code)
        if status is None:
            raise broker_error(response.code, response.remark, address, dict(response.ext_fields))
        queue_id = int_field(response, "queueId", address)
        return SendResult(
            status=status,
            msg_id=join_ids(prepared.message_ids),
            message_queue=MessageQueue(queue.topic, queue.broker_name, queue_id),
            queue_offset=int_field(response, "queueOffset", address),
            offset_msg_id=response.ext_fields.get("msgId", ""),
            transaction_id=response.ext_fields.get("transactionId") or None,
            broker_address=address,
        )
