"""Typed request headers read from extFields, and the error every processor raises for bad input.

A header field that is missing, of the wrong type or out of range is a :class:`RequestError` carrying the
response code RocketMQ answers with (SYSTEM_ERROR for a header that cannot be decoded, as Java's
``decodeCommandCustomHeader`` failure is answered), so nothing is proposed and the client gets a remark
naming the field.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from dataclasses import fields as dataclass_fields
from typing import Final

from protocol.codes import ResponseCode
from protocol.invariant import invariant

#: protocol/_native.c's read_send_header, where it is built
_native_send_header: Callable[[type[SendHeader], tuple[str | None, ...]], SendHeader | None] | None
try:
    from protocol._native import read_send_header as _native_send_header
except ImportError:  # not built (setup.py: optional): SendHeader.parse reads every header in Python
    _native_send_header = None

INT32_MIN: Final = -(2**31)
INT32_MAX: Final = 2**31 - 1
INT64_MIN: Final = -(2**63)
INT64_MAX: Final = 2**63 - 1
#: SEND_MESSAGE_V2's one-letter field names, in SendMessageRequestHeader's order
V2_NAMES: Final = {
    "a": "producerGroup", "b": "topic", "c": "defaultTopic", "d": "defaultTopicQueueNums", "e": "queueId",
    "f": "sysFlag", "g": "bornTimestamp", "h": "flag", "i": "properties", "j": "reconsumeTimes",
    "k": "unitMode", "l": "maxReconsumeTimes", "m": "batch", "n": "brokerName",
}


class RequestError(Exception):
    """An operating error answered with ``code`` and ``remark`` (nothing was stored)."""

    def __init__(self, code: int, remark: str, ext_fields: Mapping[str, str] | None = None) -> None:
        super().__init__(remark)
        self.code = code
        self.remark = remark
        self.ext_fields = dict(ext_fields or {})


def bad_header(remark: str) -> RequestError:
    return RequestError(ResponseCode.SYSTEM_ERROR, remark)


def text(fields: Mapping[str, str], key: str, default: str | None = None) -> str:
    return _text_value(fields.get(key), key, default)


def integer(fields: Mapping[str, str], key: str, default: int | None = None,
            low: int = INT64_MIN, high: int = INT64_MAX) -> int:
    return _integer_value(fields.get(key), key, default, low, high)


def boolean(fields: Mapping[str, str], key: str, default: bool = False) -> bool:
    return _boolean_value(fields.get(key), key, default)


def _text_value(value: str | None, key: str, default: str | None = None) -> str:
    """``value``, the field ``key`` as sent (None: absent), or ``default``; no default: it is required."""
    if value is None:
        if default is None:
            raise bad_header(f"the custom field <{key}> is null")
        return default
    return value


def _integer_value(value: str | None, key: str, default: int | None, low: int, high: int) -> int:
    if value is None or value == "":
        if default is None:
            raise bad_header(f"the custom field <{key}> is null")
        return default
    try:
        number = int(value.strip())
    except ValueError:
        raise bad_header(f"the custom field <{key}> must be an integer, got {value[:40]!r}") from None
    if not low <= number <= high:
        raise bad_header(f"the custom field <{key}> must be in {low}..{high}, got {number}")
    return number


def _boolean_value(value: str | None, key: str, default: bool) -> bool:
    if value is None or value == "":
        return default
    lowered = value.strip().lower()
    if lowered in ("true", "1"):
        return True
    if lowered in ("false", "0"):
        return False
    raise bad_header(f"the custom field <{key}> must be true or false, got {value[:40]!r}")


#: what :meth:`SendHeader.parse` reads, in its order: SendMessageRequestHeader's names ...
_SEND_NAMES: Final[tuple[str, ...]] = (
    "producerGroup", "topic", "defaultTopic", "defaultTopicQueueNums", "queueId", "sysFlag", "bornTimestamp",
    "flag", "properties", "reconsumeTimes", "maxReconsumeTimes", "batch",
)
_V2_LETTERS: Final = {name: letter for letter, name in V2_NAMES.items()}
#: ... and SEND_MESSAGE_V2's one-letter names for them
_SEND_NAMES_V2: Final = tuple(_V2_LETTERS[name] for name in _SEND_NAMES)
_V2_ONLY: Final = frozenset(V2_NAMES)


@dataclass(frozen=True, slots=True, init=False)
class SendHeader:
    producer_group: str
    topic: str
    default_topic: str
    default_topic_queue_nums: int
    queue_id: int
    sys_flag: int
    born_timestamp: int
    flag: int
    properties: str
    reconsume_times: int
    max_reconsume_times: int | None
    batch: bool

    def __init__(self, producer_group: str, topic: str, default_topic: str, default_topic_queue_nums: int,
                 queue_id: int, sys_flag: int, born_timestamp: int, flag: int, properties: str,
                 reconsume_times: int, max_reconsume_times: int | None, batch: bool) -> None:
        # The generated __init__ of a frozen dataclass stores each field through object.__setattr__, the
        # dearest part of parse (one header per send); the slots' own setters store the same for less.
        _SET_PRODUCER_GROUP(self, producer_group)
        _SET_TOPIC(self, topic)
        _SET_DEFAULT_TOPIC(self, default_topic)
        _SET_DEFAULT_TOPIC_QUEUE_NUMS(self, default_topic_queue_nums)
        _SET_QUEUE_ID(self, queue_id)
        _SET_SYS_FLAG(self, sys_flag)
        _SET_BORN_TIMESTAMP(self, born_timestamp)
        _SET_FLAG(self, flag)
        _SET_PROPERTIES(self, properties)
        _SET_RECONSUME_TIMES(self, reconsume_times)
        _SET_MAX_RECONSUME_TIMES(self, max_reconsume_times)
        _SET_BATCH(self, batch)

    @classmethod
    def parse(cls, fields: Mapping[str, str], v2: bool) -> SendHeader:
        """``v2``: the one-letter names of SEND_MESSAGE_V2; Java sends SEND_BATCH_MESSAGE with them too,
        so any request carrying ``a`` and ``b`` is read that way."""
        names = _SEND_NAMES
        if v2 or ("a" in fields and "b" in fields):
            if fields.keys() <= _V2_ONLY:
                names = _SEND_NAMES_V2  # one-letter names only, as every client sends them: read in place
            else:
                # Both names of a field may be there: the renamed copy keeps the later one.
                fields = {V2_NAMES.get(key, key): value for key, value in fields.items()}
        values = tuple(map(fields.get, names))
        if _native_send_header is not None:
            header: SendHeader | None = _native_send_header(cls, values)
            if header is not None:
                return header  # the common case, read in C; anything else is read (or refused) below
        (producer_group, topic, default_topic, default_topic_queue_nums, queue_id, sys_flag, born_timestamp,
         flag, properties, reconsume_times, max_reconsume_times, batch) = values
        return cls(
            producer_group=_text_value(producer_group, "producerGroup"),
            topic=_text_value(topic, "topic"),
            default_topic=_text_value(default_topic, "defaultTopic", "TBW102"),
            default_topic_queue_nums=_integer_value(default_topic_queue_nums, "defaultTopicQueueNums", 4, 1, 1024),
            queue_id=_integer_value(queue_id, "queueId", -1, INT32_MIN, INT32_MAX),
            sys_flag=_integer_value(sys_flag, "sysFlag", 0, INT32_MIN, INT32_MAX),
            born_timestamp=_integer_value(born_timestamp, "bornTimestamp", None, INT64_MIN, INT64_MAX),
            flag=_integer_value(flag, "flag", 0, INT32_MIN, INT32_MAX),
            properties=properties or "",
            reconsume_times=_integer_value(reconsume_times, "reconsumeTimes", 0, 0, INT32_MAX),
            max_reconsume_times=None if not max_reconsume_times
            else _integer_value(max_reconsume_times, "maxReconsumeTimes", 16, -1, INT32_MAX),
            batch=_boolean_value(batch, "batch", False),
        )


(
    _SET_PRODUCER_GROUP, _SET_TOPIC, _SET_DEFAULT_TOPIC, _SET_DEFAULT_TOPIC_QUEUE_NUMS, _SET_QUEUE_ID, _SET_SYS_FLAG,
    _SET_BORN_TIMESTAMP, _SET_FLAG, _SET_PROPERTIES, _SET_RECONSUME_TIMES, _SET_MAX_RECONSUME_TIMES, _SET_BATCH,
) = (getattr(SendHeader, field.name).__set__ for field in dataclass_fields(SendHeader))
invariant([field.name for field in dataclass_fields(SendHeader)] == [
    "producer_group", "topic", "default_topic", "default_topic_queue_nums", "queue_id", "sys_flag", "born_timestamp",
    "flag", "properties", "reconsume_times", "max_reconsume_times", "batch",
], "SendHeader's fields changed: update its __init__ and its setters")


#: PULL_MESSAGE sysFlag bits (PullSysFlag)
PULL_COMMIT_OFFSET: Final = 0x1
PULL_SUSPEND: Final = 0x2
PULL_SUBSCRIPTION: Final = 0x4


@dataclass(frozen=True, slots=True)
class PullHeader:
    consumer_group: str
    topic: str
    queue_id: int
    queue_offset: int
    max_msg_nums: int
    sys_flag: int
    commit_offset: int
    suspend_timeout_millis: int
    subscription: str | None
    expression_type: str

    @classmethod
    def parse(cls, fields: Mapping[str, str]) -> PullHeader:
        return cls(
            consumer_group=text(fields, "consumerGroup"),
            topic=text(fields, "topic"),
            queue_id=integer(fields, "queueId", None, 0, INT32_MAX),
            queue_offset=integer(fields, "queueOffset", None, 0, INT64_MAX),
            max_msg_nums=integer(fields, "maxMsgNums", None, 1, INT32_MAX),
            sys_flag=integer(fields, "sysFlag", 0, INT32_MIN, INT32_MAX),
            commit_offset=integer(fields, "commitOffset", 0),
            suspend_timeout_millis=integer(fields, "suspendTimeoutMillis", 0, 0, INT64_MAX),
            subscription=fields.get("subscription"),
            expression_type=fields.get("expressionType") or "TAG",
        )
