"""Feature invariants over one replica's commit log: transactions, their op records, delay levels, retry
and dead-letter copies. Each pass takes the cached records (:mod:`spark_analytics.tables`) and yields
violations in the shape of :mod:`spark_analytics.violations`; every join is keyed by replica first, so it
uses the records' partitioning instead of shuffling them again, and joins subsets (system topics, the
records that carry the properties followed) rather than the whole log wherever it can.

The broker facts these rest on (broker/send.py, broker/delay.py, broker/send_back.py, broker/transactions.py):

* **Transactions.** A half message is stored in :data:`TRANS_HALF_TOPIC` (queue 0) with REAL_TOPIC /
  REAL_QID; its queue offset there names it. A commit is a record in the real topic with transaction type
  COMMIT (0x8), the half's UNIQ_KEY and ``preparedTransactionOffset`` = the half's physical offset. Every
  commit, rollback or discard also stores an op record in :data:`TRANS_OP_HALF_TOPIC` (the half's queue id)
  whose body is the half's queue offset in decimal and whose TAGS is ``d``, at or after the commit it
  goes with. A record of transaction type ROLLBACK (0xC) naming a half is a rollback marker (RocketMQ's
  older brokers wrote them; ours does not, but a store that has one must not also commit that half).
* **Delays.** A delayed message is stored in :data:`SCHEDULE_TOPIC` queue ``level - 1`` with REAL_TOPIC,
  REAL_QID and DELAY, then delivered as a new record in REAL_TOPIC / REAL_QID with the same UNIQ_KEY and
  reconsume times, REAL_TOPIC kept and DELAY removed, at a store time at least the level's delay after
  the scheduled record's. The replicated timer progress (``level:L`` -> the next queue offset to deliver)
  moves in the same command as the deliveries, so it says exactly which scheduled records are delivered.
* **Retries.** CONSUMER_SEND_MSG_BACK stores a copy (reconsume times + 1, RETRY_TOPIC = the original
  topic, ORIGIN_MESSAGE_ID = the original's id, the original's UNIQ_KEY) through the delay machinery into
  ``%RETRY%<group>``, or directly into ``%DLQ%<group>`` past the maximum reconsume times. The original's id
  is its store-based message id or, from Java clients (``MessageClientExt.getMsgId``), its UNIQ_KEY.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Final

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from commitlog.sys_flags import TRANSACTION_COMMIT_TYPE, TRANSACTION_ROLLBACK_TYPE, TRANSACTION_TYPE_MASK
from protocol.topics import DLQ_PREFIX, RETRY_PREFIX, SCHEDULE_TOPIC, TRANS_HALF_TOPIC, TRANS_OP_HALF_TOPIC
from spark_analytics.violations import explode_found, found, hidden

OP_TAG: Final = "d"
#: RocketMQ's default delay levels (messageDelayLevel), in seconds: level L is element L - 1
DELAY_LEVELS_SECONDS: Final = (1, 5, 10, 30, 60, 120, 180, 240, 300, 360, 420, 480, 540, 600, 1200, 1800, 3600, 7200)

#: the invariants of this module, as :data:`spark_analytics.checks.INVARIANTS` lists them
FEATURE_INVARIANTS: Final = {
    "transactions": "each commit names a stored half message, lands in the topic and queue the half names with "
                    "its UNIQ_KEY, is the half's only commit, and does not follow the half's resolution",
    "transaction_ops": "each committed (or rolled-back) half has exactly one op record; every op record's body is "
                       "the queue offset of a stored half and its TAGS is d",
    "delays": "each scheduled message is delivered at most once into the queue it names, never before its "
              "level's delay passed, and (when the checkpoint covers the whole log) exactly when the timer "
              "progress says it was",
    "retries": "retry and dead-letter copies keep the original's UNIQ_KEY, carry RETRY_TOPIC and "
               "ORIGIN_MESSAGE_ID naming the original, and count a reconsume",
}

#: replica -> delay level -> next queue offset to deliver, for replicas whose checkpoint covers their log
DelayProgress = Mapping[str, Mapping[int, int]]
ReplicaMin = Callable[[Column], Column]


def feature_records(records: DataFrame) -> DataFrame:
    """The message records every pass but one reads: system topics, records carrying REAL_TOPIC, commits
    and rollbacks, retry and dead-letter copies. Usually a sliver of the log: the caller caches it, so the
    passes scan it instead of the whole log again and again."""
    col = F.col
    transaction_type = col("sys_flag").bitwiseAND(TRANSACTION_TYPE_MASK)
    return records.where((col("kind") == "message") & (
        col("topic").isin(SCHEDULE_TOPIC, TRANS_HALF_TOPIC, TRANS_OP_HALF_TOPIC)
        | col("real_topic").isNotNull()
        | transaction_type.isin(TRANSACTION_COMMIT_TYPE, TRANSACTION_ROLLBACK_TYPE)
        | is_retry_copy()))


def feature_violations(features: DataFrame, records: DataFrame, replica_min: ReplicaMin,
                       delay_progress: DelayProgress, delay_levels_seconds: tuple[int, ...] = DELAY_LEVELS_SECONDS,
                       broadcast_copies: bool = True) -> DataFrame:
    """Every feature invariant's violations. ``features``: :func:`feature_records` of ``records`` (their
    ``body`` is needed for op records); the whole ``records`` are read once, to look the originals of
    retry copies up. ``broadcast_copies``: the copies (:func:`is_retry_copy`) are few enough to send to
    every task (the caller counted them), so that lookup does not sort the whole log."""
    messages = records.where(F.col("kind") == "message")
    return (transaction_violations(features, replica_min)
            .unionByName(delay_violations(features, delay_progress, delay_levels_seconds))
            .unionByName(retry_violations(features, replica_min, broadcast_copies, messages)))


# ---------------------------------------------------------------------------------------------- transactions


def transaction_violations(messages: DataFrame, replica_min: ReplicaMin) -> DataFrame:
    col = F.col
    transaction_type = col("sys_flag").bitwiseAND(TRANSACTION_TYPE_MASK)
    halves = messages.where(col("topic") == TRANS_HALF_TOPIC).select(
        "replica", col("physical_offset").alias("half_offset"), col("queue_id").alias("half_queue_id"),
        col("queue_offset").alias("half_queue_offset"), col("uniq_key").alias("half_uniq_key"),
        col("real_topic").alias("half_real_topic"), col("real_qid").alias("half_real_qid"),
    )
    commits = messages.where((transaction_type == TRANSACTION_COMMIT_TYPE) & (col("topic") != TRANS_HALF_TOPIC))
    rollbacks = (messages.where((transaction_type == TRANSACTION_ROLLBACK_TYPE)
                                & (col("topic") != TRANS_HALF_TOPIC))
                 .groupBy("replica", col("prepared_transaction_offset").alias("half_offset"))
                 .agg(F.min("physical_offset").alias("rollback_offset")))
    body_text = F.trim(col("body").cast("string"))
    ops = messages.where(col("topic") == TRANS_OP_HALF_TOPIC).select(
        "replica", "physical_offset", "topic", "queue_id", "queue_offset", "store_timestamp", "tags",
        body_text.alias("op_body"),
        F.when(body_text.rlike("^[0-9]{1,18}$"), body_text.cast("bigint")).alias("op_half_queue_offset"),
    )
    ops_per_half = ops.where(col("op_half_queue_offset").isNotNull()).groupBy(
        "replica", col("queue_id").alias("half_queue_id"), col("op_half_queue_offset").alias("half_queue_offset"),
    ).agg(F.count(F.lit(1)).alias("op_records"), F.min("physical_offset").alias("first_op_offset"),
          F.min_by("store_timestamp", "physical_offset").alias("first_op_timestamp"))
    commits_per_half = commits.groupBy("replica", col("prepared_transaction_offset").alias("half_offset")).agg(
        F.count(F.lit(1)).alias("commit_records"), F.min("physical_offset").alias("first_commit_offset"))

    # halves: resolved ones need exactly one op record (more than one is reported on the op records)
    resolved = (halves.join(commits_per_half, ["replica", "half_offset"], "left")
                .join(rollbacks, ["replica", "half_offset"], "left")
                .join(ops_per_half, ["replica", "half_queue_id", "half_queue_offset"], "left"))
    half_problems = explode_found(resolved.withColumn("half_topic", F.lit(TRANS_HALF_TOPIC)), [
        found("transaction_ops", col("commit_records").isNotNull() & col("op_records").isNull(),
              F.format_string("the half is committed (at physical offset %d) but has no op record",
                              col("first_commit_offset"))),
        found("transaction_ops", col("commit_records").isNull() & col("rollback_offset").isNotNull()
              & col("op_records").isNull(),
              F.format_string("the half is rolled back (at physical offset %d) but has no op record",
                              col("rollback_offset"))),
    ], topic="half_topic", queue_id="half_queue_id", queue_offset="half_queue_offset", physical_offset="half_offset")

    # commits: against their half, its first op record and each other
    same_half = Window.partitionBy("replica", "prepared_transaction_offset").orderBy("physical_offset")
    checked = (commits.withColumn("commit_number", F.row_number().over(same_half))
               .withColumn("first_commit_offset", F.first("physical_offset").over(same_half))
               .join(halves.withColumnRenamed("half_offset", "prepared_transaction_offset"),
                     ["replica", "prepared_transaction_offset"], "left")
               .join(ops_per_half.drop("op_records"), ["replica", "half_queue_id", "half_queue_offset"], "left")
               .join(rollbacks.withColumnRenamed("half_offset", "prepared_transaction_offset"),
                     ["replica", "prepared_transaction_offset"], "left"))
    has_half = col("half_queue_offset").isNotNull()
    prepared = col("prepared_transaction_offset")
    commit_problems = explode_found(checked, [
        found("transactions", ~has_half & (prepared >= replica_min(col("replica"))),
              F.format_string("commits the half at physical offset %d, where no %s record is stored", prepared,
                              F.lit(TRANS_HALF_TOPIC))),
        found("transactions", has_half & ((col("topic") != F.coalesce(col("half_real_topic"), F.lit("")))
                                         | (col("queue_id") != F.coalesce(col("half_real_qid").cast("int"), F.lit(-1)))),
              F.format_string("the half at physical offset %d names %s/%s, the commit is in %s/%d", prepared,
                              col("half_real_topic"), col("half_real_qid"), col("topic"), col("queue_id"))),
        found("transactions", has_half & ~col("uniq_key").eqNullSafe(col("half_uniq_key")),
              F.format_string("UNIQ_KEY %s is not the half's %s", F.coalesce(col("uniq_key"), F.lit("(none)")),
                              F.coalesce(col("half_uniq_key"), F.lit("(none)")))),
        found("transactions", col("commit_number") > 1,
              F.format_string("the half at physical offset %d is committed again (first commit at %d)", prepared,
                              col("first_commit_offset"))),
        found("transactions", col("first_op_timestamp") < col("store_timestamp"),
              F.format_string("committed at store time %d, after the half was resolved by the op record at "
                              "physical offset %d (store time %d)", col("store_timestamp"),
                              col("first_op_offset"), col("first_op_timestamp"))),
        found("transactions", col("rollback_offset").isNotNull(),
              F.format_string("the half at physical offset %d is also rolled back (record at %d)", prepared,
                              col("rollback_offset"))),
    ])

    # op records: readable, tagged, naming a half, one per half
    same_op_half = Window.partitionBy("replica", "queue_id", "op_half_queue_offset").orderBy("physical_offset")
    op_checked = (ops.withColumn("op_number", F.row_number().over(same_op_half))
                  .withColumn("op_count", F.count(F.lit(1)).over(same_op_half.rowsBetween(
                      Window.unboundedPreceding, Window.unboundedFollowing)))
                  .withColumn("first_op", F.first("physical_offset").over(same_op_half))
                  .join(halves.select("replica", col("half_queue_id").alias("queue_id"),
                                      col("half_queue_offset").alias("op_half_queue_offset"), "half_offset"),
                        ["replica", "queue_id", "op_half_queue_offset"], "left"))
    parsed = col("op_half_queue_offset").isNotNull()
    op_problems = explode_found(op_checked, [
        found("transaction_ops", ~parsed,
              F.format_string("op record body '%s' is not a half queue offset", F.substring(col("op_body"), 1, 40))),
        found("transaction_ops", ~F.coalesce(col("tags"), F.lit("")).eqNullSafe(F.lit(OP_TAG)),
              F.format_string("op record TAGS is '%s', not '%s'", F.coalesce(col("tags"), F.lit("")), F.lit(OP_TAG))),
        found("transaction_ops", parsed & col("half_offset").isNull() & (replica_min(col("replica")) == 0),
              F.format_string("names half queue offset %d, where no half message is stored",
                              col("op_half_queue_offset"))),
        found("transaction_ops", parsed & (col("op_number") > 1),
              F.format_string("the half at queue offset %d has %d op records (first at physical offset %d)",
                              col("op_half_queue_offset"), col("op_count"), col("first_op"))),
    ])
    return half_problems.unionByName(commit_problems).unionByName(op_problems)


# ---------------------------------------------------------------------------------------------- delays


def delay_violations(messages: DataFrame, delay_progress: DelayProgress,
                     delay_levels_seconds: tuple[int, ...] = DELAY_LEVELS_SECONDS) -> DataFrame:
    """Scheduled records and deliveries paired per (replica, real topic, UNIQ_KEY, reconsume times): the
    k-th delivery (in log order) goes with the k-th scheduled record."""
    col = F.col
    key = ["replica", "delivery_topic", "uniq_key", "reconsume_times"]
    in_key_order = Window.partitionBy(*key).orderBy("physical_offset")
    whole_key = in_key_order.rowsBetween(Window.unboundedPreceding, Window.unboundedFollowing)
    level = col("queue_id") + 1
    delays_ms = F.array(*[F.lit(seconds * 1000) for seconds in delay_levels_seconds])
    scheduled = (
        messages.where((col("topic") == SCHEDULE_TOPIC) & col("uniq_key").isNotNull() & col("real_topic").isNotNull())
        .select("replica", col("real_topic").alias("delivery_topic"), "uniq_key", "reconsume_times",
                "physical_offset", "queue_id", "queue_offset", "store_timestamp", "real_qid",
                level.alias("level"),
                F.when((level >= 1) & (level <= len(delay_levels_seconds)), F.element_at(delays_ms, level))
                .alias("delay_ms"),
                _progress_expected(delay_progress).alias("due_by_progress"))
        .withColumn("number", F.row_number().over(in_key_order))
        .withColumn("scheduled_count", F.count(F.lit(1)).over(whole_key))
        .withColumn("first_scheduled", F.first("physical_offset").over(in_key_order))
    )
    deliveries = (
        messages.where(col("real_topic").isNotNull() & (col("topic") == col("real_topic")) & col("delay").isNull()
                       & (col("topic") != SCHEDULE_TOPIC) & ~hidden(col("sys_flag")) & col("uniq_key").isNotNull())
        .select("replica", col("topic").alias("delivery_topic"), "uniq_key", "reconsume_times",
                col("physical_offset").alias("delivered_offset"), col("queue_id").alias("delivered_queue_id"),
                col("queue_offset").alias("delivered_queue_offset"),
                col("store_timestamp").alias("delivered_timestamp"))
        .withColumn("number", F.row_number().over(in_key_order.orderBy("delivered_offset")))
        .withColumn("delivered_count", F.count(F.lit(1)).over(
            Window.partitionBy(*key).rowsBetween(Window.unboundedPreceding, Window.unboundedFollowing)))
    )
    per_key = scheduled.groupBy(*key).agg(F.count(F.lit(1)).alias("key_scheduled"),
                                         F.min("physical_offset").alias("key_first_scheduled"))
    delivered_keys = deliveries.groupBy(*key).agg(F.count(F.lit(1)).alias("key_delivered"))
    paired = (deliveries.join(per_key, key, "left")
              .join(scheduled.drop("scheduled_count", "first_scheduled"), [*key, "number"], "left"))
    has_schedule = col("physical_offset").isNotNull()
    due = col("store_timestamp") + col("delay_ms")
    delivery_problems = explode_found(paired, [
        found("delays", col("physical_offset").isNull() & col("key_scheduled").isNotNull(),
              F.format_string("UNIQ_KEY %s is delivered %d times, scheduled %d times (first at physical offset %d)",
                              col("uniq_key"), col("delivered_count"), col("key_scheduled"),
                              col("key_first_scheduled"))),
        found("delays", has_schedule & (col("delivered_timestamp") < due),
              F.format_string("delivered at store time %d, %d ms before it was due: scheduled at physical offset "
                              "%d (store time %d, level %d = %d ms)", col("delivered_timestamp"),
                              due - col("delivered_timestamp"), col("physical_offset"), col("store_timestamp"),
                              col("level"), col("delay_ms"))),
        found("delays", has_schedule & (col("delivered_offset") < col("physical_offset")),
              F.format_string("delivered at physical offset %d, before it was scheduled at %d",
                              col("delivered_offset"), col("physical_offset"))),
        found("delays", has_schedule & ~col("delivered_queue_id").eqNullSafe(col("real_qid").cast("int")),
              F.format_string("delivered to queue %d, the scheduled record at physical offset %d names REAL_QID %s",
                              col("delivered_queue_id"), col("physical_offset"),
                              F.coalesce(col("real_qid"), F.lit("(none)")))),
        found("delays", has_schedule & (col("due_by_progress") == F.lit(False)),
              F.format_string("delivered, but the timer progress says %s queue %d offset %d is not delivered yet",
                              F.lit(SCHEDULE_TOPIC), col("queue_id"), col("queue_offset"))),
    ], queue_id="delivered_queue_id", queue_offset="delivered_queue_offset", physical_offset="delivered_offset",
        topic="delivery_topic")
    lost = scheduled.join(delivered_keys, key, "left").withColumn("schedule_topic", F.lit(SCHEDULE_TOPIC))
    lost_problems = explode_found(lost, [
        found("delays", (col("due_by_progress") == F.lit(True))
              & (col("number") > F.coalesce(col("key_delivered"), F.lit(0))),
              F.format_string("the timer progress says it was delivered, but %s has no delivery of UNIQ_KEY %s",
                              col("delivery_topic"), col("uniq_key"))),
        found("delays", col("delay_ms").isNull(),
              F.format_string("scheduled in queue %d: no delay level %d", col("queue_id"), col("level"))),
    ], topic="schedule_topic")
    return delivery_problems.unionByName(lost_problems)


def _progress_expected(delay_progress: DelayProgress) -> Column:
    """Whether the timer progress says a scheduled row was delivered: queue offset below the progress of
    its level (0 when the level has none); null for replicas whose progress is unknown."""
    col = F.col
    known = [replica for replica in delay_progress]
    if not known:
        return F.lit(None).cast("boolean")
    entries = [F.lit(item) for replica, levels in delay_progress.items() for level, offset in levels.items()
               for item in (f"{replica}|{level}", offset)]
    progress = F.create_map(*entries)[F.concat_ws("|", col("replica"), (col("queue_id") + 1).cast("string"))] \
        if entries else F.lit(None).cast("bigint")
    return F.when(col("replica").isin(*known), col("queue_offset") < F.coalesce(progress, F.lit(0)))


# ---------------------------------------------------------------------------------------------- retries


def is_retry_copy() -> Column:
    """Whether a message record is in a retry or dead-letter topic, or scheduled on its way to one."""
    col = F.col

    def copy_topic(topic: Column) -> Column:
        return topic.startswith(RETRY_PREFIX) | topic.startswith(DLQ_PREFIX)

    return ~hidden(col("sys_flag")) & (
        copy_topic(col("topic")) | ((col("topic") == SCHEDULE_TOPIC) & copy_topic(F.coalesce(col("real_topic"), F.lit("")))))


def retry_violations(messages: DataFrame, replica_min: ReplicaMin, broadcast_copies: bool = True,
                     lookups: DataFrame | None = None) -> DataFrame:
    """Copies in ``messages``; their originals are looked up in ``lookups`` (default ``messages``: the
    originals are in ordinary topics, so pass the whole log when ``messages`` is a subset)."""
    col = F.col
    copies = messages.where(is_retry_copy()).select(
        "replica", "physical_offset", "topic", "queue_id", "queue_offset", "uniq_key", "reconsume_times",
        "retry_topic", "origin_message_id",
        # a store-based id: store host (IPv4 + port, 16 hex digits; IPv6 + port, 40) then the physical offset (16)
        F.when(col("origin_message_id").rlike("^([0-9A-Fa-f]{40}|[0-9A-Fa-f]{16})[0-9A-Fa-f]{16}$"),
               F.conv(F.substring(col("origin_message_id"), -16, 16), 16, 10).cast("bigint")).alias("origin_offset"),
    )
    keyed = copies.where(col("uniq_key").isNotNull())
    others = (lookups if lookups is not None else messages).select("replica", col("uniq_key"), col("physical_offset").alias("other_offset"),
                             col("topic").alias("other_topic"), col("reconsume_times").alias("other_reconsume_times"))
    joined = others.join(F.broadcast(keyed) if broadcast_copies else keyed, ["replica", "uniq_key"], "inner")
    looked_up = joined.groupBy("replica", "physical_offset").agg(
        F.max((col("other_topic") == col("retry_topic")) & (col("other_offset") < col("physical_offset"))
              & (col("other_reconsume_times") < col("reconsume_times"))).alias("original_found"),
        F.max(col("other_offset") == col("origin_offset")).alias("origin_found"),
    )
    checked = copies.join(looked_up, ["replica", "physical_offset"], "left")
    min_offset = replica_min(col("replica"))
    origin = col("origin_message_id")
    return explode_found(checked, [
        found("retries", col("uniq_key").isNull(), F.lit("a retry or dead-letter copy without UNIQ_KEY")),
        found("retries", col("retry_topic").isNull(), F.lit("a retry or dead-letter copy without RETRY_TOPIC")),
        found("retries", origin.isNull(), F.lit("a retry or dead-letter copy without ORIGIN_MESSAGE_ID")),
        found("retries", col("reconsume_times") < 1,
              F.format_string("a retry or dead-letter copy with reconsume times %d", col("reconsume_times"))),
        found("retries", col("uniq_key").isNotNull() & origin.isNotNull() & (origin != col("uniq_key"))
              & col("origin_offset").isNull(),
              F.format_string("ORIGIN_MESSAGE_ID %s is neither the copy's UNIQ_KEY %s nor a store message id",
                              origin, col("uniq_key"))),
        found("retries", col("uniq_key").isNotNull() & (origin != col("uniq_key")) & col("origin_offset").isNotNull()
              & ~F.coalesce(col("origin_found"), F.lit(False)) & (col("origin_offset") >= min_offset),
              F.format_string("ORIGIN_MESSAGE_ID %s names physical offset %d, which holds no record with UNIQ_KEY %s",
                              origin, col("origin_offset"), col("uniq_key"))),
        found("retries", col("uniq_key").isNotNull() & col("retry_topic").isNotNull()
              & ~F.coalesce(col("original_found"), F.lit(False)) & (min_offset == 0),
              F.format_string("no original of UNIQ_KEY %s in topic %s (with fewer reconsumes) is stored before it",
                              col("uniq_key"), col("retry_topic"))),
    ])
