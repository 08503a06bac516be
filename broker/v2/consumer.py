"""The 5.x consumption RPCs (pop through Raft, ``broker.pop``): QueryAssignment, ReceiveMessage, AckMessage,
ChangeInvisibleDuration, ForwardMessageToDeadLetterQueue. Typed requests in, typed responses out; nothing
here knows gRPC (``broker.v2.server`` is the shell).

The mapping is the proxy's (``proxy/grpc/v2/consumer``, ``route/RouteActivity.queryAssignment``):

- QueryAssignment names one queue of this broker with id -1: a receive on it pops from every readable queue.
  A receive naming a queue (a SimpleConsumer takes the route's queues in turn) pops from every readable queue
  too, starting with that one: the proxy keeps only the broker's name of it.
- ReceiveMessage answers a stream: a status, then each message, then the delivery timestamp; with nothing to
  deliver within the long-polling time, only MESSAGE_NOT_FOUND. Tag filters as the 4.x pull path
  (:func:`tag_filter`); SQL92 filters answer NOT_IMPLEMENTED. ``auto_renew`` (push consumers) gets
  :data:`DEFAULT_INVISIBLE_MS` (the proxy's default invisible time), renewed by the leader until
  acknowledged (``broker.pop``).
- A receipt handle names the Raft index that issued it (``dledger.pop.encode_handle``): after a failover,
  the new leader honours it exactly when its replicated state still holds it, and answers
  INVALID_RECEIPT_HANDLE otherwise.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import zlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Final

from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from broker.pop import PoppedMessage, PopService
from broker.requests import RequestError
from broker.v2.auth import Access, Authenticator
from broker.v2.messages import (
    PROPERTY_SHARDING_KEY,
    PROPERTY_TRACE_CONTEXT,
    RESERVED_PROPERTIES,
    has_control_character,
    topic_name,
)
from broker.v2.protocol.definition_pb2 import (
    Assignment,
    Broker,
    Code,
    Digest,
    DigestType,
    Encoding,
    FilterExpression,
    FilterType,
    Message,
    MessageQueue,
    MessageType,
    Permission,
    Resource,
    Status,
)
from broker.v2.protocol.service_pb2 import (
    AckMessageRequest,
    AckMessageResponse,
    AckMessageResultEntry,
    ChangeInvisibleDurationRequest,
    ChangeInvisibleDurationResponse,
    ForwardMessageToDeadLetterQueueRequest,
    ForwardMessageToDeadLetterQueueResponse,
    QueryAssignmentRequest,
    QueryAssignmentResponse,
    ReceiveMessageRequest,
    ReceiveMessageResponse,
)
from broker.v2.status import StatusError, ok
from commitlog.hosts import format_address
from commitlog.record_codec import StoredMessage
from commitlog.sys_flags import SYSFLAG_COMPRESSED
from commitlog.tag_codes import java_string_hash
from dledger.pop import POP_RECEIVE_BATCH_MAX, decode_handle, encode_handle
from protocol.properties import (
    PROPERTY_KEYS,
    PROPERTY_TAGS,
    PROPERTY_TIMER_DELIVER_MS,
    PROPERTY_TRANSACTION_PREPARED,
    PROPERTY_UNIQ_KEY,
)
from protocol.route_data import PERM_READ
from protocol.subscription import expression_tags

#: the invisible time of a receive that names none (auto-renewing push consumers): the proxy's default
DEFAULT_INVISIBLE_MS: Final = 60_000
INVISIBLE_MS_MIN: Final = 1_000
INVISIBLE_MS_MAX: Final = 12 * 3_600_000
#: consumer group names: RocketMQ's limit
GROUP_NAME_CHARS_MAX: Final = 255
#: entries one AckMessage may carry
ACK_ENTRIES_MAX: Final = POP_RECEIVE_BATCH_MAX * 4
#: a receive answers this long before the client's own deadline, so the answer reaches it in time
DEADLINE_MARGIN_SECONDS: Final = 0.5
#: a body this large is not inflated for a 5.x consumer (it gets the stored bytes, marked GZIP if gzip)
INFLATED_BYTES_MAX: Final = 64 << 20


def group_name(resource: Resource) -> str:
    name = resource.name
    if resource.resource_namespace:
        name = f"{resource.resource_namespace}%{name}"
    if not name or len(name) > GROUP_NAME_CHARS_MAX or any(not (char.isalnum() or char in "%|-_") for char in name):
        raise StatusError(Code.ILLEGAL_CONSUMER_GROUP, f"illegal consumer group {name[:60]!r}")
    return name


@dataclass(frozen=True, slots=True)
class TagFilter:
    """The tags a filter expression such as ``"TagA || TagB"`` selects; ``tags`` None selects every message."""

    tags: frozenset[str] | None

    @property
    def codes(self) -> frozenset[int] | None:
        """The tags' hash codes, as the consume queue holds them (``broker.pull.tag_codes``)."""
        return None if self.tags is None else frozenset(java_string_hash(tag) for tag in self.tags)

    def accepts(self, tag: str | None) -> bool:
        """Whether a message with this tag is selected: the exact check after the consume queue's hash match
        (two tags can share a hash code), as RocketMQ's clients check again."""
        return self.tags is None or (tag is not None and tag in self.tags)


def tag_filter(expression: FilterExpression) -> TagFilter:
    """The filter of a receive or pull. TAG (or no type) as the 4.x path reads it (``broker.pull.tag_codes``);
    SQL92 is answered NOT_IMPLEMENTED: neither protocol's broker side evaluates SQL92 here (the 4.x pull
    answers SUBSCRIPTION_PARSE_FAILED for it); any other type is ILLEGAL_FILTER_EXPRESSION."""
    if expression.type == FilterType.SQL:
        raise StatusError(Code.NOT_IMPLEMENTED, "SQL92 filter expressions are not supported by this broker: "
                                                "filter by TAG")
    if expression.type not in (FilterType.TAG, FilterType.FILTER_TYPE_UNSPECIFIED):
        raise StatusError(Code.ILLEGAL_FILTER_EXPRESSION, f"unknown filter expression type {expression.type}")
    text = expression.expression.strip()
    if has_control_character(text):
        raise StatusError(Code.ILLEGAL_FILTER_EXPRESSION, "a filter expression cannot contain control characters")
    return TagFilter(expression_tags(text) or None)


def duration_ms(duration: Duration) -> int:
    return duration.seconds * 1000 + duration.nanos // 1_000_000


def _timestamp(milliseconds: int) -> Timestamp:
    return Timestamp(seconds=milliseconds // 1000, nanos=(milliseconds % 1000) * 1_000_000)


def _host_text(host: bytes) -> str:
    """``ip:port``, ``[ipv6]:port`` (compressed), or "" for bytes that are no host."""
    try:
        return format_address(host)
    except ValueError:
        return ""


def _body_and_encoding(stored: StoredMessage) -> tuple[bytes, int]:
    """The body a 5.x consumer gets: a compressed stored body (zlib from 4.x clients, gzip from 5.x ones)
    inflated, as the proxy hands bodies out (the broker decompresses them for it)."""
    if not stored.sys_flag & SYSFLAG_COMPRESSED:
        return stored.body, Encoding.IDENTITY
    inflater = zlib.decompressobj(wbits=47)  # zlib or gzip, by its header
    try:
        body = inflater.decompress(stored.body, INFLATED_BYTES_MAX)
    except zlib.error:
        return stored.body, Encoding.IDENTITY
    if inflater.unconsumed_tail:
        return stored.body, Encoding.GZIP if stored.body[:2] == b"\x1f\x8b" else Encoding.IDENTITY
    return body, Encoding.IDENTITY


def v2_message(popped: PoppedMessage, topic: Resource, invisible_ms: int) -> Message:
    """A popped message as a 5.x consumer receives it (the proxy's ``GrpcConverter.buildMessage``)."""
    message = v2_stored_message(popped.message, topic)
    system = message.system_properties
    system.receipt_handle = encode_handle(popped.message.queue_id, popped.queue_offset, popped.handle_id)
    system.queue_offset = popped.queue_offset
    system.invisible_duration.CopyFrom(Duration(seconds=invisible_ms // 1000, nanos=(invisible_ms % 1000) * 1_000_000))
    system.delivery_attempt = popped.attempt
    return message


def v2_stored_message(stored: StoredMessage, topic: Resource) -> Message:
    """A stored message as the 5.x protocol carries it, without what a receive adds (receipt handle,
    invisibility, attempt): its body (inflated), user properties, tag, keys, message id and type, hosts
    and times, queue id and offset."""
    properties = stored.property_map
    body, encoding = _body_and_encoding(stored)
    message = Message(body=body)
    message.topic.CopyFrom(topic)
    for key, value in properties.items():
        if key not in RESERVED_PROPERTIES:
            message.user_properties[key] = value
    system = message.system_properties
    if properties.get(PROPERTY_TAGS):
        system.tag = properties[PROPERTY_TAGS]
    system.keys.extend(key for key in properties.get(PROPERTY_KEYS, "").split(" ") if key)
    system.message_id = properties.get(PROPERTY_UNIQ_KEY) or stored.msg_id
    # MD5 in upper-case hex, as the proxy sends it: the one digest every SDK checks alike (their CRC32 texts
    # differ: the Node.js SDK compares decimal, the Python SDK zero-padded hex, and discards a mismatch)
    system.body_digest.CopyFrom(Digest(type=DigestType.MD5, checksum=hashlib.md5(body).hexdigest().upper()))
    system.body_encoding = encoding  # type: ignore[assignment]
    group = properties.get(PROPERTY_SHARDING_KEY)
    deliver_text = properties.get(PROPERTY_TIMER_DELIVER_MS, "")
    if properties.get(PROPERTY_TRANSACTION_PREPARED) == "true":
        system.message_type = MessageType.TRANSACTION
    elif group:
        system.message_type = MessageType.FIFO
        system.message_group = group
    elif deliver_text.isdigit():
        system.message_type = MessageType.DELAY
        system.delivery_timestamp.CopyFrom(_timestamp(int(deliver_text)))
    else:
        system.message_type = MessageType.NORMAL
    system.born_timestamp.CopyFrom(_timestamp(stored.born_timestamp))
    system.born_host = _host_text(stored.born_host)
    system.store_timestamp.CopyFrom(_timestamp(stored.store_timestamp))
    system.store_host = _host_text(stored.store_host)
    system.queue_id = stored.queue_id
    system.queue_offset = stored.queue_offset
    if properties.get(PROPERTY_TRACE_CONTEXT):
        system.trace_context = properties[PROPERTY_TRACE_CONTEXT]
    return message


def _status(code: Code, message: str) -> Status:
    return Status(code=code, message=message)


class ConsumerService:
    def __init__(self, pops: PopService, authenticator: Authenticator, rng: random.Random | None = None) -> None:
        self.pops = pops
        self.broker = pops.broker
        self.authenticator = authenticator
        self.random = rng if rng is not None else random.Random()

    def _readable_queues(self, topic: str) -> int:
        config = self.broker.topic_config(topic)
        if config is None or config.deleted:
            raise StatusError(Code.TOPIC_NOT_FOUND, f"topic {topic} does not exist")
        if not config.perm & PERM_READ:
            raise StatusError(Code.FORBIDDEN, f"the topic {topic} cannot be read")
        return config.read_queue_nums

    # ---------------------------------------------------------------------------------- QueryAssignment

    async def query_assignment(self, request: QueryAssignmentRequest, metadata: dict[str, str], peer_host: str,
                               broker: Broker) -> QueryAssignmentResponse:
        try:
            topic, group = topic_name(request.topic), group_name(request.group)
            self.authenticator.check(metadata, peer_host, Access(subscribe_topics=(topic,), group=group),
                                     "QueryAssignment")
            if self._readable_queues(topic) <= 0:
                return QueryAssignmentResponse(status=ok())
            queue = MessageQueue(id=-1, permission=Permission.READ_WRITE, broker=broker)
            queue.topic.CopyFrom(request.topic)
        except StatusError as error:
            return QueryAssignmentResponse(status=error.status())
        return QueryAssignmentResponse(status=ok(), assignments=[Assignment(message_queue=queue)])

    # ---------------------------------------------------------------------------------- ReceiveMessage

    async def receive(self, request: ReceiveMessageRequest, metadata: dict[str, str], peer_host: str,
                      remaining_seconds: float | None) -> AsyncIterator[ReceiveMessageResponse]:
        """The response stream of one ReceiveMessage. ``remaining_seconds``: the client's deadline, if any."""
        loop_time = asyncio.get_running_loop().time
        try:
            topic, group = topic_name(request.message_queue.topic), group_name(request.group)
            self.authenticator.check(metadata, peer_host, Access(subscribe_topics=(topic,), group=group),
                                     "ReceiveMessage")
            selector = tag_filter(request.filter_expression)
            if request.batch_size <= 0:
                raise StatusError(Code.BAD_REQUEST, f"batch size {request.batch_size} is not positive")
            if request.auto_renew or not request.HasField("invisible_duration"):
                invisible_ms = DEFAULT_INVISIBLE_MS
            else:
                invisible_ms = duration_ms(request.invisible_duration)
                if not INVISIBLE_MS_MIN <= invisible_ms <= INVISIBLE_MS_MAX:
                    raise StatusError(Code.ILLEGAL_INVISIBLE_TIME,
                                      f"invisible duration {invisible_ms} ms is outside "
                                      f"[{INVISIBLE_MS_MIN}, {INVISIBLE_MS_MAX}]")
            polling_ms = duration_ms(request.long_polling_timeout) if request.HasField("long_polling_timeout") else 0
            polling_seconds = min(max(0, polling_ms), self.broker.config.long_polling_max_ms) / 1000
            if remaining_seconds is not None:
                polling_seconds = min(polling_seconds, max(0.0, remaining_seconds - DEADLINE_MARGIN_SECONDS))
            queue_nums = self._readable_queues(topic)
            queue_id = request.message_queue.id
            if queue_id >= queue_nums:
                raise StatusError(Code.BAD_REQUEST, f"topic {topic} has no readable queue {queue_id}")
            deadline = loop_time() + polling_seconds
            # as the proxy pops: from every queue of this broker group (its ReceiveMessageQueueSelector keeps only
            # the broker's name), starting with the queue the client named. The SDKs name the queues in turn;
            # receiving from that one only left a consumer long-polling an empty queue while others held messages.
            start = queue_id if queue_id >= 0 else (self.random.randrange(queue_nums) if queue_nums else 0)
            with self.pops.long_poll():
                while True:
                    queues = [(start + step) % queue_nums for step in range(queue_nums)]
                    for each in queues:
                        popped = await self.pops.receive(group, topic, each, request.batch_size, invisible_ms,
                                                         selector.codes, request.auto_renew, selector.tags)
                        if popped:
                            yield ReceiveMessageResponse(status=ok())
                            for item in popped:
                                yield ReceiveMessageResponse(message=v2_message(item, request.message_queue.topic,
                                                                                 invisible_ms))
                            yield ReceiveMessageResponse(delivery_timestamp=_timestamp(self.pops.wall_clock_ms()))
                            return
                    remaining = deadline - loop_time()
                    if remaining <= 0:
                        break
                    await self.pops.wait_applied(remaining)
            yield ReceiveMessageResponse(status=_status(Code.MESSAGE_NOT_FOUND, "no new message"))
        except StatusError as error:
            yield ReceiveMessageResponse(status=error.status())
        except RequestError as error:
            yield ReceiveMessageResponse(status=StatusError.of(error).status())

    # ---------------------------------------------------------------------------------- AckMessage

    async def ack(self, request: AckMessageRequest, metadata: dict[str, str], peer_host: str) -> AckMessageResponse:
        try:
            topic, group = topic_name(request.topic), group_name(request.group)
            self.authenticator.check(metadata, peer_host, Access(subscribe_topics=(topic,), group=group),
                                     "AckMessage")
            if not request.entries or len(request.entries) > ACK_ENTRIES_MAX:
                raise StatusError(Code.BAD_REQUEST, f"an ack carries 1 to {ACK_ENTRIES_MAX} entries")
            handles = [decode_handle(entry.receipt_handle) for entry in request.entries]
            valid = [(queue_id, offset, handle_id) for queue_id, offset, handle_id in
                     (handle for handle in handles if handle is not None)]
            outcomes = iter(await self.pops.ack_many(group, topic, valid) if valid else [])
        except StatusError as error:
            return AckMessageResponse(status=error.status())
        except RequestError as error:
            return AckMessageResponse(status=StatusError.of(error).status())
        results = []
        for entry, handle in zip(request.entries, handles, strict=True):
            if handle is None:
                status = _status(Code.INVALID_RECEIPT_HANDLE, "malformed receipt handle")
            else:
                outcome = next(outcomes)
                status = ok() if outcome.reason is None else _status(Code.INVALID_RECEIPT_HANDLE, outcome.reason)
            results.append(AckMessageResultEntry(message_id=entry.message_id, receipt_handle=entry.receipt_handle,
                                                 status=status))
        codes = {result.status.code for result in results}
        if codes == {Code.OK}:
            overall = ok()
        elif len(codes) == 1:
            overall = results[0].status
        else:
            overall = _status(Code.MULTIPLE_RESULTS, "some entries were not acknowledged")
        return AckMessageResponse(status=overall, entries=results)

    # ---------------------------------------------------------------------------------- ChangeInvisibleDuration

    async def change_invisible(self, request: ChangeInvisibleDurationRequest, metadata: dict[str, str],
                               peer_host: str) -> ChangeInvisibleDurationResponse:
        try:
            topic, group = topic_name(request.topic), group_name(request.group)
            self.authenticator.check(metadata, peer_host, Access(subscribe_topics=(topic,), group=group),
                                     "ChangeInvisibleDuration")
            invisible_ms = duration_ms(request.invisible_duration)
            if not 0 <= invisible_ms <= INVISIBLE_MS_MAX:
                raise StatusError(Code.ILLEGAL_INVISIBLE_TIME, f"invisible duration {invisible_ms} ms is out of range")
            handle = decode_handle(request.receipt_handle)
            if handle is None:
                raise StatusError(Code.INVALID_RECEIPT_HANDLE, "malformed receipt handle")
            queue_id, offset, handle_id = handle
            outcome = await self.pops.change_invisible(group, topic, queue_id, offset, handle_id, invisible_ms)
            if outcome.reason is not None:
                raise StatusError(Code.INVALID_RECEIPT_HANDLE, outcome.reason)
        except StatusError as error:
            return ChangeInvisibleDurationResponse(status=error.status())
        except RequestError as error:
            return ChangeInvisibleDurationResponse(status=StatusError.of(error).status())
        return ChangeInvisibleDurationResponse(status=ok(),
                                               receipt_handle=encode_handle(queue_id, offset, outcome.handle_id))

    # ---------------------------------------------------------------------------------- dead letters

    async def forward_to_dead_letter(self, request: ForwardMessageToDeadLetterQueueRequest, metadata: dict[str, str],
                                     peer_host: str) -> ForwardMessageToDeadLetterQueueResponse:
        try:
            topic, group = topic_name(request.topic), group_name(request.group)
            self.authenticator.check(metadata, peer_host, Access(subscribe_topics=(topic,), group=group),
                                     "ForwardMessageToDeadLetterQueue")
            handle = decode_handle(request.receipt_handle)
            if handle is None:
                raise StatusError(Code.INVALID_RECEIPT_HANDLE, "malformed receipt handle")
            queue_id, offset, handle_id = handle
            outcome = await self.pops.forward_to_dead_letter(group, topic, queue_id, offset, handle_id)
            if outcome.reason is not None:
                raise StatusError(Code.INVALID_RECEIPT_HANDLE, outcome.reason)
        except StatusError as error:
            return ForwardMessageToDeadLetterQueueResponse(status=error.status())
        except RequestError as error:
            return ForwardMessageToDeadLetterQueueResponse(status=StatusError.of(error).status())
        return ForwardMessageToDeadLetterQueueResponse(status=ok())

