"""The low-level pull consumer (Java's ``DefaultMQPullConsumer``): you choose the queue and the
offset of every pull and keep the offsets yourself, with the broker's offset store as a helper."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Self

from client.config import ClientConfig, ConsumerConfig, MessageModel
from client.consumer_api import parse_subscription, pull_message, queue_offset, send_message_back
from client.errors import ClientNotRunningError
from client.instance import ClientInstance
from client.message import MessageExt, MessageQueue, PullResult, check_topic
from client.offset_store import LocalFileOffsetStore, OffsetStore, RemoteOffsetStore
from client.running_info import consumer_properties, encode_running_info
from protocol.codes import RequestCode, ResponseCode
from protocol.command import RemotingCommand, make_response


class AsyncPullConsumer:
    def __init__(
        self,
        namesrv: str | ClientConfig,
        config: ConsumerConfig | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        self.config = (config or ConsumerConfig()).validate()
        self.instance = ClientInstance(ClientConfig.of(namesrv), clock=clock, rng=rng)
        self._offset_store: OffsetStore = (
            LocalFileOffsetStore(self.config.offset_store_dir, self.config.group)
            if self.config.message_model is MessageModel.BROADCASTING
            else RemoteOffsetStore(self.instance, self.config.group)
        )
        self._topics: set[str] = set()
        self._started = False
        self._closed = False
        self._start_ms = 0

    @property
    def group(self) -> str:
        return self.config.group

    def register_topic(self, topic: str) -> None:
        """Announce ``topic`` in heartbeats (brokers list the group as its consumer)."""
        self._topics.add(check_topic(topic))

    def _heartbeat_data(self) -> tuple[list[dict[str, object]], list[dict[str, object]]]:
        return [], [
            {
                "groupName": self.config.group,
                "consumeType": "CONSUME_ACTIVELY",
                "messageModel": self.config.message_model.value,
                "consumeFromWhere": self.config.consume_from_where.value,
                "unitMode": False,
                "subscriptionDataSet": [
                    parse_subscription(topic, "*", 0).to_json_object() for topic in sorted(self._topics)
                ],
            }
        ]

    async def _on_running_info(self, address: str, request: RemotingCommand) -> RemotingCommand | None:
        """GET_CONSUMER_RUNNING_INFO: its configuration and topics (the caller keeps queues and offsets, so it
        reports none, as Java's pull consumer)."""
        group = request.ext_fields.get("consumerGroup")
        if group != self.group:
            return make_response(request, ResponseCode.SYSTEM_ERROR,
                                 f"The Consumer Group <{group}> not exist in this consumer")
        properties = consumer_properties(self.config, self.instance.config.namesrv_addresses, self.instance.client_id,
                                         consume_type="CONSUME_ACTIVELY", orderly=False, threads=0,
                                         start_ms=self._start_ms)
        subscriptions = [parse_subscription(topic, "*", 0).to_json_object() for topic in sorted(self._topics)]
        return make_response(request, ResponseCode.SUCCESS,
                             body=encode_running_info(properties, subscriptions, {}, {}))

    async def start(self) -> Self:
        if self._closed:
            raise ClientNotRunningError("the consumer was closed")
        if not self._started:
            await self._offset_store.load()
            self.instance.add_heartbeat_source(self._heartbeat_data)
            self.instance.register_request_handler(RequestCode.GET_CONSUMER_RUNNING_INFO, self._on_running_info)
            self._start_ms = time.time_ns() // 1_000_000
            await self.instance.start()
            self._started = True
        return self

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._started:
            await self._offset_store.persist()
            await self.instance.unregister_client(None, self.config.group)
        await self.instance.close()

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def _check_running(self) -> None:
        if not self._started or self._closed:
            raise ClientNotRunningError("the consumer is not running (call start() first)")

    async def fetch_subscribe_queues(self, topic: str) -> list[MessageQueue]:
        """The topic's readable queues."""
        self._check_running()
        return list((await self.instance.topic_route(topic, refresh=True)).subscribe_queues)

    async def pull(
        self,
        queue: MessageQueue,
        expression: str = "*",
        offset: int = 0,
        max_nums: int = 32,
        *,
        block_seconds: float = 0.0,
    ) -> PullResult:
        """Messages of ``queue`` from ``offset`` matching ``expression``; with ``block_seconds`` the
        broker holds the pull until a message arrives or that time passes (long polling)."""
        self._check_running()
        if queue.topic not in self._topics:
            self._topics.add(queue.topic)
            self.instance.spawn(self.instance.send_heartbeat_to_all(), "heartbeat new topic")
        if not self.instance.candidate_addresses(queue.broker_name):
            # as Java's pullKernelImpl: a queue of a topic whose route it never fetched gets the route first
            await self.instance.topic_route(queue.topic, refresh=True)
        subscription = parse_subscription(queue.topic, expression, 0)
        return await pull_message(
            self.instance, self.config.group, queue, subscription, offset, max_nums, suspend_seconds=block_seconds
        )

    async def fetch_consume_offset(self, queue: MessageQueue, *, from_store: bool = True) -> int | None:
        self._check_running()
        if not from_store:
            return self._offset_store.read_memory(queue)
        return await self._offset_store.read_store(queue)

    async def update_consume_offset(self, queue: MessageQueue, offset: int, *, persist: bool = False) -> None:
        """Remember ``offset`` (the next to consume); committed at close, or now with ``persist``."""
        self._check_running()
        self._offset_store.update(queue, offset, increase_only=False)
        if persist:
            await self._offset_store.persist([queue])

    async def max_offset(self, queue: MessageQueue) -> int:
        self._check_running()
        return await queue_offset(self.instance, RequestCode.GET_MAX_OFFSET, queue)

    async def min_offset(self, queue: MessageQueue) -> int:
        self._check_running()
        return await queue_offset(self.instance, RequestCode.GET_MIN_OFFSET, queue)

    async def search_offset(self, queue: MessageQueue, timestamp_ms: int) -> int:
        self._check_running()
        return await queue_offset(
            self.instance, RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, queue, timestamp=str(timestamp_ms)
        )

    async def send_message_back(self, message: MessageExt, delay_level: int = 0) -> None:
        """Have the broker redeliver ``message`` to this group later (through its retry topic)."""
        self._check_running()
        await send_message_back(
            self.instance,
            self.config.group,
            message,
            delay_level=delay_level,
            max_reconsume_times=self.config.max_reconsume_times,
            deadline=self.instance.now() + self.instance.config.request_timeout_seconds * 2,
        )
