"""Group commit without Raft: how waiting sends are packed into entries, and whose results each caller gets."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

import pytest

from commitlog.message import MessageInput
from commitlog.outcomes import AppendResult, AppendStatus
from dledger.apply import ApplyResult
from dledger.command import Command, Messages
from dledger.config import GroupCommitSettings
from dledger.future import AppendFuture
from dledger.group_commit import GroupCommitter, InvalidMessageError, request_bytes
from tests.commitlog.helpers import message

BYTES_MAX = 2048


class Recorder:
    """A propose that applies at once: message n of the log gets physical offset n."""

    def __init__(self) -> None:
        self.entries: list[list[MessageInput]] = []
        self.lock = threading.Lock()

    def propose(self, data: bytes, callback: Callable[[ApplyResult | None, int], None], built: Command) -> None:
        (operation,) = built.operations
        assert isinstance(operation, Messages)  # no prepare: the messages themselves
        messages = list(operation.messages)
        assert len({m.store_timestamp for m in messages}) == 1  # one store timestamp for the whole entry
        with self.lock:
            start = sum(len(entry) for entry in self.entries)
            self.entries.append(messages)
        results = tuple(AppendResult(AppendStatus.OK, start + i, 0, 1) for i in range(len(messages)))
        callback(ApplyResult(len(self.entries), (results,)), 0)


def run(requests: Sequence[Sequence[MessageInput]], messages_max: int = 8
        ) -> tuple[Recorder, list[AppendFuture[tuple[AppendResult, ...]]]]:
    recorder = Recorder()
    committer = GroupCommitter(
        GroupCommitSettings(batch_messages_max=messages_max, batch_bytes_max=BYTES_MAX, linger_ms=0,
                            in_flight_entries_max=1),
        recorder.propose, lambda: (True, None), entry_bytes_max=1 << 20)
    try:
        committer.pause()  # everything waits first, so the batcher sees all of it at once
        futures = [committer.submit(request) for request in requests]
        committer.resume()
        for future in futures:
            future.result(timeout=30)
    finally:
        committer.stop()
    return recorder, futures


def unstamped(messages: Sequence[MessageInput]) -> list[MessageInput]:
    """``messages`` without their store timestamps: group commit stamps each entry with its own."""
    return [m._replace(store_timestamp=0) for m in messages]


def check(requests: Sequence[Sequence[MessageInput]], recorder: Recorder,
          futures: Sequence[AppendFuture[tuple[AppendResult, ...]]], messages_max: int = 8) -> None:
    # the log holds every message once, in submit order
    assert unstamped([m for entry in recorder.entries for m in entry]) == unstamped([m for request in requests
                                                                                     for m in request])
    # each caller gets its own messages' results, in order
    offset = 0
    for request, future in zip(requests, futures, strict=True):
        assert [result.physical_offset for result in future.result()] == list(range(offset, offset + len(request)))
        offset += len(request)
    # entries are made of whole requests and within the bounds (a request alone may exceed them)
    taken = iter(requests)
    for entry in recorder.entries:
        parts: list[Sequence[MessageInput]] = []
        while sum(len(part) for part in parts) < len(entry):
            parts.append(next(taken))
        assert unstamped([m for part in parts for m in part]) == unstamped(entry)
        if len(parts) > 1:
            assert len(entry) <= messages_max
            assert sum(request_bytes(part) for part in parts) <= BYTES_MAX


def test_single_sends_fill_entries_up_to_the_message_bound() -> None:
    requests = [[message(n, body=b"x" * 10)] for n in range(30)]
    recorder, futures = run(requests)
    check(requests, recorder, futures)
    assert [len(entry) for entry in recorder.entries] == [8, 8, 8, 6]


def test_single_sends_are_cut_by_the_byte_bound_too() -> None:
    requests = [[message(n, body=b"x" * 300)] for n in range(20)]
    size = request_bytes(requests[0])
    per_entry = BYTES_MAX // size
    assert per_entry < 8
    recorder, futures = run(requests)
    check(requests, recorder, futures)
    assert [len(entry) for entry in recorder.entries] == [per_entry] * (20 // per_entry) + [20 % per_entry] * (
        20 % per_entry > 0)


def test_batch_sends_stay_whole_and_mix_with_single_sends() -> None:
    sizes = [1, 3, 1, 1, 5, 2, 1, 8, 1, 1, 1, 4, 9, 1, 2]
    number = 0
    requests: list[list[MessageInput]] = []
    for size in sizes:
        requests.append([message(number + i, body=b"y" * 40) for i in range(size)])
        number += size
    recorder, futures = run(requests)
    check(requests, recorder, futures)
    assert max(len(entry) for entry in recorder.entries) == 9  # the 9-message batch went alone


def test_a_few_waiting_sends_go_in_one_entry() -> None:
    requests = [[message(0)], [message(1), message(2)], [message(3)]]
    recorder, futures = run(requests)
    check(requests, recorder, futures)
    assert len(recorder.entries) == 1


def test_an_empty_send_is_refused_and_nothing_is_proposed() -> None:
    recorder = Recorder()
    committer = GroupCommitter(GroupCommitSettings(), recorder.propose, lambda: (True, None), entry_bytes_max=1 << 20)
    try:
        with pytest.raises(InvalidMessageError, match="no messages"):
            committer.submit([])
        assert committer.submit([message(7)]).result(timeout=30)[0].physical_offset == 0
    finally:
        committer.stop()
    assert [unstamped(entry) for entry in recorder.entries] == [unstamped([message(7)])]


def test_requests_let_go_of_their_messages_once_proposed() -> None:
    # the batcher frees what it gathered on its own thread; each caller still gets its own results
    requests = [[message(10 * n + i) for i in range(n % 3 + 1)] for n in range(12)]
    recorder, futures = run(requests)
    check(requests, recorder, futures)
    assert all(future.messages == () for future in futures)  # type: ignore[attr-defined]


def test_a_callback_given_with_the_send_runs_once_with_its_results_and_never_for_a_refused_send() -> None:
    recorder = Recorder()
    committer = GroupCommitter(GroupCommitSettings(pending_bytes_max=1 << 20), recorder.propose,
                               lambda: (True, None), entry_bytes_max=1 << 20)
    seen: list[tuple[int, ...]] = []
    done = threading.Event()

    def callback(future: AppendFuture[tuple[AppendResult, ...]]) -> None:
        seen.append(tuple(result.physical_offset for result in future.result()))
        if len(seen) == 3:
            done.set()

    try:
        committer.pause()  # all three wait, so they are answered by one entry
        futures = [committer.submit([message(0)], callback), committer.submit([message(1), message(2)], callback),
                   committer.submit([message(3)], callback)]
        with pytest.raises(InvalidMessageError):
            committer.submit([], callback)
        committer.resume()
        assert done.wait(30)
        later: list[AppendFuture[tuple[AppendResult, ...]]] = []
        futures[0].add_done_callback(later.append)  # already done: runs at once, on this thread
    finally:
        committer.stop()
    assert seen == [(0,), (1, 2), (3,)]
    assert later == [futures[0]]
    assert len(recorder.entries) == 1


class ApplyingThread:
    """A propose whose entries are applied on a thread of their own, as pysyncobj's tick thread applies them."""

    def __init__(self) -> None:
        self.recorder = Recorder()
        self.thread: threading.Thread | None = None

    def propose(self, data: bytes, callback: Callable[[ApplyResult | None, int], None], built: Command) -> None:
        self.thread = threading.Thread(target=self.recorder.propose, args=(data, callback, built), name="applying")
        self.thread.start()


@pytest.mark.parametrize(("inline_max", "sends", "completed_on"), [
    (512, 3, "applying"),  # the default: every entry is completed where it was applied
    (3, 3, "applying"),
    (2, 3, "group-commit-complete"),  # more sends than the bound: handed to the completion thread
    (0, 1, "group-commit-complete"),  # 0: always handed over
])
def test_an_entry_of_few_sends_is_completed_on_the_thread_that_applied_it(inline_max: int, sends: int,
                                                                           completed_on: str) -> None:
    applying = ApplyingThread()
    settings = GroupCommitSettings(complete_inline_requests_max=inline_max)
    assert GroupCommitSettings().complete_inline_requests_max == GroupCommitSettings().batch_messages_max
    committer = GroupCommitter(settings, applying.propose, lambda: (True, None), entry_bytes_max=1 << 20)
    threads: list[str] = []
    try:
        committer.pause()  # all of them wait, so that one entry answers them
        futures = [committer.submit([message(n)], lambda _: threads.append(threading.current_thread().name))
                   for n in range(sends)]
        committer.resume()
        offsets = [[result.physical_offset for result in future.result(timeout=30)] for future in futures]
    finally:
        committer.stop()  # joins the completion thread: whatever it was given is done
    assert applying.thread is not None
    applying.thread.join(timeout=30)  # whatever was completed where it was applied is done too
    assert offsets == [[n] for n in range(sends)]
    assert threads == [completed_on] * sends
    assert len(applying.recorder.entries) == 1
    assert (committer.stored_messages, committer.stored_bytes) == (sends, request_bytes(
        [m for entry in applying.recorder.entries for m in entry]))
