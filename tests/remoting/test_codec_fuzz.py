"""Property and fuzz tests of the remoting codec, plus the corpus replay.

Every Hypothesis test is derandomized (same examples on every run) and keeps no example database,
so the suite is deterministic; the corpus holds the regressions worth pinning by hand.
"""

from __future__ import annotations

import itertools
import json
import struct
from typing import TypeVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocol.codec import FrameDecoder, FrameError, encode_frame
from protocol.codes import LanguageCode, SerializeType
from protocol.command import RemotingCommand
from protocol.limits import CodecLimits
from tests.remoting import CorpusEntry, read_corpus, replay

T = TypeVar("T")

DETERMINISTIC = settings(
    derandomize=True,
    database=None,
    deadline=None,
    max_examples=150,
    suppress_health_check=[HealthCheck.too_slow],
)

INT16 = st.integers(-(2**15), 2**15 - 1)
INT32 = st.integers(-(2**31), 2**31 - 1)
# st.text() never draws lone surrogates, which UTF-8 cannot carry
SHORT_TEXT = st.text(max_size=20)
EXT_FIELDS = st.dictionaries(SHORT_TEXT, st.text(max_size=60), max_size=8)
BODY = st.binary(max_size=300)

JSON_COMMANDS = st.builds(
    RemotingCommand,
    code=INT32,
    opaque=INT32,
    flag=INT32,
    language=st.one_of(st.sampled_from([member.name for member in LanguageCode]), SHORT_TEXT),
    version=INT32,
    remark=st.one_of(st.none(), st.text(max_size=40)),
    ext_fields=EXT_FIELDS,
    body=BODY,
    serialize_type=st.just(SerializeType.JSON),
)
# The binary form has int16 code and version, a language byte, and reads an empty remark as None.
BINARY_COMMANDS = st.builds(
    RemotingCommand,
    code=INT16,
    opaque=INT32,
    flag=INT32,
    language=st.sampled_from([member.name for member in LanguageCode]),
    version=INT16,
    remark=st.one_of(st.none(), st.text(min_size=1, max_size=40)),
    ext_fields=EXT_FIELDS,
    body=BODY,
    serialize_type=st.just(SerializeType.ROCKETMQ),
)
COMMANDS = st.one_of(JSON_COMMANDS, BINARY_COMMANDS)

#: small limits, so random input completes frames and reaches every check
FUZZ_LIMITS = CodecLimits(
    frame_size_max_bytes=2048,
    header_size_max_bytes=512,
    ext_fields_count_max=6,
    ext_field_value_max_bytes=48,
    remark_max_bytes=32,
    body_size_max_bytes=1024,
)

#: a roomier header, so that generated JSON headers get past the size check
JSON_FUZZ_LIMITS = CodecLimits(
    frame_size_max_bytes=8192,
    header_size_max_bytes=4096,
    ext_fields_count_max=6,
    ext_field_value_max_bytes=48,
    remark_max_bytes=32,
    body_size_max_bytes=1024,
)


def plausible_frame(serialize_type: int, header: bytes, body: bytes) -> bytes:
    return struct.pack(">iI", 4 + len(header) + len(body), serialize_type << 24 | len(header)) + header + body


def chunked(data: bytes, cut_points: list[int]) -> list[bytes]:
    cuts = sorted({min(point, len(data)) for point in cut_points} | {0, len(data)})
    return [data[start:end] for start, end in itertools.pairwise(cuts)]


def decode_stream(decoder: FrameDecoder, chunks: list[bytes]) -> list[RemotingCommand]:
    """Feed chunk by chunk as a server does; any FrameError propagates. Checks the buffer bound."""
    commands: list[RemotingCommand] = []
    for chunk in chunks:
        decoder.feed(chunk)
        assert decoder.buffered_bytes < decoder.limits.frame_size_max_bytes + len(chunk)
        while (command := decoder.next_frame()) is not None:
            commands.append(command)
    return commands


def survive(decoder: FrameDecoder, chunks: list[bytes]) -> None:
    """Feed hostile chunks: only FrameError may come out, and the buffer stays within one max frame
    plus the chunk being fed."""
    frame_max = decoder.limits.frame_size_max_bytes
    for chunk in chunks:
        decoder.feed(chunk)
        assert decoder.buffered_bytes < frame_max + len(chunk)
        while True:
            try:
                command = decoder.next_frame()
            except FrameError as error:
                assert str(error)
                if error.fatal:
                    assert decoder.broken
                    return
                continue
            if command is None:
                break
            assert all(type(key) is str and type(value) is str for key, value in command.ext_fields.items())
            assert len(command.body) <= decoder.limits.body_size_max_bytes


# --------------------------------------------------------------------------------------- round trips


@DETERMINISTIC
@given(command=COMMANDS, cut_points=st.lists(st.integers(0, 1000), max_size=6))
def test_round_trip_any_command_any_split(command: RemotingCommand, cut_points: list[int]) -> None:
    frame = encode_frame(command)
    assert decode_stream(FrameDecoder(), chunked(frame, cut_points)) == [command]


@DETERMINISTIC
@given(
    commands=st.lists(COMMANDS, min_size=1, max_size=5),
    cut_points=st.lists(st.integers(0, 3000), max_size=10),
)
def test_round_trip_streams(commands: list[RemotingCommand], cut_points: list[int]) -> None:
    data = b"".join(encode_frame(command) for command in commands)
    assert decode_stream(FrameDecoder(), chunked(data, cut_points)) == commands


JSON_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=10),
)
JSON_VALUES = st.recursive(
    JSON_SCALARS,
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3)
    ),
    max_leaves=8,
)


def mostly(valid: st.SearchStrategy[object]) -> st.SearchStrategy[object]:
    """Nine times in ten a valid value, else any JSON value: later checks run only once earlier ones pass."""
    return st.integers(0, 9).flatmap(lambda choice: JSON_VALUES if choice == 0 else valid)


JSON_HEADERS = st.fixed_dictionaries(
    {
        "code": mostly(INT32),
        "opaque": mostly(INT32),
        "extFields": mostly(
            st.dictionaries(st.text(max_size=8), st.one_of(JSON_SCALARS, JSON_VALUES), max_size=7)
        ),
    },
    optional={
        "flag": mostly(INT32),
        "version": mostly(INT32.map(str)),
        "language": mostly(st.one_of(st.integers(0, 11), st.text(max_size=6))),
        "remark": mostly(st.one_of(st.none(), st.text(max_size=40))),
        "serializeTypeCurrentRPC": JSON_VALUES,
    },
)


@DETERMINISTIC
@given(header=JSON_HEADERS, body=st.binary(max_size=20))
def test_any_json_header_decodes_or_raises_frame_error(header: dict[str, object], body: bytes) -> None:
    """Headers of every JSON shape: a command with string-only extFields, or a FrameError."""
    header_bytes = json.dumps(header).encode()
    frame = struct.pack(">iI", 4 + len(header_bytes) + len(body), len(header_bytes)) + header_bytes + body
    survive(FrameDecoder(JSON_FUZZ_LIMITS), [frame])


def declared(actual: int, bits: int) -> st.SearchStrategy[int]:
    """Nine times in ten the true length, else any value the length field can hold."""
    low, high = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    return st.integers(0, 9).flatmap(
        lambda choice: st.integers(low, high) if choice == 0 else st.just(actual)
    )


def mostly_utf8(max_size: int) -> st.SearchStrategy[bytes]:
    return st.integers(0, 9).flatmap(
        lambda choice: (
            st.binary(max_size=max_size) if choice == 0 else st.text(max_size=max_size).map(str.encode)
        )
    )


def usually(value: T, otherwise: st.SearchStrategy[T]) -> st.SearchStrategy[T]:
    """Nine times in ten ``value``, else a draw from ``otherwise``."""
    return st.integers(0, 9).flatmap(lambda choice: otherwise if choice == 0 else st.just(value))


@st.composite
def binary_headers(draw: st.DrawFn) -> bytes:
    """ROCKETMQ binary headers that are mostly right (language, lengths, UTF-8), so that every check of
    the layout is reached, not just the first."""
    remark = draw(mostly_utf8(40))
    entries = b""
    for key, value in draw(st.lists(st.tuples(mostly_utf8(8), mostly_utf8(60)), max_size=8)):
        entries += struct.pack(">h", draw(declared(len(key), 16))) + key
        entries += struct.pack(">i", draw(declared(len(value), 32))) + value
    language = draw(
        st.integers(0, 9).flatmap(
            lambda choice: st.integers(-128, 127) if choice == 0 else st.integers(0, 11)
        )
    )
    header = (
        struct.pack(">hbhii", draw(INT16), language, draw(INT16), draw(INT32), draw(INT32))
        + struct.pack(">i", draw(declared(len(remark), 32)))
        + remark
        + struct.pack(">i", draw(declared(len(entries), 32)))
        + entries
        + draw(usually(b"", st.binary(min_size=1, max_size=3)))
    )
    return header[: draw(usually(len(header), st.integers(0, 40)))]


@DETERMINISTIC
@given(header=binary_headers(), body=st.binary(max_size=20))
def test_any_binary_header_decodes_or_raises_frame_error(header: bytes, body: bytes) -> None:
    survive(FrameDecoder(JSON_FUZZ_LIMITS), [plausible_frame(1, header, body)])


# ---------------------------------------------------------------------------------------------- fuzz


@settings(DETERMINISTIC, max_examples=300)
@given(data=st.binary(max_size=3000), cut_points=st.lists(st.integers(0, 3000), max_size=8))
def test_random_bytes(data: bytes, cut_points: list[int]) -> None:
    survive(FrameDecoder(FUZZ_LIMITS), chunked(data, cut_points))


@settings(DETERMINISTIC, max_examples=300)
@given(
    serialize_type=st.sampled_from([0, 1, 2, 255]),
    header=st.binary(max_size=600),
    body=st.binary(max_size=50),
    cut_points=st.lists(st.integers(0, 700), max_size=4),
)
def test_random_headers_inside_valid_framing(
    serialize_type: int, header: bytes, body: bytes, cut_points: list[int]
) -> None:
    frame = plausible_frame(serialize_type, header, body)
    survive(FrameDecoder(FUZZ_LIMITS), chunked(frame + frame, cut_points))


Mutation = tuple[str, int, int]
MUTATIONS = st.lists(
    st.tuples(
        st.sampled_from(["flip", "set", "delete", "insert", "truncate", "length"]),
        st.integers(0, 4000),
        st.integers(0, 255),
    ),
    min_size=1,
    max_size=4,
)
INTERESTING_LENGTHS = [-(2**31), -1, 0, 1, 3, 4, 5, 8, 13, 2047, 2048, 2**24 - 1, 2**24, 2**31 - 1]


def mutate(data: bytes, mutations: list[Mutation]) -> bytes:
    mutable = bytearray(data)
    for kind, position, value in mutations:
        if not mutable:
            mutable.append(value)
            continue
        index = position % len(mutable)
        if kind == "flip":
            mutable[index] ^= 1 << (value % 8)
        elif kind == "set":
            mutable[index] = value
        elif kind == "delete":
            del mutable[index]
        elif kind == "insert":
            mutable.insert(index, value)
        elif kind == "truncate":
            del mutable[index:]
        else:  # overwrite an int32 with a boundary value: a length prefix, header word or binary length
            length = INTERESTING_LENGTHS[value % len(INTERESTING_LENGTHS)]
            mutable[index : index + 4] = struct.pack(">i", length)
    return bytes(mutable)


CORPUS = read_corpus()
SMALL_COMMANDS = st.one_of(
    st.builds(
        RemotingCommand,
        code=INT16,
        opaque=INT32,
        ext_fields=st.dictionaries(SHORT_TEXT, SHORT_TEXT, max_size=6),
        remark=st.one_of(st.none(), st.text(min_size=1, max_size=10)),
        body=st.binary(max_size=40),
        serialize_type=st.sampled_from([0, 1]),
    ),
)


@settings(DETERMINISTIC, max_examples=400)
@given(
    seed=st.one_of(
        st.sampled_from([entry.data for entry in CORPUS]),
        st.lists(SMALL_COMMANDS, min_size=1, max_size=3).map(
            lambda cs: b"".join(encode_frame(c) for c in cs)
        ),
    ),
    mutations=MUTATIONS,
    cut_points=st.lists(st.integers(0, 4000), max_size=4),
)
def test_mutated_valid_frames(seed: bytes, mutations: list[Mutation], cut_points: list[int]) -> None:
    data = mutate(seed, mutations)
    survive(FrameDecoder(FUZZ_LIMITS), chunked(data, cut_points))
    survive(FrameDecoder(), chunked(data, cut_points))


# -------------------------------------------------------------------------------------------- corpus


@pytest.mark.parametrize("entry", CORPUS, ids=lambda entry: entry.name)
def test_corpus_replay(entry: CorpusEntry) -> None:
    """Each corpus file decodes to the outcomes it states, read whole and read byte by byte; the frames
    that decode re-encode to frames that decode to the same commands."""
    outcomes, commands = replay(FrameDecoder(), entry.data, len(entry.data))
    assert tuple(outcomes) == entry.expected_outcomes
    byte_outcomes, byte_commands = replay(FrameDecoder(), entry.data, 1)
    assert byte_outcomes == outcomes and byte_commands == commands
    for command in commands:
        assert replay(FrameDecoder(), encode_frame(command), 4096)[1] == [command]


def test_corpus_is_present() -> None:
    names = {entry.name for entry in CORPUS}
    assert {
        "cpp_send_message.hex",
        "cpp_send_batch.hex",
        "cpp_heartbeat.hex",
        "java_broker_send_response.hex",
    } <= names
