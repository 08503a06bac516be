"""The member's HTTP port (``[broker] http_address``): ``GET /healthz``, ``GET /readyz``,
``GET /readyz?role=leader`` (``role=follower`` too) and ``GET /metrics`` (Prometheus text).

A probe answers 200 with "ok", or 503 with the reason (broker.probes); ``/metrics`` renders this member's
registry (broker.metrics). A load balancer in front of the group checks ``/readyz?role=leader``: only the
Raft leader that takes writes answers it 200.

The request head is parsed by a pure function (:func:`parse_request_head`), the answer encoded by another
(:func:`encode_response`); :class:`HttpServer` is the asyncio shell around them, on the broker's event loop.
GET and HEAD only, no request bodies; HTTP/1.1 keep-alive (HTTP/1.0 on request). Every bad request is
answered with a 4xx and closes the connection; a failing route answers 500; nothing a client sends stops
the server. Limits: the head's size and header count, the time to send a head, open connections and
requests per connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Final, Protocol
from urllib.parse import parse_qsl, unquote

from broker.probes import ROLES

log = logging.getLogger(__name__)

TEXT_PLAIN: Final = "text/plain; charset=utf-8"
_TOKEN_CHARACTERS: Final = frozenset("!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
_VERSIONS: Final = ("HTTP/1.0", "HTTP/1.1")
_METHODS: Final = ("GET", "HEAD")
#: how long a refused connection is read (and what it sent dropped) before it closes, and how many reads
_LINGER_SECONDS: Final = 1.0
_LINGER_READS_MAX: Final = 16


@dataclass(frozen=True, slots=True)
class HttpLimits:
    #: a request line and its headers, blank line included
    head_bytes_max: int = 8192
    headers_max: int = 64
    #: to send a whole head once the connection opened or the previous answer went out (slow clients,
    #: idle keep-alive connections)
    head_timeout_seconds: float = 10.0
    connections_max: int = 64
    requests_per_connection_max: int = 1000

    def validate(self) -> HttpLimits:
        for name in ("head_bytes_max", "headers_max", "connections_max", "requests_per_connection_max"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if not 0 < self.head_timeout_seconds <= 3600:
            raise ValueError(f"head_timeout_seconds must be in (0, 3600], got {self.head_timeout_seconds!r}")
        return self


@dataclass(frozen=True, slots=True)
class HttpRequest:
    method: str
    #: the path, percent-decoded
    path: str
    query: Mapping[str, str] = field(default_factory=dict)
    keep_alive: bool = True


@dataclass(frozen=True, slots=True)
class HttpResponse:
    status: int
    body: bytes = b""
    content_type: str = TEXT_PLAIN


class HttpError(Exception):
    """A request that cannot be served: answered with ``status`` and the message, then the connection closes."""

    def __init__(self, status: HTTPStatus, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def parse_request_head(head: bytes, limits: HttpLimits = HttpLimits()) -> HttpRequest:
    """A request head (request line, headers, the blank line that ends them) as a request; HttpError for
    one this server does not serve."""
    if len(head) > limits.head_bytes_max:
        raise HttpError(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "request head too large")
    if not head.endswith(b"\r\n\r\n"):
        raise HttpError(HTTPStatus.BAD_REQUEST, "incomplete request head")
    lines = head[:-4].decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not all(parts):
        raise HttpError(HTTPStatus.BAD_REQUEST, "malformed request line")
    method, target, version = parts
    if version not in _VERSIONS:
        if version.startswith("HTTP/"):
            raise HttpError(HTTPStatus.HTTP_VERSION_NOT_SUPPORTED, f"{version} is not supported")
        raise HttpError(HTTPStatus.BAD_REQUEST, "malformed request line")
    if not set(method) <= _TOKEN_CHARACTERS:
        raise HttpError(HTTPStatus.BAD_REQUEST, "malformed method")
    if method not in _METHODS:
        raise HttpError(HTTPStatus.METHOD_NOT_ALLOWED, f"{method} is not allowed: GET or HEAD")
    if not target.startswith("/") or any(ord(character) <= 0x20 or ord(character) >= 0x7F for character in target):
        raise HttpError(HTTPStatus.BAD_REQUEST, "the target must be a path")
    headers = lines[1:]
    if len(headers) > limits.headers_max:
        raise HttpError(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, f"more than {limits.headers_max} headers")
    connection = ""
    for line in headers:
        name, colon, value = line.partition(":")
        if not colon or not name or not set(name) <= _TOKEN_CHARACTERS:
            raise HttpError(HTTPStatus.BAD_REQUEST, "malformed header")
        name = name.lower()
        value = value.strip(" \t")
        if name == "transfer-encoding" or (name == "content-length" and value != "0"):
            raise HttpError(HTTPStatus.BAD_REQUEST, "requests carry no body here")
        if name == "connection":
            connection = value.lower()
    path, _, query_text = target.partition("?")
    try:
        query = dict(parse_qsl(query_text, keep_blank_values=True, strict_parsing=False, errors="strict"))
        decoded_path = unquote(path, errors="strict")
    except (UnicodeDecodeError, ValueError):
        raise HttpError(HTTPStatus.BAD_REQUEST, "malformed target") from None
    keep_alive = "close" not in connection if version == "HTTP/1.1" else "keep-alive" in connection
    return HttpRequest(method, decoded_path, query, keep_alive)


def encode_response(response: HttpResponse, head_only: bool = False, keep_alive: bool = False) -> bytes:
    try:
        reason = HTTPStatus(response.status).phrase
    except ValueError:
        reason = "Unknown"
    head = (f"HTTP/1.1 {response.status} {reason}\r\n"
            f"Content-Type: {response.content_type}\r\n"
            f"Content-Length: {len(response.body)}\r\n"
            "Cache-Control: no-store\r\n"
            f"Connection: {'keep-alive' if keep_alive else 'close'}\r\n\r\n")
    return head.encode("latin-1") + (b"" if head_only else response.body)


class ProbeSource(Protocol):
    def health(self) -> str | None: ...

    def readiness(self, role: str | None = None) -> str | None: ...


def _problem_response(problem: str | None) -> HttpResponse:
    if problem is None:
        return HttpResponse(HTTPStatus.OK, b"ok\n")
    return HttpResponse(HTTPStatus.SERVICE_UNAVAILABLE, problem.encode("utf-8", "replace") + b"\n")


def probe_routes(probes: ProbeSource, metrics: Callable[[], bytes],
                 metrics_content_type: str) -> Callable[[HttpRequest], HttpResponse]:
    """The routes of a member's HTTP port."""

    def route(request: HttpRequest) -> HttpResponse:
        if request.path == "/healthz":
            return _problem_response(probes.health())
        if request.path == "/readyz":
            role = request.query.get("role") or None
            if role is not None and role not in ROLES:
                return HttpResponse(HTTPStatus.BAD_REQUEST, f"unknown role: one of {', '.join(ROLES)}\n".encode())
            return _problem_response(probes.readiness(role))
        if request.path == "/metrics":
            return HttpResponse(HTTPStatus.OK, metrics(), metrics_content_type)
        return HttpResponse(HTTPStatus.NOT_FOUND, b"not found: /healthz, /readyz, /readyz?role=leader, /metrics\n")

    return route


class HttpServer:
    """Serves ``route`` on ``host:port`` (port 0: a free one, see :attr:`port`)."""

    def __init__(self, host: str, port: int, route: Callable[[HttpRequest], HttpResponse],
                 limits: HttpLimits | None = None) -> None:
        self._host = host
        self._requested_port = port
        self._route = route
        self._limits = (limits or HttpLimits()).validate()
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()

    @property
    def port(self) -> int:
        if self._server is None or not self._server.sockets:
            raise RuntimeError("the HTTP server is not started")
        return int(self._server.sockets[0].getsockname()[1])

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, self._host, self._requested_port,
                                                  limit=self._limits.head_bytes_max)

    async def stop(self) -> None:
        if self._server is None:
            return
        self._server.close()
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._server.wait_closed(), 1.0)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        try:
            if len(self._connections) >= self._limits.connections_max:
                await self._refuse(reader, writer, HttpResponse(HTTPStatus.SERVICE_UNAVAILABLE,
                                                                b"too many connections\n"))
                return
            self._connections.add(task)
            await self._requests(reader, writer)
        except ConnectionError:
            pass
        except asyncio.CancelledError:
            # stop() cancels the connections: end normally, as asyncio's stream server (3.11) reports a handler
            # task that ends cancelled as an unhandled error
            pass
        finally:
            self._connections.discard(task)
            writer.close()
            with contextlib.suppress(ConnectionError, asyncio.CancelledError):
                await writer.wait_closed()

    async def _requests(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        limits = self._limits
        for served in range(1, limits.requests_per_connection_max + 1):
            try:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), limits.head_timeout_seconds)
            except (TimeoutError, asyncio.IncompleteReadError):
                return  # the client closed, or sent too slowly (nothing to answer mid-head)
            except asyncio.LimitOverrunError:
                await self._refuse(reader, writer, HttpResponse(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE,
                                                                b"request head too large\n"))
                return
            try:
                request = parse_request_head(head, limits)
            except HttpError as error:
                await self._refuse(reader, writer, HttpResponse(error.status, error.message.encode() + b"\n"))
                return
            keep_alive = request.keep_alive and served < limits.requests_per_connection_max
            response = self._answer(request)
            keep_alive = keep_alive and response.status != HTTPStatus.INTERNAL_SERVER_ERROR
            writer.write(encode_response(response, request.method == "HEAD", keep_alive))
            await writer.drain()
            if not keep_alive:
                return

    async def _refuse(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                      response: HttpResponse) -> None:
        """Answer and close without reading the request: what the client sent is read and dropped for a
        moment first (closing with unread data resets the connection, and the client may lose the answer)."""
        writer.write(encode_response(response))
        await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
        with contextlib.suppress(TimeoutError, ConnectionError):
            async with asyncio.timeout(_LINGER_SECONDS):
                for _ in range(_LINGER_READS_MAX):
                    if not await reader.read(self._limits.head_bytes_max):
                        break

    def _answer(self, request: HttpRequest) -> HttpResponse:
        try:
            return self._route(request)
        except Exception as error:  # an operating error of one answer: 500, the server goes on
            log.exception("HTTP %s %s failed", request.method, request.path)
            return HttpResponse(HTTPStatus.INTERNAL_SERVER_ERROR, f"{type(error).__name__}\n".encode())
