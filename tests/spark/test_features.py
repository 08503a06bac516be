"""Feature invariants (transactions, op records, delays, retries) and the replicated state in the
checkpoints: broker bugs written into every replica alike are reported on every replica, precisely, and
nothing else is; a state entry that differs on one replica names that replica."""

from __future__ import annotations

from pathlib import Path

from pyspark.sql import SparkSession

from broker.config import DEFAULT_DELAY_LEVELS_SECONDS
from broker.delay import level_key
from spark_analytics import features
from spark_analytics.checks import check_byte_equality, check_integrity
from spark_analytics.layout import list_replicas
from spark_analytics.replicated_state import (
    LEVEL_KEY_PREFIX,
    ReplicaCheckpoint,
    compare_states,
    read_checkpoints,
)
from tests.spark.cluster import (
    DELAYED_LEVEL_1,
    DELAYED_LEVEL_3,
    HALVES,
    FeatureDefects,
    build_cluster,
    node_state,
    node_store,
    records_of,
)


def test_broker_facts_agree_with_the_broker() -> None:
    # topic and property names are protocol's, shared; what spark_analytics still keeps a copy of is checked here
    assert features.DELAY_LEVELS_SECONDS == DEFAULT_DELAY_LEVELS_SECONDS
    assert level_key(3) == f"{LEVEL_KEY_PREFIX}3"


def test_broker_bugs_are_reported_on_every_replica(spark: SparkSession, tmp_path: Path) -> None:
    cluster = tmp_path / "cluster"
    build_cluster(cluster, defects=FeatureDefects(missing_op=True, delivered_twice=True, delivered_early=True,
                                                  committed_again=True, wrong_origin=True))
    records = records_of(node_store(cluster, "n0"))

    def record(topic: str, number: int, index: int = 0) -> tuple[int, str, int, int]:
        key = f"C0A8000A9CB3{number:020X}"
        found = [r for r in records if r.topic == topic and r.property_map["UNIQ_KEY"] == key][index]
        return found.physical_offset, found.topic, found.queue_id, found.queue_offset

    assert check_byte_equality(spark, cluster).ok  # a replicated bug: the replicas agree
    integrity = check_integrity(spark, cluster)
    for replica in ("n0", "n1", "n2"):
        result = integrity.replica(replica)
        assert {i.name for i in result.invariants if not i.ok} == {
            "transactions", "transaction_ops", "delays", "retries", "unique_keys"}
        (missing,) = result.invariant("transaction_ops").examples
        half = record("RMQ_SYS_TRANS_HALF_TOPIC", HALVES[0])
        commit = record("Orders", HALVES[0])
        assert (missing.physical_offset, missing.topic, missing.queue_id, missing.queue_offset) == half
        assert missing.detail == f"the half is committed (at physical offset {commit[0]}) but has no op record"
        early, twice = result.invariant("delays").examples  # in log order
        assert (early.physical_offset, early.topic, early.queue_id, early.queue_offset) == record(
            "TopicTest", DELAYED_LEVEL_3)
        scheduled_3 = record("SCHEDULE_TOPIC_XXXX", DELAYED_LEVEL_3)
        assert early.detail.startswith("delivered at store time 1700000105600, 6000 ms before it was due: "
                                       f"scheduled at physical offset {scheduled_3[0]}")
        assert (twice.physical_offset, twice.topic, twice.queue_id, twice.queue_offset) == record(
            "TopicTest", DELAYED_LEVEL_1, 1)
        scheduled_1 = record("SCHEDULE_TOPIC_XXXX", DELAYED_LEVEL_1)
        assert twice.detail == (f"UNIQ_KEY C0A8000A9CB3{DELAYED_LEVEL_1:020X} is delivered 2 times, scheduled 1 "
                                f"times (first at physical offset {scheduled_1[0]})")
        # the second delivery and the second commit are stored duplicates too
        assert result.invariant("unique_keys").violations == 2
        again, after_rollback = result.invariant("transactions").examples
        assert (again.physical_offset, again.topic, again.queue_id, again.queue_offset) == record("Orders", HALVES[0], 1)
        assert again.detail == f"the half at physical offset {half[0]} is committed again (first commit at {commit[0]})"
        rolled_back = record("RMQ_SYS_TRANS_HALF_TOPIC", HALVES[1])
        assert after_rollback.physical_offset == record("Orders", HALVES[1])[0]
        assert after_rollback.detail.startswith(f"committed at store time {1700000101600 + 10_030}, after the half was "
                                                "resolved by the op record at physical offset")
        assert result.invariant("transactions").violations == 2 and rolled_back[3] == 1
        (origin,) = result.invariant("retries").examples
        assert (origin.physical_offset, origin.topic) == record("%DLQ%cg", 9020)[:2]
        assert origin.detail == (f"ORIGIN_MESSAGE_ID {'0A01020300002A9F'}{half[0]:016X} names physical offset "
                                 f"{half[0]}, which holds no record with UNIQ_KEY C0A8000A9CB3{9020:020X}")


def test_a_consumer_offset_differing_on_one_replica_names_it(tmp_path: Path) -> None:
    cluster = tmp_path / "cluster"
    build_cluster(cluster, offsets={"n1": {("cg", "TopicTest", 1): 3}})
    result = compare_states(read_checkpoints(list_replicas(cluster)))
    assert not result.ok and result.odd_replicas == ("n1",) and result.groups_compared == (("n0", "n1", "n2"),)
    (difference,) = result.differences
    assert (difference.section, difference.key, difference.replica, difference.reference_replicas) == (
        "consumer_offsets", "cg/TopicTest/1", "n1", ("n0", "n2"))
    assert (difference.expected, difference.actual, difference.applied_index) == ("6", "3", 65)


def test_states_at_other_indexes_are_compared_on_timer_progress_only() -> None:
    def at(replica: str, state_index: int, level_1: int) -> ReplicaCheckpoint:
        state = node_state(state_index, {("cg", "Orders", 0): state_index})  # offsets move with the index
        state.timer_progress["level:1"] = level_1
        return ReplicaCheckpoint(replica, None, state)

    lagging = compare_states([at("n0", 70, 4), at("n1", 70, 4), at("n2", 60, 2)])
    assert lagging.ok and lagging.groups_compared == (("n0", "n1"),)
    assert lagging.notes == ("the replicas' states are at different applied indexes (n0, n1 at 70; n2 at 60): each "
                             "is compared only with replicas at its index, and with the others on timer progress "
                             "(which never goes back)",)
    ahead = compare_states([at("n0", 70, 4), at("n1", 70, 4), at("n2", 60, 5)])
    assert not ahead.ok and ahead.odd_replicas == ("n2",)
    assert {(d.section, d.key, d.replica, d.actual) for d in ahead.differences} == {
        ("timer_progress", "level:1", "n2", "5")}
    damaged = compare_states([at("n0", 70, 4), ReplicaCheckpoint("n1", None, None, "checkpoint is damaged")])
    assert not damaged.ok and damaged.odd_replicas == ("n1",)


def test_an_origin_message_id_of_an_ipv6_store_host_names_its_offset(spark: SparkSession) -> None:
    """ORIGIN_MESSAGE_ID is a store message id of 32 hex characters (IPv4 store host) or 56 (IPv6): the
    physical offset is its last 16 either way; anything else is neither an id nor the copy's UNIQ_KEY."""
    from pyspark.sql import functions as F

    from commitlog.hosts import encode_address, encode_message_id

    v6_id = encode_message_id(encode_address("[fd00::3]:10911"), 4096)
    rows = [  # replica, physical offset, topic, queue, queue offset, sys flag, uniq key, reconsumes, retry topic,
        # origin id, real topic
        ("n0", 4096, "TopicTest", 0, 0, 0, "K1", 0, None, None, None),
        ("n0", 8192, "%RETRY%g", 0, 0, 0, "K1", 1, "TopicTest", v6_id, None),  # names 4096: the original
        ("n0", 9000, "%RETRY%g", 0, 1, 0, "K1", 2, "TopicTest", v6_id[:-16] + f"{5000:016X}", None),  # holds none
        ("n0", 9500, "%RETRY%g", 0, 2, 0, "K1", 3, "TopicTest", v6_id[2:], None),  # 54 characters: no id
    ]
    schema = ("replica string, physical_offset bigint, topic string, queue_id int, queue_offset bigint, sys_flag int, "
              "uniq_key string, reconsume_times int, retry_topic string, origin_message_id string, real_topic string")
    found = features.retry_violations(spark.createDataFrame(rows, schema), lambda replica: F.lit(0)).collect()
    details = sorted((row.physical_offset, row.detail) for row in found)
    assert details == [
        (9000, f"ORIGIN_MESSAGE_ID {v6_id[:-16]}{5000:016X} names physical offset 5000, which holds no record with "
               "UNIQ_KEY K1"),
        (9500, f"ORIGIN_MESSAGE_ID {v6_id[2:]} is neither the copy's UNIQ_KEY K1 nor a store message id"),
    ]
