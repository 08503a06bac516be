"""The shared test support: the waits every test uses."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator

import pytest

from tests.support.waiting import poll_until, wait_for


def test_wait_for_returns_the_first_truthy_value() -> None:
    answers: Iterator[object] = iter([None, 0, [], False, "found"])
    assert wait_for(lambda: next(answers), "an answer", timeout_seconds=5.0, interval_seconds=0.0) == "found"


def test_wait_for_names_what_it_waited_for_and_explains_at_the_deadline() -> None:
    polls = itertools.count()
    expected = r"timed out after 0\.05 s waiting for the impossible\nlog tail"
    with pytest.raises(AssertionError, match=expected) as raised:
        wait_for(lambda: next(polls) < 0, "the impossible", timeout_seconds=0.05, interval_seconds=0.01,
                 explain=lambda: "log tail")
    assert "the impossible" in str(raised.value)
    assert next(polls) >= 2  # polled until the deadline, and once after it



def test_poll_until_lets_the_loop_run_what_it_waits_for_and_fails_at_the_deadline() -> None:
    async def scenario() -> None:
        done: list[int] = []
        asyncio.get_running_loop().call_later(0.02, done.append, 1)
        await poll_until(lambda: done, "the callback", timeout_seconds=5.0)
        with pytest.raises(AssertionError, match=r"timed out after 0\.05 s waiting for never"):
            await poll_until(lambda: False, "never", timeout_seconds=0.05)

    asyncio.run(scenario())
