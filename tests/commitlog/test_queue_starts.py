"""A replica that copies the commit log from past a peer's retention point continues every queue where the peer
does (commitlog/queue_starts.py, MessageStore.queue_starts and finish_ingest), and a queue that begins past its
first consume-queue file is searched and read within the units it has."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from commitlog.consume_queue import ConsumeQueue
from commitlog.errors import CorruptionError
from commitlog.queue_starts import continuation_problem
from commitlog.record_codec import StoredMessage, decode_record
from commitlog.store import MessageStore
from commitlog.sys_flags import TRANSACTION_PREPARED_TYPE
from tests.commitlog.helpers import message, small_config, store_past_retention

LONG = ("TopicTest", 0)
LONE = ("TopicTest", 1)


def copy_from(source: MessageStore, target: MessageStore, low: int) -> None:
    target.reset_to(low)
    offset = low
    while offset < source.max_physical_offset:
        chunk = source.read_committed(offset, 70_000)
        target.ingest_raw(offset, chunk)
        offset += len(chunk)


def test_a_copy_past_retention_continues_each_queue_where_the_peer_does(tmp_path: Path) -> None:
    source = store_past_retention(tmp_path / "source")
    low = source.commit_log.min_offset
    starts = source.queue_starts(low)
    assert starts == {LONG: source.min_queue_offset(*LONG), LONE: 1}
    assert starts[LONG] > source.config.consume_queue_units_per_file  # past the queue's first file
    target = MessageStore(small_config(tmp_path / "target"))
    copy_from(source, target, low)
    target.finish_ingest(source.applied_raft_index, starts)
    for key in (LONG, LONE):
        assert (target.min_queue_offset(*key), target.max_queue_offset(*key)) == (
            source.min_queue_offset(*key), source.max_queue_offset(*key))
    assert target.get_messages(*LONG, 0, 10).messages == source.get_messages(*LONG, 0, 10).messages
    index = source.applied_raft_index + 1
    sent = [message(1000, queue_id=1), message(1001)]
    for store in (source, target):
        store.append(index, sent)
    assert target.max_queue_offset(*LONE) == 2
    assert target.read_committed(low, target.max_physical_offset - low) == source.read_committed(
        low, source.max_physical_offset - low)
    expected = {key: (target.min_queue_offset(*key), target.max_queue_offset(*key)) for key in (LONG, LONE)}
    target.close()
    reopened = MessageStore(small_config(tmp_path / "target"))
    assert {key: (reopened.min_queue_offset(*key), reopened.max_queue_offset(*key)) for key in (LONG, LONE)} == expected
    reopened.close()
    source.close()


def test_an_emptied_queue_continues_after_a_restart_before_its_next_message(tmp_path: Path) -> None:
    source = store_past_retention(tmp_path / "source")
    low = source.commit_log.min_offset
    target = MessageStore(small_config(tmp_path / "target"))
    copy_from(source, target, low)
    target.finish_ingest(source.applied_raft_index, source.queue_starts(low))
    target.close()
    reopened = MessageStore(small_config(tmp_path / "target"))
    assert (reopened.min_queue_offset(*LONE), reopened.max_queue_offset(*LONE)) == (1, 1)
    result = reopened.append(source.applied_raft_index + 1, [message(1000, queue_id=1)]).results[0]
    assert result.queue_offset == 1
    reopened.close()
    source.close()


def test_queue_starts_are_asked_within_the_commit_log(tmp_path: Path) -> None:
    source = store_past_retention(tmp_path / "source")
    low, end = source.commit_log.min_offset, source.max_physical_offset
    assert source.queue_starts(low - 1) is None
    assert source.queue_starts(end + 1) is None
    at_end = source.queue_starts(end)
    assert at_end == {LONG: source.max_queue_offset(*LONG), LONE: 1}
    middle = source.get_messages(*LONG, source.min_queue_offset(*LONG) + 5, 1)
    physical = decode_record(middle.messages[0]).physical_offset
    assert source.queue_starts(physical) == {LONG: middle.queue_offsets[0], LONE: 1}
    source.close()


def test_copied_records_that_disagree_with_the_starts_make_nothing_visible(tmp_path: Path) -> None:
    source = store_past_retention(tmp_path / "source")
    low = source.commit_log.min_offset
    starts = source.queue_starts(low)
    assert starts is not None
    target = MessageStore(small_config(tmp_path / "target"))
    copy_from(source, target, low)
    with pytest.raises(CorruptionError, match="do not continue the queues"):
        target.finish_ingest(source.applied_raft_index, {**starts, LONG: starts[LONG] + 1})
    assert target.max_physical_offset == low and target.applied_raft_index == 0
    assert target.queue_ids() == []
    target.close()
    source.close()


def stored(topic: str, queue_id: int, queue_offset: int, physical_offset: int, sys_flag: int = 0) -> StoredMessage:
    return StoredMessage(100, 0, queue_id, 0, queue_offset, physical_offset, sys_flag, 0, bytes(8), 0, bytes(8), 0,
                         0, b"", topic, b"")


@pytest.mark.parametrize(("messages", "next_offsets", "starts", "problem"), [
    ([stored("A", 0, 0, 0), stored("A", 0, 1, 100)], {}, {}, None),
    ([stored("A", 0, 7, 0), stored("A", 0, 8, 100)], {}, {("A", 0): 7}, None),
    ([stored("A", 0, 7, 0)], {}, None, None),  # no starts: a queue unknown here starts at its first record
    ([stored("A", 0, 7, 0)], {}, {}, "continues at 0"),
    ([stored("A", 0, 6, 0)], {}, {("A", 0): 7}, "continues at 7"),
    ([stored("A", 0, 7, 0), stored("A", 0, 9, 100)], {}, {("A", 0): 7}, "continues at 8"),
    ([stored("A", 0, 4, 0)], {("A", 0): 4}, None, None),
    ([stored("A", 0, 5, 0)], {("A", 0): 4}, None, "continues at 4"),
    ([], {("A", 0): 9}, {("A", 0): 7}, "goes up to 9 here"),
    ([stored("A", 0, 0, 0, TRANSACTION_PREPARED_TYPE), stored("A", 0, 7, 100)], {}, {("A", 0): 7}, None),
])
def test_continuation_problem(messages: list[StoredMessage], next_offsets: dict[tuple[str, int], int],
                              starts: dict[tuple[str, int], int] | None, problem: str | None) -> None:
    found = continuation_problem(messages, next_offsets, starts)
    if problem is None:
        assert found is None
    else:
        assert found is not None and problem in found


def test_a_queue_that_begins_past_its_first_file_is_searched_within_its_units(tmp_path: Path) -> None:
    queue = ConsumeQueue(tmp_path / "queue", "TopicTest", 0, units_per_file=8)
    queue.ensure_capacity(21, 30)
    queue.put_run(21, [(1000 + 100 * number, 100, 0) for number in range(10)])
    assert (queue.min_offset, queue.max_offset) == (21, 31)
    assert queue.first_at_or_after(1450) == 26
    assert queue.units(0, 2) == [(1000, 100, 0), (1100, 100, 0)]
    queue.prune_below(1300)
    assert (queue.min_offset, queue.max_offset) == (24, 31)
    queue.close()
    reopened = ConsumeQueue(tmp_path / "queue", "TopicTest", 0, units_per_file=8)  # the file with 21..23 is gone
    assert (reopened.min_offset, reopened.max_offset, reopened.first_at_or_after(0)) == (24, 31, 24)
    single = ConsumeQueue(tmp_path / "single", "TopicTest", 0, units_per_file=8)
    single.ensure_capacity(19)
    single.put(19, 5000, 100, 0)
    assert (single.min_offset, single.max_offset, single.first_at_or_after(0)) == (19, 20, 19)


def test_consume_queues_rebuilt_past_retention_begin_at_their_first_kept_unit(tmp_path: Path) -> None:
    source = store_past_retention(tmp_path / "store")
    expected = source.min_queue_offset(*LONG), source.max_queue_offset(*LONG)
    source.close()
    shutil.rmtree(tmp_path / "store" / "consumequeue")  # derived: rebuilt from the commit log
    reopened = MessageStore(small_config(tmp_path / "store"))
    assert (reopened.min_queue_offset(*LONG), reopened.max_queue_offset(*LONG)) == expected
    assert reopened.get_messages(*LONG, expected[0], 1).queue_offsets == [expected[0]]
    reopened.close()


def test_a_rebuild_of_the_consume_queues_keeps_a_queue_that_retention_emptied(tmp_path: Path) -> None:
    """Recovery restored a queue that retention emptied from the checkpoint, then threw it away with every other
    queue when one queue was missing or short and the consume queues were rebuilt from the commit log, which
    holds none of its records: its next message was numbered 0 where the other replicas go on."""
    source = store_past_retention(tmp_path / "store")
    assert (source.min_queue_offset(*LONE), source.max_queue_offset(*LONE)) == (1, 1)
    source.close()
    shutil.rmtree(tmp_path / "store" / "consumequeue" / LONG[0] / str(LONG[1]))
    reopened = MessageStore(small_config(tmp_path / "store"))
    try:
        assert (reopened.min_queue_offset(*LONE), reopened.max_queue_offset(*LONE)) == (1, 1)
    finally:
        reopened.close()
