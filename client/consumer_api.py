"""The requests consumers send (Java's ``PullAPIWrapper`` and ``MQClientAPIImpl``), as functions over a
:class:`ClientInstance`, and subscriptions with their tag filter (``FilterAPI``, ``SubscriptionData``).

Writes (offset commits, send-back) go to the group's leader with failover; reads (pulls, offset
queries) go to the leader first, then to followers, which serve committed data.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from client.errors import MQBrokerError, MQClientError, broker_error
from client.instance import ClientInstance, check_response, int_field
from client.message import MessageExt, MessageQueue, PullResult, PullStatus, decode_messages
from commitlog.record_codec import RecordError
from commitlog.tag_codes import java_string_hash
from protocol.codes import RequestCode, ResponseCode
from protocol.route_data import MASTER_ID
from protocol.subscription import SUBSCRIBE_ALL, expression_tags

#: PullSysFlag bits
PULL_FLAG_COMMIT_OFFSET: Final = 0x1
PULL_FLAG_SUSPEND: Final = 0x2
PULL_FLAG_SUBSCRIPTION: Final = 0x4
_PULL_STATUS: Final[dict[int, PullStatus]] = {
    ResponseCode.SUCCESS: PullStatus.FOUND,
    ResponseCode.PULL_NOT_FOUND: PullStatus.NO_NEW_MSG,
    ResponseCode.PULL_RETRY_IMMEDIATELY: PullStatus.NO_MATCHED_MSG,
    ResponseCode.PULL_OFFSET_MOVED: PullStatus.OFFSET_ILLEGAL,
}
#: what a pull waits beyond the broker's suspend time before giving up on the answer
PULL_TIMEOUT_MARGIN_SECONDS: Final = 5.0


@dataclass(frozen=True, slots=True)
class Subscription:
    """A topic and a tag expression (``"*"`` or ``"TagA || TagB"``), as Java's ``SubscriptionData``."""

    topic: str
    expression: str
    tags: frozenset[str]
    sub_version: int

    @property
    def codes(self) -> list[int]:
        return sorted(java_string_hash(tag) for tag in self.tags)

    def matches(self, message: MessageExt) -> bool:
        """Client-side filter after the broker's hash filter (hash codes can collide)."""
        return not self.tags or (message.tags is not None and message.tags in self.tags)

    def to_json_object(self) -> dict[str, object]:
        return {
            "classFilterMode": False,
            "topic": self.topic,
            "subString": self.expression,
            "tagsSet": sorted(self.tags),
            "codeSet": self.codes,
            "subVersion": self.sub_version,
            "expressionType": "TAG",
        }


def parse_subscription(topic: str, expression: str | None, sub_version: int) -> Subscription:
    """``FilterAPI.buildSubscriptionData``: blank or ``*`` subscribes to everything."""
    tags = expression_tags(expression)
    if not tags:
        return Subscription(topic, SUBSCRIBE_ALL, frozenset(), sub_version)
    return Subscription(topic, (expression or "").strip(), tags, sub_version)


async def pull_message(
    instance: ClientInstance,
    group: str,
    queue: MessageQueue,
    subscription: Subscription,
    offset: int,
    max_nums: int,
    *,
    commit_offset: int | None = None,
    suspend_seconds: float = 0.0,
    broker_id: int = MASTER_ID,
) -> PullResult:
    """PULL_MESSAGE; with ``suspend_seconds`` the broker holds the request until a message arrives
    (long polling). The messages returned are filtered by tag."""
    sys_flag = PULL_FLAG_SUBSCRIPTION
    if commit_offset is not None and commit_offset >= 0:
        sys_flag |= PULL_FLAG_COMMIT_OFFSET
    if suspend_seconds > 0:
        sys_flag |= PULL_FLAG_SUSPEND
    fields = {
        "consumerGroup": group,
        "topic": queue.topic,
        "queueId": str(queue.queue_id),
        "queueOffset": str(offset),
        "maxMsgNums": str(max_nums),
        "sysFlag": str(sys_flag),
        "commitOffset": str(commit_offset if commit_offset is not None and commit_offset >= 0 else 0),
        "suspendTimeoutMillis": str(int(suspend_seconds * 1000)),
        "subscription": subscription.expression,
        "subVersion": str(subscription.sub_version),
        "expressionType": "TAG",
    }
    timeout = instance.config.request_timeout_seconds + (
        suspend_seconds + PULL_TIMEOUT_MARGIN_SECONDS if suspend_seconds > 0 else 0.0
    )
    response, address = await instance.invoke_any(
        queue.broker_name, RequestCode.PULL_MESSAGE, fields, preferred_id=broker_id, timeout_seconds=timeout
    )
    status = _PULL_STATUS.get(response.code)
    if status is None:
        raise broker_error(response.code, response.remark, address, dict(response.ext_fields))
    messages: tuple[MessageExt, ...] = ()
    if status is PullStatus.FOUND:
        try:
            decoded = decode_messages(response.body, queue.broker_name)
        except RecordError as error:
            raise MQBrokerError(ResponseCode.SYSTEM_ERROR, f"bad PULL answer: {error}", address) from None
        messages = tuple(message for message in decoded if subscription.matches(message))
    suggested = response.ext_fields.get("suggestWhichBrokerId", "0")
    return PullResult(
        status=status,
        next_begin_offset=int_field(response, "nextBeginOffset", address),
        min_offset=int_field(response, "minOffset", address),
        max_offset=int_field(response, "maxOffset", address),
        messages=messages,
        suggest_which_broker_id=int(suggested) if suggested.isdigit() else MASTER_ID,
    )


async def query_consumer_offset(instance: ClientInstance, group: str, queue: MessageQueue) -> int | None:
    """The group's committed offset of ``queue``; None when the broker has none (QUERY_NOT_FOUND)."""
    fields = {"consumerGroup": group, "topic": queue.topic, "queueId": str(queue.queue_id)}
    response, address = await instance.invoke_any(queue.broker_name, RequestCode.QUERY_CONSUMER_OFFSET, fields)
    if response.code == ResponseCode.QUERY_NOT_FOUND:
        return None
    check_response(response, address)
    return int_field(response, "offset", address)


async def update_consumer_offset(
    instance: ClientInstance, group: str, queue: MessageQueue, offset: int, *, deadline: float
) -> None:
    """UPDATE_CONSUMER_OFFSET on the leader (answered once replicated)."""
    fields = {
        "consumerGroup": group,
        "topic": queue.topic,
        "queueId": str(queue.queue_id),
        "commitOffset": str(offset),
    }
    response, address = await instance.invoke_leader(
        queue.broker_name, RequestCode.UPDATE_CONSUMER_OFFSET, fields, deadline=deadline
    )
    check_response(response, address)


async def queue_offset(instance: ClientInstance, code: int, queue: MessageQueue, **extra: str) -> int:
    """GET_MAX_OFFSET / GET_MIN_OFFSET / SEARCH_OFFSET_BY_TIMESTAMP (``timestamp=...``)."""
    fields = {"topic": queue.topic, "queueId": str(queue.queue_id), **extra}
    response, address = await instance.invoke_any(queue.broker_name, code, fields)
    check_response(response, address)
    return int_field(response, "offset", address)


async def consumer_ids(instance: ClientInstance, group: str, broker_names: Iterable[str]) -> list[str] | None:
    """GET_CONSUMER_LIST_BY_GROUP from the first broker group that answers; None if none did
    (an empty group is answered SYSTEM_ERROR by brokers: that is an empty list)."""
    for name in broker_names:
        try:
            response, _ = await instance.invoke_any(
                name, RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": group}
            )
        except MQClientError:
            continue
        if response.code != ResponseCode.SUCCESS:
            return []
        try:
            ids = json.loads(response.body).get("consumerIdList") or []
        except (ValueError, AttributeError):
            continue
        return sorted(str(each) for each in ids)
    return None


def _lock_body(group: str, client_id: str, queues: Iterable[MessageQueue]) -> bytes:
    return json.dumps(
        {"consumerGroup": group, "clientId": client_id, "mqSet": [queue.to_json_object() for queue in queues]},
        separators=(",", ":"),
    ).encode("utf-8")


async def lock_queues(
    instance: ClientInstance, group: str, broker_name: str, queues: Iterable[MessageQueue], *, deadline: float
) -> set[MessageQueue]:
    """LOCK_BATCH_MQ on the group's leader: the queues now held by this client."""
    body = _lock_body(group, instance.client_id, queues)
    response, address = await instance.invoke_leader(broker_name, RequestCode.LOCK_BATCH_MQ, {}, body, deadline=deadline)
    check_response(response, address)
    try:
        locked = json.loads(response.body).get("lockOKMQSet") or []
        return {MessageQueue.from_json_object(item) for item in locked}
    except (ValueError, AttributeError) as error:
        raise MQBrokerError(ResponseCode.SYSTEM_ERROR, f"bad LOCK_BATCH_MQ answer: {error}", address) from None


async def unlock_queues(
    instance: ClientInstance, group: str, broker_name: str, queues: Iterable[MessageQueue], *, deadline: float
) -> None:
    body = _lock_body(group, instance.client_id, queues)
    response, address = await instance.invoke_leader(
        broker_name, RequestCode.UNLOCK_BATCH_MQ, {}, body, deadline=deadline
    )
    check_response(response, address)


async def send_message_back(
    instance: ClientInstance,
    group: str,
    message: MessageExt,
    *,
    delay_level: int,
    max_reconsume_times: int,
    deadline: float,
) -> None:
    """CONSUMER_SEND_MSG_BACK: the broker re-delivers ``message`` through the group's retry topic
    after a delay (0: its default for the reconsume count), or to the dead-letter queue once
    ``max_reconsume_times`` is reached."""
    fields = {
        "offset": str(message.commit_log_offset),
        "group": group,
        "delayLevel": str(delay_level),
        "originMsgId": message.msg_id,
        "originTopic": message.topic,
        "unitMode": "false",
        "maxReconsumeTimes": str(max_reconsume_times),
    }
    response, address = await instance.invoke_leader(
        message.broker_name, RequestCode.CONSUMER_SEND_MSG_BACK, fields, deadline=deadline
    )
    check_response(response, address)
