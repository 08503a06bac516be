"""The synchronous facade: each class owns an :class:`~client.loop.EventLoopThread` and forwards every
call to its asyncio counterpart. Same names, same arguments, blocking results; ``send_async`` returns a
``concurrent.futures.Future``.

Use them as context managers (``with Producer(...) as producer:``) or call ``start`` / ``close``.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, Self

from client.admin import (
    AsyncAdmin,
    ClientConnection,
    ConsumerConnection,
    ConsumerProgress,
    QueueConsumeStats,
    QueueOffsets,
    TopicQueueStats,
)
from client.config import ClientConfig, ConsumerConfig, ProducerConfig
from client.lite_pull_consumer import AsyncLitePullConsumer
from client.loop import EventLoopThread
from client.message import Message, MessageExt, MessageQueue, PullResult, SendResult
from client.producer import AsyncProducer
from client.pull_consumer import AsyncPullConsumer
from client.push_consumer import AsyncPushConsumer, MessageListener
from client.route import TopicRoute
from client.running_info import ConsumerRunningInfo
from client.selector import MessageQueueSelector
from client.transaction import AsyncTransactionProducer, TransactionListener, TransactionSendResult


class _Lifecycle(Protocol):
    async def start(self) -> object: ...

    async def close(self) -> None: ...


class _Facade:
    """Start, close and the context manager, around the asyncio object :meth:`_target` returns. The
    loop thread is stopped by :meth:`close` (and when :meth:`start` fails)."""

    _loop: EventLoopThread

    def _target(self) -> _Lifecycle:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def start(self) -> Self:
        try:
            self._loop.run(self._target().start())
        except BaseException:
            with contextlib.suppress(Exception):
                self._loop.run(self._target().close())
            self._loop.stop()
            raise
        return self

    def close(self) -> None:
        try:
            self._loop.run(self._target().close())
        finally:
            self._loop.stop()


class Producer(_Facade):
    """Blocking :class:`~client.producer.AsyncProducer`."""

    def __init__(self, namesrv: str | ClientConfig, config: ProducerConfig | None = None, **options: Any) -> None:
        self.async_producer = AsyncProducer(namesrv, config, **options)
        self._loop = EventLoopThread("raftmq-producer")

    @property
    def group(self) -> str:
        return self.async_producer.group

    def _target(self) -> _Lifecycle:
        return self.async_producer

    def send(
        self,
        message: Message,
        *,
        queue: MessageQueue | None = None,
        selector: MessageQueueSelector | None = None,
        arg: object = None,
        timeout_seconds: float | None = None,
    ) -> SendResult:
        return self._loop.run(
            self.async_producer.send(message, queue=queue, selector=selector, arg=arg, timeout_seconds=timeout_seconds)
        )

    def send_orderly(self, message: Message, selector: MessageQueueSelector, arg: object = None) -> SendResult:
        return self._loop.run(self.async_producer.send_orderly(message, selector, arg))

    def send_batch(self, messages: Sequence[Message], *, queue: MessageQueue | None = None) -> SendResult:
        return self._loop.run(self.async_producer.send_batch(messages, queue=queue))

    def send_oneway(self, message: Message, *, queue: MessageQueue | None = None) -> None:
        self._loop.run(self.async_producer.send_oneway(message, queue=queue))

    def send_async(
        self,
        message: Message,
        *,
        queue: MessageQueue | None = None,
        selector: MessageQueueSelector | None = None,
        arg: object = None,
    ) -> concurrent.futures.Future[SendResult]:
        """Start a send; the future completes with its :class:`SendResult` or error."""
        producer = self.async_producer

        async def send() -> SendResult:
            return await producer.send_async(message, queue=queue, selector=selector, arg=arg)

        return self._loop.submit(send())

    def fetch_publish_queues(self, topic: str) -> list[MessageQueue]:
        return self._loop.run(self.async_producer.fetch_publish_queues(topic))


class Admin(_Facade):
    """Blocking :class:`~client.admin.AsyncAdmin`."""

    def __init__(self, namesrv: str | ClientConfig, **options: Any) -> None:
        self.async_admin = AsyncAdmin(namesrv, **options)
        self._loop = EventLoopThread("raftmq-admin")

    def _target(self) -> _Lifecycle:
        return self.async_admin

    def create_topic(self, topic: str, **options: Any) -> list[str]:
        return self._loop.run(self.async_admin.create_topic(topic, **options))

    def update_topic(self, topic: str, **options: Any) -> list[str]:
        return self._loop.run(self.async_admin.update_topic(topic, **options))

    def update_group(self, group: str, **options: Any) -> list[str]:
        return self._loop.run(self.async_admin.update_group(group, **options))

    def delete_group(self, group: str, **options: Any) -> list[str]:
        return self._loop.run(self.async_admin.delete_group(group, **options))

    def list_topics(self, *, include_system: bool = False) -> list[str]:
        return self._loop.run(self.async_admin.list_topics(include_system=include_system))

    def describe_topic(self, topic: str) -> TopicRoute:
        return self._loop.run(self.async_admin.describe_topic(topic))

    def topic_offsets(self, topic: str) -> list[QueueOffsets]:
        return self._loop.run(self.async_admin.topic_offsets(topic))

    def max_offset(self, queue: MessageQueue) -> int:
        return self._loop.run(self.async_admin.max_offset(queue))

    def min_offset(self, queue: MessageQueue) -> int:
        return self._loop.run(self.async_admin.min_offset(queue))

    def search_offset(self, queue: MessageQueue, timestamp_ms: int) -> int:
        return self._loop.run(self.async_admin.search_offset(queue, timestamp_ms))

    def consumer_offset(self, group: str, queue: MessageQueue) -> int | None:
        return self._loop.run(self.async_admin.consumer_offset(group, queue))

    def consumer_ids(self, group: str, topic: str | None = None) -> list[str]:
        return self._loop.run(self.async_admin.consumer_ids(group, topic))

    def consumer_progress(self, group: str, topics: Sequence[str] | None = None) -> ConsumerProgress:
        return self._loop.run(self.async_admin.consumer_progress(group, topics))

    def topic_stats(self, topic: str) -> list[TopicQueueStats]:
        return self._loop.run(self.async_admin.topic_stats(topic))

    def consume_stats(self, group: str, topic: str | None = None) -> list[QueueConsumeStats]:
        return self._loop.run(self.async_admin.consume_stats(group, topic))

    def consume_tps(self, group: str, topic: str | None = None) -> float:
        return self._loop.run(self.async_admin.consume_tps(group, topic))

    def consumer_connections(self, group: str) -> ConsumerConnection:
        return self._loop.run(self.async_admin.consumer_connections(group))

    def producer_connections(self, group: str) -> list[ClientConnection]:
        return self._loop.run(self.async_admin.producer_connections(group))

    def consumer_running_info(self, group: str, client_id: str, *, jstack: bool = False) -> ConsumerRunningInfo:
        return self._loop.run(self.async_admin.consumer_running_info(group, client_id, jstack=jstack))

    def query_messages_by_key(self, topic: str, key: str, **options: Any) -> list[MessageExt]:
        return self._loop.run(self.async_admin.query_messages_by_key(topic, key, **options))

    def view_message(self, offset_msg_id: str) -> MessageExt:
        return self._loop.run(self.async_admin.view_message(offset_msg_id))

    def query_message_by_id(self, msg_id: str, topic: str | None = None) -> MessageExt:
        return self._loop.run(self.async_admin.query_message_by_id(msg_id, topic))


class PushConsumer(_Facade):
    """Blocking :class:`~client.push_consumer.AsyncPushConsumer`: listeners run in worker threads."""

    def __init__(self, namesrv: str | ClientConfig, config: ConsumerConfig | None = None, **options: Any) -> None:
        self.async_consumer = AsyncPushConsumer(namesrv, config, **options)
        self._loop = EventLoopThread("raftmq-push-consumer")

    def subscribe(self, topic: str, expression: str = "*") -> None:
        self._loop.call(lambda: self.async_consumer.subscribe(topic, expression))

    def unsubscribe(self, topic: str) -> None:
        self._loop.call(lambda: self.async_consumer.unsubscribe(topic))

    def register_listener(self, listener: MessageListener) -> None:
        self.async_consumer.register_listener(listener)

    def register_orderly_listener(self, listener: MessageListener) -> None:
        self.async_consumer.register_orderly_listener(listener)

    def _target(self) -> _Lifecycle:
        return self.async_consumer

    def assigned_queues(self) -> list[MessageQueue]:
        return self._loop.call(self.async_consumer.assigned_queues)

    @property
    def client_id(self) -> str:
        """The id brokers know this consumer by (``raftmq group status``, GET_CONSUMER_RUNNING_INFO)."""
        return self.async_consumer.client_id

    def offsets(self) -> dict[MessageQueue, int]:
        return self._loop.call(self.async_consumer.offsets)

    def persist_offsets(self) -> None:
        self._loop.run(self.async_consumer.persist_offsets())


class LitePullConsumer(_Facade):
    """Blocking :class:`~client.lite_pull_consumer.AsyncLitePullConsumer`."""

    def __init__(self, namesrv: str | ClientConfig, config: ConsumerConfig | None = None, **options: Any) -> None:
        self.async_consumer = AsyncLitePullConsumer(namesrv, config, **options)
        self._loop = EventLoopThread("raftmq-lite-pull-consumer")

    def subscribe(self, topic: str, expression: str = "*") -> None:
        self._loop.call(lambda: self.async_consumer.subscribe(topic, expression))

    def assign(self, queues: Sequence[MessageQueue]) -> None:
        self._loop.call(lambda: self.async_consumer.assign(queues))

    def _target(self) -> _Lifecycle:
        return self.async_consumer

    def poll(self, timeout_seconds: float = 5.0) -> list[MessageExt]:
        return self._loop.run(self.async_consumer.poll(timeout_seconds))

    def commit(self, offsets: Mapping[MessageQueue, int] | None = None) -> None:
        self._loop.run(self.async_consumer.commit(offsets))

    def committed(self, queue: MessageQueue) -> int | None:
        return self._loop.run(self.async_consumer.committed(queue))

    def seek(self, queue: MessageQueue, offset: int) -> None:
        self._loop.run(self.async_consumer.seek(queue, offset))

    def assigned_queues(self) -> list[MessageQueue]:
        return self._loop.call(self.async_consumer.assigned_queues)

    @property
    def client_id(self) -> str:
        """The id brokers know this consumer by (``raftmq group status``, GET_CONSUMER_RUNNING_INFO)."""
        return self.async_consumer.client_id


class PullConsumer(_Facade):
    """Blocking :class:`~client.pull_consumer.AsyncPullConsumer`."""

    def __init__(self, namesrv: str | ClientConfig, config: ConsumerConfig | None = None, **options: Any) -> None:
        self.async_consumer = AsyncPullConsumer(namesrv, config, **options)
        self._loop = EventLoopThread("raftmq-pull-consumer")

    def _target(self) -> _Lifecycle:
        return self.async_consumer

    def fetch_subscribe_queues(self, topic: str) -> list[MessageQueue]:
        return self._loop.run(self.async_consumer.fetch_subscribe_queues(topic))

    def pull(
        self, queue: MessageQueue, expression: str = "*", offset: int = 0, max_nums: int = 32, *,
        block_seconds: float = 0.0,
    ) -> PullResult:
        return self._loop.run(
            self.async_consumer.pull(queue, expression, offset, max_nums, block_seconds=block_seconds)
        )

    def fetch_consume_offset(self, queue: MessageQueue) -> int | None:
        return self._loop.run(self.async_consumer.fetch_consume_offset(queue))

    def update_consume_offset(self, queue: MessageQueue, offset: int, *, persist: bool = False) -> None:
        self._loop.run(self.async_consumer.update_consume_offset(queue, offset, persist=persist))

    def max_offset(self, queue: MessageQueue) -> int:
        return self._loop.run(self.async_consumer.max_offset(queue))

    def min_offset(self, queue: MessageQueue) -> int:
        return self._loop.run(self.async_consumer.min_offset(queue))

    def send_message_back(self, message: MessageExt, delay_level: int = 0) -> None:
        self._loop.run(self.async_consumer.send_message_back(message, delay_level))


class TransactionProducer(Producer):
    """Blocking :class:`~client.transaction.AsyncTransactionProducer`: listener methods run in threads."""

    def __init__(
        self,
        namesrv: str | ClientConfig,
        config: ProducerConfig | None = None,
        *,
        listener: TransactionListener,
        **options: Any,
    ) -> None:
        self.async_producer = AsyncTransactionProducer(namesrv, config, listener=listener, **options)
        self._loop = EventLoopThread("raftmq-transaction-producer")

    def send_message_in_transaction(self, message: Message, arg: object = None) -> TransactionSendResult:
        producer = self.async_producer
        assert isinstance(producer, AsyncTransactionProducer)
        return self._loop.run(producer.send_message_in_transaction(message, arg))
