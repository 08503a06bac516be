"""Administration (Java's ``DefaultMQAdminExt`` / ``MQAdminImpl``, the parts users need): topics (create,
update what is given, delete), routes, queue offsets, consumer groups and their progress, offset resets, what
a consumer reports about itself (running info), and looking messages up by key or id.

Topic changes and offset resets go to each broker group's leader (with the same failover as sends); reads
go to the leader first and to followers when it cannot be reached.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final, Self

from client.config import ClientConfig, ConfigError, ConsumerConfig
from client.errors import (
    BrokerUnavailableError,
    ClientErrorCode,
    MessageValidationError,
    MQBrokerError,
    MQClientError,
    NameServerUnavailableError,
    RequestTimeoutError,
    TopicNotFoundError,
)
from client.instance import ClientInstance, check_response, int_field
from client.message import MessageExt, MessageQueue, check_topic, decode_messages
from client.route import TopicRoute
from client.running_info import (
    ConsumerRunningInfo,
    RunningInfoError,
    decode_running_info,
    loads_lenient,
    queue_of_key,
)
from commitlog.hosts import decode_message_id
from commitlog.record_codec import RecordError
from protocol.codes import RequestCode, ResponseCode
from protocol.route_data import PERM_READ, PERM_WRITE, ClusterInfo, decode_topic_list
from protocol.topics import AUTO_CREATE_TOPIC, DLQ_PREFIX, RETRY_PREFIX, SYSTEM_TOPICS, retry_topic

#: Java's ``MixAll.UNIQUE_MSG_QUERY_FLAG``
UNIQUE_MSG_QUERY_FLAG: Final = "_UNIQUE_KEY_QUERY"
#: topics the broker keeps for itself; never listed as a group's consumed topics
SYSTEM_TOPIC_PREFIXES: Final = ("RMQ_SYS_", "SCHEDULE_TOPIC_", "rmq_sys_")
QUEUE_NUMS_MAX: Final = 1024
_QUERY_MAX_NUM: Final = 64
#: a broker waits 10 s for a consumer's running info (Java's ``Broker2Client``): the admin waits longer
RUNNING_INFO_TIMEOUT_SECONDS: Final = 15.0
#: :meth:`AsyncAdmin.reset_offset` timestamps: each queue's first stored message, and its end (Java's -1)
RESET_TO_EARLIEST: Final = 0
RESET_TO_LATEST: Final = -1
#: INVOKE_BROKER_TO_RESET_OFFSET's field (raftmq's) that resets while the group has live consumers, and the
#: field of the refusal naming them (broker.admin)
_RESET_WHILE_ONLINE_FIELD: Final = "resetWhileOnline"
_ONLINE_CONSUMERS_FIELD: Final = "onlineConsumers"
#: groups :meth:`AsyncAdmin.list_groups` asks about at once
_GROUP_QUERIES_IN_FLIGHT_MAX: Final = 16


@dataclass(frozen=True, slots=True)
class QueueOffsets:
    """A queue's offset range: messages ``min_offset`` .. ``max_offset - 1`` are stored."""

    queue: MessageQueue
    min_offset: int
    max_offset: int


@dataclass(frozen=True, slots=True)
class QueueProgress:
    """One queue of a consumer group: ``lag`` = ``broker_offset`` - ``consumer_offset``."""

    queue: MessageQueue
    broker_offset: int
    consumer_offset: int | None

    @property
    def lag(self) -> int:
        return self.broker_offset - (self.consumer_offset or 0)


@dataclass(frozen=True, slots=True)
class ConsumerProgress:
    group: str
    queues: tuple[QueueProgress, ...]
    consumer_ids: tuple[str, ...]

    @property
    def total_lag(self) -> int:
        return sum(queue.lag for queue in self.queues)


@dataclass(frozen=True, slots=True)
class TopicQueueStats:
    """One queue of GET_TOPIC_STATS_INFO (``mqadmin topicStatus``): its offsets and the store time of its
    last message (0 when empty)."""

    queue: MessageQueue
    min_offset: int
    max_offset: int
    last_update_ms: int


@dataclass(frozen=True, slots=True)
class QueueConsumeStats:
    """One queue of GET_CONSUME_STATS (``mqadmin consumerProgress``): the broker's max offset, the group's
    committed offset, and the store time of the last message it consumed (0 when none)."""

    queue: MessageQueue
    broker_offset: int
    consumer_offset: int
    last_timestamp_ms: int

    @property
    def lag(self) -> int:
        return self.broker_offset - self.consumer_offset


@dataclass(frozen=True, slots=True)
class ClientConnection:
    """A client connected to a broker (Java's ``Connection``)."""

    client_id: str
    address: str
    language: str
    version: int


@dataclass(frozen=True, slots=True)
class ConsumerConnection:
    """GET_CONSUMER_CONNECTION_LIST (``mqadmin consumerConnection``): a group's live members, its
    subscriptions (topic -> SubscriptionData fields) and how it consumes."""

    connections: tuple[ClientConnection, ...]
    subscriptions: dict[str, dict[str, Any]]
    consume_type: str
    message_model: str
    consume_from_where: str


@dataclass(frozen=True, slots=True)
class TopicSettings:
    """A topic's configuration on one broker group (GET_ALL_TOPIC_CONFIG's TopicConfig)."""

    topic: str
    broker_name: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int
    order: bool = False
    topic_sys_flag: int = 0


@dataclass(frozen=True, slots=True)
class GroupSettings:
    """A consumer group's configuration on one broker group (GET_ALL_SUBSCRIPTIONGROUP_CONFIG's
    SubscriptionGroupConfig); ``config`` is the whole JSON entry as the broker reported it."""

    group: str
    broker_name: str
    consume_enable: bool
    consume_broadcast_enable: bool
    consume_orderly: bool
    retry_max_times: int
    broker_id: int
    config: dict[str, Any]

    @classmethod
    def from_json(cls, group: str, broker_name: str, entry: dict[str, Any]) -> GroupSettings:
        return cls(group, broker_name, bool(entry.get("consumeEnable", True)),
                   bool(entry.get("consumeBroadcastEnable", True)), bool(entry.get("consumeMessageOrderly", False)),
                   int(entry.get("retryMaxTimes", 16)), int(entry.get("brokerId", 0)), dict(entry))


@dataclass(frozen=True, slots=True)
class GroupSummary:
    """One consumer group as ``mqadmin consumerProgress`` without a group lists it: its live members, the
    topics it has committed offsets on, its total lag and how fast it consumed over the last minute."""

    group: str
    consumer_ids: tuple[str, ...]
    topics: tuple[str, ...]
    total_lag: int
    consume_tps: float


@dataclass(frozen=True, slots=True)
class QueueReset:
    """One queue of an offset reset: the group's committed offset before (None: it had none) and after."""

    queue: MessageQueue
    previous_offset: int | None
    offset: int


class GroupOnlineError(MQClientError):
    """An offset reset refused because the group has live consumers of the topic: a live consumer keeps the
    position it holds and commits it over the reset. Nothing was changed."""

    def __init__(self, group: str, topic: str, client_ids: Sequence[str]) -> None:
        super().__init__(
            ResponseCode.SYSTEM_ERROR,
            f"consumer group {group} has {len(client_ids)} live consumer(s) of {topic} ({', '.join(client_ids)}): "
            "stop them first (a live consumer commits the position it holds over the reset)",
        )
        self.group = group
        self.topic = topic
        self.client_ids = tuple(client_ids)


def check_group(group: object) -> str:
    """A consumer group name the client accepts, or :class:`MessageValidationError`."""
    try:
        ConsumerConfig(group=group)  # type: ignore[arg-type]
    except ConfigError as error:
        raise MessageValidationError(str(error)) from None
    assert isinstance(group, str)
    return group


def _topic_fields(settings: TopicSettings) -> dict[str, str]:
    """UPDATE_AND_CREATE_TOPIC's header for ``settings``."""
    return {
        "topic": settings.topic,
        "defaultTopic": AUTO_CREATE_TOPIC,
        "readQueueNums": str(settings.read_queue_nums),
        "writeQueueNums": str(settings.write_queue_nums),
        "perm": str(settings.perm),
        "topicFilterType": "SINGLE_TAG",
        "topicSysFlag": str(settings.topic_sys_flag),
        "order": "true" if settings.order else "false",
    }


def _connections(value: object, address: str) -> tuple[ClientConnection, ...]:
    if not isinstance(value, list):
        raise MQClientError(ResponseCode.SYSTEM_ERROR, f"connectionSet from {address} is not a list")
    try:
        return tuple(ClientConnection(str(entry["clientId"]), str(entry.get("clientAddr", "")),
                                      str(entry.get("language", "")), int(entry.get("version", 0)))
                     for entry in value)
    except (TypeError, KeyError, ValueError, AttributeError) as exc:
        raise MQClientError(ResponseCode.SYSTEM_ERROR, f"a connection from {address} is unreadable: {exc!r}") from None


def _offset_table(body: bytes, address: str) -> list[tuple[MessageQueue, dict[str, Any]]]:
    """The ``offsetTable`` of a TopicStatsTable or ConsumeStats body (fastjson's object keys)."""
    try:
        table = loads_lenient(body.decode("utf-8")).get("offsetTable") or {}
        if not isinstance(table, dict):
            raise RunningInfoError("offsetTable is not an object")
        return [(queue_of_key(key), value) for key, value in table.items() if isinstance(value, dict)]
    except (RunningInfoError, UnicodeDecodeError, AttributeError) as exc:
        raise MQClientError(ResponseCode.SYSTEM_ERROR, f"unreadable offset table from {address}: {exc}") from None


def is_system_topic(topic: str) -> bool:
    return topic == AUTO_CREATE_TOPIC or topic.startswith(SYSTEM_TOPIC_PREFIXES) or topic in SYSTEM_TOPICS


def _check_queue_count(value: object, name: str) -> None:
    if type(value) is not int or not 0 <= value <= QUEUE_NUMS_MAX:
        raise MessageValidationError(f"{name} must be in [0, {QUEUE_NUMS_MAX}], got {value!r}")


def _check_perm(perm: object) -> None:
    if type(perm) is not int or not 0 <= perm <= 7:
        raise MessageValidationError(f"perm must be in [0, 7] (read 4, write 2, inherit 1), got {perm!r}")


class AsyncAdmin:
    """Admin operations over a :class:`ClientInstance`. ``async with AsyncAdmin(namesrv) as admin:``."""

    def __init__(
        self,
        namesrv: str | ClientConfig,
        *,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
        timeout_seconds: float = 10.0,
    ) -> None:
        self.instance = ClientInstance(ClientConfig.of(namesrv), clock=clock, rng=rng)
        self.timeout_seconds = timeout_seconds

    async def start(self) -> Self:
        await self.instance.start()
        return self

    async def close(self) -> None:
        await self.instance.close()

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def _deadline(self) -> float:
        return self.instance.now() + self.timeout_seconds

    async def runtime_info(self, broker_name: str) -> tuple[dict[str, str], str]:
        """GET_BROKER_RUNTIME_INFO of the group's leader (another member if it cannot be reached): its
        ``table``, and the address that answered."""
        response, address = await self.instance.invoke_any(broker_name, RequestCode.GET_BROKER_RUNTIME_INFO)
        check_response(response, address)
        try:
            table = json.loads(response.body)["table"]
        except (ValueError, KeyError, TypeError) as exc:
            raise MQClientError(ResponseCode.SYSTEM_ERROR, f"unreadable runtime info from {address}: {exc}") from None
        if not isinstance(table, dict):
            raise MQClientError(ResponseCode.SYSTEM_ERROR, f"the runtime info from {address} is not a table")
        return {str(key): str(value) for key, value in table.items()}, address

    # -------------------------------------------------------------------------------- topics

    async def cluster_info(self) -> ClusterInfo:
        info = await self.instance.fetch_cluster_info()
        for name, broker in info.broker_datas.items():
            self.instance.remember_broker(name, broker.broker_addresses)
        return info

    async def broker_names(self, cluster: str | None = None) -> list[str]:
        """The broker groups of ``cluster`` (all groups when None)."""
        info = await self.cluster_info()
        if cluster is None:
            return sorted(info.broker_datas)
        names = info.cluster_broker_names.get(cluster)
        if names is None:
            known = ", ".join(sorted(info.cluster_broker_names)) or "none"
            raise MQClientError(ResponseCode.SYSTEM_ERROR, f"no cluster named {cluster!r} (known: {known})")
        return sorted(names)

    async def create_topic(
        self,
        topic: str,
        *,
        read_queue_nums: int = 4,
        write_queue_nums: int = 4,
        perm: int = PERM_READ | PERM_WRITE,
        order: bool = False,
        cluster: str | None = None,
        broker_names: Sequence[str] | None = None,
        wait_for_route: bool = True,
    ) -> list[str]:
        """UPDATE_AND_CREATE_TOPIC on the leader of each broker group (of ``cluster``, or the given
        ones); with ``wait_for_route``, return once the name servers route the new queue counts.
        Returns the broker groups changed."""
        check_topic(topic)
        _check_queue_count(read_queue_nums, "read_queue_nums")
        _check_queue_count(write_queue_nums, "write_queue_nums")
        if read_queue_nums == 0 and write_queue_nums == 0:
            raise MessageValidationError("a topic needs read or write queues")
        _check_perm(perm)
        names = list(broker_names) if broker_names else await self.broker_names(cluster)
        if not names:
            raise MQClientError(ResponseCode.SYSTEM_ERROR, "no broker group is registered with the name servers")
        fields = _topic_fields(TopicSettings(topic, "", read_queue_nums, write_queue_nums, perm, order))
        deadline = self._deadline()
        for name in names:
            response, address = await self.instance.invoke_leader(
                name, RequestCode.UPDATE_AND_CREATE_TOPIC, fields, deadline=deadline
            )
            check_response(response, address)
        if wait_for_route:
            await self._wait_for_route(topic, set(names), read_queue_nums, write_queue_nums, perm, deadline)
        return names

    async def topic_settings(self, topic: str, broker_names: Sequence[str] | None = None) -> dict[str, TopicSettings]:
        """The topic's configuration on each broker group of its route (or the given groups), read from each
        group's leader (GET_ALL_TOPIC_CONFIG); a group that does not hold the topic is left out.
        :class:`TopicNotFoundError` when the name servers route no such topic and no group is given."""
        names = list(broker_names) if broker_names else list((await self.instance.topic_route(topic, refresh=True)).broker_names)
        found: dict[str, TopicSettings] = {}
        for name in names:
            response, address = await self.instance.invoke_any(name, RequestCode.GET_ALL_TOPIC_CONFIG)
            check_response(response, address)
            try:
                entry = json.loads(response.body)["topicConfigTable"].get(topic)
                if entry is not None:
                    found[name] = TopicSettings(topic, name, int(entry["readQueueNums"]), int(entry["writeQueueNums"]),
                                                int(entry["perm"]), bool(entry.get("order", False)),
                                                int(entry.get("topicSysFlag", 0)))
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                raise MQClientError(ResponseCode.SYSTEM_ERROR, f"unreadable topic config from {address}: {exc!r}") from None
        return found

    async def update_topic(
        self,
        topic: str,
        *,
        read_queue_nums: int | None = None,
        write_queue_nums: int | None = None,
        perm: int | None = None,
        order: bool | None = None,
        cluster: str | None = None,
        broker_names: Sequence[str] | None = None,
        wait_for_route: bool = True,
    ) -> list[str]:
        """Change what is given of an existing topic on each broker group that holds it (of ``cluster``, or
        the given groups): everything else keeps the value that group has (read from its leader first).
        :class:`TopicNotFoundError` when no group holds it.

        Shrinking queues, as RocketMQ does it: fewer write queues is always allowed (producers stop writing to
        the others; consumers still read them). Fewer read queues leaves the messages in the queues removed
        where no consumer reads them, so it is refused (:class:`MessageValidationError`, nothing changed)
        while a consumer group still has messages to consume there, or when fewer read than write queues
        would remain: shrink the write queues first, let the groups consume what is left, then the read
        queues. Returns the broker groups changed."""
        check_topic(topic)
        for name, value in (("read_queue_nums", read_queue_nums), ("write_queue_nums", write_queue_nums)):
            if value is not None:
                _check_queue_count(value, name)
        if perm is not None:
            _check_perm(perm)
        if order is not None and not isinstance(order, bool):
            raise MessageValidationError(f"order must be True or False, got {order!r}")
        if read_queue_nums is None and write_queue_nums is None and perm is None and order is None:
            raise MessageValidationError("nothing to change: give read or write queue counts, perm or order")
        names = list(broker_names) if broker_names else None
        if names is None:
            route = await self.instance.topic_route(topic, refresh=True)
            names = list(route.broker_names)
            if cluster is not None:
                in_cluster = set(await self.broker_names(cluster))
                names = [name for name in names if name in in_cluster]
        current = await self.topic_settings(topic, names)
        if not current:
            raise TopicNotFoundError(topic, f"no broker group{' of cluster ' + cluster if cluster else ''} "
                                            f"holds topic {topic!r}")
        wanted = {
            name: TopicSettings(
                topic, name,
                settings.read_queue_nums if read_queue_nums is None else read_queue_nums,
                settings.write_queue_nums if write_queue_nums is None else write_queue_nums,
                settings.perm if perm is None else perm,
                settings.order if order is None else order,
                settings.topic_sys_flag)
            for name, settings in current.items()
        }
        for name, settings in wanted.items():
            if settings.read_queue_nums == 0 and settings.write_queue_nums == 0:
                raise MessageValidationError("a topic needs read or write queues")
            queues_changed = (settings.read_queue_nums, settings.write_queue_nums) != (
                current[name].read_queue_nums, current[name].write_queue_nums)
            if queues_changed and settings.read_queue_nums < settings.write_queue_nums:
                unread = (f"queue {settings.read_queue_nums}" if settings.write_queue_nums - settings.read_queue_nums == 1
                          else f"queues {settings.read_queue_nums}..{settings.write_queue_nums - 1}")
                raise MessageValidationError(
                    f"{topic} on {name}: {settings.read_queue_nums} read queues for {settings.write_queue_nums} "
                    f"write queues: messages written to {unread} would never be consumed (shrink the write queues "
                    "first)")
        await self._check_read_queues_drained(topic, current, wanted)
        deadline = self._deadline()
        for name, settings in wanted.items():
            response, address = await self.instance.invoke_leader(
                name, RequestCode.UPDATE_AND_CREATE_TOPIC, _topic_fields(settings), deadline=deadline)
            check_response(response, address)
        if wait_for_route:
            for name, settings in wanted.items():
                await self._wait_for_route(topic, {name}, settings.read_queue_nums, settings.write_queue_nums,
                                           settings.perm, deadline)
        return sorted(wanted)

    async def _check_read_queues_drained(self, topic: str, current: dict[str, TopicSettings],
                                         wanted: dict[str, TopicSettings]) -> None:
        """:class:`MessageValidationError` when a read queue to be removed still holds messages a consumer
        group has not consumed (by its committed offset)."""
        removed = {name: wanted[name].read_queue_nums for name in wanted
                   if wanted[name].read_queue_nums < current[name].read_queue_nums}
        if not removed:
            return
        behind: list[str] = []
        for group in await self.group_names():
            # without a topic, a broker reports only the topics the group committed on: asked for one, it
            # reports every queue of it, at offset 0 for a group that never consumed it
            rows, _ = await self._consume_stats_and_tps(group, None)
            behind += [f"{group} has {row.lag} on {row.queue.broker_name} queue {row.queue.queue_id}" for row in rows
                       if row.queue.topic == topic and row.queue.broker_name in removed
                       and row.queue.queue_id >= removed[row.queue.broker_name] and row.lag > 0]
        if behind:
            raise MessageValidationError(
                f"the read queues to remove from {topic} still hold messages to consume ({'; '.join(behind)}): shrink "
                "the write queues first and let the groups consume them (or reset a group that no longer matters "
                "to the latest offset)")

    async def delete_topic(self, topic: str, *, cluster: str | None = None) -> list[str]:
        """``mqadmin deleteTopic``: DELETE_TOPIC_IN_BROKER on the leader of each broker group that routes the
        topic (of ``cluster`` only, when given), then DELETE_TOPIC_IN_NAMESRV on every name server (a name
        server that cannot be reached is skipped: it holds nothing once restarted, and brokers register no
        deleted topic). Returns once no name server routes it on those groups any more. System topics are
        refused (:class:`MessageValidationError`); :class:`TopicNotFoundError` when nothing routes it.
        Returns the broker groups it was deleted from."""
        check_topic(topic)
        if is_system_topic(topic):
            raise MessageValidationError(f"{topic} is a system topic: the broker's own, it cannot be deleted")
        route = await self.instance.topic_route(topic, refresh=True)
        names = list(route.broker_names)
        if cluster is not None:
            in_cluster = set(await self.broker_names(cluster))
            names = [name for name in names if name in in_cluster]
            if not names:
                raise TopicNotFoundError(topic, f"no broker group of cluster {cluster!r} holds topic {topic!r}")
        deadline = self._deadline()
        for name in names:
            response, address = await self.instance.invoke_leader(
                name, RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": topic}, deadline=deadline)
            check_response(response, address, ResponseCode.TOPIC_NOT_EXIST)  # gone already: a repeated delete
        deleted = set(names)
        while True:
            await self._delete_topic_in_name_servers(topic, cluster)
            # a registration the leader sent before its delete applied can still add the topic back once
            remaining: set[str] = set()
            with contextlib.suppress(TopicNotFoundError):
                remaining = set((await self.instance.topic_route(topic, refresh=True)).broker_names) & deleted
            if not remaining:
                self.instance.forget_topic(topic)
                return sorted(deleted)
            if self.instance.now() > deadline:
                raise MQClientError(ResponseCode.SYSTEM_ERROR, f"topic {topic!r} was deleted on the brokers but the "
                                    f"name servers still route it on {', '.join(sorted(remaining))}")
            await asyncio.sleep(0.05)

    async def _delete_topic_in_name_servers(self, topic: str, cluster: str | None) -> None:
        fields = {"topic": topic, **({"clusterName": cluster} if cluster else {})}
        errors: list[str] = []
        for address in self.instance.config.namesrv_addresses:
            try:
                response = await self.instance.invoke(address, RequestCode.DELETE_TOPIC_IN_NAMESRV, fields)
            except (BrokerUnavailableError, RequestTimeoutError) as error:
                errors.append(str(error))
                continue
            check_response(response, address)
        if len(errors) == len(self.instance.config.namesrv_addresses):
            raise NameServerUnavailableError("no name server answered: " + "; ".join(errors))

    async def _wait_for_route(
        self, topic: str, names: set[str], read: int, write: int, perm: int, deadline: float
    ) -> None:
        while True:
            try:
                route = await self.instance.topic_route(topic, refresh=True)
                current = {
                    data.broker_name: (data.read_queue_nums, data.write_queue_nums, data.perm)
                    for data in route.data.queue_datas
                }
                if all(current.get(name) == (read, write, perm) for name in names):
                    return
            except TopicNotFoundError:
                pass
            if self.instance.now() > deadline:
                raise MQClientError(
                    ResponseCode.SYSTEM_ERROR,
                    f"topic {topic!r} was created but the name servers do not route it yet",
                )
            await asyncio.sleep(0.05)

    async def list_topics(self, *, include_system: bool = False) -> list[str]:
        response = await self.instance.namesrv_request(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER)
        check_response(response, "name server")
        topics = decode_topic_list(response.body)
        if not include_system:
            topics = [topic for topic in topics if not is_system_topic(topic)]
        return sorted(topics)

    async def describe_topic(self, topic: str) -> TopicRoute:
        """The topic's route as the name servers have it now."""
        return await self.instance.topic_route(topic, refresh=True)

    # ------------------------------------------------------------------------------- offsets

    async def _queue_offset(self, code: int, queue: MessageQueue, **extra: str) -> int:
        fields = {"topic": queue.topic, "queueId": str(queue.queue_id), **extra}
        response, address = await self.instance.invoke_any(queue.broker_name, code, fields)
        check_response(response, address)
        return int_field(response, "offset", address)

    async def max_offset(self, queue: MessageQueue) -> int:
        """The offset the next message of the queue will get."""
        return await self._queue_offset(RequestCode.GET_MAX_OFFSET, queue)

    async def min_offset(self, queue: MessageQueue) -> int:
        return await self._queue_offset(RequestCode.GET_MIN_OFFSET, queue)

    async def search_offset(self, queue: MessageQueue, timestamp_ms: int) -> int:
        """The first offset stored at or after ``timestamp_ms``."""
        return await self._queue_offset(RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, queue, timestamp=str(timestamp_ms))

    async def topic_offsets(self, topic: str) -> list[QueueOffsets]:
        route = await self.instance.topic_route(topic, refresh=True)
        queues = route.subscribe_queues

        async def offsets(queue: MessageQueue) -> QueueOffsets:
            low, high = await asyncio.gather(self.min_offset(queue), self.max_offset(queue))
            return QueueOffsets(queue, low, high)

        return list(await asyncio.gather(*(offsets(queue) for queue in queues)))

    async def consumer_offset(self, group: str, queue: MessageQueue) -> int | None:
        """The group's committed offset of the queue, None when it has none."""
        fields = {"consumerGroup": group, "topic": queue.topic, "queueId": str(queue.queue_id)}
        response, address = await self.instance.invoke_any(queue.broker_name, RequestCode.QUERY_CONSUMER_OFFSET, fields)
        if response.code == ResponseCode.QUERY_NOT_FOUND:
            return None
        check_response(response, address)
        return int_field(response, "offset", address)

    async def topic_stats(self, topic: str) -> list[TopicQueueStats]:
        """GET_TOPIC_STATS_INFO on every broker group of the topic: each write queue's offsets and when it
        was last written."""
        route = await self.instance.topic_route(topic, refresh=True)
        rows: list[TopicQueueStats] = []
        for name in route.broker_names:
            response, address = await self.instance.invoke_any(name, RequestCode.GET_TOPIC_STATS_INFO, {"topic": topic})
            check_response(response, address)
            rows.extend(TopicQueueStats(queue, int(row.get("minOffset", 0)), int(row.get("maxOffset", 0)),
                                        int(row.get("lastUpdateTimestamp", 0)))
                        for queue, row in _offset_table(response.body, address))
        return sorted(rows, key=lambda row: row.queue)

    async def consume_stats(self, group: str, topic: str | None = None) -> list[QueueConsumeStats]:
        """GET_CONSUME_STATS on every broker group (of ``topic``'s route when given): per queue of each topic
        the group consumes there, the broker's offset, the group's committed offset and when the last
        message it consumed was stored."""
        rows, _ = await self._consume_stats_and_tps(group, topic)
        return rows

    async def consume_tps(self, group: str, topic: str | None = None) -> float:
        """GET_CONSUME_STATS's ``consumeTps`` summed over the broker groups: the messages per second the
        group was served over the last minute (by the members that served its pulls), on ``topic`` or on
        every topic it consumes."""
        _, tps = await self._consume_stats_and_tps(group, topic)
        return tps

    async def _consume_stats_and_tps(self, group: str, topic: str | None) -> tuple[list[QueueConsumeStats], float]:
        rows: list[QueueConsumeStats] = []
        total = 0.0
        for body, address in await self._consume_stats_bodies(group, topic):
            rows.extend(QueueConsumeStats(queue, int(row.get("brokerOffset", 0)), int(row.get("consumerOffset", 0)),
                                          int(row.get("lastTimestamp", 0)))
                        for queue, row in _offset_table(body, address))
            try:
                value = loads_lenient(body.decode("utf-8")).get("consumeTps", 0.0)
                total += float(value)
            except (RunningInfoError, UnicodeDecodeError, AttributeError, TypeError, ValueError) as exc:
                raise MQClientError(ResponseCode.SYSTEM_ERROR, f"unreadable consumeTps from {address}: {exc}") from None
        return sorted(rows, key=lambda row: row.queue), total

    async def _consume_stats_bodies(self, group: str, topic: str | None) -> list[tuple[bytes, str]]:
        names = list((await self.instance.topic_route(topic)).broker_names) if topic else await self.broker_names()
        fields = {"consumerGroup": group, **({"topic": topic} if topic else {})}
        bodies: list[tuple[bytes, str]] = []
        for name in names:
            response, address = await self.instance.invoke_any(name, RequestCode.GET_CONSUME_STATS, fields)
            check_response(response, address)
            bodies.append((response.body, address))
        return bodies

    # ----------------------------------------------------------------------------- groups

    async def group_settings(self, group: str, broker_names: Sequence[str] | None = None) -> dict[str, GroupSettings]:
        """The group's configuration on each broker group (or the given ones), read from each group's leader
        (GET_ALL_SUBSCRIPTIONGROUP_CONFIG); a broker group that does not know the group is left out."""
        check_group(group)
        found: dict[str, GroupSettings] = {}
        deadline = self._deadline()
        for name in list(broker_names) if broker_names else await self.broker_names():
            response, address = await self.instance.invoke_leader(
                name, RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG, deadline=deadline)
            check_response(response, address)
            try:
                entry = json.loads(response.body)["subscriptionGroupTable"].get(group)
                if entry is not None:
                    found[name] = GroupSettings.from_json(group, name, entry)
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                raise MQClientError(ResponseCode.SYSTEM_ERROR,
                                    f"unreadable subscription group config from {address}: {exc!r}") from None
        return found

    async def update_group(
        self,
        group: str,
        *,
        retry_max_times: int | None = None,
        consume_orderly: bool | None = None,
        consume_enable: bool | None = None,
        consume_broadcast_enable: bool | None = None,
        broker_id: int | None = None,
        cluster: str | None = None,
        broker_names: Sequence[str] | None = None,
    ) -> list[str]:
        """``mqadmin updateSubGroup``: create the consumer group's configuration, or change what is given of
        it, on each broker group (of ``cluster``, or the given ones); everything else keeps the value that
        broker group has (read from its leader first; the broker's defaults for a group it does not know).
        ``retry_max_times``: deliveries after the first before a message goes to the group's dead-letter queue
        (4.x send-back and 5.x pop alike); ``consume_orderly``: a 5.x FIFO group. Returns the broker groups
        changed."""
        check_group(group)
        changes: dict[str, object] = {}
        for key, value in (("consumeMessageOrderly", consume_orderly), ("consumeEnable", consume_enable),
                           ("consumeBroadcastEnable", consume_broadcast_enable)):
            if value is not None:
                if not isinstance(value, bool):
                    raise MessageValidationError(f"{key} must be True or False, got {value!r}")
                changes[key] = value
        for key, number in (("retryMaxTimes", retry_max_times), ("brokerId", broker_id)):
            if number is not None:
                if isinstance(number, bool) or not isinstance(number, int) or not 0 <= number < 2**31 - 1:
                    raise MessageValidationError(f"{key} must be an integer within [0, {2**31 - 2}], got {number!r}")
                changes[key] = number
        if not changes:
            raise MessageValidationError("nothing to change: give retry max times, orderly, consume enable, "
                                         "broadcast or broker id")
        names = list(broker_names) if broker_names else await self.broker_names(cluster)
        if not names:
            raise MQClientError(ResponseCode.SYSTEM_ERROR, "no broker group is registered with the name servers")
        current = await self.group_settings(group, names)
        deadline = self._deadline()
        for name in names:
            config = dict(current[name].config) if name in current else {}
            config.update(changes, groupName=group)
            response, address = await self.instance.invoke_leader(
                name, RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, {}, json.dumps(config).encode(),
                deadline=deadline)
            check_response(response, address)
        return names

    async def delete_group(self, group: str, *, cluster: str | None = None) -> list[str]:
        """``mqadmin deleteSubGroup``: DELETE_SUBSCRIPTIONGROUP on the leader of each broker group (of
        ``cluster``): the group's configuration goes (it consumes with the broker's defaults again), its
        committed offsets stay. Returns the broker groups asked."""
        check_group(group)
        names = await self.broker_names(cluster)
        deadline = self._deadline()
        for name in names:
            response, address = await self.instance.invoke_leader(
                name, RequestCode.DELETE_SUBSCRIPTIONGROUP, {"groupName": group}, deadline=deadline)
            check_response(response, address)
        return names

    async def group_names(self) -> list[str]:
        """The consumer groups the broker groups know (GET_ALL_SUBSCRIPTIONGROUP_CONFIG of each, merged): those
        configured, those with committed offsets, and those with live consumers."""
        names: set[str] = set()
        for body, address in await self._json_from_each_group(RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG, {}):
            table = body.get("subscriptionGroupTable")
            if not isinstance(table, dict):
                raise MQClientError(ResponseCode.SYSTEM_ERROR, f"subscriptionGroupTable from {address} is not an object")
            names.update(str(name) for name in table)
        return sorted(names)

    async def list_groups(self) -> list[GroupSummary]:
        """Every consumer group the broker groups know (:meth:`group_names`), each with its live members, the
        topics it has committed offsets on, its total lag and its consume rate (``mqadmin consumerProgress``
        without a group)."""
        limit = asyncio.Semaphore(_GROUP_QUERIES_IN_FLIGHT_MAX)

        async def summary(group: str) -> GroupSummary:
            async with limit:
                members = await self.consumer_ids(group)
                rows, tps = await self._consume_stats_and_tps(group, None)
            return GroupSummary(group, tuple(members), tuple(sorted({row.queue.topic for row in rows})),
                                sum(row.lag for row in rows), tps)

        return list(await asyncio.gather(*(summary(group) for group in await self.group_names())))

    async def reset_offset(self, group: str, topic: str, timestamp_ms: int, *,
                           while_online: bool = False) -> list[QueueReset]:
        """``mqadmin resetOffsetByTime``: on each broker group of the topic, the group's committed offset of
        every read queue moves to the first message stored at or after ``timestamp_ms`` (epoch ms;
        :data:`RESET_TO_EARLIEST`, :data:`RESET_TO_LATEST`), forward or back, through Raft like any offset
        commit. Refused (:class:`GroupOnlineError`, nothing changed) while the group has live consumers of the
        topic, unless ``while_online``: Java's broker tells them to move, raftmq's does not, and a live
        consumer commits the position it holds over the reset. Returns each queue's offsets before and after."""
        check_group(group)
        check_topic(topic)
        if is_system_topic(topic):
            raise MessageValidationError(f"{topic} is a system topic: its offsets are the broker's own")
        if type(timestamp_ms) is not int or timestamp_ms < RESET_TO_LATEST:
            raise MessageValidationError(f"timestamp_ms must be epoch milliseconds, 0 or -1, got {timestamp_ms!r}")
        route = await self.instance.topic_route(topic, refresh=True)
        if not while_online:
            await self._refuse_online_consumers(group, topic)
        # the topics the group committed on (asked for one topic, a broker reports 0 for a group that never did)
        previous = {row.queue: row.consumer_offset for row in await self.consume_stats(group) if row.queue.topic == topic}
        fields = {"topic": topic, "group": group, "timestamp": str(timestamp_ms), "isForce": "true",
                  _RESET_WHILE_ONLINE_FIELD: "true" if while_online else "false"}
        deadline = self._deadline()
        resets: list[QueueReset] = []
        for name in route.broker_names:
            response, address = await self.instance.invoke_leader(
                name, RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, fields, deadline=deadline)
            online = response.ext_fields.get(_ONLINE_CONSUMERS_FIELD)
            if response.code != ResponseCode.SUCCESS and online:
                raise GroupOnlineError(group, topic, online.split(","))
            check_response(response, address)
            try:
                table = loads_lenient(response.body.decode("utf-8")).get("offsetTable") or {}
                resets += [QueueReset(queue, previous.get(queue), int(offset))
                           for queue, offset in ((queue_of_key(key), value) for key, value in table.items())]
            except (RunningInfoError, UnicodeDecodeError, AttributeError, TypeError, ValueError) as exc:
                raise MQClientError(ResponseCode.SYSTEM_ERROR, f"unreadable reset answer from {address}: {exc}") from None
        return sorted(resets, key=lambda reset: reset.queue)

    async def _refuse_online_consumers(self, group: str, topic: str) -> None:
        """:class:`GroupOnlineError` when a live member of ``group`` subscribes ``topic`` (asked before anything
        changes; each broker checks again when it resets)."""
        try:
            connection = await self.consumer_connections(group)
        except MQBrokerError as error:
            if error.code == ResponseCode.CONSUMER_NOT_ONLINE:
                return
            raise
        if topic in connection.subscriptions and connection.connections:
            raise GroupOnlineError(group, topic, [entry.client_id for entry in connection.connections])

    async def _json_from_each_group(self, code: int, fields: dict[str, str]) -> list[tuple[dict[str, Any], str]]:
        """``code`` to every broker group: the JSON bodies of those that answered SUCCESS, with their address.
        Raises the last error when none did, and :class:`MQClientError` for a body that is not a JSON object."""
        bodies: list[tuple[dict[str, Any], str]] = []
        last: MQClientError | None = None
        for name in await self.broker_names():
            try:
                response, address = await self.instance.invoke_any(name, code, fields)
                check_response(response, address)
            except MQClientError as error:
                last = error
                continue
            try:
                body = json.loads(response.body)
            except ValueError as exc:
                raise MQClientError(ResponseCode.SYSTEM_ERROR, f"unreadable answer from {address}: {exc}") from None
            if not isinstance(body, dict):
                raise MQClientError(ResponseCode.SYSTEM_ERROR, f"the answer from {address} is not a JSON object")
            bodies.append((body, address))
        if not bodies:
            raise last or MQClientError(ClientErrorCode.CONNECT_BROKER_EXCEPTION, "no broker group is known")
        return bodies

    async def consumer_connections(self, group: str) -> ConsumerConnection:
        """GET_CONSUMER_CONNECTION_LIST from every broker group, merged: the group's live members (each once),
        its subscriptions and how it consumes. Raises :class:`MQBrokerError` (CONSUMER_NOT_ONLINE) when no
        broker group has a member of it."""
        bodies = await self._json_from_each_group(RequestCode.GET_CONSUMER_CONNECTION_LIST, {"consumerGroup": group})
        found: dict[str, ClientConnection] = {}
        subscriptions: dict[str, dict[str, Any]] = {}
        for body, address in bodies:
            found.update((entry.client_id, entry) for entry in _connections(body.get("connectionSet"), address))
            table = body.get("subscriptionTable")
            if isinstance(table, dict):
                subscriptions.update(table)
        body = bodies[-1][0]
        return ConsumerConnection(tuple(found[client_id] for client_id in sorted(found)),
                                  dict(sorted(subscriptions.items())), str(body.get("consumeType", "")),
                                  str(body.get("messageModel", "")), str(body.get("consumeFromWhere", "")))

    async def producer_connections(self, group: str) -> list[ClientConnection]:
        """GET_PRODUCER_CONNECTION_LIST from every broker group, merged: the group's connected producers.
        Raises :class:`MQBrokerError` when no broker group knows the group."""
        bodies = await self._json_from_each_group(RequestCode.GET_PRODUCER_CONNECTION_LIST, {"producerGroup": group})
        found = {entry.client_id: entry for body, address in bodies
                 for entry in _connections(body.get("connectionSet"), address)}
        return [found[client_id] for client_id in sorted(found)]

    # ----------------------------------------------------------------------------- consumers

    async def consumer_ids(self, group: str, topic: str | None = None) -> list[str]:
        """GET_CONSUMER_LIST_BY_GROUP: the client ids of the group's live members."""
        if topic is not None:
            names = list((await self.instance.topic_route(topic)).broker_names)
        else:
            names = await self.broker_names()
        for name in names:
            try:
                response, _address = await self.instance.invoke_any(
                    name, RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": group}
                )
            except MQClientError:
                continue
            if response.code != ResponseCode.SUCCESS:
                continue  # "no consumer for this group" is SYSTEM_ERROR on Java brokers too
            try:
                ids = json.loads(response.body).get("consumerIdList") or []
            except (ValueError, AttributeError):
                continue
            return sorted(str(each) for each in ids)
        return []

    async def consumer_running_info(self, group: str, client_id: str, *, jstack: bool = False) -> ConsumerRunningInfo:
        """GET_CONSUMER_RUNNING_INFO (``mqadmin consumerStatus``): what the consumer ``client_id`` of ``group``
        reports about itself (subscriptions, the queues it holds with their cached messages, commit
        offsets and locks, pull and consume rates), asked through each member that knows it until one
        answers. ``jstack``: with its threads' and tasks' stacks. Raises :class:`MQBrokerError` with the
        broker's remark when no member has the consumer online, or with the consumer's own error."""
        fields = {"consumerGroup": group, "clientId": client_id, "jstackEnable": "true" if jstack else "false"}
        last: MQClientError | None = None
        for name in await self.broker_names():
            for address in self.instance.candidate_addresses(name):
                try:
                    response = await self.instance.invoke(address, RequestCode.GET_CONSUMER_RUNNING_INFO, fields,
                                                          timeout_seconds=RUNNING_INFO_TIMEOUT_SECONDS)
                    check_response(response, address)
                except (BrokerUnavailableError, RequestTimeoutError, MQBrokerError) as error:
                    last = error  # another member may have the consumer's connection
                    continue
                try:
                    return decode_running_info(client_id, response.body)
                except RunningInfoError as exc:
                    raise MQClientError(ResponseCode.SYSTEM_ERROR,
                                        f"consumer {client_id} answered an unreadable running info: {exc}") from None
        raise last or MQClientError(ClientErrorCode.CONNECT_BROKER_EXCEPTION, "no broker group is known")

    async def consumer_progress(self, group: str, topics: Iterable[str] | None = None) -> ConsumerProgress:
        """Per queue: the broker's max offset, the group's committed offset, and the lag. Without
        ``topics``, every non-system topic where the group committed a positive offset, and its retry
        topic (brokers answer 0 for a group that never committed while a queue starts at 0, so a topic
        the group never consumed from cannot be told apart from one it consumed nothing of)."""
        explicit = topics is not None
        candidates = list(topics) if topics is not None else [
            topic
            for topic in await self.list_topics(include_system=False)
            if not topic.startswith((RETRY_PREFIX, DLQ_PREFIX)) or topic == retry_topic(group)
        ]
        results: list[QueueProgress] = []
        for topic in candidates:
            try:
                route = await self.instance.topic_route(topic, refresh=True)
            except TopicNotFoundError:
                if explicit:
                    raise
                continue

            async def progress(queue: MessageQueue) -> QueueProgress:
                broker_offset, consumer_offset = await asyncio.gather(
                    self.max_offset(queue), self.consumer_offset(group, queue)
                )
                return QueueProgress(queue, broker_offset, consumer_offset)

            rows = await asyncio.gather(*(progress(queue) for queue in route.subscribe_queues))
            if explicit or any((row.consumer_offset or 0) > 0 for row in rows):
                results.extend(rows)
        return ConsumerProgress(group, tuple(sorted(results, key=lambda row: row.queue)), tuple(await self.consumer_ids(group)))

    # ------------------------------------------------------------------------------ messages

    async def query_messages_by_key(
        self,
        topic: str,
        key: str,
        *,
        max_num: int = 32,
        begin_timestamp_ms: int = 0,
        end_timestamp_ms: int | None = None,
        unique_key: bool = False,
    ) -> list[MessageExt]:
        """QUERY_MESSAGE on every broker group of the topic: messages whose KEYS hold ``key`` (or
        whose UNIQ_KEY is ``key`` with ``unique_key``), oldest first."""
        route = await self.instance.topic_route(topic)
        fields = {
            "topic": topic,
            "key": key,
            "maxNum": str(min(max_num, _QUERY_MAX_NUM)),
            "beginTimestamp": str(begin_timestamp_ms),
            "endTimestamp": str(end_timestamp_ms if end_timestamp_ms is not None else 2**63 - 1),
        }
        if unique_key:
            fields[UNIQUE_MSG_QUERY_FLAG] = "true"
        found: dict[tuple[str, int], MessageExt] = {}
        for name in route.broker_names:
            response, address = await self.instance.invoke_any(name, RequestCode.QUERY_MESSAGE, fields)
            if response.code == ResponseCode.QUERY_NOT_FOUND:
                continue
            check_response(response, address)
            try:
                messages = decode_messages(response.body, name)
            except RecordError as error:
                raise MQBrokerError(ResponseCode.SYSTEM_ERROR, f"bad QUERY_MESSAGE answer: {error}", address) from None
            for message in messages:
                # the key index is a hash: keep exact matches only (Java filters the same way)
                matches = message.unique_id == key if unique_key else key in message.keys
                if matches and message.topic == topic:
                    found[(name, message.commit_log_offset)] = message
        return sorted(found.values(), key=lambda message: (message.store_timestamp_ms, message.commit_log_offset))

    async def view_message(self, offset_msg_id: str) -> MessageExt:
        """VIEW_MESSAGE_BY_ID: the message at the commit-log offset the store-based id names. The id's
        store host is the group's stable address, not a node's, so every known group is asked."""
        try:
            _, physical_offset = decode_message_id(offset_msg_id)
        except ValueError as error:
            raise MessageValidationError(f"not a message id: {offset_msg_id!r} ({error})") from None
        names = self.instance.known_broker_names() or await self.broker_names()
        last_error: MQClientError | None = None
        for name in names:
            try:
                response, address = await self.instance.invoke_any(
                    name, RequestCode.VIEW_MESSAGE_BY_ID, {"offset": str(physical_offset)}
                )
                check_response(response, address)
                (message,) = decode_messages(response.body, name)
            except MQClientError as error:
                last_error = error
                continue
            except (RecordError, ValueError):
                continue
            if message.offset_msg_id.upper() == offset_msg_id.upper():
                return message
        raise last_error or MQClientError(ResponseCode.QUERY_NOT_FOUND, f"no message with id {offset_msg_id}")

    async def query_message_by_id(self, msg_id: str, topic: str | None = None) -> MessageExt:
        """A message by store-based id, or by client id (UNIQ_KEY) when ``topic`` is given (Java's
        ``queryMsgById`` tries both the same way)."""
        try:
            return await self.view_message(msg_id)
        except MQClientError as error:
            if topic is None:
                raise
            first_error = error
        matches = await self.query_messages_by_key(topic, msg_id, unique_key=True)
        if not matches:
            raise MQClientError(
                ResponseCode.QUERY_NOT_FOUND, f"no message with id {msg_id} in topic {topic!r} ({first_error.remark})"
            )
        return matches[-1]
