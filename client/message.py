"""Messages as producers build them and consumers receive them, message queues, send results, and the
pure encodings around them (Java's ``Message``, ``MessageExt``, ``MessageQueue``, ``SendResult``,
``Validators`` and ``MessageDecoder.encodeMessages``, whose layout is :mod:`protocol.batch`'s).

Received records are decoded with :func:`commitlog.record_codec.decode_record`, the store's own codec.
"""

from __future__ import annotations

import base64
import enum
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Final

from client.errors import MessageValidationError
from commitlog.hosts import encode_message_id, format_address
from commitlog.record_codec import RecordError, StoredMessage, decode_record
from commitlog.sys_flags import SYSFLAG_COMPRESSED
from protocol.batch import encode_batch_message
from protocol.properties import (
    KEY_SEPARATOR,
    PROPERTIES_BYTES_MAX,
    PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS,
    PROPERTY_CLUSTER,
    PROPERTY_CONSUME_START_TIMESTAMP,
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_KEYS,
    PROPERTY_MAX_OFFSET,
    PROPERTY_MAX_RECONSUME_TIMES,
    PROPERTY_MIN_OFFSET,
    PROPERTY_ORIGIN_MESSAGE_ID,
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_RECONSUME_TIME,
    PROPERTY_RETRY_TOPIC,
    PROPERTY_START_DELIVER_TIME,
    PROPERTY_TAGS,
    PROPERTY_TIMER_DELIVER_MS,
    PROPERTY_TRANSACTION_CHECK_TIMES,
    PROPERTY_TRANSACTION_PREPARED,
    PROPERTY_UNIQ_KEY,
    PROPERTY_WAIT_STORE_MSG_OK,
    decode_properties,
    encode_properties,
)
from protocol.topics import check_topic_name

# ------------------------------------------------------------------------------- property keys

#: where this client puts a message's sharding key (the other names are :mod:`protocol.properties`'); the
#: 5.x side's ``__SHARDINGKEY`` (a message group, :mod:`broker.v2.messages`) is another property
PROPERTY_SHARDING_KEY: Final = "SHARDING_KEY"

#: keys a user property may not take (a subset of Java's ``MessageConst.STRING_HASH_SET``)
SYSTEM_PROPERTY_KEYS: Final = frozenset(
    {
        PROPERTY_KEYS,
        PROPERTY_TAGS,
        PROPERTY_WAIT_STORE_MSG_OK,
        PROPERTY_DELAY_TIME_LEVEL,
        PROPERTY_RETRY_TOPIC,
        PROPERTY_REAL_TOPIC,
        PROPERTY_REAL_QUEUE_ID,
        PROPERTY_TRANSACTION_PREPARED,
        PROPERTY_PRODUCER_GROUP,
        PROPERTY_MIN_OFFSET,
        PROPERTY_MAX_OFFSET,
        PROPERTY_ORIGIN_MESSAGE_ID,
        PROPERTY_RECONSUME_TIME,
        PROPERTY_MAX_RECONSUME_TIMES,
        PROPERTY_CONSUME_START_TIMESTAMP,
        PROPERTY_UNIQ_KEY,
        PROPERTY_TRANSACTION_CHECK_TIMES,
        PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS,
        PROPERTY_SHARDING_KEY,
        PROPERTY_START_DELIVER_TIME,
        PROPERTY_TIMER_DELIVER_MS,
        PROPERTY_CLUSTER,
    }
)

#: Java's default ``messageDelayLevel`` has 18 levels; brokers cap larger values at their maximum
DELAY_LEVEL_MAX: Final = 18


def check_topic(topic: object) -> str:
    """Java's ``Validators.checkTopic`` (the broker's rule, :func:`protocol.topics.check_topic_name`): raise
    :class:`MessageValidationError` or return the topic."""
    if not isinstance(topic, str):
        topic = ""  # no name at all: refused as a blank one, as Java refuses a null topic
    problem = check_topic_name(topic)
    if problem is not None:
        raise MessageValidationError(problem)
    return topic


def _check_property_text(text: str, what: str) -> None:
    if "\x01" in text or "\x02" in text:
        raise MessageValidationError(f"{what} must not contain the separators \\x01 or \\x02: {text!r}")


# ------------------------------------------------------------------------------------ message queue


@dataclass(frozen=True, slots=True, order=True)
class MessageQueue:
    """One queue of a topic on one broker group; ordered as Java's ``compareTo`` (topic, broker, id)."""

    topic: str
    broker_name: str
    queue_id: int

    def __str__(self) -> str:
        # Java's MessageQueue.toString(): the consistent-hash allocator hashes this text
        return f"MessageQueue [topic={self.topic}, brokerName={self.broker_name}, queueId={self.queue_id}]"

    def to_json_object(self) -> dict[str, object]:
        return {"topic": self.topic, "brokerName": self.broker_name, "queueId": self.queue_id}

    @classmethod
    def from_json_object(cls, value: object) -> MessageQueue:
        if not isinstance(value, dict):
            raise ValueError(f"a message queue must be a JSON object, got {value!r}")
        topic, broker_name, queue_id = value.get("topic"), value.get("brokerName"), value.get("queueId")
        if not isinstance(topic, str) or not isinstance(broker_name, str):
            raise ValueError(f"a message queue needs topic and brokerName strings, got {value!r}")
        if isinstance(queue_id, str) and queue_id.isdigit():
            queue_id = int(queue_id)
        if type(queue_id) is not int:
            raise ValueError(f"a message queue needs an integer queueId, got {value!r}")
        return cls(topic, broker_name, queue_id)


# ----------------------------------------------------------------------------------------- message


@dataclass(slots=True)
class Message:
    """A message to send. ``keys`` are indexed by the broker (query by key); ``tags`` filter
    subscriptions; ``properties`` are user properties (system keys are refused).

    - ``delay_level``: 1..18 (1 s ... 2 h, the broker's ``messageDelayLevel``), 0 for none.
    - ``deliver_at_ms``: deliver at this epoch time in ms (``__STARTDELIVERTIME`` and
      ``TIMER_DELIVER_MS``); exclusive with ``delay_level``.
    - ``sharding_key``: orderly sends hash it to pick the queue (all messages of one key stay in order).
    - ``unique_id``: set by the producer on the first attempt (UNIQ_KEY) and kept for retries; set it
      yourself to make a re-send after a crash deduplicate against the first.
    """

    topic: str
    body: bytes
    tags: str | None = None
    keys: tuple[str, ...] = ()
    properties: dict[str, str] = field(default_factory=dict)
    delay_level: int = 0
    deliver_at_ms: int | None = None
    sharding_key: str | None = None
    flag: int = 0
    wait_store_msg_ok: bool = True
    unique_id: str | None = None

    def __post_init__(self) -> None:
        keys: object = self.keys  # a space-separated str or any iterable is accepted too
        if isinstance(keys, str):
            self.keys = split_keys(keys)
        elif not isinstance(keys, tuple) and isinstance(keys, Iterable):
            self.keys = tuple(str(key) for key in keys)
        body: object = self.body
        if isinstance(body, str):
            self.body = body.encode("utf-8")

    def validate(self, body_size_max_bytes: int) -> None:
        """Java's ``Validators.checkMessage`` and more: raise :class:`MessageValidationError`."""
        check_topic(self.topic)
        if not isinstance(self.body, bytes | bytearray | memoryview):
            raise MessageValidationError(f"the body must be bytes, got {type(self.body).__name__}")
        if len(self.body) == 0:
            raise MessageValidationError("the message body is empty")
        if len(self.body) > body_size_max_bytes:
            raise MessageValidationError(
                f"the message body is {len(self.body)} bytes, over the limit of {body_size_max_bytes}"
            )
        if self.tags is not None:
            _check_property_text(self.tags, "tags")
        for key in self.keys:
            if not key or KEY_SEPARATOR in key:
                raise MessageValidationError(f"a key must be non-empty and without spaces: {key!r}")
            _check_property_text(key, "a key")
        for name, value in self.properties.items():
            if not name:
                raise MessageValidationError("a property name is empty")
            if name in SYSTEM_PROPERTY_KEYS:
                raise MessageValidationError(f"the property {name!r} is reserved for the system")
            _check_property_text(name, "a property name")
            _check_property_text(value, f"property {name!r}")
        if type(self.delay_level) is not int or not 0 <= self.delay_level <= DELAY_LEVEL_MAX:
            raise MessageValidationError(f"delay_level must be in [0, {DELAY_LEVEL_MAX}], got {self.delay_level!r}")
        if self.deliver_at_ms is not None:
            if type(self.deliver_at_ms) is not int or self.deliver_at_ms < 0:
                raise MessageValidationError(f"deliver_at_ms must be epoch milliseconds, got {self.deliver_at_ms!r}")
            if self.delay_level:
                raise MessageValidationError("delay_level and deliver_at_ms are exclusive")
        if self.sharding_key is not None:
            _check_property_text(self.sharding_key, "the sharding key")
        if type(self.flag) is not int or not -(2**31) <= self.flag < 2**31:
            raise MessageValidationError(f"flag must be an int32, got {self.flag!r}")

    def wire_properties(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """The properties as sent: system ones from the fields, then user ones, then ``extra``."""
        result: dict[str, str] = {}
        if self.tags:
            result[PROPERTY_TAGS] = self.tags
        if self.keys:
            result[PROPERTY_KEYS] = KEY_SEPARATOR.join(self.keys)
        result[PROPERTY_WAIT_STORE_MSG_OK] = "true" if self.wait_store_msg_ok else "false"
        if self.delay_level:
            result[PROPERTY_DELAY_TIME_LEVEL] = str(self.delay_level)
        if self.deliver_at_ms is not None:
            result[PROPERTY_START_DELIVER_TIME] = str(self.deliver_at_ms)
            result[PROPERTY_TIMER_DELIVER_MS] = str(self.deliver_at_ms)
        if self.sharding_key is not None:
            result[PROPERTY_SHARDING_KEY] = self.sharding_key
        if self.unique_id is not None:
            result[PROPERTY_UNIQ_KEY] = self.unique_id
        result.update(self.properties)
        if extra:
            result.update(extra)
        return result


def encode_wire_properties(properties: Mapping[str, str]) -> str:
    """``key\\x01value\\x02...`` as the header's ``properties`` string; checks the int16 bound."""
    encoded = encode_properties(dict(properties))
    if len(encoded) > PROPERTIES_BYTES_MAX:
        raise MessageValidationError(
            f"the encoded properties are {len(encoded)} bytes, over the limit of {PROPERTIES_BYTES_MAX}"
        )
    return encoded.decode("utf-8")


def encode_batch_record(body: bytes, properties: Mapping[str, str], flag: int = 0, magic: int = 0) -> bytes:
    """One message of a batch body (:func:`protocol.batch.encode_batch_message`), its properties checked
    as a single send's are (:func:`encode_wire_properties`)."""
    return encode_batch_message(body, encode_wire_properties(properties).encode("utf-8"), flag, magic)


# ------------------------------------------------------------------------------- received messages


@dataclass(frozen=True, slots=True)
class MessageExt:
    """A received message (Java's ``MessageExt``).

    ``msg_id`` is the client id (UNIQ_KEY) when the producer set one, else the store-based id;
    ``offset_msg_id`` is always the store-based id (store host + commit-log offset). ``topic`` is the
    original topic for a message redelivered through the retry topic.
    """

    topic: str
    body: bytes
    queue_id: int
    queue_offset: int
    commit_log_offset: int
    msg_id: str
    offset_msg_id: str
    properties: Mapping[str, str]
    born_timestamp_ms: int
    store_timestamp_ms: int
    born_host: str
    store_host: str
    reconsume_times: int
    sys_flag: int
    flag: int
    prepared_transaction_offset: int
    broker_name: str = ""
    store_size: int = 0
    #: the topic of the queue it was pulled from, when that differs from ``topic`` (a redelivery
    #: through ``%RETRY%<group>`` shows its original topic)
    queue_topic: str = ""

    @property
    def tags(self) -> str | None:
        return self.properties.get(PROPERTY_TAGS)

    @property
    def keys(self) -> tuple[str, ...]:
        raw = self.properties.get(PROPERTY_KEYS, "")
        return tuple(key for key in raw.split(KEY_SEPARATOR) if key)

    @property
    def unique_id(self) -> str | None:
        return self.properties.get(PROPERTY_UNIQ_KEY)

    @property
    def delay_level(self) -> int:
        try:
            return int(self.properties.get(PROPERTY_DELAY_TIME_LEVEL, "0"))
        except ValueError:
            return 0

    @property
    def user_properties(self) -> dict[str, str]:
        return {key: value for key, value in self.properties.items() if key not in SYSTEM_PROPERTY_KEYS}

    @property
    def message_queue(self) -> MessageQueue:
        """The queue the message was pulled from (what its offset counts in)."""
        return MessageQueue(self.queue_topic or self.topic, self.broker_name, self.queue_id)

    def with_changes(self, **changes: object) -> MessageExt:
        return replace(self, **changes)  # type: ignore[arg-type]

    def to_json_object(self, *, body_as_text: bool = True) -> dict[str, object]:
        """A JSON-friendly view (what ``raftmq consume`` prints)."""
        body: object
        if body_as_text:
            try:
                body = self.body.decode("utf-8")
            except UnicodeDecodeError:
                body = {"base64": base64.b64encode(self.body).decode("ascii")}
        else:
            body = base64.b64encode(self.body).decode("ascii")
        return {
            "topic": self.topic,
            "brokerName": self.broker_name,
            "queueId": self.queue_id,
            "queueOffset": self.queue_offset,
            "msgId": self.msg_id,
            "offsetMsgId": self.offset_msg_id,
            "tags": self.tags,
            "keys": list(self.keys),
            "properties": self.user_properties,
            "bornTimestamp": self.born_timestamp_ms,
            "storeTimestamp": self.store_timestamp_ms,
            "reconsumeTimes": self.reconsume_times,
            "body": body,
        }


def _host_text(raw: bytes) -> str:
    """``ip:port``, ``[ipv6]:port`` (compressed), or the bytes in hex when they are no host."""
    try:
        return format_address(raw)
    except ValueError:
        return raw.hex()


def message_from_record(stored: StoredMessage, broker_name: str = "") -> MessageExt:
    """A :class:`MessageExt` from a decoded stored record; a compressed body (sysFlag 0x1) is inflated."""
    body = stored.body
    if stored.sys_flag & SYSFLAG_COMPRESSED:
        try:
            body = zlib.decompress(body)
        except zlib.error as error:
            raise RecordError(f"compressed body at offset {stored.physical_offset} does not inflate: {error}") from None
    properties = decode_properties(stored.properties)
    offset_msg_id = encode_message_id(stored.store_host, stored.physical_offset)
    return MessageExt(
        topic=stored.topic,
        body=body,
        queue_id=stored.queue_id,
        queue_offset=stored.queue_offset,
        commit_log_offset=stored.physical_offset,
        msg_id=properties.get(PROPERTY_UNIQ_KEY) or offset_msg_id,
        offset_msg_id=offset_msg_id,
        properties=MappingProxyType(properties),
        born_timestamp_ms=stored.born_timestamp,
        store_timestamp_ms=stored.store_timestamp,
        born_host=_host_text(stored.born_host),
        store_host=_host_text(stored.store_host),
        reconsume_times=stored.reconsume_times,
        sys_flag=stored.sys_flag,
        flag=stored.flag,
        prepared_transaction_offset=stored.prepared_transaction_offset,
        broker_name=broker_name,
        store_size=stored.total_size,
    )


def decode_messages(body: bytes, broker_name: str = "") -> list[MessageExt]:
    """The concatenated stored records of a PULL or QUERY_MESSAGE answer. Raises
    :class:`~commitlog.record_codec.RecordError` on malformed bytes. CRCs are not checked, as Java's client
    does not (the Java store writes a masked CRC)."""
    messages: list[MessageExt] = []
    view = memoryview(body)
    position = 0
    while position < len(view):
        stored = decode_record(view, position, check_crc=False)
        messages.append(message_from_record(stored, broker_name))
        position += stored.total_size
    return messages


# ---------------------------------------------------------------------------------------- results


class SendStatus(enum.Enum):
    """``SendStatus``: anything but SEND_OK was stored but not as durably as asked."""

    SEND_OK = "SEND_OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"
    FLUSH_SLAVE_TIMEOUT = "FLUSH_SLAVE_TIMEOUT"
    SLAVE_NOT_AVAILABLE = "SLAVE_NOT_AVAILABLE"


@dataclass(frozen=True, slots=True)
class SendResult:
    """What an acknowledged send returns. For a batch, ``msg_id`` and ``offset_msg_id`` list every
    message's id separated by commas (as Java's), ``queue_offset`` is the first message's."""

    status: SendStatus
    msg_id: str
    message_queue: MessageQueue
    queue_offset: int
    offset_msg_id: str
    transaction_id: str | None = None
    broker_address: str = ""

    @property
    def queue(self) -> MessageQueue:
        return self.message_queue

    @property
    def msg_ids(self) -> tuple[str, ...]:
        return tuple(self.msg_id.split(","))

    @property
    def offset_msg_ids(self) -> tuple[str, ...]:
        return tuple(self.offset_msg_id.split(","))


class PullStatus(enum.Enum):
    FOUND = "FOUND"
    NO_NEW_MSG = "NO_NEW_MSG"
    NO_MATCHED_MSG = "NO_MATCHED_MSG"
    OFFSET_ILLEGAL = "OFFSET_ILLEGAL"


@dataclass(frozen=True, slots=True)
class PullResult:
    """A PULL answer: ``messages`` are already filtered by tag on the client (the broker filters by
    tag hash only); ``next_begin_offset`` is where the next pull starts."""

    status: PullStatus
    next_begin_offset: int
    min_offset: int
    max_offset: int
    messages: tuple[MessageExt, ...] = ()
    suggest_which_broker_id: int = 0


def join_ids(ids: Iterable[str]) -> str:
    return ",".join(ids)


def split_keys(text: str | Sequence[str] | None) -> tuple[str, ...]:
    if text is None:
        return ()
    if isinstance(text, str):
        return tuple(key for key in text.split(KEY_SEPARATOR) if key)
    return tuple(text)

