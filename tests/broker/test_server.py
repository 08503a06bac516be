"""The remoting server shell and client helper, over real loopback sockets.

Every wait polls a condition with a deadline; nothing sleeps for a fixed time to let things happen.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import struct
from contextlib import suppress

import pytest

from broker.remoting import RequestContext, ServerLimits
from broker.remoting.server import (
    PAUSED_FOR_IN_FLIGHT,
    PAUSED_FOR_STOP,
    PAUSED_FOR_WRITE_BUFFER,
    RemotingServer,
)
from protocol.client import RemotingClient
from protocol.codec import encode_frame
from protocol.codes import RequestCode, ResponseCode, SerializeType
from protocol.command import ONEWAY_FLAG, RemotingCommand, make_request, make_response
from protocol.connection import ConnectionClosedError, RequestTimeoutError
from protocol.invariant import InvariantError
from protocol.limits import CodecLimits
from tests.broker.helpers import LOOPBACK, RawConnection, run, running_server
from tests.support.waiting import poll_until

ECHO = 1000
BLOCKING = 1001
FAILING = 1002
SILENT = 1003


async def echo(context: RequestContext) -> RemotingCommand:
    request = context.request
    return make_response(
        request, ResponseCode.SUCCESS, remark=f"echo {request.code}", ext_fields=request.ext_fields
    )


class Gate:
    """A processor that records what it got and holds every request until released."""

    def __init__(self) -> None:
        self.started: list[RemotingCommand] = []
        self.release = asyncio.Event()

    async def __call__(self, context: RequestContext) -> RemotingCommand:
        self.started.append(context.request)
        await self.release.wait()
        return make_response(context.request, ResponseCode.SUCCESS)


# ------------------------------------------------------------------------------------- answering rules


def test_unknown_code_answers_request_code_not_supported() -> None:
    async def scenario() -> None:
        async with running_server({ECHO: echo}) as server:
            client = await RemotingClient.connect(LOOPBACK, server.port)
            response = await client.request(4242)
            assert response.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
            assert response.remark is not None and "4242" in response.remark
            assert (await client.request(ECHO)).code == ResponseCode.SUCCESS
            await client.close()

    run(scenario())


@pytest.mark.parametrize("opaque", [0, 7, 2**31 - 1, -5])
@pytest.mark.parametrize("serialize_type", [SerializeType.JSON, SerializeType.ROCKETMQ])
def test_answer_echoes_opaque_and_header_form(opaque: int, serialize_type: SerializeType) -> None:
    async def scenario() -> None:
        async with running_server({ECHO: echo}) as server:
            raw = await RawConnection.open(server.port)
            await raw.send_request(ECHO, opaque, ext_fields={"topic": "T"}, serialize_type=serialize_type)
            frame = await raw.read_frame()
            assert frame.serialize_type == serialize_type
            assert frame.command.opaque == opaque
            assert frame.command.is_response
            assert frame.command.ext_fields == {"topic": "T"}
            await raw.close()

    run(scenario())


def test_processor_error_answers_system_error_naming_it(caplog: pytest.LogCaptureFixture) -> None:
    async def failing(context: RequestContext) -> RemotingCommand:
        raise ValueError("disk on fire")

    async def scenario() -> None:
        async with running_server({FAILING: failing}) as server:
            client = await RemotingClient.connect(LOOPBACK, server.port)
            response = await client.request(FAILING)
            assert response.code == ResponseCode.SYSTEM_ERROR
            assert response.remark is not None
            assert "ValueError" in response.remark and "disk on fire" in response.remark
            assert "Traceback" not in response.remark and ".py" not in response.remark
            await client.close()

    with caplog.at_level(logging.ERROR, logger="broker.remoting.server"):
        run(scenario())
    # the traceback went to the log instead
    assert any(record.exc_info is not None for record in caplog.records)


def test_full_queue_answers_system_busy_at_once() -> None:
    gate = Gate()

    async def scenario() -> None:
        async with running_server({BLOCKING: gate}, queue_max=1, workers=1) as server:
            client = await RemotingClient.connect(LOOPBACK, server.port)
            first = asyncio.create_task(client.request(BLOCKING, timeout_seconds=10))
            await poll_until(lambda: len(gate.started) == 1, "the worker to take the first request",
                             timeout_seconds=5.0)
            second = asyncio.create_task(client.request(BLOCKING, timeout_seconds=10))
            await poll_until(lambda: server.connections[0].in_flight == 2, "the second request to be queued",
                             timeout_seconds=5.0)
            # worker busy, queue full: answered before anything is released
            third = await client.request(BLOCKING, timeout_seconds=10)
            assert third.code == ResponseCode.SYSTEM_BUSY
            assert third.remark is not None and "busy" in third.remark
            gate.release.set()
            assert (await first).code == ResponseCode.SUCCESS
            assert (await second).code == ResponseCode.SUCCESS
            await client.close()

    run(scenario())


def test_oneway_flag_gets_no_answer_and_none_means_no_answer() -> None:
    seen: list[int] = []

    async def record(context: RequestContext) -> RemotingCommand | None:
        seen.append(context.request.opaque)
        if context.request.code == SILENT:
            return None  # what a processor does for the C++ client's unflagged oneway calls
        return make_response(context.request, ResponseCode.SUCCESS)

    async def scenario() -> None:
        # one worker: requests are processed, and would be answered, in the order they were sent
        async with running_server({(ECHO, SILENT): record}, workers=1) as server:
            raw = await RawConnection.open(server.port)
            await raw.send_request(ECHO, 1, oneway=True)  # flagged: the answer is dropped
            await raw.send_request(SILENT, 2)  # unflagged, processor answers None
            await raw.send_request(ECHO, 3)
            frame = await raw.read_frame()
            assert frame.command.opaque == 3
            assert seen == [1, 2, 3]
            await raw.close()

    run(scenario())


def test_response_echoes_request_whatever_the_processor_set() -> None:
    async def sloppy(context: RequestContext) -> RemotingCommand:
        # not a response, wrong opaque, wrong header form: the server fixes all three
        return RemotingCommand(code=ResponseCode.SUCCESS, opaque=99999, serialize_type=SerializeType.ROCKETMQ)

    async def scenario() -> None:
        async with running_server({ECHO: sloppy}) as server:
            raw = await RawConnection.open(server.port)
            await raw.send_request(ECHO, 5)
            frame = await raw.read_frame()
            assert frame.command.opaque == 5
            assert frame.serialize_type == SerializeType.JSON
            assert frame.command.is_response
            await raw.close()

    run(scenario())


# ------------------------------------------------------------------------------------------ bad frames


@pytest.mark.parametrize(
    "prefix",
    [struct.pack(">i", 2), struct.pack(">i", -1), struct.pack(">i", 2**31 - 1)],
    ids=["below-minimum", "negative", "too-large"],
)
def test_fatal_frame_error_closes_the_connection(prefix: bytes) -> None:
    async def scenario() -> None:
        async with running_server({ECHO: echo}) as server:
            raw = await RawConnection.open(server.port)
            await poll_until(lambda: len(server.connections) == 1, "the connection to be admitted",
                             timeout_seconds=5.0)
            await raw.send(prefix + b"\x00" * 16)
            assert await raw.closed_by_peer()
            await poll_until(lambda: not server.connections, "the server to forget the connection",
                             timeout_seconds=5.0)
            await raw.close()

    run(scenario())


def test_recoverable_frame_error_is_answered_and_the_connection_goes_on() -> None:
    small = ServerLimits(codec=CodecLimits(remark_max_bytes=16))

    def json_frame(header: bytes) -> bytes:
        return struct.pack(">iI", 4 + len(header), len(header)) + header

    async def scenario() -> None:
        async with running_server({ECHO: echo}, small) as server:
            raw = await RawConnection.open(server.port)
            # a field of the wrong type after a readable opaque: SYSTEM_ERROR
            await raw.send(json_frame(b'{"opaque":9,"code":"ten","flag":0}'))
            frame = await raw.read_frame()
            assert (frame.command.opaque, frame.command.code) == (9, ResponseCode.SYSTEM_ERROR)
            assert frame.command.remark is not None and "code" in frame.command.remark
            # over a codec limit: MESSAGE_ILLEGAL
            await raw.send(json_frame(b'{"opaque":10,"code":1000,"flag":0,"remark":"' + b"r" * 40 + b'"}'))
            frame = await raw.read_frame()
            assert (frame.command.opaque, frame.command.code) == (10, ResponseCode.MESSAGE_ILLEGAL)
            # no opaque, nobody to answer; the flagged-oneway bad frame is not answered either
            await raw.send(json_frame(b"not json"))
            await raw.send(json_frame(b'{"opaque":11,"code":1000,"flag":2,"remark":"' + b"r" * 40 + b'"}'))
            await raw.send_request(ECHO, 12)
            frame = await raw.read_frame()
            assert (frame.command.opaque, frame.command.code) == (12, ResponseCode.SUCCESS)
            await raw.close()

    run(scenario())


# --------------------------------------------------------------------------------------------- limits


def test_connections_beyond_the_limit_are_closed_at_once() -> None:
    async def scenario() -> None:
        async with running_server({ECHO: echo}, ServerLimits(connections_max=2)) as server:
            first = await RemotingClient.connect(LOOPBACK, server.port)
            second = await RemotingClient.connect(LOOPBACK, server.port)
            await poll_until(lambda: len(server.connections) == 2, "two admitted connections",
                             timeout_seconds=5.0)
            extra = await RawConnection.open(server.port)
            assert await extra.closed_by_peer()
            assert len(server.connections) == 2
            assert (await first.request(ECHO)).code == ResponseCode.SUCCESS
            assert (await second.request(ECHO)).code == ResponseCode.SUCCESS
            await first.close()
            await poll_until(lambda: len(server.connections) == 1, "the closed connection to be forgotten",
                             timeout_seconds=5.0)
            third = await RemotingClient.connect(LOOPBACK, server.port)
            assert (await third.request(ECHO)).code == ResponseCode.SUCCESS
            for client in (second, third):
                await client.close()
            await extra.close()

    run(scenario())


def test_idle_and_trickling_connections_are_closed_but_busy_ones_are_not() -> None:
    gate = Gate()
    limits = ServerLimits(idle_timeout_seconds=0.3)

    async def scenario() -> None:
        async with running_server({BLOCKING: gate}, limits) as server:
            silent = await RawConnection.open(server.port)
            trickling = await RawConnection.open(server.port)
            await trickling.send(b"\x00\x00\x00")  # a frame that never completes (slow loris)
            busy = await RemotingClient.connect(LOOPBACK, server.port)
            pending = asyncio.create_task(busy.request(BLOCKING, timeout_seconds=10))
            await poll_until(lambda: len(gate.started) == 1, "the busy connection's request to start",
                             timeout_seconds=5.0)
            assert await silent.closed_by_peer()
            assert await trickling.closed_by_peer()
            await poll_until(lambda: len(server.connections) == 1, "the two idle connections to be closed",
                             timeout_seconds=5.0)
            # a request in progress is not idleness, however long it takes
            assert not busy.is_closed
            gate.release.set()
            assert (await pending).code == ResponseCode.SUCCESS
            await busy.close()
            for raw in (silent, trickling):
                await raw.close()

    run(scenario())


def test_in_flight_limit_stops_reading_until_a_request_finishes() -> None:
    gate = Gate()
    frame_size = len(encode_frame(make_request(BLOCKING, 0)))

    async def scenario() -> None:
        limits = ServerLimits(in_flight_requests_max=2)
        async with running_server({BLOCKING: gate}, limits, workers=8) as server:
            raw = await RawConnection.open(server.port)
            for opaque in range(5):
                await raw.send_request(BLOCKING, opaque)
            connection_list = server.connections
            await poll_until(
                lambda: connection_list[0].buffered_bytes >= 3 * frame_size,
                "the last three frames to be held", timeout_seconds=5.0,
            )
            connection = connection_list[0]
            assert connection.in_flight == 2
            assert PAUSED_FOR_IN_FLIGHT in connection.pause_reasons
            assert [request.opaque for request in gate.started] == [0, 1]
            gate.release.set()
            answered = sorted([(await raw.read_frame()).command.opaque for _ in range(5)])
            assert answered == [0, 1, 2, 3, 4]
            await poll_until(lambda: not connection.reading_paused, "reading to resume", timeout_seconds=5.0)
            await raw.close()

    run(scenario())


def test_write_buffer_above_high_water_stops_reading_until_the_client_reads() -> None:
    body = b"x" * (512 * 1024)
    requests = 48  # 24 MiB of answers: more than loopback socket buffers hold

    async def large(context: RequestContext) -> RemotingCommand:
        return make_response(context.request, ResponseCode.SUCCESS, body=body)

    async def scenario() -> None:
        limits = ServerLimits(
            write_buffer_high_water_bytes=256 * 1024, write_buffer_low_water_bytes=64 * 1024
        )
        async with running_server({ECHO: large}, limits, workers=1) as server:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 * 1024)
            sock.setblocking(False)
            await asyncio.get_running_loop().sock_connect(sock, (LOOPBACK, server.port))
            reader, writer = await asyncio.open_connection(sock=sock)
            raw = RawConnection(reader, writer)
            for opaque in range(requests):
                await raw.send_request(ECHO, opaque)
            await poll_until(lambda: len(server.connections) == 1, "the connection", timeout_seconds=5.0)
            connection = server.connections[0]
            await poll_until(
                lambda: PAUSED_FOR_WRITE_BUFFER in connection.pause_reasons,
                "reads to pause on the write buffer", timeout_seconds=5.0,
            )
            answered = sorted(
                [(await raw.read_frame(timeout_seconds=10)).command.opaque for _ in range(requests)]
            )
            assert answered == list(range(requests))
            await poll_until(lambda: not connection.reading_paused, "reading to resume", timeout_seconds=5.0)
            await raw.close()

    run(scenario())


@pytest.mark.parametrize(
    "values",
    [
        {"connections_max": 0},
        {"in_flight_requests_max": -1},
        {"idle_timeout_seconds": 0},
        {"idle_timeout_seconds": float("inf")},
        {"write_buffer_low_water_bytes": 10, "write_buffer_high_water_bytes": 5},
        {"outbound_requests_max": 1.5},
    ],
)
def test_server_limits_reject_bad_values(values: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        ServerLimits.from_mapping(values)


def test_server_limits_from_mapping() -> None:
    limits = ServerLimits.from_mapping({"connections_max": 3, "codec": {"remark_max_bytes": 100}})
    assert limits.connections_max == 3
    assert limits.codec.remark_max_bytes == 100
    with pytest.raises(ValueError, match="unknown server limits: conections_max"):
        ServerLimits.from_mapping({"conections_max": 3})
    with pytest.raises(ValueError):
        RemotingServer(LOOPBACK, 70000)


# ---------------------------------------------------------------------------------- server-initiated


def test_server_initiated_requests_round_trip() -> None:
    kept: list[RequestContext] = []
    client_saw: list[tuple[int, dict[str, str], bool]] = []

    async def ask_back(context: RequestContext) -> RemotingCommand:
        kept.append(context)
        answer = await context.connection.send_request(
            RequestCode.GET_CONSUMER_RUNNING_INFO, {"consumerGroup": "G"}, timeout_seconds=5
        )
        await context.connection.send_oneway(RequestCode.CHECK_TRANSACTION_STATE, {"msgId": "M1"})
        return make_response(context.request, ResponseCode.SUCCESS, remark=f"client said {answer.remark}")

    async def handler(request: RemotingCommand) -> RemotingCommand | None:
        client_saw.append((request.code, dict(request.ext_fields), request.is_oneway))
        if request.code == RequestCode.GET_CONSUMER_RUNNING_INFO:
            return make_response(request, ResponseCode.SUCCESS, remark="running")
        return None

    async def scenario() -> None:
        async with running_server({ECHO: ask_back}) as server:
            client = await RemotingClient.connect(LOOPBACK, server.port, request_handler=handler)
            response = await client.request(ECHO, timeout_seconds=5)
            assert response.remark == "client said running"
            await poll_until(lambda: len(client_saw) == 2, "the oneway check to arrive", timeout_seconds=5.0)
            # a processor may keep the connection and use it after answering
            await kept[0].connection.send_oneway(
                RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, {"consumerGroup": "G"}
            )
            await poll_until(lambda: len(client_saw) == 3, "the notification to arrive", timeout_seconds=5.0)
            assert client_saw == [
                (RequestCode.GET_CONSUMER_RUNNING_INFO, {"consumerGroup": "G"}, False),
                (RequestCode.CHECK_TRANSACTION_STATE, {"msgId": "M1"}, True),
                (RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, {"consumerGroup": "G"}, True),
            ]
            assert kept[0].remote_address.startswith(f"{LOOPBACK}:")
            await client.close()
            with pytest.raises(ConnectionClosedError):
                await kept[0].connection.send_oneway(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED)

    run(scenario())


def test_server_initiated_request_times_out_when_the_client_never_answers() -> None:
    async def ask_back(context: RequestContext) -> RemotingCommand:
        try:
            await context.connection.send_request(RequestCode.GET_CONSUMER_RUNNING_INFO, timeout_seconds=0.2)
        except RequestTimeoutError as error:
            return make_response(context.request, ResponseCode.SUCCESS, remark=f"timed out: {error}")
        return make_response(context.request, ResponseCode.SYSTEM_ERROR)

    async def never(request: RemotingCommand) -> RemotingCommand | None:
        await asyncio.Event().wait()
        return None

    async def scenario() -> None:
        async with running_server({ECHO: ask_back}) as server:
            client = await RemotingClient.connect(LOOPBACK, server.port, request_handler=never)
            response = await client.request(ECHO, timeout_seconds=5)
            assert response.code == ResponseCode.SUCCESS
            assert response.remark is not None and response.remark.startswith("timed out")
            await client.close()

    run(scenario())


def test_client_without_handler_answers_not_supported() -> None:
    answers: list[RemotingCommand] = []

    async def ask_back(context: RequestContext) -> RemotingCommand:
        answers.append(await context.connection.send_request(RequestCode.GET_CONSUMER_RUNNING_INFO))
        return make_response(context.request, ResponseCode.SUCCESS)

    async def scenario() -> None:
        async with running_server({ECHO: ask_back}) as server:
            async with await RemotingClient.connect(LOOPBACK, server.port) as client:
                await client.request(ECHO)
            assert answers[0].code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED

    run(scenario())


# ------------------------------------------------------------------------------------ client errors


def test_client_request_times_out_and_fails_when_the_connection_closes() -> None:
    gate = Gate()

    async def silent(context: RequestContext) -> None:
        return None

    async def scenario() -> None:
        async with running_server({SILENT: silent, BLOCKING: gate}) as server:
            client = await RemotingClient.connect(LOOPBACK, server.port)
            with pytest.raises(RequestTimeoutError):
                await client.request(SILENT, timeout_seconds=0.2)
            assert client.pending_requests == 0
            pending = asyncio.create_task(client.request(BLOCKING, timeout_seconds=10))
            await poll_until(lambda: len(gate.started) == 1, "the blocking request to start",
                             timeout_seconds=5.0)
            server.connections[0].abort()
            with pytest.raises(ConnectionClosedError):
                await pending
            with pytest.raises(ConnectionClosedError):
                await client.request(SILENT)
            await client.close()
            gate.release.set()

    run(scenario())


# ------------------------------------------------------------------------------------------ life cycle


def test_graceful_stop_finishes_requests_in_progress() -> None:
    gate = Gate()
    closed: list[int] = []

    async def scenario() -> None:
        server = RemotingServer(LOOPBACK, 0)
        server.register(BLOCKING, gate)
        server.add_close_listener(lambda connection: closed.append(connection.connection_id))
        await server.start()
        port = server.port
        client = await RemotingClient.connect(LOOPBACK, port)
        pending = asyncio.create_task(client.request(BLOCKING, timeout_seconds=10))
        await poll_until(lambda: len(gate.started) == 1, "the request to start", timeout_seconds=5.0)
        connection = server.connections[0]
        stopping = asyncio.create_task(server.stop(grace_seconds=10))
        await poll_until(lambda: PAUSED_FOR_STOP in connection.pause_reasons, "reads to stop",
                         timeout_seconds=5.0)
        assert not server.is_serving
        with pytest.raises(OSError):
            await asyncio.open_connection(LOOPBACK, port)
        gate.release.set()
        assert (await pending).code == ResponseCode.SUCCESS
        await stopping
        await client.wait_closed()
        assert closed == [connection.connection_id]
        await server.wait_stopped()

    run(scenario())


def test_broken_invariant_in_a_processor_stops_the_server() -> None:
    async def broken(context: RequestContext) -> RemotingCommand:
        raise InvariantError("queue offsets went backwards")

    async def scenario() -> None:
        server = RemotingServer(LOOPBACK, 0)
        server.register(FAILING, broken)
        await server.start()
        client = await RemotingClient.connect(LOOPBACK, server.port)
        # the answer may lose the race with the stop
        with suppress(ConnectionClosedError):
            await client.request(FAILING, timeout_seconds=5)
        with pytest.raises(InvariantError, match="went backwards"):
            await server.wait_stopped()
        await client.wait_closed()

    run(scenario())


def test_register_rejects_duplicates_and_bad_arguments() -> None:
    server = RemotingServer(LOOPBACK, 0)
    server.register([ECHO, SILENT], echo)
    assert server.registered_codes == {ECHO, SILENT}
    with pytest.raises(ValueError, match="already has a processor"):
        server.register(ECHO, echo)
    with pytest.raises(ValueError):
        server.register(BLOCKING, echo, queue_max=0)
    with pytest.raises(ValueError):
        server.register([], echo)


def test_oneway_flag_constant_matches_the_wire() -> None:
    assert make_request(ECHO, 1, oneway=True).flag == ONEWAY_FLAG
