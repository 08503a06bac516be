"""The checks: each takes a SparkSession and a cluster directory and returns a typed result.

* :func:`check_byte_equality`: the replicas' commit logs are byte-identical over the range all of them
  hold. Executors hash fixed-size blocks of every segment; the driver votes per block, names the outvoted
  replica, and pins each difference to its first byte and the record holding it.
* :func:`check_integrity`: each replica on its own is sound: records readable, CRCs right, physical
  offsets back to back, queue offsets without gaps, consume queues matching the commit log both ways,
  store timestamps non-decreasing, no message stored twice, and the feature invariants of
  :mod:`spark_analytics.features` (transactions and their op records, delays, retry and dead-letter copies).

Both read the files through the data sources of :mod:`spark_analytics.sources` (registered here if
needed). They expect replicas at rest (a stopped cluster, or one that is not being written to).
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from pathlib import Path
from typing import Final

from pyspark.sql import Column, DataFrame, Row, SparkSession, Window
from pyspark.sql import functions as F

from commitlog.sys_flags import TRANSACTION_ROLLBACK_TYPE, TRANSACTION_TYPE_MASK
from dledger.apply import UNIQ_KEY_WINDOW_MS
from spark_analytics.equality import (
    first_difference,
    locate,
    range_digest,
    read_range,
    vote,
)
from spark_analytics.features import FEATURE_INVARIANTS, feature_records, feature_violations, is_retry_copy
from spark_analytics.layout import CUT_PREFIX, Replica, list_replicas, segment_size_bytes
from spark_analytics.replicated_state import delay_progress, read_checkpoints
from spark_analytics.results import (
    ByteDifference,
    ByteEqualityResult,
    IntegrityResult,
    InvariantResult,
    ReplicaExtent,
    ReplicaIntegrity,
    SegmentComparison,
    Violation,
)
from spark_analytics.rounds import RoundCarry, message_key, recent_candidates
from spark_analytics.sources import BLOCK_SIZE_BYTES_DEFAULT, BLOCKS_SOURCE, register_sources
from spark_analytics.tables import ReplicaTables
from spark_analytics.violations import explode_found, found, hidden, replica_lookup

#: differing blocks examined byte by byte on the driver (each costs a read of the block on every replica)
DIFFERENCES_MAX: Final = 10
#: examples kept per invariant and replica
EXAMPLES_MAX: Final = 5

#: retry and dead-letter copies up to this many are sent to every task to look their originals up; more are
#: joined by sorting (both sides are keyed by replica, so neither is shuffled)
BROADCAST_ROWS_MAX: Final = 200_000

INVARIANTS: Final = {
    "files": "segment and consume-queue files have the size they were preallocated with",
    "records_readable": "every stretch of every segment is a record, a filler reaching the segment end, or the "
                        "all-zero tail",
    "crc": "every message record's body matches its body CRC",
    "physical_offsets": "records lie back to back, each at the physical offset it records: no gap, no overlap, "
                        "fillers only at segment ends, nothing after the all-zero tail",
    "queue_offsets": "each queue's visible records carry offsets min..max without gaps or repeats, from 0 unless "
                     "retention removed the start",
    "consume_queue": "every consume-queue unit points at a record of its topic, queue and offset with its size "
                     "and tag hash; every visible record is in exactly one unit",
    "store_timestamps": "store timestamps never decrease in commit-log order",
    "unique_keys": "no message is stored twice within the broker's deduplication window: no visible record repeats "
                   "the (topic, UNIQ_KEY, reconsume times) and content (flag, body, properties less the "
                   "per-attempt ones: commitlog.retries) of one stored less than UNIQ_KEY_WINDOW_MS before it",
    "key_index": "every KEYS and UNIQ_KEY of every record not rolled back is in the key index exactly once, every "
                 "entry points at a record with its key, and lookups reach every entry",
    **FEATURE_INVARIANTS,
}


# ---------------------------------------------------------------------------------------------- byte equality


def check_byte_equality(spark: SparkSession, cluster_dir: Path | str,
                        block_size_bytes: int = BLOCK_SIZE_BYTES_DEFAULT,
                        differences_max: int = DIFFERENCES_MAX, member_digests: bool = True) -> ByteEqualityResult:
    """Compare the replicas' commit logs over ``[max of first offsets, min of data ends)``.

    A replica that ends earlier is behind, not different: the bytes past its end are not compared (its
    extent is in the result). Raises :class:`spark_analytics.layout.LayoutError` for an unreadable layout.
    For a live group's cut, ``member_digests`` has each member hash its own blocks (only digests travel);
    without it the executors read every byte over the network. Either way the driver reads the bytes of
    differing blocks from the members to find the first differing byte.
    """
    register_sources(spark)
    replicas = list_replicas(Path(cluster_dir))
    names = [replica.name for replica in replicas]
    by_name = {replica.name: replica for replica in replicas}
    segment_size = segment_size_bytes(replicas)
    block_size = min(block_size_bytes, segment_size) if segment_size else block_size_bytes
    rows = (
        spark.read.format(BLOCKS_SOURCE)
        .option("block_size_bytes", str(block_size))
        .option("segment_size_bytes", str(segment_size))
        .option("member_digests", str(member_digests).lower())
        .load(str(cluster_dir))
        .collect()
    )
    hashed_by = "members" if member_digests and str(cluster_dir).startswith(CUT_PREFIX) else "executors"
    data_ends = {row["replica"]: row["data_end"] for row in rows if row["data_end"] is not None}
    extents = tuple(
        ReplicaExtent(replica.name, replica.min_offset, data_ends.get(replica.name, replica.min_offset),
                      len(replica.segments))
        for replica in replicas
    )
    common_start = max(extent.min_offset for extent in extents)
    common_end = min(extent.data_end for extent in extents)
    notes = _extent_notes(extents, common_start, common_end)

    blocks: dict[int, dict[str, tuple[int, bytes]]] = collections.defaultdict(dict)
    for row in rows:
        offset = row["block_offset"]
        if common_start <= offset < common_end:
            blocks[offset][row["replica"]] = (row["block_bytes"], bytes(row["digest"]))

    differing: list[tuple[int, int, tuple[str, ...], tuple[str, ...]]] = []  # (offset, end, reference, odd)
    segments_compared: set[int] = set()
    segment_blocks: dict[int, list[tuple[str, ...]]] = collections.defaultdict(list)
    without_majority = 0
    for offset in sorted(blocks):
        digests = blocks[offset]
        segment = offset - offset % segment_size
        end = min(segment + segment_size, (offset // block_size + 1) * block_size, common_end)
        if any(size > end - offset for size, _ in digests.values()):
            # the block the common range ends in: longer replicas hashed bytes past the end; compare here
            digests = {name: range_digest(read_range(by_name[name], segment_size, offset, end)) for name in names}
        outcome = vote(digests, names)
        segments_compared.add(segment)
        segment_blocks[segment].append(outcome.odd)
        if outcome.differs:
            without_majority += not outcome.majority
            reference = outcome.majority or (names[0],)
            differing.append((offset, end, reference, outcome.odd))

    differences = [
        _first_difference(by_name, segment_size, offset, end, reference, odd_replica)
        for offset, end, reference, odd in differing[:differences_max]
        for odd_replica in odd
    ]
    differing_segments = tuple(
        SegmentComparison(segment, len(outcomes), sum(1 for odd in outcomes if odd),
                          tuple(name for name in names if any(name in odd for odd in outcomes)))
        for segment, outcomes in sorted(segment_blocks.items())
        if any(outcomes)
    )
    odd_replicas = tuple(name for name in names if any(name in odd for _, _, _, odd in differing))
    return ByteEqualityResult(
        ok=not differing,
        replicas=tuple(names),
        common_start=common_start,
        common_end=common_end,
        block_size_bytes=block_size,
        bytes_compared_per_replica=max(0, common_end - common_start),
        segments_compared=len(segments_compared),
        segments_differing=len(differing_segments),
        blocks_compared=len(blocks),
        blocks_differing=len(differing),
        blocks_without_majority=without_majority,
        odd_replicas=odd_replicas,
        extents=extents,
        differing_segments=differing_segments,
        differences=tuple(sorted((d for d in differences if d is not None),
                                 key=lambda d: (d.physical_offset, d.replica))),
        notes=notes,
        hashed_by=hashed_by,
    )


def _extent_notes(extents: tuple[ReplicaExtent, ...], common_start: int, common_end: int) -> tuple[str, ...]:
    notes = []
    longest = max(extent.data_end for extent in extents)
    for extent in extents:
        if extent.segment_files == 0:
            notes.append(f"{extent.replica} holds no commit-log segment")
        elif extent.data_end < longest:
            notes.append(f"{extent.replica}'s data ends at {extent.data_end}, before {longest}: it is behind, and "
                         f"the bytes past {common_end} are not compared")
    if common_end <= common_start:
        notes.append(f"the replicas have no range in common ([{common_start}, {common_end})): nothing compared")
    return tuple(notes)


def _first_difference(replicas: dict[str, Replica], segment_size: int, offset: int, end: int,
                      reference: tuple[str, ...], odd_replica: str) -> ByteDifference | None:
    expected = read_range(replicas[reference[0]], segment_size, offset, end)
    actual = read_range(replicas[odd_replica], segment_size, offset, end)
    index = first_difference(expected, actual)
    if index is None:  # equal bytes, different digests: only a file changing under the check does that
        return None
    position = offset + index
    return ByteDifference(
        physical_offset=position,
        segment=offset - offset % segment_size,
        block_offset=offset,
        replica=odd_replica,
        reference_replicas=reference,
        expected_byte=expected[index] if index < len(expected) else None,
        actual_byte=actual[index] if index < len(actual) else None,
        expected=locate(replicas[reference[0]], segment_size, position),
        actual=locate(replicas[odd_replica], segment_size, position),
    )


# ---------------------------------------------------------------------------------------------- integrity


def check_integrity(spark: SparkSession, cluster_dir: Path | str, examples_max: int = EXAMPLES_MAX,
                    tables: ReplicaTables | None = None, carried: RoundCarry | None = None) -> IntegrityResult:
    """Check every replica's invariants (see :data:`INVARIANTS`), all replicas in the same Spark jobs.
    ``tables``: the replicas' files already cached (``verify`` shares them between checks); without
    them they are read here, and released on return. ``carried``: what the previous round of a continuous
    audit read below where this one starts (:mod:`spark_analytics.rounds`): store timestamps and UNIQ_KEY
    copies are then compared across the rounds' boundary too."""
    owned = tables is None
    if tables is None:
        tables = ReplicaTables(spark, cluster_dir)
    try:
        return _check_integrity(tables, examples_max, carried)
    finally:
        if owned:
            tables.close()


def _check_integrity(tables: ReplicaTables, examples_max: int, carried: RoundCarry | None) -> IntegrityResult:
    replicas, records, units = tables.replicas, tables.records, tables.units
    summary = {row["replica"]: row for row in
               _record_summary(records).join(_unit_summary(units), "replica", "full_outer").collect()}
    min_offsets = tables.min_offsets
    data_ends = {replica.name: _summary_value(summary.get(replica.name), "data_end", replica.min_offset)
                 for replica in replicas}
    checkpoints = read_checkpoints(replicas)
    progress = delay_progress(checkpoints, data_ends)
    notes = [f"{checkpoint.replica}: the checkpoint does not cover the whole commit log (or carries no "
             f"replicated state): scheduled messages are not checked against the timer progress"
             for checkpoint in checkpoints if checkpoint.replica not in progress]
    notes.extend(carried.notes if carried is not None else ())
    earlier_timestamps = carried.timestamps_below(min_offsets) if carried is not None else {}
    earlier_copies = carried.recent_below(tables.spark, min_offsets) if carried is not None else None
    copies = sum(_summary_value(row, "retry_copies") for row in summary.values())
    features = feature_records(records).persist()
    try:
        violations = (_violations(records, units, min_offsets, earlier_timestamps, earlier_copies)
                      .unionByName(_key_index_violations(records, tables.entries, replica_lookup(min_offsets)))
                      .unionByName(feature_violations(features, records, replica_lookup(min_offsets), progress,
                                                      broadcast_copies=copies <= BROADCAST_ROWS_MAX)))
        rows = _ranked_violations(violations, examples_max).collect()
    finally:
        features.unpersist()

    counts: dict[tuple[str, str], int] = {}
    examples: dict[tuple[str, str], list[Violation]] = collections.defaultdict(list)
    for row in rows:
        key = (row["invariant"], row["replica"])
        counts[key] = row["violations"]
        examples[key].append(Violation(row["invariant"], row["replica"], row["physical_offset"],
                                       row["topic"], row["queue_id"], row["queue_offset"], row["detail"]))
    for violation in _file_violations(replicas, tables.segment_size):
        key = (violation.invariant, violation.replica)
        counts[key] = counts.get(key, 0) + 1
        if len(examples[key]) < examples_max:
            examples[key].append(violation)

    results = []
    for replica in replicas:
        invariants = tuple(
            InvariantResult(name, description, counts.get((name, replica.name), 0) == 0,
                            counts.get((name, replica.name), 0), tuple(examples.get((name, replica.name), ())))
            for name, description in INVARIANTS.items()
        )
        counted = summary.get(replica.name)
        results.append(ReplicaIntegrity(
            replica=replica.name,
            ok=all(result.ok for result in invariants),
            messages=_summary_value(counted, "messages"),
            fillers=_summary_value(counted, "fillers"),
            invalid_stretches=_summary_value(counted, "invalid"),
            data_end=data_ends[replica.name],
            queues=_summary_value(counted, "queues"),
            consume_queue_units=_summary_value(counted, "units"),
            invariants=invariants,
        ))
    return IntegrityResult(all(result.ok for result in results), tuple(results), tuple(notes))


def _summary_value(row: Row | None, name: str, default: int = 0) -> int:
    """A count of the summary; a replica without records (or units) has no row (or nulls)."""
    value = row[name] if row is not None else None
    return int(value) if value is not None else default


def _record_summary(records: DataFrame) -> DataFrame:
    kind = F.col("kind")
    return records.groupBy("replica").agg(
        F.sum(F.when(kind == "message", 1).otherwise(0)).alias("messages"),
        F.sum(F.when(kind == "filler", 1).otherwise(0)).alias("fillers"),
        F.sum(F.when(kind == "invalid", 1).otherwise(0)).alias("invalid"),
        F.max(F.when(kind != "end", F.col("physical_offset") + F.col("total_size"))).alias("data_end"),
        F.sum(F.when((kind == "message") & is_retry_copy(), 1).otherwise(0)).alias("retry_copies"),
    )


def _unit_summary(units: DataFrame) -> DataFrame:
    return units.groupBy("replica").agg(
        F.count(F.lit(1)).alias("units"),
        F.countDistinct("topic", "queue_id").alias("queues"),
    )


def _violations(records: DataFrame, units: DataFrame, min_offsets: dict[str, int],
                earlier_timestamps: dict[str, int] | None = None, earlier_copies: DataFrame | None = None) -> DataFrame:
    """Every violation of every replica, in four passes: commit-log order, queue order, UNIQ_KEY groups,
    and consume-queue units joined with records. ``earlier_*``: what earlier rounds of a continuous audit
    read below where this one starts (:class:`spark_analytics.rounds.RoundCarry`)."""
    return (_log_order_violations(records, earlier_timestamps or {})
            .unionByName(_queue_order_violations(records, replica_lookup(min_offsets)))
            .unionByName(_unique_key_violations(records, earlier_copies))
            .unionByName(_consume_queue_violations(records, units, replica_lookup(min_offsets))))


def _log_order_violations(records: DataFrame, earlier_timestamps: dict[str, int] | None = None) -> DataFrame:
    """Readability, CRCs, physical offsets and store timestamps: one sort per replica in log order.
    ``earlier_timestamps``: the largest store timestamp each replica holds below what is read here (an
    earlier round's)."""
    col = F.col
    in_log_order = Window.partitionBy("replica").orderBy("physical_offset")
    earlier = replica_lookup(earlier_timestamps or {})
    ordered = (
        records
        .withColumn("previous_end", F.lag(col("physical_offset") + col("total_size")).over(in_log_order))
        .withColumn("previous_kind", F.lag("kind").over(in_log_order))
        .withColumn("previous_timestamp_max", F.greatest(F.max("store_timestamp").over(
            in_log_order.rowsBetween(Window.unboundedPreceding, -1)), earlier(col("replica"))))
    )
    message = col("kind") == "message"
    previous_end = col("previous_end")
    return explode_found(ordered, [
        found("records_readable", col("kind") == "invalid",
               F.format_string("%d bytes are not a record: %s", col("total_size"), col("problem"))),
        found("crc", message & ~col("crc_ok"),
               F.format_string("body CRC %d does not match the body's %d bytes", col("body_crc"), col("body_length"))),
        found("physical_offsets", message & (col("stored_physical_offset") != col("physical_offset")),
               F.format_string("the record says it is at physical offset %d", col("stored_physical_offset"))),
        found("physical_offsets", previous_end.isNotNull() & (previous_end < col("physical_offset")),
               F.format_string("%d bytes missing before this offset: the previous stretch ends at %d",
                               col("physical_offset") - previous_end, previous_end)),
        found("physical_offsets", previous_end.isNotNull() & (previous_end > col("physical_offset")),
               F.format_string("overlaps the previous stretch, which ends at %d", previous_end)),
        found("physical_offsets", (col("previous_kind") == "end") & (col("kind") != "end"),
               F.format_string("a %s after the all-zero tail that ends the data", col("kind"))),
        found("store_timestamps", message & (col("store_timestamp") < col("previous_timestamp_max")),
               F.format_string("store timestamp %d is before %d, stored earlier", col("store_timestamp"),
                               col("previous_timestamp_max"))),
    ])


def _queue_order_violations(records: DataFrame, replica_min: Callable[[Column], Column]) -> DataFrame:
    col = F.col
    visible = records.where((col("kind") == "message") & ~hidden(col("sys_flag")))
    in_queue_order = Window.partitionBy("replica", "topic", "queue_id").orderBy("queue_offset", "physical_offset")
    queued = (visible.withColumn("previous_queue_offset", F.lag("queue_offset").over(in_queue_order))
              .withColumn("position", F.row_number().over(in_queue_order)))
    previous = col("previous_queue_offset")
    return explode_found(queued, [
        found("queue_offsets", previous.isNotNull() & (col("queue_offset") == previous),
               F.format_string("queue offset %d is used twice", col("queue_offset"))),
        found("queue_offsets", previous.isNotNull() & (col("queue_offset") > previous + 1),
               F.format_string("queue offsets %d..%d are missing", previous + 1, col("queue_offset") - 1)),
        found("queue_offsets", (col("position") == 1) & (col("queue_offset") != 0) & (replica_min(col("replica")) == 0),
               F.format_string("the queue starts at offset %d, not 0", col("queue_offset"))),
    ])


def _unique_key_violations(records: DataFrame, earlier_copies: DataFrame | None = None) -> DataFrame:
    """A copy is a violation when the copy before it (same topic, UNIQ_KEY, reconsume times and content) was
    stored within the window apply deduplicates over (``dledger.apply.UNIQ_KEY_WINDOW_MS``, by store
    timestamp, as apply compares them). A later copy is at-least-once delivery working as in RocketMQ: a
    producer's retry, or a consumer sending the same message back again after a rebalance, minutes later.
    Another content under the same UNIQ_KEY is another message (a key collision, which apply stores).

    Copies are grouped by :func:`spark_analytics.rounds.message_key` (a hash of topic, UNIQ_KEY, reconsume
    times and content: the ``retry_content`` column of spark_analytics.tables). ``earlier_copies``: the newest
    copy of each message an earlier round stored within the window below what is read here
    (:data:`spark_analytics.rounds.RECENT_SCHEMA`): a copy here is compared with it too; it is never reported
    itself (its round did)."""
    col = F.col
    visible = (recent_candidates(records)
               .select("replica", message_key().alias("message_key"), "physical_offset", "store_timestamp",
                       "topic", "queue_id", "queue_offset", "uniq_key", F.lit(False).alias("earlier")))
    if earlier_copies is not None:
        visible = visible.unionByName(earlier_copies.select(
            "replica", "message_key", "physical_offset", "store_timestamp", F.lit(None).cast("string").alias("topic"),
            F.lit(None).cast("int").alias("queue_id"), F.lit(None).cast("bigint").alias("queue_offset"),
            F.lit(None).cast("string").alias("uniq_key"), F.lit(True).alias("earlier")))
    same_message = Window.partitionBy("replica", "message_key").orderBy("physical_offset")
    repeated = (visible.withColumn("previous_offset", F.lag("physical_offset").over(same_message))
                .withColumn("previous_timestamp", F.lag("store_timestamp").over(same_message)))
    return explode_found(repeated, [
        found("unique_keys", ~col("earlier") & col("previous_offset").isNotNull()
              & (col("previous_timestamp") >= col("store_timestamp") - UNIQ_KEY_WINDOW_MS),
              F.format_string("UNIQ_KEY %s was already stored at physical offset %d, %d ms earlier",
                              col("uniq_key"), col("previous_offset"),
                              col("store_timestamp") - col("previous_timestamp"))),
    ])


def _consume_queue_violations(records: DataFrame, units: DataFrame,
                              replica_min: Callable[[Column], Column]) -> DataFrame:
    """Units and message records in one full outer join on (replica, physical offset): a unit must match
    its record, and a visible record must have exactly one unit."""
    col = F.col
    unit = units.select(
        col("replica").alias("unit_replica"), col("physical_offset").alias("unit_physical_offset"),
        col("topic").alias("unit_topic"), col("queue_id").alias("unit_queue_id"),
        col("queue_offset").alias("unit_queue_offset"), col("size").alias("unit_size"),
        col("tags_code").alias("unit_tags_code"),
    ).where(col("unit_physical_offset") >= replica_min(col("unit_replica")))  # below: deleted by retention
    record = records.where(col("kind") == "message").select(
        "replica", "physical_offset", "topic", "queue_id", "queue_offset", "total_size", "tags_code",
        hidden(col("sys_flag")).alias("hidden"),
    )
    joined = unit.join(record, (col("unit_replica") == col("replica"))
                       & (col("unit_physical_offset") == col("physical_offset")), "full_outer")
    same_record = Window.partitionBy("replica", "physical_offset")
    joined = (joined.withColumn("units", F.count("unit_physical_offset").over(same_record))
              .withColumn("unit_number", F.row_number().over(same_record.orderBy("unit_topic", "unit_queue_id",
                                                                                 "unit_queue_offset"))))
    has_unit = col("unit_replica").isNotNull()
    has_record = col("replica").isNotNull()
    problems = F.concat_ws("; ", *[
        F.when(~has_record, F.lit("no message record starts there")),
        F.when(col("topic") != col("unit_topic"), F.format_string("the record is in topic %s", col("topic"))),
        F.when(col("queue_id") != col("unit_queue_id"), F.format_string("the record is in queue %d", col("queue_id"))),
        F.when(col("queue_offset") != col("unit_queue_offset"),
               F.format_string("the record has queue offset %d", col("queue_offset"))),
        F.when(col("total_size") != col("unit_size"),
               F.format_string("unit size %d, record size %d", col("unit_size"), col("total_size"))),
        F.when(col("tags_code") != col("unit_tags_code"),
               F.format_string("unit tag hash %d, record tag hash %d", col("unit_tags_code"), col("tags_code"))),
        F.when(col("hidden"), F.lit("the record is a prepared or rolled-back transaction message")),
    ])
    visible_record = has_record & ~col("hidden") & (col("unit_number") == 1)
    located = joined.select(
        F.coalesce(col("unit_replica"), col("replica")).alias("where_replica"),
        F.coalesce(col("unit_physical_offset"), col("physical_offset")).alias("where_physical_offset"),
        F.when(has_unit, col("unit_topic")).otherwise(col("topic")).alias("where_topic"),
        F.when(has_unit, col("unit_queue_id")).otherwise(col("queue_id")).alias("where_queue_id"),
        F.when(has_unit, col("unit_queue_offset")).otherwise(col("queue_offset")).alias("where_queue_offset"),
        has_unit.alias("has_unit"), problems.alias("problems"), visible_record.alias("visible_record"),
        col("units"),
    )
    return explode_found(located, [
        found("consume_queue", col("has_unit") & (col("problems") != ""),
               F.format_string("unit -> physical offset %d: %s", col("where_physical_offset"), col("problems"))),
        found("consume_queue", col("visible_record") & (col("units") == 0),
               F.lit("the record is in no consume-queue unit")),
        found("consume_queue", col("visible_record") & (col("units") > 1),
               F.format_string("the record is in %d consume-queue units", col("units"))),
    ], topic="where_topic", queue_id="where_queue_id", queue_offset="where_queue_offset",
        physical_offset="where_physical_offset", replica="where_replica")


def _key_index_violations(records: DataFrame, entries: DataFrame,
                          replica_min: Callable[[Column], Column]) -> DataFrame:
    """The key index against the records, as multisets of (replica, physical offset, key hash): the store
    indexes ``topic#key`` (CRC32) for UNIQ_KEY and each space-separated KEYS value of every record that is
    not a rolled-back transaction message."""
    col = F.col
    keyed = records.where((col("kind") == "message")
                          & (col("sys_flag").bitwiseAND(TRANSACTION_TYPE_MASK) != TRANSACTION_ROLLBACK_TYPE))
    keys = F.concat(F.array(col("uniq_key")), F.split(F.coalesce(col("keys"), F.lit("")), " "))
    expected = (
        keyed.select("replica", "physical_offset", "topic", "queue_id", "queue_offset",
                     F.explode(F.filter(keys, lambda key: key.isNotNull() & (key != ""))).alias("key"))
        .withColumn("key_hash", F.crc32(F.concat_ws("#", col("topic"), col("key")).cast("binary")))
        .groupBy("replica", "physical_offset", "key_hash")
        .agg(F.count(F.lit(1)).alias("expected"), F.first("topic").alias("topic"),
             F.first("queue_id").alias("queue_id"), F.first("queue_offset").alias("queue_offset"),
             F.first("key").alias("key"))
    )
    readable = entries.where(col("problem").isNull())
    indexed = (readable.where(col("physical_offset") >= replica_min(col("replica")))  # below: retention
               .groupBy("replica", "physical_offset", "key_hash")
               .agg(F.count(F.lit(1)).alias("indexed"), F.min("file").alias("file")))
    compared = expected.join(indexed, ["replica", "physical_offset", "key_hash"], "full_outer")
    expected_count = F.coalesce(col("expected"), F.lit(0))
    indexed_count = F.coalesce(col("indexed"), F.lit(0))
    by_record = explode_found(compared, [
        found("key_index", col("expected").isNull(),
               F.format_string("index entries (file %d) with key hash %d point here, where no record has that key",
                               col("file"), col("key_hash"))),
        found("key_index", col("indexed").isNull(), F.format_string("key %s is not in the key index", col("key"))),
        found("key_index", col("expected").isNotNull() & col("indexed").isNotNull() & (expected_count != indexed_count),
               F.format_string("key %s is indexed %d times, not %d", col("key"), indexed_count, expected_count)),
    ])
    by_entry = explode_found(entries.withColumn("topic", F.lit(None).cast("string"))
                              .withColumn("queue_id", F.lit(None).cast("int"))
                              .withColumn("queue_offset", F.lit(None).cast("bigint")), [
        found("key_index", col("problem").isNotNull(),
               F.format_string("key-index file %d cannot be read: %s", col("file"), col("problem"))),
        found("key_index", col("problem").isNull() & ~col("reachable"),
               F.format_string("entry %d of key-index file %d is not reachable from its slot: lookups miss it",
                               col("entry_number"), col("file"))),
    ])
    return by_record.unionByName(by_entry)


def _ranked_violations(violations: DataFrame, examples_max: int) -> DataFrame:
    """The first ``examples_max`` violations of each (invariant, replica), in log order, each with the
    total count: one job for every invariant's count and examples."""
    group = Window.partitionBy("invariant", "replica")
    in_order = group.orderBy(F.col("physical_offset").asc_nulls_last(), F.col("queue_offset").asc_nulls_last(),
                             F.col("detail"))
    return (violations.withColumn("violations", F.count(F.lit(1)).over(group))
            .withColumn("rank", F.row_number().over(in_order))
            .where(F.col("rank") <= examples_max))


def _file_violations(replicas: list[Replica], segment_size: int) -> list[Violation]:
    """File sizes, on the driver from the listing: every segment and consume-queue file is preallocated
    to its full size, so a different size is damage (a truncated copy, a disk error)."""
    queue_sizes = collections.Counter(file.size_bytes for replica in replicas for file in replica.queue_files)
    queue_file_size = max(queue_sizes.items(), key=lambda item: (item[1], item[0]))[0] if queue_sizes else 0
    violations = []
    for replica in replicas:
        for segment in replica.segments:
            if segment.size_bytes != segment_size:
                violations.append(Violation("files", replica.name, segment.start, None, None, None,
                                            f"segment file {segment.path} has {segment.size_bytes} bytes, "
                                            f"not {segment_size}"))
            if segment_size and segment.start % segment_size:
                violations.append(Violation("files", replica.name, segment.start, None, None, None,
                                            f"segment file {segment.path} does not start at a multiple of "
                                            f"{segment_size}"))
        for file in replica.queue_files:
            if file.size_bytes != queue_file_size:
                violations.append(Violation("files", replica.name, None, file.topic, file.queue_id, None,
                                            f"consume-queue file {file.path} has {file.size_bytes} bytes, "
                                            f"not {queue_file_size}"))
    return violations
