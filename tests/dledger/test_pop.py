"""Pop consumption through apply (no Raft): receive, ack, change of invisibility, revive, dead-lettering,
FIFO blocking, stale handles, idempotence by Raft index, snapshots."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import pytest

from commitlog.record_codec import decode_record
from commitlog.store import MessageStore
from dledger.apply import ApplyResult, StateMachine
from dledger.command import (
    Command,
    Messages,
    PopAck,
    PopChangeInvisible,
    PopReceive,
    PopRevive,
    SubscriptionGroup,
    TopicConfig,
    decode_command,
    encode_command,
)
from dledger.pop import (
    POP_IN_FLIGHT_PER_QUEUE_MAX,
    PopEntry,
    PopGrant,
    PopQueue,
    apply_receive,
    decode_handle,
    due_entries,
    encode_handle,
)
from dledger.state import STATE_MAGIC, ReplicatedState
from tests.commitlog.helpers import message, small_config

GROUP = "GID_pop"
TOPIC = "TopicTest"


def machine(directory: Path) -> StateMachine:
    state = ReplicatedState()
    store = MessageStore(small_config(directory), extension_provider=lambda: state.encode())
    return StateMachine(store, state)


def run(sm: StateMachine, index: int, *operations: object) -> ApplyResult:
    return sm.apply(index, encode_command(Command(operations)))  # type: ignore[arg-type]


def receive(start: int, end: int, offsets: tuple[int, ...], until: int = 10_000, fifo: bool = False,
            queue_id: int = 0) -> PopReceive:
    return PopReceive(GROUP, TOPIC, queue_id, start, end, offsets, until, fifo)


def stored(sm: StateMachine, count: int = 3) -> None:
    run(sm, 1, Messages(tuple(message(number) for number in range(count))))


def test_operations_round_trip_the_command_format() -> None:
    operations = (receive(0, 3, (0, 2), fifo=True), PopAck(GROUP, TOPIC, 1, 2, 9, True, 77),
                  PopChangeInvisible(GROUP, TOPIC, 1, 2, 9, 5), PopRevive(GROUP, TOPIC, 0, (1, 4), 100, 17))
    command = Command(operations)
    assert decode_command(encode_command(command)) == command


def test_receive_ack_and_idempotence_by_raft_index(tmp_path: Path) -> None:
    sm = machine(tmp_path / "a")
    stored(sm)
    first = run(sm, 2, receive(0, 3, (0, 1, 2)))
    assert first.pop_results[0].granted == (PopGrant(0, 1), PopGrant(1, 1), PopGrant(2, 1))
    assert first.pop_results[0].handle_id == 2
    queue = sm.state.pop_queues[(GROUP, TOPIC, 0)]
    assert queue.cursor == 3 and queue.in_flight[1] == PopEntry(10_000, 1, 2)
    # replaying the same index changes nothing; a second receive from the old cursor gets nothing new
    assert run(sm, 2, receive(0, 3, (0, 1, 2))).pop_results == ()
    assert run(sm, 3, receive(0, 3, (0, 1, 2))).pop_results[0].reason is not None
    ack = run(sm, 4, PopAck(GROUP, TOPIC, 0, 1, 2))
    assert ack.pop_results[0].reason is None and 1 not in queue.in_flight
    again = run(sm, 5, PopAck(GROUP, TOPIC, 0, 1, 2))
    assert again.pop_results[0].reason is not None and "not in flight" in again.pop_results[0].reason


def test_bad_handles_are_deterministic_noops(tmp_path: Path) -> None:
    sm = machine(tmp_path / "a")
    stored(sm)
    run(sm, 2, receive(0, 3, (0,)))
    before = sm.state.encode()
    for index, operation in enumerate((PopAck(GROUP, TOPIC, 0, 0, 99), PopAck(GROUP, TOPIC, 0, 5, 2),
                                       PopAck("other", TOPIC, 0, 0, 2),
                                       PopChangeInvisible(GROUP, TOPIC, 0, 0, 3, 1)), start=3):
        result = run(sm, index, operation)
        assert result.pop_results[0].reason is not None
        assert sm.state.pop_queues == ReplicatedState.decode(before).pop_queues
    assert decode_handle(encode_handle(3, 17, 42)) == (3, 17, 42)
    for bad in ("", "rq1.1.2", "rq1.a.b.c", "rq2.1.2.3", "rq1.1.2.0", "x" * 100):
        assert decode_handle(bad) is None


def test_change_invisible_issues_a_new_handle(tmp_path: Path) -> None:
    sm = machine(tmp_path / "a")
    stored(sm)
    run(sm, 2, receive(0, 3, (0,)))
    changed = run(sm, 3, PopChangeInvisible(GROUP, TOPIC, 0, 0, 2, 50_000))
    assert changed.pop_results[0].handle_id == 3
    assert sm.state.pop_queues[(GROUP, TOPIC, 0)].in_flight[0] == PopEntry(50_000, 1, 3)
    assert run(sm, 4, PopAck(GROUP, TOPIC, 0, 0, 2)).pop_results[0].reason is not None  # the old handle
    assert run(sm, 5, PopRevive(GROUP, TOPIC, 0, (0,), 20_000, 17)).pop_results[0].reason is not None
    assert run(sm, 6, PopAck(GROUP, TOPIC, 0, 0, 3)).pop_results[0].reason is None


def test_revive_makes_a_message_receivable_again_with_one_attempt_more(tmp_path: Path) -> None:
    sm = machine(tmp_path / "a")
    stored(sm)
    run(sm, 2, receive(0, 3, (0, 1)))
    assert list(due_entries(sm.state.pop_queues, 10_000)) == [((GROUP, TOPIC, 0), [0, 1])]
    assert not list(due_entries(sm.state.pop_queues, 9_999))
    run(sm, 3, PopAck(GROUP, TOPIC, 0, 0, 2))
    # not yet due: nothing; due: offset 1 revived (the acknowledged offset 0 never comes back)
    assert run(sm, 4, PopRevive(GROUP, TOPIC, 0, (0, 1), 9_999, 17)).pop_results[0].reason is not None
    revived = run(sm, 5, PopRevive(GROUP, TOPIC, 0, (0, 1), 10_000, 17))
    assert revived.pop_results[0].granted == (PopGrant(1, 2),)
    assert run(sm, 6, PopAck(GROUP, TOPIC, 0, 1, 2)).pop_results[0].reason is not None  # stale after revive
    again = run(sm, 7, receive(3, 3, (1,), until=30_000))
    assert again.pop_results[0].granted == (PopGrant(1, 2),)
    assert sm.state.pop_queues[(GROUP, TOPIC, 0)].in_flight[1] == PopEntry(30_000, 2, 7)


def test_dead_letter_after_max_attempts(tmp_path: Path) -> None:
    sm = machine(tmp_path / "a")
    stored(sm)
    index = 2
    run(sm, index, receive(0, 3, (0,), until=100))
    for attempt in range(2, 4):
        index += 1
        assert run(sm, index, PopRevive(GROUP, TOPIC, 0, (0,), 100 * attempt, 3)).pop_results[0].granted \
            == (PopGrant(0, attempt),)
        index += 1
        run(sm, index, receive(3, 3, (0,), until=100 * attempt + 50))
    index += 1
    dead = run(sm, index, PopRevive(GROUP, TOPIC, 0, (0,), 5_000, 3))
    assert dead.pop_results[0].dead_lettered == (PopGrant(0, 3),)
    assert dead.message_results[0][0].queue_offset == 0
    assert 0 not in sm.state.pop_queues[(GROUP, TOPIC, 0)].in_flight
    result = sm.store.get_messages(f"%DLQ%{GROUP}", 0, 0, 10)
    (copy,) = [decode_record(raw) for raw in result.messages]
    assert copy.body == decode_record(sm.store.get_messages(TOPIC, 0, 0, 1).messages[0]).body
    assert copy.property_map["DLQ_ORIGIN_TOPIC"] == TOPIC and copy.reconsume_times == 3
    assert copy.store_timestamp >= 5_000
    # replaying the index stores no second copy
    assert run(sm, index, PopRevive(GROUP, TOPIC, 0, (0,), 5_000, 3)).already_applied
    assert sm.store.max_queue_offset(f"%DLQ%{GROUP}", 0) == 1


def test_forward_to_dead_letter_queue_with_a_valid_handle_only(tmp_path: Path) -> None:
    sm = machine(tmp_path / "a")
    stored(sm)
    run(sm, 2, receive(0, 3, (0, 1)))
    refused = run(sm, 3, PopAck(GROUP, TOPIC, 0, 0, 99, dead_letter=True, timestamp=7))
    assert refused.pop_results[0].reason is not None and sm.store.max_queue_offset(f"%DLQ%{GROUP}", 0) == 0
    forwarded = run(sm, 4, PopAck(GROUP, TOPIC, 0, 0, 2, dead_letter=True, timestamp=7))
    assert forwarded.pop_results[0].dead_lettered == (PopGrant(0, 1),)
    assert sm.store.max_queue_offset(f"%DLQ%{GROUP}", 0) == 1


def test_fifo_queue_is_blocked_while_a_message_is_in_flight(tmp_path: Path) -> None:
    sm = machine(tmp_path / "a")
    stored(sm, 4)
    assert run(sm, 2, receive(0, 2, (0, 1), fifo=True)).pop_results[0].granted == (PopGrant(0, 1), PopGrant(1, 1))
    blocked = run(sm, 3, receive(2, 4, (2, 3), fifo=True))
    assert blocked.pop_results[0].reason is not None and "blocked" in blocked.pop_results[0].reason
    run(sm, 4, PopAck(GROUP, TOPIC, 0, 0, 2))
    assert run(sm, 5, receive(2, 4, (2, 3), fifo=True)).pop_results[0].granted == ()  # 1 still in flight
    run(sm, 6, PopRevive(GROUP, TOPIC, 0, (1,), 10_000, 17))
    # the revived message comes first; new ones only together with (behind) it
    assert run(sm, 7, receive(2, 4, (2, 3), fifo=True)).pop_results[0].reason is not None
    ordered = run(sm, 8, receive(2, 4, (1, 2, 3), fifo=True))
    assert ordered.pop_results[0].granted == (PopGrant(1, 2), PopGrant(2, 1), PopGrant(3, 1))


def test_filtered_offsets_move_the_cursor_and_bounds_hold() -> None:
    queues: dict[tuple[str, str, int], PopQueue] = {}
    outcome = apply_receive(queues, 5, receive(0, 10, (3, 7)))
    assert outcome.granted == (PopGrant(3, 1), PopGrant(7, 1)) and queues[(GROUP, TOPIC, 0)].cursor == 10
    assert apply_receive(queues, 6, receive(10, 10, ())).reason is not None
    assert apply_receive(queues, 7, receive(10, 12, (11, 10))).reason is not None  # not ascending
    full = queues[(GROUP, TOPIC, 0)]
    full.in_flight.update({offset: PopEntry(1, 1, 1) for offset in range(100, 100 + POP_IN_FLIGHT_PER_QUEUE_MAX - 3)})
    capped = apply_receive(queues, 8, receive(10, 20, (10, 11, 12)))
    assert capped.granted == (PopGrant(10, 1),) and full.cursor == 11


def test_snapshot_round_trip_and_the_previous_version(tmp_path: Path) -> None:
    sm = machine(tmp_path / "a")
    stored(sm)
    run(sm, 2, TopicConfig(TOPIC, 4, 4, 6), SubscriptionGroup(GROUP), receive(0, 3, (0, 2)))
    run(sm, 3, PopRevive(GROUP, TOPIC, 0, (2,), 20_000, 17))
    encoded = sm.state.encode()
    decoded = ReplicatedState.decode(encoded)
    assert decoded == sm.state and decoded.pop_queues[(GROUP, TOPIC, 0)].in_flight[2] == PopEntry(0, 2, 0)
    # a version-5 snapshot (no pop section) still reads
    old = ReplicatedState(applied_index=3, topics=dict(sm.state.topics))
    body = old.encode()[:-4]
    body = struct.pack(">IH", STATE_MAGIC, 5) + body[6:-4]  # version 5, without the empty pop section
    decoded_old = ReplicatedState.decode(body + struct.pack(">I", zlib.crc32(body)))
    assert decoded_old.pop_queues == {} and decoded_old.topics == old.topics
    # deleting the topic forgets its pop state
    run(sm, 4, TopicConfig(TOPIC, 4, 4, 6, deleted=True))
    assert sm.state.pop_queues == {}


def test_replicas_agree(tmp_path: Path) -> None:
    commands = [Command((Messages(tuple(message(number) for number in range(5))),)),
                Command((receive(0, 5, (0, 1, 2, 4), until=50),)),
                Command((PopAck(GROUP, TOPIC, 0, 1, 2),)),
                Command((PopRevive(GROUP, TOPIC, 0, (0, 2, 4), 60, 1),)),
                Command((PopChangeInvisible(GROUP, TOPIC, 0, 4, 2, 99),))]
    states = []
    for name in ("a", "b"):
        sm = machine(tmp_path / name)
        for index, command in enumerate(commands, start=1):
            sm.apply(index, encode_command(command))
        states.append(sm.state.encode())
    assert states[0] == states[1]


@pytest.mark.parametrize("payload", [b"", b"\x00" * 3])
def test_truncated_pop_operations_are_noops(tmp_path: Path, payload: bytes) -> None:
    sm = machine(tmp_path / "a")
    data = bytes((1, 0)) + struct.pack(">IBI", 1, 12, len(payload)) + payload
    assert sm.apply(1, data).noop_reason is not None


def test_fifo_group_flag_round_trips_and_leaves_other_groups_bytes_alone() -> None:
    plain = encode_command(Command((SubscriptionGroup(GROUP),)), compress=False)
    orderly = encode_command(Command((SubscriptionGroup(GROUP, consume_orderly=True),)), compress=False)
    assert len(orderly) == len(plain) + 1
    assert decode_command(orderly).operations == (SubscriptionGroup(GROUP, consume_orderly=True),)
    assert decode_command(plain).operations == (SubscriptionGroup(GROUP),)
    state = ReplicatedState(groups={GROUP: SubscriptionGroup(GROUP, retry_max_times=2, consume_orderly=True)})
    assert ReplicatedState.decode(state.encode()) == state


def test_a_renewal_keeps_the_handle(tmp_path: Path) -> None:
    sm = machine(tmp_path / "a")
    stored(sm)
    run(sm, 2, receive(0, 3, (0,)))
    renewed = run(sm, 3, PopChangeInvisible(GROUP, TOPIC, 0, 0, 2, 70_000, keep_handle=True))
    assert renewed.pop_results[0].handle_id == 2
    assert sm.state.pop_queues[(GROUP, TOPIC, 0)].in_flight[0] == PopEntry(70_000, 1, 2)
    assert run(sm, 4, PopAck(GROUP, TOPIC, 0, 0, 2)).pop_results[0].reason is None


def test_the_replicated_state_check_compares_pop_state() -> None:
    from spark_analytics.replicated_state import ReplicaCheckpoint, compare_states

    def replica(name: str, attempt: int) -> ReplicaCheckpoint:
        state = ReplicatedState(applied_index=7, pop_queues={(GROUP, TOPIC, 0): PopQueue(3, {1: PopEntry(9, attempt, 5)})})
        return ReplicaCheckpoint(name, None, state)

    same = compare_states([replica("n0", 1), replica("n1", 1), replica("n2", 1)])
    assert same.ok
    odd = compare_states([replica("n0", 1), replica("n1", 2), replica("n2", 1)])
    assert not odd.ok and any(difference.section == "pop_queues" for difference in odd.differences)
