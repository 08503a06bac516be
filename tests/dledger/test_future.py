"""The append future: completion, callbacks on either side of completion, waiting across threads."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable

import pytest

from dledger.future import AppendFuture, InvalidStateError, set_results


def test_callbacks_added_before_and_after_completion_each_run_once() -> None:
    future: AppendFuture[int] = AppendFuture()
    seen: list[tuple[str, int]] = []
    future.add_done_callback(lambda f: seen.append(("before", f.result())))
    assert not future.done()
    future.set_result(7)
    future.add_done_callback(lambda f: seen.append(("after", f.result())))
    assert future.done() and future.result() == 7 and future.exception() is None
    assert seen == [("before", 7), ("after", 7)]


def test_an_error_is_raised_by_result_and_returned_by_exception() -> None:
    future: AppendFuture[int] = AppendFuture()
    error = ValueError("no")
    future.set_exception(error)
    assert future.exception() is error
    with pytest.raises(ValueError, match="no"):
        future.result()


def test_completing_twice_is_refused_and_keeps_the_first_outcome() -> None:
    future: AppendFuture[int] = AppendFuture()
    future.set_result(1)
    with pytest.raises(InvalidStateError):
        future.set_result(2)
    with pytest.raises(InvalidStateError):
        future.set_exception(ValueError())
    assert future.result() == 1


def test_result_times_out_while_pending() -> None:
    future: AppendFuture[int] = AppendFuture()
    with pytest.raises(TimeoutError):
        future.result(timeout=0.01)
    with pytest.raises(TimeoutError):
        future.exception(timeout=0.0)


def test_a_waiter_on_another_thread_wakes_with_the_result() -> None:
    future: AppendFuture[str] = AppendFuture()
    results: list[str] = []
    waiting = threading.Event()

    def wait() -> None:
        waiting.set()
        results.append(future.result(timeout=30))

    thread = threading.Thread(target=wait)
    thread.start()
    assert waiting.wait(30)
    future.set_result("done")
    thread.join(30)
    assert results == ["done"]


def test_a_failing_callback_is_logged_and_the_others_still_run(caplog: pytest.LogCaptureFixture) -> None:
    future: AppendFuture[int] = AppendFuture()
    seen: list[int] = []

    def broken(_: AppendFuture[int]) -> None:
        raise RuntimeError("callback bug")

    future.add_done_callback(broken)
    future.add_done_callback(lambda f: seen.append(f.result()))
    future.set_result(3)
    assert seen == [3]
    assert "callback failed" in caplog.text


def test_many_threads_adding_callbacks_while_it_completes_all_run_exactly_once() -> None:
    for _ in range(50):
        future: AppendFuture[int] = AppendFuture()
        calls: list[list[int]] = [[] for _ in range(8)]  # list.append is atomic: no lost counts
        start = threading.Barrier(9)

        def add(slot: int, target: AppendFuture[int], hits: list[int], barrier: threading.Barrier) -> None:
            barrier.wait()
            for _ in range(20):
                target.add_done_callback(lambda _f: hits.append(1))

        threads = [threading.Thread(target=add, args=(slot, future, calls[slot], start)) for slot in range(8)]
        for thread in threads:
            thread.start()
        start.wait()
        future.set_result(0)
        for thread in threads:
            thread.join(30)
        assert [len(hits) for hits in calls] == [20] * 8


def test_set_results_completes_all_in_order_or_none() -> None:
    futures: list[AppendFuture[int]] = [AppendFuture() for _ in range(3)]
    seen: list[tuple[int, int]] = []
    def recorder(number: int) -> Callable[[AppendFuture[int]], None]:
        return lambda done: seen.append((number, done.result()))

    for number, future in enumerate(futures):
        future.add_done_callback(recorder(number))
    waiter = threading.Thread(target=futures[2].result)
    waiter.start()
    set_results(futures, [10, 11, 12])
    waiter.join(timeout=10)
    assert not waiter.is_alive() and seen == [(0, 10), (1, 11), (2, 12)]
    fresh: AppendFuture[int] = AppendFuture()
    with pytest.raises(InvalidStateError):
        set_results([fresh, futures[0]], [1, 2])  # one is done: none is set
    assert not fresh.done() and futures[0].result() == 10


def test_set_results_logs_a_failing_callback_and_runs_the_rest(caplog: pytest.LogCaptureFixture) -> None:
    futures: list[AppendFuture[int]] = [AppendFuture() for _ in range(2)]
    seen: list[int] = []

    def broken(_: AppendFuture[int]) -> None:
        raise RuntimeError("callback bug")

    futures[0].add_done_callback(broken)
    futures[0].add_done_callback(lambda f: seen.append(f.result()))
    futures[1].add_done_callback(lambda f: seen.append(f.result()))
    set_results(futures, [5, 6])
    assert seen == [5, 6]
    assert "callback failed" in caplog.text


def test_one_two_and_three_callbacks_run_in_the_order_added() -> None:
    # one callback is kept as is, more in a list: either way each runs once, in order, on both completions
    for count in (1, 2, 3):
        for complete in ("set_result", "set_results"):
            future: AppendFuture[int] = AppendFuture()
            seen: list[int] = []
            for number in range(count):
                future.add_done_callback(functools.partial(lambda number, _f, into: into.append(number),
                                                           number, into=seen))
            if complete == "set_result":
                future.set_result(1)
            else:
                set_results([future], [1])
            assert seen == list(range(count)), (count, complete)
            future.add_done_callback(functools.partial(lambda _f, into: into.append(-1), into=seen))  # at once
            assert seen == [*range(count), -1]


def test_set_results_with_fewer_values_than_futures_sets_nothing() -> None:
    futures: list[AppendFuture[int]] = [AppendFuture() for _ in range(3)]
    with pytest.raises(ValueError, match="3 futures, 2 values"):
        set_results(futures, [1, 2])
    assert not any(future.done() for future in futures)
