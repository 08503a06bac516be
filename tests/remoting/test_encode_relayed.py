"""codec.encode_relayed, the frame a member relays (a client's request to the leader under the member link's
opaque and with the forwarded-for field; the leader's answer back under the client's opaque), written without
building the changed command: byte for byte what encode_frame(replace(command, ...)) writes, errors included.
And a connection's answer whose only difference from its request is the opaque is framed that way.

Derandomized, no example database: the same examples on every run."""

from __future__ import annotations

import dataclasses
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.codec import EncodeError, FrameDecoder, encode_frame, encode_relayed
from protocol.codes import SerializeType
from protocol.command import ONEWAY_FLAG, RESPONSE_FLAG, RemotingCommand
from protocol.limits import CodecLimits

DETERMINISTIC = settings(derandomize=True, database=None, deadline=None, max_examples=400)
TEXT = st.text(max_size=12)  # lone surrogates included: both ways refuse them by EncodeError
INT32 = st.integers(-(2**31), 2**31 - 1)
INT16 = st.integers(-(2**15), 2**15 - 1)
FIELDS = st.dictionaries(TEXT, TEXT, max_size=5)

COMMANDS = st.builds(
    RemotingCommand,
    code=INT16,
    opaque=INT32,
    flag=st.sampled_from([0, RESPONSE_FLAG, ONEWAY_FLAG, RESPONSE_FLAG | ONEWAY_FLAG]),
    language=st.sampled_from(["JAVA", "CPP", "PYTHON", "GO"]),
    version=INT16,
    remark=st.one_of(st.none(), TEXT),
    ext_fields=FIELDS,
    body=st.binary(max_size=100),
    serialize_type=st.sampled_from([SerializeType.JSON, SerializeType.ROCKETMQ]),
)


def limits_of(frame_max: int) -> CodecLimits:
    return CodecLimits(frame_size_max_bytes=frame_max, header_size_max_bytes=frame_max - 8,
                       body_size_max_bytes=frame_max - 8, ext_field_value_max_bytes=32, remark_max_bytes=32)


def general(command: RemotingCommand, opaque: int, ext_fields: dict[str, str] | None,
            limits: CodecLimits) -> bytes | type[EncodeError]:
    changed = dataclasses.replace(command, opaque=opaque) if ext_fields is None else \
        dataclasses.replace(command, opaque=opaque, ext_fields=ext_fields)
    try:
        return encode_frame(changed, limits)
    except EncodeError:
        return EncodeError


def relayed(command: RemotingCommand, opaque: int, ext_fields: dict[str, str] | None,
            limits: CodecLimits) -> bytes | type[EncodeError]:
    try:
        return encode_relayed(command, opaque, ext_fields, limits)
    except EncodeError:
        return EncodeError


@DETERMINISTIC
@given(COMMANDS, INT32, st.one_of(st.none(), FIELDS), st.integers(48, 600))
def test_the_relayed_frame_is_the_general_one(command: RemotingCommand, opaque: int,
                                              ext_fields: dict[str, str] | None, frame_max: int) -> None:
    limits = limits_of(frame_max)
    assert relayed(command, opaque, ext_fields, limits) == general(command, opaque, ext_fields, limits)


def test_a_relayed_request_decodes_as_the_request_with_the_new_opaque_and_fields() -> None:
    request = RemotingCommand(code=310, opaque=77, flag=0, language="CPP", version=435, remark="r",
                              ext_fields={"a": "1", "b": "é\x02"}, body=b"\x00body")
    frame = encode_relayed(request, 5, {**request.ext_fields, "raftmqForwardedFor": "10.0.0.1:5"})
    decoder = FrameDecoder()
    decoder.feed(frame)
    decoded = decoder.next_frame()
    assert decoded == dataclasses.replace(request, opaque=5,
                                          ext_fields={"a": "1", "b": "é\x02", "raftmqForwardedFor": "10.0.0.1:5"})
    (length,) = struct.unpack_from(">i", frame)
    assert length == len(frame) - 4


def test_a_frame_over_the_limit_is_refused_as_encode_frame_refuses_it() -> None:
    limits = limits_of(64)
    command = RemotingCommand(code=10, opaque=1, body=b"x" * 100)
    with pytest.raises(EncodeError, match="exceeds frame_size_max_bytes=64"):
        encode_relayed(command, 2, None, limits)
