"""A quiet group's leader sends heartbeats every ``idle_heartbeat_period_ms``, not every append-entries period;
anything to replicate brings the short period back, and the followers still learn every commit."""

from __future__ import annotations

import time
from pathlib import Path

from dledger.config import RaftSettings
from tests.dledger.group import Node, running_group
from tests.support.stores import SMALL_STORE
from tests.support.waiting import wait_for


def test_the_quiet_period_stays_within_the_append_entries_period_and_a_fifth_of_the_election_timeout() -> None:
    assert RaftSettings().quiet_heartbeat_period_ms == 100
    assert RaftSettings(election_timeout_min_ms=200, election_timeout_max_ms=400).quiet_heartbeat_period_ms == 40
    assert RaftSettings(election_timeout_min_ms=50, election_timeout_max_ms=100,
                        append_entries_period_ms=10, tick_period_ms=5).quiet_heartbeat_period_ms == 10
    assert RaftSettings(idle_heartbeat_period_ms=1).quiet_heartbeat_period_ms == 5


def rounds_per_second(node: Node, seconds: float) -> float:
    """The leader's append_entries rounds a second, counted over ``seconds`` of status requests."""
    first = int(node.request("status")["append_entries_rounds"])
    started = time.monotonic()
    last = first
    while time.monotonic() - started < seconds:  # a rate needs a span of time: status requests fill it
        last = int(node.request("status")["append_entries_rounds"])
    return (last - first) / (time.monotonic() - started)


def test_a_quiet_group_sends_few_heartbeats_and_its_followers_still_learn_every_commit(tmp_path: Path) -> None:
    env = {"RAFTMQ_TEST_ACK_LOG": "0"}
    with running_group(tmp_path, store=SMALL_STORE, env=env) as group:
        leader = group.wait_leader()
        # quiet: at most 1 / 0.1 s rounds a second (pysyncobj's every 5 ms would be 200)
        wait_for(lambda: rounds_per_second(leader, 0.5) <= 15, "a quiet leader's heartbeats slowed down",
                 timeout_seconds=30)
        group.load(True)
        wait_for(lambda: leader.request("status")["acked"] >= 500, "500 acknowledged appends", timeout_seconds=60)
        busy = rounds_per_second(leader, 0.5)
        group.load(False)
        statuses = group.wait_converged(timeout_seconds=60)  # every member applied the last commit
        assert len({status["raft_applied"] for status in statuses.values()}) == 1
        wait_for(lambda: rounds_per_second(leader, 0.5) <= 15, "quiet again", timeout_seconds=30)
    assert busy > 15, busy  # under load the rounds are as frequent as before (each new entry leaves at once)
