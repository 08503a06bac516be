"""Prepared records: a batch of messages already laid out as stored records, so replicas do not encode them.

The leader builds the records once (:class:`RecordBuilder`): every field of the stored record is filled in
except the two that depend on where apply puts it, the queue offset and the physical offset, which are
zero. Next to the records travels what dispatch needs per record (its size, topic, queue, tag code,
reconsume count and key-index hashes), so a replica's apply patches two fields per record, writes the
records as one chunk and dispatches from these figures: no decoding of properties, no CRC of bodies,
no record encoding (:meth:`commitlog.store.MessageStore.append_records`).

Only plain messages are prepared. A batch with anything the store treats specially (a prepared or
rolled-back transaction message, an excluded topic such as the timer topic, a property name given twice,
a message the store would refuse) is not prepared, and goes as plain messages instead. The stored bytes
are the same either way (tested).
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Collection, Sequence
from typing import Final, NamedTuple

import numpy as np
import numpy.typing as npt

from commitlog.dispatch import DISPATCH_PROPERTY
from commitlog.hosts import HOST_V4_BYTES, HOST_V6_BYTES, HOST_V6_EXTRA_BYTES
from commitlog.message import MessageInput
from commitlog.record_codec import BODY_AT_V4, FILLER_HEADER_BYTES, MESSAGE_MAGIC, pack_record, stored_size
from commitlog.record_codec import crc32 as _crc32
from commitlog.sys_flags import TRANSACTION_COMMIT_TYPE, TRANSACTION_PREPARED_TYPE, TRANSACTION_ROLLBACK_TYPE
from commitlog.tag_codes import cached_tag_code
from protocol.invariant import invariant
from protocol.properties import PROPERTIES_BYTES_MAX, find_uniq_key
from protocol.topics import check_topic_name

try:  # the record builder in C (setup.py builds it where a compiler is; the Python one below is the reference)
    from commitlog import _native
except ImportError:  # pragma: no cover - a machine that could not build it
    _native = None  # type: ignore[assignment]

#: per record: size, topic (index into the batch's topics), flags, queue id, tag code, reconsume count,
#: number of key-index hashes
META: Final = struct.Struct(">IHBiqiH")
#: :data:`META` as a numpy record, so replicas read a batch's metas as columns without a per-record step
META_DTYPE: Final = np.dtype([("size", ">u4"), ("topic", ">u2"), ("flags", "u1"), ("queue", ">i4"),
                              ("tag", ">i8"), ("reconsume", ">i4"), ("keys", ">u2")])
invariant(META_DTYPE.itemsize == META.size, "the meta dtype is the meta struct")
#: one key-index hash (CRC32) of a batch
HASH: Final = struct.Struct(">I")
HASH_DTYPE: Final = np.dtype(">u4")
#: meta flags
HAS_UNIQ_KEY: Final = 0x1  # the record's first key-index hash is its UNIQ_KEY's
BORN_HOST_V6: Final = 0x2  # the record's born host is IPv6 (12 bytes more of head; the store host is the batch's)
FLAGS_KNOWN: Final = HAS_UNIQ_KEY | BORN_HOST_V6
#: the queue offset and physical offset of a record, adjacent at QUEUE_OFFSET_AT
OFFSETS: Final = struct.Struct(">qq")
QUEUE_OFFSET_AT: Final = 20
#: where the store timestamp sits for an IPv4 / IPv6 born host (it comes before the store host, so that
#: one does not move it)
STORE_TIMESTAMP_AT: Final = (56, 68)
_I64: Final = struct.Struct(">q")
_SIZE_MAGIC: Final = struct.Struct(">iI")
_INT16: Final = struct.Struct(">h")
_BODY_LENGTH: Final = struct.Struct(">i")
#: bounds the topic and tag-code caches of a builder
CACHE_ENTRIES_MAX: Final = 100_000


#: prepared (0x4) and rolled-back (0xC) transaction messages are the ones with this sys_flag bit
_SPECIAL_TRANSACTION_BIT: Final = TRANSACTION_PREPARED_TYPE
invariant(_native is None or (MESSAGE_MAGIC, PROPERTIES_BYTES_MAX, META.size, HAS_UNIQ_KEY, BORN_HOST_V6)
          == (_native.MESSAGE_MAGIC, _native.PROPERTIES_BYTES_MAX, _native.META_BYTES, _native.HAS_UNIQ_KEY,
              _native.BORN_HOST_V6), "the C record builder has the constants of this module")
invariant(bool(TRANSACTION_ROLLBACK_TYPE & _SPECIAL_TRANSACTION_BIT)
          and not TRANSACTION_COMMIT_TYPE & _SPECIAL_TRANSACTION_BIT, "prepared and rollback share a bit commit lacks")


class PreparedRecords(NamedTuple):
    """Records laid out by the leader, with queue and physical offsets still zero."""

    #: the store timestamp every record carries
    store_timestamp: int
    #: the store host every record carries: 8 bytes (IPv4 + port) or 20 (IPv6 + port, sysFlag 0x20 in each
    #: record), the same for the whole batch
    store_host: bytes
    topics: tuple[str, ...]
    #: one packed :data:`META` per record, in order (:func:`meta_list` unpacks them, :data:`META_DTYPE` as columns)
    metas: bytes
    #: the key-index hashes of all records, in order, packed as :data:`HASH` (each record's count is in its meta)
    key_hashes: bytes
    #: the records, back to back
    records: bytes

    @property
    def record_count(self) -> int:
        """How many records the batch holds."""
        return len(self.metas) // META.size


class RecordMeta(NamedTuple):
    """One record's :data:`META`, unpacked."""

    size: int
    #: index into the batch's topics
    topic_index: int
    #: :data:`HAS_UNIQ_KEY`, :data:`BORN_HOST_V6`
    flags: int
    queue_id: int
    tag_code: int
    reconsume_times: int
    #: how many of the batch's key-index hashes are this record's
    key_count: int


#: a :class:`RecordMeta` from the tuple :data:`META` unpacks to, without the keyword handling of its
#: constructor (apply unpacks every record's meta of a small batch)
_new_meta: Final = functools.partial(tuple.__new__, RecordMeta)


def meta_list(batch: PreparedRecords) -> list[RecordMeta]:
    """The metas of ``batch``, in order."""
    return list(map(_new_meta, META.iter_unpack(batch.metas)))


def hash_list(batch: PreparedRecords) -> list[int]:
    """The key-index hashes of ``batch`` as ints."""
    return [key_hash for (key_hash,) in HASH.iter_unpack(batch.key_hashes)]


def pack_metas(metas: Sequence[tuple[int, int, int, int, int, int, int]]) -> bytes:
    return b"".join([META.pack(*meta) for meta in metas])


def pack_hashes(hashes: Sequence[int]) -> bytes:
    return struct.pack(f">{len(hashes)}I", *hashes)


#: batches of at least this many records (or key-index entries) are handled column-wise with numpy. In
#: apply, column-wise work costs a fixed amount per batch and little per record, one by one more per record
#: and nothing per batch: from about this size on, column-wise is cheaper. Small batches, the rule at low
#: load, where commit latency matters, go record by record
COLUMNS_MIN = 64


def columnwise(count: int) -> bool:
    """Whether ``count`` records (or index entries) are handled column-wise."""
    return count >= COLUMNS_MIN


class Layout(NamedTuple):
    """A batch's metas as columns, with where each record starts in ``records``."""

    metas: npt.NDArray[np.void]
    sizes: npt.NDArray[np.int64]
    starts: npt.NDArray[np.int64]
    #: where each record's key-index hashes start in ``key_hashes``
    key_starts: npt.NDArray[np.int64]


def layout_of(batch: PreparedRecords) -> Layout:
    """The columns of a batch whose lengths are whole metas and hashes (``check_layout`` checks them)."""
    metas = np.frombuffer(batch.metas, META_DTYPE)
    sizes = metas["size"].astype(np.int64)
    ends = sizes.cumsum()
    key_counts = metas["keys"].astype(np.int64)
    return Layout(metas, sizes, ends - sizes, key_counts.cumsum() - key_counts)


def gather(data: npt.NDArray[np.uint8], at: npt.NDArray[np.int64], width: int) -> npt.NDArray[np.uint8]:
    """``width`` bytes of ``data`` from each position in ``at``, one row each."""
    rows: npt.NDArray[np.uint8] = data[at[:, None] + np.arange(width)]
    return rows


def scatter(data: npt.NDArray[np.uint8], at: npt.NDArray[np.int64], rows: npt.NDArray[np.uint8]) -> None:
    """Write each row of ``rows`` into ``data`` at the matching position of ``at``."""
    data[at[:, None] + np.arange(rows.shape[1])] = rows


def body_at_in_batch(flags: int, store_host: bytes) -> int:
    """Where the body of a record of a batch starts, from its meta ``flags`` and the batch's store host."""
    return (BODY_AT_V4 + (HOST_V6_EXTRA_BYTES if flags & BORN_HOST_V6 else 0)
            + (HOST_V6_EXTRA_BYTES if len(store_host) == HOST_V6_BYTES else 0))


def uniq_key_of(batch: PreparedRecords, start: int, flags: int) -> bytes | None:
    """The UNIQ_KEY of the record of ``batch`` at ``start`` with meta ``flags`` (None when it has none): read
    from its properties."""
    records = batch.records
    head = body_at_in_batch(flags, batch.store_host)
    (body_length,) = _BODY_LENGTH.unpack_from(records, start + head - 4)
    topic_at = start + head + body_length
    properties_at = topic_at + 1 + records[topic_at]
    (properties_length,) = _INT16.unpack_from(records, properties_at)
    properties = bytes(records[properties_at + 2 : properties_at + 2 + properties_length])
    return find_uniq_key(properties)


def check_layout(batch: PreparedRecords) -> str | None:
    """Why ``batch`` is not consistent (record sizes against the records, key counts against the hashes,
    topic indexes, flags), or None. Column-wise over the metas: apply refuses an inconsistent batch whole.
    The first record that fails is named, with the first of its checks that fails."""
    records = batch.records
    end = len(records)
    if len(batch.metas) % META.size or len(batch.key_hashes) % HASH.size:
        return f"{len(batch.metas)} bytes of metas and {len(batch.key_hashes)} of key hashes are not whole"
    if not columnwise(batch.record_count):
        return _check_each(batch)
    layout = layout_of(batch)
    metas, sizes, starts = layout.metas, layout.sizes, layout.starts
    count = len(sizes)
    size_bad = (sizes < _smallest_record(batch)) | (starts + sizes > end)
    sized = int(np.argmax(size_bad)) if size_bad.any() else count  # records before this one lie within
    if sized:
        head = gather(np.frombuffer(records, np.uint8), starts[:sized], 8).view(">u4")
        bad = ((head[:, 0] != sizes[:sized]) | (head[:, 1] != MESSAGE_MAGIC)
               | (metas["topic"][:sized] >= len(batch.topics)) | (metas["flags"][:sized] & (0xFF & ~FLAGS_KNOWN) != 0))
        if bad.any():
            first = int(np.argmax(bad))
            position = int(starts[first])
            total, magic = (int(value) for value in head[first])
            if total != sizes[first] or magic != MESSAGE_MAGIC:
                return f"the record at {position} does not match its meta (size {total}, magic {magic:#x})"
            return (f"the record at {position} names topic {metas['topic'][first]} of {len(batch.topics)} "
                    f"with flags {metas['flags'][first]:#x}")
    if sized < count:
        return f"record of {sizes[sized]} bytes at {starts[sized]} runs past the {end} bytes of records"
    return _check_totals(batch, int(starts[-1] + sizes[-1]) if count else 0, int(metas["keys"].sum()))


def _check_each(batch: PreparedRecords) -> str | None:
    """:func:`check_layout` record by record (the same answers)."""
    records = batch.records
    position = 0
    keys = 0
    topics = len(batch.topics)
    unpack = _SIZE_MAGIC.unpack_from
    end = len(records)
    smallest = _smallest_record(batch)
    for size, topic_index, flags, _, _, _, key_count in META.iter_unpack(batch.metas):
        if size < smallest or position + size > end:
            return f"record of {size} bytes at {position} runs past the {end} bytes of records"
        total, magic = unpack(records, position)
        if total != size or magic != MESSAGE_MAGIC:
            return f"the record at {position} does not match its meta (size {total}, magic {magic:#x})"
        if topic_index >= topics or flags & ~FLAGS_KNOWN:
            return f"the record at {position} names topic {topic_index} of {topics} with flags {flags:#x}"
        position += size
        keys += key_count
    return _check_totals(batch, position, keys)


def _smallest_record(batch: PreparedRecords) -> int:
    """The least a record of ``batch`` can take: its head with an IPv4 born host (and the batch's store host)."""
    return body_at_in_batch(0, batch.store_host)


def _check_totals(batch: PreparedRecords, records_end: int, keys: int) -> str | None:
    """The checks of a batch as a whole, once its records checked out up to ``records_end``."""
    end = len(batch.records)
    if records_end != end:
        return f"{end - records_end} bytes of records past the last one"
    hash_count = len(batch.key_hashes) // HASH.size
    if keys != hash_count:
        return f"metas count {keys} key hashes, {hash_count} travel"
    if len(batch.store_host) not in (HOST_V4_BYTES, HOST_V6_BYTES):
        return f"store host of {len(batch.store_host)} bytes"
    return None


def restamp(records: bytearray, layout: Layout, store_timestamp: int) -> None:
    """Set every record's store timestamp to ``stamp`` (apply raised the batch's stamp to the floor)."""
    at = layout.starts + np.where(layout.metas["flags"] & BORN_HOST_V6, STORE_TIMESTAMP_AT[1], STORE_TIMESTAMP_AT[0])
    row = np.frombuffer(_I64.pack(store_timestamp), np.uint8)
    scatter(np.frombuffer(records, np.uint8), at, np.broadcast_to(row, (len(at), 8)))


class RecordBuilder:
    """Lays out batches of plain messages as records (the leader, before proposing). Not thread-safe."""

    def __init__(self, store_host: bytes, segment_size_bytes: int, body_size_max_bytes: int,
                 excluded_topics: Collection[str] = ()) -> None:
        self.store_host = store_host
        self.segment_size_bytes = segment_size_bytes
        self.body_size_max_bytes = body_size_max_bytes
        self.excluded_topics = frozenset(excluded_topics)
        # topic -> (length byte + bytes, CRC of "topic#"), or None when the store would refuse it
        self._topics: dict[str, tuple[bytes, int] | None] = {}
        self._tag_codes: dict[bytes, int] = {}

    def _topic(self, topic: str) -> tuple[bytes, int] | None:
        if topic in self._topics:
            return self._topics[topic]
        entry: tuple[bytes, int] | None = None
        if topic not in self.excluded_topics and check_topic_name(topic) is None:
            encoded = topic.encode()
            entry = (bytes((len(encoded),)) + encoded, _crc32(encoded + b"#"))
        if len(self._topics) < CACHE_ENTRIES_MAX:
            self._topics[topic] = entry
        return entry

    def build(self, messages: Sequence[MessageInput], store_timestamp: int) -> PreparedRecords | None:
        """The records of ``messages``, all stamped ``stamp``; None when the batch must go as messages. Laid
        out in C where commitlog._native is built (the same bytes: it hands anything it is not sure of to
        :meth:`build_python`, which decides)."""
        if _native is not None:
            built = _native.build_records(messages, store_timestamp, self.store_host, self.body_size_max_bytes,
                                          self.segment_size_bytes - FILLER_HEADER_BYTES, self._topic,
                                          self._tag_codes, cached_tag_code, _crc32)
            if built is not NotImplemented:
                topics, metas, key_hashes, records = built
                return PreparedRecords(store_timestamp, self.store_host, topics, metas, key_hashes, records)
        return self.build_python(messages, store_timestamp)

    def build_python(self, messages: Sequence[MessageInput], store_timestamp: int) -> PreparedRecords | None:
        """:meth:`build` in Python: the reference, and what decides whatever the C builder hands over."""
        batch_topics: dict[str, tuple[int, bytes, int]] = {}  # topic -> (index, segment, prefix CRC)
        topics: list[str] = []
        metas: list[bytes] = []
        pack_meta = META.pack
        key_hashes: list[int] = []
        parts: list[bytes] = []
        store_host = self.store_host
        if len(store_host) not in (HOST_V4_BYTES, HOST_V6_BYTES):
            return None  # not a store host: the plain path's store uses its own
        body_max = self.body_size_max_bytes
        segment_max = self.segment_size_bytes - FILLER_HEADER_BYTES
        findall = DISPATCH_PROPERTY.findall
        crc32 = _crc32
        tag_codes = self._tag_codes
        special_transaction = _SPECIAL_TRANSACTION_BIT
        try:
            for message in messages:
                topic, queue_id, _, sys_flag, _, born_host, _, reconsume_times, _, body, properties = message
                known = batch_topics.get(topic)
                if known is None:
                    entry = self._topic(topic)
                    if entry is None:
                        return None
                    known = batch_topics[topic] = (len(topics), *entry)
                    topics.append(topic)
                topic_index, topic_segment, prefix_crc = known
                if (len(body) > body_max or len(properties) > PROPERTIES_BYTES_MAX
                        or sys_flag & special_transaction or not 0 <= queue_id < 2**31):
                    return None
                if len(born_host) == HOST_V4_BYTES:
                    flags = 0
                elif len(born_host) == HOST_V6_BYTES:
                    flags = BORN_HOST_V6
                else:
                    return None
                size = stored_size(len(born_host), len(store_host), len(body), len(topic_segment), len(properties))
                if size > segment_max:
                    return None
                found = findall(properties)
                fields = dict(found)
                if len(fields) != len(found):
                    return None  # a property named twice: the plain path decides which counts
                parts.append(pack_record(message, topic_segment, size, 0, 0, store_host, store_timestamp))
                count = len(key_hashes)
                uniq_key = fields.get(b"UNIQ_KEY")
                if uniq_key:
                    key_hashes.append(crc32(uniq_key, prefix_crc))
                    flags |= HAS_UNIQ_KEY
                keys = fields.get(b"KEYS")
                if keys:
                    key_hashes.extend([crc32(key, prefix_crc) for key in keys.split(b" ") if key])
                tags = fields.get(b"TAGS")
                tag_code = tag_codes.get(tags, None) if tags else 0
                if tag_code is None:
                    tag_code = cached_tag_code(tag_codes, tags)
                metas.append(pack_meta(size, topic_index, flags, queue_id, tag_code, reconsume_times,
                                       len(key_hashes) - count))
        except (struct.error, OverflowError, ValueError):
            return None  # a field that does not fit, or not a message: the plain path says why
        return PreparedRecords(store_timestamp, store_host, tuple(topics), b"".join(metas), pack_hashes(key_hashes),
                               b"".join(parts))
