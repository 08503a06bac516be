"""Addresses with host names and IPv6 literals: parsing, config errors, resolution at connect time, and a
Raft group addressed by a name and by ``[::1]``."""

from __future__ import annotations

import re
import socket
import threading
from pathlib import Path

import pytest

from commitlog.config import ConfigError
from dledger.addresses import (
    AddressError,
    HostPort,
    Resolver,
    format_host_port,
    is_host_name,
    resolve_for_bind,
    split_host_port,
)
from dledger.config import parse_address
from tests.dledger.member_group import running_group

SECRET = b"a group secret of enough bytes!!"


@pytest.mark.parametrize(("text", "expected"), [
    ("127.0.0.1:9876", HostPort("127.0.0.1", 9876)),
    ("raftmq-0.raftmq:20010", HostPort("raftmq-0.raftmq", 20010)),
    ("raftmq-0.raftmq.default.svc.cluster.local.:1", HostPort("raftmq-0.raftmq.default.svc.cluster.local.", 1)),
    ("localhost:65535", HostPort("localhost", 65535)),
    ("[::1]:20010", HostPort("::1", 20010)),
    ("[fd00:231::7]:9", HostPort("fd00:231::7", 9)),
    ("[fe80::1%eth0]:9", HostPort("fe80::1%eth0", 9)),
])
def test_addresses_parse_to_host_and_port(text: str, expected: HostPort) -> None:
    assert split_host_port(text) == expected
    assert str(expected) == text


@pytest.mark.parametrize(("text", "message"), [
    ("::1:20010", "an IPv6 host goes between brackets"),
    ("[::1]20010", "must be '[IPv6]:port'"),
    ("[127.0.0.1]:1", "must have an IPv6 address between the brackets"),
    ("[raftmq-0]:1", "must have an IPv6 address between the brackets"),
    ("300.1.1.1:1", "must have an IPv4 address, a host name or a bracketed IPv6 address"),
    ("1.2.3:1", "must have an IPv4 address, a host name"),
    ("under_score:1", "must have an IPv4 address, a host name"),
    ("-leading.dash:1", "must have an IPv4 address, a host name"),
    (f"{'a' * 64}.example:1", "must have an IPv4 address, a host name"),
    (":1", "must have an IPv4 address, a host name"),
    ("host:0", "must have a port in 1..65535"),
    ("host:65536", "must have a port in 1..65535"),
    ("host:http", "must have a port in 1..65535"),
    ("host", "must be 'host:port'"),
    (20010, "must be 'host:port'"),
])
def test_malformed_addresses_are_refused_saying_why(text: object, message: str) -> None:
    with pytest.raises(AddressError, match=re.escape(message)):
        split_host_port(text)


def test_config_errors_name_the_setting() -> None:
    assert parse_address("[::1]:5", "peers[0].raft_address") == ("::1", 5)
    with pytest.raises(ConfigError, match=re.escape("peers[0].raft_address an IPv6 host goes between brackets")):
        parse_address("::1:5", "peers[0].raft_address")


def test_host_names_follow_rfc_1123() -> None:
    assert is_host_name("a") and is_host_name("a-b.c1") and is_host_name("1a.example")
    assert not is_host_name("") and not is_host_name("a..b") and not is_host_name("a-.b")
    assert not is_host_name("10.0.0.1") and not is_host_name("é.example")
    assert not is_host_name("a." * 127 + "ab")  # 256 characters


def test_format_host_port_brackets_ipv6_only() -> None:
    assert format_host_port("::1", 1) == "[::1]:1" and format_host_port("host", 2) == "host:2"


def test_bind_resolution_gives_the_family_of_the_address() -> None:
    assert resolve_for_bind("::1", 5) == (socket.AF_INET6, ("::1", 5))
    assert resolve_for_bind("127.0.0.1", 5) == (socket.AF_INET, ("127.0.0.1", 5))
    family, (ip, port) = resolve_for_bind("localhost", 5)
    assert family in (socket.AF_INET, socket.AF_INET6) and ip in ("127.0.0.1", "::1") and port == 5


def test_the_resolver_looks_a_name_up_on_every_attempt_and_keeps_the_last_answer() -> None:
    answers = {"peer": "10.0.0.1"}
    calls = []

    def lookup(host: str) -> list[tuple[socket.AddressFamily, str]]:
        calls.append(host)
        if host not in answers:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return [(socket.AF_INET, answers[host])]

    resolver = Resolver(wait_seconds=5.0, resolve=lookup)
    assert resolver.resolve("10.9.9.9") == "10.9.9.9" and calls == []  # literals need no lookup
    assert resolver.resolve("peer") == "10.0.0.1"
    answers["peer"] = "10.0.0.2"  # the peer moved: the next attempt finds it at its new address
    assert resolver.resolve("peer") == "10.0.0.2"
    del answers["peer"]  # its name is gone for a while: the last answer is kept, and why is known
    assert resolver.resolve("peer") == "10.0.0.2" and "not known" in resolver.last_error["peer"]
    assert resolver.resolve("never") is None and calls == ["peer", "peer", "peer", "never"]


def test_a_slow_lookup_does_not_hold_the_caller() -> None:
    release = threading.Event()

    def stalled(host: str) -> list[tuple[socket.AddressFamily, str]]:
        release.wait(10)
        return [(socket.AF_INET6, "fd00::9")]

    resolver = Resolver(wait_seconds=0.01, resolve=stalled)
    assert resolver.resolve("slow") is None  # not answered in time: this attempt is skipped
    release.set()
    assert Resolver(wait_seconds=5.0, resolve=stalled).resolve("slow") == "fd00::9"


@pytest.mark.slow
@pytest.mark.parametrize("host", ["localhost", "::1"])
def test_a_group_addressed_by_name_or_ipv6_replicates(tmp_path: Path, host: str) -> None:
    with running_group(tmp_path, secret=SECRET, host=host) as group:
        assert all(member.address.startswith("localhost:" if host == "localhost" else "[::1]:")
                   for member in group.members)
        leader = group.wait_for_leader()
        result = leader.request("propose", timeout_seconds=40, count=50, size=1000, seed=5, timeout=30)
        assert result == {"acked": 50, "errors": {}, "in_flight": 0}
        statuses = group.wait_for_identical_state(50)
        assert len({status["chain"] for status in statuses}) == 1
