"""The hosts a stored record carries and the store-based message id made of one.

A host is stored as its address and port: 8 bytes for IPv4 (4 + port i32), 20 for IPv6 (16 + port i32).
A record's sysFlag says which of its two hosts are IPv6 (:mod:`commitlog.sys_flags`). The store-based message
id is the store host followed by the record's physical offset, in hex.
"""

from __future__ import annotations

import ipaddress
from typing import Final

HOST_V4_BYTES: Final = 8
HOST_V6_BYTES: Final = 20
#: what an IPv6 host adds to a record, compared with an IPv4 one
HOST_V6_EXTRA_BYTES: Final = HOST_V6_BYTES - HOST_V4_BYTES


def encode_host(ip: str, port: int) -> bytes:
    """IPv4 address and port as the 8 bytes stored in a record."""
    parts = ip.split(".")
    if len(parts) != 4 or not all(p.isdigit() and 0 <= int(p) <= 255 for p in parts):
        raise ValueError(f"not an IPv4 address: {ip!r}")
    if not 0 <= port <= 65535:
        raise ValueError(f"port out of range: {port}")
    return bytes(int(p) for p in parts) + port.to_bytes(4, "big")


def encode_address(address: str) -> bytes:
    """``ip:port`` (an IPv4 literal, as :func:`encode_host` takes it) or ``[ipv6]:port`` as a record stores it:
    8 bytes (IPv4 + port) or 20 (IPv6 + port). ValueError says what is wrong: a host name has no bytes to
    store, an IPv6 address needs its brackets, a scope id (``%eth0``) does not fit in the record."""
    if address.startswith("["):
        host, bracket, port_text = address[1:].partition("]:")
        if not bracket:
            raise ValueError(f"an IPv6 address is written [address]:port, got {address!r}")
    else:
        host, _, port_text = address.rpartition(":")
        if ":" in host:
            raise ValueError(f"an IPv6 address needs brackets: [address]:port, got {address!r}")
    try:
        port = int(port_text)
    except ValueError:
        raise ValueError(f"no port number after the host in {address!r}") from None
    if not 0 <= port <= 65535:
        raise ValueError(f"port out of range: {port}")
    if not address.startswith("["):
        if not host.replace(".", "").isdigit():
            raise ValueError(f"{host!r} is not an IP address (a host name has no bytes to store)")
        return encode_host(host, port)
    if "%" in host:
        raise ValueError(f"an IPv6 scope id does not fit in a record: {host!r}")
    try:
        ip = ipaddress.IPv6Address(host)
    except ValueError:
        raise ValueError(f"not an IPv6 address: {host!r}") from None
    if ip.ipv4_mapped is not None:
        raise ValueError(f"{host!r} is an IPv4-mapped address: write it as IPv4 ({ip.ipv4_mapped}:{port})")
    return ip.packed + port.to_bytes(4, "big")


def encode_peer(host: str, port: int) -> bytes:
    """A connection's peer as a record's born host: 8 bytes for IPv4 (an IPv4-mapped IPv6 address too, as
    a dual-stack socket reports an IPv4 client), 20 for IPv6 (its scope id dropped). ValueError for what is
    not an IP address or a port."""
    try:
        ip = ipaddress.ip_address(host.strip("[]").partition("%")[0])
    except ValueError:
        raise ValueError(f"not an IP address: {host!r}") from None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if not 0 <= port <= 65535:
        raise ValueError(f"port out of range: {port}")
    return ip.packed + port.to_bytes(4, "big")


def format_address(raw: bytes) -> str:
    """The canonical ``ip:port`` / ``[ipv6]:port`` of 8 or 20 stored host bytes (IPv6 compressed, lower
    case): :func:`encode_address` of it gives ``raw`` back."""
    host, port = decode_host(raw)
    if len(raw) == HOST_V6_BYTES:
        return f"[{ipaddress.IPv6Address(raw[:16]).compressed}]:{port}"
    return f"{host}:{port}"


def decode_host(raw: bytes) -> tuple[str, int]:
    if len(raw) == 8:
        return ".".join(str(b) for b in raw[:4]), int.from_bytes(raw[4:], "big")
    if len(raw) == 20:
        groups = [raw[i : i + 2].hex() for i in range(0, 16, 2)]
        return ":".join(groups), int.from_bytes(raw[16:], "big")
    raise ValueError(f"host must be 8 or 20 bytes, got {len(raw)}")


def encode_message_id(store_host: bytes, physical_offset: int) -> str:
    """RocketMQ's store-based message id: hex(storeHost + physical offset), upper case: 32 characters for
    an IPv4 store host, 56 for an IPv6 one (MessageDecoder.createMessageId)."""
    return (store_host + physical_offset.to_bytes(8, "big", signed=True)).hex().upper()


def decode_message_id(msg_id: str) -> tuple[bytes, int]:
    """(store host bytes, physical offset) from a store-based message id, 32 hex characters (IPv4 store host)
    or 56 (IPv6) as MessageDecoder.decodeMessageId reads it; ValueError if malformed."""
    if len(msg_id) not in (32, 56):
        raise ValueError(f"message id must be 32 or 56 hex characters, got {len(msg_id)}")
    raw = bytes.fromhex(msg_id)
    return raw[:-8], int.from_bytes(raw[-8:], "big", signed=True)
