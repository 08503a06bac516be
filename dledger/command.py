"""The replicated command: our own versioned binary format (no pickled method calls in it).

A command is what one Raft entry carries: a version byte, a flags byte, and a list of operations that
apply atomically, in order, at one Raft index::

    command   = version u8 | flags u8 | body            (flags bit 0: body is an lz4 block)
    body      = count u32 | operation*
    operation = type u8 | length u32 | payload

Everything apply needs travels inside: store timestamps, hosts, target queues, delivery times. Apply never
reads a clock, a random number, the host name or the environment.

Payloads (all big-endian; ``str`` is ``u16 length + UTF-8``, ``bytes`` is ``u32 length + bytes``):

* MESSAGES: ``count u32`` then per message: topic str, queue_id i32, flag i32, sys_flag i32,
  born_timestamp i64, born_host (u8 length + bytes), store_timestamp i64, reconsume_times i32,
  prepared_transaction_offset i64, body bytes, properties bytes.
* CONSUMER_OFFSETS: ``count u32`` then group str, topic str, queue_id i32, offset i64.
* TOPIC_CONFIG: topic str, read_queue_nums i32, write_queue_nums i32, perm i32, topic_sys_flag i32,
  order u8, deleted u8.
* SUBSCRIPTION_GROUP: group str, consume_enable u8, consume_broadcast_enable u8, retry_max_times i32,
  broker_id i64, deleted u8, then consume_orderly u8 only when set.
* TRANSACTION_OP: half_offset i64, action u8 (1 commit, 2 rollback, 3 check, 4 discard), producer_group str,
  timestamp i64. (Issue: transactions) The real message and op record travel as MESSAGES in the same command.
* TIMER_PROGRESS: timer_key str, delivered_up_to i64. (Issue: delay/timer) A TIMER_PROGRESS under the key
  :data:`TIMER_RELEASE_KEY` is a :class:`TimerRelease` (release the timers due up to ``second``, from position
  ``start`` of them): its value is ``second * TIMER_RELEASE_STARTS + start``. Releases have always travelled
  so, and a replica of an older version reads them so: the operation has a type of its own in the code, not
  on the wire, so journals already written and members not yet upgraded agree with the new ones.
* RETENTION: min_physical_offset i64.
* LEADER_STAMP: term i64, node str, timestamp i64: the first command of a new leader's term.
* ACL_DOCUMENT: document bytes: the access-control rules every member enforces (canonical JSON written
  and read by ``broker.acl``; opaque here). Proposed by the leader when its ACL file changes.
* BYTE_CONFIG: ``count u16`` then per setting name str, value str (sorted by name): the local settings
  that shape stored bytes, as the group fixed them (:class:`ByteConfig`). The first leader of a group
  (or of a data directory from before it existed) proposes its own before anything else; the first one
  applied is the group's for good.
* RECORDS: plain messages already laid out as stored records by the leader (``commitlog.records``), so
  replicas patch two fields per record instead of encoding it: ``count u32``, stamp i64, store_host (8
  bytes), ``topic_count u16`` then topic str per topic, then ``count`` metas (``commitlog.records.META``:
  size u32, topic index u16, flags u8, queue_id i32, tag code i64, reconsume_times i32, key count u16),
  ``hash_count u32`` then each key-index hash u32, then the records (the rest of the payload). Apply
  refuses (as a no-op) a payload whose metas do not match its records.
* RECORDS_STORE_HOST_V6: RECORDS whose store host is IPv6 (20 bytes: address + port, in place of the 8),
  for a group whose ``store_host`` is ``[IPv6]:port``. (A type of its own, so that RECORDS stays as it was.)
* POP_RECEIVE, POP_ACK, POP_CHANGE_INVISIBLE, POP_REVIVE: pop consumption (``dledger.pop``, where the
  payloads are laid out). Each names a (group, topic, queue) and carries every time it needs, stamped by
  the leader with the group's time.
"""

from __future__ import annotations

import enum
import functools
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import lz4.block

from commitlog.config import StoreConfig
from commitlog.hosts import HOST_V4_BYTES, HOST_V6_BYTES, encode_address, format_address
from commitlog.message import MessageInput
from commitlog.records import HASH, META, PreparedRecords

COMMAND_VERSION: Final = 1
FLAG_LZ4: Final = 0x1
#: commands whose body is at least this large are lz4-compressed when that saves at least an eighth
COMPRESS_MIN_BYTES: Final = 4096
#: a decoded command may not claim more than this (guards decompression)
COMMAND_BYTES_MAX: Final = 64 << 20

U8 = struct.Struct(">B")
U16 = struct.Struct(">H")
U32 = struct.Struct(">I")
I64 = struct.Struct(">q")
OP_HEAD = struct.Struct(">BI")
MESSAGE_FIXED_A = struct.Struct(">iiiq")  # queue_id, flag, sys_flag, born_timestamp
MESSAGE_FIXED_B = struct.Struct(">qiq")  # store_timestamp, reconsume_times, prepared_transaction_offset
OFFSET_FIXED = struct.Struct(">iq")
TOPIC_FIXED = struct.Struct(">iiiiBB")
GROUP_FIXED = struct.Struct(">BBiqB")
I32 = struct.Struct(">i")
POP_RECEIVE_FIXED = struct.Struct(">qqqBI")  # start_offset, scan_end, invisible_until, fifo, offset count
POP_ACK_FIXED = struct.Struct(">qqBq")  # offset, handle_id, dead_letter, timestamp
POP_CHANGE_FIXED = struct.Struct(">qqqB")  # offset, handle_id, invisible_until, keep_handle
POP_REVIVE_FIXED = struct.Struct(">qiI")  # now, max_attempts, offset count
#: offsets one pop operation may name (a receive's batch, a revive's sweep)
POP_OFFSETS_MAX: Final = 1024


class OpType(enum.IntEnum):
    MESSAGES = 1
    CONSUMER_OFFSETS = 2
    TOPIC_CONFIG = 3
    SUBSCRIPTION_GROUP = 4
    TRANSACTION_OP = 5
    TIMER_PROGRESS = 6
    RETENTION = 7
    LEADER_STAMP = 8
    ACL_DOCUMENT = 9
    RECORDS = 10
    BYTE_CONFIG = 11
    POP_RECEIVE = 12
    POP_ACK = 13
    POP_CHANGE_INVISIBLE = 14
    POP_REVIVE = 15
    RECORDS_STORE_HOST_V6 = 16


class CommandError(ValueError):
    """Bytes that are not a valid command of a version we know. Apply turns it into a recorded no-op."""


@dataclass(frozen=True, slots=True)
class Messages:
    messages: tuple[MessageInput, ...]


@dataclass(frozen=True, slots=True)
class ConsumerOffset:
    group: str
    topic: str
    queue_id: int
    offset: int


@dataclass(frozen=True, slots=True)
class ConsumerOffsets:
    offsets: tuple[ConsumerOffset, ...]


@dataclass(frozen=True, slots=True)
class TopicConfig:
    topic: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int
    topic_sys_flag: int = 0
    order: bool = False
    deleted: bool = False


@dataclass(frozen=True, slots=True)
class SubscriptionGroup:
    group: str
    consume_enable: bool = True
    consume_broadcast_enable: bool = True
    retry_max_times: int = 16
    broker_id: int = 0
    deleted: bool = False
    #: a FIFO group of 5.x clients (RocketMQ's consumeMessageOrderly): pop delivers each queue in order.
    #: Encoded as a trailing byte only when set (commands of groups without it keep their bytes).
    consume_orderly: bool = False


class TransactionAction(enum.IntEnum):
    COMMIT = 1
    ROLLBACK = 2
    CHECK = 3
    DISCARD = 4


@dataclass(frozen=True, slots=True)
class TransactionOp:
    half_offset: int
    action: TransactionAction
    producer_group: str
    timestamp: int


#: the TIMER_PROGRESS key that carries a :class:`TimerRelease`
TIMER_RELEASE_KEY: Final = "timer-deliver"
#: a release's ``start`` is below this: its value on the wire is ``second * TIMER_RELEASE_STARTS + start``
TIMER_RELEASE_STARTS: Final = 1_000_000


@dataclass(frozen=True, slots=True)
class TimerProgress:
    """A delivery progress (a delay level's next queue offset, the transaction half queue's resolved
    prefix); never under :data:`TIMER_RELEASE_KEY`, which is a :class:`TimerRelease`'s."""

    timer_key: str
    delivered_up_to: int


@dataclass(frozen=True, slots=True)
class TimerRelease:
    """Release the timed messages due after the replicated timer progress and at or before ``second``
    (``dledger.timers``): at most ``TIMER_RELEASE_MAX`` of them, from position ``start`` in commit-log order."""

    second: int
    start: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.start < TIMER_RELEASE_STARTS:
            raise ValueError(f"a timer release starts in [0, {TIMER_RELEASE_STARTS}), not at {self.start}")

    @property
    def packed(self) -> int:
        """Its value on the wire, and in the replicated state's timer progress under TIMER_RELEASE_KEY."""
        return self.second * TIMER_RELEASE_STARTS + self.start

    @classmethod
    def unpacked(cls, packed: int) -> TimerRelease:
        return cls(*divmod(packed, TIMER_RELEASE_STARTS))


@dataclass(frozen=True, slots=True)
class Retention:
    min_physical_offset: int


@dataclass(frozen=True, slots=True)
class LeaderStamp:
    term: int
    node: str
    timestamp: int


@dataclass(frozen=True, slots=True)
class AclDocument:
    document: bytes


#: the store settings that change the bytes a member stores or what apply decides: where records and fillers
#: fall (segment size), what every record and message id carries (store host), which messages apply refuses
#: (body limit), and the layout of the derived files (consume-queue and key-index files). Every member must
#: have the group's values; the others (flush policy and interval, page cache) are each member's own.
BYTE_SETTINGS: Final = ("body_size_max_bytes", "consume_queue_units_per_file", "index_entry_capacity",
                        "index_slot_count", "segment_size_bytes", "store_host")


@dataclass(frozen=True, slots=True)
class ByteConfig:
    """The settings of :data:`BYTE_SETTINGS` as (name, value) pairs sorted by name, values as text.

    Carried by name, not by position, so a later version can add a setting: a setting one side has and the
    other lacks counts as a difference (a new setting needs a rule for groups whose configuration predates it)."""

    settings: tuple[tuple[str, str], ...]

    @classmethod
    def of(cls, config: StoreConfig) -> ByteConfig:
        """This member's own: the store host in its canonical spelling (``010.1.2.3`` is ``10.1.2.3``,
        ``[FD00:0::1]`` is ``[fd00::1]``), so members that spell one address differently agree."""
        values = {name: str(getattr(config, name)) for name in BYTE_SETTINGS}
        values["store_host"] = format_address(config.store_host_bytes)
        return cls(tuple(sorted(values.items())))

    @property
    def store_host_bytes(self) -> bytes | None:
        """The store host as records carry it (None when there is none or it is neither IPv4:port nor
        [IPv6]:port). Worked out once per configuration: every Records entry is checked against it."""
        return _store_host_of(self.settings)

    def differences(self, group: ByteConfig) -> list[tuple[str, str | None, str | None]]:
        """(setting, ours, the group's) for each setting that differs, by name; None where one side lacks it."""
        ours, theirs = dict(self.settings), dict(group.settings)
        return [(name, ours.get(name), theirs.get(name)) for name in sorted(ours.keys() | theirs.keys())
                if ours.get(name) != theirs.get(name)]


@functools.lru_cache(maxsize=8)
def _store_host_of(settings: tuple[tuple[str, str], ...]) -> bytes | None:
    try:
        return encode_address(dict(settings).get("store_host", ""))
    except ValueError:
        return None


@dataclass(frozen=True, slots=True)
class PopReceive:
    """Hand out ``offsets`` of a queue to a consumer of ``group`` until ``invisible_until`` (ms, the group's
    time). ``offsets`` are redeliveries (entries the state holds as revived) and new offsets in
    [``start_offset``, ``scan_end``): the leader read the queue from the cursor it saw (``start_offset``) up
    to ``scan_end`` and kept what the filter selects; the new ones count only if the cursor is still there."""

    group: str
    topic: str
    queue_id: int
    start_offset: int
    scan_end: int
    offsets: tuple[int, ...]
    invisible_until: int
    fifo: bool = False


@dataclass(frozen=True, slots=True)
class PopAck:
    """Acknowledge the in-flight offset whose handle is ``handle_id``; ``dead_letter``: and store it in
    the group's dead-letter queue (ForwardMessageToDeadLetterQueue)."""

    group: str
    topic: str
    queue_id: int
    offset: int
    handle_id: int
    dead_letter: bool = False
    #: the leader's time (the dead-letter message's store timestamp)
    timestamp: int = 0


@dataclass(frozen=True, slots=True)
class PopChangeInvisible:
    """A new invisible time for the in-flight offset whose handle is ``handle_id``: with a new receipt
    handle (ChangeInvisibleDuration), or keeping it (``keep_handle``: the renewal of an auto-renewed receive,
    whose client still holds the handle)."""

    group: str
    topic: str
    queue_id: int
    offset: int
    handle_id: int
    invisible_until: int
    keep_handle: bool = False


@dataclass(frozen=True, slots=True)
class PopRevive:
    """In-flight offsets whose invisible time passed by ``now``: receivable again with one attempt more,
    or, past ``max_attempts``, stored in the group's dead-letter queue and forgotten."""

    group: str
    topic: str
    queue_id: int
    offsets: tuple[int, ...]
    now: int
    max_attempts: int


PopOperation = PopReceive | PopAck | PopChangeInvisible | PopRevive

Operation = (
    Messages | ConsumerOffsets | TopicConfig | SubscriptionGroup | TransactionOp | TimerProgress | TimerRelease
    | Retention | LeaderStamp | AclDocument | PreparedRecords | ByteConfig | PopReceive | PopAck | PopChangeInvisible
    | PopRevive
)


@dataclass(frozen=True, slots=True)
class Command:
    operations: tuple[Operation, ...]


# ---------------------------------------------------------------------------------------------- encoding


def _str(value: str) -> bytes:
    encoded = value.encode()
    return U16.pack(len(encoded)) + encoded


def _bytes(value: bytes) -> bytes:
    return U32.pack(len(value)) + value


def _encode_messages(operation: Messages, store_timestamp: int | None = None) -> bytes:
    parts = [U32.pack(len(operation.messages))]
    for message in operation.messages:
        timestamp = message.store_timestamp if store_timestamp is None else store_timestamp
        parts += (
            _str(message.topic),
            MESSAGE_FIXED_A.pack(message.queue_id, message.flag, message.sys_flag, message.born_timestamp),
            U8.pack(len(message.born_host)),
            message.born_host,
            MESSAGE_FIXED_B.pack(timestamp, message.reconsume_times, message.prepared_transaction_offset),
            U32.pack(len(message.body)),
            message.body,
            U32.pack(len(message.properties)),
            message.properties,
        )
    return b"".join(parts)


def _encode_operation(operation: Operation) -> tuple[OpType, bytes]:
    match operation:
        case Messages():
            return OpType.MESSAGES, _encode_messages(operation)
        case ConsumerOffsets(offsets):
            return OpType.CONSUMER_OFFSETS, U32.pack(len(offsets)) + b"".join(
                _str(o.group) + _str(o.topic) + OFFSET_FIXED.pack(o.queue_id, o.offset) for o in offsets
            )
        case TopicConfig():
            return OpType.TOPIC_CONFIG, _str(operation.topic) + TOPIC_FIXED.pack(
                operation.read_queue_nums, operation.write_queue_nums, operation.perm, operation.topic_sys_flag,
                operation.order, operation.deleted,
            )
        case SubscriptionGroup():
            return OpType.SUBSCRIPTION_GROUP, _str(operation.group) + GROUP_FIXED.pack(
                operation.consume_enable, operation.consume_broadcast_enable, operation.retry_max_times,
                operation.broker_id, operation.deleted,
            ) + (U8.pack(1) if operation.consume_orderly else b"")
        case TransactionOp():
            return OpType.TRANSACTION_OP, (
                I64.pack(operation.half_offset) + U8.pack(operation.action) + _str(operation.producer_group)
                + I64.pack(operation.timestamp)
            )
        case TimerProgress():
            if operation.timer_key == TIMER_RELEASE_KEY:
                raise ValueError(f"a timer progress under {TIMER_RELEASE_KEY!r} is a TimerRelease")
            return OpType.TIMER_PROGRESS, _str(operation.timer_key) + I64.pack(operation.delivered_up_to)
        case TimerRelease():
            return OpType.TIMER_PROGRESS, _str(TIMER_RELEASE_KEY) + I64.pack(operation.packed)
        case Retention():
            return OpType.RETENTION, I64.pack(operation.min_physical_offset)
        case LeaderStamp():
            return OpType.LEADER_STAMP, I64.pack(operation.term) + _str(operation.node) + I64.pack(operation.timestamp)
        case AclDocument(document):
            return OpType.ACL_DOCUMENT, _bytes(document)
        case ByteConfig(settings):
            return OpType.BYTE_CONFIG, U16.pack(len(settings)) + b"".join(
                _str(name) + _str(value) for name, value in settings)
        case PreparedRecords():
            return _records_kind(operation)[0], _encode_records(operation)
        case PopReceive():
            return OpType.POP_RECEIVE, _pop_key(operation) + POP_RECEIVE_FIXED.pack(
                operation.start_offset, operation.scan_end, operation.invisible_until, operation.fifo,
                len(operation.offsets)) + b"".join(I64.pack(offset) for offset in operation.offsets)
        case PopAck():
            return OpType.POP_ACK, _pop_key(operation) + POP_ACK_FIXED.pack(
                operation.offset, operation.handle_id, operation.dead_letter, operation.timestamp)
        case PopChangeInvisible():
            return OpType.POP_CHANGE_INVISIBLE, _pop_key(operation) + POP_CHANGE_FIXED.pack(
                operation.offset, operation.handle_id, operation.invisible_until, operation.keep_handle)
        case PopRevive():
            return OpType.POP_REVIVE, _pop_key(operation) + POP_REVIVE_FIXED.pack(
                operation.now, operation.max_attempts, len(operation.offsets)) + b"".join(
                I64.pack(offset) for offset in operation.offsets)
    raise TypeError(f"not an operation: {operation!r}")  # pragma: no cover - exhaustive above


def _pop_key(operation: PopOperation) -> bytes:
    return _str(operation.group) + _str(operation.topic) + I32.pack(operation.queue_id)


_RECORDS_HEAD = struct.Struct(">Iq8sH")  # count, stamp, store host, topic count
_RECORDS_HEAD_STORE_HOST_V6 = struct.Struct(">Iq20sH")  # the same with an IPv6 store host
#: the operation type and head of a Records operation, by the width of its store host
_RECORDS_HEADS: Final = {HOST_V4_BYTES: (OpType.RECORDS, _RECORDS_HEAD),
                         HOST_V6_BYTES: (OpType.RECORDS_STORE_HOST_V6, _RECORDS_HEAD_STORE_HOST_V6)}


def _records_kind(batch: PreparedRecords) -> tuple[OpType, struct.Struct]:
    """RECORDS or RECORDS_STORE_HOST_V6 and its head; ValueError for a store host of neither width."""
    known = _RECORDS_HEADS.get(len(batch.store_host))
    if known is None:
        raise ValueError(f"a store host is 8 or 20 bytes, got {len(batch.store_host)}")
    return known


def _records_head(batch: PreparedRecords) -> list[bytes]:
    """A Records operation's payload up to its records."""
    head = [_records_kind(batch)[1].pack(batch.record_count, batch.store_timestamp, batch.store_host, len(batch.topics))]
    head += (_str(topic) for topic in batch.topics)
    head += (batch.metas, U32.pack(len(batch.key_hashes) // HASH.size), batch.key_hashes)
    return head


def _encode_records(batch: PreparedRecords) -> bytes:
    return b"".join([*_records_head(batch), batch.records])


def encode_command(command: Command, compress: bool = True) -> bytes:
    """Encode ``command``; struct.error / ValueError when a field does not fit (callers validate first)."""
    parts = [U32.pack(len(command.operations))]
    for operation in command.operations:
        op_type, payload = _encode_operation(operation)
        parts.append(OP_HEAD.pack(op_type, len(payload)))
        parts.append(payload)
    return _frame(b"".join(parts), compress)


def encode_messages_command(messages: Sequence[MessageInput], store_timestamp: int, compress: bool = True) -> bytes:
    """A command of one Messages operation whose messages all get ``store_timestamp`` (the leader's
    stamp), without building new message objects."""
    payload = _encode_messages(Messages(tuple(messages)), store_timestamp)
    return _frame(U32.pack(1) + OP_HEAD.pack(OpType.MESSAGES, len(payload)) + payload, compress)


def stamped_messages_command(messages: Sequence[MessageInput], store_timestamp: int) -> Command:
    """The command :func:`encode_messages_command` encodes: what decoding its bytes gives."""
    return Command((Messages(tuple(message if message.store_timestamp == store_timestamp
                                   else message._replace(store_timestamp=store_timestamp) for message in messages)),))


def encode_records_command(batch: PreparedRecords, compress: bool = True, prefix: bytes = b"") -> bytes:
    """A command of one Records operation, after ``prefix`` (how the caller stores commands: the same bytes
    as ``prefix + encode_records_command(batch)``). Uncompressed, the records are copied once, by one join:
    joining the payload, the operation and the frame one after another copied the whole entry
    three times more, and prepending the prefix a fourth, all of it on the leader."""
    head = _records_head(batch)
    payload_length = sum(map(len, head)) + len(batch.records)
    operation = [U32.pack(1), OP_HEAD.pack(_records_kind(batch)[0], payload_length), *head, batch.records]
    if compress and sum(map(len, operation[:2])) + payload_length >= COMPRESS_MIN_BYTES:
        compressed = _compressed(b"".join(operation))
        if compressed is not None:
            return prefix + compressed
    return b"".join([prefix, bytes((COMMAND_VERSION, 0)), *operation])


def _frame(body: bytes, compress: bool) -> bytes:
    if compress and len(body) >= COMPRESS_MIN_BYTES:
        compressed = _compressed(body)
        if compressed is not None:
            return compressed
    return bytes((COMMAND_VERSION, 0)) + body


def _compressed(body: bytes) -> bytes | None:
    """``body`` framed lz4-compressed, or None when that saves less than an eighth."""
    compressed = bytes(lz4.block.compress(body, store_size=True))
    if len(compressed) <= len(body) - len(body) // 8:
        return bytes((COMMAND_VERSION, FLAG_LZ4)) + compressed
    return None


# ---------------------------------------------------------------------------------------------- decoding


class _Reader:
    """Reads ``data[position:end]`` without copying it first."""

    __slots__ = ("data", "end", "position")

    def __init__(self, data: bytes, position: int = 0, end: int | None = None) -> None:
        self.data = data
        self.position = position
        self.end = len(data) if end is None else end

    def take(self, size: int) -> bytes:
        end = self.position + size
        if size < 0 or end > self.end:
            raise CommandError(f"truncated command: need {size} bytes at {self.position}")
        chunk = self.data[self.position : end]
        self.position = end
        return chunk

    def skip(self, size: int) -> int:
        """Move past ``size`` bytes (bounds checked, nothing copied); returns where they start."""
        start = self.position
        if size < 0 or start + size > self.end:
            raise CommandError(f"truncated command: need {size} bytes at {start}")
        self.position = start + size
        return start

    def unpack(self, layout: struct.Struct) -> tuple[int, ...]:
        values: tuple[int, ...] = layout.unpack(self.take(layout.size))
        return values

    def string(self) -> str:
        (length,) = self.unpack(U16)
        try:
            return self.take(length).decode()
        except UnicodeDecodeError as exc:
            raise CommandError("string is not UTF-8") from exc

    def blob(self) -> bytes:
        (length,) = self.unpack(U32)
        return self.take(length)

    def done(self) -> None:
        if self.position != self.end:
            raise CommandError(f"{self.end - self.position} trailing bytes")


_MESSAGE_FIXED_B_BODY = struct.Struct(">qiqI")  # MESSAGE_FIXED_B and the body's length


def _decode_messages(reader: _Reader) -> Messages:
    """The hot path of a follower's apply: offsets computed from declared lengths, one ``unpack_from``
    per fixed part. A slice past the end is shorter than declared, so the position then ends up past the
    end and the whole operation is refused as truncated."""
    data = reader.data
    end = reader.end
    position = reader.position
    unpack_u16 = U16.unpack_from
    unpack_u32 = U32.unpack_from
    unpack_a = MESSAGE_FIXED_A.unpack_from
    unpack_b = _MESSAGE_FIXED_B_BODY.unpack_from
    messages: list[MessageInput] = []
    append = messages.append
    try:
        (count,) = unpack_u32(data, position)
        position += 4
        if count > end:
            raise CommandError(f"message count {count} exceeds the payload")
        for _ in range(count):
            (topic_length,) = unpack_u16(data, position)
            topic_end = position + 2 + topic_length
            topic = data[position + 2 : topic_end].decode()
            queue_id, flag, sys_flag, born_timestamp = unpack_a(data, topic_end)
            host_start = topic_end + 21
            position = host_start + data[topic_end + 20]
            born_host = data[host_start:position]
            store_timestamp, reconsume_times, prepared, body_length = unpack_b(data, position)
            body_start = position + 24
            body_end = body_start + body_length
            (properties_length,) = unpack_u32(data, body_end)
            position = body_end + 4 + properties_length
            append(MessageInput(topic, queue_id, flag, sys_flag, born_timestamp, born_host, store_timestamp,
                                reconsume_times, prepared, data[body_start:body_end], data[body_end + 4 : position]))
    except (struct.error, IndexError) as exc:
        raise CommandError(f"truncated command: {exc}") from None
    except UnicodeDecodeError as exc:
        raise CommandError("string is not UTF-8") from exc
    if position > end:
        raise CommandError(f"truncated command: messages end at {position} of {end} bytes")
    reader.position = position
    return Messages(tuple(messages))


def _decode_records(reader: _Reader, head: struct.Struct) -> PreparedRecords:
    """The metas, hashes and records stay packed slices (apply reads them as columns). Whether they agree
    with each other is for apply to check (``commitlog.records.check_layout``)."""
    count, store_timestamp, store_host, topic_count = head.unpack(reader.take(head.size))
    topics = tuple(reader.string() for _ in range(topic_count))
    if count * META.size > reader.end - reader.position:
        raise CommandError(f"{count} record metas exceed the payload")
    metas = reader.take(count * META.size)
    (hash_count,) = reader.unpack(U32)
    if hash_count * HASH.size > reader.end - reader.position:
        raise CommandError(f"{hash_count} key hashes exceed the payload")
    hashes = reader.take(hash_count * HASH.size)
    records = reader.take(reader.end - reader.position)
    return PreparedRecords(store_timestamp, store_host, topics, metas, hashes, records)


def _decode_operation(op_type: int, reader: _Reader) -> Operation:
    if op_type == OpType.MESSAGES:
        return _decode_messages(reader)
    if op_type == OpType.RECORDS:
        return _decode_records(reader, _RECORDS_HEAD)
    if op_type == OpType.RECORDS_STORE_HOST_V6:
        return _decode_records(reader, _RECORDS_HEAD_STORE_HOST_V6)
    if op_type == OpType.CONSUMER_OFFSETS:
        (count,) = reader.unpack(U32)
        if count > reader.end:
            raise CommandError(f"offset count {count} exceeds the payload")
        offsets = []
        for _ in range(count):
            group, topic = reader.string(), reader.string()
            queue_id, offset = reader.unpack(OFFSET_FIXED)
            offsets.append(ConsumerOffset(group, topic, queue_id, offset))
        return ConsumerOffsets(tuple(offsets))
    if op_type == OpType.TOPIC_CONFIG:
        topic = reader.string()
        read, write, perm, sys_flag, order, deleted = reader.unpack(TOPIC_FIXED)
        return TopicConfig(topic, read, write, perm, sys_flag, bool(order), bool(deleted))
    if op_type == OpType.SUBSCRIPTION_GROUP:
        group = reader.string()
        enable, broadcast, retry, broker_id, deleted = reader.unpack(GROUP_FIXED)
        orderly = reader.unpack(U8)[0] if reader.position < reader.end else 0
        return SubscriptionGroup(group, bool(enable), bool(broadcast), retry, broker_id, bool(deleted), bool(orderly))
    if op_type == OpType.TRANSACTION_OP:
        (half_offset,) = reader.unpack(I64)
        (action,) = reader.unpack(U8)
        if action not in TransactionAction.__members__.values():
            raise CommandError(f"unknown transaction action {action}")
        group = reader.string()
        (timestamp,) = reader.unpack(I64)
        return TransactionOp(half_offset, TransactionAction(action), group, timestamp)
    if op_type == OpType.TIMER_PROGRESS:
        key = reader.string()
        (delivered,) = reader.unpack(I64)
        return TimerRelease.unpacked(delivered) if key == TIMER_RELEASE_KEY else TimerProgress(key, delivered)
    if op_type == OpType.RETENTION:
        (offset,) = reader.unpack(I64)
        return Retention(offset)
    if op_type == OpType.LEADER_STAMP:
        (term,) = reader.unpack(I64)
        node = reader.string()
        (timestamp,) = reader.unpack(I64)
        return LeaderStamp(term, node, timestamp)
    if op_type == OpType.ACL_DOCUMENT:
        return AclDocument(reader.blob())
    if op_type == OpType.BYTE_CONFIG:
        (count,) = reader.unpack(U16)
        settings = tuple((reader.string(), reader.string()) for _ in range(count))
        if [name for name, _ in settings] != sorted({name for name, _ in settings}):
            raise CommandError("byte configuration settings are not sorted by name, or repeat one")
        return ByteConfig(settings)
    if op_type in (OpType.POP_RECEIVE, OpType.POP_ACK, OpType.POP_CHANGE_INVISIBLE, OpType.POP_REVIVE):
        return _decode_pop(op_type, reader)
    raise CommandError(f"unknown operation type {op_type}")


def _pop_offsets(reader: _Reader, count: int) -> tuple[int, ...]:
    if count > POP_OFFSETS_MAX:
        raise CommandError(f"{count} offsets exceed the {POP_OFFSETS_MAX} one pop operation may name")
    return tuple(reader.unpack(I64)[0] for _ in range(count))


def _decode_pop(op_type: int, reader: _Reader) -> PopOperation:
    group, topic = reader.string(), reader.string()
    (queue_id,) = reader.unpack(I32)
    if op_type == OpType.POP_RECEIVE:
        start, scan_end, invisible_until, fifo, count = reader.unpack(POP_RECEIVE_FIXED)
        return PopReceive(group, topic, queue_id, start, scan_end, _pop_offsets(reader, count), invisible_until,
                          bool(fifo))
    if op_type == OpType.POP_ACK:
        offset, handle_id, dead_letter, timestamp = reader.unpack(POP_ACK_FIXED)
        return PopAck(group, topic, queue_id, offset, handle_id, bool(dead_letter), timestamp)
    if op_type == OpType.POP_CHANGE_INVISIBLE:
        offset, handle_id, invisible_until, keep = reader.unpack(POP_CHANGE_FIXED)
        return PopChangeInvisible(group, topic, queue_id, offset, handle_id, invisible_until, bool(keep))
    now, max_attempts, count = reader.unpack(POP_REVIVE_FIXED)
    return PopRevive(group, topic, queue_id, _pop_offsets(reader, count), now, max_attempts)


def decode_command(data: bytes) -> Command:
    """Decode a command; :class:`CommandError` for anything malformed or of an unknown version."""
    if len(data) < 2:
        raise CommandError("command shorter than its header")
    version, flags = data[0], data[1]
    if version != COMMAND_VERSION:
        raise CommandError(f"unsupported command version {version}")
    if flags & ~FLAG_LZ4:
        raise CommandError(f"unknown command flags {flags:#x}")
    if flags & FLAG_LZ4:
        if len(data) < 6 or int.from_bytes(data[2:6], "little") > COMMAND_BYTES_MAX:
            raise CommandError("compressed command claims an impossible size")
        try:
            reader = _Reader(bytes(lz4.block.decompress(memoryview(data)[2:])))
        except lz4.block.LZ4BlockError as exc:
            raise CommandError(f"corrupt lz4 body: {exc}") from exc
    else:
        reader = _Reader(data, 2)
    (count,) = reader.unpack(U32)
    if count > reader.end:
        raise CommandError(f"operation count {count} exceeds the command")
    operations = []
    for _ in range(count):
        op_type, length = reader.unpack(OP_HEAD)
        start = reader.skip(length)  # the payload is read in place
        payload = _Reader(reader.data, start, start + length)
        operations.append(_decode_operation(op_type, payload))
        payload.done()
    reader.done()
    return Command(tuple(operations))


def messages_command(messages: Sequence[MessageInput]) -> Command:
    return Command((Messages(tuple(messages)),))
