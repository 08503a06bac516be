"""Offsets, queries and administration: QUERY/UPDATE_CONSUMER_OFFSET, GET_MAX/MIN_OFFSET,
SEARCH_OFFSET_BY_TIMESTAMP, GET_EARLIEST_MSG_STORETIME, QUERY_MESSAGE, VIEW_MESSAGE_BY_ID,
UPDATE_AND_CREATE_TOPIC, DELETE_TOPIC_IN_BROKER, GET_ALL_TOPIC_CONFIG, GET_BROKER_RUNTIME_INFO, what
``mqadmin topicStatus`` and ``consumerProgress`` read: GET_TOPIC_STATS_INFO and GET_CONSUME_STATS (their
bodies key each queue by a MessageQueue object, as fastjson writes such a map), the consumer groups
(GET_ALL_SUBSCRIPTIONGROUP_CONFIG, as rocketmq-dashboard lists them; UPDATE_AND_CREATE_SUBSCRIPTIONGROUP and
DELETE_SUBSCRIPTIONGROUP, as ``mqadmin updateSubGroup`` / ``deleteSubGroup`` send them: broker.subscription_groups)
and ``mqadmin resetOffsetByTime``'s INVOKE_BROKER_TO_RESET_OFFSET.

Every change (a topic or subscription group created, changed or deleted, an offset reset) goes through Raft: a deleted topic
leaves every replica's state with its committed offsets, a reset offset is a replicated offset commit."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping
from typing import Final

from broker.consumers import ConsumerManager
from broker.context import BrokerContext
from broker.offsets import OffsetCommitter
from broker.pull_rates import PullRates
from broker.remoting.server import RequestContext
from broker.requests import INT32_MAX, RequestError, boolean, integer, text
from broker.runtime_stats import QueueFacts, RuntimeStats, StoreFacts, Totals, disk_space
from broker.subscription_groups import group_config_json, parse_group_config
from commitlog.errors import StoreError
from commitlog.sys_flags import SYSFLAG_BORNHOST_V6
from dledger.command import Command, SubscriptionGroup, TopicConfig
from protocol.codes import RequestCode, ResponseCode
from protocol.command import RemotingCommand, make_response
from protocol.fastjson import object_keyed_json
from protocol.route_data import PERM_INHERIT, PERM_READ, PERM_WRITE
from protocol.topics import INTERNAL_TOPIC_QUEUES, SYSTEM_TOPICS, check_topic_name

QUERY_MESSAGES_MAX: Final = 64
QUEUE_NUMS_MAX: Final = 1024
ADMIN_CODES: Final = (
    RequestCode.QUERY_CONSUMER_OFFSET, RequestCode.UPDATE_CONSUMER_OFFSET, RequestCode.GET_MAX_OFFSET,
    RequestCode.GET_MIN_OFFSET, RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, RequestCode.GET_EARLIEST_MSG_STORETIME,
    RequestCode.QUERY_MESSAGE, RequestCode.VIEW_MESSAGE_BY_ID, RequestCode.UPDATE_AND_CREATE_TOPIC,
    RequestCode.DELETE_TOPIC_IN_BROKER, RequestCode.GET_ALL_TOPIC_CONFIG, RequestCode.GET_BROKER_RUNTIME_INFO,
    RequestCode.GET_TOPIC_STATS_INFO, RequestCode.GET_CONSUME_STATS, RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG,
    RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
    RequestCode.DELETE_SUBSCRIPTIONGROUP,
)
#: groups one GET_ALL_SUBSCRIPTIONGROUP_CONFIG answer lists at most (each takes ~250 bytes of a frame)
GROUPS_LISTED_MAX: Final = 20_000
#: INVOKE_BROKER_TO_RESET_OFFSET's timestamp that means each queue's max offset (Java's, as mqadmin sends it)
RESET_TO_LATEST: Final = -1
#: ours, in INVOKE_BROKER_TO_RESET_OFFSET: "true" resets while the group has live consumers of the topic.
#: Java's broker tells live consumers to move (RESET_CONSUMER_CLIENT_OFFSET); this one does not, and a live
#: consumer commits the position it holds over the reset within seconds, so it refuses unless asked.
RESET_WHILE_ONLINE_FIELD: Final = "resetWhileOnline"
#: the extField of that refusal naming the live consumers (comma-separated client ids)
ONLINE_CONSUMERS_FIELD: Final = "onlineConsumers"
#: where a stored record's store timestamp starts, by born host kind (the store host comes after it)
_STORE_TIMESTAMP_AT: Final = (56, 68)


def record_store_timestamp(record: bytes) -> int:
    """The store timestamp of a stored record (after an 8- or a 20-byte born host)."""
    at = _STORE_TIMESTAMP_AT[1 if int.from_bytes(record[36:40], "big") & SYSFLAG_BORNHOST_V6 else 0]
    return int.from_bytes(record[at : at + 8], "big", signed=True)


class AdminProcessor:
    def __init__(self, broker: BrokerContext, offsets: OffsetCommitter, consumers: ConsumerManager | None = None,
                 rates: PullRates | None = None, stats: RuntimeStats | None = None,
                 queue_depths: Callable[[], Mapping[str, tuple[int, int]]] = dict) -> None:
        """``stats``: the member's put and get statistics (sampled by the node); ``queue_depths``: the
        remoting server's request queues (GET_BROKER_RUNTIME_INFO reports both in Java's fields)."""
        self.broker = broker
        self.offsets = offsets
        self.consumers = consumers or ConsumerManager()
        self.rates = rates if rates is not None else PullRates()
        self.stats = stats if stats is not None else RuntimeStats(self._pull_totals)
        self.queue_depths = queue_depths

    async def __call__(self, context: RequestContext) -> RemotingCommand | None:
        request = context.request
        try:
            return await self.handle(request)
        except RequestError as error:
            return make_response(request, error.code, error.remark, error.ext_fields)

    async def handle(self, request: RemotingCommand) -> RemotingCommand:
        fields = request.ext_fields
        broker = self.broker
        store = broker.store
        code = request.code
        if code == RequestCode.QUERY_CONSUMER_OFFSET:
            group, topic = text(fields, "consumerGroup"), text(fields, "topic")
            queue_id = integer(fields, "queueId", None, 0, INT32_MAX)
            offset = self.offsets.pending_offset(group, topic, queue_id)
            if offset is None:
                offset = broker.state.consumer_offset(group, topic, queue_id)
            if offset is None:
                # As RocketMQ: a group that never committed starts at 0 while the queue still starts there
                if store.min_queue_offset(topic, queue_id) <= 0:
                    offset = 0
                else:
                    return make_response(request, ResponseCode.QUERY_NOT_FOUND,
                                         "Not found, V3_0_6_SNAPSHOT maybe this group consumer boot first")
            return _ok(request, offset=offset)
        if code == RequestCode.UPDATE_CONSUMER_OFFSET:
            group, topic = text(fields, "consumerGroup"), text(fields, "topic")
            queue_id = integer(fields, "queueId", None, 0, INT32_MAX)
            offset = integer(fields, "commitOffset", None, 0)
            broker.require_leader()
            await self.offsets.submit(group, topic, queue_id, offset)
            return _ok(request)
        if code in (RequestCode.GET_MAX_OFFSET, RequestCode.GET_MIN_OFFSET):
            topic, queue_id = text(fields, "topic"), integer(fields, "queueId", None, 0, INT32_MAX)
            if code == RequestCode.GET_MAX_OFFSET:
                return _ok(request, offset=store.max_queue_offset(topic, queue_id))
            return _ok(request, offset=store.min_queue_offset(topic, queue_id))
        if code == RequestCode.SEARCH_OFFSET_BY_TIMESTAMP:
            topic, queue_id = text(fields, "topic"), integer(fields, "queueId", None, 0, INT32_MAX)
            return _ok(request, offset=store.offset_by_timestamp(topic, queue_id, integer(fields, "timestamp")))
        if code == RequestCode.GET_EARLIEST_MSG_STORETIME:
            topic, queue_id = text(fields, "topic"), integer(fields, "queueId", None, 0, INT32_MAX)
            timestamp = self._store_timestamp(topic, queue_id, store.min_queue_offset(topic, queue_id))
            if timestamp is None:
                return make_response(request, ResponseCode.SYSTEM_ERROR, f"no message in {topic} queue {queue_id}")
            return _ok(request, timestamp=timestamp)
        if code == RequestCode.QUERY_MESSAGE:
            return self._query(request)
        if code == RequestCode.VIEW_MESSAGE_BY_ID:
            offset = integer(fields, "offset", None, 0)
            try:
                record = store.read_record(offset)
            except (StoreError, ValueError) as exc:
                return make_response(request, ResponseCode.SYSTEM_ERROR, f"no message at offset {offset}: {exc}")
            return make_response(request, ResponseCode.SUCCESS, body=record)
        if code == RequestCode.UPDATE_AND_CREATE_TOPIC:
            return await self._create_topic(request)
        if code == RequestCode.DELETE_TOPIC_IN_BROKER:
            return await self._delete_topic(request)
        if code == RequestCode.GET_ALL_TOPIC_CONFIG:
            table = {name: _topic_json(config) for name, config in sorted(dict(broker.state.topics).items())}
            return make_response(request, ResponseCode.SUCCESS, body=json.dumps(
                {"topicConfigTable": table, "dataVersion": {"timestamp": 0, "counter": broker.state.applied_index}}
            ).encode())
        if code == RequestCode.GET_TOPIC_STATS_INFO:
            return self._topic_stats(request)
        if code == RequestCode.GET_CONSUME_STATS:
            return self._consume_stats(request)
        if code == RequestCode.GET_BROKER_RUNTIME_INFO:
            return make_response(request, ResponseCode.SUCCESS, body=json.dumps({"table": self.runtime_info()}).encode())
        if code == RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG:
            return self._subscription_groups(request)
        if code == RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP:
            configured = parse_group_config(request.body, self.broker.config.max_reconsume_times)
            await self.broker.propose(Command((configured,)))
            return _ok(request)
        if code == RequestCode.DELETE_SUBSCRIPTIONGROUP:
            return await self._delete_group(request)
        if code == RequestCode.INVOKE_BROKER_TO_RESET_OFFSET:
            return await self._reset_offset(request)
        return make_response(request, ResponseCode.REQUEST_CODE_NOT_SUPPORTED, "not an admin request")

    def runtime_info(self) -> dict[str, str]:
        """Java's fields (runtime_stats: what rocketmq-dashboard and rocketmq-exporter read), then ours."""
        broker = self.broker
        status = broker.member.status()
        return {
            **self._java_runtime_info(),
            "nodeId": status.node_id,
            "brokerName": broker.config.broker_name,
            "brokerAddress": broker.config.announced_address,
            "listenAddress": broker.config.listen_address,
            "brokerRole": "LEADER" if status.role == "leader" else status.role.upper(),
            "raftTerm": str(status.term),
            "raftLeader": broker.client_address_by_raft.get(status.leader or "", status.leader or ""),
            "commitIndex": str(status.commit_index),
            "appliedIndex": str(status.applied_index),
            "commitLogMaxOffset": str(status.commit_log_max_offset),
            "commitLogMinOffset": str(status.commit_log_min_offset),
            "uniqKeyCollisions": str(status.uniq_key_collisions),
            "raftJournalSyncs": str(status.journal_syncs),
            "raftDamage": status.damage or "",
            # where the send path's time goes on this member (dledger.stages; raftmq bench produce --stages)
            "sendStages": broker.member.stages.encode(),
            "topics": str(len(broker.state.topics)),
        }

    def _pull_totals(self) -> Totals:
        """Without the node's statistics: what this processor's pull counters know (no puts)."""
        rates = self.rates
        return Totals(pulls_found=rates.pulls_found, pulls_missed=rates.pulls_missed,
                      messages_served=rates.messages_served)

    def _java_runtime_info(self) -> dict[str, str]:
        store = self.broker.store
        low, high = store.commit_log.min_offset, store.max_physical_offset
        earliest = -1
        if high > low:
            try:
                earliest = store.store_timestamp_at(low)
            except (StoreError, ValueError):
                earliest = -1
        total, free = disk_space(str(store.root))
        facts = StoreFacts(low, high, earliest, store.unflushed_bytes, total, free)
        queues = {name: QueueFacts(waiting, limit) for name, (waiting, limit) in self.queue_depths().items()}
        return self.stats.fields(facts, queues, self.broker.member.stages.snapshot().get("apply", []))

    def _store_timestamp(self, topic: str, queue_id: int, queue_offset: int) -> int | None:
        """The store timestamp of a queue's message at ``queue_offset``; None when there is none."""
        result = self.broker.store.get_messages(topic, queue_id, queue_offset, 1)
        return record_store_timestamp(result.messages[0]) if result.messages else None

    def _queue_key(self, topic: str, queue_id: int) -> dict[str, object]:
        return {"brokerName": self.broker.config.broker_name, "queueId": queue_id, "topic": topic}

    def _topic_stats(self, request: RemotingCommand) -> RemotingCommand:
        """GET_TOPIC_STATS_INFO (``mqadmin topicStatus``): each write queue's offsets and when it was last
        written (the store timestamp of its last message; 0 for an empty queue)."""
        topic = text(request.ext_fields, "topic")
        config = self.broker.topic_config(topic)
        if config is None:
            return make_response(request, ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist")
        store = self.broker.store
        rows = []
        for queue_id in range(config.write_queue_nums):
            low, high = store.min_queue_offset(topic, queue_id), store.max_queue_offset(topic, queue_id)
            last = (self._store_timestamp(topic, queue_id, high - 1) or 0) if high > low else 0
            rows.append((self._queue_key(topic, queue_id),
                         {"minOffset": low, "maxOffset": high, "lastUpdateTimestamp": last}))
        return make_response(request, ResponseCode.SUCCESS,
                             body=('{"offsetTable":' + object_keyed_json(rows) + "}").encode())

    def _consume_stats(self, request: RemotingCommand) -> RemotingCommand:
        """GET_CONSUME_STATS (``mqadmin consumerProgress``): per queue of each topic the group consumes (the
        topic asked, or every topic it committed on), the broker's max offset, the group's committed offset
        and the store timestamp of the last message it consumed. As Java's, a topic the group's live
        members do not subscribe is left out while it has members. ``consumeTps`` is, as Java's, the sum
        over the topics reported of the messages per second this member served the group in the last
        minute (broker.pull_rates)."""
        fields = request.ext_fields
        group = text(fields, "consumerGroup")
        asked = fields.get("topic") or None
        broker = self.broker
        if asked is not None:
            topics = [asked]
        else:
            committed = {key[1] for key in broker.state.consumer_offsets if key[0] == group}
            topics = sorted(committed | self.offsets.pending_topics(group))
        members = self.consumers.live(self.consumers.consumers, group)
        subscribed = {topic for entry in members for topic in entry.subscriptions}
        rows = []
        consume_tps = 0.0
        for topic in topics:
            config = broker.topic_config(topic)
            if config is None or (members and topic not in subscribed):
                continue
            consume_tps += self.rates.messages_per_second(group, topic)
            for queue_id in range(config.read_queue_nums):
                pending = self.offsets.pending_offset(group, topic, queue_id)
                consumer_offset = pending if pending is not None else broker.state.consumer_offset(group, topic, queue_id)
                consumer_offset = max(consumer_offset or 0, 0)
                last = (self._store_timestamp(topic, queue_id, consumer_offset - 1) or 0) if consumer_offset > 0 else 0
                rows.append((self._queue_key(topic, queue_id), {
                    "brokerOffset": broker.store.max_queue_offset(topic, queue_id),
                    "consumerOffset": consumer_offset, "lastTimestamp": last}))
        if not rows and asked is not None and broker.topic_config(asked) is None:
            return make_response(request, ResponseCode.TOPIC_NOT_EXIST, f"topic[{asked}] not exist")
        return make_response(request, ResponseCode.SUCCESS,
                             body=('{"consumeTps":' + json.dumps(round(consume_tps, 3)) + ',"offsetTable":'
                                   + object_keyed_json(rows) + "}").encode())

    def _query(self, request: RemotingCommand) -> RemotingCommand:
        fields = request.ext_fields
        topic, key = text(fields, "topic"), text(fields, "key")
        count = min(integer(fields, "maxNum", 32, 1, INT32_MAX), QUERY_MESSAGES_MAX)
        begin = integer(fields, "beginTimestamp", 0)
        end = integer(fields, "endTimestamp", 2**63 - 1)
        found = self.broker.store.query_by_key(topic, key, count, begin, end)
        if not found:
            return make_response(request, ResponseCode.QUERY_NOT_FOUND, "can not find message, maybe time range not correct")
        records = [self.broker.store.read_record(message.physical_offset) for message in found]
        return make_response(request, ResponseCode.SUCCESS, None, {
            "indexLastUpdateTimestamp": str(max(message.store_timestamp for message in found)),
            "indexLastUpdatePhyoffset": str(max(message.physical_offset for message in found)),
        }, b"".join(records))

    async def _create_topic(self, request: RemotingCommand) -> RemotingCommand:
        fields = request.ext_fields
        topic = text(fields, "topic")
        problem = check_topic_name(topic)
        if problem is not None:
            raise RequestError(ResponseCode.SYSTEM_ERROR, problem)
        if topic in SYSTEM_TOPICS:
            raise RequestError(ResponseCode.SYSTEM_ERROR, f"the topic[{topic}] is conflict with system topic")
        read = integer(fields, "readQueueNums", 16, 0, QUEUE_NUMS_MAX)
        write = integer(fields, "writeQueueNums", 16, 0, QUEUE_NUMS_MAX)
        perm = integer(fields, "perm", PERM_READ | PERM_WRITE, 0, PERM_READ | PERM_WRITE | PERM_INHERIT)
        if read == 0 and write == 0:
            raise RequestError(ResponseCode.SYSTEM_ERROR, "a topic needs read or write queues")
        sys_flag = integer(fields, "topicSysFlag", 0, 0, INT32_MAX)
        order = fields.get("order", "false").strip().lower() == "true"
        self.broker.require_leader()
        await self.broker.put_topic(TopicConfig(topic, read, write, perm, sys_flag, order))
        return _ok(request)

    async def _delete_topic(self, request: RemotingCommand) -> RemotingCommand:
        """DELETE_TOPIC_IN_BROKER: the topic leaves the replicated state of every member, with every group's
        committed offsets of it (``ReplicatedState.apply_topic``); pulls and sends then find no such topic.
        The broker's own topics are refused, as Java refuses system topics. The name servers keep routing
        it until DELETE_TOPIC_IN_NAMESRV (registrations only add topics), as with Java's broker."""
        topic = text(request.ext_fields, "topic")
        if topic in SYSTEM_TOPICS or topic in INTERNAL_TOPIC_QUEUES:
            raise RequestError(ResponseCode.SYSTEM_ERROR, f"The topic[{topic}] is conflict with system topic.")
        if topic not in self.broker.state.topics:
            return make_response(request, ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist")
        await self.broker.propose(Command((TopicConfig(topic, 0, 0, 0, deleted=True),)))
        self.broker.on_topics_changed()
        return _ok(request)

    def _subscription_groups(self, request: RemotingCommand) -> RemotingCommand:
        """GET_ALL_SUBSCRIPTIONGROUP_CONFIG (Java's SubscriptionGroupWrapper): the consumer groups this broker
        group knows. Java creates a group's entry on its first heartbeat or pull (autoCreateSubscriptionGroup)
        and keeps it; raftmq keeps no table of such implicit groups, so the answer is what stands in for it:
        the groups configured through Raft, those with committed offsets (both replicated) and those with live
        consumers connected to this member, each with Java's default settings unless configured."""
        broker = self.broker
        configured = dict(broker.state.groups)
        names = set(configured) | {key[0] for key in list(broker.state.consumer_offsets)}
        names |= {name for name in list(self.consumers.consumers) if self.consumers.live(self.consumers.consumers, name)}
        if len(names) > GROUPS_LISTED_MAX:
            raise RequestError(ResponseCode.SYSTEM_ERROR,
                               f"{len(names)} consumer groups exceed what one answer lists ({GROUPS_LISTED_MAX})")
        default_retry = broker.config.max_reconsume_times
        table = {name: group_config_json(name, configured.get(name), default_retry) for name in sorted(names)}
        return make_response(request, ResponseCode.SUCCESS, body=json.dumps({
            "subscriptionGroupTable": table, "dataVersion": {"timestamp": 0, "counter": broker.state.applied_index},
        }).encode())

    async def _delete_group(self, request: RemotingCommand) -> RemotingCommand:
        """DELETE_SUBSCRIPTIONGROUP (header groupName, cleanOffset): the group's configuration leaves every
        member's replicated state, with its pop consumption state (``ReplicatedState.apply_group``); it then
        consumes with the broker's defaults. A group that is not configured answers SUCCESS and changes
        nothing, as Java's. Its committed offsets stay (Java's cleanOffset=false); cleanOffset=true is refused:
        offsets are removed with the topic (DELETE_TOPIC_IN_BROKER), or moved with a reset."""
        fields = request.ext_fields
        group = text(fields, "groupName")
        if boolean(fields, "cleanOffset", False):
            raise RequestError(ResponseCode.SYSTEM_ERROR,
                               "cleanOffset=true is not supported: a group's committed offsets stay when it is deleted")
        self.broker.require_leader()
        if group in self.broker.state.groups:
            await self.broker.propose(Command((SubscriptionGroup(group, deleted=True),)))
        return _ok(request)

    async def _reset_offset(self, request: RemotingCommand) -> RemotingCommand:
        """INVOKE_BROKER_TO_RESET_OFFSET (``mqadmin resetOffsetByTime``; header topic, group, timestamp,
        isForce): each read queue's committed offset of ``group`` moves to the first message stored at or
        after ``timestamp`` (each queue's max offset for -1, its min offset for 0), or, without isForce, only
        back, never forward (Java's rule). Committed as one replicated offset commit, after this leader
        caught up with what any member applied (a barrier), so the max offsets are the group's latest.

        Java's broker tells the group's live consumers to move and answers CONSUMER_NOT_ONLINE when it has
        none (mqadmin then commits the offsets itself); this one commits for a group without live consumers
        of the topic, and refuses one that has them (naming them in ``onlineConsumers``) unless
        ``resetWhileOnline`` is true: a live consumer would commit the position it holds over the reset.
        Answers Java's ResetOffsetBody, ``{"offsetTable": {MessageQueue: offset}}``."""
        fields = request.ext_fields
        topic, group = text(fields, "topic"), text(fields, "group")
        timestamp = integer(fields, "timestamp", None, RESET_TO_LATEST)
        only_back = not boolean(fields, "isForce", True)
        while_online = boolean(fields, RESET_WHILE_ONLINE_FIELD, False)
        if not group.strip():
            raise RequestError(ResponseCode.SYSTEM_ERROR, "the consumer group is blank")
        if topic in SYSTEM_TOPICS or topic in INTERNAL_TOPIC_QUEUES:
            raise RequestError(ResponseCode.SYSTEM_ERROR, f"the offsets of system topic {topic} are the broker's own")
        broker = self.broker
        if broker.topic_config(topic) is None:
            return make_response(request, ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist")
        broker.require_leader()
        online = [entry.client_id for entry in self.consumers.live(self.consumers.consumers, group)
                  if topic in entry.subscriptions]
        if online and not while_online:
            raise RequestError(
                ResponseCode.SYSTEM_ERROR,
                f"consumer group {group} has {len(online)} live consumer(s) of {topic} ({', '.join(online)}): "
                "stop them first, a live consumer commits the position it holds over a reset",
                {ONLINE_CONSUMERS_FIELD: ",".join(online)})
        await broker.barrier()
        config = broker.topic_config(topic)
        if config is None:  # deleted meanwhile
            return make_response(request, ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist")
        store = broker.store
        targets: list[tuple[int, int]] = []
        for queue_id in range(config.read_queue_nums):
            if timestamp == RESET_TO_LATEST:
                target = store.max_queue_offset(topic, queue_id)
            else:
                target = store.offset_by_timestamp(topic, queue_id, timestamp)
            pending = self.offsets.pending_offset(group, topic, queue_id)
            current = pending if pending is not None else broker.state.consumer_offset(group, topic, queue_id)
            if only_back and current is not None and current < target:
                target = current
            targets.append((queue_id, target))
        # one submission: behind any commit already waiting, and coalesced into one command
        await asyncio.gather(*[self.offsets.submit(group, topic, queue_id, offset) for queue_id, offset in targets])
        table = ",".join(f"{json.dumps(self._queue_key(topic, queue_id), separators=(',', ':'), sort_keys=True)}:{offset}"
                         for queue_id, offset in targets)
        return make_response(request, ResponseCode.SUCCESS, body=('{"offsetTable":{' + table + "}}").encode())


def _topic_json(config: TopicConfig) -> dict[str, object]:
    return {"topicName": config.topic, "readQueueNums": config.read_queue_nums,
            "writeQueueNums": config.write_queue_nums, "perm": config.perm, "topicFilterType": "SINGLE_TAG",
            "topicSysFlag": config.topic_sys_flag, "order": config.order}


def _ok(request: RemotingCommand, **fields: int) -> RemotingCommand:
    return make_response(request, ResponseCode.SUCCESS, None, {key: str(value) for key, value in fields.items()})
