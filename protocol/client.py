"""The small client our SDK, tools and tests use: one :class:`RemotingConnection` to a broker or a name
server, with the requests that server sends back (CHECK_TRANSACTION_STATE, NOTIFY_CONSUMER_IDS_CHANGED, ...)
handed to a request handler under a bound."""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields

from protocol.codes import ResponseCode, SerializeType, describe_request_code
from protocol.command import RemotingCommand, make_response
from protocol.connection import (
    DEFAULT_REQUEST_TIMEOUT_SECONDS,
    RemotingConnectError,
    RemotingConnection,
    RequestHandler,
    check_timeout,
)
from protocol.limits import DEFAULT_LIMITS, CodecLimits

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ClientLimits:
    """Limits of one client connection.

    ``outbound_requests_max``: requests waiting for a response at once (a full table fails fast with
    :class:`TooManyPendingRequestsError`). ``incoming_requests_max``: server-initiated requests being
    handled at once; more are answered SYSTEM_BUSY (pausing reads instead would also hold back the
    responses to our own requests).
    """

    outbound_requests_max: int = 65_536
    incoming_requests_max: int = 64
    write_buffer_high_water_bytes: int = 4 * 1024 * 1024
    write_buffer_low_water_bytes: int = 1024 * 1024
    codec: CodecLimits = DEFAULT_LIMITS

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        for limit in fields(self):
            value = getattr(self, limit.name)
            if limit.name == "codec":
                if not isinstance(value, CodecLimits):
                    raise ValueError(f"codec must be a CodecLimits, got {type(value).__name__}")
                value.validate()
                continue
            if type(value) is not int or value < 1:
                raise ValueError(f"{limit.name} must be a positive int, got {value!r}")
        if self.write_buffer_low_water_bytes > self.write_buffer_high_water_bytes:
            raise ValueError(
                f"write_buffer_low_water_bytes ({self.write_buffer_low_water_bytes}) cannot exceed "
                f"write_buffer_high_water_bytes ({self.write_buffer_high_water_bytes})"
            )


class _ClientConnection(RemotingConnection):
    def __init__(self, limits: ClientLimits, request_handler: RequestHandler | None) -> None:
        super().__init__(codec_limits=limits.codec, outbound_requests_max=limits.outbound_requests_max)
        self._limits = limits
        self._request_handler = request_handler
        self._handler_tasks: set[asyncio.Task[None]] = set()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        if self._transport is not None:
            self._transport.set_write_buffer_limits(
                high=self._limits.write_buffer_high_water_bytes, low=self._limits.write_buffer_low_water_bytes
            )

    def _on_request(self, request: RemotingCommand) -> None:
        if self._request_handler is None:
            self._answer(
                request,
                make_response(
                    request,
                    ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
                    f"this client handles no requests ({describe_request_code(request.code)})",
                ),
            )
            return
        if len(self._handler_tasks) >= self._limits.incoming_requests_max:
            self._answer(
                request,
                make_response(
                    request,
                    ResponseCode.SYSTEM_BUSY,
                    f"[OVERLOAD] client busy: {len(self._handler_tasks)} requests being handled",
                ),
            )
            return
        task = self._loop.create_task(self._handle(self._request_handler, request))
        self._handler_tasks.add(task)
        task.add_done_callback(self._handler_tasks.discard)

    async def _handle(self, handler: RequestHandler, request: RemotingCommand) -> None:
        try:
            response = await handler(request)
        except Exception as error:  # an operating error of the handler: the server hears about it
            logger.exception(
                "handler for %s from %s failed", describe_request_code(request.code), self.remote_address
            )
            response = make_response(request, ResponseCode.SYSTEM_ERROR, f"{type(error).__name__}: {error}")
        self._answer(request, response)

    def cancel_handlers(self) -> None:
        for task in list(self._handler_tasks):
            task.cancel()


class RemotingClient:
    """One connection to a RocketMQ remoting server (a broker or a name server).

    ``request_handler`` receives the requests the server initiates (CHECK_TRANSACTION_STATE,
    NOTIFY_CONSUMER_IDS_CHANGED, GET_CONSUMER_RUNNING_INFO); its return value is the answer, None for
    no answer. Without a handler such requests are answered REQUEST_CODE_NOT_SUPPORTED.
    """

    def __init__(self, connection: _ClientConnection) -> None:
        # Use connect(): a client wraps a connected protocol.
        self._connection = connection

    @classmethod
    async def connect(
        cls,
        host: str,
        port: int,
        *,
        limits: ClientLimits | None = None,
        request_handler: RequestHandler | None = None,
        connect_timeout_seconds: float = 3.0,
        ssl_context: ssl.SSLContext | None = None,
    ) -> RemotingClient:
        """Connect (with TLS when ``ssl_context`` is given: the host is the name its certificate must
        carry; the handshake counts against the connect timeout)."""
        check_timeout(connect_timeout_seconds)
        client_limits = ClientLimits() if limits is None else limits
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(connect_timeout_seconds):
                _, connection = await loop.create_connection(
                    lambda: _ClientConnection(client_limits, request_handler), host, port, ssl=ssl_context
                )
        except TimeoutError:
            raise RemotingConnectError(
                f"connecting to {host}:{port} timed out after {connect_timeout_seconds} s"
            ) from None
        except OSError as error:
            raise RemotingConnectError(f"cannot connect to {host}:{port}: {error}") from error
        return cls(connection)

    @property
    def remote_address(self) -> str:
        return self._connection.remote_address

    @property
    def is_closed(self) -> bool:
        return self._connection.is_closed

    @property
    def pending_requests(self) -> int:
        return self._connection.pending_requests

    async def request(
        self,
        code: int,
        ext_fields: Mapping[str, str] | None = None,
        body: bytes = b"",
        *,
        timeout_seconds: float = DEFAULT_REQUEST_TIMEOUT_SECONDS,
        remark: str | None = None,
        serialize_type: int = SerializeType.JSON,
    ) -> RemotingCommand:
        """Send a request and return its response; see :meth:`RemotingConnection.send_request`."""
        return await self._connection.send_request(
            code,
            ext_fields,
            body,
            timeout_seconds=timeout_seconds,
            remark=remark,
            serialize_type=serialize_type,
        )

    async def oneway(
        self,
        code: int,
        ext_fields: Mapping[str, str] | None = None,
        body: bytes = b"",
        *,
        timeout_seconds: float = DEFAULT_REQUEST_TIMEOUT_SECONDS,
        remark: str | None = None,
        serialize_type: int = SerializeType.JSON,
    ) -> None:
        """Send a request with the oneway flag; nothing is awaited but a writable transport."""
        await self._connection.send_oneway(
            code,
            ext_fields,
            body,
            timeout_seconds=timeout_seconds,
            remark=remark,
            serialize_type=serialize_type,
        )

    async def relay(
        self, request: RemotingCommand, *, timeout_seconds: float = DEFAULT_REQUEST_TIMEOUT_SECONDS
    ) -> RemotingCommand | None:
        """Send a request received elsewhere as it is; see :meth:`RemotingConnection.relay_request`."""
        return await self._connection.relay_request(request, timeout_seconds=timeout_seconds)

    def relay_now(self, request: RemotingCommand, ext_fields: dict[str, str], timeout_seconds: float,
                  then: Callable[[RemotingCommand | None, BaseException | None], None]) -> bool:
        """Send a request received elsewhere, with ``ext_fields``, without a coroutine; see
        :meth:`RemotingConnection.relay_now`."""
        return self._connection.relay_now(request, ext_fields, timeout_seconds, then)

    async def close(self, timeout_seconds: float = 3.0) -> None:
        """Close the connection after buffered writes and wait until it is closed; a server that does
        not read them within ``timeout_seconds`` gets the connection aborted. Requests still waiting
        fail with :class:`ConnectionClosedError`; handlers of server requests are cancelled."""
        check_timeout(timeout_seconds)
        self._connection.cancel_handlers()
        self._connection.close()
        try:
            async with asyncio.timeout(timeout_seconds):
                await self._connection.wait_closed()
        except TimeoutError:
            self._connection.abort()
            await self._connection.wait_closed()

    async def wait_closed(self) -> None:
        """Return once the connection is closed, by either side."""
        await self._connection.wait_closed()

    async def __aenter__(self) -> RemotingClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()
