"""broker.pull_rates: messages served per group and topic over the last minute (GET_CONSUME_STATS's
consumeTps), on a fake clock."""

from __future__ import annotations

import pytest

from broker import pull_rates
from broker.pull_rates import PullRates


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def test_a_steady_rate_reads_back_and_goes_to_zero_a_minute_after_the_last_pull() -> None:
    clock = Clock()
    rates = PullRates(clock)
    assert rates.messages_per_second("g", "T") == 0.0
    for _ in range(120):  # 50 messages a second for two minutes
        rates.record("g", "T", 50)
        clock.now += 1
    assert rates.messages_per_second("g", "T") == pytest.approx(50, rel=0.02)
    assert rates.messages_per_second("g", "Other") == 0.0 and rates.messages_per_second("h", "T") == 0.0
    clock.now += 30
    assert rates.messages_per_second("g", "T") == pytest.approx(20)  # 20 s of pulls in the 50 s the window covers
    clock.now += 40
    assert rates.messages_per_second("g", "T") == 0.0


def test_one_pull_after_a_quiet_spell_is_spread_over_a_bucket_at_least() -> None:
    clock = Clock()
    rates = PullRates(clock)
    rates.record("g", "T", 32)
    clock.now += 0.001
    assert rates.messages_per_second("g", "T") == pytest.approx(3.2)


def test_empty_pulls_count_nothing_and_old_buckets_are_dropped() -> None:
    clock = Clock()
    rates = PullRates(clock)
    rates.record("g", "T", 0)
    assert rates._buckets == {}
    for _ in range(100):
        rates.record("g", "T", 1)
        clock.now += pull_rates.BUCKET_SECONDS
    assert len(rates._buckets[("g", "T")]) <= pull_rates.WINDOW_BUCKETS + 1


def test_pairs_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pull_rates, "PAIRS_MAX", 2)
    clock = Clock()
    rates = PullRates(clock)
    rates.record("g1", "T", 1)
    rates.record("g2", "T", 1)
    rates.record("g3", "T", 1)  # full, and nobody quiet: not counted
    assert rates.messages_per_second("g3", "T") == 0.0 and rates.messages_per_second("g1", "T") > 0
    clock.now += 61 + pull_rates.BUCKET_SECONDS
    rates.record("g3", "T", 1)  # the quiet pairs make room
    assert set(rates._buckets) == {("g3", "T")}
