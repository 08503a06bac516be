"""asyncio TCP server around the sans-IO codec: connections in, request processors out.

Each connection owns one :class:`~protocol.codec.FrameDecoder`. A request goes to the processor
registered for its code through that processor's bounded queue, served by a fixed number of worker
tasks (RocketMQ's ``registerProcessor(code, processor, executor)``). The rules every request follows:

- unknown code: REQUEST_CODE_NOT_SUPPORTED (3), at once;
- the optional ``authorizer`` (access control, request limits) refuses it: its answer, at once, before
  the request is queued, so no processor sees it;
- the processor's queue is full: SYSTEM_BUSY (2), at once (RocketMQ's ``[OVERLOAD]`` flow control);
- the processor raises: SYSTEM_ERROR (1) with a remark naming the error; the traceback goes to the log,
  never to the wire. A broken invariant (``InvariantError``) stops the whole server instead;
- the processor returns None: no answer (stock C++ clients send some oneway calls without the oneway
  flag, so processors decide, not the flag);
- a route may also have a synchronous way in (``fast``, :data:`FastPath`): while nothing of the route
  waits in its queue, the request is handed to it straight from the read callback, with no queue, worker
  task or coroutine, and it answers through a callback. What it declines goes to the queue as above; the
  other rules (refusals, errors, the in-flight limit, a graceful stop) hold for it the same way;
- a request with the oneway flag (2) gets no answer at all, whatever happens to it;
- an answer echoes the request's opaque and header form (JSON or ROCKETMQ binary).

Bad frames: a fatal :class:`~protocol.codec.FrameError` (the stream cannot be resynchronised)
aborts the connection; a recoverable one is answered with ``make_error_response`` when the sender is
listening, and decoding goes on with the next frame.

Limits (:class:`ServerLimits`): connections beyond ``connections_max`` are closed at once; a
connection with ``in_flight_requests_max`` requests in progress is not read until one finishes
(back-pressure through TCP, not an error); a connection whose write buffer passes the high-water mark
is not read until the client catches up; a connection idle for ``idle_timeout_seconds`` (no whole
frame either way and nothing in progress: slow-loris and half-open peers) is aborted.

TLS (optional, ``ssl_context``): the handshake must finish within the idle timeout (at most 60 s), and
a connection counts against ``connections_max`` only once it did.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import math
import ssl
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, fields
from typing import Final, Protocol

from broker.remoting.proxy_protocol import ProxyHeaderError, parse_header
from protocol.codes import ResponseCode, describe_request_code
from protocol.command import RemotingCommand, make_response
from protocol.connection import RemotingConnection, format_address
from protocol.invariant import InvariantError
from protocol.limits import DEFAULT_LIMITS, CodecLimits

logger = logging.getLogger(__name__)

_PORT_MAX: Final = 65_535
#: pause reasons, named for logs and tests
PAUSED_FOR_IN_FLIGHT: Final = "in-flight requests at limit"
PAUSED_FOR_WRITE_BUFFER: Final = "write buffer above high-water mark"
PAUSED_FOR_STOP: Final = "server stopping"


# ---------------------------------------------------------------------------------------------- limits


@dataclass(frozen=True, slots=True)
class ServerLimits:
    """What one server lets its peers make it hold: a named limit on each, so nothing grows without bound.

    - ``connections_max``: open connections; one more is closed as soon as it is accepted.
    - ``in_flight_requests_max``: requests of one connection queued or being processed; at the limit
      the connection is not read until one finishes. A processor that awaits an answer from the *same*
      connection while it is at the limit waits for that answer until another request finishes.
    - ``outbound_requests_max``: server-initiated requests on one connection waiting for an answer.
    - ``idle_timeout_seconds``: a connection with no whole frame received or written and nothing in
      progress for this long is aborted (RocketMQ: 120 s; clients heartbeat every 30 s). A partial
      frame is not activity, so a peer that trickles bytes is closed too.
    - ``write_buffer_high_water_bytes`` / ``write_buffer_low_water_bytes``: above high, the connection
      is not read until its unsent answers drain below low.
    - ``codec``: the frame limits of every connection's decoder and encoder.
    """

    connections_max: int = 1024
    in_flight_requests_max: int = 1024
    outbound_requests_max: int = 1024
    idle_timeout_seconds: float = 120.0
    write_buffer_high_water_bytes: int = 4 * 1024 * 1024
    write_buffer_low_water_bytes: int = 1024 * 1024
    codec: CodecLimits = DEFAULT_LIMITS

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first field of the wrong type or out of range."""
        for limit in fields(self):
            value = getattr(self, limit.name)
            if limit.name == "codec":
                if not isinstance(value, CodecLimits):
                    raise ValueError(f"codec must be a CodecLimits, got {type(value).__name__}")
                value.validate()
            elif limit.name == "idle_timeout_seconds":
                if not (type(value) in (int, float) and math.isfinite(value) and value > 0):
                    raise ValueError(f"idle_timeout_seconds must be a positive finite number, got {value!r}")
            elif type(value) is not int or value < 1:
                raise ValueError(f"{limit.name} must be a positive int, got {value!r}")
        if self.write_buffer_low_water_bytes > self.write_buffer_high_water_bytes:
            raise ValueError(
                f"write_buffer_low_water_bytes ({self.write_buffer_low_water_bytes}) cannot exceed "
                f"write_buffer_high_water_bytes ({self.write_buffer_high_water_bytes})"
            )

    @classmethod
    def from_mapping(cls, values: Mapping[str, object]) -> ServerLimits:
        """Limits from a configuration table (TOML): unknown keys are rejected, missing ones default;
        ``codec`` is a nested table for :meth:`CodecLimits.from_mapping`."""
        known = {limit.name for limit in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(
                f"unknown server limits: {', '.join(unknown)} (known: {', '.join(sorted(known))})"
            )
        arguments: dict[str, object] = dict(values)
        codec = arguments.get("codec")
        if codec is not None:
            if not isinstance(codec, Mapping):
                raise ValueError(f"codec must be a table, got {type(codec).__name__}")
            arguments["codec"] = CodecLimits.from_mapping(codec)
        return cls(**arguments)  # type: ignore[arg-type]  # validate() checks every type


# ------------------------------------------------------------------------------ processor interface


class Connection(Protocol):
    """What a processor may do with the connection a request came on (no transport leaks out).

    A processor may keep it (a producer group's connections, for transaction check-backs) and use it
    after answering; operations on a closed connection raise ``ConnectionClosedError``.
    """

    @property
    def connection_id(self) -> int: ...

    @property
    def remote_address(self) -> str: ...

    @property
    def remote_host(self) -> str: ...

    @property
    def remote_port(self) -> int: ...

    @property
    def is_closed(self) -> bool: ...

    async def send_request(
        self,
        code: int,
        ext_fields: Mapping[str, str] | None = None,
        body: bytes = b"",
        *,
        timeout_seconds: float = ...,
        remark: str | None = None,
        serialize_type: int = ...,
    ) -> RemotingCommand: ...

    async def send_oneway(
        self,
        code: int,
        ext_fields: Mapping[str, str] | None = None,
        body: bytes = b"",
        *,
        timeout_seconds: float = ...,
        remark: str | None = None,
        serialize_type: int = ...,
    ) -> None: ...

    def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class RequestContext:
    """One request as a processor sees it: the command and the connection it came on."""

    request: RemotingCommand
    connection: Connection
    #: when the server queued it for a worker (``time.monotonic()``; 0.0 when not known)
    received: float = 0.0
    #: ``"host:port"`` of the client a group member forwarded this request for (:data:`FORWARDED_FOR_FIELD`,
    #: taken from a trusted member link only); empty: the request came from the client itself
    forwarded_for: str = ""

    @property
    def remote_address(self) -> str:
        """``"host:port"`` of the client (RocketMQ uses it as the message's born host): the one a member
        forwarded the request for, else the connection's peer."""
        return self.forwarded_for or self.connection.remote_address


#: a processor answers with a response, or None for no answer
Processor = Callable[[RequestContext], Awaitable[RemotingCommand | None]]
#: a request's answer on the loop (called once): a response, its frame (in the request's header form, with
#: its opaque), None for no answer, or the exception its processing failed with (a processor's failure)
Finish = Callable[[RemotingCommand | bytes | Exception | None], None]
#: a route's synchronous way in: None leaves the request to the route's queue and workers; a response answers
#: it at once; a callable ``start(finish)`` hands it on (on the loop, at once), and ``finish`` answers it later
FastPath = Callable[[RequestContext], "RemotingCommand | Callable[[Finish], None] | None"]
#: called once for every connection that closes (after it was admitted)
ConnectionCloseListener = Callable[[Connection], None]
#: consulted before a request is queued: None lets it through, a response refuses it (answered at once)
Authorizer = Callable[[RemotingCommand, Connection], RemotingCommand | None]
#: says whether a connection is an authenticated link from another member of the group (broker.forwarding)
MemberLinkCheck = Callable[[Connection], bool]
#: the extField a member adds to a request it forwards to the leader: the client's ``"host:port"``. The
#: server takes it from member links only and strips it from every request before anything else sees it,
#: so a client cannot pass itself off as forwarded (nor keep the field in what its ACL signature covers).
FORWARDED_FOR_FIELD: Final = "raftmqForwardedFor"
#: the longest a TLS handshake may take (asyncio's default), whatever the idle timeout
_TLS_HANDSHAKE_TIMEOUT_MAX_SECONDS: Final = 60.0


@dataclass(slots=True)
class _Route:
    """The processor of some request codes, its bounded queue and its workers."""

    name: str
    processor: Processor
    queue: asyncio.Queue[tuple[ServerConnection, RemotingCommand, float, str]]
    queue_max: int
    workers: int
    tasks: list[asyncio.Task[None]]
    fast: FastPath | None = None


# ---------------------------------------------------------------------------------------- connection


class ServerConnection(RemotingConnection):
    """One accepted connection; processors see it through :class:`Connection`."""

    def __init__(self, server: RemotingServer, connection_id: int) -> None:
        limits = server.limits
        super().__init__(codec_limits=limits.codec, outbound_requests_max=limits.outbound_requests_max)
        self._server = server
        self._limits = limits
        self._connection_id = connection_id
        self._in_flight = 0
        self._admitted = False
        self._last_activity = self._loop.time()
        self._idle_timer: asyncio.TimerHandle | None = None
        self._close_when_idle = False
        #: the start of a PROXY v2 header while one is expected (a connection from a front: proxy_protocol)
        self._proxy_header: bytearray | None = None
        self._through_front = False

    @property
    def connection_id(self) -> int:
        return self._connection_id

    @property
    def is_idle(self) -> bool:
        """Nothing in progress either way: no request of the peer queued, processed or partly received, no
        request of ours waiting for an answer."""
        return self._in_flight == 0 and self.pending_requests == 0 and self.buffered_bytes == 0

    @property
    def through_front(self) -> bool:
        """The connection came from a front (a host of the server's ``proxy_protocol_hosts``); its remote
        address is the client's the front named."""
        return self._through_front

    @property
    def closing_when_idle(self) -> bool:
        """:meth:`close_when_idle` was called."""
        return self._close_when_idle

    def close_when_idle(self) -> bool:
        """Close (after writing what is buffered) at once if idle, else right after the answer that leaves it
        idle: the peer gets its last answer and the close together, never a request cut off. Returns whether
        it closed now."""
        if self.is_closed:
            return False
        self._close_when_idle = True
        if self.is_idle:
            self.close()
            return True
        return False

    @property
    def in_flight(self) -> int:
        """Requests of this connection queued for or inside a processor."""
        return self._in_flight

    @property
    def pause_reasons(self) -> frozenset[str]:
        return frozenset(self._read_pause_reasons)

    def __repr__(self) -> str:
        return f"ServerConnection(id={self._connection_id}, remote={self.remote_address})"

    # ------------------------------------------------------------------------ transport callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        if self._transport is None:
            return
        if not self._server._admit(self):
            # refused before reading a byte: no decoder work, no processor sees it
            self._transport.abort()
            return
        self._admitted = True
        if self._remote_host in self._server.proxy_protocol_hosts:
            self._through_front = True
            self._proxy_header = bytearray()
        self._transport.set_write_buffer_limits(
            high=self._limits.write_buffer_high_water_bytes, low=self._limits.write_buffer_low_water_bytes
        )
        self._touch()
        self._schedule_idle_check(self._limits.idle_timeout_seconds)

    def data_received(self, data: bytes) -> None:
        if self._proxy_header is None:
            super().data_received(data)
            return
        self._proxy_header += data
        try:
            header = parse_header(self._proxy_header)
        except ProxyHeaderError as error:
            logger.warning("closing %r: %s", self, error)
            self.abort()
            return
        if header is None:
            return
        rest = bytes(self._proxy_header[header.length:])
        self._proxy_header = None
        if header.client is not None:  # the client the front stands for: its address is the connection's
            self._remote_host, self._remote_port, self._remote_address = format_address(header.client)
        if rest:
            super().data_received(rest)

    # ---------------------------------------------------------------------------- RemotingConnection

    def _on_request(self, request: RemotingCommand) -> None:
        self._server._dispatch(self, request)

    def _on_frame_received(self) -> None:
        self._touch()

    def _on_frame_written(self) -> None:
        self._touch()

    def _on_write_paused(self) -> None:
        logger.debug("%r: write buffer above high-water mark, pausing reads", self)
        self._pause_reading(PAUSED_FOR_WRITE_BUFFER)

    def _on_write_resumed(self) -> None:
        self._resume_reading(PAUSED_FOR_WRITE_BUFFER)

    def _on_connection_closed(self, error: Exception | None) -> None:
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None
        if self._admitted:
            self._server._forget(self, error)

    # ------------------------------------------------------------------------------- for the server

    def request_started(self) -> None:
        self._in_flight += 1
        if self._in_flight >= self._limits.in_flight_requests_max:
            self._pause_reading(PAUSED_FOR_IN_FLIGHT)

    def request_finished(self) -> None:
        self._in_flight -= 1
        self._touch()
        if self._close_when_idle and self.is_idle:
            self.close()
            return
        if self._in_flight < self._limits.in_flight_requests_max:
            self._resume_reading(PAUSED_FOR_IN_FLIGHT)

    def answer(self, request: RemotingCommand, response: RemotingCommand | None) -> None:
        self._answer(request, response)

    def answer_frame(self, request: RemotingCommand, frame: bytes) -> None:
        """Answer with a response already framed in the request's header form, with its opaque."""
        self._answer_frame(request, frame)

    def stop_reading(self) -> None:
        """No more requests from this connection (the server is stopping); answers still go out."""
        self._pause_reading(PAUSED_FOR_STOP)

    # --------------------------------------------------------------------------------------- idle

    def _touch(self) -> None:
        self._last_activity = self._loop.time()

    def _schedule_idle_check(self, delay_seconds: float) -> None:
        self._idle_timer = self._loop.call_later(delay_seconds, self._check_idle)

    def _check_idle(self) -> None:
        self._idle_timer = None
        if self.is_closed:
            return
        timeout = self._limits.idle_timeout_seconds
        busy = self._in_flight > 0 or self.pending_requests > 0
        quiet_for = self._loop.time() - self._last_activity
        if not busy and quiet_for >= timeout:
            logger.info(
                "closing %r: idle for %.1f s (%d bytes of a partial frame)",
                self,
                quiet_for,
                self.buffered_bytes,
            )
            self.abort()
            return
        self._schedule_idle_check(timeout if busy else timeout - quiet_for)


# -------------------------------------------------------------------------------------------- server


class RemotingServer:
    """The remoting server: bind, accept, dispatch to processors, stop gracefully.

    Register processors with :meth:`register` (before or after :meth:`start`), then ``await start()``;
    :attr:`port` is the bound port (useful with port 0). ``await stop()`` stops accepting, stops
    reading, lets requests in progress finish (up to a grace period), then closes every connection.
    """

    def __init__(self, host: str, port: int, limits: ServerLimits | None = None, *,
                 authorizer: Authorizer | None = None, ssl_context: ssl.SSLContext | None = None,
                 is_member_link: MemberLinkCheck | None = None,
                 proxy_protocol_hosts: frozenset[str] = frozenset()) -> None:
        if not isinstance(host, str) or not host:
            raise ValueError(f"host must be a non-empty string, got {host!r}")
        if type(port) is not int or not 0 <= port <= _PORT_MAX:
            raise ValueError(f"port must be an int in [0, {_PORT_MAX}] (0 picks a free port), got {port!r}")
        self._host = host
        self._requested_port = port
        self._limits = ServerLimits() if limits is None else limits
        self._limits.validate()
        self._authorizer = authorizer
        self._is_member_link = is_member_link
        #: peers whose connections start with a PROXY v2 header naming the client (a front's hosts)
        self.proxy_protocol_hosts = proxy_protocol_hosts
        self._ssl_context = ssl_context
        self._routes: dict[int, _Route] = {}
        self._route_list: list[_Route] = []
        self._connections: dict[int, ServerConnection] = {}
        self._connection_ids = itertools.count(1)
        self._close_listeners: list[ConnectionCloseListener] = []
        self._server: asyncio.Server | None = None
        self._bound_addresses: list[tuple[str, int]] = []
        self._started = False
        self._stopping = False
        self._stop_task: asyncio.Task[None] | None = None
        self._stopped: asyncio.Event | None = None
        self._fatal_error: BaseException | None = None
        self._in_flight_total = 0
        self._no_requests_in_flight: asyncio.Event | None = None

    # --------------------------------------------------------------------------------- properties

    @property
    def limits(self) -> ServerLimits:
        return self._limits

    @property
    def host(self) -> str:
        return self._host

    @property
    def port(self) -> int:
        """The bound port once started (the first socket's, if the host resolved to several)."""
        if not self._bound_addresses:
            raise RuntimeError("the server is not started")
        return self._bound_addresses[0][1]

    @property
    def bound_addresses(self) -> list[tuple[str, int]]:
        return list(self._bound_addresses)

    @property
    def connections(self) -> list[ServerConnection]:
        """Open, admitted connections (a snapshot)."""
        return list(self._connections.values())

    @property
    def registered_codes(self) -> frozenset[int]:
        return frozenset(self._routes)

    def queue_depths(self) -> dict[str, tuple[int, int]]:
        """Each processor's requests waiting and its queue's limit, by the name it was registered under."""
        return {route.name: (route.queue.qsize(), route.queue_max) for route in self._route_list}

    @property
    def is_serving(self) -> bool:
        return self._started and not self._stopping

    # ------------------------------------------------------------------------------ configuration

    def register(
        self,
        code: int | Iterable[int],
        processor: Processor,
        *,
        queue_max: int = 1024,
        workers: int = 8,
        name: str | None = None,
        fast: FastPath | None = None,
    ) -> None:
        """Route requests with ``code`` (or each of several codes, sharing one queue and its workers)
        to ``processor``. ``queue_max`` requests may wait (more are answered SYSTEM_BUSY); ``workers``
        requests run at once. ``fast`` is tried first while the queue is empty (:data:`FastPath`). A code
        can be registered only once."""
        codes = [code] if isinstance(code, int) else list(code)
        if not codes:
            raise ValueError("register needs at least one request code")
        for each in codes:
            if not isinstance(each, int) or isinstance(each, bool):
                raise ValueError(f"request codes must be ints, got {each!r}")
            if each in self._routes:
                raise ValueError(f"{describe_request_code(each)} already has a processor")
        if len(set(codes)) != len(codes):
            raise ValueError(f"duplicate request codes in {codes}")
        if type(queue_max) is not int or queue_max < 1:
            raise ValueError(f"queue_max must be a positive int, got {queue_max!r}")
        if type(workers) is not int or workers < 1:
            raise ValueError(f"workers must be a positive int, got {workers!r}")
        if self._stopping:
            raise RuntimeError("cannot register processors on a stopping server")
        route = _Route(
            name=name or "+".join(describe_request_code(each) for each in codes),
            processor=processor,
            queue=asyncio.Queue(maxsize=queue_max),
            queue_max=queue_max,
            workers=workers,
            tasks=[],
            fast=fast,
        )
        for each in codes:
            self._routes[int(each)] = route
        self._route_list.append(route)
        if self._started:
            self._start_workers(route)

    def add_close_listener(self, listener: ConnectionCloseListener) -> None:
        """Call ``listener(connection)`` when an admitted connection closes (RocketMQ's channel
        housekeeping: a name server forgets a broker whose connection dropped)."""
        self._close_listeners.append(listener)

    # --------------------------------------------------------------------------------- life cycle

    async def start(self) -> None:
        """Bind and start accepting. Raises ``OSError`` if the address cannot be bound."""
        if self._started:
            raise RuntimeError("the server was already started")
        self._started = True
        self._stopped = asyncio.Event()
        self._no_requests_in_flight = asyncio.Event()
        self._no_requests_in_flight.set()
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: ServerConnection(self, next(self._connection_ids)),
            self._host,
            self._requested_port,
            reuse_address=True,
            ssl=self._ssl_context,
            ssl_handshake_timeout=(
                None if self._ssl_context is None
                else min(self._limits.idle_timeout_seconds, _TLS_HANDSHAKE_TIMEOUT_MAX_SECONDS)
            ),
        )
        for sock in self._server.sockets:
            address = sock.getsockname()
            self._bound_addresses.append((str(address[0]), int(address[1])))
        for route in self._route_list:
            self._start_workers(route)
        logger.info(
            "remoting server listening on %s",
            ", ".join(f"{host}:{port}" for host, port in self._bound_addresses),
        )

    async def stop(self, grace_seconds: float = 5.0) -> None:
        """Stop gracefully: no new connections or requests; requests in progress get ``grace_seconds``
        to finish and be answered; then every connection is closed (aborted if it will not flush).
        Idempotent; concurrent callers all wait for the same stop."""
        if not (
            isinstance(grace_seconds, int | float) and math.isfinite(grace_seconds) and grace_seconds >= 0
        ):
            raise ValueError(f"grace_seconds must be a non-negative finite number, got {grace_seconds!r}")
        if not self._started:
            self._started = self._stopping = True
            self._stopped = asyncio.Event()
            self._stopped.set()
            return
        if self._stop_task is None:
            self._stop_task = asyncio.get_running_loop().create_task(self._stop(grace_seconds))
        await asyncio.shield(self._stop_task)

    async def wait_stopped(self) -> None:
        """Return once the server has stopped; re-raise the programmer error that stopped it, if any."""
        if self._stopped is None:
            raise RuntimeError("the server is not started")
        await self._stopped.wait()
        if self._fatal_error is not None:
            raise self._fatal_error

    async def _stop(self, grace_seconds: float) -> None:
        self._stopping = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace_seconds
        if self._server is not None:
            self._server.close()
        for connection in list(self._connections.values()):
            connection.stop_reading()
        if self._no_requests_in_flight is not None and not self._no_requests_in_flight.is_set():
            try:
                async with asyncio.timeout_at(deadline):
                    await self._no_requests_in_flight.wait()
            except TimeoutError:
                logger.warning(
                    "stopping with %d requests still in progress after %.1f s",
                    self._in_flight_total,
                    grace_seconds,
                )
        tasks = [task for route in self._route_list for task in route.tasks]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        connections = list(self._connections.values())
        for connection in connections:
            connection.close()
        if connections:
            try:
                async with asyncio.timeout_at(max(deadline, loop.time() + 0.1)):
                    await asyncio.gather(*(connection.wait_closed() for connection in connections))
            except TimeoutError:
                for connection in connections:
                    connection.abort()
                await asyncio.gather(*(connection.wait_closed() for connection in connections))
        if self._server is not None:
            await self._server.wait_closed()
        assert self._stopped is not None
        self._stopped.set()
        logger.info("remoting server on %s stopped", self._host)

    # -------------------------------------------------------------------------------- connections

    def _admit(self, connection: ServerConnection) -> bool:
        if self._stopping:
            return False
        if len(self._connections) >= self._limits.connections_max:
            logger.warning(
                "refusing %s: %d connections open (connections_max=%d)",
                connection.remote_address,
                len(self._connections),
                self._limits.connections_max,
            )
            return False
        self._connections[connection.connection_id] = connection
        return True

    def _forget(self, connection: ServerConnection, error: Exception | None) -> None:
        self._connections.pop(connection.connection_id, None)
        logger.debug("%r closed%s", connection, f": {error}" if error else "")
        for listener in self._close_listeners:
            try:
                listener(connection)
            except InvariantError as invariant_error:
                self._fail(invariant_error)
            except Exception:  # a listener's operating error must not keep the others from running
                logger.exception("connection close listener failed for %r", connection)

    # ---------------------------------------------------------------------------------- dispatch

    def _dispatch(self, connection: ServerConnection, request: RemotingCommand) -> None:
        route = self._routes.get(request.code)
        if route is None:
            connection.answer(
                request,
                make_response(
                    request,
                    ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
                    f"request code {describe_request_code(request.code)} not supported",
                ),
            )
            return
        forwarded_for = ""
        if FORWARDED_FOR_FIELD in request.ext_fields:  # (one lookup: the only cost to a client's request)
            request, forwarded_for = self._take_forwarded_for(connection, request)
        if self._authorizer is not None:
            refusal = self._authorize(self._authorizer, connection, request)
            if refusal is not None:
                connection.answer(request, refusal)
                return
        if route.fast is not None and route.queue.empty() and self._fast(route.fast, connection, request,
                                                                         forwarded_for):
            return
        try:
            route.queue.put_nowait((connection, request, time.monotonic(), forwarded_for))
        except asyncio.QueueFull:
            connection.answer(
                request,
                make_response(
                    request,
                    ResponseCode.SYSTEM_BUSY,
                    f"[OVERLOAD] system busy: {route.queue_max} {route.name} requests are waiting, "
                    "retry later",
                ),
            )
            return
        connection.request_started()
        self._in_flight_total += 1
        if self._no_requests_in_flight is not None:
            self._no_requests_in_flight.clear()

    def _fast(self, fast: FastPath, connection: ServerConnection, request: RemotingCommand,
              forwarded_for: str = "") -> bool:
        """Offer ``request`` to a route's synchronous way in; False: declined, nothing was done."""
        try:
            taken = fast(RequestContext(request, connection, time.monotonic(), forwarded_for))
        except Exception as error:
            connection.answer(request, self._processor_failed(error, connection, request, "fast path"))
            return True
        if taken is None:
            return False
        if isinstance(taken, RemotingCommand):
            connection.answer(request, taken)
            return True
        connection.request_started()
        self._in_flight_total += 1
        if self._no_requests_in_flight is not None:
            self._no_requests_in_flight.clear()
        answered = False

        def finish(response: RemotingCommand | bytes | Exception | None) -> None:
            nonlocal answered
            if answered:
                return
            answered = True
            try:
                if type(response) is bytes:
                    connection.answer_frame(request, response)
                    return
                if isinstance(response, Exception):
                    response = self._processor_failed(response, connection, request, "fast path")
                assert not isinstance(response, bytes)
                connection.answer(request, response)
            finally:
                self._finished(connection)

        try:
            taken(finish)
        except Exception as error:
            finish(error)
        return True

    def _finished(self, connection: ServerConnection) -> None:
        connection.request_finished()
        self._in_flight_total -= 1
        if self._in_flight_total == 0 and self._no_requests_in_flight is not None:
            self._no_requests_in_flight.set()

    def _take_forwarded_for(self, connection: ServerConnection,
                            request: RemotingCommand) -> tuple[RemotingCommand, str]:
        """The request without :data:`FORWARDED_FOR_FIELD`, and the client it names when ``connection`` is a
        member link (else "": a client's own marker is ignored)."""
        fields = dict(request.ext_fields)
        claimed = fields.pop(FORWARDED_FOR_FIELD)
        trusted = self._is_member_link is not None and self._is_member_link(connection)
        if not trusted:
            logger.debug("ignoring %s from %s: not a member link", FORWARDED_FOR_FIELD, connection.remote_address)
        return dataclasses.replace(request, ext_fields=fields), (claimed if trusted else "")

    def _authorize(
        self, authorizer: Authorizer, connection: ServerConnection, request: RemotingCommand
    ) -> RemotingCommand | None:
        try:
            return authorizer(request, connection)
        except InvariantError as error:
            self._fail(error)
            return make_response(request, ResponseCode.SYSTEM_ERROR, "internal error: the server is stopping")
        except Exception as error:  # an operating error of the check: refuse this request, not the server
            logger.exception("authorizer failed on a request from %s (opaque %d)", connection.remote_address,
                             request.opaque)
            return make_response(
                request, ResponseCode.SYSTEM_ERROR,
                f"{describe_request_code(request.code)} refused: the access check failed: {type(error).__name__}",
            )

    def _start_workers(self, route: _Route) -> None:
        loop = asyncio.get_running_loop()
        for index in range(route.workers):
            route.tasks.append(
                loop.create_task(self._work(route), name=f"remoting {route.name} worker {index}")
            )

    async def _work(self, route: _Route) -> None:
        while True:
            connection, request, received, forwarded_for = await route.queue.get()
            try:
                response = await self._process(route, connection, request, received, forwarded_for)
                connection.answer(request, response)
            finally:
                self._finished(connection)
                route.queue.task_done()

    async def _process(
        self, route: _Route, connection: ServerConnection, request: RemotingCommand, received: float,
        forwarded_for: str = "",
    ) -> RemotingCommand | None:
        try:
            return await route.processor(RequestContext(request, connection, received, forwarded_for))
        except Exception as error:
            return self._processor_failed(error, connection, request, route.name)

    def _processor_failed(self, error: Exception, connection: ServerConnection, request: RemotingCommand,
                          name: str) -> RemotingCommand:
        """The answer to a request whose processor raised ``error``."""
        if isinstance(error, InvariantError):
            # A programmer error: this process can no longer be trusted to answer anything.
            self._fail(error)
            return make_response(request, ResponseCode.SYSTEM_ERROR, "internal error: the server is stopping")
        logger.error("processor %s failed on a request from %s (opaque %d)", name, connection.remote_address,
                     request.opaque, exc_info=error)
        return make_response(
            request,
            ResponseCode.SYSTEM_ERROR,
            f"{describe_request_code(request.code)} failed: {type(error).__name__}: {error}",
        )

    def _fail(self, error: BaseException) -> None:
        """Stop the server because of a programmer error; :meth:`wait_stopped` re-raises it."""
        logger.critical("stopping the remoting server: %s", error, exc_info=error)
        if self._fatal_error is None:
            self._fatal_error = error
        if self._stop_task is None:
            self._stop_task = asyncio.get_running_loop().create_task(self._stop(0.0))


__all__ = [
    "FORWARDED_FOR_FIELD",
    "PAUSED_FOR_IN_FLIGHT",
    "PAUSED_FOR_STOP",
    "PAUSED_FOR_WRITE_BUFFER",
    "Authorizer",
    "Connection",
    "ConnectionCloseListener",
    "FastPath",
    "Finish",
    "MemberLinkCheck",
    "Processor",
    "RemotingServer",
    "RequestContext",
    "ServerConnection",
    "ServerLimits",
]
