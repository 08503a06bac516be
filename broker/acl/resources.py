"""What a request needs: the resources it touches and the permission on each
(``PlainAccessResource.parse`` of RocketMQ 4.9.x, plus the codes raftmq serves that Java leaves out).

Topic and group names are read from the request exactly as the processors read them (SEND accepts the
one-letter names of SEND_MESSAGE_V2 whenever ``a`` and ``b`` are present, as ``SendHeader.parse`` does),
so a request cannot be checked against one topic and processed against another.

======================================  =====================================================
request                                 needs
======================================  =====================================================
SEND_MESSAGE, _V2, SEND_BATCH_MESSAGE   PUB on the topic (a retry topic: SUB on its group)
PULL_MESSAGE, LITE_PULL_MESSAGE         SUB on the topic and on the consumer group
QUERY_MESSAGE                           SUB on the topic
HEART_BEAT                              SUB on each consumer group and each subscribed topic
UNREGISTER_CLIENT                       SUB on the consumer group (if any)
GET_CONSUMER_LIST_BY_GROUP              SUB on the consumer group
GET_CONSUMER_RUNNING_INFO               SUB on the consumer group
GET_CONSUMER_CONNECTION_LIST            SUB on the consumer group
GET_CONSUME_STATS                       SUB on the consumer group (and the topic, if named)
GET_TOPIC_STATS_INFO                    SUB on the topic
QUERY/UPDATE_CONSUMER_OFFSET            SUB on the consumer group and the topic
LOCK_BATCH_MQ, UNLOCK_BATCH_MQ          SUB on the consumer group and each queue's topic
CONSUMER_SEND_MSG_BACK                  SUB on the group, PUB on ``originTopic``
INVOKE_BROKER_TO_RESET_OFFSET           SUB on the group and the topic (Java checks nothing)
admin codes (permissions.ADMIN_CODES)   an admin account
anything else                           a valid signature of a known account
======================================  =====================================================

Java also checks QUERY_CONSUMER_OFFSET, SEND_BATCH_MESSAGE, LITE_PULL_MESSAGE and the lock codes less
(or not at all); raftmq checks them because each one reads or moves a group's position in a topic.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Final

from broker.acl.permissions import PUB, SUB, group_resource, is_group_resource
from broker.requests import RequestError, SendHeader
from protocol.codes import RequestCode
from protocol.command import RemotingCommand


class UnreadableRequestError(ValueError):
    """A request whose resources cannot be read (a heartbeat body that is not JSON, ...)."""


_SEND_CODES: Final = frozenset({RequestCode.SEND_MESSAGE, RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE})
_PULL_CODES: Final = frozenset({RequestCode.PULL_MESSAGE, RequestCode.LITE_PULL_MESSAGE})
_OFFSET_CODES: Final = frozenset({RequestCode.QUERY_CONSUMER_OFFSET, RequestCode.UPDATE_CONSUMER_OFFSET})
_LOCK_CODES: Final = frozenset({RequestCode.LOCK_BATCH_MQ, RequestCode.UNLOCK_BATCH_MQ})


class _Needs:
    __slots__ = ("table",)

    def __init__(self) -> None:
        self.table: dict[str, int] = {}

    def add(self, resource: str | None, permission: int) -> None:
        # a missing name adds nothing (Java's addResourceAndPerm(null) is a no-op): the processor rejects
        # the request for the missing field
        if resource:
            self.table[resource] = self.table.get(resource, 0) | permission

    def group(self, group: str | None) -> None:
        if group:
            self.add(group_resource(group), SUB)


def _json_object(body: bytes, what: str) -> dict[str, object]:
    try:
        value = json.loads(body.decode("utf-8")) if body else {}
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise UnreadableRequestError(f"the {what} body is not JSON") from None
    if not isinstance(value, dict):
        raise UnreadableRequestError(f"the {what} body is not a JSON object")
    return value


def _send_topic(code: int, fields: Mapping[str, str]) -> str | None:
    """The topic as the send processor reads it: through ``SendHeader.parse`` itself. A header it
    refuses needs nothing here: the processor refuses it for the same reason and stores nothing."""
    try:
        return SendHeader.parse(fields, code == RequestCode.SEND_MESSAGE_V2).topic
    except RequestError:
        return None


def required_permissions(request: RemotingCommand) -> dict[str, int]:
    """Resource (topic, or ``%RETRY%<group>`` for a group) -> the permission bits the request needs.
    Raises :class:`UnreadableRequestError` when the body that names them cannot be read."""
    code = request.code
    fields = request.ext_fields
    needs = _Needs()
    if code in _SEND_CODES:
        topic = _send_topic(code, fields)
        if topic is not None and is_group_resource(topic):
            needs.add(topic, SUB)  # a consumer's send-back through SEND to %RETRY%<group>
        else:
            needs.add(topic, PUB)
    elif code in _PULL_CODES:
        needs.add(fields.get("topic"), SUB)
        needs.group(fields.get("consumerGroup"))
    elif code == RequestCode.QUERY_MESSAGE:
        needs.add(fields.get("topic"), SUB)
    elif code == RequestCode.HEART_BEAT:
        body = _json_object(request.body, "HEART_BEAT")
        consumers = body.get("consumerDataSet") or []
        if not isinstance(consumers, list):
            raise UnreadableRequestError("the HEART_BEAT consumerDataSet is not a list")
        for consumer in consumers:
            if not isinstance(consumer, dict):
                raise UnreadableRequestError("a HEART_BEAT consumerDataSet entry is not an object")
            group = consumer.get("groupName")
            needs.group(group if isinstance(group, str) else None)
            subscriptions = consumer.get("subscriptionDataSet") or []
            if not isinstance(subscriptions, list):
                raise UnreadableRequestError("a HEART_BEAT subscriptionDataSet is not a list")
            for subscription in subscriptions:
                topic = subscription.get("topic") if isinstance(subscription, dict) else None
                needs.add(topic if isinstance(topic, str) else None, SUB)
    elif code in (RequestCode.UNREGISTER_CLIENT, RequestCode.GET_CONSUMER_LIST_BY_GROUP,
                  RequestCode.GET_CONSUMER_RUNNING_INFO, RequestCode.GET_CONSUMER_CONNECTION_LIST):
        needs.group(fields.get("consumerGroup"))
    elif code == RequestCode.GET_CONSUME_STATS:
        needs.group(fields.get("consumerGroup"))
        needs.add(fields.get("topic"), SUB)
    elif code == RequestCode.GET_TOPIC_STATS_INFO:
        needs.add(fields.get("topic"), SUB)
    elif code in _OFFSET_CODES:
        needs.group(fields.get("consumerGroup"))
        needs.add(fields.get("topic"), SUB)
    elif code in _LOCK_CODES:
        body = _json_object(request.body, RequestCode(code).name)
        group = body.get("consumerGroup")
        needs.group(str(group) if group else None)
        queues = body.get("mqSet") or []
        if not isinstance(queues, list):
            raise UnreadableRequestError("mqSet is not a list")
        for queue in queues:
            topic = queue.get("topic") if isinstance(queue, dict) else None
            needs.add(topic if isinstance(topic, str) else None, SUB)
    elif code == RequestCode.CONSUMER_SEND_MSG_BACK:
        needs.group(fields.get("group"))
        needs.add(fields.get("originTopic"), PUB)
    elif code == RequestCode.INVOKE_BROKER_TO_RESET_OFFSET:  # moves a group's position, as an offset commit
        needs.group(fields.get("group"))
        needs.add(fields.get("topic"), SUB)
    return needs.table
