"""asyncio shell around the sans-IO codec: what every RocketMQ remoting connection does, whichever side
opened it.

Both ends of a remoting connection send requests: our client SDK sends SEND/PULL/..., and the broker sends
CHECK_TRANSACTION_STATE or NOTIFY_CONSUMER_IDS_CHANGED back over the same connection. So
:class:`RemotingConnection` holds framing, opaque allocation, responses matched by opaque and flow control
on writes for both: the client (:class:`protocol.client.RemotingClient`) and the server
(:mod:`broker.remoting.server`) build on it.

Requests this side sends get opaques from a per-connection counter; the peer's requests carry the
peer's own opaques. The two never mix: a frame's response bit says which map its opaque belongs to.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace
from typing import Final, cast

from protocol.codec import (
    FrameDecoder,
    FrameError,
    encode_frame,
    encode_json_request,
    encode_relayed,
    make_error_response,
)
from protocol.codes import ResponseCode, SerializeType, describe_request_code
from protocol.command import (
    INT32_MAX,
    ONEWAY_FLAG,
    RESPONSE_FLAG,
    RemotingCommand,
    make_request,
    make_response,
)
from protocol.limits import CodecLimits

logger = logging.getLogger(__name__)

#: what a request handler (server-initiated requests on a client) or a processor may return:
#: None means "send no answer" (a oneway call, whatever its flag says)
RequestHandler = Callable[[RemotingCommand], Awaitable[RemotingCommand | None]]

DEFAULT_REQUEST_TIMEOUT_SECONDS: Final = 3.0


# --------------------------------------------------------------------------------------------- errors


class RemotingError(Exception):
    """An operating error of a remoting connection (the peer is gone, slow, or broke the protocol)."""


class ConnectionClosedError(RemotingError, ConnectionError):
    """The connection closed (or was closed) before the operation could complete."""


class RemotingConnectError(RemotingError, ConnectionError):
    """Connecting failed or timed out."""


class RequestTimeoutError(RemotingError, TimeoutError):
    """No response arrived within the timeout. The peer may still have acted on the request."""


class _ResponseOverdue(TimeoutError):
    """What a request's waiter fails with at its deadline (:meth:`RemotingConnection.send_request` raises
    :class:`RequestTimeoutError`, naming the request, instead)."""


class TooManyPendingRequestsError(RemotingError):
    """``outbound_requests_max`` requests already wait for a response on this connection."""


class InvalidResponseError(RemotingError):
    """The peer answered with a frame the codec rejected (its opaque was readable, the rest was not)."""


# ----------------------------------------------------------------------------------- pending responses


class PendingResponses:
    """Opaques of the requests this side sent, and the futures waiting for their responses.

    Opaques count up from 0 and wrap at int32 max, skipping any still waiting: a long-lived connection
    never reuses an opaque whose response could still arrive.
    """

    __slots__ = ("_limit", "_next_opaque", "_waiters")

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"limit must be at least 1, got {limit}")
        self._limit = limit
        self._next_opaque = 0
        self._waiters: dict[int, asyncio.Future[RemotingCommand]] = {}

    def __len__(self) -> int:
        return len(self._waiters)

    def open(self, loop: asyncio.AbstractEventLoop) -> tuple[int, asyncio.Future[RemotingCommand]]:
        """A fresh opaque and the future its response will complete. Call :meth:`discard` when done."""
        if len(self._waiters) >= self._limit:
            raise TooManyPendingRequestsError(
                f"{len(self._waiters)} requests already wait for a response (outbound_requests_max={self._limit})"
            )
        opaque = self.take_opaque()
        waiter: asyncio.Future[RemotingCommand] = loop.create_future()
        self._waiters[opaque] = waiter
        return opaque, waiter

    def take_opaque(self) -> int:
        """The next opaque not waiting for a response, registering nothing (for oneway requests)."""
        while True:
            opaque = self._next_opaque
            self._next_opaque = 0 if opaque >= INT32_MAX else opaque + 1
            if opaque not in self._waiters:
                return opaque

    def resolve(self, response: RemotingCommand) -> bool:
        """Hand ``response`` to its waiter; False when nobody waits (timed out, or a stray opaque)."""
        waiter = self._waiters.pop(response.opaque, None)
        if waiter is None or waiter.done():
            return False
        waiter.set_result(response)
        return True

    def fail(self, opaque: int, error: BaseException) -> bool:
        waiter = self._waiters.pop(opaque, None)
        if waiter is None or waiter.done():
            return False
        _set_exception_quietly(waiter, error)
        return True

    def discard(self, opaque: int) -> None:
        self._waiters.pop(opaque, None)

    def fail_all(self, error: BaseException) -> None:
        waiters = list(self._waiters.values())
        self._waiters.clear()
        for waiter in waiters:
            if not waiter.done():
                _set_exception_quietly(waiter, error)


def _set_exception_quietly(waiter: asyncio.Future[RemotingCommand], error: BaseException) -> None:
    waiter.set_exception(error)
    # Mark it retrieved: a waiter whose task was cancelled in the same loop iteration would otherwise
    # log "exception was never retrieved"; an awaiting task still gets the exception raised.
    waiter.exception()


# ---------------------------------------------------------------------------------- frame connection


def format_address(address: object) -> tuple[str, int, str]:
    """(host, port, "host:port") from a socket address; IPv6 hosts are bracketed in the text form."""
    if isinstance(address, tuple) and len(address) >= 2:
        host, port = str(address[0]), int(address[1])
        text = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        return host, port, text
    return "", 0, str(address)


def check_timeout(timeout_seconds: float) -> None:
    if not (
        isinstance(timeout_seconds, int | float) and math.isfinite(timeout_seconds) and timeout_seconds > 0
    ):
        raise ValueError(f"timeout_seconds must be a positive finite number, got {timeout_seconds!r}")


class RemotingConnection(asyncio.Protocol):
    """One RemotingCommand stream over a transport: frames in through a :class:`FrameDecoder`, commands
    out through :func:`encode_frame`, and this side's requests matched to their responses by opaque.

    Subclasses decide what an incoming request means (:meth:`_on_request`). Reading can be paused for
    named reasons (:meth:`_pause_reading`); while any reason holds, frames already buffered stay in the
    decoder, and they are handled before the socket is read again.

    Writes of requests wait while the transport's write buffer is above its high-water mark, so a peer
    that does not read cannot make this side buffer without bound.
    """

    def __init__(self, *, codec_limits: CodecLimits, outbound_requests_max: int) -> None:
        self._loop = asyncio.get_running_loop()
        self._codec_limits = codec_limits
        self._decoder = FrameDecoder(codec_limits)
        self._pending = PendingResponses(outbound_requests_max)
        self._transport: asyncio.Transport | None = None
        self._closed = self._loop.create_future()
        self._is_closed = False
        self._writable = asyncio.Event()
        self._writable.set()
        self._read_pause_reasons: set[str] = set()
        self._resume_scheduled = False
        self._remote_host = ""
        self._remote_port = 0
        self._remote_address = "(not connected)"
        #: frames written this turn of the event loop, sent together at its end (one send for many answers)
        self._outgoing: list[bytes] = []
        self._flush_scheduled = False

    # ------------------------------------------------------------------------------ public, read-only

    @property
    def remote_address(self) -> str:
        """``"host:port"`` of the peer (``"[::1]:port"`` for IPv6), as RocketMQ writes addresses."""
        return self._remote_address

    @property
    def remote_host(self) -> str:
        return self._remote_host

    @property
    def remote_port(self) -> int:
        return self._remote_port

    @property
    def is_closed(self) -> bool:
        return self._is_closed

    @property
    def reading_paused(self) -> bool:
        return bool(self._read_pause_reasons)

    @property
    def pending_requests(self) -> int:
        """Requests this side sent that still wait for their response."""
        return len(self._pending)

    @property
    def buffered_bytes(self) -> int:
        """Bytes received and not yet handled (a partial frame, or whole frames held while paused)."""
        return self._decoder.buffered_bytes

    async def wait_closed(self) -> None:
        await asyncio.shield(self._closed)

    def close(self) -> None:
        """Close after writing what is buffered; idempotent."""
        self._flush_outgoing()
        if self._transport is not None:
            self._transport.close()

    def abort(self) -> None:
        """Close now, dropping anything not yet written; idempotent."""
        self._outgoing.clear()
        if self._transport is not None:
            self._transport.abort()

    # ----------------------------------------------------------------------------- requests this side

    async def send_request(
        self,
        code: int,
        ext_fields: Mapping[str, str] | None = None,
        body: bytes = b"",
        *,
        timeout_seconds: float = DEFAULT_REQUEST_TIMEOUT_SECONDS,
        remark: str | None = None,
        serialize_type: int = SerializeType.JSON,
    ) -> RemotingCommand:
        """Send a request and wait for its response (any response code: the caller interprets it).

        The timeout covers waiting for a writable transport as well as for the answer. Raises
        :class:`RequestTimeoutError`, :class:`ConnectionClosedError`, :class:`TooManyPendingRequestsError`,
        :class:`InvalidResponseError`, or :class:`~protocol.codec.EncodeError` for a request that
        cannot be framed.
        """
        check_timeout(timeout_seconds)
        self._raise_if_closed()
        loop = self._loop
        deadline = loop.time() + timeout_seconds
        opaque, waiter = self._pending.open(loop)
        expiry: asyncio.TimerHandle | None = None
        try:
            if not self._writable.is_set():
                async with asyncio.timeout_at(deadline):
                    await self._wait_writable()
            frame = None
            if remark is None and serialize_type == SerializeType.JSON:
                frame = encode_json_request(code, opaque, ext_fields, body, self._codec_limits)
            if frame is None:  # built and checked as a command: a field that cannot be sent is named
                self._write_command(
                    make_request(code, opaque, ext_fields, body, remark=remark, serialize_type=serialize_type)
                )
            else:
                self._write_frame(frame)
            # one timer that fails the waiter, not a timeout scope around the await: a scope costs a task
            # lookup, a timer and its bookkeeping on every request, a third of a pipelined client's work
            expiry = loop.call_at(deadline, self._expire, opaque)
            return await waiter
        except TimeoutError:
            raise RequestTimeoutError(
                f"no response to {describe_request_code(code)} (opaque {opaque}) from {self._remote_address} "
                f"within {timeout_seconds} s"
            ) from None
        finally:
            if expiry is not None:
                expiry.cancel()
            self._pending.discard(opaque)

    def _expire(self, opaque: int) -> None:
        self._pending.fail(opaque, _ResponseOverdue())

    async def send_oneway(
        self,
        code: int,
        ext_fields: Mapping[str, str] | None = None,
        body: bytes = b"",
        *,
        timeout_seconds: float = DEFAULT_REQUEST_TIMEOUT_SECONDS,
        remark: str | None = None,
        serialize_type: int = SerializeType.JSON,
    ) -> None:
        """Send a request with the oneway flag; the peer sends no answer. The timeout bounds only the wait
        for a writable transport. The opaque still comes from this connection's counter, as Java's does."""
        check_timeout(timeout_seconds)
        self._raise_if_closed()
        opaque = self._pending.take_opaque()
        try:
            async with asyncio.timeout(timeout_seconds):
                await self._wait_writable()
        except TimeoutError:
            raise RequestTimeoutError(
                f"{self._remote_address} did not read for {timeout_seconds} s: "
                f"oneway {describe_request_code(code)} not sent"
            ) from None
        self._write_command(
            make_request(
                code, opaque, ext_fields, body, remark=remark, oneway=True, serialize_type=serialize_type
            )
        )

    async def relay_request(
        self, request: RemotingCommand, *, timeout_seconds: float = DEFAULT_REQUEST_TIMEOUT_SECONDS
    ) -> RemotingCommand | None:
        """Send ``request`` as it is (code, flag, language, version, remark, fields, body, header form) under
        an opaque of this connection's own, and return the answer: None for a request with the oneway flag
        (the peer sends none). Raises as :meth:`send_request` does."""
        check_timeout(timeout_seconds)
        self._raise_if_closed()
        if request.is_oneway:
            opaque = self._pending.take_opaque()
            waiter = None
        else:
            opaque, waiter = self._pending.open(self._loop)
        try:
            async with asyncio.timeout(timeout_seconds):
                await self._wait_writable()
                self._write_command(replace(request, opaque=opaque))
                return None if waiter is None else await waiter
        except TimeoutError:
            raise RequestTimeoutError(
                f"no response to the relayed {describe_request_code(request.code)} (opaque {opaque}) from "
                f"{self._remote_address} within {timeout_seconds} s"
            ) from None
        finally:
            if waiter is not None:
                self._pending.discard(opaque)

    def relay_now(
        self,
        request: RemotingCommand,
        ext_fields: dict[str, str],
        timeout_seconds: float,
        then: Callable[[RemotingCommand | None, BaseException | None], None],
    ) -> bool:
        """:meth:`relay_request` without a coroutine, for a request that gets an answer, sent with
        ``ext_fields`` in place of its own: written now, then ``then(answer, None)`` or ``then(None, error)``
        is called once, on the loop (:class:`RequestTimeoutError`, :class:`ConnectionClosedError`, ...).
        False, with nothing sent and ``then`` never called, when it cannot go at once: a oneway request, a
        closed connection, a transport that is not writable, or too many requests waiting. A request that
        cannot be framed raises, as :meth:`relay_request` does."""
        check_timeout(timeout_seconds)
        if request.is_oneway or self._is_closed or not self._writable.is_set():
            return False
        loop = self._loop
        try:
            opaque, waiter = self._pending.open(loop)
        except TooManyPendingRequestsError:
            return False
        try:
            self._write_frame(encode_relayed(request, opaque, ext_fields, self._codec_limits))
        except BaseException:
            self._pending.discard(opaque)
            raise
        expiry = loop.call_at(loop.time() + timeout_seconds, self._expire, opaque)
        remote_address = self._remote_address

        def answered(done: asyncio.Future[RemotingCommand]) -> None:
            expiry.cancel()
            self._pending.discard(opaque)
            error = done.exception()
            if error is None:
                then(done.result(), None)
                return
            if isinstance(error, _ResponseOverdue):
                error = RequestTimeoutError(
                    f"no response to the relayed {describe_request_code(request.code)} (opaque {opaque}) from "
                    f"{remote_address} within {timeout_seconds} s")
            then(None, error)

        waiter.add_done_callback(answered)
        return True

    # ------------------------------------------------------------------------------- for subclasses

    def _on_request(self, request: RemotingCommand) -> None:
        """A request from the peer (never a response). Subclasses answer it, now or later."""
        raise NotImplementedError

    def _on_frame_received(self) -> None:
        """A whole frame (request, response or rejected frame) arrived: activity, for idle tracking."""

    def _on_frame_written(self) -> None:
        """A frame was handed to the transport."""

    def _on_write_paused(self) -> None:
        """The transport's write buffer went above its high-water mark."""

    def _on_write_resumed(self) -> None:
        """The transport's write buffer drained below its low-water mark."""

    def _on_connection_closed(self, error: Exception | None) -> None:
        """The transport is gone; waiters have already been failed."""

    def _write_command(self, command: RemotingCommand) -> None:
        """Frame and write ``command`` now. Raises ``EncodeError`` or :class:`ConnectionClosedError`."""
        self._write_frame(encode_frame(command, self._codec_limits))

    def _write_frame(self, frame: bytes) -> None:
        """Write ``frame`` now (with the others of this loop turn). Raises :class:`ConnectionClosedError`."""
        transport = self._transport
        if transport is None or transport.is_closing():
            raise ConnectionClosedError(f"connection to {self._remote_address} is closed")
        self._outgoing.append(frame)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush_outgoing)
        self._on_frame_written()

    def _flush_outgoing(self) -> None:
        """Hand the frames of this loop turn to the transport in one write (frame order is kept)."""
        self._flush_scheduled = False
        if not self._outgoing:
            return
        frames, self._outgoing = self._outgoing, []
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        transport.write(frames[0] if len(frames) == 1 else b"".join(frames))

    def _answer_frame_error(self, error: FrameError) -> None:
        """Answer a recoverable bad frame when its sender is listening (``make_error_response``)."""
        if error.flag is not None and error.flag & RESPONSE_FLAG:
            # A broken response: fail its waiter now rather than letting it time out.
            if error.opaque is not None:
                self._pending.fail(error.opaque, InvalidResponseError(f"bad response frame: {error.message}"))
            return
        if error.flag is not None and error.flag & ONEWAY_FLAG:
            return
        response = make_error_response(error)
        if response is None:
            return
        try:
            self._write_command(response)
        except (ConnectionClosedError, ValueError) as write_error:
            logger.debug("cannot answer a bad frame from %s: %s", self._remote_address, write_error)

    def _answer(self, request: RemotingCommand, response: RemotingCommand | None) -> None:
        """Write ``response`` to ``request``, unless it is None or the request carried the oneway flag.

        The response is made to echo the request's opaque and header form whatever the handler set:
        those belong to the connection, not to the handler.
        """
        if response is None or request.is_oneway:
            return
        opaque = None  # the response's own
        if (
            response.opaque != request.opaque
            or response.serialize_type != request.serialize_type
            or not response.is_response
        ):
            if (response.serialize_type == request.serialize_type and response.is_response
                    and not response.flag & ONEWAY_FLAG):
                opaque = request.opaque  # only the opaque differs (a relayed answer): framed under it at once
            else:
                response = RemotingCommand(
                    code=response.code,
                    opaque=request.opaque,
                    flag=(response.flag | RESPONSE_FLAG) & ~ONEWAY_FLAG,
                    language=response.language,
                    version=response.version,
                    remark=response.remark,
                    ext_fields=response.ext_fields,
                    body=response.body,
                    serialize_type=request.serialize_type,
                )
        if self._is_closed:
            logger.debug(
                "dropping the answer to %s (opaque %d): %s is closed",
                describe_request_code(request.code),
                request.opaque,
                self._remote_address,
            )
            return
        try:
            if opaque is None:
                self._write_command(response)
            else:
                self._write_frame(encode_relayed(response, opaque, None, self._codec_limits))
        except ConnectionClosedError:
            return
        except ValueError as error:  # EncodeError: too large for a frame, or unwritable text
            logger.error(
                "answer to %s (opaque %d) for %s cannot be encoded: %s",
                describe_request_code(request.code),
                request.opaque,
                self._remote_address,
                error,
            )
            fallback = make_response(
                request, ResponseCode.SYSTEM_ERROR, f"the response could not be encoded: {error}"
            )
            try:
                self._write_command(fallback)
            except (ConnectionClosedError, ValueError):
                self.abort()

    def _answer_frame(self, request: RemotingCommand, frame: bytes) -> None:
        """:meth:`_answer` with the response already framed (``codec.encode_json_answer``, from the
        request's opaque and in its header form)."""
        if request.is_oneway or self._is_closed:
            return
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        self._outgoing.append(frame)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush_outgoing)
        self._on_frame_written()

    def _pause_reading(self, reason: str) -> None:
        if not self._read_pause_reasons and self._transport is not None:
            self._transport.pause_reading()
        self._read_pause_reasons.add(reason)

    def _resume_reading(self, reason: str) -> None:
        if reason not in self._read_pause_reasons:
            return
        self._read_pause_reasons.discard(reason)
        if not self._read_pause_reasons and not self._resume_scheduled:
            # Not inline: this may run inside a transport callback or a processor's answer path.
            self._resume_scheduled = True
            self._loop.call_soon(self._resume_now)

    async def _wait_writable(self) -> None:
        while not self._writable.is_set():
            await self._writable.wait()
        self._raise_if_closed()

    def _raise_if_closed(self) -> None:
        if self._is_closed or self._transport is None or self._transport.is_closing():
            raise ConnectionClosedError(f"connection to {self._remote_address} is closed")

    # ------------------------------------------------------------------------- transport callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's stream transports are not asyncio.Transport subclasses: what a stream offers is checked
        if not callable(getattr(transport, "write", None)) or not callable(getattr(transport, "pause_reading", None)):
            raise TypeError(f"a stream transport is required, got {type(transport).__name__}")
        self._transport = cast(asyncio.Transport, transport)
        self._remote_host, self._remote_port, self._remote_address = format_address(
            transport.get_extra_info("peername")
        )

    def data_received(self, data: bytes) -> None:
        if self._is_closed:
            return
        # Reading is only resumed once the decoder was drained, so this never exceeds one chunk
        # beyond a partial frame (the decoder's DecoderUsageError cannot fire).
        self._decoder.feed(data)
        self._drain_frames()

    def eof_received(self) -> bool | None:
        # The peer is done sending; half-open connections are not useful in this protocol.
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self._is_closed = True
        self._writable.set()  # wake writers: they find the connection closed
        reason = f": {exc}" if exc is not None else ""
        self._pending.fail_all(ConnectionClosedError(f"connection to {self._remote_address} closed{reason}"))
        if not self._closed.done():
            self._closed.set_result(None)
        self._on_connection_closed(exc)

    def pause_writing(self) -> None:
        self._writable.clear()
        self._on_write_paused()

    def resume_writing(self) -> None:
        self._writable.set()
        self._on_write_resumed()

    # ------------------------------------------------------------------------------------- internal

    def _resume_now(self) -> None:
        self._resume_scheduled = False
        if self._read_pause_reasons or self._is_closed:
            return
        self._drain_frames()  # frames that arrived before the pause come first
        if not self._read_pause_reasons and self._transport is not None and not self._transport.is_closing():
            self._transport.resume_reading()

    def _drain_frames(self) -> None:
        while not self._read_pause_reasons and not self._is_closed:
            transport = self._transport
            if transport is None or transport.is_closing():
                return
            try:
                command = self._decoder.next_frame()
            except FrameError as error:
                if error.fatal:
                    logger.warning(
                        "closing %s: the stream cannot be resynchronised: %s", self._remote_address, error
                    )
                    transport.abort()
                    return
                logger.info("bad frame from %s: %s", self._remote_address, error)
                self._on_frame_received()
                self._answer_frame_error(error)
                continue
            if command is None:
                return
            self._on_frame_received()
            if command.is_response:
                if not self._pending.resolve(command):
                    logger.debug(
                        "response with opaque %d from %s matches no waiting request (timed out?)",
                        command.opaque,
                        self._remote_address,
                    )
            else:
                self._on_request(command)
