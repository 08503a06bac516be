"""Test helpers for the Toxiproxy-compatible server: an event loop on a thread (the server and the echo
servers live there, the blocking test code and toxiproxy-python talk to them), an echo server, and
blocking sockets with deadlines (no sleeps: every wait is a recv with a deadline)."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Coroutine
from typing import Any, Literal, TypeVar

T = TypeVar("T")
LOOPBACK = "127.0.0.1"
#: any single wait in these tests ends within this, so a hang fails the test, not the suite
WAIT_SECONDS = 10.0

Ending = Literal["eof", "reset"]


class BackgroundLoop:
    """An asyncio event loop running on its own thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="chaos-test-loop", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def run(self, coroutine: Coroutine[Any, Any, T], timeout_seconds: float = WAIT_SECONDS) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout_seconds)

    def other_tasks(self) -> list[asyncio.Task[Any]]:
        """Tasks alive on the loop, besides the one asking."""

        async def collect() -> list[asyncio.Task[Any]]:
            return [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]

        return self.run(collect())

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(WAIT_SECONDS)
        self.loop.close()


class EchoServer:
    """Echoes every byte back; sends ``banner`` first if given; closes its side on end of stream."""

    def __init__(self, banner: bytes = b"") -> None:
        self.banner = banner
        self.port = 0
        self.received_bytes = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._accept, LOOPBACK, 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    @property
    def address(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.get_running_loop().create_task(self._echo(reader, writer))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _echo(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            if self.banner:
                writer.write(self.banner)
            while data := await reader.read(65536):
                self.received_bytes += len(data)
                writer.write(data)
                await writer.drain()
        except OSError:
            pass
        finally:
            writer.transport.abort()

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()


def connect(port: int) -> socket.socket:
    connection = socket.create_connection((LOOPBACK, port), timeout=WAIT_SECONDS)
    connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return connection


def refuses_connections(port: int) -> bool:
    try:
        with socket.create_connection((LOOPBACK, port), timeout=WAIT_SECONDS):
            return False
    except ConnectionRefusedError:
        return True


def receive_exactly(connection: socket.socket, size: int, timeout_seconds: float = WAIT_SECONDS) -> bytes:
    deadline = time.monotonic() + timeout_seconds
    received = bytearray()
    while len(received) < size:
        connection.settimeout(max(0.001, deadline - time.monotonic()))
        data = connection.recv(size - len(received))
        if not data:
            raise AssertionError(f"connection closed after {len(received)} of {size} bytes")
        received += data
    return bytes(received)


def receive_until_closed(
    connection: socket.socket, timeout_seconds: float = WAIT_SECONDS
) -> tuple[bytes, Ending]:
    """Everything the peer sends until it closes, and how it closed (FIN or RST)."""
    deadline = time.monotonic() + timeout_seconds
    received = bytearray()
    while True:
        connection.settimeout(max(0.001, deadline - time.monotonic()))
        try:
            data = connection.recv(65536)
        except ConnectionResetError:
            return bytes(received), "reset"
        if not data:
            return bytes(received), "eof"
        received += data


def receives_nothing_for(connection: socket.socket, seconds: float) -> bool:
    """True if the connection stays open and silent for ``seconds`` (checking an absence takes time)."""
    connection.settimeout(seconds)
    try:
        data = connection.recv(1)
    except TimeoutError:
        return True
    finally:
        connection.settimeout(WAIT_SECONDS)
    raise AssertionError(f"expected silence, got {data!r}")


def echo_round_trip_seconds(connection: socket.socket, payload: bytes = b"ping") -> float:
    started = time.monotonic()
    connection.sendall(payload)
    assert receive_exactly(connection, len(payload)) == payload
    return time.monotonic() - started
