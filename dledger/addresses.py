"""Network addresses in node files: ``host:port`` where host is an IPv4 literal, a DNS name, or an IPv6
literal in brackets (``[fd00::1]:20010``), and how names become IP addresses.

Names are resolved when a connection is made, never once at start: a peer that comes back under a new
IP address (a rescheduled container, a changed DNS record) is reached at its new address on the next
reconnect. :class:`Resolver` does this for the Raft transport without ever blocking pysyncobj's tick
thread for longer than a short, named bound; the asyncio and catch-up paths resolve on every connect
through the standard library.
"""

from __future__ import annotations

import ipaddress
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

#: RFC 1123: a DNS name is at most 253 characters of dot-separated labels of at most 63
HOST_NAME_LENGTH_MAX: Final = 253
LABEL_LENGTH_MAX: Final = 63
#: hosts that stand for every interface: a server may listen there, but nobody can connect to them
WILDCARD_HOSTS: Final = frozenset({"0.0.0.0", "::", ""})
#: the longest the Raft thread waits for a name lookup before it uses the last answer it has (or skips
#: this connection attempt); the lookup goes on in the background and the next attempt uses its answer
RESOLVE_WAIT_SECONDS: Final = 0.2


class AddressError(ValueError):
    """A malformed address (the message names what is wrong; callers prefix the setting's name)."""


@dataclass(frozen=True, slots=True)
class HostPort:
    host: str  # without brackets
    port: int

    @property
    def is_ip_literal(self) -> bool:
        return ip_literal_version(self.host) is not None

    def __str__(self) -> str:
        return format_host_port(self.host, self.port)


def ip_literal_version(host: str) -> int | None:
    """4 or 6 when ``host`` is an IP literal (an IPv6 scope id such as ``%eth0`` allowed), else None."""
    try:
        return ipaddress.ip_address(host).version
    except ValueError:
        return None


def is_host_name(host: str) -> bool:
    """Whether ``host`` is a syntactically valid DNS name (letters, digits and '-', dot-separated)."""
    name = host[:-1] if host.endswith(".") else host
    if not name or len(name) > HOST_NAME_LENGTH_MAX:
        return False
    labels = name.split(".")
    if all(label.isdigit() for label in labels):
        return False  # digits and dots only: a (bad) IPv4 literal, not a name
    for label in labels:
        if not 1 <= len(label) <= LABEL_LENGTH_MAX or label.startswith("-") or label.endswith("-"):
            return False
        if not all(character.isascii() and (character.isalnum() or character == "-") for character in label):
            return False
    return True


def split_host_port(value: object) -> HostPort:
    """``host:port``, ``a.b.c.d:port`` or ``[v6]:port`` as a :class:`HostPort`; AddressError otherwise."""
    if not isinstance(value, str):
        raise AddressError(f"must be 'host:port', got {value!r}")
    if value.startswith("["):
        inside, bracket, rest = value[1:].partition("]")
        if not bracket or not rest.startswith(":"):
            raise AddressError(f"must be '[IPv6]:port', got {value!r}")
        host, port_text = inside, rest[1:]
        if ip_literal_version(host) != 6:
            raise AddressError(f"must have an IPv6 address between the brackets, got {host!r}")
    else:
        if value.count(":") != 1:
            if value.count(":") > 1:
                raise AddressError(f"an IPv6 host goes between brackets ('[::1]:port'), got {value!r}")
            raise AddressError(f"must be 'host:port', got {value!r}")
        host, _, port_text = value.partition(":")
        if ip_literal_version(host) != 4 and not is_host_name(host):
            raise AddressError(f"must have an IPv4 address, a host name or a bracketed IPv6 address as its host, "
                               f"got {host!r}")
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise AddressError(f"must have a port in 1..65535, got {port_text!r}")
    return HostPort(host, int(port_text))


def format_host_port(host: str, port: int) -> str:
    """The inverse of :func:`split_host_port`: IPv6 literals go between brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def lookup(host: str, port: int = 0) -> list[tuple[socket.AddressFamily, str]]:
    """Every (family, IP address) ``host`` resolves to, in the system's order of preference (RFC 6724,
    gai.conf); an IP literal is itself. Raises OSError (socket.gaierror) when it does not resolve."""
    version = ip_literal_version(host)
    if version is not None:
        return [(socket.AF_INET if version == 4 else socket.AF_INET6, host)]
    answers = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    seen: list[tuple[socket.AddressFamily, str]] = []
    for family, _, _, _, sockaddr in answers:
        if family in (socket.AF_INET, socket.AF_INET6) and (family, str(sockaddr[0])) not in seen:
            seen.append((family, str(sockaddr[0])))
    if not seen:
        raise socket.gaierror(socket.EAI_NONAME, f"{host} has no IPv4 or IPv6 address")
    return seen


def resolve_for_bind(host: str, port: int) -> tuple[socket.AddressFamily, tuple[str, int]]:
    """Where a server whose configured address is ``host:port`` binds: the first address the host
    resolves to, with its family. OSError when it does not resolve."""
    family, ip = lookup(host, port)[0]
    return family, (ip, port)


class _Lookup:
    """One lookup running on a daemon thread (getaddrinfo cannot be cancelled or given a timeout)."""

    def __init__(self, host: str, resolve: Callable[[str], list[tuple[socket.AddressFamily, str]]]) -> None:
        self.done = threading.Event()
        self.answer: str | None = None
        self.error: str | None = None
        self._thread = threading.Thread(target=self._run, args=(host, resolve), name=f"resolve-{host}", daemon=True)
        self._thread.start()

    def _run(self, host: str, resolve: Callable[[str], list[tuple[socket.AddressFamily, str]]]) -> None:
        try:
            self.answer = resolve(host)[0][1]
        except (OSError, UnicodeError) as error:
            self.error = str(error)
        finally:
            self.done.set()


class Resolver:
    """Names to IP addresses at connect time, for a caller that must not block (the Raft tick thread).

    Each :meth:`resolve` of a name starts a fresh lookup (unless one is still running) and waits for it
    at most ``wait_seconds``; when it does not finish in time, or fails, the last good answer is used
    (None before the first). IP literals are returned as they are, without a lookup.
    """

    def __init__(self, wait_seconds: float = RESOLVE_WAIT_SECONDS,
                 resolve: Callable[[str], list[tuple[socket.AddressFamily, str]]] = lookup) -> None:
        self._wait_seconds = wait_seconds
        self._resolve = resolve
        self._lock = threading.Lock()
        self._running: dict[str, _Lookup] = {}
        self._last_answer: dict[str, str] = {}
        #: the last failure per name (for the caller's log), cleared by a success
        self.last_error: dict[str, str] = {}

    def resolve(self, host: str) -> str | None:
        if ip_literal_version(host) is not None:
            return host
        with self._lock:
            running = self._running.get(host)
            if running is None:
                running = self._running[host] = _Lookup(host, self._resolve)
        if running.done.wait(self._wait_seconds):
            with self._lock:
                if self._running.get(host) is running:
                    del self._running[host]
                if running.answer is not None:
                    self._last_answer[host] = running.answer
                    self.last_error.pop(host, None)
                elif running.error is not None:
                    self.last_error[host] = running.error
        with self._lock:
            return self._last_answer.get(host)
