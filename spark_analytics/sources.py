"""PySpark Python data sources over replicas' files, yielding Arrow record batches.

Register them once per session with :func:`register_sources`, then::

    spark.read.format("raftmq_commitlog").option("bodies", "false").load(cluster_dir)
    spark.read.format("raftmq_consumequeue").load(cluster_dir)
    spark.read.format("raftmq_keyindex").load(cluster_dir)
    spark.read.format("raftmq_blocks").option("block_size_bytes", str(1 << 20)).load(cluster_dir)

``path`` is a cluster directory (``<node>/store/`` below it), one node's directory or a store directory.
Common options: ``replicas`` (comma-separated names; default all). ``raftmq_commitlog``: ``bodies``
(``true``/``false``, default true: without it the ``body`` column is not in the schema at all),
``body_topics`` (comma-separated topics: with ``bodies`` false, the ``body`` column is kept but filled only
for records of these topics, for checks that read a few small system bodies), ``segments``
(comma-separated segment start offsets; default all). ``raftmq_blocks``: ``block_size_bytes``
(default 1 MiB); over the network ``member_digests`` (default true: each member hashes its own blocks,
see :class:`BlocksDataSource`; false: the executors read the bytes and hash them). Commit-log sources:
``segment_size_bytes`` (default: what the files say, see :func:`spark_analytics.layout.segment_size_bytes`).

Partitioning: one partition per commit-log segment file; consume-queue and key-index files, small and
many, are grouped per replica up to a byte bound. Files are read in the executors (segments through a
read-only mmap); the driver looks at names and sizes only. The data sources are pure readers: they
describe what is there, damage included (``kind = 'invalid'`` rows, ``problem`` columns); judging it is
:mod:`spark_analytics.checks`' job.

How PySpark 4 runs these (read from ``pyspark/sql/worker/plan_data_source_read.py``): ``schema()``,
``reader()`` and ``partitions()`` run in a planning Python worker, each partition object is pickled to an
executor's Python worker, and ``read()`` may yield ``pyarrow.RecordBatch`` objects, which are passed to the
JVM as they are provided their Arrow schema equals ``to_arrow_schema(schema)`` exactly (names, types and
nullability); the first batch is checked. Python data sources have no column pruning: every column of
the schema is produced, hence the ``bodies`` option.
"""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from pyspark.sql import SparkSession
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from commitlog.consume_queue import CQ_UNIT, UNIT_BYTES
from commitlog.hosts import decode_host
from commitlog.record_codec import BLANK_MAGIC, MESSAGE_MAGIC, body_crc32
from commitlog.tag_codes import tags_hash_code
from protocol.properties import (
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_KEYS,
    PROPERTY_ORIGIN_MESSAGE_ID,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_RETRY_TOPIC,
    PROPERTY_TAGS,
    PROPERTY_UNIQ_KEY,
    decode_properties,
)
from spark_analytics.index_file import IndexFileContents, IndexFileError, read_index_file
from spark_analytics.layout import CUT_PREFIX, Replica, list_replicas, map_file, read_file, segment_size_bytes
from spark_analytics.walker import KIND_END, KIND_FILLER, Buffer, walk_segment

COMMIT_LOG_SOURCE: Final = "raftmq_commitlog"
CONSUME_QUEUE_SOURCE: Final = "raftmq_consumequeue"
BLOCKS_SOURCE: Final = "raftmq_blocks"
KEY_INDEX_SOURCE: Final = "raftmq_keyindex"

#: rows per Arrow batch, and the body bytes one batch may hold (a batch is built in the Python worker's
#: memory before it is handed to the JVM, so both bound that memory)
BATCH_ROWS_MAX: Final = 4096
BATCH_BODY_BYTES_MAX: Final = 16 << 20
BLOCK_SIZE_BYTES_DEFAULT: Final = 1 << 20
#: distinct tags (and hosts) whose Java hash code (and text) one reader remembers: they usually repeat, and
#: unbounded ones must not grow the worker
TAG_CODE_CACHE_ENTRIES_MAX: Final = 10_000
#: consume-queue and key-index bytes one partition reads (such files are small and many: a Python task per
#: file costs more than reading it)
QUEUE_PARTITION_BYTES_MAX: Final = 64 << 20
INDEX_PARTITION_BYTES_MAX: Final = 256 << 20
#: a partition of the blocks source over the network covers at most this much of a segment (executors on
#: several hosts then share a big segment; local files are hashed a segment per task, from the page cache)
REMOTE_RANGE_BYTES: Final = 16 << 20
#: the same when members hash their own blocks: a task then only waits for the member, so fewer, larger
#: ranges (each one digest request) cost less task overhead; members still hash several ranges at once
REMOTE_DIGEST_RANGE_BYTES: Final = 64 << 20
#: the block digest: SHA-256, with the CPU's SHA extensions, runs faster than MD5 here
DIGEST_NAME: Final = "sha256"

COMMIT_LOG_SCHEMA: Final = StructType([
    StructField("replica", StringType(), False),
    StructField("segment", LongType(), False),
    StructField("physical_offset", LongType(), False),
    StructField("kind", StringType(), False),
    StructField("total_size", IntegerType(), False),
    StructField("magic", LongType(), True),
    StructField("problem", StringType(), True),
    StructField("stored_physical_offset", LongType(), True),
    StructField("body_crc", LongType(), True),
    StructField("crc_ok", BooleanType(), True),
    StructField("queue_id", IntegerType(), True),
    StructField("flag", IntegerType(), True),
    StructField("queue_offset", LongType(), True),
    StructField("sys_flag", IntegerType(), True),
    StructField("born_timestamp", LongType(), True),
    StructField("born_host", StringType(), True),
    StructField("store_timestamp", LongType(), True),
    StructField("store_host", StringType(), True),
    StructField("reconsume_times", IntegerType(), True),
    StructField("prepared_transaction_offset", LongType(), True),
    StructField("topic", StringType(), True),
    StructField("tags", StringType(), True),
    StructField("keys", StringType(), True),
    StructField("uniq_key", StringType(), True),
    StructField("tags_code", LongType(), True),
    StructField("properties", BinaryType(), True),
    StructField("body_length", IntegerType(), True),
    # the properties the feature invariants follow (delay, retry, transactions), as the broker wrote them
    StructField("real_topic", StringType(), True),
    StructField("real_qid", StringType(), True),
    StructField("delay", StringType(), True),
    StructField("retry_topic", StringType(), True),
    StructField("origin_message_id", StringType(), True),
])
BODY_FIELD: Final = StructField("body", BinaryType(), True)

CONSUME_QUEUE_SCHEMA: Final = StructType([
    StructField("replica", StringType(), False),
    StructField("topic", StringType(), False),
    StructField("queue_id", IntegerType(), False),
    StructField("queue_offset", LongType(), False),
    StructField("physical_offset", LongType(), False),
    StructField("size", IntegerType(), False),
    StructField("tags_code", LongType(), False),
])

BLOCKS_SCHEMA: Final = StructType([
    StructField("replica", StringType(), False),
    StructField("segment", LongType(), False),
    StructField("block_offset", LongType(), False),
    StructField("block_bytes", IntegerType(), False),
    StructField("digest", BinaryType(), False),
    StructField("data_end", LongType(), True),
])


KEY_INDEX_SCHEMA: Final = StructType([
    StructField("replica", StringType(), False),
    StructField("file", LongType(), False),
    StructField("entry_number", IntegerType(), True),
    StructField("key_hash", LongType(), True),
    StructField("physical_offset", LongType(), True),
    StructField("timestamp_seconds", LongType(), True),
    StructField("previous", LongType(), True),
    StructField("reachable", BooleanType(), True),
    StructField("slot_count", IntegerType(), True),
    StructField("problem", StringType(), True),
])


class SourceOptionError(ValueError):
    """An option of a raftmq data source is missing or malformed; the message names it."""


def register_sources(spark: SparkSession) -> None:
    """Register every raftmq data source with ``spark`` (idempotent)."""
    for source in (CommitLogDataSource, ConsumeQueueDataSource, BlocksDataSource, KeyIndexDataSource):
        spark.dataSource.register(source)


# ---------------------------------------------------------------------------------------------- options


def _path_option(options: Any) -> Path:
    path = options.get("path")
    if not path:
        raise SourceOptionError("the path of a cluster, node or store directory is required (load(path))")
    return Path(str(path))


def _replicas_option(options: Any) -> frozenset[str] | None:
    names = str(options.get("replicas", "")).strip()
    return frozenset(name.strip() for name in names.split(",") if name.strip()) if names else None


def _names_option(options: Any, name: str) -> frozenset[str] | None:
    """A comma-separated list of names (None when absent or empty)."""
    text = str(options.get(name, "")).strip()
    names = frozenset(part.strip() for part in text.split(",") if part.strip())
    return names or None


def _bool_option(options: Any, name: str, default: bool) -> bool:
    value = str(options.get(name, str(default))).strip().lower()
    if value not in ("true", "false"):
        raise SourceOptionError(f"option {name} must be true or false, got {value!r}")
    return value == "true"


def _int_option(options: Any, name: str, default: int, low: int, high: int) -> int:
    text = str(options.get(name, str(default))).strip()
    if not text.isdigit() or not low <= int(text) <= high:
        raise SourceOptionError(f"option {name} must be an integer in {low}..{high}, got {text!r}")
    return int(text)


def _offsets_option(options: Any, name: str) -> frozenset[int] | None:
    text = str(options.get(name, "")).strip()
    if not text:
        return None
    parts = [part.strip() for part in text.split(",") if part.strip()]
    if not all(part.isdigit() for part in parts):
        raise SourceOptionError(f"option {name} must be comma-separated offsets, got {text!r}")
    return frozenset(int(part) for part in parts)


def _access_option(options: Any) -> str:
    """The credentials of a live group's cut (for the executors' reads), "" for directories."""
    path = str(options.get("path", ""))
    if not path.startswith(CUT_PREFIX):
        return ""
    from spark_analytics.remote import RemoteCut, install_access

    access = RemoteCut.decode(path).access
    install_access(access)  # the planning worker lists nothing remote, but the driver may read through it
    return access


def _install(access: str) -> None:
    if access:
        from spark_analytics.remote import install_access

        install_access(access)


def _replicas_and_segment_size(options: Any) -> tuple[list[Replica], int]:
    replicas = list_replicas(_path_option(options), _replicas_option(options))
    inferred = segment_size_bytes(replicas)
    size = _int_option(options, "segment_size_bytes", inferred, 0, 1 << 40)
    return replicas, size


def _arrow_schema(schema: StructType) -> Any:
    """The Arrow schema the JVM expects for ``schema`` (the worker compares it with ``equals``)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(schema, timezone="UTC")


# ---------------------------------------------------------------------------------------------- commit log


@dataclass(frozen=True)
class SegmentPartition(InputPartition):
    """One segment file to read (pickled to an executor)."""

    replica: str
    path: str
    start: int
    segment_size: int
    is_last: bool
    #: credentials of replica files over the network ("" for local files)
    access: str = ""


def _segment_partitions(replicas: list[Replica], segment_size: int,
                        segments: frozenset[int] | None = None, access: str = "") -> list[InputPartition]:
    partitions: list[InputPartition] = []
    for replica in replicas:
        for position, segment in enumerate(replica.segments):
            if segments is None or segment.start in segments:
                is_last = position == len(replica.segments) - 1
                partitions.append(SegmentPartition(replica.name, segment.path, segment.start, segment_size, is_last,
                                                   access))
    return partitions


class CommitLogDataSource(DataSource):
    """``raftmq_commitlog``: one row per stretch of every segment (records, fillers, the zero tail, damage)."""

    @classmethod
    def name(cls) -> str:
        return COMMIT_LOG_SOURCE

    def schema(self) -> StructType:
        if _bool_option(self.options, "bodies", True) or _names_option(self.options, "body_topics"):
            return StructType([*COMMIT_LOG_SCHEMA.fields, BODY_FIELD])
        return COMMIT_LOG_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        replicas, segment_size = _replicas_and_segment_size(self.options)
        partitions = _segment_partitions(replicas, segment_size, _offsets_option(self.options, "segments"),
                                         _access_option(self.options))
        bodies = _bool_option(self.options, "bodies", True)
        return CommitLogReader(schema, partitions, bodies, None if bodies else _names_option(self.options, "body_topics"))


class CommitLogReader(DataSourceReader):
    def __init__(self, schema: StructType, partitions: list[InputPartition], bodies: bool,
                 body_topics: frozenset[str] | None = None) -> None:
        self.schema = schema
        self.planned = partitions
        self.bodies = bodies
        self.body_topics = body_topics

    def partitions(self) -> Sequence[InputPartition]:
        return self.planned

    def read(self, partition: InputPartition) -> Iterator[Any]:
        if not isinstance(partition, SegmentPartition):  # no files: PySpark plans one InputPartition(None)
            return
        yield from read_segment_batches(partition, self.bodies, _arrow_schema(self.schema), self.body_topics)


def read_segment_batches(partition: SegmentPartition, bodies: bool, arrow_schema: Any,
                         body_topics: frozenset[str] | None = None) -> Iterator[Any]:
    """Arrow batches describing one segment file (see :data:`COMMIT_LOG_SCHEMA`). Without ``bodies``,
    ``body_topics`` (when given) names the topics whose bodies fill the ``body`` column (null for others)."""
    some_bodies = not bodies and bool(body_topics)
    topics_with_body = body_topics or frozenset()
    import pyarrow

    names = [field.name for field in arrow_schema]
    columns: dict[str, list[Any]] = {name: [] for name in names}
    body_bytes = 0
    tag_codes: dict[str, int] = {}  # Java's hashCode in Python is slow; tags repeat
    hosts: dict[bytes, str] = {}  # a few producer hosts and one store host: each formatted once

    def host(raw: bytes) -> str:
        text = hosts.get(raw)
        if text is None:
            text = _host(raw)
            if len(hosts) < TAG_CODE_CACHE_ENTRIES_MAX:
                hosts[raw] = text
        return text

    def batch() -> Any:
        arrays = [pyarrow.array(columns[field.name], type=field.type) for field in arrow_schema]
        for values in columns.values():
            values.clear()
        return pyarrow.RecordBatch.from_arrays(arrays, schema=arrow_schema)

    _install(partition.access)
    with map_file(partition.path) as data:
        for entry in walk_segment(data, partition.start, partition.segment_size, decode=True):
            message = entry.message
            columns["replica"].append(partition.replica)
            columns["segment"].append(partition.start)
            columns["physical_offset"].append(partition.start + entry.offset)
            columns["kind"].append(entry.kind)
            columns["total_size"].append(entry.length)
            columns["problem"].append(entry.problem)
            if message is None:
                columns["magic"].append(BLANK_MAGIC if entry.kind == KIND_FILLER else None)
                for name in _MESSAGE_COLUMNS:
                    columns[name].append(None)
                if bodies or some_bodies:
                    columns["body"].append(None)
            else:
                properties = decode_properties(message.properties)
                tags = properties.get(PROPERTY_TAGS)
                tag_code = tag_codes.get(tags) if tags else 0
                if tag_code is None:
                    tag_code = tags_hash_code(tags)
                    if len(tag_codes) < TAG_CODE_CACHE_ENTRIES_MAX:
                        tag_codes[str(tags)] = tag_code
                columns["magic"].append(MESSAGE_MAGIC)
                columns["stored_physical_offset"].append(message.physical_offset)
                columns["body_crc"].append(message.body_crc)
                columns["crc_ok"].append(message.body_crc in (body_crc32(message.body), zlib.crc32(message.body)))
                columns["queue_id"].append(message.queue_id)
                columns["flag"].append(message.flag)
                columns["queue_offset"].append(message.queue_offset)
                columns["sys_flag"].append(message.sys_flag)
                columns["born_timestamp"].append(message.born_timestamp)
                columns["born_host"].append(host(message.born_host))
                columns["store_timestamp"].append(message.store_timestamp)
                columns["store_host"].append(host(message.store_host))
                columns["reconsume_times"].append(message.reconsume_times)
                columns["prepared_transaction_offset"].append(message.prepared_transaction_offset)
                columns["topic"].append(message.topic)
                columns["tags"].append(tags)
                columns["keys"].append(properties.get(PROPERTY_KEYS))
                columns["uniq_key"].append(properties.get(PROPERTY_UNIQ_KEY))
                columns["tags_code"].append(tag_code)
                columns["properties"].append(message.properties)
                columns["body_length"].append(len(message.body))
                columns["real_topic"].append(properties.get(PROPERTY_REAL_TOPIC))
                columns["real_qid"].append(properties.get(PROPERTY_REAL_QUEUE_ID))
                columns["delay"].append(properties.get(PROPERTY_DELAY_TIME_LEVEL))
                columns["retry_topic"].append(properties.get(PROPERTY_RETRY_TOPIC))
                columns["origin_message_id"].append(properties.get(PROPERTY_ORIGIN_MESSAGE_ID))
                if bodies or (some_bodies and message.topic in topics_with_body):
                    columns["body"].append(message.body)
                    body_bytes += len(message.body)
                elif some_bodies:
                    columns["body"].append(None)
            if len(columns["replica"]) >= BATCH_ROWS_MAX or body_bytes >= BATCH_BODY_BYTES_MAX:
                body_bytes = 0
                yield batch()
    if columns["replica"]:
        yield batch()


_MESSAGE_COLUMNS: Final = (
    "stored_physical_offset", "body_crc", "crc_ok", "queue_id", "flag", "queue_offset", "sys_flag",
    "born_timestamp", "born_host", "store_timestamp", "store_host", "reconsume_times",
    "prepared_transaction_offset", "topic", "tags", "keys", "uniq_key", "tags_code", "properties", "body_length",
    "real_topic", "real_qid", "delay", "retry_topic", "origin_message_id",
)


def _host(raw: bytes) -> str:
    host, port = decode_host(raw)
    return f"{host}:{port}"


# ---------------------------------------------------------------------------------------------- consume queues


@dataclass(frozen=True)
class QueueFile:
    """One consume-queue file to read: its queue and the queue offset of its first unit."""

    topic: str
    queue_id: int
    path: str
    first_queue_offset: int


@dataclass(frozen=True)
class QueueFilesPartition(InputPartition):
    """Consume-queue files of one replica, together at most :data:`QUEUE_PARTITION_BYTES_MAX` (queue files
    are small and many: a task per file would cost more than reading it)."""

    replica: str
    files: tuple[QueueFile, ...]
    access: str = ""


def _queue_partitions(replicas: list[Replica], access: str = "") -> list[InputPartition]:
    partitions: list[InputPartition] = []
    for replica in replicas:
        files: list[QueueFile] = []
        size = 0
        for file in replica.queue_files:
            if files and size + file.size_bytes > QUEUE_PARTITION_BYTES_MAX:
                partitions.append(QueueFilesPartition(replica.name, tuple(files), access))
                files, size = [], 0
            files.append(QueueFile(file.topic, file.queue_id, file.path, file.start_byte // UNIT_BYTES))
            size += file.size_bytes
        if files:
            partitions.append(QueueFilesPartition(replica.name, tuple(files), access))
    return partitions


class ConsumeQueueDataSource(DataSource):
    """``raftmq_consumequeue``: one row per non-empty 20-byte unit of every consume-queue file."""

    @classmethod
    def name(cls) -> str:
        return CONSUME_QUEUE_SOURCE

    def schema(self) -> StructType:
        return CONSUME_QUEUE_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        replicas = list_replicas(_path_option(self.options), _replicas_option(self.options))
        return ConsumeQueueReader(schema, _queue_partitions(replicas, _access_option(self.options)))


class ConsumeQueueReader(DataSourceReader):
    def __init__(self, schema: StructType, partitions: list[InputPartition]) -> None:
        self.schema = schema
        self.planned = partitions

    def partitions(self) -> Sequence[InputPartition]:
        return self.planned

    def read(self, partition: InputPartition) -> Iterator[Any]:
        if not isinstance(partition, QueueFilesPartition):  # no files: PySpark plans one InputPartition(None)
            return
        arrow_schema = _arrow_schema(self.schema)
        _install(partition.access)
        for file in partition.files:
            yield from read_queue_batches(partition.replica, file, arrow_schema)


def read_queue_batches(replica: str, file: QueueFile, arrow_schema: Any) -> Iterator[Any]:
    """Arrow batches of the non-empty units (size != 0) of one consume-queue file. Units are written
    positionally, so a unit's queue offset is its position; an empty unit inside the used run is a hole,
    which shows as a missing offset."""
    import pyarrow

    raw = read_file(file.path)
    # units after the last non-zero byte are empty: skip them without unpacking (files are mostly empty)
    used_units = min(len(raw) // UNIT_BYTES, -(-len(raw.rstrip(b"\x00")) // UNIT_BYTES))
    queue_offsets: list[int] = []
    physical_offsets: list[int] = []
    sizes: list[int] = []
    tag_codes: list[int] = []
    for number, (physical_offset, size, tags_code) in enumerate(CQ_UNIT.iter_unpack(raw[: used_units * UNIT_BYTES])):
        if size != 0:
            queue_offsets.append(file.first_queue_offset + number)
            physical_offsets.append(physical_offset)
            sizes.append(size)
            tag_codes.append(tags_code)
    rows_per_batch = BATCH_ROWS_MAX * 4  # units are narrow
    for low in range(0, len(sizes), rows_per_batch):
        high = low + rows_per_batch
        count = len(sizes[low:high])
        arrays = [
            pyarrow.array([replica] * count, type=pyarrow.string()),
            pyarrow.array([file.topic] * count, type=pyarrow.string()),
            pyarrow.array([file.queue_id] * count, type=pyarrow.int32()),
            pyarrow.array(queue_offsets[low:high], type=pyarrow.int64()),
            pyarrow.array(physical_offsets[low:high], type=pyarrow.int64()),
            pyarrow.array(sizes[low:high], type=pyarrow.int32()),
            pyarrow.array(tag_codes[low:high], type=pyarrow.int64()),
        ]
        yield pyarrow.RecordBatch.from_arrays(arrays, schema=arrow_schema)


# ---------------------------------------------------------------------------------------------- block digests


@dataclass(frozen=True)
class BlockPartition(InputPartition):
    """A segment's blocks, or (over the network) those of ``[low, high)`` of it (local offsets; -1: the end),
    hashed by the member that holds them when ``member_digests``."""

    segment: SegmentPartition
    block_size: int
    low: int = 0
    high: int = -1
    member_digests: bool = False


class BlocksDataSource(DataSource):
    """``raftmq_blocks``: a digest per fixed-size block of every segment file, blocks aligned to physical
    offsets. A replica's last segment is hashed only up to its data end (the start of the all-zero tail,
    found by following total sizes), reported in ``data_end`` on that segment's rows; other segments are
    hashed whole, filler padding included (the store writes it identically on every replica). A file
    shorter than the segment has fewer, or a shorter last, block: missing bytes show as differences.

    Over the network (a live group's cut), each member hashes the blocks of its own segments by default
    (``REPLICA_FILES_DIGESTS``: read from its files when asked, below the cut) and only the digests travel:
    the same rows, as hashing the bytes read over the network would give them. ``member_digests=false``
    reads the bytes into the executors and hashes them there."""

    @classmethod
    def name(cls) -> str:
        return BLOCKS_SOURCE

    def schema(self) -> StructType:
        return BLOCKS_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        replicas, segment_size = _replicas_and_segment_size(self.options)
        block_size = _int_option(self.options, "block_size_bytes", BLOCK_SIZE_BYTES_DEFAULT, 4096, 1 << 30)
        block_size = min(block_size, segment_size) if segment_size else block_size
        access = _access_option(self.options)
        member_digests = _bool_option(self.options, "member_digests", True)
        partitions: list[InputPartition] = []
        for segment in _segment_partitions(replicas, segment_size, access=access):
            if not isinstance(segment, SegmentPartition):
                continue
            if not access:
                partitions.append(BlockPartition(segment, block_size))
                continue
            # over the network: one partition per (member, range of a segment), ranges made of whole blocks
            range_bytes = REMOTE_DIGEST_RANGE_BYTES if member_digests else REMOTE_RANGE_BYTES
            step = max(block_size, range_bytes // block_size * block_size)
            size = segment.segment_size or step
            partitions.extend(BlockPartition(segment, block_size, low, min(size, low + step), member_digests)
                              for low in range(0, size, step))
        return BlocksReader(schema, partitions)


class BlocksReader(DataSourceReader):
    def __init__(self, schema: StructType, partitions: list[InputPartition]) -> None:
        self.schema = schema
        self.planned = partitions

    def partitions(self) -> Sequence[InputPartition]:
        return self.planned

    def read(self, partition: InputPartition) -> Iterator[Any]:
        if not isinstance(partition, BlockPartition):  # no files: PySpark plans one InputPartition(None)
            return
        yield from read_block_batches(partition, _arrow_schema(self.schema))


def data_end_of(data: Buffer, segment_start: int, segment_size: int) -> int:
    """Where the data of a replica's newest segment ends: the start of its all-zero tail, by the chain of
    total sizes (a physical offset; the end of the file when there is no zero tail)."""
    end = min(len(data), segment_size)
    for entry in walk_segment(data, segment_start, segment_size, decode=False):
        if entry.kind == KIND_END:
            return segment_start + entry.offset
        end = entry.offset + entry.length
    return segment_start + end


def block_digests(data: Buffer | memoryview, segment_start: int, hashed_bytes: int,
                  block_size: int) -> Iterator[tuple[int, int, bytes]]:
    """(block offset, bytes hashed, digest) for ``data[:hashed_bytes]`` cut at physical offsets that are
    multiples of ``block_size`` (a memoryview hashes each block without copying it first)."""
    local = 0
    while local < hashed_bytes:
        block_end = min(hashed_bytes, (segment_start + local) // block_size * block_size + block_size - segment_start)
        digest = hashlib.new(DIGEST_NAME, data[local:block_end]).digest()
        yield segment_start + local, block_end - local, digest
        local = block_end


def read_block_batches(partition: BlockPartition, arrow_schema: Any) -> Iterator[Any]:
    import pyarrow

    segment = partition.segment
    rows: list[tuple[int, int, bytes]] = []
    data_end: int | None = None
    if segment.access:
        yield _remote_block_batch(partition, arrow_schema)
        return
    with map_file(segment.path) as data:
        hashed = min(len(data), segment.segment_size)
        if segment.is_last:
            data_end = data_end_of(data, segment.start, segment.segment_size)
            hashed = data_end - segment.start
        with memoryview(data) as view:  # released before the mapping closes
            rows = list(block_digests(view, segment.start, hashed, partition.block_size))
    if not rows:  # an empty newest segment still reports where the data ends
        rows = [(segment.start, 0, hashlib.new(DIGEST_NAME, b"").digest())]
    count = len(rows)
    arrays = [
        pyarrow.array([segment.replica] * count, type=pyarrow.string()),
        pyarrow.array([segment.start] * count, type=pyarrow.int64()),
        pyarrow.array([row[0] for row in rows], type=pyarrow.int64()),
        pyarrow.array([row[1] for row in rows], type=pyarrow.int32()),
        pyarrow.array([row[2] for row in rows], type=pyarrow.binary()),
        pyarrow.array([data_end] * count, type=pyarrow.int64()),
    ]
    yield pyarrow.RecordBatch.from_arrays(arrays, schema=arrow_schema)


def _remote_block_batch(partition: BlockPartition, arrow_schema: Any) -> Any:
    """The digests of a range of a segment read over the network, below the cut. A member's newest
    segment below the cut ends at the cut: that is its ``data_end`` (every member applied up to there)."""
    import pyarrow

    from spark_analytics.remote import RemotePath, digest_path, read_path

    segment = partition.segment
    _install(segment.access)
    below = RemotePath.parse(segment.path).below
    limit = min(segment.segment_size, below - segment.start)
    high = limit if partition.high < 0 else min(partition.high, limit)
    if partition.member_digests:
        rows = digest_path(segment.path, partition.low, high, partition.block_size, DIGEST_NAME)
    else:
        data = read_path(segment.path, partition.low, high) if high > partition.low else b""
        with memoryview(data) as view:
            rows = list(block_digests(view, segment.start + partition.low, len(data), partition.block_size))
    if not rows and partition.low == 0:
        rows = [(segment.start, 0, hashlib.new(DIGEST_NAME, b"").digest())]
    data_end = min(below, segment.start + segment.segment_size) if segment.is_last else None
    count = len(rows)
    return pyarrow.RecordBatch.from_arrays([
        pyarrow.array([segment.replica] * count, type=pyarrow.string()),
        pyarrow.array([segment.start] * count, type=pyarrow.int64()),
        pyarrow.array([row[0] for row in rows], type=pyarrow.int64()),
        pyarrow.array([row[1] for row in rows], type=pyarrow.int32()),
        pyarrow.array([row[2] for row in rows], type=pyarrow.binary()),
        pyarrow.array([data_end] * count, type=pyarrow.int64()),
    ], schema=arrow_schema)


# ---------------------------------------------------------------------------------------------- key index


@dataclass(frozen=True)
class IndexFile:
    path: str
    begin_physical: int


@dataclass(frozen=True)
class IndexFilesPartition(InputPartition):
    """Key-index files of one replica, together at most :data:`INDEX_PARTITION_BYTES_MAX`."""

    replica: str
    files: tuple[IndexFile, ...]
    access: str = ""


def _index_partitions(replicas: list[Replica], access: str = "") -> list[InputPartition]:
    partitions: list[InputPartition] = []
    for replica in replicas:
        files: list[IndexFile] = []
        size = 0
        for file in replica.index_files:
            if files and size + file.size_bytes > INDEX_PARTITION_BYTES_MAX:
                partitions.append(IndexFilesPartition(replica.name, tuple(files), access))
                files, size = [], 0
            files.append(IndexFile(file.path, file.begin_physical))
            size += file.size_bytes
        if files:
            partitions.append(IndexFilesPartition(replica.name, tuple(files), access))
    return partitions


class KeyIndexDataSource(DataSource):
    """``raftmq_keyindex``: one row per entry of every key-index file, with whether a lookup reaches it
    (its slot's chain passes through it). A file that cannot be read yields one row with ``problem`` set."""

    @classmethod
    def name(cls) -> str:
        return KEY_INDEX_SOURCE

    def schema(self) -> StructType:
        return KEY_INDEX_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        replicas = list_replicas(_path_option(self.options), _replicas_option(self.options))
        return KeyIndexReader(schema, _index_partitions(replicas, _access_option(self.options)))


class KeyIndexReader(DataSourceReader):
    def __init__(self, schema: StructType, partitions: list[InputPartition]) -> None:
        self.schema = schema
        self.planned = partitions

    def partitions(self) -> Sequence[InputPartition]:
        return self.planned

    def read(self, partition: InputPartition) -> Iterator[Any]:
        if not isinstance(partition, IndexFilesPartition):  # no files: PySpark plans one InputPartition(None)
            return
        arrow_schema = _arrow_schema(self.schema)
        _install(partition.access)
        for file in partition.files:
            yield from read_index_batches(partition.replica, file, arrow_schema)


def read_index_batches(replica: str, file: IndexFile, arrow_schema: Any) -> Iterator[Any]:
    import pyarrow

    raw = read_file(file.path)
    try:
        contents = read_index_file(raw)
    except IndexFileError as exc:
        row: dict[str, list[Any]] = {field.name: [None] for field in arrow_schema}
        row["replica"], row["file"], row["problem"] = [replica], [file.begin_physical], [str(exc)]
        yield pyarrow.RecordBatch.from_pydict(row, schema=arrow_schema)
        return
    if file.path.startswith("raftmq://"):
        contents = _entries_below(contents, file.path)
    rows_per_batch = BATCH_ROWS_MAX * 4
    for low in range(0, contents.entry_count, rows_per_batch):
        high = min(contents.entry_count, low + rows_per_batch)
        count = high - low
        yield pyarrow.RecordBatch.from_pydict({
            "replica": [replica] * count,
            "file": [file.begin_physical] * count,
            "entry_number": list(range(low, high)),
            "key_hash": contents.key_hashes[low:high],
            "physical_offset": contents.physical_offsets[low:high],
            "timestamp_seconds": contents.timestamps_seconds[low:high],
            "previous": contents.previous[low:high],
            "reachable": contents.reachable[low:high],
            "slot_count": [contents.slot_count] * count,
            "problem": [None] * count,
        }, schema=arrow_schema)


def _entries_below(contents: IndexFileContents, path: str) -> IndexFileContents:
    """A live member's key-index file up to its last entry that points below the cut: entries are appended
    in commit-log order, so those after it were made for records past the cut (an entry before it pointing
    past the cut is damage, and kept). Reachability was computed over the whole image."""
    from spark_analytics.remote import RemotePath

    below = RemotePath.parse(path).below
    kept = next((number + 1 for number in range(contents.entry_count - 1, -1, -1)
                 if contents.physical_offsets[number] < below), 0)
    if kept == contents.entry_count:
        return contents
    return contents._replace(entry_count=kept, key_hashes=contents.key_hashes[:kept],
                             physical_offsets=contents.physical_offsets[:kept],
                             timestamps_seconds=contents.timestamps_seconds[:kept],
                             previous=contents.previous[:kept], reachable=contents.reachable[:kept])
