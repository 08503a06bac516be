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


def rounds_per_second(node: Node, seconds: float, counter: str = "append_entries_rounds") -> float:
    """The leader's append_entries rounds (or ``counter``) a second, counted over ``seconds`` of status
    requests."""
    first = int(node.request("status")[counter])
    started = time.monotonic()
    last = first
    while time.monotonic() - started < seconds:  # a rate needs a span of time: status requests fill it
        last = int(node.request("status")[counter])
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


def test_the_raft_thread_of_a_quiet_member_sleeps_longer_and_an_election_still_comes_in_time(
        tmp_path: Path) -> None:
    env = {"RAFTMQ_TEST_ACK_LOG": "0"}
    with running_group(tmp_path, store=SMALL_STORE, env=env) as group:
        leader = group.wait_leader()
        # quiet: each member ticks at most for its heartbeats (10 a second) and every 50 ms, not every 5 ms
        # (status requests are answered by the member process's own thread: they do not wake its Raft thread)
        for node in group.nodes:
            def sleeping_longer(node: Node = node) -> bool:
                return rounds_per_second(node, 0.5, "ticks") <= 60

            wait_for(sleeping_longer, f"{node.node_id}'s tick thread sleeping longer", timeout_seconds=30)
        group.load(True)
        wait_for(lambda: leader.request("status")["acked"] >= 500, "500 acknowledged appends", timeout_seconds=60)
        group.load(False)
        statuses = group.wait_converged(timeout_seconds=60)  # the followers woke for every entry and commit
        assert len({status["raft_applied"] for status in statuses.values()}) == 1
        # a quiet group loses its leader: a follower sleeps no later than its election deadline
        term = int(leader.request("status")["term"])
        wait_for(lambda: rounds_per_second(leader, 0.5, "ticks") <= 60, "quiet again", timeout_seconds=30)
        leader.kill()
        survivors = [node for node in group.nodes if node is not leader]
        started = time.monotonic()
        new_leader = wait_for(lambda: next((node for node in survivors
                                            if node.request("status")["role"] == "leader"), None),
                              "a new leader", timeout_seconds=30)
        elected_after = time.monotonic() - started
        assert int(new_leader.request("status")["term"]) > term
    # elections begin 1-2 s after the last heartbeat: well within this bound, quiet or not
    assert elected_after < 10, elected_after
