"""The broker's services run by the group's time, not the leader's clock (issue "Time"): a leader whose
clock is hours ahead of its peers deletes no minutes-old segment and releases no timer or delay early, and
a new leader whose clock is behind never stamps below its predecessor. No processes: the services over a
stand-in member with a real store, replicated state and apply, whose group clock hears peers the test
names (the transport's part is tests/dledger/test_group_clock.py)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import cast

import pytest

from broker.config import load_node_file
from broker.context import BrokerContext
from broker.delay import DelayService
from broker.retention import CLOCK_JUMP_TOLERANCE_MS, RetentionService
from broker.timers import TimerService
from commitlog.message import MessageInput
from commitlog.records import PreparedRecords
from commitlog.store import MessageStore
from dledger.apply import ApplyResult, StateMachine
from dledger.command import Command, LeaderStamp, Messages, encode_command, encode_messages_command
from dledger.config import GroupCommitSettings
from dledger.group_clock import GroupClock, replicated_floor_ms
from dledger.group_commit import GroupCommitter
from dledger.member import GroupMember, MemberStatus
from dledger.stages import StageHistograms
from dledger.state import ReplicatedState
from dledger.timers import schedule
from protocol.properties import (
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    decode_properties,
    encode_properties,
)
from protocol.topics import SCHEDULE_TOPIC
from tests.broker.helpers import NODE_FILE_HEAD, run
from tests.commitlog.helpers import message, small_config

T = 1_750_000_000_000
HOUR_MS = 3_600_000
RESERVED_SECONDS = 72 * 3600
TOPIC = "TopicTest"


class Clocks:
    """The monotonic clock every member of the test shares, moved by hand."""

    def __init__(self) -> None:
        self.monotonic_seconds = 1000.0

    def monotonic(self) -> float:
        return self.monotonic_seconds


class Replica:
    """One copy of the group's data: a store, the replicated state and apply."""

    def __init__(self, directory: Path) -> None:
        self.state = ReplicatedState()
        self.store = MessageStore(small_config(directory), extension_provider=self.state.encode)
        self.machine = StateMachine(self.store, self.state)
        self.index = 0

    def apply(self, data: bytes) -> ApplyResult:
        self.index += 1
        return self.machine.apply(self.index, data)

    def store_messages(self, messages: list[MessageInput], store_timestamp: int) -> None:
        self.apply(encode_messages_command(messages, store_timestamp=store_timestamp))


class StandInMember:
    """What the broker's services use of a member. Its own wall clock is ``own_ms``; its peers' clocks are
    what the test says they are (``hear``)."""

    def __init__(self, name: str, replica: Replica, clocks: Clocks, own_ms: int) -> None:
        self.name = name
        self.replica = replica
        self.store = replica.store
        self.state = replica.state
        self.clocks = clocks
        self.own_ms = own_ms
        self.is_leader = True
        self.stages = StageHistograms()
        self.group_clock = GroupClock(3, lambda: replicated_floor_ms(replica.state), wall_clock_ms=self.wall,
                                      monotonic=clocks.monotonic)

    def wall(self) -> int:
        return self.own_ms

    def hear(self, **peer_clocks_ms: int) -> None:
        for peer, peer_ms in peer_clocks_ms.items():
            self.group_clock.record(peer, peer_ms)

    def status(self) -> MemberStatus:
        return MemberStatus(self.name, "leader", 3, None, 0, 0, 0, 0)

    def leader_name(self) -> str | None:
        return None

    def propose(self, command: Command, timeout_seconds: float = 10.0) -> ApplyResult:
        return self.replica.apply(encode_command(command))


def broker_of(tmp_path: Path, member: StandInMember) -> BrokerContext:
    path = tmp_path / "node.toml"
    path.write_text(NODE_FILE_HEAD + f'listen_address = "127.0.0.1:10911"\nfile_reserved_seconds = {RESERVED_SECONDS}\n')
    node, config = load_node_file(path)
    return BrokerContext(node, config, cast(GroupMember, member))


def refusal(retention: RetentionService) -> str | None:
    """Why the last check deleted nothing for time (a call: mypy would keep an earlier assert's narrowing)."""
    return retention.time_refusal_kind


def fill_segments(replica: Replica, segments: int, store_timestamp: int, first: int) -> int:
    """Store messages stamped ``stamp`` until the commit log has ``segments`` segments; the next number."""
    number = first
    while len(replica.store.commit_log.starts) < segments:
        replica.store_messages([message(number, body=bytes(16 << 10))], store_timestamp)
        number += 1
    return number


def test_a_leader_73_hours_ahead_deletes_no_minutes_old_segment(tmp_path: Path) -> None:
    """The finding: a leader 73 h ahead deleted 6 of 7 segments. Here the first three segments are 80 h old
    and go; the fourth starts with one old message and holds minutes-old ones from there on, as the rest."""
    replica = Replica(tmp_path / "store")
    number = fill_segments(replica, 4, T - 80 * HOUR_MS, 0)
    fill_segments(replica, 8, T - 10 * 60_000, number)
    starts = list(replica.store.commit_log.starts)
    clocks = Clocks()
    leader = StandInMember("n0", replica, clocks, own_ms=T + 73 * HOUR_MS)
    leader.hear(n1=T, n2=T + 20)
    retention = RetentionService(broker_of(tmp_path, leader), monotonic=clocks.monotonic)
    assert run(retention.check()) == starts[3]  # the expired segments go, nothing minutes old
    assert replica.store.commit_log.min_offset == starts[3]
    assert run(retention.check()) is None
    # the leader's clock alone, with a peer's reading gone stale: still the majority of what is heard
    clocks.monotonic_seconds += 6.0
    leader.hear(n1=T + 6000)
    assert run(retention.check()) is None
    assert replica.store.commit_log.min_offset == starts[3]


def test_without_a_majority_of_clocks_nothing_is_deleted(tmp_path: Path) -> None:
    replica = Replica(tmp_path / "store")
    fill_segments(replica, 4, T - 80 * HOUR_MS, 0)
    leader = StandInMember("n0", replica, Clocks(), own_ms=T)  # right, but nobody corroborates it
    retention = RetentionService(broker_of(tmp_path, leader), monotonic=leader.clocks.monotonic)
    assert run(retention.check()) is None
    assert refusal(retention) == "clocks"
    assert replica.store.commit_log.min_offset == 0


def test_a_majority_jumping_during_a_leadership_deletes_nothing(tmp_path: Path) -> None:
    replica = Replica(tmp_path / "store")
    number = fill_segments(replica, 2, T - 10 * 60_000, 0)
    clocks = Clocks()
    leader = StandInMember("n0", replica, clocks, own_ms=T)
    leader.hear(n1=T, n2=T)
    retention = RetentionService(broker_of(tmp_path, leader), monotonic=clocks.monotonic)
    assert run(retention.check()) is None  # nothing old yet; the tenure's time is anchored
    assert refusal(retention) is None
    clocks.monotonic_seconds += 60.0
    leader.own_ms = T + 60_000 + 73 * HOUR_MS  # the leader and one peer jump 73 h
    leader.hear(n1=T + 60_000 + 73 * HOUR_MS, n2=T + 60_000)
    jumped = leader.group_clock.now_ms()
    assert jumped == T + 60_000 + 73 * HOUR_MS  # two of three clocks: the group's time jumped
    fill_segments(replica, 4, jumped, number)  # and stamped new messages: the idle guard cannot help, the anchor does
    assert run(retention.check()) is None
    assert refusal(retention) == "jump"
    assert replica.store.commit_log.min_offset == 0
    assert CLOCK_JUMP_TOLERANCE_MS < 73 * HOUR_MS


def test_an_idle_log_is_not_aged_by_a_jump_nothing_was_stamped_at(tmp_path: Path) -> None:
    replica = Replica(tmp_path / "store")
    fill_segments(replica, 4, T - 10 * 60_000, 0)
    clocks = Clocks()
    leader = StandInMember("n0", replica, clocks, own_ms=T + 73 * HOUR_MS)
    leader.hear(n1=T + 73 * HOUR_MS, n2=T)  # a majority ahead from the start of the leadership
    retention = RetentionService(broker_of(tmp_path, leader), monotonic=clocks.monotonic)
    assert run(retention.check()) is None
    assert refusal(retention) == "idle"
    assert replica.store.commit_log.min_offset == 0


def scheduled(number: int, due_ms: int) -> MessageInput:
    return schedule(message(number), due_ms)


def delayed(number: int, level: int) -> MessageInput:
    original = message(number)
    properties = decode_properties(original.properties)
    properties.update({PROPERTY_DELAY_TIME_LEVEL: str(level), PROPERTY_REAL_TOPIC: TOPIC, PROPERTY_REAL_QUEUE_ID: "0"})
    return original._replace(topic=SCHEDULE_TOPIC, queue_id=level - 1, properties=encode_properties(properties))


def delivered(replica: Replica) -> int:
    return replica.store.max_queue_offset(TOPIC, 0)


@pytest.mark.parametrize("kind", ["timer", "delay level"])
def test_a_leader_an_hour_ahead_releases_nothing_due_in_an_hour(tmp_path: Path, kind: str) -> None:
    replica = Replica(tmp_path / "store")
    clocks = Clocks()
    leader = StandInMember("n0", replica, clocks, own_ms=T + HOUR_MS + 5000)
    broker = broker_of(tmp_path, leader)
    level = broker.config.delay_levels_seconds.index(3600) + 1
    # stored at T by the previous leader (right clock): due at T + 1 h
    replica.store_messages([scheduled(1, T + HOUR_MS) if kind == "timer" else delayed(1, level)], T)
    leader.hear(n1=T + 5000, n2=T + 5000)  # the leader's clock is an hour ahead of both peers'
    release: Callable[[], object]
    if kind == "timer":
        timers = TimerService(broker, monotonic=clocks.monotonic)
        release = lambda: run(timers.release_due())  # noqa: E731
    else:
        release = lambda: run(DelayService(broker).deliver_due())  # noqa: E731
    release()
    assert delivered(replica) == 0, "released an hour early by the leader's clock"
    # an hour later by every clock, it is released
    clocks.monotonic_seconds += 3600.0
    leader.own_ms += HOUR_MS
    leader.hear(n1=T + HOUR_MS + 5000, n2=T + HOUR_MS + 5000)
    release()
    assert delivered(replica) == 1


def test_a_new_leader_behind_never_stamps_below_its_predecessor(tmp_path: Path) -> None:
    """n0 (right clock) leads and stamps; it fails; n1 and n2, whose clocks are now an hour behind, go on:
    the time they use (leader stamps, store stamps, the services' now) does not go back."""
    replica = Replica(tmp_path / "store")  # the replicas are identical: one copy stands for all
    clocks = Clocks()
    first = StandInMember("n0", replica, clocks, own_ms=T)
    first.hear(n1=T - HOUR_MS, n2=T)
    (tmp_path / "n0").mkdir()
    first_broker = broker_of(tmp_path / "n0", first)
    run(first_broker.barrier())
    replica.store_messages([message(1)], first_broker.wall_clock_ms())
    first_stamp = replica.state.leader_stamp
    assert first_stamp is not None and first_stamp.timestamp == T
    assert replica.state.last_store_timestamp == T

    clocks.monotonic_seconds += 10.0  # n0 is gone: its readings age out
    second = StandInMember("n1", replica, clocks, own_ms=T - HOUR_MS + 10_000)
    second.hear(n2=T - HOUR_MS + 10_000)
    (tmp_path / "n1").mkdir()
    second_broker = broker_of(tmp_path / "n1", second)
    assert second.group_clock.corroborated_ms() == T - HOUR_MS + 10_000  # what the majority's clocks say
    assert second_broker.wall_clock_ms() >= T
    run(second_broker.barrier())
    second_stamp = replica.state.leader_stamp
    assert isinstance(second_stamp, LeaderStamp) and second_stamp.timestamp >= first_stamp.timestamp

    # group commit on the new leader, built as GroupMember builds it, stamps at or above the old stamps
    stamps: list[int] = []
    done = threading.Event()

    def propose(data: bytes, callback: Callable[[ApplyResult | None, int], None], built: Command) -> None:
        (operation,) = built.operations
        if isinstance(operation, PreparedRecords):
            stamps.append(operation.store_timestamp)
        else:
            assert isinstance(operation, Messages)
            stamps.append(operation.messages[0].store_timestamp)
        done.set()

    committer = GroupCommitter(GroupCommitSettings(linger_ms=0), propose, lambda: (True, None), 1 << 20,
                               wall_clock_ms=second.group_clock.now_ms)
    try:
        committer.submit([message(2)])
        assert done.wait(10)
    finally:
        committer.stop()
    assert stamps and stamps[0] >= T
