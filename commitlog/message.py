"""RocketMQ's stored-message layout: pure encode/decode functions, no I/O.

Layout (all big-endian), as RocketMQ 4.x's CommitLog writes it and PULL returns it::

    totalSize i32 | magic i32 | bodyCRC i32 | queueId i32 | flag i32 | queueOffset i64 |
    physicalOffset i64 | sysFlag i32 | bornTimestamp i64 | bornHost (IPv4 4 + port i32, or IPv6 16 + 4) |
    storeTimestamp i64 | storeHost (same) | reconsumeTimes i32 | preparedTransactionOffset i64 |
    bodyLen i32 + body | topicLen i8 + topic | propertiesLen i16 + properties

sysFlag says which hosts are IPv6 (``SYSFLAG_BORNHOST_V6``, ``SYSFLAG_STOREHOST_V6``): each adds 12 bytes, so
the store timestamp moves with the born host only, and everything after the store host with both.

A segment ends with a filler record: ``totalSize i32 | BLANK_MAGIC i32`` followed by unspecified bytes.
"""

from __future__ import annotations

import ipaddress
import struct
from dataclasses import dataclass
from typing import Final, NamedTuple

from isal import isal_zlib

from protocol.invariant import invariant
from protocol.properties import PROPERTIES_BYTES_MAX, decode_properties

MESSAGE_MAGIC: Final = 0xDAA320A7
BLANK_MAGIC: Final = 0xCBD43194
#: a segment always keeps room for a filler header (totalSize + magic)
FILLER_HEADER_BYTES: Final = 8

# sysFlag bits (MessageSysFlag)
SYSFLAG_COMPRESSED: Final = 0x1
SYSFLAG_MULTI_TAGS: Final = 0x2
TRANSACTION_NOT_TYPE: Final = 0x0
TRANSACTION_PREPARED_TYPE: Final = 0x4
TRANSACTION_COMMIT_TYPE: Final = 0x8
TRANSACTION_ROLLBACK_TYPE: Final = 0xC
TRANSACTION_TYPE_MASK: Final = 0xC
SYSFLAG_BORNHOST_V6: Final = 0x10
SYSFLAG_STOREHOST_V6: Final = 0x20

TOPIC_BYTES_MAX: Final = 127

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
HOST_V4_BYTES: Final = 8
HOST_V6_BYTES: Final = 20
HOST_V6_EXTRA_BYTES: Final = HOST_V6_BYTES - HOST_V4_BYTES
#: a record's bytes besides its two hosts, body, topic segment (length byte and topic) and properties: head A,
#: storeTimestamp, reconsumeTimes, preparedTransactionOffset, bodyLen and propertiesLen (74)
RECORD_FIXED_BYTES: Final = HEAD_A.size + 8 + 4 + 8 + 4 + 2


def body_at(sys_flag: int) -> int:
    """Where the body of a record with ``sys_flag`` starts: 88 bytes of head with IPv4 hosts, 12 more per
    IPv6 host (bodyLen is the 4 bytes before it)."""
    return (BODY_AT_V4 + (HOST_V6_EXTRA_BYTES if sys_flag & SYSFLAG_BORNHOST_V6 else 0)
            + (HOST_V6_EXTRA_BYTES if sys_flag & SYSFLAG_STOREHOST_V6 else 0))


class MessageInput(NamedTuple):
    """One message as apply hands it to the store: everything the stored record needs, stamped by the
    leader before proposing, so every replica writes the same bytes. (A NamedTuple: one is built per
    message on every replica, and a frozen dataclass costs several times more to construct.)

    ``properties`` is the encoded ``key\\x01value\\x02`` string exactly as the producer sent it (plus what
    the broker added). ``born_host`` is 8 bytes (IPv4 + port) or 20 bytes (IPv6 + port), as is the store
    host the store adds.
    """

    topic: str
    queue_id: int
    flag: int
    sys_flag: int
    born_timestamp: int
    born_host: bytes
    store_timestamp: int
    reconsume_times: int
    prepared_transaction_offset: int
    body: bytes
    properties: bytes


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


_I32: Final = 2**31
_I64: Final = 2**63


def validate_input(message: MessageInput, body_size_max_bytes: int) -> str | None:
    """Return why ``message`` cannot be stored, or None. Never raises."""
    # the common case in one pass over the unpacked fields (a quarter cheaper than reading each by name);
    # the checks below name what is wrong
    (topic, queue_id, flag, sys_flag, born_timestamp, born_host, store_timestamp, reconsume_times, prepared_offset,
     body, properties) = message
    if (topic.isascii() and 0 < len(topic) <= TOPIC_BYTES_MAX and len(properties) <= PROPERTIES_BYTES_MAX
            and len(body) <= body_size_max_bytes and len(born_host) in (8, 20)
            and 0 <= queue_id < _I32 and -_I32 <= flag < _I32 and -_I32 <= sys_flag < _I32
            and -_I32 <= reconsume_times < _I32 and -_I64 <= born_timestamp < _I64
            and -_I64 <= store_timestamp < _I64 and -_I64 <= prepared_offset < _I64):
        return None
    try:
        topic_len = len(message.topic.encode())
    except UnicodeEncodeError:
        return "topic is not valid unicode"
    if not 0 < topic_len <= TOPIC_BYTES_MAX:
        return f"topic length {topic_len} outside 1..{TOPIC_BYTES_MAX} bytes"
    if len(message.properties) > PROPERTIES_BYTES_MAX:
        return f"properties length {len(message.properties)} over {PROPERTIES_BYTES_MAX} bytes"
    if len(message.body) > body_size_max_bytes:
        return f"body length {len(message.body)} over {body_size_max_bytes} bytes"
    if len(message.born_host) not in (8, 20):
        return f"born host must be 8 or 20 bytes, got {len(message.born_host)}"
    if not 0 <= message.queue_id < 2**31:
        return f"queue id {message.queue_id} out of range"
    for name, value, bits in (
        ("flag", message.flag, 32),
        ("sys_flag", message.sys_flag, 32),
        ("reconsume_times", message.reconsume_times, 32),
        ("born_timestamp", message.born_timestamp, 64),
        ("store_timestamp", message.store_timestamp, 64),
        ("prepared_transaction_offset", message.prepared_transaction_offset, 64),
    ):
        if not -(2 ** (bits - 1)) <= value < 2 ** (bits - 1):
            return f"{name} {value} does not fit in {bits} bits"
    return None


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


def encode_host(ip: str, port: int) -> bytes:
    """IPv4 address and port as the 8 bytes stored in a record."""
    parts = ip.split(".")
    if len(parts) != 4 or not all(p.isdigit() and 0 <= int(p) <= 255 for p in parts):
        raise ValueError(f"not an IPv4 address: {ip!r}")
    if not 0 <= port <= 65535:
        raise ValueError(f"port out of range: {port}")
    return bytes(int(p) for p in parts) + port.to_bytes(4, "big")


def encode_address(address: str) -> bytes:
    """``ip:port`` (an IPv4 literal, as :func:`encode_host` takes it) or ``[ipv6]:port`` as a record stores it:
    8 bytes (IPv4 + port) or 20 (IPv6 + port). ValueError says what is wrong: a host name has no bytes to
    store, an IPv6 address needs its brackets, a scope id (``%eth0``) does not fit in the record."""
    if address.startswith("["):
        host, bracket, port_text = address[1:].partition("]:")
        if not bracket:
            raise ValueError(f"an IPv6 address is written [address]:port, got {address!r}")
    else:
        host, _, port_text = address.rpartition(":")
        if ":" in host:
            raise ValueError(f"an IPv6 address needs brackets: [address]:port, got {address!r}")
    try:
        port = int(port_text)
    except ValueError:
        raise ValueError(f"no port number after the host in {address!r}") from None
    if not 0 <= port <= 65535:
        raise ValueError(f"port out of range: {port}")
    if not address.startswith("["):
        if not host.replace(".", "").isdigit():
            raise ValueError(f"{host!r} is not an IP address (a host name has no bytes to store)")
        return encode_host(host, port)
    if "%" in host:
        raise ValueError(f"an IPv6 scope id does not fit in a record: {host!r}")
    try:
        ip = ipaddress.IPv6Address(host)
    except ValueError:
        raise ValueError(f"not an IPv6 address: {host!r}") from None
    if ip.ipv4_mapped is not None:
        raise ValueError(f"{host!r} is an IPv4-mapped address: write it as IPv4 ({ip.ipv4_mapped}:{port})")
    return ip.packed + port.to_bytes(4, "big")


def encode_peer(host: str, port: int) -> bytes:
    """A connection's peer as a record's born host: 8 bytes for IPv4 (an IPv4-mapped IPv6 address too, as
    a dual-stack socket reports an IPv4 client), 20 for IPv6 (its scope id dropped). ValueError for what is
    not an IP address or a port."""
    try:
        ip = ipaddress.ip_address(host.strip("[]").partition("%")[0])
    except ValueError:
        raise ValueError(f"not an IP address: {host!r}") from None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if not 0 <= port <= 65535:
        raise ValueError(f"port out of range: {port}")
    return ip.packed + port.to_bytes(4, "big")


def format_address(raw: bytes) -> str:
    """The canonical ``ip:port`` / ``[ipv6]:port`` of 8 or 20 stored host bytes (IPv6 compressed, lower
    case): :func:`encode_address` of it gives ``raw`` back."""
    host, port = decode_host(raw)
    if len(raw) == HOST_V6_BYTES:
        return f"[{ipaddress.IPv6Address(raw[:16]).compressed}]:{port}"
    return f"{host}:{port}"


def decode_host(raw: bytes) -> tuple[str, int]:
    if len(raw) == 8:
        return ".".join(str(b) for b in raw[:4]), int.from_bytes(raw[4:], "big")
    if len(raw) == 20:
        groups = [raw[i : i + 2].hex() for i in range(0, 16, 2)]
        return ":".join(groups), int.from_bytes(raw[16:], "big")
    raise ValueError(f"host must be 8 or 20 bytes, got {len(raw)}")


def encode_message_id(store_host: bytes, physical_offset: int) -> str:
    """RocketMQ's store-based message id: hex(storeHost + physical offset), upper case: 32 characters for
    an IPv4 store host, 56 for an IPv6 one (MessageDecoder.createMessageId)."""
    return (store_host + physical_offset.to_bytes(8, "big", signed=True)).hex().upper()


def decode_message_id(msg_id: str) -> tuple[bytes, int]:
    """(store host bytes, physical offset) from a store-based message id, 32 hex characters (IPv4 store host)
    or 56 (IPv6) as MessageDecoder.decodeMessageId reads it; ValueError if malformed."""
    if len(msg_id) not in (32, 56):
        raise ValueError(f"message id must be 32 or 56 hex characters, got {len(msg_id)}")
    raw = bytes.fromhex(msg_id)
    return raw[:-8], int.from_bytes(raw[-8:], "big", signed=True)


def java_string_hash(text: str) -> int:
    """Java's String.hashCode (UTF-16 code units, 32-bit wrap-around), as a signed int."""
    h = 0
    data = text.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def tags_hash_code(tags: str | None) -> int:
    """The consume-queue tag code: Java's hashCode of the TAGS property, 0 when absent."""
    return java_string_hash(tags) if tags else 0


#: bound on a tag-code cache
TAG_CODE_CACHE_MAX: Final = 100_000


def cached_tag_code(cache: dict[bytes, int], tags: bytes | None) -> int:
    """:func:`tags_hash_code` of raw TAGS bytes, remembered in ``cache`` (up to TAG_CODE_CACHE_MAX)."""
    if not tags:
        return 0
    code = cache.get(tags)
    if code is None:
        code = tags_hash_code(tags.decode("utf-8", "replace"))
        if len(cache) < TAG_CODE_CACHE_MAX:
            cache[tags] = code
    return code
