"""RocketMQ's stored-message layout: pure encode/decode functions, no I/O.

Layout (all big-endian), as RocketMQ 4.x's CommitLog writes it and PULL returns it::

    totalSize i32 | magic i32 | bodyCRC i32 | queueId i32 | flag i32 | queueOffset i64 |
    physicalOffset i64 | sysFlag i32 | bornTimestamp i64 | bornHost (IPv4 4 + port i32, or IPv6 16 + 4) |
    storeTimestamp i64 | storeHost (same) | reconsumeTimes i32 | preparedTransactionOffset i64 |
    bodyLen i32 + body | topicLen i8 + topic | propertiesLen i16 + properties

sysFlag says which hosts are IPv6 (``SYSFLAG_BORNHOST_V6``, ``SYSFLAG_STOREHOST_V6``): each adds 12 bytes, so
the store timestamp moves with the born host only, and everything after the store host with both.

A segment ends with a filler record: ``totalSize i32 | BLANK_MAGIC i32`` followed by unspecified bytes.

The sysFlag bits are in :mod:`commitlog.sys_flags`, the hosts' widths and the message id in
:mod:`commitlog.hosts`, and the message the store encodes in :mod:`commitlog.message`.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final

from isal import isal_zlib

from commitlog.hosts import HOST_V4_BYTES, HOST_V6_BYTES, HOST_V6_EXTRA_BYTES, encode_message_id
from commitlog.message import MessageInput
from commitlog.sys_flags import SYSFLAG_BORNHOST_V6, SYSFLAG_STOREHOST_V6, TRANSACTION_TYPE_MASK
from protocol.invariant import invariant
from protocol.properties import decode_properties

MESSAGE_MAGIC: Final = 0xDAA320A7
BLANK_MAGIC: Final = 0xCBD43194
#: a segment always keeps room for a filler header (totalSize + magic)
FILLER_HEADER_BYTES: Final = 8

# Head up to and including bornTimestamp; host fields vary in width, so the head is split in three parts.
HEAD_A: Final = struct.Struct(">iIIiiqqiq")  # totalSize..bornTimestamp
HEAD_B_V4: Final = struct.Struct(">8sq8siq")  # bornHost, storeTimestamp, storeHost, reconsume, prepOffset
invariant(HEAD_A.size == 48, "head A must be 48 bytes")
invariant(HEAD_B_V4.size == 36, "head B must be 36 bytes")
#: a record's fixed head up to and including bodyLen, as one struct, by [born host IPv6][store host IPv6]
#: (88, 100, 100 and 112 bytes): totalSize..bornTimestamp, bornHost, storeTimestamp, storeHost, reconsumeTimes,
#: preparedTransactionOffset, bodyLen
RECORD_HEADS: Final = tuple(tuple(struct.Struct(f">iIIiiqqiq{born}sq{store}siqi") for store in (8, 20))
                            for born in (8, 20))
invariant([head.size for heads in RECORD_HEADS for head in heads] == [88, 100, 100, 112],
          "record heads are 88, 100, 100 and 112 bytes")
FILLER: Final = struct.Struct(">iI")
invariant(FILLER.size == FILLER_HEADER_BYTES, "filler header must be 8 bytes")
INT32: Final = struct.Struct(">i")
INT16: Final = struct.Struct(">h")

# Offsets of fixed fields inside a record, for readers that peek without decoding.
POS_TOTAL_SIZE: Final = 0
POS_MAGIC: Final = 4
POS_BODY_CRC: Final = 8
POS_QUEUE_ID: Final = 12
POS_QUEUE_OFFSET: Final = 20
POS_PHYSICAL_OFFSET: Final = 28
POS_SYS_FLAG: Final = 36
POS_BORN_TIMESTAMP: Final = 40
POS_BORN_HOST: Final = 48
#: where the body starts (and bodyLen ends) with IPv4 born and store hosts; each IPv6 host adds HOST_V6_EXTRA_BYTES
BODY_AT_V4: Final = 88
#: a record's bytes besides its two hosts, body, topic segment (length byte and topic) and properties: head A,
#: storeTimestamp, reconsumeTimes, preparedTransactionOffset, bodyLen and propertiesLen (74)
RECORD_FIXED_BYTES: Final = HEAD_A.size + 8 + 4 + 8 + 4 + 2


def body_at(sys_flag: int) -> int:
    """Where the body of a record with ``sys_flag`` starts: 88 bytes of head with IPv4 hosts, 12 more per
    IPv6 host (bodyLen is the 4 bytes before it)."""
    return (BODY_AT_V4 + (HOST_V6_EXTRA_BYTES if sys_flag & SYSFLAG_BORNHOST_V6 else 0)
            + (HOST_V6_EXTRA_BYTES if sys_flag & SYSFLAG_STOREHOST_V6 else 0))


@dataclass(frozen=True, slots=True)
class StoredMessage:
    """A decoded stored record."""

    total_size: int
    body_crc: int
    queue_id: int
    flag: int
    queue_offset: int
    physical_offset: int
    sys_flag: int
    born_timestamp: int
    born_host: bytes
    store_timestamp: int
    store_host: bytes
    reconsume_times: int
    prepared_transaction_offset: int
    body: bytes
    topic: str
    properties: bytes

    @property
    def property_map(self) -> dict[str, str]:
        return decode_properties(self.properties)

    @property
    def msg_id(self) -> str:
        return encode_message_id(self.store_host, self.physical_offset)

    @property
    def transaction_type(self) -> int:
        return self.sys_flag & TRANSACTION_TYPE_MASK


class RecordError(ValueError):
    """Bytes that are not a valid stored record (bad magic, size, CRC, truncated)."""


#: zlib's CRC-32 (the same values, and the same start-value argument), computed by ISA-L: several times
#: faster than zlib's, and every stored record pays it once on the leader
crc32: Final = isal_zlib.crc32


def body_crc32(body: bytes) -> int:
    """The body CRC a record stores: RocketMQ's ``UtilAll.crc32``, CRC32 with the top bit cleared."""
    return crc32(body) & 0x7FFFFFFF


def record_size(body_len: int, topic_len: int, properties_len: int, born_v6: bool = False,
                store_v6: bool = False) -> int:
    """Total size of a stored record (IPv4 hosts unless said otherwise)."""
    return stored_size(HOST_V6_BYTES if born_v6 else HOST_V4_BYTES, HOST_V6_BYTES if store_v6 else HOST_V4_BYTES,
                       body_len, 1 + topic_len, properties_len)


def stored_size(born_host_length: int, store_host_length: int, body_length: int, topic_segment_length: int,
                properties_length: int) -> int:
    """Total size of a stored record from the lengths of its variable parts (``topic_segment_length``: the
    topic's length byte and its bytes): the one size formula, which :func:`pack_record` lays out."""
    return (RECORD_FIXED_BYTES + born_host_length + store_host_length + body_length + topic_segment_length
            + properties_length)


def encode_record(
    message: MessageInput,
    queue_offset: int,
    physical_offset: int,
    store_host: bytes,
    topic_bytes: bytes | None = None,
) -> bytes:
    """Encode one stored record. The input must have passed :func:`validate_input`; ``store_host`` is 8 bytes
    (IPv4 + port) or 20 (IPv6 + port), and the sysFlag bits of both hosts follow their widths."""
    invariant(len(store_host) in (HOST_V4_BYTES, HOST_V6_BYTES), "a store host is 8 or 20 bytes")
    topic = topic_bytes if topic_bytes is not None else message.topic.encode()
    topic_segment = bytes((len(topic),)) + topic
    size = stored_size(len(message.born_host), len(store_host), len(message.body), len(topic_segment),
                       len(message.properties))
    return pack_record(message, topic_segment, size, queue_offset, physical_offset, store_host,
                       message.store_timestamp)


def pack_record(message: MessageInput, topic_segment: bytes, size: int, queue_offset: int, physical_offset: int,
                store_host: bytes, store_timestamp: int) -> bytes:
    """The stored record's layout, the reference every path stores (``commitlog._native`` builds the same
    bytes, tested byte for byte): ``topic_segment`` is the topic's length byte followed by its bytes, ``size``
    the record's :func:`stored_size` (the caller has it already: it places the record by it), and
    ``store_timestamp`` replaces the message's (the leader stamps a whole batch). The sysFlag bits of both
    hosts follow their widths. ``struct.error`` or ``OverflowError`` when a field does not fit its width."""
    body = message.body
    properties = message.properties
    born_host = message.born_host
    sys_flag = message.sys_flag & ~(SYSFLAG_BORNHOST_V6 | SYSFLAG_STOREHOST_V6)
    born_v6 = len(born_host) == HOST_V6_BYTES
    store_v6 = len(store_host) == HOST_V6_BYTES
    if born_v6:
        sys_flag |= SYSFLAG_BORNHOST_V6
    if store_v6:
        sys_flag |= SYSFLAG_STOREHOST_V6
    return b"".join((
        RECORD_HEADS[born_v6][store_v6].pack(
            size, MESSAGE_MAGIC, body_crc32(body), message.queue_id, message.flag, queue_offset, physical_offset,
            sys_flag, message.born_timestamp, born_host, store_timestamp, store_host, message.reconsume_times,
            message.prepared_transaction_offset, len(body)),
        body,
        topic_segment,
        INT16.pack(len(properties)),
        properties,
    ))


def decode_record(buffer: bytes | memoryview, offset: int = 0, check_crc: bool = True) -> StoredMessage:
    """Decode the record starting at ``offset``. Raises :class:`RecordError` on anything malformed."""
    view = memoryview(buffer)
    available = len(view) - offset
    if available < 48:
        raise RecordError(f"truncated record head at {offset}: {available} bytes")
    (total, magic, body_crc, queue_id, flag, queue_offset, physical_offset, sys_flag, born_ts) = (
        HEAD_A.unpack_from(view, offset)
    )
    if magic != MESSAGE_MAGIC:
        raise RecordError(f"bad magic {magic:#010x} at {offset}")
    if total < record_size(0, 1, 0) or total > available:
        raise RecordError(f"bad total size {total} at {offset} ({available} bytes available)")
    end = offset + total
    pos = offset + 48
    born_len = 20 if sys_flag & SYSFLAG_BORNHOST_V6 else 8
    store_len = 20 if sys_flag & SYSFLAG_STOREHOST_V6 else 8
    fixed_rest = born_len + 8 + store_len + 4 + 8 + 4
    if pos + fixed_rest > end:
        raise RecordError(f"record at {offset} too short for its hosts")
    born_host = bytes(view[pos : pos + born_len])
    pos += born_len
    (store_ts,) = struct.unpack_from(">q", view, pos)
    pos += 8
    store_host = bytes(view[pos : pos + store_len])
    pos += store_len
    reconsume, prepared, body_len = struct.unpack_from(">iqi", view, pos)
    pos += 16
    if body_len < 0 or pos + body_len + 3 > end:
        raise RecordError(f"bad body length {body_len} at {offset}")
    body = bytes(view[pos : pos + body_len])
    pos += body_len
    topic_len = view[pos]
    pos += 1
    if topic_len == 0 or pos + topic_len + 2 > end:
        raise RecordError(f"bad topic length {topic_len} at {offset}")
    try:
        topic = bytes(view[pos : pos + topic_len]).decode()
    except UnicodeDecodeError as exc:
        raise RecordError(f"topic is not utf-8 at {offset}") from exc
    pos += topic_len
    (props_len,) = struct.unpack_from(">h", view, pos)
    pos += 2
    if props_len < 0 or pos + props_len != end:
        raise RecordError(f"bad properties length {props_len} at {offset}")
    properties = bytes(view[pos:end])
    if check_crc and body_crc != body_crc32(body) and body_crc != crc32(body):
        # (the unmasked CRC is what stores written before the switch to RocketMQ's masked CRC hold)
        raise RecordError(f"body CRC mismatch at {offset}")
    return StoredMessage(
        total_size=total,
        body_crc=body_crc,
        queue_id=queue_id,
        flag=flag,
        queue_offset=queue_offset,
        physical_offset=physical_offset,
        sys_flag=sys_flag,
        born_timestamp=born_ts,
        born_host=born_host,
        store_timestamp=store_ts,
        store_host=store_host,
        reconsume_times=reconsume,
        prepared_transaction_offset=prepared,
        body=body,
        topic=topic,
        properties=properties,
    )
