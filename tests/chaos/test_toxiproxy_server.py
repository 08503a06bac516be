"""The Toxiproxy-compatible server, driven only through toxiproxy-python (the contract) and plain
sockets through its proxies to an echo server. Timings are lower bounds only: the machine is shared."""

from __future__ import annotations

import json
import random
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from toxiproxy.api import APIConsumer
from toxiproxy.exceptions import InvalidToxic, NotFound, ProxyExists

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
from tests.support.waiting import wait_for


def port_of(proxy: Any) -> int:
    return int(proxy.listen.rpartition(":")[2])


def error_of(raised: pytest.ExceptionInfo[Exception]) -> dict[str, object]:
    """The JSON body toxiproxy-python put in the exception it raised for an error status."""
    body: dict[str, object] = json.loads(raised.value.args[0])
    return body


def test_version_and_no_proxies(toxiproxy: Any) -> None:
    assert json.loads(toxiproxy.version())["version"]
    assert toxiproxy.proxies() == {}
    assert toxiproxy.running()


def test_create_list_get_delete(toxiproxy: Any, echo: EchoServer) -> None:
    proxy = toxiproxy.create(upstream=echo.address, name="alpha")
    assert proxy.enabled is True
    assert proxy.listen.startswith("127.0.0.1:") and port_of(proxy) > 0
    assert proxy.upstream == echo.address
    listed = toxiproxy.proxies()
    assert list(listed) == ["alpha"]
    assert listed["alpha"].listen == proxy.listen
    assert toxiproxy.get_proxy("alpha").upstream == echo.address
    shown = APIConsumer.get("/proxies/alpha").json()
    assert shown == {
        "name": "alpha",
        "listen": proxy.listen,
        "upstream": echo.address,
        "enabled": True,
        "toxics": [],
    }
    with connect(port_of(proxy)) as connection:
        echo_round_trip_seconds(connection, b"hello")

    assert toxiproxy.destroy(proxy) is True
    assert toxiproxy.proxies() == {}
    assert refuses_connections(port_of(proxy))
    with pytest.raises(NotFound):
        APIConsumer.get("/proxies/alpha")


def test_created_disabled_on_a_chosen_port(toxiproxy: Any, echo: EchoServer) -> None:
    (port,) = free_ports(1)
    proxy = toxiproxy.create(upstream=echo.address, name="chosen", listen=f"127.0.0.1:{port}", enabled=False)
    assert proxy.listen == f"127.0.0.1:{port}" and proxy.enabled is False
    assert refuses_connections(port)
    proxy.enable()
    assert toxiproxy.get_proxy("chosen").enabled is True
    with connect(port) as connection:
        echo_round_trip_seconds(connection)


def test_disable_closes_listener_and_connections_enable_reopens(toxiproxy: Any, echo: EchoServer) -> None:
    proxy = toxiproxy.create(upstream=echo.address, name="door")
    port = port_of(proxy)
    with connect(port) as connection:
        echo_round_trip_seconds(connection)
        proxy.disable()
        assert toxiproxy.get_proxy("door").enabled is False
        data, _ = receive_until_closed(connection)
        assert data == b""
    assert refuses_connections(port)

    proxy.enable()
    assert toxiproxy.get_proxy("door").listen == f"127.0.0.1:{port}"  # the same port again
    with connect(port) as connection:
        echo_round_trip_seconds(connection)
    with proxy.down():
        assert refuses_connections(port)
    with connect(port) as connection:
        echo_round_trip_seconds(connection)


def test_update_upstream_and_listen(toxiproxy: Any, echo_factory: Callable[[bytes], EchoServer]) -> None:
    first, second = echo_factory(b"one"), echo_factory(b"two")
    proxy = toxiproxy.create(upstream=first.address, name="moving")
    port = port_of(proxy)
    with connect(port) as connection:
        assert receive_exactly(connection, 3) == b"one"
        updated = APIConsumer.post("/proxies/moving", json={"upstream": second.address}).json()
        assert updated["upstream"] == second.address and updated["enabled"] is True
        assert receive_until_closed(connection)[0] == b""  # a new upstream restarts the proxy
    with connect(port) as connection:
        assert receive_exactly(connection, 3) == b"two"

    (new_port,) = free_ports(1)
    updated = APIConsumer.post("/proxies/moving", json={"listen": f"127.0.0.1:{new_port}"}).json()
    assert updated["listen"] == f"127.0.0.1:{new_port}"
    assert refuses_connections(port)
    with connect(new_port) as connection:
        assert receive_exactly(connection, 3) == b"two"


def test_latency_delays_each_direction(toxiproxy: Any, echo: EchoServer) -> None:
    proxy = toxiproxy.create(upstream=echo.address, name="slow")
    with connect(port_of(proxy)) as connection:
        echo_round_trip_seconds(connection)
        proxy.add_toxic(type="latency", attributes={"latency": 300})  # downstream by default
        assert "latency_downstream" in proxy.toxics()
        assert echo_round_trip_seconds(connection) >= 0.3

        proxy.destroy_toxic("latency_downstream")
        proxy.add_toxic(type="latency", stream="upstream", attributes={"latency": 100})
        proxy.add_toxic(type="latency", stream="downstream", attributes={"latency": 200, "jitter": 50})
        assert echo_round_trip_seconds(connection) >= 0.1 + 0.2 - 0.05


def test_removing_a_toxic_releases_what_it_holds(toxiproxy: Any, echo: EchoServer) -> None:
    proxy = toxiproxy.create(upstream=echo.address, name="released")
    proxy.add_toxic(type="latency", attributes={"latency": 60_000})  # far beyond any wait here
    with connect(port_of(proxy)) as connection:
        connection.sendall(b"held")
        wait_for(lambda: echo.received_bytes == 4, "the echo server to answer", timeout_seconds=10.0)
        proxy.destroy_toxic("latency_downstream")
        assert receive_exactly(connection, 4) == b"held"


def test_chained_toxics_keep_the_stream_intact(toxiproxy: Any, echo: EchoServer) -> None:
    proxy = toxiproxy.create(upstream=echo.address, name="chained")
    for stream in ("upstream", "downstream"):
        proxy.add_toxic(type="latency", stream=stream, attributes={"latency": 20, "jitter": 10})
        proxy.add_toxic(type="slicer", stream=stream, attributes={"average_size": 500, "size_variation": 200})
        proxy.add_toxic(type="bandwidth", stream=stream, attributes={"rate": 2000})
    payload = random.Random(3).randbytes(300_000)
    with connect(port_of(proxy)) as connection:
        sender = threading.Thread(target=connection.sendall, args=(payload,))
        sender.start()
        try:
            assert receive_exactly(connection, len(payload)) == payload
        finally:
            sender.join(10.0)


def test_bandwidth_limits_the_rate(toxiproxy: Any, echo: EchoServer) -> None:
    proxy = toxiproxy.create(upstream=echo.address, name="narrow")
    proxy.add_toxic(type="bandwidth", attributes={"rate": 50})  # 50 KB/s downstream
    payload = random.Random(1).randbytes(25_000)
    with connect(port_of(proxy)) as connection:
        started = time.monotonic()
        connection.sendall(payload)
        assert receive_exactly(connection, len(payload)) == payload
        assert time.monotonic() - started >= len(payload) / 50_000


def test_timeout_drops_data_then_closes(toxiproxy: Any, echo: EchoServer) -> None:
    proxy = toxiproxy.create(upstream=echo.address, name="black-hole")
    proxy.add_toxic(type="timeout", attributes={"timeout": 300})
    with connect(port_of(proxy)) as connection:
        started = time.monotonic()
        connection.sendall(b"anyone there?")
        data, _ = receive_until_closed(connection)
        assert data == b""
        assert time.monotonic() - started >= 0.3


def test_timeout_zero_holds_until_removed(toxiproxy: Any, echo: EchoServer) -> None:
    proxy = toxiproxy.create(upstream=echo.address, name="held")
    proxy.add_toxic(type="timeout", stream="upstream", attributes={"timeout": 0})
    with connect(port_of(proxy)) as connection:
        connection.sendall(b"lost")
        assert receives_nothing_for(connection, 0.3)
        assert echo.received_bytes == 0
        # removing a timeout toxic closes the connections it held (Toxiproxy's cleanup)
        proxy.destroy_toxic("timeout_upstream")
        assert receive_until_closed(connection)[0] == b""
    with connect(port_of(proxy)) as connection:
        echo_round_trip_seconds(connection)


def test_reset_peer_resets_the_connection(toxiproxy: Any, echo: EchoServer) -> None:
    proxy = toxiproxy.create(upstream=echo.address, name="rude")
    with connect(port_of(proxy)) as connection:
        echo_round_trip_seconds(connection)
        proxy.add_toxic(type="reset_peer", attributes={"timeout": 200})
        started = time.monotonic()
        connection.sendall(b"hello")
        assert receive_until_closed(connection) == (b"", "reset")
        assert time.monotonic() - started >= 0.2


def test_slicer_delivers_data_intact(toxiproxy: Any, echo: EchoServer) -> None:
    proxy = toxiproxy.create(upstream=echo.address, name="sliced")
    for stream in ("upstream", "downstream"):
        attributes = {"average_size": 64, "size_variation": 16, "delay": 100}
        proxy.add_toxic(type="slicer", stream=stream, attributes=attributes)
    payload = random.Random(2).randbytes(20_000)
    with connect(port_of(proxy)) as connection:
        connection.sendall(payload)
        assert receive_exactly(connection, len(payload)) == payload


def test_limit_data_closes_after_the_limit(toxiproxy: Any, echo: EchoServer) -> None:
    proxy = toxiproxy.create(upstream=echo.address, name="limited")
    proxy.add_toxic(type="limit_data", attributes={"bytes": 10})
    with connect(port_of(proxy)) as connection:
        connection.sendall(b"0123456789abcdefghij")
        assert receive_until_closed(connection) == (b"0123456789", "eof")


def test_toxicity_zero_never_applies(toxiproxy: Any, echo: EchoServer) -> None:
    proxy = toxiproxy.create(upstream=echo.address, name="harmless")
    proxy.add_toxic(type="timeout", toxicity=0.0, attributes={"timeout": 0})
    assert proxy.get_toxic("timeout_downstream").toxicity == 0.0
    for _ in range(5):
        with connect(port_of(proxy)) as connection:
            echo_round_trip_seconds(connection)


def test_toxic_update_merges_attributes(toxiproxy: Any, echo: EchoServer) -> None:
    proxy = toxiproxy.create(upstream=echo.address, name="tuned")
    proxy.add_toxic(type="latency", attributes={"latency": 5000, "jitter": 10})
    updated = APIConsumer.post(
        "/proxies/tuned/toxics/latency_downstream", json={"attributes": {"latency": 0}}
    ).json()
    assert updated == {
        "name": "latency_downstream",
        "type": "latency",
        "stream": "downstream",
        "toxicity": 1.0,
        "attributes": {"latency": 0, "jitter": 10},
    }
    assert APIConsumer.get("/proxies/tuned").json()["toxics"] == [updated]
    with connect(port_of(proxy)) as connection:
        echo_round_trip_seconds(connection)  # would take 5 s with the old latency


def test_reset_enables_everything_and_removes_toxics(toxiproxy: Any, echo: EchoServer) -> None:
    off = toxiproxy.create(upstream=echo.address, name="off")
    poisoned = toxiproxy.create(upstream=echo.address, name="poisoned")
    off.disable()
    poisoned.add_toxic(type="timeout", stream="upstream", attributes={"timeout": 0})
    poisoned.add_toxic(type="latency", attributes={"latency": 5000})
    assert toxiproxy.reset() is True
    for name, proxy in toxiproxy.proxies().items():
        assert proxy.enabled is True, name
        assert proxy.toxics() == {}, name
        with connect(port_of(proxy)) as connection:
            echo_round_trip_seconds(connection)


def test_bad_input_is_refused_with_toxiproxy_errors(toxiproxy: Any, echo: EchoServer) -> None:
    proxy = toxiproxy.create(upstream=echo.address, name="strict")

    with pytest.raises(InvalidToxic) as raised:
        proxy.add_toxic(type="earthquake")
    assert error_of(raised) == {"error": "invalid toxic type", "status": 400}
    with pytest.raises(InvalidToxic) as raised:
        proxy.add_toxic(type="latency", stream="sideways")
    assert error_of(raised)["status"] == 400
    with pytest.raises(InvalidToxic):
        proxy.add_toxic(type="latency", attributes={"latancy": 100})  # misspelt
    with pytest.raises(InvalidToxic):
        proxy.add_toxic(type="latency", toxicity=1.5)
    with pytest.raises(InvalidToxic):
        proxy.add_toxic(type="slicer", attributes={"average_size": 4, "size_variation": 4})
    proxy.add_toxic(type="latency", attributes={"latency": 1})
    with pytest.raises(ProxyExists) as raised:
        proxy.add_toxic(type="latency", attributes={"latency": 2})
    assert error_of(raised) == {"error": "toxic already exists", "status": 409}

    with pytest.raises(ProxyExists):
        toxiproxy.create(upstream=echo.address, name="strict")  # the client checks first
    with pytest.raises(ProxyExists) as raised:
        APIConsumer.post("/proxies", json={"name": "strict", "upstream": echo.address})
    assert error_of(raised) == {"error": "proxy already exists", "status": 409}

    with pytest.raises(InvalidToxic) as raised:
        APIConsumer.post("/proxies", data=b'{"name": "broken", ')
    assert error_of(raised)["status"] == 400
    assert str(error_of(raised)["error"]).startswith("bad request body")
    with pytest.raises(InvalidToxic) as raised:
        APIConsumer.post("/proxies", json={"name": "no-upstream"})
    assert error_of(raised) == {"error": "missing required field: upstream", "status": 400}
    with pytest.raises(InvalidToxic):
        APIConsumer.post("/proxies", json={"name": "public", "upstream": echo.address, "listen": "0.0.0.0:0"})
    with pytest.raises(InvalidToxic):
        APIConsumer.post("/proxies/strict", json={"enabled": "yes"})

    with pytest.raises(NotFound) as raised:
        APIConsumer.get("/proxies/missing")
    assert error_of(raised) == {"error": "proxy not found", "status": 404}
    with pytest.raises(NotFound):
        APIConsumer.post("/proxies/missing/toxics", json={"type": "latency"})
    with pytest.raises(NotFound) as raised:
        proxy.destroy_toxic("missing")
    assert error_of(raised) == {"error": "toxic not found", "status": 404}
    assert list(toxiproxy.proxies()) == ["strict"]  # nothing was created by the refused requests


def test_a_proxy_to_nowhere_closes_its_clients(toxiproxy: Any) -> None:
    (dead_port,) = free_ports(1)
    proxy = toxiproxy.create(upstream=f"127.0.0.1:{dead_port}", name="nowhere")
    with connect(port_of(proxy)) as connection:
        connection.sendall(b"hello?")
        data, _ = receive_until_closed(connection)
        assert data == b""


def test_half_close_is_forwarded(toxiproxy: Any, echo: EchoServer) -> None:
    proxy = toxiproxy.create(upstream=echo.address, name="polite")
    with connect(port_of(proxy)) as connection:
        connection.sendall(b"last words")
        connection.shutdown(socket.SHUT_WR)
        assert receive_until_closed(connection) == (b"last words", "eof")
