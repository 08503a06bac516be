"""A lightweight future for appends: one per send on the leader's hot path.

``concurrent.futures.Future`` builds a ``threading.Condition`` (and its ``RLock``) per instance and takes
it on every call; with one future per send that was a large share of the leader's CPU. :class:`AppendFuture`
has the part of its interface that appends need (``done``, ``result``, ``exception``, ``add_done_callback``,
``set_result``, ``set_exception``), shares one module lock for its short critical sections and creates an
``Event`` only for a caller that actually blocks in ``result``/``exception`` before it is done.

Callbacks run on the thread that completes the future (or at once, on the caller's thread, when it is
already done), like ``concurrent.futures``; an exception from a callback is logged, never propagated.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Final, Generic, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")

_LOCK = threading.Lock()
#: the value of a future not done yet
PENDING: Final = object()


class InvalidStateError(RuntimeError):
    """The future was completed twice."""


#: a future's callbacks: none, the one callback (the common case: no list per send), or several in order
Callbacks = Callable[["AppendFuture[T]"], object] | list[Callable[["AppendFuture[T]"], object]] | None


def set_results(futures: Sequence[AppendFuture[T]], values: Sequence[T]) -> None:
    """``set_result`` for many futures at once (a group commit's callers): the module lock is taken once,
    then each future's callbacks run, in order. Nothing is set if any of them is already done."""
    if len(futures) != len(values):
        raise ValueError(f"{len(futures)} futures, {len(values)} values")
    with _LOCK:
        if any(future._value is not PENDING for future in futures):
            raise InvalidStateError("a future is already done")
        for future, value in zip(futures, values, strict=True):
            future._value = value
    # Done, so nobody else touches their callbacks or events any more: add_done_callback and result() look
    # at the value under the lock and act on their own. Read here, outside it, without a tuple per future.
    for future in futures:
        event = future._event
        if event is not None:
            event.set()
        callbacks = future._callbacks
        if callbacks is not None:
            future._callbacks = None
            if type(callbacks) is list:
                for callback in callbacks:
                    future._run(callback)
            else:
                try:  # as _run, inlined: one call less per send
                    callbacks(future)  # type: ignore[operator]  # not a list: the one callback
                except Exception:
                    log.exception("an append future's callback failed")


class AppendFuture(Generic[T]):
    __slots__ = ("_callbacks", "_error", "_event", "_value")

    def __init__(self) -> None:
        self._value: object = PENDING
        self._error: BaseException | None = None
        self._callbacks: Callbacks[T] = None
        self._event: threading.Event | None = None

    def done(self) -> bool:
        return self._value is not PENDING

    def _wait(self, timeout: float | None) -> None:
        if self._value is not PENDING:
            return
        with _LOCK:
            if self._value is not PENDING:
                return
            if self._event is None:
                self._event = threading.Event()
            event = self._event
        if not event.wait(timeout):
            raise TimeoutError(f"not done within {timeout} s")

    def result(self, timeout: float | None = None) -> T:
        """The result, waiting up to ``timeout`` seconds (``TimeoutError``); raises the future's error."""
        self._wait(timeout)
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]  # set by set_result: a T

    def exception(self, timeout: float | None = None) -> BaseException | None:
        self._wait(timeout)
        return self._error

    def add_done_callback(self, callback: Callable[[AppendFuture[T]], object]) -> None:
        if self._value is PENDING:
            with _LOCK:
                if self._value is PENDING:
                    callbacks = self._callbacks
                    if callbacks is None:
                        self._callbacks = callback
                    elif type(callbacks) is list:
                        callbacks.append(callback)
                    else:
                        self._callbacks = [callbacks, callback]  # type: ignore[list-item]  # the one callback
                    return
        self._run(callback)

    def set_result(self, value: T) -> None:
        self._complete(value, None)

    def set_exception(self, error: BaseException) -> None:
        self._complete(None, error)

    def _complete(self, value: object, error: BaseException | None) -> None:
        with _LOCK:
            if self._value is not PENDING:
                raise InvalidStateError("the future is already done")
            self._error = error
            self._value = value
            callbacks, self._callbacks = self._callbacks, None
            event = self._event
        if event is not None:
            event.set()
        if type(callbacks) is list:
            for callback in callbacks:
                self._run(callback)
        elif callbacks is not None:
            self._run(callbacks)  # type: ignore[arg-type]  # not a list: the one callback

    def _run(self, callback: Callable[[AppendFuture[T]], object]) -> None:
        try:
            callback(self)
        except Exception:
            log.exception("an append future's callback failed")
