"""An in-process fake raftmq broker group for client tests: a real name server (in process), and N
broker nodes on real loopback ports sharing one in-memory store (as if Raft replicated it instantly).

It speaks the RocketMQ 4.x requests the client uses, with raftmq's rules: only the leader accepts
writes (followers answer SERVICE_NOT_AVAILABLE with ``leaderAddress``), the leader registers as
brokerId 0, followers under their own ids and serve reads. Records are encoded with the store's own
codec, so the client decodes exactly what a real broker returns.

Test hooks: ``group.inject`` (answer the next requests of a code with an error), ``group.drop_answers``
(store the send but do not answer: an unknown outcome), ``kill`` / ``revive`` a node, ``elect``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

from broker.namesrv import (
    NameServer,
    NameServerConfig,
    RegisterBrokerRequestHeader,
    UnregisterBrokerRequestHeader,
)
from broker.pull_rates import PullRates
from broker.remoting import Connection, RemotingServer, RequestContext
from commitlog.hosts import encode_host, encode_message_id
from commitlog.message import MessageInput
from commitlog.record_codec import decode_record, encode_record
from commitlog.retries import retry_digest
from commitlog.tag_codes import tags_hash_code
from protocol.batch import decode_batch
from protocol.client import RemotingClient
from protocol.codes import RequestCode, ResponseCode
from protocol.command import RemotingCommand, make_response
from protocol.fastjson import object_keyed_json
from protocol.properties import decode_properties, encode_properties
from protocol.route_data import PERM_READ, PERM_WRITE, RegisterBrokerBody, TopicConfig

LOOPBACK = "127.0.0.1"
BROKER_NAME = "broker-a"
CLUSTER = "DefaultCluster"
#: the group's stable store host (not any node's address: every replica writes the same bytes)
STORE_HOST = encode_host("10.0.0.1", 10911)
DEFAULT_QUEUES = 4
V2_NAMES = dict(zip("abcdefghijklmn", [
    "producerGroup", "topic", "defaultTopic", "defaultTopicQueueNums", "queueId", "sysFlag",
    "bornTimestamp", "flag", "properties", "reconsumeTimes", "unitMode", "maxReconsumeTimes", "batch",
    "brokerName",
], strict=True))


Handler = Callable[["FakeNode", RequestContext], Awaitable[RemotingCommand | None]]


@dataclass
class TopicState:
    read_queue_nums: int
    write_queue_nums: int
    perm: int = PERM_READ | PERM_WRITE
    order: bool = False
    queues: dict[int, list[int]] = field(default_factory=lambda: defaultdict(list))  # queue -> physical offsets


@dataclass
class EndTransaction:
    fields: dict[str, str]


class FakeStore:
    """What Raft would replicate: records, topics, offsets; plus dedupe of retries by UNIQ_KEY and content,
    as apply's (commitlog.retries), without its time window."""

    def __init__(self) -> None:
        self.records: dict[int, bytes] = {}
        self.next_physical = 0
        self.topics: dict[str, TopicState] = {"TBW102": TopicState(8, 8)}
        self.offsets: dict[tuple[str, str, int], int] = {}
        self.dedupe: dict[tuple[str, str, int, bytes], tuple[str, int, int]] = {}
        self.end_transactions: list[EndTransaction] = []
        self.new_data = asyncio.Condition()

    def topic(self, name: str, queues: int = DEFAULT_QUEUES) -> TopicState:
        if name not in self.topics:
            self.topics[name] = TopicState(queues, queues)
        return self.topics[name]

    def append(self, topic: str, queue_id: int, body: bytes, properties: dict[str, str], *,
               sys_flag: int = 0, flag: int = 0, born_ms: int = 0, reconsume: int = 0,
               dedupe: bool = True) -> tuple[str, int, int]:
        """Store one record; a retry (a UNIQ_KEY and content seen before) returns the first result."""
        unique = properties.get("UNIQ_KEY") if dedupe else None
        identity = (topic, unique or "", reconsume, retry_digest(flag, body, encode_properties(properties)))
        if unique and identity in self.dedupe:
            return self.dedupe[identity]
        state = self.topic(topic)
        queue = state.queues[queue_id]
        record = encode_record(
            MessageInput(topic, queue_id, flag, sys_flag, born_ms, encode_host("127.0.0.1", 5000),
                         time.time_ns() // 1_000_000, reconsume, 0, body, encode_properties(properties)),
            len(queue), self.next_physical, STORE_HOST,
        )
        physical = self.next_physical
        self.records[physical] = record
        self.next_physical += len(record)
        transaction = sys_flag & 0xC
        if transaction != 0x4:  # prepared records are not dispatched to the consume queue
            queue.append(physical)
        result = (encode_message_id(STORE_HOST, physical), queue_id, len(queue) - 1)
        if unique:
            self.dedupe[identity] = result
        return result

    def messages(self, topic: str, queue_id: int) -> list[bytes]:
        state = self.topics.get(topic)
        if state is None:
            return []
        return [self.records[offset] for offset in state.queues.get(queue_id, [])]

    async def notify(self) -> None:
        async with self.new_data:
            self.new_data.notify_all()


class FakeNode:
    def __init__(self, group: FakeGroup, node_id: int) -> None:
        self.group = group
        self.node_id = node_id
        self.server: RemotingServer | None = None
        self.port = 0
        self.namesrv_client: RemotingClient | None = None
        self.alive = False
        self.requests: list[int] = []

    @property
    def address(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    @property
    def is_leader(self) -> bool:
        return self.group.leader_id == self.node_id

    async def start(self) -> None:
        self.server = RemotingServer(LOOPBACK, self.port)
        self.server.register(list(self.group.processors()), self.process, queue_max=4096, workers=64)
        await self.server.start()
        self.port = self.server.port
        self.alive = True

    async def stop(self) -> None:
        self.alive = False
        if self.namesrv_client is not None:
            await self.namesrv_client.close()
            self.namesrv_client = None
        if self.server is not None:
            await self.server.stop(grace_seconds=0.2)
            self.server = None

    async def register(self) -> None:
        if not self.alive:
            return
        if self.namesrv_client is None or self.namesrv_client.is_closed:
            host, port = self.group.namesrv.split(":")
            self.namesrv_client = await RemotingClient.connect(host, int(port))
        store = self.group.store
        body = RegisterBrokerBody(topic_configs=tuple(
            TopicConfig(name, state.read_queue_nums, state.write_queue_nums, state.perm)
            for name, state in store.topics.items()
        )).encode()
        header = RegisterBrokerRequestHeader(
            broker_name=BROKER_NAME, broker_address=self.address, cluster_name=CLUSTER,
            ha_server_address=self.address, broker_id=0 if self.is_leader else self.node_id + 1,
        )
        response = await self.namesrv_client.request(RequestCode.REGISTER_BROKER, header.to_ext_fields(), body)
        assert response.code == ResponseCode.SUCCESS, response

    async def unregister(self) -> None:
        if self.namesrv_client is None:
            return
        header = UnregisterBrokerRequestHeader(BROKER_NAME, self.address, CLUSTER,
                                               0 if self.is_leader else self.node_id + 1)
        await self.namesrv_client.request(RequestCode.UNREGISTER_BROKER, header.to_ext_fields())

    async def process(self, context: RequestContext) -> RemotingCommand | None:
        request = context.request
        self.requests.append(request.code)
        injected = self.group.take_injection(request.code)
        if injected is not None:
            return make_response(request, injected, f"injected {injected}")
        return await self.group.processors()[request.code](self, context)


class FakeGroup:
    """A name server and ``nodes`` broker nodes; node 0 leads at first."""

    def __init__(self, nodes: int = 1) -> None:
        self.store = FakeStore()
        self.nodes = [FakeNode(self, node_id) for node_id in range(nodes)]
        self.leader_id: int | None = 0
        self.name_server = NameServer(NameServerConfig(port=0, forget_brokers_on_disconnect=True))
        self.namesrv = ""
        self.injections: dict[int, list[int]] = defaultdict(list)
        self.drop_answers: dict[int, int] = defaultdict(int)
        self.consumers: dict[str, dict[str, float]] = defaultdict(dict)
        self.producer_connections: dict[str, list[Connection]] = defaultdict(list)
        self.heartbeats: list[dict[str, object]] = []
        self.locks: dict[tuple[str, str, int], str] = {}
        self.lock_requests = 0
        self.unlocked: list[tuple[str, str, int]] = []
        self.pulls = 0
        self.pull_rates = PullRates()  # messages served per group and topic (GET_CONSUME_STATS's consumeTps)
        self.sent_back: list[dict[str, str]] = []
        self.auto_create = True
        self.notify_consumers = True
        self.consumer_connections: dict[str, dict[str, Connection]] = defaultdict(dict)

    async def start(self) -> FakeGroup:
        await self.name_server.start()
        self.namesrv = self.name_server.address
        for node in self.nodes:
            await node.start()
        await self.register_all()
        return self

    async def stop(self) -> None:
        for node in self.nodes:
            await node.stop()
        await self.name_server.stop(grace_seconds=0.2)

    async def register_all(self) -> None:
        for node in self.nodes:
            await node.register()

    @property
    def leader(self) -> FakeNode:
        assert self.leader_id is not None
        return self.nodes[self.leader_id]

    async def elect(self, node_id: int | None) -> None:
        """Move leadership (None: no leader); every live node re-registers under its new id."""
        old = self.leader_id
        if old is not None and self.nodes[old].alive:
            await self.nodes[old].unregister()
        self.leader_id = node_id
        await self.register_all()

    async def kill(self, node_id: int) -> None:
        await self.nodes[node_id].stop()

    async def revive(self, node_id: int) -> None:
        await self.nodes[node_id].start()
        await self.nodes[node_id].register()

    def inject(self, code: int, *responses: int) -> None:
        self.injections[code].extend(responses)

    def take_injection(self, code: int) -> int | None:
        queue = self.injections.get(code)
        return queue.pop(0) if queue else None

    def processors(self) -> Mapping[int, Handler]:
        return _PROCESSORS

    def queue_bodies(self, topic: str) -> list[bytes]:
        return [decode_record(raw).body for queue_id in sorted(self.store.topic(topic).queues)
                for raw in self.store.messages(topic, queue_id)]

    def all_records(self, topic: str) -> list[tuple[int, int, dict[str, str], bytes]]:
        """(queue id, queue offset, properties, body) of every dispatched record of ``topic``."""
        result = []
        state = self.store.topics.get(topic)
        if state is None:
            return []
        for queue_id in sorted(state.queues):
            for raw in self.store.messages(topic, queue_id):
                record = decode_record(raw)
                result.append((queue_id, record.queue_offset, decode_properties(record.properties), record.body))
        return result


# ------------------------------------------------------------------------------------ processors


def _not_leader(node: FakeNode, request: RemotingCommand) -> RemotingCommand | None:
    if node.is_leader:
        return None
    fields = {}
    if node.group.leader_id is not None:
        fields["leaderAddress"] = node.group.leader.address
    return make_response(request, ResponseCode.SERVICE_NOT_AVAILABLE, "not the leader", fields)


async def _send(node: FakeNode, context: RequestContext) -> RemotingCommand | None:
    request = context.request
    redirect = _not_leader(node, request)
    if redirect is not None:
        return redirect
    fields = dict(request.ext_fields)
    if "a" in fields:
        fields = {V2_NAMES.get(key, key): value for key, value in fields.items()}
    group = node.group
    store = group.store
    topic = fields["topic"]
    if topic not in store.topics:
        if not group.auto_create:
            return make_response(request, ResponseCode.TOPIC_NOT_EXIST, f"topic {topic} not exist")
        store.topic(topic, min(int(fields.get("defaultTopicQueueNums", "4")), DEFAULT_QUEUES))
        await group.register_all()
    queue_id = int(fields["queueId"]) % store.topics[topic].write_queue_nums
    properties = decode_properties(fields.get("properties", "").encode())
    born = int(fields.get("bornTimestamp", "0"))
    if request.code == RequestCode.SEND_BATCH_MESSAGE or fields.get("batch") in ("true", "1"):
        results = [store.append(topic, queue_id, message.body, message.properties, flag=message.flag, born_ms=born)
                   for message in decode_batch(request.body)]
        msg_id = ",".join(result[0] for result in results)
        queue_offset = results[0][2]
    else:
        sys_flag = int(fields.get("sysFlag", "0"))
        msg_id, _, queue_offset = store.append(topic, queue_id, request.body, properties,
                                               sys_flag=sys_flag, flag=int(fields.get("flag", "0")),
                                               born_ms=born, reconsume=int(fields.get("reconsumeTimes", "0")))
    await store.notify()
    if group.drop_answers[request.code] > 0:
        group.drop_answers[request.code] -= 1
        return None
    return make_response(request, ResponseCode.SUCCESS, ext_fields={
        "msgId": msg_id, "queueId": str(queue_id), "queueOffset": str(queue_offset),
    })


async def _pull(node: FakeNode, context: RequestContext) -> RemotingCommand:
    request = context.request
    fields = request.ext_fields
    store = node.group.store
    node.group.pulls += 1
    topic, queue_id = fields["topic"], int(fields["queueId"])
    offset, max_nums = int(fields["queueOffset"]), int(fields["maxMsgNums"])
    suspend = int(fields.get("sysFlag", "0")) & 2
    if topic not in store.topics:
        return make_response(request, ResponseCode.TOPIC_NOT_EXIST, f"topic {topic} not exist")
    deadline = asyncio.get_running_loop().time() + int(fields.get("suspendTimeoutMillis", "0")) / 1000
    while True:
        records = store.messages(topic, queue_id)
        maximum = len(records)
        if offset > maximum or offset < 0:
            return make_response(request, ResponseCode.PULL_OFFSET_MOVED, "offset moved", {
                "nextBeginOffset": str(maximum if offset > maximum else 0),
                "minOffset": "0", "maxOffset": str(maximum), "suggestWhichBrokerId": "0"})
        if offset < maximum:
            break
        remaining = deadline - asyncio.get_running_loop().time()
        if not suspend or remaining <= 0:
            return make_response(request, ResponseCode.PULL_NOT_FOUND, "no new message", {
                "nextBeginOffset": str(offset), "minOffset": "0", "maxOffset": str(maximum),
                "suggestWhichBrokerId": "0"})
        async with store.new_data:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(store.new_data.wait(), min(remaining, 0.5))
    subscription = fields.get("subscription", "*")
    wanted = None if subscription in ("*", "") else {tags_hash_code(tag.strip()) for tag in subscription.split("||")}
    chosen = []
    next_offset = offset
    for raw in records[offset:offset + max_nums]:
        next_offset += 1
        record = decode_record(raw)
        tags = decode_properties(record.properties).get("TAGS")
        if wanted is None or tags_hash_code(tags) in wanted:
            chosen.append(raw)
    ext = {"nextBeginOffset": str(next_offset), "minOffset": "0", "maxOffset": str(maximum),
           "suggestWhichBrokerId": "0"}
    if not chosen:
        return make_response(request, ResponseCode.PULL_RETRY_IMMEDIATELY, "no matched message", ext)
    node.group.pull_rates.record(fields.get("consumerGroup", ""), topic, len(chosen))
    return make_response(request, ResponseCode.SUCCESS, ext_fields=ext, body=b"".join(chosen))


async def _query_offset(node: FakeNode, context: RequestContext) -> RemotingCommand:
    fields = context.request.ext_fields
    key = (fields["consumerGroup"], fields["topic"], int(fields["queueId"]))
    if key not in node.group.store.offsets:
        return make_response(context.request, ResponseCode.QUERY_NOT_FOUND, "no offset")
    return make_response(context.request, ResponseCode.SUCCESS, ext_fields={"offset": str(node.group.store.offsets[key])})


async def _consume_stats(node: FakeNode, context: RequestContext) -> RemotingCommand:
    """GET_CONSUME_STATS as the real broker answers it, without the subscription filter."""
    fields = context.request.ext_fields
    group, asked = fields["consumerGroup"], fields.get("topic")
    store = node.group.store
    topics = [asked] if asked else sorted({topic for (owner, topic, _) in store.offsets if owner == group})
    rows: list[tuple[dict[str, object], dict[str, object]]] = []
    consume_tps = 0.0
    for topic in topics:
        state = store.topics.get(topic)
        if state is None:
            return make_response(context.request, ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist")
        consume_tps += node.group.pull_rates.messages_per_second(group, topic)
        for queue_id in range(state.read_queue_nums):
            rows.append(({"brokerName": BROKER_NAME, "queueId": queue_id, "topic": topic},
                         {"brokerOffset": len(state.queues.get(queue_id, [])),
                          "consumerOffset": max(store.offsets.get((group, topic, queue_id), 0), 0), "lastTimestamp": 0}))
    body = '{"consumeTps":' + json.dumps(round(consume_tps, 3)) + ',"offsetTable":' + object_keyed_json(rows) + "}"
    return make_response(context.request, ResponseCode.SUCCESS, body=body.encode())


async def _update_offset(node: FakeNode, context: RequestContext) -> RemotingCommand:
    redirect = _not_leader(node, context.request)
    if redirect is not None:
        return redirect
    fields = context.request.ext_fields
    node.group.store.offsets[(fields["consumerGroup"], fields["topic"], int(fields["queueId"]))] = int(fields["commitOffset"])
    return make_response(context.request, ResponseCode.SUCCESS)


async def _heartbeat(node: FakeNode, context: RequestContext) -> RemotingCommand:
    data = json.loads(context.request.body)
    group = node.group
    group.heartbeats.append(data)
    for producer in data.get("producerDataSet", []):
        connections = group.producer_connections[producer["groupName"]]
        if context.connection not in connections:
            connections.append(context.connection)
    for consumer in data.get("consumerDataSet", []):
        members = group.consumer_connections[consumer["groupName"]]
        joined = data["clientID"] not in members
        members[data["clientID"]] = context.connection
        group.consumers[consumer["groupName"]][data["clientID"]] = time.monotonic()
        if joined and group.notify_consumers:
            for connection in members.values():
                if not connection.is_closed:
                    await connection.send_oneway(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED,
                                                 {"consumerGroup": consumer["groupName"]})
        retry = "%RETRY%" + consumer["groupName"]
        if consumer.get("messageModel") == "CLUSTERING" and retry not in group.store.topics:
            group.store.topic(retry, 1)  # as the real broker: a clustering group gets its retry topic
            await group.register_all()
    return make_response(context.request, ResponseCode.SUCCESS)


async def _unregister_client(node: FakeNode, context: RequestContext) -> RemotingCommand:
    fields = context.request.ext_fields
    if "consumerGroup" in fields:
        node.group.consumers[fields["consumerGroup"]].pop(fields["clientID"], None)
    return make_response(context.request, ResponseCode.SUCCESS)


async def _consumer_list(node: FakeNode, context: RequestContext) -> RemotingCommand:
    members = sorted(node.group.consumers.get(context.request.ext_fields["consumerGroup"], {}))
    if not members:
        return make_response(context.request, ResponseCode.SYSTEM_ERROR, "no consumer")
    return make_response(context.request, ResponseCode.SUCCESS,
                         body=json.dumps({"consumerIdList": members}).encode())


async def _lock(node: FakeNode, context: RequestContext) -> RemotingCommand:
    body = json.loads(context.request.body)
    group = node.group
    group.lock_requests += 1
    locked = []
    for mq in body["mqSet"]:
        key = (body["consumerGroup"], mq["topic"], int(mq["queueId"]))
        owner = group.locks.get(key)
        if owner is None or owner == body["clientId"]:
            group.locks[key] = body["clientId"]
            locked.append(mq)
    return make_response(context.request, ResponseCode.SUCCESS, body=json.dumps({"lockOKMQSet": locked}).encode())


async def _unlock(node: FakeNode, context: RequestContext) -> RemotingCommand:
    body = json.loads(context.request.body)
    for mq in body["mqSet"]:
        key = (body["consumerGroup"], mq["topic"], int(mq["queueId"]))
        if node.group.locks.get(key) == body["clientId"]:
            del node.group.locks[key]
            node.group.unlocked.append(key)
    return make_response(context.request, ResponseCode.SUCCESS)


async def _max_offset(node: FakeNode, context: RequestContext) -> RemotingCommand:
    fields = context.request.ext_fields
    count = len(node.group.store.messages(fields["topic"], int(fields["queueId"])))
    return make_response(context.request, ResponseCode.SUCCESS, ext_fields={"offset": str(count)})


async def _min_offset(node: FakeNode, context: RequestContext) -> RemotingCommand:
    return make_response(context.request, ResponseCode.SUCCESS, ext_fields={"offset": "0"})


async def _search_offset(node: FakeNode, context: RequestContext) -> RemotingCommand:
    fields = context.request.ext_fields
    timestamp = int(fields["timestamp"])
    records = node.group.store.messages(fields["topic"], int(fields["queueId"]))
    for index, raw in enumerate(records):
        if decode_record(raw).store_timestamp >= timestamp:
            return make_response(context.request, ResponseCode.SUCCESS, ext_fields={"offset": str(index)})
    return make_response(context.request, ResponseCode.SUCCESS, ext_fields={"offset": str(len(records))})


async def _query_message(node: FakeNode, context: RequestContext) -> RemotingCommand:
    fields = context.request.ext_fields
    key, topic, limit = fields["key"], fields["topic"], int(fields["maxNum"])
    unique = fields.get("_UNIQUE_KEY_QUERY") == "true"
    found = []
    for raw in node.group.store.records.values():
        record = decode_record(raw)
        if record.topic != topic:
            continue
        properties = decode_properties(record.properties)
        if (unique and properties.get("UNIQ_KEY") == key) or (
            not unique and key in properties.get("KEYS", "").split(" ")
        ):
            found.append(raw)
    if not found:
        return make_response(context.request, ResponseCode.QUERY_NOT_FOUND, "not found")
    return make_response(context.request, ResponseCode.SUCCESS, body=b"".join(found[:limit]), ext_fields={
        "indexLastUpdateTimestamp": "0", "indexLastUpdatePhyoffset": "0"})


async def _view_message(node: FakeNode, context: RequestContext) -> RemotingCommand:
    offset = int(context.request.ext_fields["offset"])
    raw = node.group.store.records.get(offset)
    if raw is None:
        return make_response(context.request, ResponseCode.SYSTEM_ERROR, f"no message at offset {offset}")
    return make_response(context.request, ResponseCode.SUCCESS, body=raw)


async def _create_topic(node: FakeNode, context: RequestContext) -> RemotingCommand:
    redirect = _not_leader(node, context.request)
    if redirect is not None:
        return redirect
    fields = context.request.ext_fields
    state = node.group.store.topic(fields["topic"], int(fields["writeQueueNums"]))
    state.read_queue_nums = int(fields["readQueueNums"])
    state.write_queue_nums = int(fields["writeQueueNums"])
    state.perm = int(fields["perm"])
    state.order = fields.get("order") == "true"
    await node.group.register_all()
    return make_response(context.request, ResponseCode.SUCCESS)


async def _all_topic_config(node: FakeNode, context: RequestContext) -> RemotingCommand:
    table = {name: {"topicName": name, "readQueueNums": state.read_queue_nums, "writeQueueNums": state.write_queue_nums,
                    "perm": state.perm, "topicSysFlag": 0, "order": state.order}
             for name, state in node.group.store.topics.items()}
    return make_response(context.request, ResponseCode.SUCCESS, body=json.dumps({"topicConfigTable": table}).encode())


async def _send_back(node: FakeNode, context: RequestContext) -> RemotingCommand:
    redirect = _not_leader(node, context.request)
    if redirect is not None:
        return redirect
    fields = dict(context.request.ext_fields)
    group = node.group
    group.sent_back.append(fields)
    raw = group.store.records[int(fields["offset"])]
    record = decode_record(raw)
    properties = decode_properties(record.properties)
    reconsume = record.reconsume_times + 1
    properties.setdefault("RETRY_TOPIC", record.topic)
    properties.setdefault("ORIGIN_MESSAGE_ID", fields.get("originMsgId", ""))
    target = "%RETRY%" + fields["group"]
    if reconsume > int(fields.get("maxReconsumeTimes", "16")) or int(fields.get("delayLevel", "0")) < 0:
        target = "%DLQ%" + fields["group"]
    if target not in group.store.topics:
        group.store.topic(target, 1)
        await group.register_all()
    group.store.append(target, 0, record.body, properties, sys_flag=record.sys_flag, reconsume=reconsume,
                       dedupe=False)
    await group.store.notify()
    return make_response(context.request, ResponseCode.SUCCESS)


async def _end_transaction(node: FakeNode, context: RequestContext) -> RemotingCommand | None:
    fields = dict(context.request.ext_fields)
    group = node.group
    if fields.get("commitOrRollback") in ("8", "12"):
        redirect = _not_leader(node, context.request)
        if redirect is not None:
            return redirect
    group.store.end_transactions.append(EndTransaction(fields))
    if fields.get("commitOrRollback") == "8":
        raw = group.store.records.get(int(fields["commitLogOffset"]))
        if raw is not None:
            record = decode_record(raw)
            properties = decode_properties(record.properties)
            properties.pop("TRAN_MSG", None)
            topic = properties.pop("REAL_TOPIC", record.topic)
            group.store.append(topic, record.queue_id, record.body, properties, sys_flag=0x8, dedupe=False)
            await group.store.notify()
    return make_response(context.request, ResponseCode.SUCCESS)


_PROCESSORS: dict[int, Handler] = {
    RequestCode.SEND_MESSAGE: _send,
    RequestCode.SEND_MESSAGE_V2: _send,
    RequestCode.SEND_BATCH_MESSAGE: _send,
    RequestCode.PULL_MESSAGE: _pull,
    RequestCode.QUERY_CONSUMER_OFFSET: _query_offset,
    RequestCode.UPDATE_CONSUMER_OFFSET: _update_offset,
    RequestCode.GET_CONSUME_STATS: _consume_stats,
    RequestCode.HEART_BEAT: _heartbeat,
    RequestCode.UNREGISTER_CLIENT: _unregister_client,
    RequestCode.GET_CONSUMER_LIST_BY_GROUP: _consumer_list,
    RequestCode.LOCK_BATCH_MQ: _lock,
    RequestCode.UNLOCK_BATCH_MQ: _unlock,
    RequestCode.GET_MAX_OFFSET: _max_offset,
    RequestCode.GET_MIN_OFFSET: _min_offset,
    RequestCode.SEARCH_OFFSET_BY_TIMESTAMP: _search_offset,
    RequestCode.QUERY_MESSAGE: _query_message,
    RequestCode.VIEW_MESSAGE_BY_ID: _view_message,
    RequestCode.UPDATE_AND_CREATE_TOPIC: _create_topic,
    RequestCode.GET_ALL_TOPIC_CONFIG: _all_topic_config,
    RequestCode.CONSUMER_SEND_MSG_BACK: _send_back,
    RequestCode.END_TRANSACTION: _end_transaction,
}


async def check_transaction(group: FakeGroup, producer_group: str, physical_offset: int,
                            transaction_id: str = "TX") -> None:
    """CHECK_TRANSACTION_STATE to the first live producer connection of ``producer_group``, as the
    leader's check service does: oneway, the stored half message as the body."""
    raw = group.store.records[physical_offset]
    record = decode_record(raw)
    connection = next(c for c in group.producer_connections[producer_group] if not c.is_closed)
    await connection.send_oneway(RequestCode.CHECK_TRANSACTION_STATE, {
        "tranStateTableOffset": str(record.queue_offset), "commitLogOffset": str(physical_offset),
        "msgId": decode_properties(record.properties).get("UNIQ_KEY", ""), "transactionId": transaction_id,
        "offsetMsgId": encode_message_id(STORE_HOST, physical_offset),
    }, raw)
