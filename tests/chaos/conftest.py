"""Fixtures: one Toxiproxy-compatible server on a background event loop for the whole session (each
test starts from no proxies), and echo servers per test. Teardown proves every task was cleaned up."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from toxiproxy import Toxiproxy

from chaos.toxiproxy_server import ToxiproxyServer
from tests.chaos.helpers import BackgroundLoop, EchoServer

SEED = 20240611


@pytest.fixture(scope="session")
def background() -> Iterator[BackgroundLoop]:
    loop = BackgroundLoop()
    loop.start()
    try:
        yield loop
    finally:
        loop.stop()


@pytest.fixture(scope="session")
def toxiproxy_server(background: BackgroundLoop) -> Iterator[ToxiproxyServer]:
    server = ToxiproxyServer(random.Random(SEED))
    background.run(server.start("127.0.0.1", 0))
    try:
        yield server
    finally:
        background.run(server.stop())
        assert background.other_tasks() == [], "tasks left behind by the server"
    assert server.failure is None, f"the server failed: {server.failure!r}"


@pytest.fixture
def toxiproxy(toxiproxy_server: ToxiproxyServer) -> Iterator[Any]:
    """toxiproxy-python's client pointed at the session's server; every proxy deleted afterwards."""
    client = Toxiproxy()
    client.update_api_consumer(toxiproxy_server.host, toxiproxy_server.port)
    yield client
    client.update_api_consumer(toxiproxy_server.host, toxiproxy_server.port)
    client.destroy_all()
    assert toxiproxy_server.failure is None, f"the server failed: {toxiproxy_server.failure!r}"


@pytest.fixture
def echo_factory(background: BackgroundLoop) -> Iterator[Callable[[bytes], EchoServer]]:
    servers: list[EchoServer] = []

    def start(banner: bytes = b"") -> EchoServer:
        server = EchoServer(banner)
        servers.append(server)
        background.run(server.start())
        return server

    yield start
    for server in servers:
        background.run(server.stop())


@pytest.fixture
def echo(echo_factory: Callable[[bytes], EchoServer]) -> EchoServer:
    return echo_factory(b"")
