"""Model-based test: random appends, flushes, clean and crash reopens, and retention, compared with a
plain-Python model of what each queue must return."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from commitlog.outcomes import AppendStatus, GetStatus
from commitlog.record_codec import decode_record
from commitlog.store import MessageStore
from commitlog.sys_flags import TRANSACTION_PREPARED_TYPE, TRANSACTION_ROLLBACK_TYPE
from tests.commitlog.helpers import message, small_config

QUEUES = 3

batch_items = st.lists(
    st.tuples(
        st.integers(0, QUEUES - 1),
        st.integers(0, 2500),  # body size
        st.sampled_from(["TagA", "TagB", None]),
        st.sampled_from([0, 0, 0, TRANSACTION_PREPARED_TYPE, TRANSACTION_ROLLBACK_TYPE]),
        st.booleans(),  # a bad topic: rejected individually
    ),
    min_size=0,
    max_size=12,
)


class StoreMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.directory = Path(tempfile.mkdtemp(prefix="store-model-"))
        self.config = small_config(
            self.directory / "s",
            segment_size_bytes=40 * 1024,
            body_size_max_bytes=4096,
            consume_queue_units_per_file=16,
            index_entry_capacity=32,
        )
        self.store = MessageStore(self.config)
        self.raft_index = 0
        self.number = 0
        # per queue: list of (queue offset, physical offset, body) of visible messages
        self.model: dict[int, list[tuple[int, int, bytes]]] = {q: [] for q in range(QUEUES)}
        self.min_physical = 0
        self.next_offset = dict.fromkeys(range(QUEUES), 0)

    def teardown(self) -> None:
        self.store.close()
        shutil.rmtree(self.directory, ignore_errors=True)

    @rule(items=batch_items)
    def append(self, items: list[tuple[int, int, str | None, int, bool]]) -> None:
        self.raft_index += 1
        batch = []
        for queue_id, size, tags, sys_flag, bad in items:
            self.number += 1
            body = bytes([self.number % 251]) * size
            topic = "bad/topic" if bad else "TopicTest"
            batch.append(message(self.number, topic=topic, queue_id=queue_id, body=body, tags=tags, sys_flag=sys_flag))
        outcome = self.store.append(self.raft_index, batch)
        assert outcome.applied and len(outcome.results) == len(batch)
        for sent, result in zip(batch, outcome.results, strict=True):
            if sent.topic != "TopicTest":
                assert result.status is AppendStatus.REJECTED
                continue
            assert result.status is AppendStatus.OK
            if sent.sys_flag in (TRANSACTION_PREPARED_TYPE, TRANSACTION_ROLLBACK_TYPE):
                assert result.queue_offset == 0
                continue
            queue = self.model[sent.queue_id]
            assert result.queue_offset == self.next_offset[sent.queue_id]
            self.next_offset[sent.queue_id] += 1
            queue.append((result.queue_offset, result.physical_offset, sent.body))

    @rule(queue_id=st.integers(0, QUEUES - 1))
    def append_large_batch(self, queue_id: int) -> None:
        self.append([(queue_id, 2000, "TagA", 0, False)] * 20)

    @rule()
    def replay_old_index(self) -> None:
        if self.raft_index:
            assert not self.store.append(self.raft_index, [message(0)]).applied

    @rule()
    def flush(self) -> None:
        self.store.flush()

    @rule()
    def reopen_clean(self) -> None:
        self.store.close()
        self.store = MessageStore(self.config)

    @rule()
    def reopen_after_crash(self) -> None:
        # what a killed process leaves: the page cache, no final flush, no checkpoint
        self.store.abandon()
        self.store = MessageStore(self.config)
        assert self.store.applied_raft_index == self.raft_index

    @precondition(lambda self: self.store.max_physical_offset > 3 * self.config.segment_size_bytes)
    @rule()
    def retain(self) -> None:
        self.raft_index += 1
        cut = self.store.max_physical_offset - self.config.segment_size_bytes
        self.store.delete_below(self.raft_index, cut)
        self.min_physical = self.store.commit_log.min_offset
        assert self.min_physical > 0
        event("retention deleted segments")
        for queue_id, entries in self.model.items():
            self.model[queue_id] = [e for e in entries if e[1] >= self.min_physical]

    @invariant()
    def queues_match_model(self) -> None:
        for queue_id, expected in self.model.items():
            assert self.store.max_queue_offset("TopicTest", queue_id) == self.next_offset[queue_id]
            if not expected:
                continue
            low = self.store.min_queue_offset("TopicTest", queue_id)
            assert low == expected[0][0]
            assert self.store.max_queue_offset("TopicTest", queue_id) == expected[-1][0] + 1
            got: list[tuple[int, int, bytes]] = []
            offset = low
            while True:
                result = self.store.get_messages("TopicTest", queue_id, offset, 7)
                if result.status is not GetStatus.FOUND:
                    break
                for queue_offset, raw in zip(result.queue_offsets, result.messages, strict=True):
                    decoded = decode_record(raw)
                    got.append((queue_offset, decoded.physical_offset, decoded.body))
                offset = result.next_begin_offset
            assert got == expected


StoreMachine.TestCase.settings = settings(
    max_examples=60, stateful_step_count=40, derandomize=True, deadline=None
)
TestStoreModel = StoreMachine.TestCase
