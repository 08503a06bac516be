"""Shared helpers: run a coroutine with a deadline, poll for a condition, servers on free ports, raw
connections that speak bytes (to send what no well-behaved client would)."""

from __future__ import annotations

import asyncio
import json
import struct
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from typing import TypeVar

from broker.remoting import RemotingServer, RequestContext, ServerLimits
from protocol.codec import FrameDecoder, encode_frame
from protocol.command import RemotingCommand, make_request

T = TypeVar("T")
LOOPBACK = "127.0.0.1"
#: every test coroutine ends within this, so a hang fails the test instead of the suite
TEST_DEADLINE_SECONDS = 20.0


def run(coroutine: Awaitable[T], timeout_seconds: float = TEST_DEADLINE_SECONDS) -> T:
    async def bounded() -> T:
        async with asyncio.timeout(timeout_seconds):
            return await coroutine

    return asyncio.run(bounded())


Processor = Callable[[RequestContext], Awaitable[RemotingCommand | None]]


@asynccontextmanager
async def running_server(
    processors: Mapping[int | tuple[int, ...], Processor] | None = None,
    limits: ServerLimits | None = None,
    *,
    queue_max: int = 1024,
    workers: int = 4,
) -> AsyncIterator[RemotingServer]:
    """A started server on a free loopback port, stopped on exit whatever happened. A tuple of codes
    shares one queue and its workers."""
    server = RemotingServer(LOOPBACK, 0, limits)
    for code, processor in (processors or {}).items():
        server.register(code, processor, queue_max=queue_max, workers=workers)
    await server.start()
    try:
        yield server
    finally:
        await server.stop(grace_seconds=1.0)


@dataclass
class RawFrame:
    """A frame as it was on the wire: the header's own JSON (or None for binary) and the decoded command."""

    serialize_type: int
    header_json: dict[str, object] | None
    command: RemotingCommand


class RawConnection:
    """A plain socket speaking bytes; frames read back are kept raw as well as decoded."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def open(cls, port: int) -> RawConnection:
        reader, writer = await asyncio.open_connection(LOOPBACK, port)
        return cls(reader, writer)

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def send_command(self, command: RemotingCommand) -> None:
        await self.send(encode_frame(command))

    async def send_request(self, code: int, opaque: int, **options: object) -> None:
        await self.send_command(make_request(code, opaque, **options))  # type: ignore[arg-type]

    async def read_frame(self, timeout_seconds: float = 5.0) -> RawFrame:
        async with asyncio.timeout(timeout_seconds):
            prefix = await self.reader.readexactly(8)
            total_length, type_and_length = struct.unpack(">iI", prefix)
            rest = await self.reader.readexactly(total_length - 4)
        serialize_type = type_and_length >> 24
        header_length = type_and_length & 0xFFFFFF
        header_json = json.loads(rest[:header_length]) if serialize_type == 0 else None
        decoder = FrameDecoder()
        decoder.feed(prefix + rest)
        command = decoder.next_frame()
        assert command is not None
        return RawFrame(serialize_type, header_json, command)

    async def closed_by_peer(self, timeout_seconds: float = 5.0) -> bool:
        """True once the server closed the connection (EOF or reset) within the timeout."""
        try:
            async with asyncio.timeout(timeout_seconds):
                while True:
                    data = await self.reader.read(65536)
                    if not data:
                        return True
        except ConnectionResetError:
            return True
        except TimeoutError:
            return False

    async def close(self) -> None:
        self.writer.close()
        with suppress(ConnectionError):
            await self.writer.wait_closed()


#: a member's node file up to its [broker] table (two-member group n0/n1 on fixed loopback ports); tests
#: that only load configurations append their own [broker] keys
NODE_FILE_HEAD = """
[node]
id = "n0"
raft_address = "127.0.0.1:20911"
catchup_address = "127.0.0.1:20912"
data_dir = "."
secret = "a group secret of enough length"

[[peers]]
id = "n1"
raft_address = "127.0.0.1:20921"
catchup_address = "127.0.0.1:20922"

[broker]
"""
