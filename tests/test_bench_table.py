"""bench/bench_table.py: the summary of broker_bench's records, of one round and of several."""

from __future__ import annotations

from typing import Any

from bench.bench_table import merge_rounds, render


def produce(system: str, round_: int, msgs_per_s: float, cpu_total: float, **label: Any) -> dict[str, Any]:
    record: dict[str, Any] = {"bench": "broker", "system": system, "mode": "produce", "in_flight": 32,
                              "msgs_per_s": msgs_per_s, "MB_per_s": msgs_per_s / 1000, "p50_ms": 1.0, "p99_ms": 2.0,
                              "cpu_us_per_msg": {"leader": cpu_total / 2, "total": cpu_total}, "round": round_,
                              **label}
    if system == "nats":
        record.update(client="nats-py", nats_sync_setting="default")
    else:
        record.update(client="python", journal_flush="durable")
    return record


def row(text: str, start: str) -> str:
    return next(line for line in text.splitlines() if line.startswith(start))


def test_one_round_gives_plain_ratios() -> None:
    text = render([produce("raftmq", 0, 500.0, 300.0), produce("nats", 0, 1000.0, 100.0)])
    assert "rounds" not in text
    assert row(text, "32         raftmq durable").split()[-1] == "0.50x"
    assert row(text, "in-flight 32  raftmq durable").split()[-1] == "3.00x"


def test_rounds_give_medians_and_same_round_ratios_with_their_range() -> None:
    # the machine slows down over the run: each system's figures drift, the same-round ratios much less
    ours = [500.0, 400.0, 300.0]
    theirs = [1000.0, 800.0, 500.0]
    records = [produce("raftmq", n, ours[n], 300.0 + n) for n in range(3)]
    records += [produce("nats", n, theirs[n], 100.0) for n in range(3)]
    merged = merge_rounds(records)
    assert [(figure["system"], figure["msgs_per_s"], sorted(figure["by_round"])) for figure in merged] == [
        ("raftmq", 400.0, [0, 1, 2]), ("nats", 800.0, [0, 1, 2])]
    assert merged[0]["cpu_us_per_msg"] == {"leader": 150.5, "total": 301.0}
    text = render(records)
    assert text.startswith("3 rounds, each system once a round")
    ours_row = row(text, "32         raftmq durable").split()
    assert ours_row[3] == "400"  # the median
    # same-round ratios 0.50, 0.50, 0.60: their median and range, not 400 / 800 alone
    assert ours_row[-2:] == ["0.50x", "(0.50-0.60)"]
    assert row(text, "in-flight 32  raftmq durable").split()[-2:] == ["3.01x", "(3.00-3.02)"]


def test_a_figure_of_one_round_against_one_of_several_is_a_plain_ratio() -> None:
    # the stock C++ client runs in the first round only
    records = [produce("raftmq", n, 400.0 + n, 300.0) for n in range(3)]
    records.append({"bench": "broker", "system": "raftmq", "mode": "produce", "client": "cpp", "cpp_mode": "async",
                    "in_flight": 32, "msgs_per_s": 201.0, "journal_flush": "durable", "round": 0})
    text = render(records)
    assert row(text, "async").split()[-1] == "0.50x"


def test_sends_through_a_follower_are_a_figure_of_their_own() -> None:
    records = [produce("raftmq", 0, 500.0, 300.0), produce("raftmq", 0, 250.0, 400.0, route="follower"),
               produce("nats", 0, 1000.0, 100.0)]
    assert len(merge_rounds(records)) == 3
    words = [line.split() for line in render(records).splitlines()]
    assert ["32", "raftmq", "durable", "500", "1.00", "2.00", "0.50x"] in words
    assert ["32", "raftmq", "durable", "via", "a", "follower", "250", "1.00", "2.00", "0.25x"] in words
    assert ["in-flight", "32", "raftmq", "durable", "via", "a", "follower", "200.0", "-", "-", "-", "-", "400.0",
            "4.00x"] in words
