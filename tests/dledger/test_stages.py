"""The send path's stage histograms: buckets, percentiles, the wire encoding and run differences."""

from __future__ import annotations

import pytest

from dledger.stages import (
    BUCKETS,
    STAGES,
    StageHistograms,
    bucket_of,
    bucket_upper_seconds,
    decode,
    difference,
    percentile_seconds,
    summary,
)


def test_a_duration_falls_in_the_bucket_whose_bounds_hold_it() -> None:
    assert bucket_of(0.0) == 0 and bucket_of(1e-6) == 0
    for seconds in (3e-6, 0.000431, 0.0012, 0.5, 20.0):
        index = bucket_of(seconds)
        assert bucket_upper_seconds(index - 1) < seconds <= bucket_upper_seconds(index) * (1 + 1e-9)
    assert bucket_of(10_000.0) == BUCKETS - 1


def test_percentiles_are_the_upper_bound_of_the_bucket_that_holds_them() -> None:
    stages = StageHistograms()
    for _ in range(99):
        stages.record("replication", 0.001)
    stages.record("replication", 0.1)
    counts = stages.snapshot()["replication"]
    assert percentile_seconds(counts, 0.50) == pytest.approx(0.001, rel=0.19)
    assert percentile_seconds(counts, 0.99) == pytest.approx(0.001, rel=0.19)
    assert percentile_seconds(counts, 1.0) == pytest.approx(0.1, rel=0.19)
    assert percentile_seconds([0] * BUCKETS, 0.5) == 0.0


def test_weights_count_each_send_of_an_entry() -> None:
    stages = StageHistograms()
    stages.record("batch_wait", 0.002, 256)
    stages.record("batch_wait", 0.0001, 1)
    assert sum(stages.snapshot()["batch_wait"]) == 257
    assert percentile_seconds(stages.snapshot()["batch_wait"], 0.5) == pytest.approx(0.002, rel=0.19)


def test_a_run_is_the_difference_of_two_snapshots_carried_as_json() -> None:
    stages = StageHistograms()
    stages.record("apply", 0.0002, 5)
    before = decode(stages.encode())
    stages.record("apply", 0.004, 3)
    after = decode(stages.encode())
    run = difference(after, before)
    assert sum(run["apply"]) == 3 and set(run) == set(STAGES)
    rows = {row["stage"]: row for row in summary(run)}
    assert rows["apply"]["count"] == 3 and rows["apply"]["per"] == "entry"
    assert rows["apply"]["p50_ms"] == pytest.approx(4.0, rel=0.19) and rows["remoting"]["count"] == 0


@pytest.mark.parametrize("text", ["[]", '{"apply": {"999": 1}}', '{"apply": {"3": -1}}', '{"apply": {"x": 1}}'])
def test_a_bad_encoding_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        decode(text)


def test_stages_a_newer_broker_adds_are_left_out() -> None:
    assert set(decode('{"some_new_stage": {"3": 1}}')) == set(STAGES)
    assert set(decode("")) == set(STAGES)
