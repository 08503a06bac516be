"""Clients the broker knows: consumers and producers by group (from HEART_BEAT), and the queue locks of
orderly consumers (RebalanceLockManager). Per-broker, in memory, as RocketMQ keeps them: clients
heartbeat every 30 s and re-lock every 20 s, so a new leader learns them again within that time.

Processors: HEART_BEAT, UNREGISTER_CLIENT, GET_CONSUMER_LIST_BY_GROUP, LOCK_BATCH_MQ, UNLOCK_BATCH_MQ,
GET_CONSUMER_CONNECTION_LIST and GET_PRODUCER_CONNECTION_LIST (``mqadmin consumerConnection`` /
``producerConnection``); and
GET_CONSUMER_RUNNING_INFO, which an admin sends and the broker passes to the consumer's connection
(:class:`ConsumerCallProcessor`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

from broker.context import BrokerContext
from broker.offsets import OffsetCommitter
from broker.relay import DepartedConnection, RelayedClients, RelayedConnection, client_connection
from broker.remoting.server import Connection, Processor, RequestContext
from broker.requests import RequestError, text
from protocol.codec import EncodeError
from protocol.codes import RequestCode, ResponseCode
from protocol.command import RemotingCommand, make_response
from protocol.connection import RemotingError, RequestTimeoutError
from protocol.route_data import PERM_READ, PERM_WRITE
from protocol.topics import retry_topic

log = logging.getLogger(__name__)

CLIENTS_PER_GROUP_MAX: Final = 10_000
GROUPS_MAX: Final = 100_000
LOCK_QUEUES_PER_REQUEST_MAX: Final = 10_000
MESSAGE_MODEL_CLUSTERING: Final = "CLUSTERING"
#: how long the broker waits for a consumer's answer to a request it passes on (Java's ``Broker2Client``)
CALL_CONSUMER_TIMEOUT_SECONDS: Final = 10.0
#: the header fields of GET_CONSUMER_RUNNING_INFO passed on to the consumer (not an admin's signature)
_RUNNING_INFO_FIELDS: Final = ("consumerGroup", "clientId", "jstackEnable")
MESSAGE_MODEL_BROADCASTING: Final = "BROADCASTING"


def _json_body(body: bytes, what: str) -> dict[str, object]:
    try:
        value = json.loads(body.decode("utf-8")) if body else {}
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise RequestError(ResponseCode.SYSTEM_ERROR, f"{what} body is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise RequestError(ResponseCode.SYSTEM_ERROR, f"{what} body must be a JSON object")
    return value


def _message_model(value: object) -> str:
    """C++ clients send enums as integers (BROADCASTING = 0, CLUSTERING = 1), Java-style ones as names."""
    if value in (0, "0", MESSAGE_MODEL_BROADCASTING):
        return MESSAGE_MODEL_BROADCASTING
    return MESSAGE_MODEL_CLUSTERING


#: Java's ``ConsumeType`` and ``ConsumeFromWhere``, in ordinal order (C++ clients send the ordinal)
CONSUME_TYPES: Final = ("CONSUME_ACTIVELY", "CONSUME_PASSIVELY")
CONSUME_FROM_WHERE: Final = (
    "CONSUME_FROM_LAST_OFFSET", "CONSUME_FROM_LAST_OFFSET_AND_FROM_MIN_WHEN_BOOT_FIRST", "CONSUME_FROM_MIN_OFFSET",
    "CONSUME_FROM_MAX_OFFSET", "CONSUME_FROM_FIRST_OFFSET", "CONSUME_FROM_TIMESTAMP",
)
#: the fields of a heartbeat's subscription kept for GET_CONSUMER_CONNECTION_LIST (Java's SubscriptionData)
_SUBSCRIPTION_FIELDS: Final = ("classFilterMode", "topic", "subString", "tagsSet", "codeSet", "subVersion",
                               "expressionType")


def _enum_name(value: object, names: tuple[str, ...], default: str) -> str:
    """An enum a heartbeat sent by name (Java) or by ordinal (C++): its name; ``default`` if unknown."""
    if isinstance(value, str) and value in names:
        return value
    if isinstance(value, (int, str)) and not isinstance(value, bool) and str(value).isdigit():
        index = int(value)
        if index < len(names):
            return names[index]
    return default


def _subscription_data(entry: dict[str, object]) -> dict[str, object]:
    """A subscription as GET_CONSUMER_CONNECTION_LIST shows it: SubscriptionData's fields, with Java's
    defaults for those a client left out."""
    data: dict[str, object] = {"classFilterMode": False, "tagsSet": [], "codeSet": [], "subVersion": 0,
                               "expressionType": "TAG"}
    data.update({key: entry[key] for key in _SUBSCRIPTION_FIELDS if key in entry})
    data["subString"] = str(entry.get("subString") or "*")
    return data


@dataclass(slots=True)
class ClientEntry:
    client_id: str
    connection: Connection
    last_seen: float
    #: topic -> subscription expression ("*", "TagA || TagB")
    subscriptions: dict[str, str] = field(default_factory=dict)
    message_model: str = MESSAGE_MODEL_CLUSTERING
    #: what the client's requests say it is (``language`` and ``version`` of its heartbeat)
    language: str = "JAVA"
    version: int = 0
    consume_type: str = "CONSUME_PASSIVELY"
    consume_from_where: str = "CONSUME_FROM_LAST_OFFSET"
    #: topic -> the heartbeat's subscription, as GET_CONSUMER_CONNECTION_LIST shows it
    subscription_data: dict[str, dict[str, object]] = field(default_factory=dict)

    def connection_json(self) -> dict[str, object]:
        """Java's ``Connection``: clientId, clientAddr, language, version."""
        return {"clientId": self.client_id, "clientAddr": self.connection.remote_address,
                "language": self.language, "version": self.version}


class ConsumerManager:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.consumers: dict[str, dict[str, ClientEntry]] = {}
        self.producers: dict[str, dict[str, ClientEntry]] = {}
        #: called with a group whose set of consumers changed
        self.on_group_changed: Callable[[str], None] = lambda group: None

    def register_consumer(self, group: str, client_id: str, connection: Connection, subscriptions: dict[str, str],
                          message_model: str, **details: Any) -> bool:
        """Returns whether the group's membership changed. ``details``: more :class:`ClientEntry` fields
        (language, version, consume_type, consume_from_where, subscription_data)."""
        clients = self.consumers.get(group)
        if clients is None:
            if len(self.consumers) >= GROUPS_MAX:
                raise RequestError(ResponseCode.SYSTEM_BUSY, "too many consumer groups")
            clients = self.consumers[group] = {}
        entry = clients.get(client_id)
        changed = entry is None or entry.connection is not connection
        if entry is None and len(clients) >= CLIENTS_PER_GROUP_MAX:
            raise RequestError(ResponseCode.SYSTEM_BUSY, f"too many consumers in group {group}")
        clients[client_id] = ClientEntry(client_id, connection, self.clock(), subscriptions, message_model, **details)
        return changed

    def register_producer(self, group: str, client_id: str, connection: Connection, language: str = "JAVA",
                          version: int = 0) -> None:
        clients = self.producers.setdefault(group, {})
        if client_id not in clients and len(clients) >= CLIENTS_PER_GROUP_MAX:
            raise RequestError(ResponseCode.SYSTEM_BUSY, f"too many producers in group {group}")
        clients[client_id] = ClientEntry(client_id, connection, self.clock(), language=language, version=version)

    def unregister(self, client_id: str, producer_group: str | None, consumer_group: str | None) -> None:
        if producer_group:
            self.producers.get(producer_group, {}).pop(client_id, None)
        if consumer_group and self.consumers.get(consumer_group, {}).pop(client_id, None) is not None:
            self.on_group_changed(consumer_group)

    def subscription(self, group: str, topic: str) -> str | None:
        for entry in self.consumers.get(group, {}).values():
            expression = entry.subscriptions.get(topic)
            if expression is not None:
                return expression
        return None

    def consumer(self, group: str, client_id: str) -> ClientEntry | None:
        """The live consumer ``client_id`` of ``group``, if it is connected here."""
        entry = self.consumers.get(group, {}).get(client_id)
        return None if entry is None or entry.connection.is_closed else entry

    def consumer_ids(self, group: str) -> list[str]:
        return sorted(self.consumers.get(group, {}))

    def live(self, table: dict[str, dict[str, ClientEntry]], group: str) -> list[ClientEntry]:
        """The clients of ``group`` in ``table`` whose connection is open, by client id."""
        entries = table.get(group, {})
        return [entries[client_id] for client_id in sorted(entries) if not entries[client_id].connection.is_closed]

    def producer_connections(self, group: str) -> list[Connection]:
        return [entry.connection for entry in self.producers.get(group, {}).values() if not entry.connection.is_closed]

    def connection_closed(self, connection: Connection) -> None:
        """The clients of a closed connection go; of a member link, those behind it (broker.relay) too."""
        self._remove(lambda entry: entry.connection is connection or (
            isinstance(entry.connection, RelayedConnection) and entry.connection.link is connection))

    def keep_registrations(self, connection: Connection) -> None:
        """The clients of ``connection``, which is being moved to a follower (broker.front_moves), stay
        registered under a :class:`~broker.relay.DepartedConnection` until they heartbeat again or expire."""
        departed = DepartedConnection(connection.remote_address, connection.connection_id)
        for table in (self.consumers, self.producers):
            for clients in table.values():
                for entry in clients.values():
                    if entry.connection is connection:
                        entry.connection = departed

    def expire(self, expiry_seconds: float) -> None:
        now = self.clock()
        self._remove(lambda entry: now - entry.last_seen > expiry_seconds)

    def _remove(self, predicate: Callable[[ClientEntry], bool]) -> None:
        for table, notify in ((self.consumers, True), (self.producers, False)):
            for group in list(table):
                clients = table[group]
                gone = [client_id for client_id, entry in clients.items() if predicate(entry)]
                for client_id in gone:
                    del clients[client_id]
                if not clients:
                    del table[group]
                if gone and notify:
                    self.on_group_changed(group)


class QueueLocks:
    """(group, topic, broker name, queue id) -> (client id, last renewal)."""

    def __init__(self, lock_seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.lock_seconds = lock_seconds
        self.clock = clock
        self._locks: dict[tuple[str, str, str, int], tuple[str, float]] = {}

    def try_lock(self, group: str, client_id: str, queues: list[tuple[str, str, int]]) -> list[tuple[str, str, int]]:
        now = self.clock()
        locked = []
        for topic, broker_name, queue_id in queues:
            key = (group, topic, broker_name, queue_id)
            holder = self._locks.get(key)
            if holder is None or holder[0] == client_id or now - holder[1] > self.lock_seconds:
                self._locks[key] = (client_id, now)
                locked.append((topic, broker_name, queue_id))
        return locked

    def unlock(self, group: str, client_id: str, queues: list[tuple[str, str, int]]) -> None:
        for topic, broker_name, queue_id in queues:
            key = (group, topic, broker_name, queue_id)
            holder = self._locks.get(key)
            if holder is not None and holder[0] == client_id:
                del self._locks[key]


def _queues(body: dict[str, object]) -> list[tuple[str, str, int]]:
    queues = body.get("mqSet") or []
    if not isinstance(queues, list) or len(queues) > LOCK_QUEUES_PER_REQUEST_MAX:
        raise RequestError(ResponseCode.SYSTEM_ERROR, "mqSet must be a list of message queues")
    parsed = []
    for queue in queues:
        if not isinstance(queue, dict):
            raise RequestError(ResponseCode.SYSTEM_ERROR, "mqSet entries must be objects")
        topic, broker_name, queue_id = queue.get("topic"), queue.get("brokerName"), queue.get("queueId")
        if not isinstance(topic, str) or not isinstance(broker_name, str) or not isinstance(queue_id, int):
            raise RequestError(ResponseCode.SYSTEM_ERROR, "a message queue needs topic, brokerName and queueId")
        parsed.append((topic, broker_name, queue_id))
    return parsed


def _queue_json(queues: list[tuple[str, str, int]]) -> list[dict[str, object]]:
    return [{"topic": topic, "brokerName": broker_name, "queueId": queue_id} for topic, broker_name, queue_id in queues]


class ClientProcessor:
    def __init__(self, broker: BrokerContext, consumers: ConsumerManager, locks: QueueLocks,
                 offsets: OffsetCommitter | None = None, relays: RelayedClients | None = None) -> None:
        self.broker = broker
        #: the clients behind followers, as the leader registers them (broker.relay)
        self.relays = relays if relays is not None else RelayedClients()
        self.offsets = offsets
        self.consumers = consumers
        self.locks = locks
        consumers.on_group_changed = self._group_changed
        self._background: set[asyncio.Task[None]] = set()

    async def __call__(self, context: RequestContext) -> RemotingCommand | None:
        request = context.request
        try:
            if request.code == RequestCode.HEART_BEAT:
                return await self.heartbeat(context)
            if request.code == RequestCode.UNREGISTER_CLIENT:
                fields = request.ext_fields
                if self.offsets is not None:
                    await self.offsets.flush()  # its last commits apply before its queues are handed over
                self.consumers.unregister(text(fields, "clientID"), fields.get("producerGroup"),
                                          fields.get("consumerGroup"))
                return make_response(request, ResponseCode.SUCCESS)
            if request.code == RequestCode.GET_CONSUMER_LIST_BY_GROUP:
                group = text(request.ext_fields, "consumerGroup")
                ids = self.consumers.consumer_ids(group)
                if not ids:
                    return make_response(request, ResponseCode.SYSTEM_ERROR, f"no consumer for this group, {group}")
                return make_response(request, ResponseCode.SUCCESS, body=json.dumps({"consumerIdList": ids}).encode())
            if request.code == RequestCode.LOCK_BATCH_MQ:
                body = _json_body(request.body, "LOCK_BATCH_MQ")
                group, client_id = str(body.get("consumerGroup") or ""), str(body.get("clientId") or "")
                if not group or not client_id:
                    raise RequestError(ResponseCode.SYSTEM_ERROR, "LOCK_BATCH_MQ needs consumerGroup and clientId")
                locked = self.locks.try_lock(group, client_id, _queues(body))
                return make_response(request, ResponseCode.SUCCESS,
                                     body=json.dumps({"lockOKMQSet": _queue_json(locked)}).encode())
            if request.code == RequestCode.GET_CONSUMER_CONNECTION_LIST:
                return self.consumer_connections(request)
            if request.code == RequestCode.GET_PRODUCER_CONNECTION_LIST:
                group = text(request.ext_fields, "producerGroup")
                producers = self.consumers.live(self.consumers.producers, group)
                if not producers:
                    return make_response(request, ResponseCode.SYSTEM_ERROR, f"the producer group[{group}] not exist")
                return make_response(request, ResponseCode.SUCCESS, body=json.dumps(
                    {"connectionSet": [entry.connection_json() for entry in producers]}).encode())
            if request.code == RequestCode.UNLOCK_BATCH_MQ:
                body = _json_body(request.body, "UNLOCK_BATCH_MQ")
                self.locks.unlock(str(body.get("consumerGroup") or ""), str(body.get("clientId") or ""),
                                  _queues(body))
                return make_response(request, ResponseCode.SUCCESS)
            return make_response(request, ResponseCode.REQUEST_CODE_NOT_SUPPORTED, "not a client request")
        except RequestError as error:
            return make_response(request, error.code, error.remark, error.ext_fields)

    def consumer_connections(self, request: RemotingCommand) -> RemotingCommand:
        """GET_CONSUMER_CONNECTION_LIST (Java's ``ConsumerConnection``): the group's live members, its
        subscriptions and how it consumes. CONSUMER_NOT_ONLINE when it has no member here."""
        group = text(request.ext_fields, "consumerGroup")
        members = self.consumers.live(self.consumers.consumers, group)
        if not members:
            return make_response(request, ResponseCode.CONSUMER_NOT_ONLINE, f"the consumer group[{group}] not online")
        subscriptions: dict[str, dict[str, object]] = {}
        for entry in members:  # as Java's ConsumerGroupInfo: one subscription per topic, the latest heartbeat's
            subscriptions.update(entry.subscription_data)
        newest = max(members, key=lambda entry: entry.last_seen)
        return make_response(request, ResponseCode.SUCCESS, body=json.dumps({
            "connectionSet": [entry.connection_json() for entry in members],
            "subscriptionTable": dict(sorted(subscriptions.items())),
            "consumeType": newest.consume_type,
            "messageModel": newest.message_model,
            "consumeFromWhere": newest.consume_from_where,
        }).encode())

    async def heartbeat(self, context: RequestContext) -> RemotingCommand:
        request = context.request
        body = _json_body(request.body, "HEART_BEAT")
        client_id = body.get("clientID")
        if not isinstance(client_id, str) or not client_id:
            raise RequestError(ResponseCode.SYSTEM_ERROR, "HEART_BEAT needs a clientID")
        producers = body.get("producerDataSet") or []
        consumers = body.get("consumerDataSet") or []
        if not isinstance(producers, list) or not isinstance(consumers, list):
            raise RequestError(ResponseCode.SYSTEM_ERROR, "producerDataSet and consumerDataSet must be lists")
        language, version = request.language, request.version
        connection = client_connection(self.relays, context)
        for producer in producers:
            if isinstance(producer, dict) and isinstance(producer.get("groupName"), str):
                self.consumers.register_producer(producer["groupName"], client_id, connection, language, version)
        for consumer in consumers:
            if not isinstance(consumer, dict) or not isinstance(consumer.get("groupName"), str):
                raise RequestError(ResponseCode.SYSTEM_ERROR, "consumerDataSet entries need a groupName")
            group = consumer["groupName"]
            subscriptions: dict[str, str] = {}
            subscription_data: dict[str, dict[str, object]] = {}
            subscription_list = consumer.get("subscriptionDataSet") or []
            if not isinstance(subscription_list, list):
                raise RequestError(ResponseCode.SYSTEM_ERROR, "subscriptionDataSet must be a list")
            for subscription in subscription_list:
                if isinstance(subscription, dict) and isinstance(subscription.get("topic"), str):
                    subscriptions[subscription["topic"]] = str(subscription.get("subString") or "*")
                    subscription_data[subscription["topic"]] = _subscription_data(subscription)
            model = _message_model(consumer.get("messageModel"))
            details = {
                "language": language, "version": version, "subscription_data": subscription_data,
                "consume_type": _enum_name(consumer.get("consumeType"), CONSUME_TYPES, "CONSUME_PASSIVELY"),
                "consume_from_where": _enum_name(consumer.get("consumeFromWhere"), CONSUME_FROM_WHERE,
                                                 "CONSUME_FROM_LAST_OFFSET"),
            }
            if self.consumers.register_consumer(group, client_id, connection, subscriptions, model, **details):
                self._group_changed(group)
            if model == MESSAGE_MODEL_CLUSTERING and self.broker.member.is_leader:
                self._spawn(self._ensure_retry_topic(group))
        return make_response(request, ResponseCode.SUCCESS)

    async def _ensure_retry_topic(self, group: str) -> None:
        topic = retry_topic(group)
        if self.broker.topic_config(topic) is not None:
            return
        try:
            await self.broker.ensure_topic(topic, 1, PERM_READ | PERM_WRITE)
        except RequestError as exc:
            log.info("cannot create retry topic %s yet: %s", topic, exc.remark)

    def _group_changed(self, group: str) -> None:
        for entry in list(self.consumers.consumers.get(group, {}).values()):
            self._spawn(self._notify(entry.connection, group))

    async def _notify(self, connection: Connection, group: str) -> None:
        if connection.is_closed:
            return
        try:
            await connection.send_oneway(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, {"consumerGroup": group})
        except (RemotingError, OSError) as exc:
            log.debug("cannot notify %s of group %s: %s", connection.remote_address, group, exc)

    def _spawn(self, coroutine: object) -> None:
        task: asyncio.Task[None] = asyncio.get_running_loop().create_task(coroutine)  # type: ignore[arg-type]
        self._background.add(task)
        task.add_done_callback(self._background.discard)


class ConsumerCallProcessor:
    """GET_CONSUMER_RUNNING_INFO (Java's ``AdminBrokerProcessor.callConsumer``): the request goes to the
    named consumer over its own connection, and its answer (code, remark, body) comes back to the admin.
    Answers SYSTEM_ERROR when the consumer is not connected here, CONSUME_MSG_TIMEOUT when it does not
    answer within ``timeout_seconds``. Registered on its own route, so a slow consumer never holds up
    heartbeats."""

    def __init__(self, consumers: ConsumerManager, timeout_seconds: float = CALL_CONSUMER_TIMEOUT_SECONDS,
                 elsewhere: Processor | None = None) -> None:
        self.consumers = consumers
        self.timeout_seconds = timeout_seconds
        #: asked when the consumer is not connected here (a follower asks the leader, which knows them all)
        self.elsewhere = elsewhere

    async def __call__(self, context: RequestContext) -> RemotingCommand | None:
        request = context.request
        try:
            if request.code != RequestCode.GET_CONSUMER_RUNNING_INFO:
                return make_response(request, ResponseCode.REQUEST_CODE_NOT_SUPPORTED, "not a consumer call")
            fields = request.ext_fields
            group, client_id = text(fields, "consumerGroup"), text(fields, "clientId")
        except RequestError as error:
            return make_response(request, error.code, error.remark, error.ext_fields)
        entry = self.consumers.consumer(group, client_id)
        if entry is None and self.elsewhere is not None and not context.forwarded_for:
            answer = await self.elsewhere(context)
            if answer is not None:
                return answer
        if entry is None:
            return make_response(request, ResponseCode.SYSTEM_ERROR, f"The Consumer <{group}> <{client_id}> not online")
        passed = {key: fields[key] for key in _RUNNING_INFO_FIELDS if key in fields}
        try:
            answer = await entry.connection.send_request(request.code, passed, request.body,
                                                         timeout_seconds=self.timeout_seconds)
        except RequestTimeoutError as exc:
            return make_response(request, ResponseCode.CONSUME_MSG_TIMEOUT,
                                 f"consumer <{group}> <{client_id}> Timeout: {exc}")
        except (RemotingError, OSError, EncodeError) as exc:
            return make_response(request, ResponseCode.SYSTEM_ERROR,
                                 f"invoke consumer <{group}> <{client_id}> Exception: {exc}")
        return make_response(request, answer.code, answer.remark, answer.ext_fields, answer.body)
