"""codec.encode_json_request, the frame of every request a client sends, written without building the
command: byte for byte what encode_frame(make_request(...)) writes, and None (the general path then builds
the command and names what is wrong) for anything else.

Derandomized, no example database: the same examples on every run."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol import codec
from protocol.client import RemotingClient
from protocol.codec import EncodeError, encode_frame, encode_json_request
from protocol.codes import RequestCode
from protocol.command import InvalidCommandError, make_request
from protocol.limits import CodecLimits

pytestmark = pytest.mark.skipif(codec._fast_dumps is None, reason="orjson is not installed: no fast path to test")

DETERMINISTIC = settings(derandomize=True, database=None, deadline=None, max_examples=400)
TEXT = st.text(max_size=12)  # lone surrogates included: the general path names them
INT32 = st.integers(-(2**31), 2**31 - 1)


def limits_of(frame_max: int) -> CodecLimits:
    return CodecLimits(frame_size_max_bytes=frame_max, header_size_max_bytes=frame_max - 8,
                       body_size_max_bytes=frame_max - 8, ext_field_value_max_bytes=32, remark_max_bytes=32)


def general(code: Any, opaque: Any, ext_fields: Any, body: Any, limits: CodecLimits) -> object:
    try:
        return encode_frame(make_request(code, opaque, ext_fields, body), limits)
    except (EncodeError, InvalidCommandError) as error:
        return type(error)


@DETERMINISTIC
@given(st.one_of(INT32, st.sampled_from(list(RequestCode)), st.integers(), st.booleans()), st.one_of(INT32, st.integers()),
       st.one_of(st.none(), st.dictionaries(TEXT, TEXT, max_size=6),
                 st.dictionaries(TEXT, st.one_of(TEXT, st.integers()), max_size=3)),
       st.binary(max_size=200), st.integers(64, 600))
def test_the_request_frame_is_the_general_one_or_left_to_it(code: int, opaque: int, ext_fields: dict[str, str] | None,
                                                            body: bytes, frame_max: int) -> None:
    limits = limits_of(frame_max)
    frame = encode_json_request(code, opaque, ext_fields, body, limits)
    expected = general(code, opaque, ext_fields, body, limits)
    if frame is not None:
        assert frame == expected
    else:
        assert expected in (EncodeError, InvalidCommandError) or isinstance(expected, bytes)


@pytest.mark.parametrize(("code", "opaque", "ext_fields", "body"), [
    (True, 1, None, b""), (10, 2**31, None, b""), (2**31, 1, None, b""), (10, 1, {"k": 1}, b""),
    (10, 1, {1: "v"}, b""), (10, 1, {"k": "\ud800"}, b""), (10, 1, None, bytearray(b"x")),
])
def test_what_the_general_path_refuses_is_left_to_it(code: Any, opaque: Any, ext_fields: Any, body: Any) -> None:
    assert encode_json_request(code, opaque, ext_fields, body) is None
    assert general(code, opaque, ext_fields, body, CodecLimits()) in (EncodeError, InvalidCommandError)


def test_a_frame_over_the_limit_is_left_to_the_general_path() -> None:
    limits = limits_of(256)
    assert encode_json_request(10, 1, {"k": "v"}, b"x" * 300, limits) is None
    assert general(10, 1, {"k": "v"}, b"x" * 300, limits) is EncodeError
    frame = encode_json_request(RequestCode.SEND_MESSAGE_V2, 1, {"k": "v"}, b"x" * 100, limits)
    assert frame is not None and frame == general(RequestCode.SEND_MESSAGE_V2, 1, {"k": "v"}, b"x" * 100, limits)


def test_a_client_request_that_cannot_be_sent_is_still_refused_by_name() -> None:
    """The client tries the frame writer first; what it leaves is built as a command, which names it."""
    async def scenario() -> None:
        async def never(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.read()

        server = await asyncio.start_server(never, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        client = await RemotingClient.connect("127.0.0.1", port)
        try:
            with pytest.raises(InvalidCommandError, match="ext_fields must map str to str"):
                await client.request(10, {"k": 1}, timeout_seconds=5)  # type: ignore[dict-item]
            assert client.pending_requests == 0
        finally:
            await client.close()
            server.close()
            await server.wait_closed()

    asyncio.run(asyncio.wait_for(scenario(), 20))
