"""A message's properties on the wire and in the stored record: ``key\x01value\x02`` for each pair
(RocketMQ's ``MessageDecoder.messageProperties2String`` / ``string2messageProperties``), and the names of
the properties RocketMQ itself reads and writes (``MessageConst``).

The same text travels in a send's ``properties`` header field, in each message of a batch body and in the
stored record, so producers, the broker and the store share this one codec. The text form is the
reference; the bytes form is its UTF-8 encoding.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Final

NAME_VALUE_SEPARATOR: Final = b"\x01"
PROPERTY_SEPARATOR: Final = b"\x02"
#: the properties' length is an int16 (propertiesLen) in the stored record and in a batch body
PROPERTIES_BYTES_MAX: Final = 32767
#: Java's MessageConst.KEY_SEPARATOR: several keys in KEYS are separated by a space
KEY_SEPARATOR: Final = " "

PROPERTY_KEYS: Final = "KEYS"
PROPERTY_TAGS: Final = "TAGS"
PROPERTY_WAIT_STORE_MSG_OK: Final = "WAIT"
PROPERTY_DELAY_TIME_LEVEL: Final = "DELAY"
PROPERTY_RETRY_TOPIC: Final = "RETRY_TOPIC"
PROPERTY_REAL_TOPIC: Final = "REAL_TOPIC"
PROPERTY_REAL_QUEUE_ID: Final = "REAL_QID"
PROPERTY_TRANSACTION_PREPARED: Final = "TRAN_MSG"
PROPERTY_PRODUCER_GROUP: Final = "PGROUP"
PROPERTY_MIN_OFFSET: Final = "MIN_OFFSET"
PROPERTY_MAX_OFFSET: Final = "MAX_OFFSET"
PROPERTY_ORIGIN_MESSAGE_ID: Final = "ORIGIN_MESSAGE_ID"
PROPERTY_DLQ_ORIGIN_TOPIC: Final = "DLQ_ORIGIN_TOPIC"
PROPERTY_DLQ_ORIGIN_MESSAGE_ID: Final = "DLQ_ORIGIN_MESSAGE_ID"
PROPERTY_RECONSUME_TIME: Final = "RECONSUME_TIME"
PROPERTY_MAX_RECONSUME_TIMES: Final = "MAX_RECONSUME_TIMES"
PROPERTY_CONSUME_START_TIMESTAMP: Final = "CONSUME_START_TIME"
#: the producer's message id, the key the broker deduplicates retried sends by
PROPERTY_UNIQ_KEY: Final = "UNIQ_KEY"
PROPERTY_TRANSACTION_ID: Final = "__transactionId__"
PROPERTY_TRANSACTION_CHECK_TIMES: Final = "TRANSACTION_CHECK_TIMES"
PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS: Final = "CHECK_IMMUNITY_TIME_IN_SECONDS"
#: deliver-at in epoch ms: the 4.x convention (Aliyun ONS, many 4.x brokers) ...
PROPERTY_START_DELIVER_TIME: Final = "__STARTDELIVERTIME"
#: ... and RocketMQ 5's timer property; raftmq producers set both to the same value
PROPERTY_TIMER_DELIVER_MS: Final = "TIMER_DELIVER_MS"
PROPERTY_CLUSTER: Final = "CLUSTER"

#: the first non-empty UNIQ_KEY of encoded properties, found without parsing the other pairs
_UNIQ_KEY_VALUE: Final = re.compile(rb"(?:^|\x02)UNIQ_KEY\x01([^\x02]+)")


def encode_properties_text(properties: Mapping[str, str]) -> str:
    """``key\\x01value\\x02`` for each pair, in the mapping's order (RocketMQ's messageProperties2String).
    Keys and values are written as they are: whoever accepts them checks them for separators."""
    return "".join([f"{key}\x01{value}\x02" for key, value in properties.items()])


def encode_properties(properties: Mapping[str, str]) -> bytes:
    """:func:`encode_properties_text` as UTF-8 (UnicodeEncodeError for a lone surrogate)."""
    return encode_properties_text(properties).encode()


def parse_properties(text: str) -> dict[str, str]:
    """``key\\x01value\\x02`` pairs (MessageDecoder.string2messageProperties: lenient, last one wins);
    malformed pairs (no separator, or no key) are skipped, as Java does."""
    properties: dict[str, str] = {}
    for pair in text.split("\x02"):
        if not pair:
            continue
        key, separator, value = pair.partition("\x01")
        if separator and key:
            properties[key] = value
    return properties


def decode_properties(raw: bytes) -> dict[str, str]:
    """:func:`parse_properties` of stored bytes; bytes that are not UTF-8 read as U+FFFD. (The separators
    are single bytes no UTF-8 sequence contains, so decoding first splits the pairs where they are.)"""
    return parse_properties(raw.decode("utf-8", "replace"))


def find_uniq_key(properties: bytes) -> bytes | None:
    """The value of the first non-empty UNIQ_KEY in encoded ``properties``, as bytes, or None: one C-level
    search, for readers that want this one property of every send (the dedupe of retried sends)."""
    match = _UNIQ_KEY_VALUE.search(properties)
    return match.group(1) if match is not None else None
