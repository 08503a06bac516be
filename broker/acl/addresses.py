"""IP whitelist patterns as RocketMQ's ``RemoteAddressStrategyFactory`` reads them.

=====================================  =========================================================
pattern                                matches
=====================================  =========================================================
``""`` (blank)                         nothing
``*``, ``*.*.*.*``, ``*:*:*:*:*:*:*:*``  every address
``192.168.0.{1,2,3}``                  the listed last parts (IPv6: ``fe80::{1,2}``)
``10.0.0.1,10.0.0.2``                  the listed addresses
``192.168.*.*``, ``192.*.*.*``         a wildcard part and everything after it
``192.168.1.1-100``, ``10.1-9.*.*``    a range in one part (0..255), everything after it
``10.0.0.1``, ``::1``                  that address
=====================================  =========================================================

Ranges and wildcards are IPv4 only here (RocketMQ also reads them in IPv6 addresses; this module
rejects such a pattern rather than guess). Where RocketMQ silently ignores the parts after a range
(``10.1-9.5.5`` means ``10.1-9.*.*``), this module asks for ``*`` there, so a pattern means what it says.
An IPv4-mapped IPv6 peer (``::ffff:10.0.0.1``) is matched as its IPv4 address.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Final

from broker.acl.permissions import AclConfigError

_MATCH_ALL: Final = frozenset({"*", "*.*.*.*", "*:*:*:*:*:*:*:*"})
_IPV4_PARTS: Final = 4
_PART_MAX: Final = 255


def normalize_host(host: str) -> str:
    """The canonical text of an address (IPv6 compressed and lower case, IPv4-mapped as IPv4); a host
    that is not an IP address is returned as it is (it matches only the pattern ``*``)."""
    text = host.strip().strip("[]")
    try:
        address = ipaddress.ip_address(text.split("%", 1)[0])
    except ValueError:
        return text
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return str(address.ipv4_mapped)
    return str(address)


def _single(text: str, pattern: str) -> str:
    try:
        return str(ipaddress.ip_address(text.strip()))
    except ValueError:
        raise AclConfigError(f"whitelist {pattern!r}: {text.strip()!r} is not an IP address") from None


def _part(text: str, pattern: str) -> int:
    text = text.strip()
    if not text.isdigit() or int(text) > _PART_MAX:
        raise AclConfigError(f"whitelist {pattern!r}: {text!r} is not a number in 0..255")
    return int(text)


@dataclass(frozen=True, slots=True)
class AddressPattern:
    """One compiled whitelist entry: ``match(host)`` says whether a peer's address is covered."""

    text: str
    everything: bool = False
    addresses: frozenset[str] = frozenset()
    #: IPv4 range: the fixed leading parts, then the range of the next part (the rest is free)
    prefix: tuple[int, ...] = ()
    low: int = 0
    high: int = -1

    def match(self, host: str) -> bool:
        if self.everything:
            return True
        address = normalize_host(host)
        if self.addresses:
            return address in self.addresses
        if self.high < 0:
            return False
        parts = address.split(".")
        if len(parts) != _IPV4_PARTS or not all(part.isdigit() for part in parts):
            return False
        numbers = [int(part) for part in parts]
        index = len(self.prefix)
        return tuple(numbers[:index]) == self.prefix and self.low <= numbers[index] <= self.high


def compile_pattern(text: object) -> AddressPattern:
    """A whitelist pattern (see the module docstring); :class:`AclConfigError` when it is malformed."""
    if not isinstance(text, str):
        raise AclConfigError(f"a whitelist pattern must be a string, got {text!r}")
    pattern = text.strip()
    if not pattern:
        return AddressPattern(text)
    if pattern in _MATCH_ALL:
        return AddressPattern(text, everything=True)
    if pattern.endswith("}"):
        head, brace, tail = pattern.partition("{")
        if not brace or "{" in tail or not (head.endswith(".") or head.endswith(":")):
            raise AclConfigError(f"whitelist {pattern!r}: use a.b.c.{{1,2}} (braces around the last part)")
        choices = [choice for choice in tail[:-1].split(",") if choice.strip()]
        if not choices:
            raise AclConfigError(f"whitelist {pattern!r}: no address inside the braces")
        return AddressPattern(text, addresses=frozenset(_single(head + choice, pattern) for choice in choices))
    if "," in pattern:
        return AddressPattern(text, addresses=frozenset(
            _single(each, pattern) for each in pattern.split(",") if each.strip()))
    if "*" in pattern or "-" in pattern:
        if ":" in pattern:
            raise AclConfigError(f"whitelist {pattern!r}: IPv6 ranges and wildcards are not supported")
        return _compile_range(text, pattern)
    return AddressPattern(text, addresses=frozenset({_single(pattern, pattern)}))


def _compile_range(text: str, pattern: str) -> AddressPattern:
    parts = [part.strip() for part in pattern.split(".")]
    if len(parts) != _IPV4_PARTS:
        raise AclConfigError(f"whitelist {pattern!r}: an IPv4 pattern has 4 parts")
    for index, part in enumerate(parts):
        if part == "*" or "-" in part:
            if index == 0:
                raise AclConfigError(f"whitelist {pattern!r}: the first part cannot be a range (use '*')")
            if any(rest != "*" for rest in parts[index + 1:]):
                raise AclConfigError(f"whitelist {pattern!r}: the parts after a range or '*' must be '*'")
            prefix = tuple(_part(each, pattern) for each in parts[:index])
            if part == "*":
                return AddressPattern(text, prefix=prefix, low=0, high=_PART_MAX)
            low_text, _, high_text = part.partition("-")
            low, high = _part(low_text, pattern), _part(high_text, pattern)
            if low > high:
                raise AclConfigError(f"whitelist {pattern!r}: range {low}-{high} is empty")
            return AddressPattern(text, prefix=prefix, low=low, high=high)
    raise AclConfigError(f"whitelist {pattern!r}: not an address, list, range or wildcard")  # pragma: no cover
