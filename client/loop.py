"""The background event loop behind the synchronous facade (:mod:`client.sync`).

:class:`EventLoopThread` is the only moving part; every sync class (``Producer``, ``PushConsumer``,
``Admin``, ...) owns one and forwards each call into it with ``run`` (wait for the result) or
``submit`` (a ``concurrent.futures.Future``). Callbacks a user passes (listeners, transaction
executors) run in worker threads, never on the loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from protocol.event_loop import new_event_loop

T = TypeVar("T")


class EventLoopThread:
    """A daemon thread running one event loop until :meth:`stop`."""

    def __init__(self, name: str = "raftmq-client") -> None:
        self._loop = new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run_loop, name=name, daemon=True)
        self._thread.start()
        self._ready.wait()
        self._stopped = False

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def _run_loop(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.call_soon(self._ready.set)
        self._loop.run_forever()

    def submit(self, coroutine: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Schedule ``coroutine`` on the loop; its result arrives in the returned future."""
        if self._stopped:
            coroutine.close()
            raise RuntimeError("the client's event loop was stopped")
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop)

    def run(self, coroutine: Coroutine[Any, Any, T], timeout_seconds: float | None = None) -> T:
        """Run ``coroutine`` on the loop and wait for its result (its exception is raised here). At
        the timeout the coroutine is cancelled and ``TimeoutError`` raised."""
        if threading.current_thread() is self._thread:
            coroutine.close()
            raise RuntimeError("a sync client method was called from its own event loop: use the async API")
        future = self.submit(coroutine)
        try:
            return future.result(timeout_seconds)
        except concurrent.futures.TimeoutError:  # (the builtin TimeoutError, since Python 3.11)
            if future.done():
                # the coroutine's own error, e.g. the client's RequestTimeoutError (an MQClientError and a
                # TimeoutError): raised as it is, not taken for this wait's timeout
                raise
            future.cancel()
            raise TimeoutError(f"no result within {timeout_seconds} s") from None

    def call(self, function: Callable[[], T]) -> T:
        """Run a plain function on the loop thread (to touch loop-owned state safely)."""

        async def invoke() -> T:
            return function()

        return self.run(invoke())

    def stop(self, timeout_seconds: float = 10.0) -> None:
        """Cancel what still runs, stop the loop and join the thread; idempotent."""
        if self._stopped:
            return
        self._stopped = True

        async def cancel_rest() -> None:
            current = asyncio.current_task()
            tasks = [task for task in asyncio.all_tasks() if task is not current]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        if self._loop.is_running():
            with contextlib.suppress(concurrent.futures.TimeoutError, RuntimeError):
                asyncio.run_coroutine_threadsafe(cancel_rest(), self._loop).result(timeout_seconds)
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout_seconds)
        if not self._thread.is_alive():
            self._loop.close()


async def call_in_thread(function: Callable[..., T], *arguments: object) -> T:
    """Run a blocking user callback in the default thread pool."""
    return await asyncio.get_running_loop().run_in_executor(None, function, *arguments)


async def maybe_await(value: T | Awaitable[T]) -> T:
    if isinstance(value, Awaitable):
        return await value
    return value
