"""The event loop the broker and the client run on: uvloop's (libuv: less CPU per request and per timer)
where it can be imported, asyncio's own otherwise. (Stream transports of uvloop are not asyncio.Transport
subclasses: code that needs a stream checks what it offers, not its class.)"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def new_event_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def run(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run`` on :func:`new_event_loop`'s loop."""
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        return runner.run(main)
