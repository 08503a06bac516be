"""The replicas' files as cached Spark tables, read once and shared by every check of a ``verify`` run.

Records, consume-queue units and key-index entries are each cached partitioned by replica: every check
groups or joins by replica (and more), so none of them shuffles the data again (measured on the integrity
check: about half the time of its violation job on small data).
"""

from __future__ import annotations

from pathlib import Path
from types import TracebackType
from typing import Final

from pyspark.sql import DataFrame, SparkSession

from spark_analytics.features import TRANSACTION_OP_TOPIC
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
    "retry_topic", "origin_message_id", "body",
)


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
            .option("body_topics", TRANSACTION_OP_TOPIC)
            .option("segment_size_bytes", str(self.segment_size)).load(path)
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
