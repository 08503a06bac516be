"""The replicas' files as cached Spark tables, read once and shared by every check of a ``verify`` run.

Records, consume-queue units and key-index entries are each cached partitioned by replica: every check
groups or joins by replica (and more), so none of them shuffles the data again (on the integrity check, that
saved much of its violation job's time).
"""

from __future__ import annotations

from pathlib import Path
from types import TracebackType
from typing import Final

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from commitlog.retries import PER_ATTEMPT_PROPERTIES, TIMER_KEY_PREFIX
from protocol.topics import TRANS_OP_HALF_TOPIC
from spark_analytics.layout import Replica, list_replicas, segment_size_bytes
from spark_analytics.sources import (
    COMMIT_LOG_SOURCE,
    CONSUME_QUEUE_SOURCE,
    KEY_INDEX_SOURCE,
    register_sources,
)

#: the record columns the checks read (the rest, bodies above all, is not cached); ``body`` is filled
#: for op records only (their body names the half they resolve)
RECORD_COLUMNS: Final = (
    "replica", "physical_offset", "kind", "total_size", "problem", "stored_physical_offset", "body_crc", "crc_ok",
    "queue_id", "queue_offset", "sys_flag", "store_timestamp", "reconsume_times", "prepared_transaction_offset",
    "topic", "tags", "uniq_key", "keys", "tags_code", "body_length", "real_topic", "real_qid", "delay",
    "retry_topic", "origin_message_id", "body", "retry_content",
)


def retry_content(records: DataFrame) -> Column:
    """What a retry has in common with its first attempt (:mod:`commitlog.retries`), as a 64-bit hash of the
    columns at hand: flag, the body's CRC and length, and the properties less the per-attempt ones
    (REAL_QID, TIMER_OUT_MS, timer tokens in KEYS). Two records of other content can share it (a hash or CRC
    collision), never two of the same content: a check built on it may flag a copy too many, never miss one."""
    names = "|".join(PER_ATTEMPT_PROPERTIES)
    text = F.decode(records["properties"], "UTF-8")
    text = F.regexp_replace(text, f"(^|\\u0002)({names})\\u0001[^\\u0002]*", "")
    text = F.regexp_replace(text, f"{TIMER_KEY_PREFIX}[0-9]*", "")
    return F.xxhash64(records["flag"], records["body_crc"], records["body_length"], text)


class ReplicaTables:
    """``records``, ``units`` and ``entries`` of every replica under ``cluster_dir``, cached until
    :meth:`close` (or the end of a ``with`` block). The listing is taken once, here: checks sharing the
    tables see the same files."""

    def __init__(self, spark: SparkSession, cluster_dir: Path | str) -> None:
        register_sources(spark)
        self.spark = spark
        self.cluster_dir = Path(cluster_dir)
        self.replicas: list[Replica] = list_replicas(self.cluster_dir)
        self.segment_size = segment_size_bytes(self.replicas)
        path = str(self.cluster_dir)
        self.records: DataFrame = (
            spark.read.format(COMMIT_LOG_SOURCE).option("bodies", "false")
            .option("body_topics", TRANS_OP_HALF_TOPIC)
            .option("segment_size_bytes", str(self.segment_size)).load(path)
            .transform(lambda loaded: loaded.withColumn("retry_content", retry_content(loaded)))
            .select(*RECORD_COLUMNS).repartition("replica").persist()
        )
        self.units: DataFrame = spark.read.format(CONSUME_QUEUE_SOURCE).load(path).repartition("replica").persist()
        self.entries: DataFrame = spark.read.format(KEY_INDEX_SOURCE).load(path).repartition("replica").persist()

    @property
    def min_offsets(self) -> dict[str, int]:
        return {replica.name: replica.min_offset for replica in self.replicas}

    def close(self) -> None:
        self.records.unpersist()
        self.units.unpersist()
        self.entries.unpersist()

    def __enter__(self) -> ReplicaTables:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()
