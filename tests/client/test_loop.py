"""The synchronous facade's event loop thread: what a coroutine raises reaches the caller as it is."""

from __future__ import annotations

import asyncio

import pytest

from client.errors import MQClientError, RequestTimeoutError
from client.loop import EventLoopThread


async def times_out() -> None:
    raise RequestTimeoutError("no response to SEND_MESSAGE_V2 within 3.0 s", "127.0.0.1:10911")


async def sleeps() -> None:
    await asyncio.sleep(60)


def test_a_request_timeout_of_the_client_is_raised_as_the_client_error_it_is() -> None:
    """RequestTimeoutError is a TimeoutError too: the facade took it for its own wait's timeout and raised a
    bare "no result within None s" instead of the MQClientError callers catch."""
    loop = EventLoopThread("test-loop")
    try:
        with pytest.raises(MQClientError) as raised:
            loop.run(times_out())
        assert isinstance(raised.value, RequestTimeoutError) and "SEND_MESSAGE_V2" in str(raised.value)
    finally:
        loop.stop()


def test_the_facades_own_timeout_cancels_the_coroutine() -> None:
    loop = EventLoopThread("test-loop")
    try:
        with pytest.raises(TimeoutError, match=r"no result within 0\.05 s") as raised:
            loop.run(sleeps(), timeout_seconds=0.05)
        assert not isinstance(raised.value, MQClientError)
    finally:
        loop.stop()
