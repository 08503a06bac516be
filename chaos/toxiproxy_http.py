"""A small, strict HTTP/1.1 request parser and response encoder for the Toxiproxy API (sans-IO).

``RequestParser.feed(bytes)`` / ``next_request()`` and ``encode_response(...)`` never touch a socket;
the asyncio server in :mod:`chaos.toxiproxy_server` is a thin shell around them. Only what the
Toxiproxy clients send is accepted: a request line, headers, and a body framed by Content-Length.
Everything else is an :class:`HttpError` with the status to answer before closing the connection
(after a framing error the byte stream cannot be trusted to resynchronise).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from http import HTTPStatus

from protocol.invariant import invariant

_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_TARGET = re.compile(rb"/[\x21-\x7e]*")
_VERSIONS = (b"HTTP/1.1", b"HTTP/1.0")


@dataclass(frozen=True)
class HttpLimits:
    """Every part of a request that can grow has a limit (a request over one is refused, not read)."""

    head_size_max_bytes: int = 16 * 1024
    header_count_max: int = 64
    body_size_max_bytes: int = 1024 * 1024

    def validate(self) -> None:
        if self.head_size_max_bytes < 64 or self.header_count_max < 1 or self.body_size_max_bytes < 0:
            raise ValueError(f"HTTP limits out of range: {self}")


class HttpError(Exception):
    """A request this server refuses; ``status`` is the answer, the connection closes after it."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class HttpRequest:
    method: str
    path: str
    query: str
    #: header names lower-cased; a repeated header keeps its last value (Content-Length may not repeat)
    headers: Mapping[str, str]
    body: bytes
    keep_alive: bool


@dataclass(frozen=True)
class _RequestHead:
    method: str
    path: str
    query: str
    headers: Mapping[str, str]
    keep_alive: bool
    body_size_bytes: int


@dataclass
class RequestParser:
    """Bytes in, whole requests out. Pipelined requests are returned one per ``next_request`` call."""

    limits: HttpLimits = field(default_factory=HttpLimits)
    _buffer: bytearray = field(default_factory=bytearray)
    _head: _RequestHead | None = None

    def feed(self, data: bytes) -> None:
        self._buffer += data

    def next_request(self) -> HttpRequest | None:
        """The next complete request, None if more bytes are needed; HttpError if it is refused."""
        if self._head is None:
            end = self._buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(self._buffer) > self.limits.head_size_max_bytes:
                    raise HttpError(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "request head too large")
                return None
            if end + 4 > self.limits.head_size_max_bytes:
                raise HttpError(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "request head too large")
            self._head = self._parse_head(bytes(self._buffer[:end]))
            del self._buffer[: end + 4]
        head = self._head
        if len(self._buffer) < head.body_size_bytes:
            return None
        body = bytes(self._buffer[: head.body_size_bytes])
        del self._buffer[: head.body_size_bytes]
        self._head = None
        return HttpRequest(head.method, head.path, head.query, head.headers, body, head.keep_alive)

    def _parse_head(self, head: bytes) -> _RequestHead:
        request_line, *header_lines = head.split(b"\r\n")
        parts = request_line.split(b" ")
        if len(parts) != 3 or not _TOKEN.fullmatch(parts[0]) or not _TARGET.fullmatch(parts[1]):
            raise HttpError(HTTPStatus.BAD_REQUEST, "malformed request line")
        method, target, version = parts
        if version not in _VERSIONS:
            raise HttpError(HTTPStatus.HTTP_VERSION_NOT_SUPPORTED, "only HTTP/1.1 and HTTP/1.0 are served")
        if len(header_lines) > self.limits.header_count_max:
            raise HttpError(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "too many headers")
        headers: dict[str, str] = {}
        content_lengths: list[str] = []
        for line in header_lines:
            name, colon, value = line.partition(b":")
            if not colon or not _TOKEN.fullmatch(name):
                # also refuses obsolete line folding (a line starting with white space)
                raise HttpError(HTTPStatus.BAD_REQUEST, "malformed header line")
            key = name.decode("ascii").lower()
            text = value.strip(b" \t").decode("latin-1")
            if key == "content-length":
                content_lengths.append(text)
            headers[key] = text
        if "transfer-encoding" in headers:
            raise HttpError(
                HTTPStatus.NOT_IMPLEMENTED, "transfer-encoding is not supported, send Content-Length"
            )
        body_size = 0
        if content_lengths:
            if len(content_lengths) > 1 or not content_lengths[0].isdigit() or len(content_lengths[0]) > 18:
                raise HttpError(HTTPStatus.BAD_REQUEST, "bad Content-Length")
            body_size = int(content_lengths[0])
            if body_size > self.limits.body_size_max_bytes:
                raise HttpError(
                    HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                    f"request body over {self.limits.body_size_max_bytes} bytes",
                )
        connection = headers.get("connection", "").lower()
        # HTTP/1.1 keeps the connection unless told to close; 1.0 closes unless told to keep it
        keep_alive = "close" not in connection if version == b"HTTP/1.1" else "keep-alive" in connection
        path, _, query = target.decode("ascii").partition("?")
        return _RequestHead(method.decode("ascii"), path, query, headers, keep_alive, body_size)


def encode_response(
    status: int, body: bytes = b"", content_type: str | None = None, keep_alive: bool = True
) -> bytes:
    """One HTTP/1.1 response. 204 and 304 carry no body and no Content-Length."""
    bodiless = status in (HTTPStatus.NO_CONTENT, HTTPStatus.NOT_MODIFIED)
    invariant(not (bodiless and body), f"status {status} cannot carry a body")
    try:
        reason = HTTPStatus(status).phrase
    except ValueError:
        reason = "Unknown"
    lines = [f"HTTP/1.1 {status} {reason}"]
    if content_type is not None:
        lines.append(f"Content-Type: {content_type}")
    if not bodiless:
        lines.append(f"Content-Length: {len(body)}")
    lines.append("Connection: keep-alive" if keep_alive else "Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body
