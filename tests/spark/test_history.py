"""Client histories against the replicas: parsing (no Spark), and each kind of finding reported on the
replicas that show it, at the history line that names it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from spark_analytics.history import HistoryError, check_history, parse_history, read_history
from tests.spark.cluster import (
    BATCH_MESSAGES,
    DELAYED_LEVEL_3,
    DUPLICATED_BATCH,
    history_lines,
    node_store,
    records_of,
)


def write_history(path: Path, lines: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_attempts_merge_and_bad_lines_name_their_line_number(tmp_path: Path) -> None:
    history = parse_history([
        json.dumps({"type": "run", "topic": "T", "seed": 1}),
        "",
        json.dumps({"type": "send", "uniq_key": "K1", "acked": False, "send_time": 1.0, "code": 17}),
        json.dumps({"type": "send", "uniq_key": "K1", "queue": 2, "queue_offset": 7, "send_time": 2.0,
                    "end_time": 2.5, "attempt": 1}),
        json.dumps({"type": "send", "uniq_key": "K2", "topic": "U", "queue_id": 0, "acked": False}),
        json.dumps({"type": "deliver", "uniq_key": "K1", "queue": 2, "queue_offset": 7, "group": "g"}),
        json.dumps({"type": "deliver", "uniq_key": "K1", "queue": 2, "queue_offset": 7, "group": "h"}),
        json.dumps({"type": "fault", "kind": "kill"}),
    ])
    first, second = history.sends
    assert (first.line, first.topic, first.queue_id, first.queue_offset, first.acked) == (4, "T", 2, 7, True)
    assert (first.start_time, first.ack_time) == (1.0, 2.5)  # first attempt sent, the acknowledged one answered
    assert (second.topic, second.acked, second.queue_offset) == ("U", False, None)
    (delivery,) = history.deliveries
    assert (delivery.line, delivery.topic, delivery.deliveries) == (6, "T", 2)
    assert history.acknowledged == 1
    for bad, message in (('{"type": "send"}', "<history>:1: uniq_key must be a non-empty string"),
                         ('{"type": "send", "uniq_key": "K"}', "<history>:1: no topic"),
                         ('{"type": "send", "uniq_key": "K", "topic": "T", "queue_offset": -1}', "non-negative"),
                         ('{"type": "deliver", "uniq_key": "K", "topic": "T", "queue": 1}', "queue_offset is required"),
                         ("[1, 2]", "a JSON object"), ("{", "not JSON")):
        with pytest.raises(HistoryError, match=message.replace("(", r"\(")):
            parse_history([bad])
    with pytest.raises(HistoryError, match="cannot read"):
        read_history(tmp_path / "absent.jsonl")


def test_each_finding_is_reported_at_its_line(spark: SparkSession, clean_cluster: Path, tmp_path: Path) -> None:
    records = records_of(node_store(clean_cluster, "n0"))
    lines = history_lines(records)
    # an acknowledged offset pair swapped within one queue: both mismatch, and the later is reordered
    first = next(n for n, line in enumerate(lines) if line["topic"] == "Orders" and line["queue"] == 1
                 and line["queue_offset"] == 3)
    second = next(n for n, line in enumerate(lines) if line["topic"] == "Orders" and line["queue"] == 1
                  and line["queue_offset"] == 4)
    lines[first]["queue_offset"], lines[second]["queue_offset"] = 4, 3
    # a message first sent after later-stored messages of its queue were acknowledged
    late = next(n for n, line in enumerate(lines) if line["topic"] == "TopicTest" and line["queue"] == 0
                and line["queue_offset"] == 10)
    lines[late]["send_time"], lines[late]["end_time"] = 5000.0, 5000.5
    held = next(line for line in lines if line["topic"] == "TopicTest" and line["queue"] == 2)
    delayed_key = f"C0A8000A9CB3{DELAYED_LEVEL_3:020X}"
    lines = [line for line in lines if line["uniq_key"] != delayed_key]  # sent as a delayed message below
    lines += [
        {"type": "run", "topic": "TopicTest"},
        {"type": "send", "uniq_key": "FFFF0000000000000000000000000001", "queue": 1, "queue_offset": 500},  # lost
        {"type": "send", "uniq_key": "FFFF0000000000000000000000000002", "acked": False},  # unknown, not stored: fine
        {"type": "send", "uniq_key": delayed_key, "queue": 2, "queue_offset": 0, "delay_level": 3},  # delayed: fine
        {"type": "deliver", "uniq_key": "FFFF0000000000000000000000000003", "queue": 2,
         "queue_offset": held["queue_offset"]},  # another message is there
        {"type": "deliver", "uniq_key": held["uniq_key"], "queue": 2, "queue_offset": held["queue_offset"]},  # fine
        {"type": "deliver", "uniq_key": held["uniq_key"], "queue": 2, "queue_offset": 100_000},  # nothing there
    ]
    path = write_history(tmp_path / "history.jsonl", lines)
    sends = len({line["uniq_key"] for line in lines if line["type"] == "send"})

    result = check_history(spark, clean_cluster, path)
    assert not result.ok and result.acknowledged_sends == sends - 1 and result.unknown_sends == 1
    assert result.deliveries == 3
    for replica in ("n0", "n1", "n2"):
        findings = result.replica(replica)
        counts = {check.name: check.violations for check in findings.checks}
        assert counts == {"lost": 1, "duplicated": 0, "offset_mismatch": 2, "reordered": 2, "delivered_not_stored": 2}
        (lost,) = findings.check("lost").examples
        assert lost.detail == (f"line {len(lines) - 5}: acknowledged, but no record of TopicTest holds UNIQ_KEY "
                               "FFFF0000000000000000000000000001")
        mismatched = findings.check("offset_mismatch").examples
        assert [example.detail.split(":")[0] for example in mismatched] == [f"line {first + 1}", f"line {second + 1}"]
        assert "acknowledged at queue 1 offset 4, stored at queue 1 offset 3" in mismatched[0].detail
        reordered = findings.check("reordered").examples
        (by_offset,) = [example for example in reordered if "was acknowledged after" in example.detail]
        (by_time,) = [example for example in reordered if "first sent at" in example.detail]
        assert by_offset.detail.startswith(f"line {first + 1}: UNIQ_KEY {lines[first]['uniq_key']} was acknowledged "
                                           f"after {lines[second]['uniq_key']}, but is stored before it")
        assert by_time.detail.startswith(f"line {late + 1}: UNIQ_KEY {lines[late]['uniq_key']} (first sent at "
                                         "5000.000 s) is stored before")
        other, nothing = findings.check("delivered_not_stored").examples
        assert other.detail.endswith(f"where the replica holds UNIQ_KEY {held['uniq_key']} at physical offset "
                                     f"{next(r.physical_offset for r in records if r.property_map['UNIQ_KEY'] == held['uniq_key'])}")
        assert nothing.detail.endswith("where the replica holds no message") and nothing.queue_offset == 100_000


def test_messages_stored_twice_are_found_on_their_replica(spark: SparkSession, duplicated_cluster: Path,
                                                          tmp_path: Path) -> None:
    records = records_of(node_store(duplicated_cluster, "n0"))
    batch = {r.property_map["UNIQ_KEY"] for r in records[DUPLICATED_BATCH * BATCH_MESSAGES:
                                                         (DUPLICATED_BATCH + 1) * BATCH_MESSAGES]}
    lines = [line for line in history_lines(records) if line["uniq_key"] in batch]
    result = check_history(spark, duplicated_cluster, write_history(tmp_path / "history.jsonl", lines))
    assert result.replica("n0").ok and result.replica("n1").ok and not result.ok
    duplicated = result.replica("n2").check("duplicated")
    assert duplicated.violations == len(lines) and "is stored 2 times in" in duplicated.examples[0].detail
    # n2's copies moved every later message of those queues: its answers' offsets are not where n2 holds them
    assert result.replica("n2").check("offset_mismatch").ok  # the first copy is where it was acknowledged
