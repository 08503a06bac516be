"""SEND_MESSAGE, SEND_MESSAGE_V2 and SEND_BATCH_MESSAGE: validate, build the stored messages, replicate,
answer from the leader's own apply result.

Everything is checked before anything is proposed (bad input leaves no trace): the header, the
topic name and permissions, the queue id, body and properties sizes, the batch encoding. Delay levels
are applied as RocketMQ's store does: the message is stored in SCHEDULE_TOPIC_XXXX (queue = level - 1)
with its real topic and queue in REAL_TOPIC / REAL_QID, and delivered later by the leader's delay service.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable
from typing import Final

from broker.context import BrokerContext
from broker.remoting.server import Finish, RequestContext
from broker.requests import RequestError, SendHeader
from broker.timers import TIMER_IMMEDIATE_MS, TIMER_PROPERTIES, due_time_ms
from commitlog.hosts import encode_host, encode_peer
from commitlog.message import MessageInput
from commitlog.outcomes import AppendResult, AppendStatus
from commitlog.sys_flags import TRANSACTION_PREPARED_TYPE, TRANSACTION_ROLLBACK_TYPE, TRANSACTION_TYPE_MASK
from dledger.command import TopicConfig
from dledger.group_commit import AppendError
from dledger.timers import schedule
from protocol.batch import BatchError, BatchMessage, decode_batch
from protocol.codec import encode_json_answer
from protocol.codes import RequestCode, ResponseCode, SerializeType
from protocol.command import RemotingCommand, make_response
from protocol.properties import (
    PROPERTIES_BYTES_MAX,
    PROPERTY_CLUSTER,
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_TRANSACTION_PREPARED,
    PROPERTY_UNIQ_KEY,
    encode_properties_text,
    parse_properties,
)
from protocol.route_data import PERM_WRITE
from protocol.topics import (
    DLQ_PREFIX,
    RETRY_PREFIX,
    SCHEDULE_TOPIC,
    SYSTEM_TOPICS,
    TRANS_HALF_TOPIC,
    dlq_topic,
)

SEND_CODES: Final = (RequestCode.SEND_MESSAGE, RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE)
_TIMER_KEYS: Final = tuple(sorted(TIMER_PROPERTIES))

#: protocol/_native.c's plain_properties, where it is built
_native_plain_properties: Callable[[str, str, str, str, tuple[str, ...], int], bytes | None] | None
try:
    from protocol._native import plain_properties as _native_plain_properties
except ImportError:  # not built (setup.py: optional): build_message makes every message
    _native_plain_properties = None


def _properties_bytes(properties: dict[str, str]) -> bytes:
    text = encode_properties_text(properties)
    # one separator of each kind per property, unless a key or a value holds one (counted in C: no Python
    # step per property on the send path)
    count = len(properties)
    if text.count("\x01") != count or text.count("\x02") != count:
        for key, value in properties.items():
            if "\x01" in key or "\x02" in key or "\x01" in value or "\x02" in value:
                raise RequestError(ResponseCode.MESSAGE_ILLEGAL, f"property {key[:40]!r} contains a separator")
    encoded = text.encode("utf-8", "surrogatepass")
    if len(encoded) > PROPERTIES_BYTES_MAX:
        raise RequestError(ResponseCode.MESSAGE_ILLEGAL,
                           f"the message properties length {len(encoded)} exceeds {PROPERTIES_BYTES_MAX} bytes")
    return encoded


def batch_messages(body: bytes) -> list[BatchMessage]:
    """The messages of a batch send's body (:func:`protocol.batch.decode_batch`); MESSAGE_ILLEGAL, with
    the decoder's text, for a malformed one."""
    try:
        return decode_batch(body)
    except BatchError as error:
        raise RequestError(ResponseCode.MESSAGE_ILLEGAL, str(error)) from None


class SendProcessor:
    """Sends through the route's queue (:meth:`__call__`) and, while nothing waits there, straight from the
    read callback (:meth:`fast`): both run the same checks in the same order and answer the same way."""

    def __init__(self, broker: BrokerContext) -> None:
        self.broker = broker
        #: sends of the queued way between their start and their hand-over to the group committer; while
        #: there are any, :meth:`fast` declines, so sends are proposed in the order they arrived
        self._queued_before_append = 0
        #: the last queued send's turn, done once it was handed over (or refused): the next one hands over
        #: after it. A queued send may wait (for its topic to be created through Raft) while a later one
        #: need not: the creation applies, and so the topic exists here, before the send that created it
        #: resumes, and a send taken up in between found the topic and was handed over first (one queue's
        #: messages stored out of the order they were sent)
        self._last_turn: asyncio.Future[None] | None = None

    async def __call__(self, context: RequestContext) -> RemotingCommand | None:
        request = context.request
        try:
            return await self.send(context)
        except RequestError as error:
            return make_response(request, error.code, error.remark, error.ext_fields)

    async def send(self, context: RequestContext) -> RemotingCommand:
        broker = self.broker
        request = context.request
        started = time.monotonic()
        stages = broker.member.stages
        if context.received:
            stages.record("remoting", started - context.received)
        self._queued_before_append += 1
        previous = self._last_turn
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._last_turn = turn
        try:
            header = SendHeader.parse(request.ext_fields, request.code == RequestCode.SEND_MESSAGE_V2)
            broker.require_leader()
            topic = header.topic
            if topic.startswith(DLQ_PREFIX):
                raise RequestError(ResponseCode.NO_PERMISSION,
                                   f"sending message to dead-letter topic {topic} is forbidden")
            config = await broker.topic_for_send(topic, header.default_topic_queue_nums)
            batch, queue_id, transaction_type = self._checked(request, header, config)
            if topic.startswith(RETRY_PREFIX) and not batch:
                topic, queue_id = await self._retry_or_dead_letter(header, topic, queue_id)
            messages = self._messages(context, header, topic, queue_id, batch, transaction_type)
            stages.record("prepare", time.monotonic() - started)
            if previous is not None and not previous.done():
                await previous  # the send before this one has not been handed over yet
            waiter = broker.append_started(messages)
        finally:
            self._queued_before_append -= 1
            if previous is not None and not previous.done():  # refused before its turn: the turn still waits
                previous.add_done_callback(functools.partial(_take_turn, turn))
            else:
                turn.set_result(None)
                if self._last_turn is turn:
                    self._last_turn = None
        results = await broker.appended(waiter)
        return self._response(request, results, queue_id, _transaction_id(header, transaction_type))

    def fast(self, context: RequestContext) -> RemotingCommand | Callable[[Finish], None] | None:
        """A send handed on without a coroutine (:data:`broker.remoting.server.FastPath`): on the leader,
        to a topic it has that is not a retry, dead-letter or system topic, while no queued send is still
        being prepared. Anything else is declined (None) and takes the queued way."""
        broker = self.broker
        if self._queued_before_append or not broker.member.is_leader:
            return None
        started = time.monotonic()
        request = context.request
        try:
            header = SendHeader.parse(request.ext_fields, request.code == RequestCode.SEND_MESSAGE_V2)
            topic = header.topic
            config = broker.state.topics.get(topic)
            if config is None or topic in SYSTEM_TOPICS or topic.startswith((RETRY_PREFIX, DLQ_PREFIX)):
                return None
            if not config.perm & PERM_WRITE:
                raise RequestError(ResponseCode.NO_PERMISSION, f"the topic[{topic}] sending message is forbidden")
            batch, queue_id, transaction_type = self._checked(request, header, config)
            messages = self._messages(context, header, topic, queue_id, batch, transaction_type)
        except RequestError as error:
            return make_response(request, error.code, error.remark, error.ext_fields)
        stages = broker.member.stages
        stages.record("remoting", started - context.received)
        stages.record("prepare", time.monotonic() - started)
        return functools.partial(self._append_then_answer, request, messages, queue_id,
                                 _transaction_id(header, transaction_type))

    def _append_then_answer(self, request: RemotingCommand, messages: list[MessageInput], queue_id: int,
                            transaction_id: str | None, finish: Finish) -> None:
        def answer(results: tuple[AppendResult, ...] | None, error: BaseException | None) -> None:
            try:
                if error is not None:
                    raise self.broker.append_failed(error) if isinstance(error, AppendError) else error
                assert results is not None
                finish(self._answer(request, results, queue_id, transaction_id))
            except RequestError as failed:
                finish(make_response(request, failed.code, failed.remark, failed.ext_fields))
            except Exception as failed:
                finish(failed)

        try:
            self.broker.append_then(messages, answer)
        except RequestError as error:
            finish(make_response(request, error.code, error.remark, error.ext_fields))

    def _checked(self, request: RemotingCommand, header: SendHeader, config: TopicConfig) -> tuple[bool, int, int]:
        """Whether it is a batch, the queue it goes to and its transaction type, after RocketMQ's checks."""
        topic = header.topic
        batch = header.batch or request.code == RequestCode.SEND_BATCH_MESSAGE
        queue_count = config.write_queue_nums
        if queue_count <= 0:
            raise RequestError(ResponseCode.NO_PERMISSION, f"topic[{topic}] has no write queue")
        queue_id = header.queue_id
        if queue_id < 0:
            queue_id = self.broker.random.randrange(queue_count)
        elif queue_id >= max(queue_count, config.read_queue_nums):
            raise RequestError(ResponseCode.SYSTEM_ERROR,
                               f"request queueId[{queue_id}] is illegal, topic:[{topic}] "
                               f"topicConfig.writeQueueNums:[{queue_count}]")
        transaction_type = header.sys_flag & TRANSACTION_TYPE_MASK
        if transaction_type not in (0, TRANSACTION_PREPARED_TYPE):
            raise RequestError(ResponseCode.MESSAGE_ILLEGAL,
                               "only a half message (PREPARED) may carry a transaction type; end it with END_TRANSACTION")
        if transaction_type == TRANSACTION_PREPARED_TYPE and batch:
            raise RequestError(ResponseCode.MESSAGE_ILLEGAL, "a batch cannot be transactional")
        return batch, queue_id, transaction_type

    def _messages(self, context: RequestContext, header: SendHeader, topic: str, queue_id: int, batch: bool,
                  transaction_type: int) -> list[MessageInput]:
        """The messages a send stores."""
        request = context.request
        born_host = _born_host(context.remote_address)
        sys_flag = header.sys_flag & ~0x30  # our hosts are IPv4, whatever the client's were
        reconsume_times = header.reconsume_times
        if batch:
            items = batch_messages(request.body)
            for item in items:
                if item.properties.get(PROPERTY_DELAY_TIME_LEVEL, "0") not in ("", "0") or any(
                        name in item.properties for name in TIMER_PROPERTIES):
                    raise RequestError(ResponseCode.MESSAGE_ILLEGAL,
                                       "a batch message cannot have a delay level or a delivery time")
            return [self.build_message(topic, queue_id, item.flag, sys_flag, header.born_timestamp, born_host,
                                       item.body, item.properties, reconsume_times) for item in items]
        if not transaction_type and _native_plain_properties is not None:
            # the common case in C: no delay level, no delivery time, properties that write back as they came
            encoded = _native_plain_properties(header.properties, PROPERTY_CLUSTER, self.broker.config.cluster_name,
                                               PROPERTY_DELAY_TIME_LEVEL, _TIMER_KEYS, PROPERTIES_BYTES_MAX)
            body = request.body
            if encoded is not None and len(body) <= self.broker.store.config.body_size_max_bytes:
                return [MessageInput(topic, queue_id, header.flag, sys_flag, header.born_timestamp, born_host, 0,
                                     reconsume_times, 0, body, encoded)]
        properties = parse_properties(header.properties)
        return [self.build_message(topic, queue_id, header.flag, sys_flag, header.born_timestamp, born_host,
                                   request.body, properties, reconsume_times, transaction_type,
                                   header.producer_group)]

    def build_message(self, topic: str, queue_id: int, flag: int, sys_flag: int, born_timestamp: int,
                      born_host: bytes, body: bytes, properties: dict[str, str], reconsume_times: int,
                      transaction_type: int = 0, producer_group: str = "") -> MessageInput:
        """One message to store, after RocketMQ's checks and its delay-level rewrite."""
        broker = self.broker
        if len(body) > broker.store.config.body_size_max_bytes:
            raise RequestError(ResponseCode.MESSAGE_ILLEGAL,
                               f"the message body size {len(body)} exceeds {broker.store.config.body_size_max_bytes}")
        due_ms = None
        if transaction_type != TRANSACTION_PREPARED_TYPE and not TIMER_PROPERTIES.isdisjoint(properties):
            now_ms = broker.wall_clock_ms()  # (the group's time: not read for sends that ask for no time)
            due_ms = due_time_ms(properties, now_ms)
            if due_ms is not None and due_ms - now_ms <= TIMER_IMMEDIATE_MS:
                due_ms = None  # due (or past): delivered now
        properties.setdefault(PROPERTY_CLUSTER, broker.config.cluster_name)
        if transaction_type == TRANSACTION_PREPARED_TYPE:
            # a half message: stored out of sight in the half queue (TransactionalMessageBridge.parseHalfMessageInner)
            properties[PROPERTY_REAL_TOPIC] = topic
            properties[PROPERTY_REAL_QUEUE_ID] = str(queue_id)
            properties.setdefault(PROPERTY_TRANSACTION_PREPARED, "true")
            properties.setdefault(PROPERTY_PRODUCER_GROUP, producer_group)
            return MessageInput(
                topic=TRANS_HALF_TOPIC, queue_id=0, flag=flag, sys_flag=sys_flag & ~TRANSACTION_TYPE_MASK,
                born_timestamp=born_timestamp, born_host=born_host, store_timestamp=0,
                reconsume_times=reconsume_times, prepared_transaction_offset=0, body=body,
                properties=_properties_bytes(properties),
            )
        if due_ms is not None:
            return schedule(MessageInput(
                topic=topic, queue_id=queue_id, flag=flag, sys_flag=sys_flag, born_timestamp=born_timestamp,
                born_host=born_host, store_timestamp=0, reconsume_times=reconsume_times,
                prepared_transaction_offset=0, body=body, properties=_properties_bytes(properties),
            ), due_ms)
        delay_text = properties.get(PROPERTY_DELAY_TIME_LEVEL)
        if delay_text and transaction_type not in (TRANSACTION_PREPARED_TYPE, TRANSACTION_ROLLBACK_TYPE):
            try:
                level = int(delay_text)
            except ValueError:
                raise RequestError(ResponseCode.MESSAGE_ILLEGAL, f"DELAY must be a level, got {delay_text[:20]!r}") from None
            if level > 0:
                level = min(level, len(broker.config.delay_levels_seconds))
                properties[PROPERTY_DELAY_TIME_LEVEL] = str(level)
                properties[PROPERTY_REAL_TOPIC] = topic
                properties[PROPERTY_REAL_QUEUE_ID] = str(queue_id)
                topic, queue_id = SCHEDULE_TOPIC, level - 1
        return MessageInput(
            topic=topic, queue_id=queue_id, flag=flag, sys_flag=sys_flag, born_timestamp=born_timestamp,
            born_host=born_host, store_timestamp=0, reconsume_times=reconsume_times, prepared_transaction_offset=0,
            body=body, properties=_properties_bytes(properties),
        )

    async def _retry_or_dead_letter(self, header: SendHeader, topic: str, queue_id: int) -> tuple[str, int]:
        """A send to a retry topic past the group's reconsume limit goes to the dead-letter queue
        (AbstractSendMessageProcessor.handleRetryAndDLQ)."""
        group = topic[len(RETRY_PREFIX):]
        limit = header.max_reconsume_times
        if limit is None:
            subscription = self.broker.state.groups.get(group)
            limit = subscription.retry_max_times if subscription else self.broker.config.max_reconsume_times
        if header.reconsume_times > limit:
            dead_letter = dlq_topic(group)
            await self.broker.ensure_topic(dead_letter, 1, PERM_WRITE)
            return dead_letter, 0
        return topic, queue_id

    @staticmethod
    def _response(request: RemotingCommand, results: tuple[AppendResult, ...], queue_id: int,
                  transaction_id: str | None = None) -> RemotingCommand:
        return make_response(request, ResponseCode.SUCCESS, None,
                             _response_fields(results, queue_id, transaction_id))

    @staticmethod
    def _answer(request: RemotingCommand, results: tuple[AppendResult, ...], queue_id: int,
                transaction_id: str | None) -> RemotingCommand | bytes:
        """:meth:`_response`, already framed when the request's header is JSON (as every client's is)."""
        fields = _response_fields(results, queue_id, transaction_id)
        if request.serialize_type == SerializeType.JSON:
            frame = encode_json_answer(request.opaque, ResponseCode.SUCCESS, fields)
            if frame is not None:
                return frame
        return make_response(request, ResponseCode.SUCCESS, None, fields)


def _response_fields(results: tuple[AppendResult, ...], queue_id: int, transaction_id: str | None) -> dict[str, str]:
    """A send's answer: SendMessageResponseHeader. MESSAGE_ILLEGAL when the store refused a message."""
    for result in results:
        if result.status is not AppendStatus.OK:
            raise RequestError(ResponseCode.MESSAGE_ILLEGAL, result.reason or "message rejected by the store")
    first = results[0]
    # one message but for a batch: its id as it is, no generator and join
    msg_id = first.msg_id if len(results) == 1 else ",".join([result.msg_id for result in results])
    fields = {"msgId": msg_id, "queueId": str(queue_id), "queueOffset": str(first.queue_offset)}
    if transaction_id:
        fields["transactionId"] = transaction_id
    return fields


def _take_turn(turn: asyncio.Future[None], _previous: asyncio.Future[None]) -> None:
    """A refused queued send's turn ends when the one before it ended."""
    turn.set_result(None)


def _transaction_id(header: SendHeader, transaction_type: int) -> str | None:
    """A half message's transaction id: its UNIQ_KEY (the producer checks it back by that)."""
    if transaction_type != TRANSACTION_PREPARED_TYPE:
        return None
    return parse_properties(header.properties).get(PROPERTY_UNIQ_KEY)


@functools.lru_cache(maxsize=4096)
def _born_host(remote_address: str) -> bytes:
    """The encoded born host of a connection's peer (cached: every send of a connection asks)."""
    host, _, port = remote_address.rpartition(":")
    try:
        return encode_peer(host, int(port))
    except ValueError:
        return encode_host("127.0.0.1", 0)
