"""What one round of the continuous audit hands to the next (``raftmq verify --every``).

A round reads each replica from the segment the previous round's cut fell in (:mod:`spark_analytics.live`),
as if retention had removed the older segments. Two checks compare a record with records stored before it,
and those may lie in the older segments: store timestamps never decrease, and no UNIQ_KEY is stored twice
within the deduplication window (:data:`dledger.apply.UNIQ_KEY_WINDOW_MS`). So each round hands the next
a :class:`RoundCarry` of every replica it read:

* timestamp marks: for each segment start the round read (and the end of its last segment), the largest
  store timestamp of the messages below it, earlier rounds included;
* recent copies: the visible messages with a UNIQ_KEY stored within the window before the replica's newest
  store timestamp (earlier rounds' included), one row per message key (:func:`message_key`) for its newest
  copy: the key, physical offset and store timestamp.

The next round uses, for each replica, only what lies below the first segment it reads; what it reads
again is checked from the files. The recent copies are bounded (:data:`CARRY_ROWS_MAX`): past that, the
newest are kept and a note in the next round's report says from which store timestamp on the window was
carried.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StringType, StructField, StructType

from dledger.apply import UNIQ_KEY_WINDOW_MS
from spark_analytics.violations import hidden, replica_lookup

#: recent copies one round hands to the next at most (four numbers and a replica name each, in the driver)
CARRY_ROWS_MAX: Final = 2_000_000

RECENT_SCHEMA: Final = StructType([
    StructField("replica", StringType(), False),
    StructField("message_key", LongType(), False),
    StructField("physical_offset", LongType(), False),
    StructField("store_timestamp", LongType(), False),
])


def message_key() -> Column:
    """What makes two records copies of one message for the UNIQ_KEY check, as a 64-bit hash: topic,
    UNIQ_KEY, reconsume times and content (``retry_content``). Like ``retry_content``, two other messages can
    share it (a hash collision): the check may then flag a copy too many, never miss one."""
    return F.xxhash64(F.col("topic"), F.col("uniq_key"), F.col("reconsume_times"), F.col("retry_content"))


def recent_candidates(records: DataFrame) -> DataFrame:
    """The records the UNIQ_KEY check compares: visible messages with a UNIQ_KEY."""
    col = F.col
    return records.where((col("kind") == "message") & ~hidden(col("sys_flag")) & col("uniq_key").isNotNull())


@dataclass(frozen=True)
class RoundCarry:
    """What a round hands the next (see the module docstring). ``recent`` is an Arrow table of
    :data:`RECENT_SCHEMA`; ``notes`` go into the next round's report."""

    timestamp_marks: Mapping[str, tuple[tuple[int, int], ...]]
    recent: Any
    notes: tuple[str, ...] = ()

    def timestamp_below(self, replica: str, offset: int) -> int | None:
        """The largest store timestamp of the replica's messages below ``offset`` that an earlier round
        read: the mark at the largest offset not past ``offset`` (None when there is none)."""
        marks = self.timestamp_marks.get(replica, ())
        position = bisect.bisect_right([mark for mark, _ in marks], offset)
        return marks[position - 1][1] if position else None

    def recent_below(self, spark: SparkSession, min_offsets: Mapping[str, int]) -> DataFrame:
        """The recent copies below where this round starts reading each replica, as a DataFrame."""
        frame = spark.createDataFrame(self.recent, schema=RECENT_SCHEMA) if self.recent.num_rows else \
            spark.createDataFrame([], schema=RECENT_SCHEMA)
        start = replica_lookup(dict(min_offsets))
        return frame.where(F.col("physical_offset") < start(F.col("replica")))

    def timestamps_below(self, min_offsets: Mapping[str, int]) -> dict[str, int]:
        """For each replica this round reads, the largest store timestamp an earlier round read below it."""
        values = {replica: self.timestamp_below(replica, offset) for replica, offset in min_offsets.items()}
        return {replica: value for replica, value in values.items() if value is not None}


def carry_forward(spark: SparkSession, records: DataFrame, min_offsets: Mapping[str, int], segment_size: int,
                  carried: RoundCarry | None) -> RoundCarry:
    """The carry after a round that read ``records`` (each replica from ``min_offsets``), with what the
    round got from the one before (``carried``)."""
    col = F.col
    segment = col("physical_offset") - col("physical_offset") % F.lit(max(1, segment_size))
    per_segment = (records.where(col("kind") == "message")
                   .groupBy("replica", segment.alias("segment"))
                   .agg(F.max("store_timestamp").alias("latest"))
                   .collect())
    latest_by_segment: dict[str, dict[int, int]] = {replica: {} for replica in min_offsets}
    for row in per_segment:
        latest_by_segment.setdefault(row["replica"], {})[int(row["segment"])] = int(row["latest"])
    before = carried.timestamps_below(min_offsets) if carried is not None else {}
    marks: dict[str, tuple[tuple[int, int], ...]] = {}
    newest: dict[str, int] = {}
    for replica, segments in latest_by_segment.items():
        running = before.get(replica)
        replica_marks = []
        for start in sorted(segments):
            if running is not None:
                replica_marks.append((start, running))
            running = segments[start] if running is None else max(running, segments[start])
        if running is not None:
            end = max(segments) + segment_size if segments else min_offsets.get(replica, 0)
            replica_marks.append((end, running))
            newest[replica] = running
        marks[replica] = tuple(replica_marks)

    recent = recent_candidates(records).select(
        "replica", message_key().alias("message_key"), "physical_offset", "store_timestamp")
    if carried is not None:
        recent = recent.unionByName(carried.recent_below(spark, min_offsets))
    window_start = replica_lookup({replica: value - UNIQ_KEY_WINDOW_MS for replica, value in newest.items()})
    newest_copies = (recent.where(col("store_timestamp") >= window_start(col("replica")))
                     .groupBy("replica", "message_key")
                     .agg(F.max(F.struct("physical_offset", "store_timestamp")).alias("copy"))
                     .select("replica", "message_key", "copy.physical_offset", "copy.store_timestamp")
                     .orderBy(col("store_timestamp").desc())
                     .limit(CARRY_ROWS_MAX + 1))
    table = newest_copies.toArrow()
    notes: tuple[str, ...] = ()
    if table.num_rows > CARRY_ROWS_MAX:
        table = table.slice(0, CARRY_ROWS_MAX)
        oldest = table.column("store_timestamp")[CARRY_ROWS_MAX - 1].as_py()
        notes = (f"the previous round carried its {CARRY_ROWS_MAX} newest UNIQ_KEY copies (from store timestamp "
                 f"{oldest} on): older copies within the window before this round were not compared",)
    return RoundCarry(marks, table, notes)
