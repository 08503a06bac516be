"""The PROXY protocol, version 2 (HAProxy's ``send-proxy-v2``): the header a load balancer writes first on each
connection it opens to a backend, naming the client it stands for. Sans-IO: :func:`parse_header` reads it
from the start of a stream.

A RocketMQ frame begins with its 4-byte length, and the header's signature read as a length (0x0D0A0D0A) is
beyond any frame the codec accepts, so the two cannot be confused. The server believes a header only from
the hosts it was told (``[broker] follower_front_hosts``): anyone else could claim any address.

Layout: the 12-byte :data:`SIGNATURE`; version and command (0x20 LOCAL: the balancer's own connection, a
health check; 0x21 PROXY); address family and transport (0x11 TCP over IPv4, 0x21 TCP over IPv6, others
carry no address we use); the length of what follows (big-endian); then source address, destination address,
source port, destination port, and optional TLVs (skipped).
"""

from __future__ import annotations

import ipaddress
import struct
from dataclasses import dataclass
from typing import Final

SIGNATURE: Final = b"\r\n\r\n\x00\r\nQUIT\n"
#: signature, version/command, family/transport, length
FIXED_BYTES: Final = 16
#: the longest header accepted (addresses and TLVs): what HAProxy sends is far shorter
BODY_MAX_BYTES: Final = 512
_LOCAL: Final = 0x20
_PROXY: Final = 0x21
_TCP4: Final = 0x11
_TCP6: Final = 0x21
_ADDRESS_BYTES: Final = {_TCP4: 12, _TCP6: 36}


class ProxyHeaderError(ValueError):
    """Not a PROXY v2 header, or a malformed one: the connection is closed."""


@dataclass(frozen=True, slots=True)
class ProxyHeader:
    """``client``: (host, port) of the client the balancer stands for; None for a LOCAL header or a family
    without an address (the connection's own peer then counts). ``length``: bytes the header took."""

    client: tuple[str, int] | None
    length: int


def parse_header(data: bytes | bytearray | memoryview) -> ProxyHeader | None:
    """The header at the start of ``data``; None while it is incomplete. :class:`ProxyHeaderError` when the
    bytes cannot start one."""
    view = memoryview(data)
    prefix = bytes(view[: len(SIGNATURE)])
    if not SIGNATURE.startswith(prefix):
        raise ProxyHeaderError("no PROXY protocol v2 signature")
    if len(view) < FIXED_BYTES:
        return None
    command, family, body_length = view[12], view[13], struct.unpack_from(">H", view, 14)[0]
    if command not in (_LOCAL, _PROXY):
        raise ProxyHeaderError(f"PROXY v2: unknown version/command 0x{command:02x}")
    if body_length > BODY_MAX_BYTES:
        raise ProxyHeaderError(f"PROXY v2: a {body_length}-byte header is longer than {BODY_MAX_BYTES}")
    if len(view) < FIXED_BYTES + body_length:
        return None
    length = FIXED_BYTES + body_length
    address_bytes = _ADDRESS_BYTES.get(family)
    if command == _LOCAL or address_bytes is None:
        return ProxyHeader(None, length)
    if body_length < address_bytes:
        raise ProxyHeaderError(f"PROXY v2: {body_length} bytes cannot hold the addresses of family 0x{family:02x}")
    body = bytes(view[FIXED_BYTES:FIXED_BYTES + address_bytes])
    if family == _TCP4:
        host = str(ipaddress.IPv4Address(body[0:4]))
        port = struct.unpack_from(">H", body, 8)[0]
    else:
        host = str(ipaddress.IPv6Address(body[0:16]))
        port = struct.unpack_from(">H", body, 32)[0]
    return ProxyHeader((host, port), length)


def encode_header(client: tuple[str, int] | None, server: tuple[str, int] = ("0.0.0.0", 0)) -> bytes:
    """The header a balancer would send for ``client`` (None: LOCAL); tests and tools use it."""
    if client is None:
        return SIGNATURE + bytes((_LOCAL, 0)) + struct.pack(">H", 0)
    source, destination = ipaddress.ip_address(client[0]), ipaddress.ip_address(server[0])
    if source.version != destination.version:
        destination = ipaddress.ip_address("::" if source.version == 6 else "0.0.0.0")
    family = _TCP4 if source.version == 4 else _TCP6
    body = source.packed + destination.packed + struct.pack(">HH", client[1], server[1])
    return SIGNATURE + bytes((_PROXY, family)) + struct.pack(">H", len(body)) + body


__all__ = ["BODY_MAX_BYTES", "SIGNATURE", "ProxyHeader", "ProxyHeaderError", "encode_header", "parse_header"]
