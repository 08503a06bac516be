"""Cross-replica checks of derived state: the consume queues (logically, unit by unit) and the replicated
state in the checkpoints (:mod:`spark_analytics.replicated_state`).

Consume queues are derived from the commit log, so replicas whose commit logs are byte-identical over a
range must hold identical units for the records of that range, at the same queue offsets; the byte
comparison of the files themselves would not do (a queue file's unused tail, and units past a lagging
replica's end, legitimately differ). Executors reduce each replica's units to a digest per bucket of
:data:`BUCKET_UNITS` queue offsets; the driver votes per bucket and reads only differing buckets unit by
unit, so its work does not grow with the data.
"""

from __future__ import annotations

import collections
import functools
import operator
from collections.abc import Hashable, Sequence
from pathlib import Path
from typing import Final

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_analytics.equality import vote
from spark_analytics.replicated_state import check_replicated_state
from spark_analytics.results import ConsumeQueueComparison, DerivedStateResult, UnitDifference
from spark_analytics.tables import ReplicaTables

#: queue offsets per digest bucket
BUCKET_UNITS: Final = 1024
#: differing buckets read unit by unit (each costs a scan of the cached units)
BUCKETS_EXAMINED_MAX: Final = 10
#: differing units listed in the result
DIFFERENCES_MAX: Final = 20

Unit = tuple[int, int, int]  # (physical offset, size, tag hash)


def check_derived_state(spark: SparkSession, cluster_dir: Path | str, common_start: int, common_end: int,
                        tables: ReplicaTables | None = None) -> DerivedStateResult:
    """Compare the replicas' consume queues for the records of ``[common_start, common_end)`` (the range the
    byte-equality check compared: :class:`spark_analytics.results.ByteEqualityResult`) and the replicated
    state in their checkpoints."""
    owned = tables is None
    if tables is None:
        tables = ReplicaTables(spark, cluster_dir)
    try:
        names = [replica.name for replica in tables.replicas]
        queues = compare_consume_queues(tables.units, names, common_start, common_end)
        state = check_replicated_state(tables.replicas)
    finally:
        if owned:
            tables.close()
    return DerivedStateResult(queues.ok and state.ok, queues, state)


def compare_consume_queues(units: DataFrame, replicas: Sequence[str], common_start: int, common_end: int,
                           bucket_units: int = BUCKET_UNITS, differences_max: int = DIFFERENCES_MAX
                           ) -> ConsumeQueueComparison:
    col = F.col
    names = list(replicas)
    if common_end <= common_start or len(names) < 2:
        note = ("fewer than two replicas: nothing to compare" if len(names) < 2 else
                f"the replicas' commit logs have no range in common ([{common_start}, {common_end})): no consume-"
                f"queue unit compared")
        return ConsumeQueueComparison(True, tuple(names), common_start, common_end, 0,
                                      tuple((name, 0) for name in names), bucket_units, 0, 0, (), (), (note,))
    in_range = (col("physical_offset") >= common_start) & (col("physical_offset") < common_end)
    bucket = F.floor(col("queue_offset") / bucket_units).cast("bigint")
    unit_hash = F.xxhash64("queue_offset", "physical_offset", "size", "tags_code")
    rows = (units.where(in_range)
            .groupBy("replica", "topic", "queue_id", bucket.alias("bucket"))
            .agg(F.count(F.lit(1)).alias("units"), F.bit_xor(unit_hash).alias("digest"))
            .collect())
    digests: dict[tuple[str, int, int], dict[str, Hashable]] = collections.defaultdict(dict)
    compared: collections.Counter[str] = collections.Counter()
    for row in rows:
        digests[(row["topic"], row["queue_id"], row["bucket"])][row["replica"]] = (row["units"], row["digest"])
        compared[row["replica"]] += row["units"]
    differing = sorted(key for key, by_replica in digests.items() if vote(by_replica, names).differs)
    odd_replicas = tuple(name for name in names
                         if any(name in vote(digests[key], names).odd for key in differing))
    differences = _unit_differences(units, names, differing[:BUCKETS_EXAMINED_MAX], bucket_units, common_start,
                                    common_end) if differing else []
    notes = []
    if len(differing) > BUCKETS_EXAMINED_MAX:
        notes.append(f"{len(differing)} buckets differ; the first {BUCKETS_EXAMINED_MAX} were read unit by unit")
    return ConsumeQueueComparison(
        ok=not differing,
        replicas=tuple(names),
        common_start=common_start,
        common_end=common_end,
        queues_compared=len({(topic, queue_id) for topic, queue_id, _ in digests}),
        units_compared_per_replica=tuple((name, compared[name]) for name in names),
        bucket_units=bucket_units,
        buckets_compared=len(digests),
        buckets_differing=len(differing),
        odd_replicas=odd_replicas,
        differences=tuple(differences[:differences_max]),
        notes=tuple(notes),
    )


def _unit_differences(units: DataFrame, names: list[str], buckets: list[tuple[str, int, int]], bucket_units: int,
                      common_start: int, common_end: int) -> list[UnitDifference]:
    """The units of the differing buckets, every replica's, voted on queue offset by queue offset. A
    position counts when some replica's unit there points into the common range."""
    col = F.col
    selected: Column = functools.reduce(operator.or_, [
        (col("topic") == topic) & (col("queue_id") == queue_id)
        & col("queue_offset").between(bucket * bucket_units, (bucket + 1) * bucket_units - 1)
        for topic, queue_id, bucket in buckets
    ])
    positions: dict[tuple[str, int, int], dict[str, Unit]] = collections.defaultdict(dict)
    for row in units.where(selected).select("replica", "topic", "queue_id", "queue_offset", "physical_offset",
                                            "size", "tags_code").collect():
        positions[(row["topic"], row["queue_id"], row["queue_offset"])][row["replica"]] = (
            row["physical_offset"], row["size"], row["tags_code"])
    differences = []
    for (topic, queue_id, queue_offset), by_replica in sorted(positions.items()):
        if not any(common_start <= unit[0] < common_end for unit in by_replica.values()):
            continue
        values: dict[str, Hashable] = {name: by_replica.get(name) for name in names}
        outcome = vote(values, names)
        for odd in outcome.odd:
            reference = outcome.majority or (names[0],)
            differences.append(UnitDifference(topic, queue_id, queue_offset, odd, reference,
                                              _unit_text(by_replica.get(reference[0])),
                                              _unit_text(by_replica.get(odd))))
    return differences


def _unit_text(unit: Unit | None) -> str | None:
    if unit is None:
        return None
    physical_offset, size, tags_code = unit
    return f"physical offset {physical_offset}, size {size}, tag hash {tags_code}"
