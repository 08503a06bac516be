"""Client histories joined against what the replicas hold: acknowledged sends that are absent, messages
stored twice, acknowledged offsets that are not where the message is, reorderings, deliveries of
messages the replicas do not hold.

History format (JSON lines; what the chaos workloads write, chaos/history.py, is accepted as it is):

* one JSON object per line; blank lines are skipped; ``"type"`` says what the line is, and lines of other
  types (``run`` aside), and fields not listed here, are ignored;
* ``{"type": "run", "topic": T}``: optional; the topic of later lines that name none;
* ``{"type": "send", "uniq_key": K, "topic": T, "queue": Q, "queue_offset": O, "acked": true}``: one send
  attempt. ``uniq_key`` is required; ``topic`` unless a run line gave one; ``acked`` defaults to true
  (``false``: the outcome is unknown, the message may be stored once or not at all); ``queue`` (or
  ``queue_id``) and ``queue_offset`` are what the broker answered (optional; without them the position is
  not checked); ``delay_level`` > 0 marks a delayed send, whose answer is the schedule queue's (its
  position is not checked; it counts as stored while it waits in the schedule topic);
  ``send_time`` / ``end_time`` (seconds, any origin shared by the file) enable the ordering check below.
  Attempts with the same UNIQ_KEY are one message: acknowledged if any attempt was.
* ``{"type": "deliver", "uniq_key": K, "topic": T, "queue": Q, "queue_offset": O}``: a consumer received K
  from that position (``group`` and other fields are ignored).

Findings, per replica:

* ``lost``: acknowledged, and no record of its topic holds the UNIQ_KEY (nor does the schedule or
  transaction-half topic hold it for that topic);
* ``duplicated``: the UNIQ_KEY is stored more than once in its topic (reconsume times 0), acknowledged or not;
* ``offset_mismatch``: stored at another queue or queue offset than acknowledged;
* ``reordered``: two acknowledged sends of one queue stored in the other order than their acknowledged
  offsets say, or than real time says: a message acknowledged before another was first sent is stored
  after it (needs ``send_time`` and ``end_time``);
* ``delivered_not_stored``: a delivery from a position where the replica holds another message or none.
"""

from __future__ import annotations

import collections
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import (
    BooleanType,
    DoubleType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from protocol.topics import SCHEDULE_TOPIC, TRANS_HALF_TOPIC
from spark_analytics.results import HistoryReplica, HistoryResult, InvariantResult, Violation
from spark_analytics.tables import ReplicaTables
from spark_analytics.violations import hidden

#: a line longer than this is not a history line
LINE_BYTES_MAX: Final = 1 << 20
#: lines one history may have (the parsed history is held on the driver: ~200 bytes a message)
HISTORY_LINES_MAX: Final = 20_000_000
#: history rows up to this many are sent to every task (the records are then only streamed past them);
#: more are joined by shuffling both sides
BROADCAST_ROWS_MAX: Final = 500_000
EXAMPLES_MAX: Final = 5

FINDINGS: Final = {
    "lost": "every acknowledged send is stored in its topic (or waits in the schedule or half topic for it)",
    "duplicated": "no sent message is stored twice in its topic",
    "offset_mismatch": "every acknowledged send is stored at the queue and queue offset it was acknowledged with",
    "reordered": "acknowledged sends of a queue are stored in the order of their acknowledged offsets, and a "
                 "send acknowledged before another was sent is stored before it",
    "delivered_not_stored": "every delivery came from a position that holds the delivered message",
}

SEND_SCHEMA: Final = StructType([
    StructField("line", LongType(), False),
    StructField("uniq_key", StringType(), False),
    StructField("send_topic", StringType(), False),
    StructField("acked_queue_id", IntegerType(), True),
    StructField("acked_queue_offset", LongType(), True),
    StructField("acked", BooleanType(), False),
    StructField("delayed", BooleanType(), False),
    StructField("start_time", DoubleType(), True),
    StructField("ack_time", DoubleType(), True),
])
DELIVERY_SCHEMA: Final = StructType([
    StructField("line", LongType(), False),
    StructField("uniq_key", StringType(), False),
    StructField("delivered_topic", StringType(), False),
    StructField("delivered_queue_id", IntegerType(), False),
    StructField("delivered_queue_offset", LongType(), False),
    StructField("deliveries", LongType(), False),
])


class HistoryError(ValueError):
    """A history file that cannot be read (a usage error for ``verify``); the message names the line."""


@dataclass(frozen=True, slots=True)
class SentMessage:
    """The attempts with one UNIQ_KEY, merged. ``line``: the first attempt's line (the acknowledged
    one's when there is one); ``start_time``: the first attempt's send time; ``ack_time``: the first
    acknowledgement's end time."""

    line: int
    uniq_key: str
    topic: str
    queue_id: int | None
    queue_offset: int | None
    acked: bool
    delayed: bool
    start_time: float | None
    ack_time: float | None


@dataclass(frozen=True, slots=True)
class Delivery:
    line: int
    uniq_key: str
    topic: str
    queue_id: int
    queue_offset: int
    deliveries: int


@dataclass(frozen=True, slots=True)
class History:
    path: str
    sends: tuple[SentMessage, ...]
    deliveries: tuple[Delivery, ...]

    @property
    def acknowledged(self) -> int:
        return sum(1 for send in self.sends if send.acked)


def read_history(path: Path | str) -> History:
    """Parse a history file (see the module docstring); :class:`HistoryError` names the bad line."""
    try:
        with open(path, encoding="utf-8") as handle:
            return parse_history(handle, str(path))
    except OSError as exc:
        raise HistoryError(f"cannot read the history {path}: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise HistoryError(f"the history {path} is not UTF-8 text: {exc}") from exc


def parse_history(lines: Iterable[str], name: str = "<history>") -> History:
    sends: dict[str, SentMessage] = {}
    deliveries: dict[tuple[str, str, int, int], Delivery] = {}
    default_topic: str | None = None
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{name}:{number}"
        if number > HISTORY_LINES_MAX:
            raise HistoryError(f"{where}: a history has at most {HISTORY_LINES_MAX} lines")
        if len(line) > LINE_BYTES_MAX:
            raise HistoryError(f"{where}: a line of {len(line)} bytes is too long")
        try:
            document = json.loads(line)
        except ValueError as exc:
            raise HistoryError(f"{where}: not JSON: {exc}") from None
        if not isinstance(document, dict):
            raise HistoryError(f"{where}: a history line must be a JSON object")
        kind = document.get("type")
        if kind == "run":
            topic = document.get("topic")
            default_topic = _text(document, "topic", where) if topic is not None else default_topic
        elif kind == "send":
            send = _send(document, number, default_topic, where)
            sends[send.uniq_key] = _merge(sends.get(send.uniq_key), send)
        elif kind == "deliver":
            key = (_text(document, "uniq_key", where), _topic(document, default_topic, where),
                   _integer(document, ("queue", "queue_id"), where, required=True) or 0,
                   _integer(document, ("queue_offset",), where, required=True) or 0)
            seen = deliveries.get(key)
            deliveries[key] = Delivery(seen.line if seen else number, *key, (seen.deliveries if seen else 0) + 1)
    return History(name, tuple(sends.values()), tuple(deliveries.values()))


def _send(document: Mapping[str, Any], number: int, default_topic: str | None, where: str) -> SentMessage:
    acked = document.get("acked", True)
    if not isinstance(acked, bool):
        raise HistoryError(f"{where}: acked must be true or false")
    delay_level = _integer(document, ("delay_level",), where) or 0
    return SentMessage(number, _text(document, "uniq_key", where), _topic(document, default_topic, where),
                       _integer(document, ("queue", "queue_id"), where), _integer(document, ("queue_offset",), where),
                       acked, delay_level > 0, _seconds(document, "send_time", where),
                       _seconds(document, "end_time", where) if acked else None)


def _merge(earlier: SentMessage | None, attempt: SentMessage) -> SentMessage:
    if earlier is None:
        return attempt
    first_ack = earlier if earlier.acked else attempt if attempt.acked else earlier
    starts = [time for time in (earlier.start_time, attempt.start_time) if time is not None]
    return SentMessage(first_ack.line, earlier.uniq_key, first_ack.topic, first_ack.queue_id, first_ack.queue_offset,
                       earlier.acked or attempt.acked, earlier.delayed or attempt.delayed,
                       min(starts) if starts else None, first_ack.ack_time)


def _text(document: Mapping[str, Any], name: str, where: str) -> str:
    value = document.get(name)
    if not isinstance(value, str) or not value:
        raise HistoryError(f"{where}: {name} must be a non-empty string")
    return value


def _topic(document: Mapping[str, Any], default_topic: str | None, where: str) -> str:
    if document.get("topic") is None:
        if default_topic is None:
            raise HistoryError(f"{where}: no topic (neither on the line nor in an earlier run line)")
        return default_topic
    return _text(document, "topic", where)


def _integer(document: Mapping[str, Any], names: Sequence[str], where: str, required: bool = False) -> int | None:
    for name in names:
        value = document.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise HistoryError(f"{where}: {name} must be a non-negative integer, got {value!r}")
        return value
    if required:
        raise HistoryError(f"{where}: {' or '.join(names)} is required")
    return None


def _seconds(document: Mapping[str, Any], name: str, where: str) -> float | None:
    value = document.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise HistoryError(f"{where}: {name} must be a number of seconds, got {value!r}")
    return float(value)


# ---------------------------------------------------------------------------------------------- the check


def check_history(spark: SparkSession, cluster_dir: Path | str, history: History | Path | str,
                  tables: ReplicaTables | None = None, examples_max: int = EXAMPLES_MAX) -> HistoryResult:
    """Join ``history`` (a parsed history or its file) against every replica under ``cluster_dir``."""
    parsed = history if isinstance(history, History) else read_history(history)
    owned = tables is None
    if tables is None:
        tables = ReplicaTables(spark, cluster_dir)
    try:
        rows = _findings(spark, tables, parsed, examples_max)
    finally:
        if owned:
            tables.close()
    counts: dict[tuple[str, str], int] = {}
    examples: dict[tuple[str, str], list[Violation]] = collections.defaultdict(list)
    for row in rows:
        key = (row["invariant"], row["replica"])
        counts[key] = row["violations"]
        examples[key].append(Violation(row["invariant"], row["replica"], row["physical_offset"], row["topic"],
                                       row["queue_id"], row["queue_offset"], row["detail"]))
    replicas = []
    for replica in tables.replicas:
        checks = tuple(InvariantResult(name, description, counts.get((name, replica.name), 0) == 0,
                                       counts.get((name, replica.name), 0), tuple(examples.get((name, replica.name), ())))
                       for name, description in FINDINGS.items())
        replicas.append(HistoryReplica(replica.name, all(check.ok for check in checks), checks))
    return HistoryResult(all(replica.ok for replica in replicas), parsed.path, parsed.acknowledged,
                         len(parsed.sends) - parsed.acknowledged, sum(d.deliveries for d in parsed.deliveries),
                         tuple(replicas))


def _frame(spark: SparkSession, rows: Sequence[tuple[Any, ...]], schema: StructType) -> DataFrame:
    """A DataFrame from driver rows through Arrow (a million rows in seconds, not minutes)."""
    import pyarrow
    from pyspark.sql.pandas.types import to_arrow_schema

    columns = list(zip(*rows, strict=True)) if rows else [() for _ in schema.fields]
    table = pyarrow.Table.from_pydict(
        {field.name: list(column) for field, column in zip(schema.fields, columns, strict=True)},
        schema=to_arrow_schema(schema))
    return spark.createDataFrame(table, schema=schema)


def _findings(spark: SparkSession, tables: ReplicaTables, history: History, examples_max: int) -> list[Any]:
    col = F.col
    names = [replica.name for replica in tables.replicas]
    replica_names = spark.createDataFrame([(name,) for name in names], "replica string")
    sends = _frame(spark, [(s.line, s.uniq_key, s.topic, s.queue_id, s.queue_offset, s.acked, s.delayed,
                            s.start_time, s.ack_time) for s in history.sends], SEND_SCHEMA)
    deliveries = _frame(spark, [(d.line, d.uniq_key, d.topic, d.queue_id, d.queue_offset, d.deliveries)
                                for d in history.deliveries], DELIVERY_SCHEMA)
    small = len(history.sends) + len(history.deliveries) <= BROADCAST_ROWS_MAX

    def spread(frame: DataFrame) -> DataFrame:
        return F.broadcast(frame) if small else frame

    records = tables.records.where((col("kind") == "message") & ~hidden(col("sys_flag")) & col("uniq_key").isNotNull())
    # sends: every record holding a sent UNIQ_KEY in the sent topic, or waiting for it in the schedule
    # or half topic
    matched = records.join(spread(sends), "uniq_key").where(
        (col("topic") == col("send_topic"))
        | (col("topic").isin(SCHEDULE_TOPIC, TRANS_HALF_TOPIC) & (col("real_topic") == col("send_topic"))))
    in_topic = (col("topic") == col("send_topic")) & (col("reconsume_times") == 0)
    stored = matched.groupBy("replica", "line").agg(
        F.sum(F.when(in_topic, 1).otherwise(0)).alias("copies"),
        F.sum(F.when(~in_topic & (col("topic") != col("send_topic")), 1).otherwise(0)).alias("waiting"),
        F.min_by(F.struct("physical_offset", "queue_id", "queue_offset"),
                 F.when(in_topic, col("physical_offset"))).alias("first"),
        F.slice(F.array_sort(F.collect_list(F.when(in_topic, col("physical_offset")))), 1, 5).alias("offsets"),
    )
    per_replica = (sends.crossJoin(replica_names).join(stored, ["replica", "line"], "left")
                   .withColumn("copies", F.coalesce(col("copies"), F.lit(0)))
                   .withColumn("waiting", F.coalesce(col("waiting"), F.lit(0)))
                   .withColumn("stored_offset", col("first.physical_offset"))
                   .withColumn("stored_queue_id", col("first.queue_id"))
                   .withColumn("stored_queue_offset", col("first.queue_offset")))
    positioned = col("acked") & ~col("delayed") & col("acked_queue_offset").isNotNull()
    ordered = (positioned & col("acked_queue_id").isNotNull() & (col("copies") == 1)
               & (col("stored_queue_id") == col("acked_queue_id")))
    by_acked_offset = Window.partitionBy("replica", "send_topic", "acked_queue_id").orderBy("acked_queue_offset")
    by_stored_offset = Window.partitionBy("replica", "send_topic", "stored_queue_id").orderBy("stored_queue_offset")
    later = by_stored_offset.rowsBetween(1, Window.unboundedFollowing)
    timed = (col("acked") & (col("copies") == 1) & ~col("delayed"))
    checked = (per_replica
               .withColumn("previous_stored", F.lag(F.when(ordered, col("stored_queue_offset"))).over(
                   by_acked_offset.orderBy(F.when(ordered, col("acked_queue_offset")).asc_nulls_first())))
               .withColumn("previous_key", F.lag(F.when(ordered, col("uniq_key"))).over(
                   by_acked_offset.orderBy(F.when(ordered, col("acked_queue_offset")).asc_nulls_first())))
               .withColumn("earliest_later_ack", F.min(F.when(timed, col("ack_time"))).over(later))
               .withColumn("earliest_later_key", F.min_by(F.when(timed, col("uniq_key")),
                                                          F.when(timed, col("ack_time"))).over(later)))
    send_findings = _located(checked, "line", "stored_offset", "send_topic", "acked_queue_id", "acked_queue_offset", [
        _finding("lost", col("acked") & (col("copies") == 0) & (col("waiting") == 0),
                 F.format_string("line %d: acknowledged, but no record of %s holds UNIQ_KEY %s", col("line"),
                                 col("send_topic"), col("uniq_key"))),
        _finding("duplicated", col("copies") > 1,
                 F.format_string("line %d: UNIQ_KEY %s is stored %d times in %s (physical offsets %s)", col("line"),
                                 col("uniq_key"), col("copies"), col("send_topic"),
                                 F.array_join(col("offsets").cast("array<string>"), ", "))),
        _finding("offset_mismatch", positioned & (col("copies") >= 1)
                 & ((col("stored_queue_offset") != col("acked_queue_offset"))
                    | (col("acked_queue_id").isNotNull() & (col("stored_queue_id") != col("acked_queue_id")))),
                 F.format_string("line %d: UNIQ_KEY %s acknowledged at queue %s offset %d, stored at queue %d offset %d",
                                 col("line"), col("uniq_key"), F.coalesce(col("acked_queue_id").cast("string"), F.lit("?")),
                                 col("acked_queue_offset"), col("stored_queue_id"), col("stored_queue_offset"))),
        _finding("reordered", ordered & (col("previous_stored") > col("stored_queue_offset")),
                 F.format_string("line %d: UNIQ_KEY %s was acknowledged after %s, but is stored before it (queue "
                                 "offset %d, the other at %d)", col("line"), col("uniq_key"), col("previous_key"),
                                 col("stored_queue_offset"), col("previous_stored"))),
        _finding("reordered", timed & col("start_time").isNotNull() & (col("earliest_later_ack") <= col("start_time")),
                 F.format_string("line %d: UNIQ_KEY %s (first sent at %.3f s) is stored before %s, which was "
                                 "acknowledged at %.3f s", col("line"), col("uniq_key"), col("start_time"),
                                 col("earliest_later_key"), col("earliest_later_ack"))),
    ])
    # deliveries: what the replica holds at the delivered position
    at_position = records.join(spread(deliveries), (col("topic") == col("delivered_topic"))
                               & (col("queue_id") == col("delivered_queue_id"))
                               & (col("queue_offset") == col("delivered_queue_offset"))).select(
        "replica", "line", col("physical_offset").alias("held_offset"), records["uniq_key"].alias("held_key"))
    delivered = deliveries.crossJoin(replica_names).join(at_position, ["replica", "line"], "left")
    delivery_findings = _located(delivered, "line", "held_offset", "delivered_topic", "delivered_queue_id",
                                 "delivered_queue_offset", [
        _finding("delivered_not_stored", col("held_key").isNull() | (col("held_key") != col("uniq_key")),
                 F.format_string("line %d: UNIQ_KEY %s delivered (%d times) from here, where the replica holds %s",
                                 col("line"), col("uniq_key"), col("deliveries"),
                                 F.when(col("held_key").isNull(), F.lit("no message"))
                                 .otherwise(F.format_string("UNIQ_KEY %s at physical offset %d", col("held_key"),
                                                            col("held_offset"))))),
    ])
    findings = send_findings.unionByName(delivery_findings)
    group = Window.partitionBy("invariant", "replica")
    return (findings.withColumn("violations", F.count(F.lit(1)).over(group))
            .withColumn("rank", F.row_number().over(group.orderBy("line", "detail")))
            .where(col("rank") <= examples_max).collect())


def _finding(name: str, condition: Column, detail: Column) -> Column:
    return F.when(condition, F.struct(F.lit(name).alias("invariant"), detail.alias("detail")))


def _located(frame: DataFrame, line: str, physical_offset: str, topic: str, queue_id: str, queue_offset: str,
             candidates: list[Column]) -> DataFrame:
    return frame.select(
        "replica", F.col(line).alias("line"), F.col(physical_offset).cast("bigint").alias("physical_offset"),
        F.col(topic).alias("topic"), F.col(queue_id).cast("int").alias("queue_id"),
        F.col(queue_offset).cast("bigint").alias("queue_offset"),
        F.explode(F.filter(F.array(*candidates), lambda entry: entry.isNotNull())).alias("found"),
    ).select("found.invariant", "replica", "line", "physical_offset", "topic", "queue_id", "queue_offset",
             "found.detail")
