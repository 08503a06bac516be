"""The codec's fast path fuzzed against its reference: whatever the bytes, the orjson path and the stdlib
path give the same command (extFields order included) or the same error (type, message, what is known
of the frame), and encode to the same bytes or the same error; the send header's in-place read of
one-letter names against the renamed copy it replaces.

Derandomized, no example database: the same examples on every run. The tables of each known
difference are in tests/broker/test_codec_fast_path.py.
"""

from __future__ import annotations

import itertools
import json
import struct
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TypeVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.requests import INT32_MAX, INT32_MIN, V2_NAMES, RequestError, SendHeader, boolean, integer, text
from protocol import codec
from protocol.codec import EncodeError, FrameDecoder, FrameError, encode_frame
from protocol.codes import RequestCode
from protocol.command import RemotingCommand, make_request
from protocol.limits import DEFAULT_LIMITS, CodecLimits
from tests.remoting import read_corpus

pytestmark = pytest.mark.skipif(codec._fast_loads is None, reason="orjson is not installed: no fast path to test")
T = TypeVar("T")

DETERMINISTIC = settings(derandomize=True, database=None, deadline=None, max_examples=400,
                         suppress_health_check=[HealthCheck.too_slow])
FUZZ_LIMITS = CodecLimits(frame_size_max_bytes=8192, header_size_max_bytes=4096, ext_fields_count_max=6,
                          ext_field_value_max_bytes=48, remark_max_bytes=32, body_size_max_bytes=1024)


@contextmanager
def reference_only() -> Iterator[None]:
    """The codec as it is without orjson and the C header reader (a fixture would last the whole Hypothesis
    test)."""
    saved = codec._fast_loads, codec._fast_dumps, codec._native_header
    codec._fast_loads = codec._fast_dumps = codec._native_header = None
    try:
        yield
    finally:
        codec._fast_loads, codec._fast_dumps, codec._native_header = saved


@contextmanager
def without_native() -> Iterator[None]:
    """The codec as it is where protocol._native is not built: orjson reads every header the reference
    does not."""
    saved = codec._native_header
    codec._native_header = None
    try:
        yield
    finally:
        codec._native_header = saved


def outcomes(data: bytes, limits: CodecLimits, chunk_size: int) -> list[object]:
    """Every frame of ``data`` as a server decodes it: the command with its extFields order, or the whole
    error; a fatal error ends the stream."""
    decoder = FrameDecoder(limits)
    seen: list[object] = []
    for start in range(0, len(data), chunk_size):
        decoder.feed(data[start : start + chunk_size])
        while True:
            try:
                command = decoder.next_frame()
            except FrameError as error:
                seen.append((type(error).__name__, error.message, error.opaque, error.code, error.flag,
                             error.serialize_type, error.fatal))
                if error.fatal:
                    return seen
                continue
            if command is None:
                break
            seen.append((command, tuple(command.ext_fields.items())))
    seen.append(decoder.buffered_bytes)
    return seen


def assert_same_decoding(data: bytes, limits: CodecLimits = DEFAULT_LIMITS, chunk_size: int = 1 << 20) -> None:
    fast = outcomes(data, limits, chunk_size)  # the C reader first, where it is built, then orjson
    with reference_only():
        reference = outcomes(data, limits, chunk_size)
    assert fast == reference
    if codec._native_header is not None:
        with without_native():
            assert outcomes(data, limits, chunk_size) == reference


def frame(header: bytes, body: bytes = b"") -> bytes:
    return struct.pack(">iI", 4 + len(header) + len(body), len(header)) + header + body


# ------------------------------------------------------------------------------------ JSON-like headers
# Text built from tokens, not from Python values, so that what json.dumps never writes is drawn too:
# duplicate keys, lone and paired surrogate escapes, integers beyond 64 bits, numbers beyond a double,
# raw control characters, invalid UTF-8, leading zeros, stray whitespace, deep nesting.

NUMBERS = st.one_of(
    st.integers(-(2**31), 2**31 - 1).map(str),
    st.integers(-(2**80), 2**80).map(str),
    st.sampled_from(["0", "-0", "1e400", "-1e400", "1.5", "1e5", "1E+2", "-0.0", "4.9e-324", "01", "1.", "-",
                     ".5", "NaN", "Infinity", "9" * 30, "18446744073709551616", "-9223372036854775809"]),
)
ESCAPES = st.sampled_from(["\\ud800", "\\udfff", "\\ud83d\\ude80", "\\uDBFF\\uDFFF", "\\ud800\\ud800", "\\u0000",
                           "\\u0001", "\\n", "\\\"", "\\\\", "\\/", "\\x", "\\u12"])
RAW_PIECES = st.one_of(
    st.text(max_size=6).map(lambda text: text.replace("\\", "").replace('"', "").encode()),
    st.sampled_from([b"\xff", b"\xed\xa0\x80", b"\xc0\x80", b"\xf4\x90\x80\x80", b"\x1f", b"\x00", b"\x7f",
                     b"\xe2\x80\xa8", "é".encode(), "主".encode()]),
)
HOSTILE_STRINGS = st.lists(st.one_of(RAW_PIECES, ESCAPES.map(str.encode)), max_size=4).map(
    lambda pieces: b'"' + b"".join(pieces) + b'"'
)
# up to past FUZZ_LIMITS' value and remark limits, in characters and in UTF-8 bytes
PLAIN_STRINGS = st.tuples(st.one_of(st.text(max_size=12), st.text(min_size=20, max_size=60),
                                    st.text("é主", min_size=10, max_size=30)),
                          st.booleans()).map(
    lambda drawn: json.dumps(drawn[0], ensure_ascii=drawn[1]).encode()
)
STRINGS = st.one_of(PLAIN_STRINGS, PLAIN_STRINGS, HOSTILE_STRINGS)
KEYS = st.one_of(
    st.sampled_from(["code", "opaque", "flag", "version", "language", "remark", "extFields",
                     "serializeTypeCurrentRPC"]).map(lambda key: f'"{key}"'.encode()),
    STRINGS,
)
SPACES = st.sampled_from([b"", b"", b"", b" ", b"\n", b"\t\r", b"\x0c", b"\xef\xbb\xbf"])
LITERALS = st.sampled_from([b"true", b"false", b"null"])


def json_values(depth: int) -> st.SearchStrategy[bytes]:
    scalars = st.one_of(NUMBERS.map(str.encode), STRINGS, STRINGS, LITERALS)
    if depth == 0:
        return scalars
    inner = json_values(depth - 1)
    arrays = st.lists(inner, max_size=3).map(lambda items: b"[" + b",".join(items) + b"]")
    objects = st.lists(st.tuples(KEYS, inner), max_size=4).map(
        lambda pairs: b"{" + b",".join(key + b":" + value for key, value in pairs) + b"}"
    )
    return st.one_of(scalars, scalars, arrays, objects)


def rarely(common: st.SearchStrategy[T], rare: st.SearchStrategy[T]) -> st.SearchStrategy[T]:
    """One time in ten ``rare``: a header holds many values, and one flaw is enough to leave the fast path."""
    return st.integers(0, 9).flatmap(lambda choice: rare if choice == 0 else common)


# past int32 within 64 bits one time in ten (the range checks)
PLAIN_INTEGERS = rarely(st.integers(-(2**31), 2**31 - 1),
                        st.one_of(st.integers(2**31, 2**64 - 1), st.integers(-(2**63), -(2**31) - 1))).map(
    lambda number: str(number).encode()
)

#: what orjson reads as a float and the stdlib as an exact int
BEYOND_64_BITS = st.one_of(st.integers(2**64, 2**90), st.integers(-(2**90), -(2**63) - 1)).map(
    lambda number: str(number).encode()
)


def json_object(pairs: list[tuple[bytes, bytes]], space: bytes = b"") -> bytes:
    return b"{" + b",".join(space + key + b":" + value for key, value in pairs) + b"}"


@st.composite
def headers(draw: st.DrawFn) -> bytes:
    """Half the headers plain (what the fast path takes, or a limit or range it must leave to the
    reference), half with anything JSON-like in any field."""
    if draw(st.booleans()):
        integers, strings, anything = PLAIN_INTEGERS, PLAIN_STRINGS, PLAIN_STRINGS
        ext_values = rarely(st.one_of(PLAIN_STRINGS, PLAIN_STRINGS, PLAIN_INTEGERS, LITERALS), BEYOND_64_BITS)
        languages = st.sampled_from([b'"JAVA"', b'"CPP"', b'"RUST"', b"3", b"null"])
        extra_keys, space = st.sampled_from([b'"serializeTypeCurrentRPC"', b'"x"']), b""
    else:
        integers = st.one_of(PLAIN_INTEGERS, NUMBERS.map(str.encode), json_values(0))
        strings = STRINGS
        ext_values = st.one_of(STRINGS, NUMBERS.map(str.encode), LITERALS, json_values(2))
        anything = json_values(2)
        languages = st.one_of(st.sampled_from([b'"JAVA"', b"3", b"12", b"null"]), json_values(1))
        extra_keys, space = KEYS, draw(SPACES)
    pairs = [(b'"code"', draw(integers)), (b'"opaque"', draw(integers))]
    ext_keys = st.one_of(strings, st.sampled_from([b'"a"', b'"b"', b'"i"']))
    pairs.append((b'"extFields"', json_object(draw(st.lists(st.tuples(ext_keys, ext_values), max_size=7)))))
    optional = {b'"flag"': integers, b'"version"': integers, b'"remark"': strings, b'"language"': languages}
    pairs += [(key, draw(values)) for key, values in optional.items() if draw(st.booleans())]
    pairs += draw(st.lists(st.tuples(extra_keys, anything), max_size=2))
    text = json_object(draw(st.permutations(pairs)), space) + space
    if draw(st.integers(0, 19)) == 0:  # nesting around orjson's depth limit (1024)
        depth = draw(st.sampled_from([1000, 1023, 1024, 1025, 1100]))
        text = text[:-1] + b',"deep":' + b"[" * depth + b"]" * depth + b"}"
    return text


@DETERMINISTIC
@given(header=headers(), body=st.sampled_from([b"", b"\x00body", bytes(1024), bytes(1025)]))  # FUZZ_LIMITS: 1024
def test_any_json_like_header_decodes_the_same_on_both_paths(header: bytes, body: bytes) -> None:
    assert_same_decoding(frame(header, body))
    assert_same_decoding(frame(header, body), FUZZ_LIMITS)


# ------------------------------------------------------------------------------------ mutated streams

MUTATIONS = st.lists(st.tuples(st.sampled_from(["flip", "set", "delete", "insert", "truncate"]),
                               st.integers(0, 4000), st.integers(0, 255)), min_size=1, max_size=4)


def mutate(data: bytes, mutations: list[tuple[str, int, int]]) -> bytes:
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
        else:
            del mutable[index:]
    return bytes(mutable)


CORPUS_DATA = [entry.data for entry in read_corpus()]


@settings(DETERMINISTIC, max_examples=600)
@given(seed=st.sampled_from(CORPUS_DATA), mutations=MUTATIONS, chunk_size=st.sampled_from([1, 7, 1 << 20]))
def test_mutated_corpus_decodes_the_same_on_both_paths(
    seed: bytes, mutations: list[tuple[str, int, int]], chunk_size: int
) -> None:
    data = mutate(seed, mutations)
    assert_same_decoding(data, chunk_size=chunk_size)
    assert_same_decoding(data, FUZZ_LIMITS, chunk_size)


# -------------------------------------------------------------------------------------------- encode

ANY_TEXT = st.lists(st.one_of(st.characters(), st.integers(0xD800, 0xDFFF).map(chr)), max_size=12).map("".join)
MOSTLY_TEXT = st.one_of(st.text(max_size=12), st.text(max_size=12), ANY_TEXT)


@DETERMINISTIC
@given(
    command=st.builds(
        RemotingCommand,
        code=st.integers(-(2**31), 2**31 - 1),
        opaque=st.integers(-(2**31), 2**31 - 1),
        flag=st.integers(-(2**31), 2**31 - 1),
        language=MOSTLY_TEXT,
        version=st.integers(-(2**31), 2**31 - 1),
        remark=st.one_of(st.none(), MOSTLY_TEXT),
        ext_fields=st.dictionaries(MOSTLY_TEXT, MOSTLY_TEXT, max_size=5),
        body=st.binary(max_size=8),
    )
)
def test_any_command_encodes_the_same_on_both_paths(command: RemotingCommand) -> None:
    def encoded() -> bytes | str:
        try:
            return encode_frame(command)
        except EncodeError as error:
            return str(error)

    fast = encoded()
    with reference_only():
        assert encoded() == fast
    if isinstance(fast, bytes):
        assert_same_decoding(fast)


# ---------------------------------------------------------------------------------------- send header

NAMES = [*V2_NAMES, *V2_NAMES.values(), "AccessKey", "unitMode"]
VALUES = st.one_of(st.sampled_from(["", " ", "0", "1", "-1", " 7 ", "1_0", "١", "+3", "true", "TRUE", "false", "x",
                                    "1024", "1025", str(2**31), str(2**63), "1700000000123"]), st.text(max_size=4))
LONG_NAMES = dict(V2_NAMES)


def renamed_parse(fields: Mapping[str, str], v2: bool) -> SendHeader:
    """``SendHeader.parse`` as it was before it read one-letter names in place: rename, then read."""
    if v2 or ("a" in fields and "b" in fields):
        fields = {LONG_NAMES.get(key, key): value for key, value in fields.items()}
    max_reconsume = fields.get("maxReconsumeTimes")
    return SendHeader(
        producer_group=text(fields, "producerGroup"),
        topic=text(fields, "topic"),
        default_topic=text(fields, "defaultTopic", "TBW102"),
        default_topic_queue_nums=integer(fields, "defaultTopicQueueNums", 4, 1, 1024),
        queue_id=integer(fields, "queueId", -1, INT32_MIN, INT32_MAX),
        sys_flag=integer(fields, "sysFlag", 0, INT32_MIN, INT32_MAX),
        born_timestamp=integer(fields, "bornTimestamp"),
        flag=integer(fields, "flag", 0, INT32_MIN, INT32_MAX),
        properties=fields.get("properties") or "",
        reconsume_times=integer(fields, "reconsumeTimes", 0, 0, INT32_MAX),
        max_reconsume_times=None if not max_reconsume else integer(fields, "maxReconsumeTimes", 16, -1, INT32_MAX),
        batch=boolean(fields, "batch"),
    )


def parsed(parse: object, fields: Mapping[str, str], v2: bool) -> object:
    assert callable(parse)
    try:
        return parse(fields, v2)
    except RequestError as error:
        return (error.code, error.remark)


@DETERMINISTIC
@given(
    pairs=st.lists(st.tuples(st.sampled_from(NAMES), VALUES), max_size=16),
    required=st.booleans(),
    v2=st.booleans(),
)
def test_send_header_reads_the_same_as_the_renamed_copy(
    pairs: list[tuple[str, str]], required: bool, v2: bool
) -> None:
    fields = dict(itertools.chain([("a", "g"), ("b", "T"), ("g", "1")] if required else [], pairs))
    assert parsed(SendHeader.parse, fields, v2) == parsed(renamed_parse, fields, v2)


SHORT_FIELDS = {"a": "g", "b": "T", "c": "TBW102", "d": "8", "e": "2", "f": "4", "g": "1700000000123", "h": "7",
                "i": "K\x01V\x02", "j": "3", "k": "false", "l": "5", "m": "false", "n": "broker-a"}


@pytest.mark.parametrize(
    ("fields", "v2"),
    [
        (SHORT_FIELDS, True),
        (SHORT_FIELDS, False),
        ({"a": "g", "b": "T", "g": "5"}, True),
        ({**SHORT_FIELDS, "producerGroup": "other"}, True),  # both names: the later one wins
        ({"producerGroup": "other", **SHORT_FIELDS}, True),
        ({**SHORT_FIELDS, "AccessKey": "ak"}, True),
        ({**SHORT_FIELDS, "d": "0"}, True),
        ({**SHORT_FIELDS, "e": " 3 "}, True),
        ({**SHORT_FIELDS, "g": ""}, True),
        ({**SHORT_FIELDS, "l": ""}, True),
        ({**SHORT_FIELDS, "m": "maybe"}, True),
        ({key: value for key, value in SHORT_FIELDS.items() if key != "a"}, True),
        ({"b": "T", "g": "1"}, True),
    ],
    ids=["v2", "v2-by-names", "few", "both-names-later-wins", "both-names-earlier", "acl-fields",
         "queue-nums-range", "padded", "empty-born", "empty-max-reconsume", "bad-batch", "no-group", "only-b"],
)
def test_send_header_reads_one_letter_names_in_place_as_the_renamed_copy(
    fields: dict[str, str], v2: bool
) -> None:
    ext_fields = make_request(RequestCode.SEND_MESSAGE_V2, 1, fields).ext_fields  # a read-only view, as decoded
    assert parsed(SendHeader.parse, ext_fields, v2) == parsed(renamed_parse, ext_fields, v2)
