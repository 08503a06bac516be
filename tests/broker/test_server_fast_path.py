"""A route's synchronous way in (``RemotingServer.register(..., fast=...)``), over real loopback sockets:
what it takes is answered through its callback under the same rules as a processor's answer (in-flight
limit, graceful stop, oneway, errors); what it declines, and everything while the route's queue holds a
request, goes the queued way, so a connection's requests reach the route in the order they came.

Every wait polls a condition with a deadline; nothing sleeps for a fixed time to let things happen.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress

import pytest

from broker.remoting import RequestContext, ServerLimits
from broker.remoting.server import PAUSED_FOR_IN_FLIGHT, PAUSED_FOR_STOP, Finish, RemotingServer
from protocol.client import RemotingClient
from protocol.codec import encode_frame, encode_json_answer
from protocol.codes import ResponseCode
from protocol.command import RemotingCommand, make_request, make_response
from protocol.connection import ConnectionClosedError
from protocol.invariant import InvariantError
from tests.broker.helpers import LOOPBACK, RawConnection, run
from tests.support.waiting import poll_until

CODE = 1100


class Route:
    """A processor and a fast path for one code. The fast path takes a request whose ``way`` field is
    ``fast`` (held until released), answers one whose ``way`` is ``now`` at once, raises for ``raise``, and
    declines the rest; the processor answers what reaches it at once, or holds it when ``hold`` is set."""

    def __init__(self) -> None:
        self.order: list[tuple[str, int]] = []
        self.held: list[tuple[RemotingCommand, Finish]] = []
        self.hold_queued = asyncio.Event()
        self.release_queued = asyncio.Event()
        self.release_queued.set()

    async def processor(self, context: RequestContext) -> RemotingCommand:
        self.order.append(("queued", context.request.opaque))
        await self.release_queued.wait()
        return make_response(context.request, ResponseCode.SUCCESS, remark="queued")

    def fast(self, context: RequestContext) -> RemotingCommand | Callable[[Finish], None] | None:
        request = context.request
        way = request.ext_fields.get("way")
        if way == "raise":
            raise ValueError("the fast path broke")
        if way == "invariant":
            raise InvariantError("queue offsets went backwards")
        if way == "now":
            self.order.append(("now", request.opaque))
            return make_response(request, ResponseCode.SUCCESS, remark="now")
        if way != "fast":
            return None
        self.order.append(("fast", request.opaque))

        def start(finish: Finish) -> None:
            self.held.append((request, finish))

        return start

    def answer_held(self, answer: Callable[[RemotingCommand], RemotingCommand | bytes | Exception | None]) -> None:
        held, self.held = self.held, []
        for request, finish in held:
            finish(answer(request))


def success(request: RemotingCommand) -> RemotingCommand:
    return make_response(request, ResponseCode.SUCCESS, remark="fast")


async def started(route: Route, limits: ServerLimits | None = None) -> RemotingServer:
    server = RemotingServer(LOOPBACK, 0, limits)
    server.register(CODE, route.processor, queue_max=16, workers=4, fast=route.fast)
    await server.start()
    return server


@asynccontextmanager
async def serving(route: Route, limits: ServerLimits | None = None) -> AsyncIterator[RemotingServer]:
    """:func:`started`, stopped on the way out whatever happened."""
    server = await started(route, limits)
    try:
        yield server
    finally:
        await server.stop(grace_seconds=1.0)


def request(way: str, opaque: int = 0, oneway: bool = False) -> RemotingCommand:
    return make_request(CODE, opaque, ext_fields={"way": way}, oneway=oneway)


def test_taken_requests_are_answered_through_finish_and_declined_ones_by_the_processor() -> None:
    async def scenario() -> None:
        route = Route()
        async with serving(route) as server:
            client = await RemotingClient.connect(LOOPBACK, server.port)
            assert (await client.request(CODE, ext_fields={"way": "now"})).remark == "now"
            assert (await client.request(CODE, ext_fields={"way": "queued"})).remark == "queued"
            pending = asyncio.create_task(client.request(CODE, ext_fields={"way": "fast"}))
            await poll_until(lambda: len(route.held) == 1, "the fast request to be held", timeout_seconds=5.0)
            assert server.connections[0].in_flight == 1
            route.answer_held(success)
            assert (await pending).remark == "fast"
            await poll_until(lambda: server.connections[0].in_flight == 0, "the request to finish",
                             timeout_seconds=5.0)
            assert [way for way, _ in route.order] == ["now", "queued", "fast"]
            await client.close()

    run(scenario())


def test_a_framed_answer_is_written_as_is_and_matches_the_general_encoder() -> None:
    async def scenario() -> None:
        route = Route()
        async with serving(route) as server:
            raw = await RawConnection.open(server.port)
            await raw.send(encode_frame(request("fast", opaque=77)))
            await poll_until(lambda: len(route.held) == 1, "the fast request to be held", timeout_seconds=5.0)
            fields = {"msgId": "7F00000100002A9F0000000000000000", "queueId": "3", "queueOffset": "12",
                      "transactionId": "ü-1"}

            def framed(held: RemotingCommand) -> bytes:
                frame = encode_json_answer(held.opaque, ResponseCode.SUCCESS, fields)
                assert frame is not None
                return frame

            route.answer_held(framed)
            answer = await raw.read_frame()
            assert answer.command == make_response(request("fast", opaque=77), ResponseCode.SUCCESS, None, fields)
            await raw.close()

    run(scenario())


@pytest.mark.parametrize("opaque", [0, 1, -5, 2**31 - 1, -(2**31)])
@pytest.mark.parametrize("fields", [{}, {"msgId": "A", "queueId": "0", "queueOffset": "0"},
                                    {"a": "\u00fc\u4e2d\U0001f600", "b": "quote \" and \\ and \n"}])
def test_encode_json_answer_is_byte_for_byte_the_general_encoder(opaque: int, fields: dict[str, str]) -> None:
    expected = encode_frame(make_response(make_request(CODE, opaque), ResponseCode.SUCCESS, None, fields))
    assert encode_json_answer(opaque, ResponseCode.SUCCESS, fields) == expected
    assert encode_json_answer(opaque, ResponseCode.SYSTEM_ERROR, fields) == encode_frame(
        make_response(make_request(CODE, opaque), ResponseCode.SYSTEM_ERROR, None, fields))


def test_while_a_request_waits_in_the_queue_the_next_ones_queue_behind_it() -> None:
    """Requests the fast path would take go to the queue while an earlier request of the route waits
    there: the route sees them in the order they came."""

    async def scenario() -> None:
        route = Route()
        route.release_queued.clear()
        async with serving(route, ServerLimits(in_flight_requests_max=64)) as server:
            server_route = server._routes[CODE]
            raw = await RawConnection.open(server.port)
            # four queued requests hold the four workers; the fifth waits in the queue, so the fast ones
            # after it are queued too
            frames = [encode_frame(request("queued", opaque)) for opaque in range(5)]
            frames += [encode_frame(request("fast", opaque)) for opaque in range(5, 8)]
            await raw.send(b"".join(frames))
            await poll_until(lambda: len(route.order) == 4 and server_route.queue.qsize() == 4,
                             "four requests at the workers and four in the queue", timeout_seconds=5.0)
            assert route.held == []
            route.release_queued.set()
            answered = sorted([(await raw.read_frame()).command.opaque for _ in range(8)])
            assert answered == list(range(8))
            assert [opaque for _, opaque in route.order] == list(range(8))
            assert all(way == "queued" for way, _ in route.order)
            await raw.close()

    run(scenario())


def test_taken_requests_count_against_the_in_flight_limit() -> None:
    async def scenario() -> None:
        route = Route()
        async with serving(route, ServerLimits(in_flight_requests_max=2)) as server:
            raw = await RawConnection.open(server.port)
            await raw.send(b"".join(encode_frame(request("fast", opaque)) for opaque in range(5)))
            await poll_until(lambda: len(route.held) == 2, "two requests to be held", timeout_seconds=5.0)
            connection = server.connections[0]
            assert PAUSED_FOR_IN_FLIGHT in connection.pause_reasons
            assert connection.in_flight == 2
            taken = 0
            while taken < 5:
                await poll_until(lambda: bool(route.held), "a request to be held", timeout_seconds=5.0)
                assert len(route.held) <= 2 and connection.in_flight <= 2
                taken += len(route.held)
                route.answer_held(success)
            answered = sorted([(await raw.read_frame()).command.opaque for _ in range(5)])
            assert answered == [0, 1, 2, 3, 4]
            await poll_until(lambda: not connection.reading_paused, "reading to resume", timeout_seconds=5.0)
            await raw.close()

    run(scenario())


def test_a_graceful_stop_waits_for_taken_requests() -> None:
    async def scenario() -> None:
        route = Route()
        server = await started(route)
        client = await RemotingClient.connect(LOOPBACK, server.port)
        pending = asyncio.create_task(client.request(CODE, ext_fields={"way": "fast"}, timeout_seconds=10))
        await poll_until(lambda: len(route.held) == 1, "the fast request to be held", timeout_seconds=5.0)
        connection = server.connections[0]
        stopping = asyncio.create_task(server.stop(grace_seconds=10))
        await poll_until(lambda: PAUSED_FOR_STOP in connection.pause_reasons, "reads to stop",
                         timeout_seconds=5.0)
        assert not stopping.done()
        route.answer_held(success)
        assert (await pending).code == ResponseCode.SUCCESS
        await stopping
        await client.wait_closed()
        await server.wait_stopped()

    run(scenario())


def test_oneway_requests_taken_get_no_answer_and_finish() -> None:
    async def scenario() -> None:
        route = Route()
        async with serving(route) as server:
            raw = await RawConnection.open(server.port)
            await raw.send(encode_frame(request("fast", opaque=1, oneway=True)))
            await poll_until(lambda: len(route.held) == 1, "the oneway request to be held",
                             timeout_seconds=5.0)
            route.answer_held(success)
            connection = server.connections[0]
            await poll_until(lambda: connection.in_flight == 0, "the oneway request to finish",
                             timeout_seconds=5.0)
            await raw.send(encode_frame(request("now", opaque=2)))
            assert (await raw.read_frame()).command.opaque == 2  # and nothing for opaque 1 came before it
            await raw.close()

    run(scenario())


def test_errors_of_the_fast_path_are_answered_system_error_and_finish_once(
        caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        route = Route()
        async with serving(route) as server:
            client = await RemotingClient.connect(LOOPBACK, server.port)
            with caplog.at_level(logging.ERROR):
                broken = await client.request(CODE, ext_fields={"way": "raise"})
            assert broken.code == ResponseCode.SYSTEM_ERROR
            assert broken.remark is not None and "the fast path broke" in broken.remark
            pending = asyncio.create_task(client.request(CODE, ext_fields={"way": "fast"}))
            await poll_until(lambda: len(route.held) == 1, "the fast request to be held", timeout_seconds=5.0)
            (held_request, finish), = route.held
            route.held = []
            finish(RuntimeError("the append went wrong"))
            finish(success(held_request))  # a second answer is ignored
            failed = await pending
            assert failed.code == ResponseCode.SYSTEM_ERROR
            assert failed.remark is not None and "the append went wrong" in failed.remark
            await poll_until(lambda: server.connections[0].in_flight == 0, "the request to finish",
                             timeout_seconds=5.0)
            assert (await client.request(CODE, ext_fields={"way": "now"})).code == ResponseCode.SUCCESS
            await client.close()

    run(scenario())


def test_a_broken_invariant_in_the_fast_path_stops_the_server() -> None:
    async def scenario() -> None:
        route = Route()
        server = await started(route)
        client = await RemotingClient.connect(LOOPBACK, server.port)
        with suppress(ConnectionClosedError):
            await client.request(CODE, ext_fields={"way": "invariant"}, timeout_seconds=5)
        with pytest.raises(InvariantError, match="went backwards"):
            await server.wait_stopped()
        await client.wait_closed()

    run(scenario())
