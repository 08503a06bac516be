"""The checks on a clean cluster and on each injected defect: every defect is reported precisely (which
replica, which byte, which record) and nothing else is."""

from __future__ import annotations

import shutil
import struct
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from commitlog.consume_queue import UNIT_BYTES
from commitlog.store import MessageStore
from dledger.apply import UNIQ_KEY_WINDOW_MS
from spark_analytics.checks import check_byte_equality, check_integrity
from spark_analytics.derived import check_derived_state
from spark_analytics.results import IntegrityResult
from tests.commitlog.helpers import small_config
from tests.spark.cluster import (
    BATCH_MESSAGES,
    batch_stamp,
    batches,
    body_offset,
    flip_byte,
    node_store,
    overwrite,
    queue_file,
    records_of,
    segment_file,
)

NODES = ("n0", "n1", "n2")


@pytest.fixture
def cluster(clean_cluster: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "cluster"
    shutil.copytree(clean_cluster, copy)
    return copy


def failed_invariants(integrity: IntegrityResult, replica: str) -> set[str]:
    return {result.name for result in integrity.replica(replica).invariants if not result.ok}


def test_clean_cluster_holds_every_check(spark: SparkSession, clean_cluster: Path) -> None:
    equality = check_byte_equality(spark, clean_cluster)
    assert equality.ok and equality.odd_replicas == () and equality.differences == ()
    data_end = equality.extents[0].data_end
    assert equality.common_start == 0 and equality.common_end == data_end > 0
    assert all(extent.data_end == data_end for extent in equality.extents)
    assert equality.bytes_compared_per_replica == data_end and equality.segments_compared == data_end // 131072 + 1
    integrity = check_integrity(spark, clean_cluster)
    assert integrity.ok and integrity.notes == ()  # the checkpoints cover the logs: timer progress checked
    records = records_of(node_store(clean_cluster, "n0"))
    visible = [r for r in records if r.sys_flag & 0xC not in (0x4, 0xC)]
    for replica in integrity.replicas:
        assert replica.messages == len(records) and replica.invalid_stretches == 0
        assert replica.data_end == data_end and replica.queues == len({(r.topic, r.queue_id) for r in visible})
        assert replica.consume_queue_units == len(visible)
        assert {result.name for result in replica.invariants} >= {"transactions", "transaction_ops", "delays", "retries"}


def test_flipped_byte_names_the_replica_the_byte_and_the_record(spark: SparkSession, cluster: Path) -> None:
    record = records_of(node_store(cluster, "n1"))[400]
    position = body_offset(record) + 7
    flip_byte(node_store(cluster, "n1"), position)

    equality = check_byte_equality(spark, cluster)
    assert not equality.ok and equality.odd_replicas == ("n1",) and equality.blocks_differing == 1
    (difference,) = equality.differences
    assert difference.replica == "n1" and difference.reference_replicas == ("n0", "n2")
    assert difference.physical_offset == position
    assert difference.actual_byte == difference.expected_byte ^ 0xFF  # type: ignore[operator]
    expected = difference.expected
    assert expected is not None and expected.kind == "message" and expected.field == "body"
    assert (expected.topic, expected.queue_id, expected.queue_offset, expected.record_offset) == (
        record.topic, record.queue_id, record.queue_offset, record.physical_offset)
    assert [segment.segment for segment in equality.differing_segments] == [
        record.physical_offset - record.physical_offset % (128 * 1024)]

    integrity = check_integrity(spark, cluster)
    assert failed_invariants(integrity, "n1") == {"crc"}
    assert failed_invariants(integrity, "n0") == failed_invariants(integrity, "n2") == set()
    (violation,) = integrity.replica("n1").invariant("crc").examples
    assert (violation.physical_offset, violation.topic, violation.queue_id, violation.queue_offset) == (
        record.physical_offset, record.topic, record.queue_id, record.queue_offset)


def test_truncated_segment_is_missing_bytes_on_one_replica(spark: SparkSession, cluster: Path) -> None:
    store = node_store(cluster, "n2")
    cut = 131072 + 50_000
    path = segment_file(store, cut)
    with open(path, "r+b") as handle:
        handle.truncate(cut - 131072)

    equality = check_byte_equality(spark, cluster)
    assert not equality.ok and equality.odd_replicas == ("n2",)
    first = equality.differences[0]
    assert first.replica == "n2" and first.physical_offset == cut and first.actual_byte is None
    assert first.actual is not None and first.actual.kind == "missing"
    assert first.expected is not None and first.expected.kind == "message"

    integrity = check_integrity(spark, cluster)
    assert failed_invariants(integrity, "n0") == failed_invariants(integrity, "n1") == set()
    failed = failed_invariants(integrity, "n2")
    assert {"files", "physical_offsets", "queue_offsets", "consume_queue"} <= failed
    files = integrity.replica("n2").invariant("files")
    assert files.violations == 1 and "50000 bytes" in files.examples[0].detail
    gap = integrity.replica("n2").invariant("physical_offsets").examples[0]
    assert gap.physical_offset == 262144 and "missing" in gap.detail


def test_swapped_consume_queue_units_are_reported_on_their_replica(spark: SparkSession, cluster: Path) -> None:
    store = node_store(cluster, "n0")
    path, position = queue_file(store, "Orders", 1, 3)
    raw = path.read_bytes()
    unit3, unit4 = raw[position : position + UNIT_BYTES], raw[position + UNIT_BYTES : position + 2 * UNIT_BYTES]
    overwrite(path, position, unit4 + unit3)

    equality = check_byte_equality(spark, cluster)
    assert equality.ok  # commit logs untouched
    derived = check_derived_state(spark, cluster, equality.common_start, equality.common_end)
    queues = derived.consume_queues
    assert not derived.ok and derived.replicated_state.ok and queues.odd_replicas == ("n0",)
    assert queues.buckets_differing == 1
    assert [(d.replica, d.topic, d.queue_id, d.queue_offset) for d in queues.differences] == [
        ("n0", "Orders", 1, 3), ("n0", "Orders", 1, 4)]
    assert all(d.reference_replicas == ("n1", "n2") for d in queues.differences)
    assert queues.differences[0].actual == queues.differences[1].expected
    integrity = check_integrity(spark, cluster)
    assert failed_invariants(integrity, "n0") == {"consume_queue"}
    assert failed_invariants(integrity, "n1") == failed_invariants(integrity, "n2") == set()
    result = integrity.replica("n0").invariant("consume_queue")
    assert result.violations == 2
    by_offset = {example.queue_offset: example for example in result.examples}
    assert set(by_offset) == {3, 4}
    assert all(example.topic == "Orders" and example.queue_id == 1 for example in result.examples)
    assert "the record has queue offset 4" in by_offset[3].detail
    assert "the record has queue offset 3" in by_offset[4].detail


def test_duplicated_records_are_found_on_their_replica(spark: SparkSession, duplicated_cluster: Path) -> None:
    cluster = duplicated_cluster  # n2 applied the entry of batch 10 twice
    majority = records_of(node_store(cluster, "n0"))
    duplicated = records_of(node_store(cluster, "n2"))
    batch_end = 11 * BATCH_MESSAGES  # messages in batches 0..10
    original, copy = majority[10 * BATCH_MESSAGES], duplicated[batch_end]
    assert copy.properties == original.properties and copy.physical_offset == majority[batch_end].physical_offset

    equality = check_byte_equality(spark, cluster)
    assert not equality.ok and equality.odd_replicas == ("n2",)
    first = equality.differences[0]
    assert copy.physical_offset <= first.physical_offset < copy.physical_offset + copy.total_size
    assert first.actual is not None and first.actual.record_offset == copy.physical_offset
    assert first.actual.uniq_key == original.property_map["UNIQ_KEY"]
    assert first.expected is not None and first.expected.record_offset == majority[batch_end].physical_offset

    derived = check_derived_state(spark, cluster, equality.common_start, equality.common_end)
    assert derived.consume_queues.odd_replicas == ("n2",)  # later units sit at other queue offsets on n2
    # n2 applied one entry more: its replicated state is at another index, compared with nobody
    assert derived.replicated_state.ok and derived.replicated_state.groups_compared == (("n0", "n1"),)
    assert any("(n2 at 66; n0, n1 at 65)" in note for note in derived.replicated_state.notes)
    integrity = check_integrity(spark, cluster)
    assert failed_invariants(integrity, "n2") == {"unique_keys"}
    assert failed_invariants(integrity, "n0") == failed_invariants(integrity, "n1") == set()
    result = integrity.replica("n2").invariant("unique_keys")
    copies = [record for record in duplicated[batch_end : batch_end + BATCH_MESSAGES] if record.sys_flag & 0xC not in (0x4, 0xC)]
    assert result.violations == len(copies)
    violation = result.examples[0]
    assert violation.physical_offset == copy.physical_offset and violation.topic == original.topic
    assert original.property_map["UNIQ_KEY"] in violation.detail
    assert f"physical offset {original.physical_offset}" in violation.detail


def test_bad_crc_on_every_replica_is_an_integrity_failure_only(spark: SparkSession, cluster: Path) -> None:
    record = records_of(node_store(cluster, "n0"))[123]
    for node in NODES:
        store = node_store(cluster, node)
        overwrite(segment_file(store, record.physical_offset), record.physical_offset % (128 * 1024) + 8,
                  struct.pack(">I", record.body_crc ^ 0x5A5A5A5A))

    assert check_byte_equality(spark, cluster).ok  # the same bytes everywhere: a replicated bad CRC
    integrity = check_integrity(spark, cluster)
    for node in NODES:
        assert failed_invariants(integrity, node) == {"crc"}
        (violation,) = integrity.replica(node).invariant("crc").examples
        assert (violation.physical_offset, violation.topic, violation.queue_id, violation.queue_offset) == (
            record.physical_offset, record.topic, record.queue_id, record.queue_offset)


def test_a_broken_key_index_chain_is_reported(spark: SparkSession, cluster: Path) -> None:
    store = node_store(cluster, "n1")
    index_file = sorted((store / "index").iterdir())[0]
    slot = 5
    overwrite(index_file, 64 + slot * 4, bytes(4))  # one slot of 64 emptied: its chain is lost to lookups

    assert check_byte_equality(spark, cluster).ok
    integrity = check_integrity(spark, cluster)
    assert failed_invariants(integrity, "n1") == {"key_index"}
    assert failed_invariants(integrity, "n0") == failed_invariants(integrity, "n2") == set()
    result = integrity.replica("n1").invariant("key_index")
    assert result.violations > 0
    assert all("is not reachable from its slot" in example.detail for example in result.examples)


def test_a_copy_stored_after_the_dedup_window_is_not_a_duplicate(spark: SparkSession, cluster: Path) -> None:
    """Apply deduplicates a UNIQ_KEY over UNIQ_KEY_WINDOW_MS of store time; a copy stored later (a retry or
    a second send-back minutes later) is at-least-once delivery, not a broken apply. One entry stores a copy
    of a message from 120.1 s earlier and one of a message from 119.5 s earlier: only the second counts. A
    third carries the second's UNIQ_KEY with another body: another message (a key collision apply stores),
    not a copy."""
    written = batches()
    visible = [m for m in written[0] + written[-1] if m.sys_flag & 0xC not in (0x4, 0xC)]
    late, close = visible[0], visible[-1]
    collision = close._replace(body=close.body + b" and more")
    store_timestamp = batch_stamp(0) + UNIQ_KEY_WINDOW_MS + 100
    assert store_timestamp - batch_stamp(len(written) - 1) <= UNIQ_KEY_WINDOW_MS  # the close copy is inside the window
    for node in NODES:
        store = MessageStore(small_config(node_store(cluster, node)))
        try:
            store.append(store.applied_raft_index + 1, [late, collision, close], store_timestamp)
        finally:
            store.close()

    result = check_integrity(spark, cluster).replica("n0").invariant("unique_keys")
    assert result.violations == 1
    (example,) = result.examples
    original = next(r for r in records_of(node_store(cluster, "n0"))
                    if r.properties == close.properties and r.store_timestamp == batch_stamp(len(written) - 1))
    assert f"already stored at physical offset {original.physical_offset}" in example.detail
    assert f"{store_timestamp - batch_stamp(len(written) - 1)} ms earlier" in example.detail


def test_retry_content_ignores_what_each_attempt_changes_and_nothing_else(spark: SparkSession) -> None:
    """The content a copy is compared by (spark_analytics.tables.retry_content): a timed message's retry has
    another REAL_QID, due time and timer token; another body CRC, length, flag or property is another message."""
    from protocol.properties import encode_properties
    from spark_analytics.tables import retry_content

    def properties(**values: str) -> bytes:
        return encode_properties(values)

    first = properties(UNIQ_KEY="K", REAL_TOPIC="T", REAL_QID="0", TIMER_OUT_MS="1700000060000",
                       KEYS="order-1 RMQ_TIMER_1700000060")
    rows = [
        (0, 11, 100, first),
        (0, 11, 100, properties(UNIQ_KEY="K", REAL_TOPIC="T", REAL_QID="3", TIMER_OUT_MS="1700000062000",
                                KEYS="order-1 RMQ_TIMER_1700000062")),  # a retry
        (0, 12, 100, first),  # another body
        (0, 11, 101, first),
        (1, 11, 100, first),
        (0, 11, 100, properties(UNIQ_KEY="K", REAL_TOPIC="U", REAL_QID="0", TIMER_OUT_MS="1700000060000",
                                KEYS="order-1 RMQ_TIMER_1700000060")),
    ]
    frame = spark.createDataFrame(rows, "flag int, body_crc long, body_length int, properties binary")
    hashes = [row[0] for row in frame.select(retry_content(frame)).collect()]
    assert hashes[0] == hashes[1]
    assert len(set(hashes[1:])) == 5
