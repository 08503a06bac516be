"""ensure_toxiproxy (finding a running server, or starting ours as a process and stopping it) and the
typed fault helpers the chaos scenarios use."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from chaos.toxiproxy_control import (
    ProxyNotFound,
    ToxiproxyHandle,
    add_latency,
    create_proxy,
    delete_proxy,
    ensure_toxiproxy,
    get_proxy,
    heal,
    heal_all,
    limit_bandwidth,
    list_proxies,
    partition,
    reset_peer,
)
from chaos.toxiproxy_server import ToxiproxyServer
from cli.cluster import free_ports
from tests.chaos.helpers import (
    EchoServer,
    connect,
    echo_round_trip_seconds,
    receive_exactly,
    receive_until_closed,
    receives_nothing_for,
    refuses_connections,
)


@pytest.fixture
def handle(toxiproxy: Any, toxiproxy_server: ToxiproxyServer) -> Iterator[ToxiproxyHandle]:
    """A handle to the session's server, found (not started) by ensure_toxiproxy."""
    with ensure_toxiproxy(f"http://127.0.0.1:{toxiproxy_server.port}") as found:
        yield found


def test_ensure_toxiproxy_uses_a_reachable_server(
    handle: ToxiproxyHandle, toxiproxy_server: ToxiproxyServer
) -> None:
    assert not handle.started_here and handle.process is None
    assert handle.port == toxiproxy_server.port
    handle.close()
    assert handle.client().running()  # closing a found server's handle leaves it alone


@pytest.mark.slow
def test_ensure_toxiproxy_starts_and_stops_our_server(
    monkeypatch: pytest.MonkeyPatch, toxiproxy: Any, echo: EchoServer
) -> None:
    (nobody_port,) = free_ports(1)
    monkeypatch.setenv("TOXIPROXY_URL", f"http://127.0.0.1:{nobody_port}")
    with ensure_toxiproxy(seed=7) as started:
        assert (started.started_here, started.seed) == (True, 7)
        assert started.process is not None and started.process.poll() is None
        version = json.loads(started.client().version())
        assert version["implementation"] == "raftmq.chaos"
        proxy = create_proxy(started, "through-a-process", echo.address)
        with connect(proxy.listen_port) as connection:
            echo_round_trip_seconds(connection)
            api_port = started.port
    assert started.returncode == 0  # stopped by SIGTERM, cleanly
    assert not started.started_here  # the handle let go of the process it stopped
    assert refuses_connections(api_port)
    assert refuses_connections(proxy.listen_port)


def test_ensure_toxiproxy_refuses_a_bad_url() -> None:
    with pytest.raises(ValueError):
        ensure_toxiproxy("ftp://127.0.0.1:8474")


def test_create_get_list_delete(handle: ToxiproxyHandle, echo: EchoServer) -> None:
    created = create_proxy(handle, "n1->n2", echo.address)
    assert created.enabled and created.listen_host == "127.0.0.1" and created.listen_port > 0
    assert get_proxy(handle, "n1->n2") == created
    assert list_proxies(handle) == {"n1->n2": created}
    replaced = create_proxy(handle, "n1->n2", echo.address)  # replace=True by default
    assert replaced.name == "n1->n2"
    delete_proxy(handle, "n1->n2")
    delete_proxy(handle, "n1->n2")  # deleting what is not there is fine
    with pytest.raises(ProxyNotFound):
        get_proxy(handle, "n1->n2")


def test_partition_by_disabling_then_heal(handle: ToxiproxyHandle, echo: EchoServer) -> None:
    link = create_proxy(handle, "link", echo.address)
    with connect(link.listen_port) as connection:
        echo_round_trip_seconds(connection)
        partition(handle, "link")
        assert receive_until_closed(connection)[0] == b""
    assert refuses_connections(link.listen_port)
    assert not get_proxy(handle, "link").enabled
    with pytest.raises(ValueError):
        partition(handle, "link", how="disable", streams="upstream")
    heal(handle, "link")
    with connect(link.listen_port) as connection:
        echo_round_trip_seconds(connection)


def test_partition_by_black_hole_then_heal(handle: ToxiproxyHandle, echo: EchoServer) -> None:
    link = create_proxy(handle, "link", echo.address)
    with connect(link.listen_port) as connection:
        echo_round_trip_seconds(connection)
        partition(handle, "link", how="timeout")
        partition(handle, "link", how="timeout")  # again: updated in place, no conflict
        assert sorted(handle.client().get_proxy("link").toxics()) == [
            "partition_downstream",
            "partition_upstream",
        ]
        connection.sendall(b"into the void")
        assert receives_nothing_for(connection, 0.3)
        heal(handle, "link")  # the held connection is closed, not resumed with a hole in it
        assert receive_until_closed(connection)[0] == b""
    with connect(link.listen_port) as connection:
        echo_round_trip_seconds(connection)


def test_latency_bandwidth_reset_helpers(handle: ToxiproxyHandle, echo: EchoServer) -> None:
    link = create_proxy(handle, "link", echo.address)
    with connect(link.listen_port) as connection:
        assert add_latency(handle, "link", 150) == ["latency_upstream", "latency_downstream"]
        assert echo_round_trip_seconds(connection) >= 0.3
        add_latency(handle, "link", 0)  # updated in place
        assert limit_bandwidth(handle, "link", 40, streams="downstream") == ["bandwidth_downstream"]
        payload = bytes(8000)
        started = time.monotonic()
        connection.sendall(payload)
        assert receive_exactly(connection, len(payload)) == payload
        assert time.monotonic() - started >= len(payload) / 40_000
        reset_peer(handle, "link", streams="downstream")
        connection.sendall(b"bye")
        assert receive_until_closed(connection) == (b"", "reset")
    heal_all(handle)
    assert handle.client().get_proxy("link").toxics() == {}
