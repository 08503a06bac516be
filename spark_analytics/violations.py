"""Building blocks the Spark checks share: a row's possible violations as nullable structs, exploded into
the one shape every pass yields, and small per-replica constants as column expressions."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from commitlog.sys_flags import TRANSACTION_PREPARED_TYPE, TRANSACTION_ROLLBACK_TYPE, TRANSACTION_TYPE_MASK

#: the columns of every violations frame, in order
VIOLATION_COLUMNS = ("invariant", "replica", "physical_offset", "topic", "queue_id", "queue_offset", "detail")


def found(invariant: str, condition: Column, detail: Column) -> Column:
    """One possible violation of a row: an (invariant, detail) struct when ``condition`` holds, else null.
    A pass collects a row's possible violations in an array and explodes the non-null ones, so each sort
    or join is done once for every invariant it serves (Spark recomputes each branch of a union)."""
    return F.when(condition, F.struct(F.lit(invariant).alias("invariant"), detail.alias("detail")))


def explode_found(frame: DataFrame, candidates: list[Column], topic: str = "topic", queue_id: str = "queue_id",
                  queue_offset: str = "queue_offset", physical_offset: str = "physical_offset",
                  replica: str = "replica") -> DataFrame:
    """Rows of ``frame`` as violations, one per non-null entry of ``candidates`` (every pass yields this
    shape: :data:`VIOLATION_COLUMNS`)."""
    exploded = frame.select(
        F.col(replica).alias("replica"),
        F.col(physical_offset).cast("bigint").alias("physical_offset"),
        F.col(topic).cast("string").alias("topic"),
        F.col(queue_id).cast("int").alias("queue_id"),
        F.col(queue_offset).cast("bigint").alias("queue_offset"),
        F.explode(F.filter(F.array(*candidates), lambda entry: entry.isNotNull())).alias("found"),
    )
    return exploded.select("found.invariant", "replica", "physical_offset", "topic", "queue_id", "queue_offset",
                           "found.detail")


def replica_lookup(values: Mapping[str, int]) -> Callable[[Column], Column]:
    """A per-replica constant as a column expression (a literal map: the replica list is tiny)."""
    if not values:
        return lambda replica: F.lit(None).cast("bigint")
    mapping = F.create_map(*[F.lit(item) for pair in values.items() for item in pair])
    return lambda replica: mapping[replica]


def hidden(sys_flag: Column) -> Column:
    """Prepared and rolled-back transaction messages: stored, never dispatched to a consume queue."""
    return sys_flag.bitwiseAND(TRANSACTION_TYPE_MASK).isin(TRANSACTION_PREPARED_TYPE, TRANSACTION_ROLLBACK_TYPE)
