"""A Toxiproxy-compatible server (asyncio, stdlib only), for machines where the real one (Go) cannot
be installed. It speaks the Toxiproxy HTTP API (see :mod:`chaos.toxiproxy_api`) and proxies TCP on
127.0.0.1 with the toxics of :mod:`chaos.toxics`.

    python -m chaos.toxiproxy_server --host 127.0.0.1 --port 8474 [--seed N]

prints one JSON line ``{"event": "listening", "host": ..., "port": ..., "seed": ...}`` once the API
accepts connections (``--port 0`` picks a free port) and stops cleanly on SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import random
import secrets
import signal
import sys
import traceback
from collections.abc import Sequence

from chaos.toxics import Clock, LoopClock
from chaos.toxiproxy_api import ApiResponse, ToxiproxyApi
from chaos.toxiproxy_http import HttpError, RequestParser, encode_response
from chaos.toxiproxy_limits import ToxiproxyLimits
from protocol.invariant import invariant

_JSON = "application/json"


class ToxiproxyServer:
    """The API listener and the proxies it manages. ``stop`` closes every listener and connection and
    returns once every task this server started has finished."""

    def __init__(
        self,
        rng: random.Random,
        clock: Clock | None = None,
        limits: ToxiproxyLimits | None = None,
    ) -> None:
        self.limits = limits or ToxiproxyLimits()
        self.limits.validate()
        self.api = ToxiproxyApi(rng, clock or LoopClock(), self.limits, self._fail)
        #: the first programmer error seen in a connection (the process must not carry on after it)
        self.failure: BaseException | None = None
        self.failed = asyncio.Event()
        self._listener: asyncio.Server | None = None
        self._accepting = False
        self._api_tasks: set[asyncio.Task[None]] = set()
        self.host = ""
        self.port = 0

    async def start(self, host: str = "127.0.0.1", port: int = 8474) -> tuple[str, int]:
        invariant(self._listener is None, "server started twice")
        self._listener = await asyncio.start_server(
            self._accept, host, port, limit=self.limits.http.head_size_max_bytes, reuse_address=True
        )
        self._accepting = True
        self.host, self.port = self._listener.sockets[0].getsockname()[:2]
        return self.host, self.port

    async def stop(self) -> None:
        self._accepting = False
        if self._listener is not None:
            self._listener.close()
        while self._api_tasks:
            tasks = list(self._api_tasks)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        await self.api.close()
        if self._listener is not None:
            await self._listener.wait_closed()
            self._listener = None

    def _fail(self, error: BaseException) -> None:
        if self.failure is None:
            self.failure = error
            self.failed.set()

    def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # a plain callback: asyncio would run a coroutine callback as a task nobody tracks
        if not self._accepting or len(self._api_tasks) >= self.limits.api_connections_max:
            writer.transport.abort()
            return
        task = asyncio.get_running_loop().create_task(self._serve(reader, writer), name="toxiproxy api")
        self._api_tasks.add(task)
        task.add_done_callback(functools.partial(self._api_task_done, writer))

    def _api_task_done(self, writer: asyncio.StreamWriter, task: asyncio.Task[None]) -> None:
        self._api_tasks.discard(task)
        writer.transport.abort()  # a no-op after _serve closed it; a task cancelled before it ran did not
        if task.cancelled():
            return
        error = task.exception()
        if error is not None:
            self._fail(error)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Requests one after the other on one connection, until it closes, idles or errs."""
        parser = RequestParser(self.limits.http)
        try:
            while True:
                try:
                    request = parser.next_request()
                except HttpError as error:
                    body = json.dumps({"error": error.message, "status": error.status}).encode()
                    writer.write(encode_response(error.status, body, _JSON, keep_alive=False))
                    await writer.drain()
                    return
                if request is None:
                    async with asyncio.timeout(self.limits.api_idle_timeout_s):
                        data = await reader.read(self.limits.read_size_max_bytes)
                    if not data:
                        return
                    parser.feed(data)
                    continue
                response = await self.api.handle(request)
                writer.write(_encode(response, request.keep_alive))
                await writer.drain()
                if not request.keep_alive:
                    return
        except (OSError, TimeoutError):
            return  # the client went away or idled out
        finally:
            writer.close()
            try:
                async with asyncio.timeout(self.limits.close_flush_timeout_s):
                    await writer.wait_closed()
            except (OSError, TimeoutError):
                writer.transport.abort()


def _encode(response: ApiResponse, keep_alive: bool) -> bytes:
    if response.body is None:
        return encode_response(response.status, keep_alive=keep_alive)
    body = json.dumps(response.body).encode()
    return encode_response(response.status, body, _JSON, keep_alive)


async def serve(host: str, port: int, seed: int) -> int:
    """Run until SIGTERM or SIGINT (exit status 0) or a programmer error (1)."""
    server = ToxiproxyServer(random.Random(seed))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signal_number in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signal_number, stop.set)
    try:
        bound_host, bound_port = await server.start(host, port)
        line = {"event": "listening", "host": bound_host, "port": bound_port, "seed": seed}
        print(json.dumps(line), flush=True)
        stopped = loop.create_task(stop.wait())
        failed = loop.create_task(server.failed.wait())
        await asyncio.wait({stopped, failed}, return_when=asyncio.FIRST_COMPLETED)
        for task in (stopped, failed):
            task.cancel()
        await asyncio.gather(stopped, failed, return_exceptions=True)
    finally:
        await server.stop()
    if server.failure is not None:
        traceback.print_exception(server.failure, file=sys.stderr)
        return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m chaos.toxiproxy_server", description="A Toxiproxy-compatible server."
    )
    parser.add_argument("--host", default="127.0.0.1", help="address of the HTTP API (proxies use 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8474, help="port of the HTTP API; 0 picks a free one")
    parser.add_argument("--seed", type=int, default=None, help="seed of jitter, toxicity and slicing")
    arguments = parser.parse_args(argv)
    seed = arguments.seed if arguments.seed is not None else secrets.randbits(32)
    return asyncio.run(serve(arguments.host, arguments.port, seed))


if __name__ == "__main__":
    sys.exit(main())
