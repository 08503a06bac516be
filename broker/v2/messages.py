"""A 5.x message as the message a 4.x producer would have sent: checks and properties (pure, no I/O).

The rules are the RocketMQ proxy's (``SendMessageActivity.buildMessageProperty``, ``GrpcValidator``), so a
message a 5.x producer sends is stored as the proxy would have had the broker store it, and a 4.x consumer
reads the same body, TAGS, KEYS and UNIQ_KEY (the client's message id) as from a 4.x producer:

- user properties: at most :data:`USER_PROPERTIES_MAX`, none of RocketMQ's reserved names, no control
  characters; with tag and keys at most :data:`USER_PROPERTY_BYTES_MAX` bytes;
- ``TAGS`` (no ``|``, not blank), ``KEYS`` (joined by spaces), ``UNIQ_KEY`` = the client's message id;
- FIFO: ``__SHARDINGKEY`` = the message group, and the queue :func:`fifo_queue_id` picks;
- delay: ``TIMER_DELIVER_MS`` = the delivery time (the store's timers, ``broker.timers``). A delivery
  time whose ``seconds`` is past the largest valid Timestamp is read as milliseconds: the Python SDK 5.1.2
  copies its millisecond ``delivery_timestamp`` into ``seconds`` (its own example sends ``now_ms + 60_000``);
  the proxy refuses such a message as an invalid timestamp, we deliver it when the client meant;
- transaction: a half message (``TRAN_MSG``), ``CHECK_IMMUNITY_TIME_IN_SECONDS`` from the orphaned-transaction
  recovery duration; the send path stores it in the half queue;
- a GZIP body keeps its bytes and gets the compressed flag, as the proxy does.

What the proxy adds only because it is a separate hop (``__BORNHOST``, ``BORN_TIMESTAMP``: it is not the
producer) is not added: the stored born host and timestamp are the producer's own here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from broker.timers import TIMER_HORIZON_MS
from broker.v2.protocol.definition_pb2 import Code, Encoding, Message, MessageType, Resource
from broker.v2.status import StatusError
from commitlog.sys_flags import SYSFLAG_COMPRESSED, TRANSACTION_PREPARED_TYPE
from commitlog.tag_codes import java_string_hash
from protocol.properties import (
    PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS,
    PROPERTY_KEYS,
    PROPERTY_TAGS,
    PROPERTY_TIMER_DELIVER_MS,
    PROPERTY_TRANSACTION_PREPARED,
    PROPERTY_UNIQ_KEY,
)
from protocol.topics import DLQ_PREFIX, RETRY_PREFIX, SYSTEM_TOPICS, check_topic_name

#: the proxy's userPropertyMaxNum, maxUserPropertySize and maxMessageGroupSize
USER_PROPERTIES_MAX: Final = 128
USER_PROPERTY_BYTES_MAX: Final = 16 * 1024
MESSAGE_GROUP_BYTES_MAX: Final = 64
#: the largest ``seconds`` of a valid protobuf Timestamp (9999-12-31T23:59:59Z)
TIMESTAMP_SECONDS_MAX: Final = 253_402_300_799
#: a client's message id: the SDKs write 34 hex characters; bounded so one id cannot fill the properties
MESSAGE_ID_CHARS_MAX: Final = 128
#: messages one SendMessage may carry (sent as one atomic batch)
SEND_MESSAGES_MAX: Final = 1024
#: RocketMQ's ``MessageConst.STRING_HASH_SET``: names a producer may not set as user properties
RESERVED_PROPERTIES: Final = frozenset({
    "TRACE_ON", "MSG_REGION", "KEYS", "TAGS", "WAIT", "DELAY", "RETRY_TOPIC", "REAL_TOPIC", "REAL_QID",
    "TRAN_MSG", "PGROUP", "MIN_OFFSET", "MAX_OFFSET", "BUYER_ID", "ORIGIN_MESSAGE_ID", "TRANSFER_FLAG",
    "CORRECTION_FLAG", "MQ2_FLAG", "RECONSUME_TIME", "UNIQ_KEY", "MAX_RECONSUME_TIMES", "CONSUME_START_TIME",
    "POP_CK", "POP_CK_OFFSET", "1ST_POP_TIME", "TRAN_PREPARED_QUEUE_OFFSET", "DUP_INFO", "EXTEND_UNIQ_INFO",
    "INSTANCE_ID", "CORRELATION_ID", "REPLY_TO_CLIENT", "TTL", "ARRIVE_TIME", "PUSH_REPLY_TIME", "CLUSTER",
    "MSG_TYPE", "INNER_MULTI_QUEUE_OFFSET", "TIMER_DELAY_MS", "TIMER_DELAY_SEC", "TIMER_DELIVER_MS",
    "TIMER_ENQUEUE_MS", "TIMER_DEQUEUE_MS", "TIMER_ROLL_TIMES", "TIMER_OUT_MS", "TIMER_DEL_UNIQKEY",
    "TIMER_DELAY_LEVEL", "__BORNHOST", "BORN_TIMESTAMP", "DLQ_ORIGIN_TOPIC", "DLQ_ORIGIN_MESSAGE_ID", "__CRC32#",
    # raftmq reads these too (broker.timers, transactions)
    "__STARTDELIVERTIME", "CHECK_IMMUNITY_TIME_IN_SECONDS", "__SHARDINGKEY", "TRACE_CONTEXT",
})
PROPERTY_SHARDING_KEY: Final = "__SHARDINGKEY"
PROPERTY_TRACE_CONTEXT: Final = "TRACE_CONTEXT"
#: the message types the broker accepts on every topic (a topic has no type of its own here: 4.x producers
#: may send any kind of message to any topic, as to a MIXED topic of RocketMQ 5)
ACCEPTED_MESSAGE_TYPES: Final = (MessageType.NORMAL, MessageType.FIFO, MessageType.DELAY, MessageType.TRANSACTION)


@dataclass(frozen=True, slots=True)
class OutgoingMessage:
    """One message to store, before the send path's own rewrites (delay, half queue)."""

    topic: str
    body: bytes
    sys_flag: int
    properties: dict[str, str]
    born_timestamp_ms: int
    reconsume_times: int
    message_id: str
    message_group: str | None
    transactional: bool


def topic_name(resource: Resource) -> str:
    """The topic a resource names, with its namespace as the proxy wraps it (``namespace%topic``);
    ILLEGAL_TOPIC for a name that is not a valid, client-usable topic."""
    name = resource.name
    if resource.resource_namespace:
        name = f"{resource.resource_namespace}%{name}"
    problem = check_topic_name(name)
    if problem is not None:
        raise StatusError(Code.ILLEGAL_TOPIC, problem)
    if name in SYSTEM_TOPICS or name.startswith((RETRY_PREFIX, DLQ_PREFIX)):
        raise StatusError(Code.ILLEGAL_TOPIC, f"cannot access system topic {name}")
    return name


def has_control_character(text: str) -> bool:
    """Java's ``Character.isISOControl``: U+0000..U+001F and U+007F..U+009F."""
    return any(ord(char) < 0x20 or 0x7F <= ord(char) <= 0x9F for char in text)


def timestamp_ms(seconds: int, nanos: int) -> int:
    return seconds * 1000 + nanos // 1_000_000


def message_type_of(message: Message) -> MessageType:
    """The type the message's fields make it (checked against the type it declares)."""
    system = message.system_properties
    group = system.HasField("message_group")
    delivery = system.HasField("delivery_timestamp")
    declared = system.message_type
    if declared in (MessageType.LITE, MessageType.PRIORITY) or system.HasField("lite_topic") or system.HasField(
            "priority"):
        raise StatusError(Code.UNSUPPORTED, "lite topics and message priorities are not supported")
    if declared == MessageType.TRANSACTION:
        if group or delivery:
            raise StatusError(Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
                              "a transactional message cannot have a message group or a delivery time")
        return MessageType.TRANSACTION
    if group and delivery:
        raise StatusError(Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
                          "a message cannot have both a message group and a delivery time")
    derived = MessageType.FIFO if group else MessageType.DELAY if delivery else MessageType.NORMAL
    if declared not in (MessageType.MESSAGE_TYPE_UNSPECIFIED, derived):
        raise StatusError(Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
                          f"the message is declared {MessageType.Name(declared)} but its properties make it "
                          f"{MessageType.Name(derived)}")
    return derived


def outgoing_message(message: Message, body_size_max_bytes: int, now_ms: int) -> OutgoingMessage:
    """The message to store for one 5.x message; :class:`StatusError` for anything the proxy refuses."""
    topic = topic_name(message.topic)
    body = message.body
    if not body:
        raise StatusError(Code.MESSAGE_BODY_EMPTY, "message body cannot be empty")
    if len(body) > body_size_max_bytes:
        raise StatusError(Code.MESSAGE_BODY_TOO_LARGE,
                          f"message body of {len(body)} bytes exceeds the max {body_size_max_bytes}")
    message_type = message_type_of(message)
    system = message.system_properties
    properties = _user_properties(message)
    user_bytes = sum(len(key.encode()) + len(value.encode()) for key, value in properties.items())
    if system.HasField("tag"):
        tag = system.tag
        if tag:
            if not tag.strip():
                raise StatusError(Code.ILLEGAL_MESSAGE_TAG, "tag cannot be the char sequence of whitespace")
            if "|" in tag:
                raise StatusError(Code.ILLEGAL_MESSAGE_TAG, "tag cannot contain '|'")
            if has_control_character(tag):
                raise StatusError(Code.ILLEGAL_MESSAGE_TAG, "tag cannot contain control character")
            properties[PROPERTY_TAGS] = tag
            user_bytes += len(tag.encode())
    keys = list(system.keys)
    for key in keys:
        if key and not key.strip():
            raise StatusError(Code.ILLEGAL_MESSAGE_KEY, "key cannot be the char sequence of whitespace")
        if has_control_character(key):
            raise StatusError(Code.ILLEGAL_MESSAGE_KEY, "key cannot contain control character")
        user_bytes += len(key.encode())
    if user_bytes > USER_PROPERTY_BYTES_MAX:
        raise StatusError(Code.MESSAGE_PROPERTIES_TOO_LARGE,
                          f"the total size of user property is too large, max is {USER_PROPERTY_BYTES_MAX}")
    if keys:
        properties[PROPERTY_KEYS] = " ".join(keys)
    message_id = system.message_id
    if not message_id.strip():
        raise StatusError(Code.ILLEGAL_MESSAGE_ID, "message id cannot be empty")
    if len(message_id) > MESSAGE_ID_CHARS_MAX or has_control_character(message_id):
        raise StatusError(Code.ILLEGAL_MESSAGE_ID, f"message id must be at most {MESSAGE_ID_CHARS_MAX} characters "
                                                   "without control characters")
    properties[PROPERTY_UNIQ_KEY] = message_id
    sys_flag = SYSFLAG_COMPRESSED if system.body_encoding == Encoding.GZIP else 0
    transactional = message_type == MessageType.TRANSACTION
    if transactional:
        sys_flag |= TRANSACTION_PREPARED_TYPE
        properties[PROPERTY_TRANSACTION_PREPARED] = "true"
        if system.HasField("orphaned_transaction_recovery_duration"):
            properties[PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS] = str(max(0, system.orphaned_transaction_recovery_duration.seconds))
    if message_type == MessageType.DELAY:
        due = system.delivery_timestamp
        due_ms = due.seconds if due.seconds > TIMESTAMP_SECONDS_MAX else timestamp_ms(due.seconds, due.nanos)
        if due_ms - now_ms > TIMER_HORIZON_MS:
            raise StatusError(Code.ILLEGAL_DELIVERY_TIME,
                              f"the delivery time is more than {TIMER_HORIZON_MS // 86_400_000} days ahead")
        properties[PROPERTY_TIMER_DELIVER_MS] = str(max(0, due_ms))
    group: str | None = None
    if message_type == MessageType.FIFO:
        group = system.message_group
        if not group.strip():
            raise StatusError(Code.ILLEGAL_MESSAGE_GROUP, "message group cannot be empty or whitespace")
        if len(group.encode()) >= MESSAGE_GROUP_BYTES_MAX:
            raise StatusError(Code.ILLEGAL_MESSAGE_GROUP, f"message group exceed the max size {MESSAGE_GROUP_BYTES_MAX}")
        if has_control_character(group):
            raise StatusError(Code.ILLEGAL_MESSAGE_GROUP, "message group cannot contain control character")
        properties[PROPERTY_SHARDING_KEY] = group
    if system.HasField("trace_context") and system.trace_context:
        if has_control_character(system.trace_context):
            raise StatusError(Code.BAD_REQUEST, "trace context cannot contain control character")
        properties[PROPERTY_TRACE_CONTEXT] = system.trace_context
    born = system.born_timestamp
    born_ms = timestamp_ms(born.seconds, born.nanos) if system.HasField("born_timestamp") else 0
    return OutgoingMessage(
        topic=topic, body=body, sys_flag=sys_flag, properties=properties,
        born_timestamp_ms=born_ms if born_ms > 0 else now_ms,
        reconsume_times=max(0, system.delivery_attempt), message_id=message_id, message_group=group,
        transactional=transactional)


def _user_properties(message: Message) -> dict[str, str]:
    user = message.user_properties
    if len(user) > USER_PROPERTIES_MAX:
        raise StatusError(Code.MESSAGE_PROPERTIES_TOO_LARGE, f"too many user properties, max is {USER_PROPERTIES_MAX}")
    properties: dict[str, str] = {}
    for key in sorted(user):  # a map's order on the wire is not fixed: store the same bytes for the same message
        value = user[key]
        if key in RESERVED_PROPERTIES:
            raise StatusError(Code.ILLEGAL_MESSAGE_PROPERTY_KEY, f"property is used by system: {key}")
        if not key or has_control_character(key):
            raise StatusError(Code.ILLEGAL_MESSAGE_PROPERTY_KEY, "the key of property cannot be empty or contain "
                                                                "control character")
        if has_control_character(value):
            raise StatusError(Code.ILLEGAL_MESSAGE_PROPERTY_KEY, "the value of property cannot contain control character")
        properties[key] = value
    return properties


# ------------------------------------------------------------------------------------- queue selection


_LCG_MULTIPLIER: Final = 2862933555777941757
_MASK_64: Final = (1 << 64) - 1


def consistent_hash(value: int, buckets: int) -> int:
    """Guava's ``Hashing.consistentHash(long, int)`` (Lamping and Veach's jump hash with Guava's linear
    congruential generator), bit for bit: ``value`` is taken as a Java long."""
    if buckets <= 0:
        raise ValueError(f"buckets must be positive, got {buckets}")
    state = value & _MASK_64
    candidate = 0
    while True:
        state = (_LCG_MULTIPLIER * state + 1) & _MASK_64
        next_double = ((state >> 33) + 1) / 2**31
        following = int((candidate + 1) / next_double)
        if 0 <= following < buckets:
            candidate = following
        else:
            return candidate


def fifo_queue_id(message_group: str, write_queue_nums: int) -> int:
    """The queue of a message group: the proxy's ``SendMessageQueueSelector``,
    ``consistentHash(group.hashCode(), writeQueues)``, so a group keeps its queue as RocketMQ keeps it."""
    return consistent_hash(java_string_hash(message_group), write_queue_nums)
