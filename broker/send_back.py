"""CONSUMER_SEND_MSG_BACK: a message the consumer failed goes to the group's retry topic after a growing
delay, or to its dead-letter queue after the maximum reconsume times (SendMessageProcessor.consumerSendMsgBack).
"""

from __future__ import annotations

from typing import Final

from broker.context import BrokerContext
from broker.remoting.server import RequestContext
from broker.requests import INT32_MAX, RequestError, integer, text
from broker.send import SendProcessor
from commitlog.errors import StoreError
from protocol.codes import ResponseCode
from protocol.command import RemotingCommand, make_response
from protocol.properties import (
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_ORIGIN_MESSAGE_ID,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_RETRY_TOPIC,
)
from protocol.route_data import PERM_READ, PERM_WRITE
from protocol.topics import dlq_topic, retry_topic

#: the first delay level a retry uses when the consumer asks for none (RocketMQ: 3 + reconsume times)
RETRY_FIRST_LEVEL: Final = 3


class SendBackProcessor:
    def __init__(self, broker: BrokerContext, sender: SendProcessor) -> None:
        self.broker = broker
        self.sender = sender

    async def __call__(self, context: RequestContext) -> RemotingCommand | None:
        request = context.request
        try:
            return await self.send_back(request)
        except RequestError as error:
            return make_response(request, error.code, error.remark, error.ext_fields)

    async def send_back(self, request: RemotingCommand) -> RemotingCommand:
        broker = self.broker
        fields = request.ext_fields
        offset = integer(fields, "offset", None, 0)
        group = text(fields, "group")
        delay_level = integer(fields, "delayLevel", 0, -1, INT32_MAX)
        max_reconsume = fields.get("maxReconsumeTimes")
        broker.require_leader()
        try:
            original = broker.store.read_message(offset)
        except (StoreError, ValueError) as exc:
            raise RequestError(ResponseCode.SYSTEM_ERROR, f"look message by offset failed, {offset}: {exc}") from None
        origin_topic = fields.get("originTopic")
        if origin_topic and origin_topic not in (original.topic, original.property_map.get(PROPERTY_RETRY_TOPIC)):
            # only a message of the topic the consumer names (or its retry copy) may be sent back: with ACL
            # on, this keeps a consumer from copying another topic's message into its own retry topic
            raise RequestError(ResponseCode.SYSTEM_ERROR,
                               f"the message at offset {offset} is not a message of topic {origin_topic}")
        subscription = broker.state.groups.get(group)
        limit = (integer(fields, "maxReconsumeTimes", 16, -1, INT32_MAX) if max_reconsume
                 else subscription.retry_max_times if subscription else broker.config.max_reconsume_times)
        properties = original.property_map
        properties.setdefault(PROPERTY_RETRY_TOPIC, original.topic)
        properties.setdefault(PROPERTY_ORIGIN_MESSAGE_ID, fields.get("originMsgId") or original.msg_id)
        properties.pop(PROPERTY_DELAY_TIME_LEVEL, None)
        properties.pop(PROPERTY_REAL_TOPIC, None)
        properties.pop(PROPERTY_REAL_QUEUE_ID, None)
        if original.reconsume_times >= limit or delay_level < 0:
            topic = dlq_topic(group)
            await broker.ensure_topic(topic, 1, PERM_WRITE)
        else:
            topic = retry_topic(group)
            await broker.ensure_topic(topic, 1, PERM_READ | PERM_WRITE)
            properties[PROPERTY_DELAY_TIME_LEVEL] = str(delay_level or RETRY_FIRST_LEVEL + original.reconsume_times)
        message = self.sender.build_message(topic, 0, original.flag, original.sys_flag & ~0x30,
                                            original.born_timestamp, original.born_host, original.body, properties,
                                            original.reconsume_times + 1)
        await broker.append([message])
        return make_response(request, ResponseCode.SUCCESS)

