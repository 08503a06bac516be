"""The data sources: what they yield, through Spark and (the Arrow batches themselves) without it."""

from __future__ import annotations

from pathlib import Path

import pyarrow
from pyspark.sql import SparkSession
from pyspark.sql.pandas.types import to_arrow_schema

from commitlog.sys_flags import TRANSACTION_PREPARED_TYPE, TRANSACTION_ROLLBACK_TYPE
from commitlog.tag_codes import tags_hash_code
from spark_analytics.index_file import read_index_file
from spark_analytics.layout import list_replicas
from spark_analytics.sources import COMMIT_LOG_SCHEMA, SegmentPartition, read_segment_batches
from tests.spark.cluster import batches, node_store, records_of, segment_size

HIDDEN = (TRANSACTION_PREPARED_TYPE, TRANSACTION_ROLLBACK_TYPE)


def test_segment_batches_are_arrow_with_the_schema_spark_expects(clean_cluster: Path) -> None:
    replica = list_replicas(clean_cluster / "n0")[0]
    segment = replica.segments[0]
    partition = SegmentPartition("n0", segment.path, segment.start, segment.size_bytes, False)
    arrow_schema = to_arrow_schema(COMMIT_LOG_SCHEMA, timezone="UTC")
    produced = list(read_segment_batches(partition, False, arrow_schema))
    assert produced and all(isinstance(batch, pyarrow.RecordBatch) for batch in produced)
    assert all(batch.schema.equals(arrow_schema) for batch in produced)
    kinds = [kind for batch in produced for kind in batch.column("kind").to_pylist()]
    assert kinds[-1] == "filler" and set(kinds[:-1]) == {"message"}


def test_commit_log_source_reads_every_record_of_every_replica(spark: SparkSession, clean_cluster: Path) -> None:
    frame = spark.read.format("raftmq_commitlog").load(str(clean_cluster))
    assert "body" in frame.columns
    rows = frame.where("replica = 'n1' and kind = 'message'").orderBy("physical_offset").collect()
    written = [message for batch in batches() for message in batch]
    records = records_of(node_store(clean_cluster, "n1"))  # the base batches, then the feature records
    assert len(rows) == len(records) > len(written)
    for row, sent in zip(rows, written, strict=False):
        assert (row.topic, row.queue_id, row.body) == (sent.topic, sent.queue_id, sent.body)
        assert row.crc_ok and row.stored_physical_offset == row.physical_offset
        assert row.tags_code == (tags_hash_code(row.tags) if row.tags else 0)
        assert row.segment == row.physical_offset - row.physical_offset % segment_size(node_store(clean_cluster, "n1"))
    counts = {(row.replica, row.kind): row["count"] for row in frame.groupBy("replica", "kind").count().collect()}
    assert {replica for replica, _ in counts} == {"n0", "n1", "n2"}
    assert counts[("n0", "message")] == counts[("n2", "message")] == len(records)
    features = {row.topic: row for row in rows[len(written):]}
    delivered = next(row for row in rows[len(written):] if row.topic == "TopicTest" and row.real_topic)
    assert (delivered.real_topic, delivered.real_qid, delivered.delay) == ("TopicTest", str(delivered.queue_id), None)
    assert features["SCHEDULE_TOPIC_XXXX"].delay is not None
    assert features["%DLQ%cg"].retry_topic == "TopicTest" and features["%DLQ%cg"].origin_message_id is not None


def test_body_topics_fill_bodies_of_those_topics_only(spark: SparkSession, clean_cluster: Path) -> None:
    frame = (spark.read.format("raftmq_commitlog").option("bodies", "false").option("replicas", "n0")
             .option("body_topics", "RMQ_SYS_TRANS_OP_HALF_TOPIC").load(str(clean_cluster)))
    rows = frame.where("body is not null").select("topic", "body").collect()
    assert sorted(bytes(row.body) for row in rows) == [b"0", b"1"]
    assert {row.topic for row in rows} == {"RMQ_SYS_TRANS_OP_HALF_TOPIC"}


def test_options_select_replicas_segments_and_drop_bodies(spark: SparkSession, clean_cluster: Path) -> None:
    frame = (spark.read.format("raftmq_commitlog").option("bodies", "false").option("replicas", "n2")
             .option("segments", "131072").load(str(clean_cluster)))
    assert "body" not in frame.columns and "body_length" in frame.columns
    rows = frame.select("replica", "segment").distinct().collect()
    assert [(row.replica, row.segment) for row in rows] == [("n2", 131072)]


def test_consume_queue_source_has_a_unit_per_visible_record(spark: SparkSession, clean_cluster: Path) -> None:
    store = node_store(clean_cluster, "n0")
    expected = sorted(
        (record.topic, record.queue_id, record.queue_offset, record.physical_offset, record.total_size)
        for record in records_of(store)
        if record.sys_flag & 0xC not in HIDDEN
    )
    rows = spark.read.format("raftmq_consumequeue").option("replicas", "n0").load(str(clean_cluster)).collect()
    assert sorted((r.topic, r.queue_id, r.queue_offset, r.physical_offset, r.size) for r in rows) == expected


def test_key_index_files_are_read_without_their_configuration(clean_cluster: Path) -> None:
    store = node_store(clean_cluster, "n0")
    records = records_of(store)
    expected = sum(1 + len(record.property_map["KEYS"].split(" ")) for record in records if record.sys_flag & 0xC != 0xC)
    contents = [read_index_file(path.read_bytes()) for path in sorted((store / "index").iterdir())]
    assert all(file.slot_count == 64 and all(file.reachable) for file in contents)  # helpers.small_config's
    assert sum(file.entry_count for file in contents) == expected
    stored = {record.physical_offset for record in records}
    assert all(offset in stored for file in contents for offset in file.physical_offsets)
