"""Whitelist patterns as RocketMQ's RemoteAddressStrategyFactory reads them."""

from __future__ import annotations

import pytest

from broker.acl.addresses import compile_pattern, normalize_host
from broker.acl.permissions import AclConfigError

MATCHES = [
    ("*", "10.1.2.3", True),
    ("*.*.*.*", "::1", True),
    ("*:*:*:*:*:*:*:*", "192.168.0.1", True),
    ("", "10.1.2.3", False),
    ("   ", "10.1.2.3", False),
    ("10.1.2.3", "10.1.2.3", True),
    ("10.1.2.3", "10.1.2.4", False),
    ("10.1.2.3", "::ffff:10.1.2.3", True),  # an IPv4-mapped peer on a dual-stack socket
    ("::1", "0:0:0:0:0:0:0:1", True),
    ("::1", "[::1]", True),
    ("192.168.0.{1,2,3}", "192.168.0.2", True),
    ("192.168.0.{1,2,3}", "192.168.0.4", False),
    ("fe80::{1,2}", "fe80::2", True),
    ("10.0.0.1,10.0.0.2", "10.0.0.2", True),
    ("10.0.0.1,10.0.0.2", "10.0.0.3", False),
    ("192.168.*.*", "192.168.200.9", True),
    ("192.168.*.*", "192.169.0.1", False),
    ("192.*.*.*", "192.0.0.0", True),
    ("192.168.1.*", "192.168.1.255", True),
    ("192.168.1.10-20", "192.168.1.10", True),
    ("192.168.1.10-20", "192.168.1.20", True),
    ("192.168.1.10-20", "192.168.1.21", False),
    ("10.1-9.*.*", "10.9.1.1", True),
    ("10.1-9.*.*", "10.10.1.1", False),
    ("192.168.*.*", "::1", False),
    ("192.168.*.*", "not-an-address", False),
    ("10.1.2.3", "not-an-address", False),
]


@pytest.mark.parametrize(("pattern", "host", "expected"), MATCHES)
def test_pattern_matches(pattern: str, host: str, expected: bool) -> None:
    assert compile_pattern(pattern).match(host) is expected


@pytest.mark.parametrize("pattern", [
    "10.1.2", "10.1.2.256", "300.*.*.*", "*.1.2.3", "10.*.2.3", "10.1-2.3.*", "10.5-1.*.*", "10.1.2.{}",
    "10.1.{2}.3", "fe80::*", "fe80::1-5", "a,b", "host.example", "10.1.2.3-", "10.1.2.-3",
])
def test_malformed_patterns_are_rejected_by_name(pattern: str) -> None:
    with pytest.raises(AclConfigError, match="whitelist"):
        compile_pattern(pattern)


def test_non_string_pattern_is_rejected() -> None:
    with pytest.raises(AclConfigError):
        compile_pattern(5)


def test_normalize_host() -> None:
    assert normalize_host("::ffff:127.0.0.1") == "127.0.0.1"
    assert normalize_host("[0:0::1]") == "::1"
    assert normalize_host("fe80::1%eth0") == "fe80::1"
    assert normalize_host("localhost") == "localhost"
