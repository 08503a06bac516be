"""The synchronous facade: each class owns an :class:`~client.loop.EventLoopThread` and forwards every
call to its asyncio counterpart. Same names, same arguments, blocking results; ``send_async`` returns a
``concurrent.futures.Future``.

Use them as context managers (``with Producer(...) as producer:``) or call ``start`` / ``close``.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Sequence
from typing import Any, Self

from client.admin import AsyncAdmin, ConsumerProgress, QueueOffsets
from client.config import ClientConfig, ProducerConfig
from client.loop import EventLoopThread
from client.message import Message, MessageExt, MessageQueue, SendResult
from client.producer import AsyncProducer
from client.route import TopicRoute
from client.selector import MessageQueueSelector


class _Facade:
    _loop: EventLoopThread

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def start(self) -> Self:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class Producer(_Facade):
    """Blocking :class:`~client.producer.AsyncProducer`."""

    def __init__(self, namesrv: str | ClientConfig, config: ProducerConfig | None = None, **options: Any) -> None:
        self._loop = EventLoopThread("raftmq-producer")
        self.async_producer = AsyncProducer(namesrv, config, **options)

    @property
    def group(self) -> str:
        return self.async_producer.group

    def start(self) -> Self:
        try:
            self._loop.run(self.async_producer.start())
        except BaseException:
            self._loop.stop()
            raise
        return self

    def close(self) -> None:
        try:
            self._loop.run(self.async_producer.close())
        finally:
            self._loop.stop()

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
        self._loop = EventLoopThread("raftmq-admin")
        self.async_admin = AsyncAdmin(namesrv, **options)

    def start(self) -> Self:
        try:
            self._loop.run(self.async_admin.start())
        except BaseException:
            self._loop.stop()
            raise
        return self

    def close(self) -> None:
        try:
            self._loop.run(self.async_admin.close())
        finally:
            self._loop.stop()

    def create_topic(self, topic: str, **options: Any) -> list[str]:
        return self._loop.run(self.async_admin.create_topic(topic, **options))

    def update_topic(self, topic: str, **options: Any) -> list[str]:
        return self._loop.run(self.async_admin.update_topic(topic, **options))

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

    def query_messages_by_key(self, topic: str, key: str, **options: Any) -> list[MessageExt]:
        return self._loop.run(self.async_admin.query_messages_by_key(topic, key, **options))

    def view_message(self, offset_msg_id: str) -> MessageExt:
        return self._loop.run(self.async_admin.view_message(offset_msg_id))

    def query_message_by_id(self, msg_id: str, topic: str | None = None) -> MessageExt:
        return self._loop.run(self.async_admin.query_message_by_id(msg_id, topic))
