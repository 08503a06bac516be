"""One Toxiproxy proxy: a listener on 127.0.0.1, and per accepted client a connection to the upstream
whose two directions each run through that direction's chain of toxic stages.

Ordering rules:

- a direction reads chunks into a bounded queue (a full queue stops reading: backpressure reaches the
  sender through TCP) and a single writer takes them one by one through the stages, so bytes are never
  reordered and the chain snapshot a chunk starts with is the one it finishes with;
- end of stream goes through the same queue, after every byte read before it, and becomes a half
  close (``write_eof``) on the other side; the connection closes when both directions have ended;
- a toxic added, updated or removed through the API reaches every live connection before the API
  answers; connections accepted later build their chains from the proxy's toxics at that time;
- disabling (or deleting) the proxy closes its listener first, then every connection, and returns
  only once every task of every connection has finished.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import random
import socket
import struct
from collections.abc import Callable, Coroutine
from enum import Enum
from typing import Any

from chaos.toxics import Clock, Piece, Stream, ToxicSpec, ToxicStage, make_stage
from chaos.toxiproxy_limits import ToxiproxyLimits
from protocol.invariant import fail, invariant

LISTEN_HOST = "127.0.0.1"
_LINGER_RESET = struct.pack("ii", 1, 0)

FailureCallback = Callable[[BaseException], None]


def parse_address(text: str, what: str, port_min: int) -> tuple[str, int]:
    """``host:port`` (``[v6]:port`` too) to a pair; ValueError naming ``what`` otherwise."""
    host, colon, port_text = text.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not colon or not port_text.isdigit() or not port_min <= int(port_text) <= 65535:
        raise ValueError(f"{what} must be host:port with a port in [{port_min}, 65535], not {text!r}")
    return host, int(port_text)


class CloseMode(Enum):
    GRACEFUL = "graceful"  # pending data flushed, then FIN
    ABORT = "abort"  # pending data dropped, socket closed at once
    RESET = "reset"  # SO_LINGER 0: TCP RST


class ToxicProxy:
    def __init__(
        self,
        name: str,
        listen_port: int,
        upstream: tuple[str, int],
        rng: random.Random,
        clock: Clock,
        limits: ToxiproxyLimits,
        on_failure: FailureCallback,
    ) -> None:
        self.name = name
        self.listen_port = listen_port
        self.upstream_host, self.upstream_port = upstream
        self.rng = rng
        self.clock = clock
        self.limits = limits
        self.enabled = False
        self._on_failure = on_failure
        self._toxics: dict[Stream, dict[str, ToxicSpec]] = {stream: {} for stream in Stream}
        self._server: asyncio.Server | None = None
        #: bumped by every stop, so a connection the old listener accepted late is refused
        self._generation = 0
        self._connections: dict[ProxyConnection, asyncio.Task[None]] = {}

    @property
    def listen(self) -> str:
        return f"{LISTEN_HOST}:{self.listen_port}"

    @property
    def upstream(self) -> str:
        return f"{self.upstream_host}:{self.upstream_port}"

    @property
    def connection_count(self) -> int:
        return len(self._connections)

    def toxics(self, stream: Stream | None = None) -> list[ToxicSpec]:
        """Upstream toxics first, then downstream, each in the order added (Toxiproxy's order)."""
        streams = list(Stream) if stream is None else [stream]
        return [spec for each in streams for spec in self._toxics[each].values()]

    def find_toxic(self, name: str) -> ToxicSpec | None:
        for chain in self._toxics.values():
            if name in chain:
                return chain[name]
        return None

    def to_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "listen": self.listen,
            "upstream": self.upstream,
            "enabled": self.enabled,
            "toxics": [spec.to_json() for spec in self.toxics()],
        }

    # -- listener ------------------------------------------------------------------------------

    async def start(self) -> None:
        """Listen on 127.0.0.1:listen_port (0 picks a free port, kept for later restarts).
        OSError if the address cannot be bound; the proxy then stays disabled."""
        if self.enabled:
            return
        generation = self._generation
        server = await asyncio.start_server(
            functools.partial(self._accept, generation),
            LISTEN_HOST,
            self.listen_port,
            limit=self.limits.read_size_max_bytes,
            reuse_address=True,
        )
        self._server = server
        self.listen_port = server.sockets[0].getsockname()[1]
        self.enabled = True

    async def stop(self) -> None:
        """Close the listener, then every connection; returns when all their tasks are done."""
        if not self.enabled:
            return
        self.enabled = False
        self._generation += 1
        server, self._server = self._server, None
        if server is None:
            fail(f"enabled proxy {self.name} without a listener")
        server.close()
        tasks = list(self._connections.values())
        for connection, task in list(self._connections.items()):
            connection.close(CloseMode.ABORT)
            if connection.connecting:
                task.cancel()  # the only wait close() cannot end: the connect to the upstream
        await asyncio.gather(*tasks, return_exceptions=True)
        await server.wait_closed()

    async def update(self, listen_port: int, upstream: tuple[str, int], enabled: bool) -> None:
        """Toxiproxy's Proxy.Update: a new address restarts the proxy (closing its connections)."""
        if listen_port != self.listen_port or upstream != (self.upstream_host, self.upstream_port):
            await self.stop()
            self.listen_port = listen_port
            self.upstream_host, self.upstream_port = upstream
        if enabled and not self.enabled:
            await self.start()
        elif not enabled:
            await self.stop()

    def _accept(self, generation: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # a plain callback, not a coroutine: asyncio would run a coroutine as a task nobody tracks
        if (
            generation != self._generation
            or not self.enabled
            or len(self._connections) >= self.limits.connections_per_proxy_max
        ):
            writer.transport.abort()
            return
        connection = ProxyConnection(self, reader, writer)
        task = asyncio.get_running_loop().create_task(connection.run(), name=f"proxy {self.name} connection")
        self._connections[connection] = task
        task.add_done_callback(functools.partial(self._connection_done, connection))

    def _connection_done(self, connection: ProxyConnection, task: asyncio.Task[None]) -> None:
        self._connections.pop(connection, None)
        connection.abort_sockets()  # a task cancelled before it ran never reached its own teardown
        if task.cancelled():
            return
        error = task.exception()
        if error is not None:
            self._on_failure(error)

    # -- toxics --------------------------------------------------------------------------------

    def add_toxic(self, spec: ToxicSpec) -> None:
        invariant(self.find_toxic(spec.name) is None, f"toxic {spec.name} added twice")
        self._toxics[spec.stream][spec.name] = spec
        for connection in list(self._connections):
            connection.add_toxic(spec)

    def update_toxic(self, spec: ToxicSpec) -> None:
        invariant(spec.name in self._toxics[spec.stream], f"toxic {spec.name} updated before added")
        self._toxics[spec.stream][spec.name] = spec  # keeps its place in the chain
        for connection in list(self._connections):
            connection.update_toxic(spec)

    def remove_toxic(self, name: str) -> None:
        spec = self.find_toxic(name)
        if spec is None:
            fail(f"toxic {name} removed before added")
        del self._toxics[spec.stream][name]
        for connection in list(self._connections):
            connection.remove_toxic(spec)

    def reset_toxics(self) -> None:
        for spec in self.toxics():
            self.remove_toxic(spec.name)


class ProxyConnection:
    """A client accepted by a proxy, its upstream connection, and the two directions between them."""

    def __init__(
        self, proxy: ToxicProxy, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter
    ) -> None:
        self._proxy = proxy
        self._client_reader = client_reader
        self._client_writer = client_writer
        self._upstream_writer: asyncio.StreamWriter | None = None
        self._pipes: dict[Stream, DirectionPipe] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._closing = asyncio.Event()
        self._close_mode: CloseMode | None = None
        self._ended: set[Stream] = set()
        self._failure: BaseException | None = None
        #: until the upstream answers (or not): the one phase close() alone cannot end
        self.connecting = True
        self._sockets_closed = False

    async def run(self) -> None:
        """The whole life of the connection; every task it started is finished when this returns."""
        try:
            await self._connect_and_pump()
        finally:
            await self._teardown()
        if self._failure is not None:
            raise self._failure

    async def _connect_and_pump(self) -> None:
        proxy = self._proxy
        try:
            async with asyncio.timeout(proxy.limits.upstream_connect_timeout_s):
                upstream_reader, upstream_writer = await asyncio.open_connection(
                    proxy.upstream_host, proxy.upstream_port, limit=proxy.limits.read_size_max_bytes
                )
        except (OSError, TimeoutError):
            # Toxiproxy closes the client when the upstream cannot be reached
            self.close(CloseMode.ABORT)
            return
        finally:
            self.connecting = False
        self._upstream_writer = upstream_writer
        if self._closing.is_set():
            return
        directions = (
            (Stream.UPSTREAM, self._client_reader, upstream_writer),
            (Stream.DOWNSTREAM, upstream_reader, self._client_writer),
        )
        for stream, source, destination in directions:
            pipe = DirectionPipe(stream, source, destination, self, proxy.clock, proxy.limits)
            self._pipes[stream] = pipe
            for spec in proxy.toxics(stream):
                pipe.add_stage(make_stage(spec, proxy.rng, proxy.clock, self))
        for stream, pipe in self._pipes.items():
            self.spawn(pipe.read_loop(), f"{proxy.name} {stream} read")
            self.spawn(pipe.write_loop(), f"{proxy.name} {stream} write")
        await self._closing.wait()

    async def _teardown(self) -> None:
        # cancel the tasks and close the sockets before the first await: whatever happens to this
        # task while it waits below, no socket stays open and no task keeps running unasked
        for task in self._tasks:
            task.cancel()
        self._close_sockets(self._close_mode or CloseMode.ABORT)
        while self._tasks:  # a toxic added meanwhile may have started a timer
            for task in self._tasks:
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
        for writer in self._writers():
            try:
                async with asyncio.timeout(self._proxy.limits.close_flush_timeout_s):
                    await writer.wait_closed()
            except TimeoutError:
                writer.transport.abort()
            except OSError:
                pass  # the peer went away first; closed either way

    def _writers(self) -> list[asyncio.StreamWriter]:
        if self._upstream_writer is None:
            return [self._client_writer]
        return [self._client_writer, self._upstream_writer]

    def _close_sockets(self, mode: CloseMode) -> None:
        """Idempotent; an abort or reset after a graceful close drops what was still unflushed."""
        self._sockets_closed = True
        for writer in self._writers():
            if mode is CloseMode.GRACEFUL:
                writer.close()
                continue
            if mode is CloseMode.RESET:
                sock = writer.get_extra_info("socket")
                if sock is not None:
                    with contextlib.suppress(OSError):
                        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET)
            writer.transport.abort()

    def abort_sockets(self) -> None:
        self._close_sockets(CloseMode.ABORT)

    # -- LinkControl, for stages and pipes -----------------------------------------------------

    def close_link(self, reset: bool) -> None:
        self.close(CloseMode.RESET if reset else CloseMode.GRACEFUL)

    def close(self, mode: CloseMode) -> None:
        """Ask for the connection to close; the first reason asked wins, except as said below."""
        # an abort overrides a graceful close (the proxy is stopping: do not wait for a flush)
        if self._close_mode is None or (mode is CloseMode.ABORT and self._close_mode is CloseMode.GRACEFUL):
            self._close_mode = mode
            if self._sockets_closed:
                self._close_sockets(mode)
        self._closing.set()

    def spawn(self, coroutine: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coroutine, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            # a programmer error in a stage or pipe: fail the connection loudly, not silently
            if self._failure is None:
                self._failure = task.exception()
            self.close(CloseMode.ABORT)

    def direction_ended(self, stream: Stream) -> None:
        self._ended.add(stream)
        if len(self._ended) == len(Stream):
            self.close(CloseMode.GRACEFUL)

    # -- toxics reaching a live connection ------------------------------------------------------

    def add_toxic(self, spec: ToxicSpec) -> None:
        pipe = self._pipes.get(spec.stream)
        if pipe is not None:  # not connected yet: the chain will be built from the proxy's toxics
            pipe.add_stage(make_stage(spec, self._proxy.rng, self._proxy.clock, self))

    def update_toxic(self, spec: ToxicSpec) -> None:
        pipe = self._pipes.get(spec.stream)
        if pipe is not None:
            pipe.stage_named(spec.name).update(spec)

    def remove_toxic(self, spec: ToxicSpec) -> None:
        pipe = self._pipes.get(spec.stream)
        if pipe is not None:
            pipe.remove_stage(spec.name)


class DirectionPipe:
    """One direction of a connection: source socket, queue, toxic stages, destination socket."""

    def __init__(
        self,
        stream: Stream,
        source: asyncio.StreamReader,
        destination: asyncio.StreamWriter,
        connection: ProxyConnection,
        clock: Clock,
        limits: ToxiproxyLimits,
    ) -> None:
        self.stream = stream
        self.stages: list[ToxicStage] = []
        self._source = source
        self._destination = destination
        self._connection = connection
        self._clock = clock
        self._read_size_bytes = limits.read_size_max_bytes
        #: None marks the end of the stream
        self._queue: asyncio.Queue[Piece | None] = asyncio.Queue(maxsize=limits.direction_queue_chunks_max)

    def stage_named(self, name: str) -> ToxicStage:
        for stage in self.stages:
            if stage.spec.name == name:
                return stage
        raise AssertionError(f"no stage for toxic {name} on {self.stream}")

    def add_stage(self, stage: ToxicStage) -> None:
        self.stages.append(stage)
        stage.start()

    def remove_stage(self, name: str) -> None:
        stage = self.stage_named(name)
        self.stages.remove(stage)
        stage.detach()

    async def read_loop(self) -> None:
        try:
            while data := await self._source.read(self._read_size_bytes):
                await self._queue.put(Piece(data, self._clock.now_s()))
        except OSError:
            self._connection.close(CloseMode.ABORT)
            return
        await self._queue.put(None)

    async def write_loop(self) -> None:
        try:
            while (piece := await self._queue.get()) is not None:
                await self._deliver(tuple(self.stages), 0, piece)
            if self._destination.can_write_eof():
                self._destination.write_eof()
        except OSError:
            self._connection.close(CloseMode.ABORT)
            return
        self._connection.direction_ended(self.stream)

    async def _deliver(self, stages: tuple[ToxicStage, ...], index: int, piece: Piece) -> None:
        if index == len(stages):
            if piece.data:
                self._destination.write(piece.data)
                await self._destination.drain()
            return

        async def emit(output: Piece) -> None:
            await self._deliver(stages, index + 1, output)

        await stages[index].process(piece, emit)
