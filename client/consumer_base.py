"""What push and lite-pull consumers share (Java's ``RebalanceImpl``, ``PullMessageService`` and the
consumer half of ``MQClientInstance``): subscriptions, heartbeats, rebalance, one pull task per
assigned queue with long polling and flow control, offsets, and queue locks for orderly consumers.

Rebalance runs at start, every ``rebalance_interval_seconds``, and at once when a broker sends
NOTIFY_CONSUMER_IDS_CHANGED. A member that does not find itself in the group's member list (a new
leader that has not heard its heartbeat yet) heartbeats again and keeps its queues rather than
dropping them.

Delivery is at least once: an offset is committed only after every message below it was consumed.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
import os
import random
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Final, Self

from client.allocate import AllocateFunction, allocate_averagely, allocate_consistent_hash
from client.config import AllocateStrategy, ClientConfig, ConsumeFromWhere, ConsumerConfig, MessageModel
from client.consumer_api import (
    Subscription,
    consumer_ids,
    lock_queues,
    parse_subscription,
    pull_message,
    queue_offset,
    unlock_queues,
)
from client.errors import ClientNotRunningError, MQClientError, TopicNotFoundError
from client.instance import ClientInstance
from client.message import MessageExt, MessageQueue, PullStatus, check_topic
from client.offset_store import LocalFileOffsetStore, OffsetStore, RemoteOffsetStore
from client.process_queue import ProcessQueue
from client.running_info import JSTACK_CHARS_MAX, ConsumeStats, consumer_properties, encode_running_info
from protocol.codes import RequestCode, ResponseCode
from protocol.command import RemotingCommand, make_response
from protocol.properties import PROPERTY_RETRY_TOPIC
from protocol.route_data import MASTER_ID
from protocol.topics import RETRY_PREFIX, retry_topic

logger = logging.getLogger(__name__)

#: a queue lock not renewed for this long is no longer trusted (Java: 30 s; brokers expire at 60 s)
LOCK_TRUST_SECONDS: Final = 30.0
#: how long close() waits for listener calls still running
CLOSE_WAIT_SECONDS: Final = 10.0
_ALLOCATORS: Final[dict[AllocateStrategy, AllocateFunction]] = {
    AllocateStrategy.AVERAGELY: allocate_averagely,
    AllocateStrategy.CONSISTENT_HASH: allocate_consistent_hash,
}


def restore_retry_topic(message: MessageExt, group: str) -> MessageExt:
    """A redelivery from ``%RETRY%<group>`` shows its original topic (Java's ``resetRetryAndNamespace``)."""
    original = message.properties.get(PROPERTY_RETRY_TOPIC)
    if original and message.topic == retry_topic(group):
        return message.with_changes(topic=original, queue_topic=message.topic)
    return message


class ConsumerBase:
    """Subclasses deliver pulled messages (:meth:`_deliver`) and say whether they consume orderly."""

    consume_type = "CONSUME_PASSIVELY"

    def __init__(
        self,
        namesrv: str | ClientConfig,
        config: ConsumerConfig | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        self.config = (config or ConsumerConfig()).validate()
        self.instance = ClientInstance(ClientConfig.of(namesrv), clock=clock, rng=rng or random.Random(os.urandom(8)))
        self._subscriptions: dict[str, Subscription] = {}
        self._process_queues: dict[MessageQueue, ProcessQueue] = {}
        self._pull_tasks: dict[MessageQueue, asyncio.Task[None]] = {}
        self._pull_from: dict[MessageQueue, int] = {}
        self._offset_store: OffsetStore = (
            LocalFileOffsetStore(self.config.offset_store_dir, self.config.group)
            if self.is_broadcasting
            else RemoteOffsetStore(self.instance, self.config.group)
        )
        self._allocate = _ALLOCATORS[self.config.allocate_strategy]
        self._rebalance_wanted: asyncio.Event | None = None
        self._rebalance_lock: asyncio.Lock | None = None
        self._service_tasks: list[asyncio.Task[None]] = []
        self._started = False
        self._closed = False
        #: set when close() begins: no new listener call starts
        self._closing = False
        self._orderly = False
        #: manual assignment (lite pull ``assign``) instead of rebalance
        self._assigned: set[MessageQueue] | None = None
        #: pull and consume figures per topic, for GET_CONSUMER_RUNNING_INFO
        self.stats = ConsumeStats(self.instance.now)
        self._start_ms = 0

    # ----------------------------------------------------------------------------- properties

    @property
    def group(self) -> str:
        return self.config.group

    @property
    def is_broadcasting(self) -> bool:
        return self.config.message_model is MessageModel.BROADCASTING

    @property
    def client_id(self) -> str:
        return self.instance.client_id

    def assigned_queues(self) -> list[MessageQueue]:
        """The queues this member pulls now."""
        return sorted(self._process_queues)

    def offsets(self) -> dict[MessageQueue, int]:
        """Offsets in memory (committed ones, and ones waiting for the next persist)."""
        return self._offset_store.snapshot()

    # ------------------------------------------------------------------------- subscriptions

    def subscribe(self, topic: str, expression: str = "*") -> None:
        """Consume ``topic`` messages whose tag matches ``expression`` (``"*"``, ``"A || B"``)."""
        check_topic(topic)
        self._subscriptions[topic] = parse_subscription(topic, expression, time.time_ns() // 1_000_000)
        if self._started:
            self._request_rebalance()
            self.instance.spawn(self.instance.send_heartbeat_to_all(), "heartbeat after subscribe")

    def unsubscribe(self, topic: str) -> None:
        self._subscriptions.pop(topic, None)
        if self._started:
            self._request_rebalance()

    def subscriptions(self) -> dict[str, str]:
        return {topic: subscription.expression for topic, subscription in self._subscriptions.items()}

    def _heartbeat_data(self) -> tuple[list[dict[str, object]], list[dict[str, object]]]:
        return [], [
            {
                "groupName": self.config.group,
                "consumeType": self.consume_type,
                "messageModel": self.config.message_model.value,
                "consumeFromWhere": self.config.consume_from_where.value,
                "unitMode": False,
                "subscriptionDataSet": [sub.to_json_object() for sub in self._subscriptions.values()],
            }
        ]

    # ------------------------------------------------------------------------------ life cycle

    async def start(self) -> Self:
        if self._closed:
            raise ClientNotRunningError("the consumer was closed")
        if self._started:
            return self
        if not self.is_broadcasting and self._assigned is None:
            # clustering members also receive what the group sent back for a later retry
            self._subscriptions.setdefault(
                retry_topic(self.config.group),
                parse_subscription(retry_topic(self.config.group), "*", time.time_ns() // 1_000_000),
            )
        await self._offset_store.load()
        self._rebalance_wanted = asyncio.Event()
        self._rebalance_lock = asyncio.Lock()
        self.instance.add_heartbeat_source(self._heartbeat_data)
        self.instance.register_request_handler(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, self._on_ids_changed)
        self.instance.register_request_handler(RequestCode.GET_CONSUMER_RUNNING_INFO, self._on_running_info)
        self._start_ms = time.time_ns() // 1_000_000
        await self.instance.start()
        topics = {*self._subscriptions, *(queue.topic for queue in self._assigned or ())}
        for topic in sorted(topics):
            with contextlib.suppress(TopicNotFoundError):
                await self.instance.topic_route(topic)
        await self.instance.send_heartbeat_to_all()
        self._started = True
        await self.rebalance()
        loop = asyncio.get_running_loop()
        self._service_tasks = [
            loop.create_task(self._rebalance_loop(), name=f"rebalance {self.group}"),
            loop.create_task(self._persist_loop(), name=f"persist offsets {self.group}"),
        ]
        if self._orderly and not self.is_broadcasting:
            self._service_tasks.append(loop.create_task(self._lock_loop(), name=f"lock queues {self.group}"))
        return self

    async def close(self) -> None:
        """Stop pulling, let running listener calls finish, commit offsets, release queue locks,
        unregister from the brokers; idempotent."""
        if self._closed:
            return
        self._closed = True
        self._closing = True
        if not self._started:
            await self.instance.close()
            return
        for task in self._service_tasks:
            task.cancel()
        await asyncio.gather(*self._service_tasks, return_exceptions=True)
        pull_tasks = list(self._pull_tasks.values())
        for task in pull_tasks:
            task.cancel()
        await asyncio.gather(*pull_tasks, return_exceptions=True)
        await self._drain_consumers(CLOSE_WAIT_SECONDS)
        try:
            await self._offset_store.persist()
        except MQClientError as error:
            logger.warning("%s: committing offsets at shutdown failed: %s", self.group, error)
        queues = list(self._process_queues)
        for queue in queues:
            self._process_queues[queue].drop()
        if self._orderly and not self.is_broadcasting:
            await self._unlock(queues)
        self._process_queues.clear()
        await self.instance.unregister_client(None, self.config.group)
        await self.instance.close()

    async def _drain_consumers(self, timeout_seconds: float) -> None:
        """Subclasses wait for their running listener calls here."""

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def _check_running(self) -> None:
        if not self._started or self._closed:
            raise ClientNotRunningError("the consumer is not running (call start() first)")

    # ---------------------------------------------------------------------------- running info

    async def _on_running_info(self, address: str, request: RemotingCommand) -> RemotingCommand | None:
        """GET_CONSUMER_RUNNING_INFO, passed on by a broker (``mqadmin consumerStatus``)."""
        group = request.ext_fields.get("consumerGroup")
        if group != self.group:
            return make_response(request, ResponseCode.SYSTEM_ERROR,
                                 f"The Consumer Group <{group}> not exist in this consumer")
        jstack = request.ext_fields.get("jstackEnable", "false").strip().lower() == "true"
        return make_response(request, ResponseCode.SUCCESS, body=self.running_info(jstack=jstack))

    def _consume_threads(self) -> int:
        """Listener calls at once (``PROP_THREADPOOL_CORE_SIZE``)."""
        return self.config.consume_concurrency

    def running_info(self, *, jstack: bool = False) -> bytes:
        """This consumer's ``ConsumerRunningInfo`` body, as the reference clients write it."""
        properties = consumer_properties(self.config, self.instance.config.namesrv_addresses, self.client_id,
                                         consume_type=self.consume_type, orderly=self._orderly,
                                         threads=self._consume_threads(), start_ms=self._start_ms)
        now_ms = time.time_ns() // 1_000_000
        now = self.instance.now()
        queues = {}
        for queue, process_queue in self._process_queues.items():
            lock_ms = now_ms - int((now - process_queue.last_lock_time) * 1000) if process_queue.last_lock_time else 0
            commit = self._offset_store.read_memory(queue)
            queues[queue] = process_queue.info(-1 if commit is None else commit, lock_ms)
        topics = sorted({*self._subscriptions, *(queue.topic for queue in self._process_queues)})
        return encode_running_info(
            properties,
            [subscription.to_json_object() for subscription in self._subscriptions.values()],
            queues,
            {topic: self.stats.status(topic) for topic in topics},
            python_stacks() if jstack else "",
        )

    # ------------------------------------------------------------------------------- rebalance

    async def _on_ids_changed(self, address: str, request: RemotingCommand) -> RemotingCommand | None:
        self._request_rebalance()
        return None  # a oneway notification

    def _request_rebalance(self) -> None:
        if self._rebalance_wanted is not None:
            self._rebalance_wanted.set()

    async def _rebalance_loop(self) -> None:
        assert self._rebalance_wanted is not None
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.config.rebalance_interval_seconds):
                    await self._rebalance_wanted.wait()
            self._rebalance_wanted.clear()
            try:
                await self.rebalance()
            except MQClientError as error:
                logger.info("%s: rebalance failed: %s", self.group, error)

    async def rebalance(self) -> None:
        """Recompute this member's queues of every subscribed topic and start or stop pulling."""
        assert self._rebalance_lock is not None
        async with self._rebalance_lock:
            if self._assigned is not None:
                for topic in {queue.topic for queue in self._assigned}:
                    if self.instance.cached_route(topic) is None:
                        with contextlib.suppress(TopicNotFoundError):
                            await self.instance.topic_route(topic)
                await self._apply_assignment(None, set(self._assigned))
                return
            for topic in [queue.topic for queue in self._process_queues if queue.topic not in self._subscriptions]:
                await self._apply_assignment(topic, set())
            for topic in list(self._subscriptions):
                allocated = await self._allocation(topic)
                if allocated is not None:
                    await self._apply_assignment(topic, allocated)

    async def _allocation(self, topic: str) -> set[MessageQueue] | None:
        """This member's share of ``topic``; None to keep the current assignment (no answer)."""
        try:
            route = await self.instance.topic_route(topic)
        except TopicNotFoundError:
            if not topic.startswith(RETRY_PREFIX):
                logger.info("%s: topic %s has no route yet", self.group, topic)
            return None
        queues = list(route.subscribe_queues)
        if self.is_broadcasting:
            return set(queues)
        members = await consumer_ids(self.instance, self.group, route.broker_names)
        if members is not None and self.client_id not in members:
            await self.instance.send_heartbeat_to_all()
            members = await consumer_ids(self.instance, self.group, route.broker_names)
        if members is None or self.client_id not in members:
            logger.info("%s: member list of %s does not hold %s yet", self.group, topic, self.client_id)
            return None
        return set(self._allocate(self.group, self.client_id, queues, members))

    async def _apply_assignment(self, topic: str | None, allocated: set[MessageQueue]) -> None:
        current = {queue for queue in self._process_queues if topic is None or queue.topic == topic}
        removed = sorted(current - allocated)
        added = sorted(allocated - current)
        for queue in removed:
            await self._drop_queue(queue)
        if removed and self._orderly and not self.is_broadcasting:
            await self._unlock(removed)
        for queue in added:
            self._add_queue(queue)
        if removed or added:
            logger.info("%s: %s now pulls %d queues (+%d -%d)", self.group, topic or "assigned", len(
                [q for q in self._process_queues if topic is None or q.topic == topic]), len(added), len(removed))

    def _add_queue(self, queue: MessageQueue, offset: int | None = None) -> ProcessQueue:
        process_queue = ProcessQueue(queue, self.config.pull_threshold_per_queue)
        process_queue.next_offset = offset
        self._process_queues[queue] = process_queue
        task = asyncio.get_running_loop().create_task(self._pull_loop(process_queue), name=f"pull {queue}")
        self._pull_tasks[queue] = task
        task.add_done_callback(lambda _: self._forget_pull_task(queue, task))
        return process_queue

    def _forget_pull_task(self, queue: MessageQueue, task: asyncio.Task[None]) -> None:
        if self._pull_tasks.get(queue) is task:
            del self._pull_tasks[queue]

    async def _drop_queue(self, queue: MessageQueue) -> None:
        """Stop pulling ``queue``; commit its offset (after a running orderly batch) and forget it."""
        process_queue = self._process_queues.pop(queue, None)
        if process_queue is None:
            return
        process_queue.drop()
        task = self._pull_tasks.pop(queue, None)
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        async with process_queue.consume_lock:
            try:
                await self._offset_store.persist([queue])
            except MQClientError as error:
                logger.warning("%s: committing the offset of dropped %s failed: %s", self.group, queue, error)
            self._offset_store.remove(queue)
            process_queue.clear()

    # ------------------------------------------------------------------------------- offsets

    async def _initial_offset(self, queue: MessageQueue) -> int:
        """Java's ``computePullFromWhere``: the committed offset, else by ``consume_from_where``."""
        if self.is_broadcasting:
            offset = self._offset_store.read_memory(queue)
        else:
            offset = await self._offset_store.read_store(queue)
        if offset is not None and offset >= 0:
            return offset
        where = self.config.consume_from_where
        is_retry = queue.topic.startswith(RETRY_PREFIX)
        if where is ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET or (
            is_retry and where is ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET
        ):
            return await queue_offset(self.instance, RequestCode.GET_MIN_OFFSET, queue)
        if where is ConsumeFromWhere.CONSUME_FROM_TIMESTAMP and not is_retry:
            return await queue_offset(
                self.instance,
                RequestCode.SEARCH_OFFSET_BY_TIMESTAMP,
                queue,
                timestamp=str(self.config.consume_timestamp_ms),
            )
        return await queue_offset(self.instance, RequestCode.GET_MAX_OFFSET, queue)

    def _commit_local(self, queue: MessageQueue, offset: int | None, *, increase_only: bool = True) -> None:
        if offset is not None and queue in self._process_queues:
            self._offset_store.update(queue, offset, increase_only=increase_only)

    async def _persist_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.persist_offsets_interval_seconds)
            try:
                await self._offset_store.persist(list(self._process_queues))
            except MQClientError as error:
                logger.info("%s: offset commit failed: %s", self.group, error)

    async def persist_offsets(self) -> None:
        """Commit the offsets consumed so far now (raises if a commit fails)."""
        await self._offset_store.persist(list(self._process_queues))

    # ---------------------------------------------------------------------------------- pulling

    async def _pull_loop(self, process_queue: ProcessQueue) -> None:
        queue = process_queue.queue
        subscription = self._subscriptions.get(queue.topic) or parse_subscription(queue.topic, "*", 0)
        backoff = self.config.pull_backoff_seconds
        while not process_queue.is_dropped():
            try:
                if process_queue.next_offset is None:
                    process_queue.next_offset = await self._initial_offset(queue)
                if not await process_queue.wait_for_space(backoff):
                    continue  # flow control: the listener is behind
                if self._orderly and not self.is_broadcasting and not await self._ensure_locked(process_queue):
                    await asyncio.sleep(backoff)
                    continue
                commit = None if self.is_broadcasting else self._offset_store.read_memory(queue)
                process_queue.last_pull_ms = time.time_ns() // 1_000_000
                pull_started = self.instance.now()
                result = await pull_message(
                    self.instance,
                    self.group,
                    queue,
                    subscription,
                    process_queue.next_offset,
                    self.config.pull_batch_size,
                    commit_offset=commit,
                    suspend_seconds=self.config.suspend_timeout_seconds,
                    broker_id=self._pull_from.get(queue, MASTER_ID),
                )
            except MQClientError as error:
                logger.info("%s: pull of %s failed: %s", self.group, queue, error)
                await asyncio.sleep(backoff)
                continue
            self.stats.pulled(queue.topic, len(result.messages), (self.instance.now() - pull_started) * 1000)
            if process_queue.is_dropped():
                return
            self._pull_from[queue] = result.suggest_which_broker_id
            if result.status is PullStatus.OFFSET_ILLEGAL:
                logger.warning(
                    "%s: offset %d of %s is illegal, moving to %d",
                    self.group,
                    process_queue.next_offset,
                    queue,
                    result.next_begin_offset,
                )
                process_queue.next_offset = result.next_begin_offset
                self._offset_store.update(queue, result.next_begin_offset, increase_only=False)
                continue
            process_queue.next_offset = result.next_begin_offset
            messages = [restore_retry_topic(message, self.group) for message in result.messages]
            if messages:
                process_queue.put(messages)
                self._deliver(process_queue, messages)
            elif process_queue.count == 0:
                self._advance_idle_offset(queue, result.next_begin_offset)

    def _deliver(self, process_queue: ProcessQueue, messages: list[MessageExt]) -> None:
        raise NotImplementedError

    def _advance_idle_offset(self, queue: MessageQueue, offset: int) -> None:
        """Nothing (matching) is left to consume below ``offset``: move the committed offset along
        (Java's ``correctTagsOffset``), so filtered messages do not show as lag."""
        self._offset_store.update(queue, offset)

    # ------------------------------------------------------------------------------ queue locks

    async def _ensure_locked(self, process_queue: ProcessQueue) -> bool:
        if process_queue.locked and self.instance.now() - process_queue.last_lock_time < LOCK_TRUST_SECONDS:
            return True
        await self._lock([process_queue.queue])
        return process_queue.locked

    async def _lock(self, queues: list[MessageQueue]) -> None:
        by_broker: dict[str, list[MessageQueue]] = {}
        for queue in queues:
            by_broker.setdefault(queue.broker_name, []).append(queue)
        for broker_name, wanted in by_broker.items():
            try:
                locked = await lock_queues(
                    self.instance,
                    self.group,
                    broker_name,
                    wanted,
                    deadline=self.instance.now() + self.instance.config.request_timeout_seconds,
                )
            except MQClientError as error:
                logger.info("%s: locking queues on %s failed: %s", self.group, broker_name, error)
                continue
            now = self.instance.now()
            for queue in wanted:
                process_queue = self._process_queues.get(queue)
                if process_queue is None:
                    continue
                process_queue.locked = queue in locked
                if process_queue.locked:
                    process_queue.last_lock_time = now
                    self._on_locked(process_queue)

    def _on_locked(self, process_queue: ProcessQueue) -> None:
        """Subclasses resume consuming a queue whose lock was (re)gained."""

    async def _unlock(self, queues: list[MessageQueue]) -> None:
        by_broker: dict[str, list[MessageQueue]] = {}
        for queue in queues:
            by_broker.setdefault(queue.broker_name, []).append(queue)
        for broker_name, held in by_broker.items():
            try:
                await unlock_queues(
                    self.instance,
                    self.group,
                    broker_name,
                    held,
                    deadline=self.instance.now() + self.instance.config.request_timeout_seconds,
                )
            except MQClientError as error:
                logger.info("%s: unlocking queues on %s failed: %s", self.group, broker_name, error)

    async def _lock_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.lock_interval_seconds)
            await self._lock(list(self._process_queues))


def python_stacks() -> str:
    """Every thread's stack and every asyncio task's (the ``jstack`` of a running-info answer), cut to
    ``JSTACK_CHARS_MAX`` characters."""
    out = io.StringIO()
    frames = sys._current_frames()
    for thread in threading.enumerate():
        out.write(f'"{thread.name}" daemon={thread.daemon} ident={thread.ident}\n')
        frame = frames.get(thread.ident) if thread.ident is not None else None
        if frame is not None:
            out.writelines(traceback.format_stack(frame))
        out.write("\n")
    with contextlib.suppress(RuntimeError):  # no running loop: threads only
        for task in sorted(asyncio.all_tasks(), key=lambda task: task.get_name()):
            out.write(f"task {task.get_name()!r}\n")
            task.print_stack(limit=20, file=out)
            out.write("\n")
    return out.getvalue()[:JSTACK_CHARS_MAX]
