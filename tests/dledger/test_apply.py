"""The apply function without Raft: deterministic, total, idempotent per kind of effect."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import pytest

from commitlog.message import MessageInput
from commitlog.outcomes import AppendStatus
from commitlog.recent_keys import SEED_SPAN_MS
from commitlog.record_codec import decode_record
from commitlog.records import PreparedRecords, RecordBuilder
from commitlog.store import MessageStore
from dledger.apply import (
    UNIQ_KEY_WINDOW_MS,
    ApplyResult,
    StateMachine,
)
from dledger.command import (
    Command,
    ConsumerOffset,
    ConsumerOffsets,
    LeaderStamp,
    Messages,
    Retention,
    SubscriptionGroup,
    TimerProgress,
    TimerRelease,
    TopicConfig,
    TransactionAction,
    TransactionOp,
    encode_command,
    encode_messages_command,
    encode_records_command,
    stamped_messages_command,
)
from dledger.state import ReplicatedState, StateError
from dledger.timers import TIMER_PROGRESS_KEY, TIMER_RELEASE_MAX, schedule
from protocol.topics import TIMER_TOPIC
from tests.commitlog.helpers import data_bytes, message, small_config, tree_bytes
from tests.support.apply_paths import both_apply_paths  # noqa: F401  (a fixture)

pytestmark = pytest.mark.usefixtures("both_apply_paths")

#: the group's store host, IPv4 (the default of small_config) or IPv6 (records 12 bytes longer, sysFlag 0x20)
STORE_HOSTS = pytest.mark.parametrize("store_host", ["10.1.2.3:10911", "[fd00::3]:10911"], ids=["store-v4", "store-v6"])
V6_BORN_HOST = bytes(range(16)) + (40123).to_bytes(4, "big")


def machine(directory: Path, store_host: str = "10.1.2.3:10911") -> StateMachine:
    state = ReplicatedState()
    store = MessageStore(small_config(directory, store_host=store_host), extension_provider=lambda: state.encode())
    return StateMachine(store, state)


def offsets(group: str, offset: int) -> bytes:
    return encode_command(Command((ConsumerOffsets((ConsumerOffset(group, "TopicTest", 0, offset),)),)))


def test_messages_and_state_in_one_command(tmp_path: Path) -> None:
    sm = machine(tmp_path / "a")
    command = Command((
        Messages((message(1), message(2, queue_id=1))),
        ConsumerOffsets((ConsumerOffset("g", "TopicTest", 0, 5),)),
        Messages((message(3),)),
        TopicConfig("TopicTest", 4, 4, 6),
        SubscriptionGroup("g"),
        LeaderStamp(3, "n1", 1234),
    ))
    result = sm.apply(1, encode_command(command))
    assert [len(r) for r in result.message_results] == [2, 1]
    assert [r.queue_offset for r in result.message_results[0]] == [0, 0]
    assert result.message_results[1][0].queue_offset == 1
    assert sm.state.consumer_offset("g", "TopicTest", 0) == 5
    assert sm.state.topics["TopicTest"].write_queue_nums == 4 and "g" in sm.state.groups
    assert sm.state.leader_stamp == LeaderStamp(3, "n1", 1234)
    assert sm.applied_index == 1


def test_replay_is_idempotent(tmp_path: Path) -> None:
    sm = machine(tmp_path / "a")
    sm.apply(1, encode_command(Command((Messages((message(1),)),))))
    sm.apply(2, offsets("g", 7))
    again = sm.apply(1, encode_command(Command((Messages((message(1),)),))))
    assert again.already_applied
    sm.apply(2, offsets("g", 99))
    assert sm.state.consumer_offset("g", "TopicTest", 0) == 7
    assert sm.store.max_queue_offset("TopicTest", 0) == 1


def test_state_lost_in_a_crash_is_reapplied_without_duplicating_messages(tmp_path: Path) -> None:
    directory = tmp_path / "a"
    sm = machine(directory)
    sm.apply(1, offsets("g", 1))
    sm.store.flush()  # the checkpoint holds the state at index 1
    sm.apply(2, encode_command(Command((Messages((message(2),)), ConsumerOffsets((ConsumerOffset("g", "TopicTest", 0, 2),)),))))
    # crash: no flush. Reopen: the store (via its marker) has index 2, the state only index 1
    sm.store.abandon()
    peek = MessageStore(small_config(directory))
    state = ReplicatedState.decode(peek.extension)
    peek.abandon()
    assert state.applied_index == 1
    store = MessageStore(small_config(directory), extension_provider=lambda: state.encode())
    reopened = StateMachine(store, state)
    assert store.applied_raft_index == 2
    replay = reopened.apply(2, encode_command(Command((Messages((message(2),)), ConsumerOffsets((ConsumerOffset("g", "TopicTest", 0, 2),)),))))
    assert replay.message_results == ()  # the message was not stored twice
    assert store.max_queue_offset("TopicTest", 0) == 1
    assert state.consumer_offset("g", "TopicTest", 0) == 2


def test_bad_commands_are_recorded_noops(tmp_path: Path) -> None:
    sm = machine(tmp_path / "a")
    result = sm.apply(1, b"\x07garbage")
    assert result.noop_reason is not None and "unsupported command version" in result.noop_reason
    assert sm.applied_index == 1 and sm.noops[-1][0] == 1
    bad_message = message(2, topic="bad topic")
    outcome = sm.apply(2, encode_command(Command((Messages((bad_message, message(3))),))))
    assert [r.status for r in outcome.message_results[0]] == [AppendStatus.REJECTED, AppendStatus.OK]


def test_replicas_fed_the_same_log_are_byte_identical(tmp_path: Path) -> None:
    log = [encode_command(Command((Messages(tuple(message(i * 10 + j, queue_id=j % 3) for j in range(8))),
                                   ConsumerOffsets((ConsumerOffset("g", "TopicTest", i % 3, i),)))))
           for i in range(1, 60)]
    for name in ("a", "b"):
        sm = machine(tmp_path / name)
        for index, data in enumerate(log, start=1):
            sm.apply(index, data)
        sm.store.close()
    assert tree_bytes(tmp_path / "a") == tree_bytes(tmp_path / "b")


def test_retention_operation(tmp_path: Path) -> None:
    sm = machine(tmp_path / "a")
    for index in range(1, 200):
        sm.apply(index, encode_command(Command((Messages((message(index, body=b"x" * 2000),)),))))
    segment = sm.store.config.segment_size_bytes
    sm.apply(200, encode_command(Command((Retention(2 * segment),))))
    assert sm.store.commit_log.min_offset == 2 * segment


def test_state_snapshot_round_trip_and_damage() -> None:
    state = ReplicatedState(applied_index=9)
    state.apply_offsets((ConsumerOffset("g", "t", 1, 5), ConsumerOffset("h", "t", 0, 2)))
    state.apply_topic(TopicConfig("t", 8, 4, 6, 0, True))
    state.apply_group(SubscriptionGroup("g", retry_max_times=3))
    state.leader_stamp = LeaderStamp(4, "n2", 99)
    raw = state.encode()
    assert ReplicatedState.decode(raw) == state
    damaged = bytearray(raw)
    damaged[12] ^= 1
    for bad in (bytes(damaged), raw[:10], b""):
        try:
            ReplicatedState.decode(bad)
        except StateError:
            continue
        raise AssertionError("damaged state decoded")
    state.apply_topic(TopicConfig("t", 0, 0, 0, deleted=True))
    assert "t" not in state.topics and state.consumer_offsets == {}


def test_the_leaders_own_batches_apply_exactly_like_decoded_ones(tmp_path: Path) -> None:
    leader, follower = machine(tmp_path / "leader"), machine(tmp_path / "follower")
    stamps = [1_700_000_000_500, 1_700_000_000_400, 1_700_000_000_900]  # the second is below the floor
    for index, store_timestamp in enumerate(stamps, start=1):
        batch = [message(index * 100 + j, queue_id=j % 2, keys=f"k{index}") for j in range(10)]
        data = encode_messages_command(batch, store_timestamp=store_timestamp)
        mine = leader.apply(index, data, stamped_messages_command(batch, store_timestamp))
        theirs = follower.apply(index, data)
        assert [r[:3] for r in mine.message_results[0]] == [r[:3] for r in theirs.message_results[0]]
    assert leader.state.last_store_timestamp == follower.state.last_store_timestamp == stamps[2]
    leader.store.close()
    follower.store.close()
    assert data_bytes(tmp_path / "leader") == data_bytes(tmp_path / "follower")


def test_messages_that_cannot_be_stored_are_refused_at_submit() -> None:
    import pytest

    from dledger.config import GroupCommitSettings
    from dledger.group_commit import GroupCommitter, InvalidMessageError

    proposed: list[bytes] = []
    committer = GroupCommitter(GroupCommitSettings(), lambda data, callback, own: proposed.append(data),
                               lambda: (True, None), entry_bytes_max=1 << 20, body_size_max_bytes=100)
    try:
        with pytest.raises(InvalidMessageError, match="body length"):
            committer.submit([message(1, body=b"x" * 101)])
        with pytest.raises(InvalidMessageError, match="queue id"):
            committer.submit([message(1, body=b"ok")._replace(queue_id=-1)])
        assert proposed == []
    finally:
        committer.stop()


def stamped(number: int, store_timestamp: int, queue_id: int = 0, reconsume_times: int = 0) -> MessageInput:
    return message(number)._replace(store_timestamp=store_timestamp, queue_id=queue_id, reconsume_times=reconsume_times)


def test_retried_sends_are_stored_once(tmp_path: Path) -> None:
    sm = machine(tmp_path / "a")
    first = sm.apply(1, encode_command(Command((Messages((stamped(1, 1_000_000),)),))))
    # the client's retry (same UNIQ_KEY, maybe another queue), and a duplicate inside one command
    retry = sm.apply(2, encode_command(Command((Messages((stamped(1, 1_001_000, queue_id=1), stamped(2, 1_001_000),
                                                          stamped(2, 1_001_000, queue_id=1))),))))
    assert retry.message_results[0][0] == first.message_results[0][0]
    assert retry.message_results[0][2] == retry.message_results[0][1]
    assert sm.store.max_queue_offset("TopicTest", 0) == 2 and sm.store.max_queue_offset("TopicTest", 1) == 0
    # a redelivery (reconsume count differs) and a resend after the window are new messages
    later = sm.apply(3, encode_command(Command((Messages((stamped(1, 1_002_000, reconsume_times=1),
                                                          stamped(2, 1_001_000 + UNIQ_KEY_WINDOW_MS + 1000))),))))
    assert [r.queue_offset for r in later.message_results[0]] == [2, 3]


def test_deduplication_is_the_same_on_every_replica(tmp_path: Path) -> None:
    commands = [encode_command(Command((Messages((stamped(n % 3, 1_000_000 + n),)),))) for n in range(9)]
    replicas = [machine(tmp_path / name) for name in ("a", "b")]
    for replica in replicas:
        for index, command in enumerate(commands, start=1):
            replica.apply(index, command)
        replica.store.flush()
    assert replicas[0].store.max_queue_offset("TopicTest", 0) == 3
    assert data_bytes(tmp_path / "a") == data_bytes(tmp_path / "b")


def test_a_transaction_resolves_once_and_its_state_survives_a_snapshot(tmp_path: Path) -> None:
    sm = machine(tmp_path / "a")
    half = message(1, topic="RMQ_SYS_TRANS_HALF_TOPIC")
    sm.apply(1, encode_command(Command((Messages((half,)),))))
    unknown = sm.apply(2, encode_command(Command((TransactionOp(5, TransactionAction.COMMIT, "g", 1),))))
    assert unknown.noop_reason is not None  # no half at queue offset 5
    sm.apply(3, encode_command(Command((TransactionOp(0, TransactionAction.CHECK, "g", 1),))))
    assert sm.state.transaction_checks == {0: 1}
    commit = Command((Messages((message(2),)), TransactionOp(0, TransactionAction.COMMIT, "g", 2)))
    assert sm.apply(4, encode_command(commit)).noop_reason is None
    again = sm.apply(5, encode_command(commit))
    assert again.noop_reason is not None and again.message_results == ()
    assert sm.store.max_queue_offset("TopicTest", 0) == 1
    assert sm.state.transactions_resolved == {0: TransactionAction.COMMIT} and sm.state.transaction_checks == {}
    sm.apply(6, encode_command(Command((TimerProgress("transaction", 1), TimerProgress("level:3", 7)))))
    decoded = ReplicatedState.decode(sm.state.encode())
    assert decoded == sm.state and decoded.transaction_progress == 1 and decoded.timer_progress["level:3"] == 7


def test_timers_release_once_in_chunks_and_late_ones_at_once(tmp_path: Path) -> None:
    replicas = [machine(tmp_path / name) for name in ("a", "b")]
    base = 1_700_000_000_000
    due_second = base // 1000 + 100
    timers = [schedule(stamped(n, base), (due_second - 1) * 1000 + 1) for n in range(300)]
    late = schedule(stamped(999, base + 1), base - 50_000)  # already past when it is applied
    deliver = [TimerRelease(due_second, start) for start in (0, TIMER_RELEASE_MAX, 2 * TIMER_RELEASE_MAX)]
    commands = [Command((Messages(tuple(timers)),)), Command((Messages((late,)),)),
                *(Command((operation,)) for operation in deliver)]
    for replica in replicas:
        for index, command in enumerate(commands, start=1):
            replica.apply(index, encode_command(command))
        replica.store.flush()
    sm = replicas[0]
    assert sm.store.max_queue_offset("RMQ_SYS_TIMER_TOPIC", 0) == 300
    real = sm.store.get_messages("TopicTest", 0, 0, 1000)
    released = [decode_record(raw) for raw in real.messages]
    assert len(released) == 301 and released[0].body == late.body  # the late one first, at once
    assert sorted(m.body for m in released[1:]) == sorted(m.body for m in timers)
    assert all(m.store_timestamp >= due_second * 1000 - 999 for m in released[1:])
    assert sm.state.timer_progress["timer"] == due_second
    assert data_bytes(tmp_path / "a") == data_bytes(tmp_path / "b")


def release_as_written(second: int, start: int) -> bytes:
    """A timer release as raft journals already hold it, laid out by hand: a TIMER_PROGRESS operation (type 6)
    under "timer-deliver" whose value is second * 1,000,000 + start."""
    key = b"timer-deliver"
    payload = struct.pack(">H", len(key)) + key + struct.pack(">q", second * 1_000_000 + start)
    return bytes((1, 0)) + struct.pack(">IBI", 1, 6, len(payload)) + payload


def test_timer_releases_already_in_journals_apply_as_they_did(tmp_path: Path) -> None:
    """Releases written before TimerRelease had a type of its own apply as TimerRelease does: the same timers
    released, the same files, the same state (its value kept under its wire key, as it always was)."""
    assert release_as_written(1_700_000_100, 256) == bytes.fromhex(
        "0100000000010600000017000d74696d65722d64656c6976657200060a241e142200")
    base = 1_700_000_000_000
    due_second = base // 1000 + 100
    timers = encode_command(Command((Messages(tuple(schedule(stamped(n, base), due_second * 1000 - 5)
                                                    for n in range(TIMER_RELEASE_MAX + 10))),)))
    replicas = {name: machine(tmp_path / name) for name in ("journal", "new")}
    for name, replica in replicas.items():
        replica.apply(1, timers)
        for index, start in enumerate((0, TIMER_RELEASE_MAX), start=2):
            if name == "journal":
                released = replica.apply(index, release_as_written(due_second, start))
            else:
                released = replica.apply(index, encode_command(Command((TimerRelease(due_second, start),))))
            assert len(released.message_results[0]) == (TIMER_RELEASE_MAX if start == 0 else 10)
        assert replica.state.timer_progress == {TIMER_PROGRESS_KEY: due_second,
                                                "timer-deliver": due_second * 1_000_000 + TIMER_RELEASE_MAX}
        assert replica.store.max_queue_offset("TopicTest", 0) == TIMER_RELEASE_MAX + 10
    assert replicas["journal"].state.encode() == replicas["new"].state.encode()
    for replica in replicas.values():
        replica.store.close()
    assert data_bytes(tmp_path / "journal") == data_bytes(tmp_path / "new")


def test_incompressible_entries_stop_lz4_attempts_for_a_while_then_try_again() -> None:
    import random
    import threading
    from collections.abc import Callable

    from dledger.command import FLAG_LZ4, decode_command
    from dledger.config import GroupCommitSettings
    from dledger.group_commit import COMPRESS_RETRY_ENTRIES, COMPRESS_RETRY_ENTRIES_MAX, GroupCommitter

    proposed: list[bytes] = []
    arrived = threading.Semaphore(0)

    def propose(data: bytes, callback: Callable[[ApplyResult | None, int], None], own: object) -> None:
        proposed.append(data)
        callback(None, 5)  # done with it (as a leader change): frees the in-flight slot
        arrived.release()

    rng = random.Random(3)
    committer = GroupCommitter(GroupCommitSettings(linger_ms=0), propose, lambda: (True, None), entry_bytes_max=1 << 20)
    try:
        # one submit per entry: each waits for the previous entry to be proposed
        bodies = [rng.randbytes(8192) for _ in range(COMPRESS_RETRY_ENTRIES + 2)] + [b"a" * 8192] * 2
        for number, body in enumerate(bodies):
            committer.submit([message(number, body=body)])
            assert arrived.acquire(timeout=30)
    finally:
        committer.stop()
    flags = [data[1] & FLAG_LZ4 for data in proposed]
    # random: tried once, then COMPRESS_RETRY_ENTRIES sent as is; the next attempt fails again (random);
    # the compressible bodies after that are sent as is until the pause ends
    assert flags == [0] * len(bodies)
    decoded = [decode_command(data).operations[0] for data in proposed]
    assert [operation.messages[0].body for operation in decoded if isinstance(operation, Messages)] == bodies
    committer = GroupCommitter(GroupCommitSettings(linger_ms=0), propose, lambda: (True, None), entry_bytes_max=1 << 20)
    proposed.clear()
    try:
        for number, body in enumerate([rng.randbytes(8192)] + [b"a" * 8192] * (COMPRESS_RETRY_ENTRIES + 1)):
            committer.submit([message(number, body=body)])
            assert arrived.acquire(timeout=30)
    finally:
        committer.stop()
    assert [data[1] & FLAG_LZ4 for data in proposed] == [0] * (COMPRESS_RETRY_ENTRIES + 1) + [FLAG_LZ4]
    # futile attempts back off (16, 32, ... skipped entries, up to COMPRESS_RETRY_ENTRIES_MAX); one that
    # shrinks starts over: random bodies fail the attempts at 0, 17 and 50, compressible ones from 18 on are
    # sent as is until the attempt at 50 compresses them; then every entry is tried until one fails (a
    # random one at 52), and the pause after it is back at 16 (the next attempt, at 69, compresses)
    committer = GroupCommitter(GroupCommitSettings(linger_ms=0), propose, lambda: (True, None), entry_bytes_max=1 << 20)
    proposed.clear()
    bodies = ([rng.randbytes(8192) for _ in range(18)] + [b"a" * 8192] * 34 + [rng.randbytes(8192)]
              + [b"b" * 8192] * 17)
    try:
        for number, body in enumerate(bodies):
            committer.submit([message(number, body=body)])
            assert arrived.acquire(timeout=30)
    finally:
        committer.stop()
    compressed = [number for number, data in enumerate(proposed) if data[1] & FLAG_LZ4]
    assert compressed == [50, 51, 69]
    assert COMPRESS_RETRY_ENTRIES_MAX >= 4 * COMPRESS_RETRY_ENTRIES


# ---------------------------------------------------------------------------------------------- records


def record_builder(directory: Path, store_host: str = "10.1.2.3:10911") -> RecordBuilder:
    config = small_config(directory, store_host=store_host)
    return RecordBuilder(config.store_host_bytes, config.segment_size_bytes, config.body_size_max_bytes,
                         excluded_topics=(TIMER_TOPIC,))


@STORE_HOSTS
def test_records_apply_like_messages_on_leader_and_followers(tmp_path: Path, store_host: str) -> None:
    """The same batches as Messages commands, as Records decoded (a follower) and as the leader's own
    records: equal results, equal files; a stamp below the floor is raised alike."""
    replicas = {name: machine(tmp_path / name, store_host) for name in ("messages", "follower", "leader")}
    build = record_builder(tmp_path, store_host)
    stamps = [1_700_000_000_500, 1_700_000_000_400, 1_700_000_000_900, 1_700_000_000_900]
    for index, store_timestamp in enumerate(stamps, start=1):
        batch = [message(index * 100 + j, queue_id=j % 3, keys=f"k{index} x{j}") for j in range(10)]
        batch[5] = batch[5]._replace(born_host=V6_BORN_HOST)
        batch[4] = batch[1]  # a retry inside the command
        if index == 4:
            batch[7] = message(101)  # a retry of a message stored by the first command
        records = build.build(batch, store_timestamp)
        assert records is not None
        data = encode_records_command(records)
        plain = replicas["messages"].apply(index, encode_messages_command(batch, store_timestamp=store_timestamp))
        theirs = replicas["follower"].apply(index, data, want_results=False)
        mine = replicas["leader"].apply(index, data, Command((records,)))
        assert mine.message_results == plain.message_results
        assert theirs.message_results == ()  # nobody waits for a follower's results
        assert mine.message_results[0][4] == mine.message_results[0][1]
    assert mine.message_results[0][7] == plain.message_results[0][7]
    assert {replica.state.last_store_timestamp for replica in replicas.values()} == {stamps[2]}
    assert {replica.state.timer_progress.get(TIMER_PROGRESS_KEY) for replica in replicas.values()} == {
        stamps[0] // 1000 - 1}
    assert len(mine.message_results[0][0].msg_id) == (56 if store_host.startswith("[") else 32)
    for replica in replicas.values():
        replica.store.close()
    assert (data_bytes(tmp_path / "messages") == data_bytes(tmp_path / "follower")
            == data_bytes(tmp_path / "leader"))


#: two distinct UNIQ_KEYs whose key-index hashes (CRC32 of "TopicTest#" + key) are equal (found by a
#: birthday search over random keys)
COLLIDING_UNIQ_KEYS = ("522F02D3B9759D7422C46EDDF11D4CA4", "8D87076E8209C53D1D9D31AE50E6BE9E")


@STORE_HOSTS
def test_records_deduplicate_by_key_not_by_hash(tmp_path: Path, store_host: str) -> None:
    """Equal hashes of distinct keys (a CRC collision) are distinct sends, in one command and across
    commands; equal keys are one send (the keys read from the records, past both hosts)."""
    first_key, second_key = COLLIDING_UNIQ_KEYS
    assert zlib.crc32(f"TopicTest#{first_key}".encode()) == zlib.crc32(f"TopicTest#{second_key}".encode())
    build = record_builder(tmp_path, store_host)
    one, two = message(1, UNIQ_KEY=first_key), message(2, UNIQ_KEY=second_key, born_host=V6_BORN_HOST)
    replicas = [machine(tmp_path / "plain", store_host), machine(tmp_path / "records", store_host)]
    batches = [[one, two, one, two], [two, message(3), one]]
    outcomes = []
    for index, batch in enumerate(batches, start=1):
        store_timestamp = 1_700_000_000_000 + index
        records = build.build(batch, store_timestamp)
        assert records is not None
        outcomes.append((replicas[0].apply(index, encode_messages_command(batch, store_timestamp=store_timestamp)),
                         replicas[1].apply(index, encode_records_command(records), Command((records,)))))
    for plain, prepared in outcomes:
        assert plain.message_results == prepared.message_results
    first, second = outcomes[0][1].message_results[0], outcomes[1][1].message_results[0]
    assert first[0] != first[1] and first[2] == first[0] and first[3] == first[1]
    assert second[0] == first[1] and second[2] == first[0]
    assert replicas[1].store.max_queue_offset("TopicTest", 0) == 3
    for replica in replicas:
        replica.store.close()
    assert data_bytes(tmp_path / "plain") == data_bytes(tmp_path / "records")


def test_a_repeated_uniq_key_with_other_content_is_a_new_message(tmp_path: Path) -> None:
    """A UNIQ_KEY match alone never drops a send (commitlog.retries): a send with a stored message's key
    but other content is stored and counted; one with the same content is a retry. The same on the
    Messages path, a follower's records and the leader's own records."""
    key = "C0A8000A9CB3000000000000000000AA"
    a, b, c = (message(number, UNIQ_KEY=key) for number in (1, 2, 3))
    batches = [[a], [b, a._replace(queue_id=2, born_timestamp=1), b, c, message(4)], [c, message(5, UNIQ_KEY=key)]]
    build = record_builder(tmp_path)
    replicas = {name: machine(tmp_path / name) for name in ("messages", "follower", "leader")}
    results = []
    for index, batch in enumerate(batches, start=1):
        store_timestamp = 1_700_000_000_000 + index * 1000
        records = build.build(batch, store_timestamp)
        assert records is not None
        results.append(replicas["messages"].apply(index, encode_messages_command(batch, store_timestamp=store_timestamp)))
        replicas["follower"].apply(index, encode_records_command(records))
        assert replicas["leader"].apply(index, encode_records_command(records), Command((records,))) == results[-1]
    (stored_a,), (of_b, of_a, again_b, of_c, _) = results[0].message_results[0], results[1].message_results[0]
    assert of_a == stored_a and again_b == of_b  # retries: the stored message's answer
    assert len({stored_a.physical_offset, of_b.physical_offset, of_c.physical_offset}) == 3
    assert results[2].message_results[0][0] == of_c
    assert [replica.store.max_queue_offset("TopicTest", 0) for replica in replicas.values()] == [5, 5, 5]
    # b against a (stored), c against a and b (stored, or earlier in the command), message 5 likewise
    assert [replica.key_collisions for replica in replicas.values()] == [3, 3, 3]
    for replica in replicas.values():
        replica.store.close()
    assert (data_bytes(tmp_path / "messages") == data_bytes(tmp_path / "follower")
            == data_bytes(tmp_path / "leader"))


def test_ids_that_repeat_every_65536_sends_lose_nothing(tmp_path: Path) -> None:
    """What a producer did from the 25th of each month: its ids repeated after 65,536 sends, and the dedupe
    window took every repeat for a retry. Distinct messages under repeated ids are all stored."""
    sm = machine(tmp_path / "a")
    build = record_builder(tmp_path)
    keys = [f"C0A8000A9CB3000000007FFFFFFF{counter:04X}" for counter in range(8)]
    stored = 0
    for index in range(1, 5):  # four rounds through the same eight ids, one command each
        batch = [message(index * 100 + n, UNIQ_KEY=keys[n]) for n in range(8)]
        records = build.build(batch, 1_700_000_000_000 + index)
        assert records is not None
        outcome = sm.apply(index, encode_records_command(records), Command((records,)))
        stored += len({result.physical_offset for result in outcome.message_results[0]})
    assert stored == 32 and sm.store.max_queue_offset("TopicTest", 0) == 32
    assert sm.key_collisions == 24


def test_a_retried_timed_message_is_one_message_though_its_due_time_moved(tmp_path: Path) -> None:
    """A relative delay (TIMER_DELAY_SEC) gives each attempt its own due time and timer token: they are
    not content, so the retry is still a retry."""
    sm = machine(tmp_path / "a")
    sent = message(1, TIMER_DELAY_SEC="60")
    first = sm.apply(1, encode_messages_command([schedule(sent, 1_700_000_060_000)], store_timestamp=1_700_000_000_000))
    retry = sm.apply(2, encode_messages_command([schedule(sent._replace(queue_id=1), 1_700_000_062_000)],
                                                store_timestamp=1_700_000_002_000))
    assert retry.message_results[0][0] == first.message_results[0][0]
    assert sm.store.max_queue_offset(TIMER_TOPIC, 0) == 1 and sm.key_collisions == 0
    other = sm.apply(3, encode_messages_command([schedule(message(2, TIMER_DELAY_SEC="60", UNIQ_KEY=message(1).properties
                                                                  .split(b"UNIQ_KEY\x01")[1].split(b"\x02")[0].decode()),
                                                          1_700_000_063_000)], store_timestamp=1_700_000_003_000))
    assert other.message_results[0][0] != first.message_results[0][0] and sm.key_collisions == 1


def test_bad_records_commands_are_noops_on_every_replica(tmp_path: Path) -> None:
    sm = machine(tmp_path / "a")
    records = record_builder(tmp_path).build([message(1), message(2)], 1_700_000_000_000)
    assert records is not None
    mixed = encode_command(Command((records, LeaderStamp(1, "n1", 5))))
    assert "alone" in (sm.apply(1, mixed).noop_reason or "")
    broken = records._replace(key_hashes=b"")
    assert "inconsistent records" in (sm.apply(2, encode_records_command(broken)).noop_reason or "")
    assert "inconsistent records" in (sm.apply(3, b"", Command((broken,))).noop_reason or "")
    assert sm.store.commit_log.end_offset == 0 and sm.applied_index == 3
    assert sm.state.leader_stamp is None  # the mixed command did nothing at all


def test_group_commit_sends_records_and_falls_back_to_messages(tmp_path: Path) -> None:
    import threading
    from collections.abc import Callable

    from dledger.command import decode_command
    from dledger.config import GroupCommitSettings
    from dledger.group_commit import GroupCommitter

    proposed: list[tuple[bytes, Command]] = []
    arrived = threading.Semaphore(0)

    def propose(data: bytes, callback: Callable[[ApplyResult | None, int], None], built: Command) -> None:
        proposed.append((data, built))
        callback(None, 5)
        arrived.release()

    committer = GroupCommitter(GroupCommitSettings(linger_ms=0), propose, lambda: (True, None), entry_bytes_max=1 << 20,
                               prepare=record_builder(tmp_path).build)
    try:
        for batch in ([message(1), message(2)], [message(3), message(4, topic=TIMER_TOPIC)]):
            committer.submit(batch)
            assert arrived.acquire(timeout=30)
    finally:
        committer.stop()
    (records_data, records_built), (messages_data, messages_built) = proposed
    # what the leader applies for its own entry is exactly what the followers decode from its bytes
    assert decode_command(records_data) == records_built and isinstance(records_built.operations[0], PreparedRecords)
    assert decode_command(messages_data) == messages_built and isinstance(messages_built.operations[0], Messages)
    assert all(m.store_timestamp == messages_built.operations[0].messages[0].store_timestamp
               for m in messages_built.operations[0].messages)


def test_the_store_seeds_its_recent_keys_with_the_dedupe_window() -> None:
    # the store cannot import dledger: its constant must follow the window apply asks about, or the first
    # questions after a restart are answered by key-index lookups again
    assert SEED_SPAN_MS == UNIQ_KEY_WINDOW_MS


class WatchedLock:
    """A lock that knows whether it is held, for a state that checks every change is made under it."""

    def __init__(self) -> None:
        self.held = False

    def __enter__(self) -> WatchedLock:
        assert not self.held
        self.held = True
        return self

    def __exit__(self, *exc: object) -> None:
        self.held = False


class WatchedState(ReplicatedState):
    lock: WatchedLock | None = None
    changes = 0

    def __setattr__(self, name: str, value: object) -> None:
        self._changing()
        super().__setattr__(name, value)

    def _changing(self) -> None:
        if self.lock is not None:
            assert self.lock.held, "the replicated state changed outside the state lock"
            WatchedState.changes += 1

    def apply_offsets(self, offsets: tuple[ConsumerOffset, ...]) -> None:
        self._changing()
        super().apply_offsets(offsets)

    def apply_timer_progress(self, key: str, delivered_up_to: int) -> None:
        self._changing()
        super().apply_timer_progress(key, delivered_up_to)

    def count_transaction_check(self, half: int) -> None:
        self._changing()
        super().count_transaction_check(half)

    def resolve_transaction(self, half: int, action: int) -> None:
        self._changing()
        super().resolve_transaction(half, action)


def test_every_state_change_is_made_under_the_state_lock_and_retention_outside_it(tmp_path: Path) -> None:
    """A store flush encodes the state from another thread (the checkpoint, the compaction's flush): under
    the state lock it sees each index's changes whole or not at all. A retention deletes segments, which
    takes the store's locks (a flush holds those while it encodes the state): never under the state lock."""
    lock = WatchedLock()
    WatchedState.changes = 0
    state = WatchedState()
    state.lock = lock
    store = MessageStore(small_config(tmp_path), extension_provider=lambda: state.encode())
    sm = StateMachine(store, state, state_lock=lock)
    delete_below = store.delete_below

    def watched_delete_below(raft_index: int, physical_offset: int) -> object:
        assert not lock.held
        return delete_below(raft_index, physical_offset)

    store.delete_below = watched_delete_below  # type: ignore[assignment,method-assign]
    builder = RecordBuilder(store.store_host, store.config.segment_size_bytes, store.config.body_size_max_bytes)
    index = 0
    for n in range(150):
        index += 1
        sm.apply(index, encode_command(Command((Messages((message(n, body=b"x" * 2000),)),
                                                ConsumerOffsets((ConsumerOffset(f"g{n}", "TopicTest", 0, n),))))))
    records = builder.build([message(1000 + n) for n in range(4)], 1_700_000_000_000)
    assert records is not None
    index += 1
    sm.apply(index, encode_records_command(records))
    for operation in (TransactionOp(0, TransactionAction.CHECK, "g", 1), TimerProgress(TIMER_PROGRESS_KEY, 5),
                      LeaderStamp(2, "n1", 9), Retention(2 * store.config.segment_size_bytes)):
        index += 1
        sm.apply(index, encode_command(Command((operation,))))
    index += 1
    assert sm.apply(index, b"\xff garbage").noop_reason
    assert store.commit_log.min_offset == 2 * store.config.segment_size_bytes
    assert state.applied_index == index and len(state.consumer_offsets) == 150
    assert WatchedState.changes > 300


def test_a_full_disk_is_waited_out_for_messages_and_records_alike(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                                  ) -> None:
    """Apply never skips an entry for a full disk (a skipped entry is a diverged replica): each form of a
    command retries its append, sleeping in between, until there is space."""
    from collections.abc import Callable

    from commitlog.errors import DiskFullError

    state = ReplicatedState()
    store = MessageStore(small_config(tmp_path / "a"), extension_provider=state.encode)
    slept: list[float] = []
    sm = StateMachine(store, state, sleep=slept.append)
    failures = {"append": 2, "append_records": 1}
    for name in failures:
        original = getattr(store, name)

        def full_then_space(*args: object, _name: str = name, _original: Callable[..., object] = original,
                            **kwargs: object) -> object:
            if failures[_name]:
                failures[_name] -= 1
                raise DiskFullError("no space left")
            return _original(*args, **kwargs)

        monkeypatch.setattr(store, name, full_then_space)
    first = sm.apply(1, encode_messages_command([message(1)], store_timestamp=1_700_000_000_000))
    records = record_builder(tmp_path).build([message(2)], 1_700_000_000_001)
    assert records is not None
    second = sm.apply(2, encode_records_command(records), Command((records,)))
    assert failures == {"append": 0, "append_records": 0} and len(slept) == 3
    assert first.message_results[0][0].status == second.message_results[0][0].status == AppendStatus.OK
    assert store.max_queue_offset("TopicTest", 0) == 2 and sm.applied_index == 2
