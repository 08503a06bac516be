"""protocol._native: the JSON header reader in C takes the headers clients send and gives what the reference
gives for them; whatever it is not sure of it leaves to orjson and the reference, errors included. One row per
kind of header; the fuzzed twin is tests/hardening/test_codec_fast_path_fuzz.py, which decodes every
generated frame with the C reader first, with orjson alone and with the reference alone."""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator

import pytest

from bench.codec_bench import cpp_send_frame
from protocol import codec
from protocol.codec import FrameError, encode_frame, encode_json_answer
from protocol.codes import RequestCode
from protocol.command import RemotingCommand, make_request
from protocol.limits import DEFAULT_LIMITS, CodecLimits

try:
    from protocol import _native
except ImportError:  # not built: the test below that requires it says so
    _native = None  # type: ignore[assignment]

LIMITS = CodecLimits(frame_size_max_bytes=4096, header_size_max_bytes=1024, ext_fields_count_max=12,
                     ext_field_value_max_bytes=64, remark_max_bytes=32, body_size_max_bytes=256)


def raw_frame(header: bytes, body: bytes = b"") -> bytes:
    return struct.pack(">iI", 4 + len(header) + len(body), len(header)) + header + body


def native_reads(frame: bytes, limits: CodecLimits = LIMITS) -> tuple[object, ...] | None:
    assert _native is not None
    header_length = struct.unpack_from(">I", frame, 4)[0] & 0xFFFFFF
    return _native.decode_json_header(frame, 8, 8 + header_length, limits.remark_max_bytes,
                                      limits.ext_fields_count_max, limits.ext_field_value_max_bytes, "JAVA")


@pytest.fixture
def no_native(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(codec, "_native_header", None)
    yield


def outcome(frame: bytes, limits: CodecLimits) -> object:
    try:
        command = codec._decode_frame_content(frame, 4, len(frame), limits)
    except FrameError as error:
        return (type(error).__name__, error.message, error.opaque, error.code, error.flag, error.serialize_type)
    return command, tuple(command.ext_fields.items()), type(command.body)


def reference(frame: bytes, limits: CodecLimits) -> object:
    try:
        command = codec._decode_frame_content_reference(frame, 4, len(frame), limits)
    except FrameError as error:
        return (type(error).__name__, error.message, error.opaque, error.code, error.flag, error.serialize_type)
    return command, tuple(command.ext_fields.items()), type(command.body)


JAVA_SEND = (b'{"code":310,"extFields":{"a":"g","b":"T","c":"TBW102","d":"4","e":"1","f":"0","g":"1700000000123",'
             b'"h":"0","i":"UNIQ_KEY\\u0001AC11\\u0002TAGS\\u0001t\\u0002","j":"0","k":"false","m":"false"},"flag":0,'
             b'"language":"JAVA","opaque":42,"serializeTypeCurrentRPC":"JSON","version":475}')
# fmt: off
ROWS = [
    # (header, the C reader takes it, extFields in order, or the error type)
    pytest.param(JAVA_SEND, True, None, id="java-send-v2-with-escapes-and-an-ignored-field"),
    pytest.param(encode_frame(make_request(RequestCode.SEND_MESSAGE_V2, 7, {"a": "g", "b": "T", "i": "K\x01V\x02"},
                                           b"x"))[8:-1], True, None, id="our-client"),
    pytest.param(b' \t\r\n{ "code" : 10 , "opaque" : -1 , "extFields" : { } }\n', True, {}, id="json-whitespace"),
    pytest.param(b'{"code":10,"opaque":1,"flag":null,"version":null,"language":null,"remark":null,"extFields":null}',
                 True, {}, id="nulls-are-defaults"),
    pytest.param(b'{"code":10,"opaque":1,"opaque":2,"extFields":{"a":"1","b":"2","a":"3"}}', True,
                 {"a": "3", "b": "2"}, id="duplicate-keys-last-value-first-place"),
    pytest.param(b'{"code":10,"opaque":1,"extFields":{"a":null,"b":"2","a":"1","c":null}}', True,
                 {"a": "1", "b": "2"}, id="a-null-keeps-its-place-and-is-dropped"),
    pytest.param(b'{"code":10,"opaque":1,"language":"CPP","extFields":{"n":4,"z":0,"m":-0,"t":true,"f":false}}', True,
                 {"n": "4", "z": "0", "m": "0", "t": "true", "f": "false"}, id="cpp-numbers-and-booleans"),
    pytest.param(b'{"code":10,"opaque":1,"extFields":{"k":"\\ud83d\\ude80 \\u00e9\\u4e3b\\/\\b\\f\\n\\r\\t\\"\\\\"}}',
                 True, {"k": "\U0001f680 \u00e9\u4e3b/\b\f\n\r\t\"\\"}, id="every-escape"),
    pytest.param('{"code":10,"opaque":1,"remark":"é主","extFields":{"é":"主"}}'.encode(), True, {"é": "主"},
                 id="raw-utf8"),
    pytest.param(b'{"code":10,"opaque":1,"extFields":{"k":"\\u0000"}}', True, {"k": "\x00"}, id="escaped-nul"),
    pytest.param(b'{"code":-2147483648,"opaque":2147483647,"flag":0,"other":123,"more":true}', True, {},
                 id="int32-ends-and-ignored-scalars"),
    pytest.param(b'{"code":10,"opaque":1,"language":1}', False, {}, id="language-ordinal"),
    pytest.param(b'{"code":10,"opaque":1,"other":1.5}', False, {}, id="float-in-an-ignored-field"),
    pytest.param(b'{"code":10,"opaque":1,"extFields":{"k":1e5}}', False, {"k": "100000.0"}, id="float-value"),
    pytest.param(b'{"code":10,"opaque":1,"other":{"x":[1]}}', False, {}, id="nested-ignored-field"),
    pytest.param(b'{"code":10,"opaque":1,"extFields":{"k":[1]}}', False, {"k": "[1]"}, id="nested-value"),
    pytest.param(b'{"code":10,"opaque":1,"extFields":{"k":1234567890123456789}}', False,
                 {"k": "1234567890123456789"}, id="nineteen-digits"),
    pytest.param(b'{"code":10,"opaque":1,"extFields":{"a":"1"},"extFields":{"b":"2"}}', False, {"b": "2"},
                 id="ext-fields-twice"),
    pytest.param(b'{"code":10,"opaque":1,"other":"\\ud800","extFields":{"k":"v"}}', False, {"k": "v"},
                 id="lone-surrogate-in-an-ignored-field"),
    pytest.param(b'{"code":10,"opaque":1,"remark":"\\ud800"}', False, codec.HeaderEncodingError,
                 id="lone-high-surrogate"),
    pytest.param(b'{"code":10,"opaque":1,"remark":"\\udc00\\ud800"}', False, codec.HeaderEncodingError,
                 id="reversed-surrogates"),
    pytest.param(b'{"code":10,"opaque":1,"remark":"\xed\xa0\x80"}', False, codec.HeaderEncodingError,
                 id="utf8-encoded-surrogate"),
    pytest.param(b'{"code":10,"opaque":1,"remark":"\xc0\x80"}', False, codec.HeaderEncodingError, id="overlong-utf8"),
    pytest.param(b'{"code":10,"opaque":1,"remark":"\xff"}', False, codec.HeaderEncodingError, id="invalid-utf8"),
    pytest.param(b'{"code":10,"opaque":1,"remark":"a\x1fb"}', False, codec.HeaderSyntaxError, id="control-character"),
    pytest.param(b'{"code":10,"opaque":1,"remark":"\\x"}', False, codec.HeaderSyntaxError, id="unknown-escape"),
    pytest.param(b'{"code":10,"opaque":1,"remark":"\\u12"}', False, codec.HeaderSyntaxError, id="short-u-escape"),
    pytest.param(b'{"code":10,"opaque":01}', False, codec.HeaderSyntaxError, id="leading-zero"),
    pytest.param(b'{"code":10,"opaque":-}', False, codec.HeaderSyntaxError, id="sign-alone"),
    pytest.param(b'{"code":10,"opaque":2147483648}', False, codec.HeaderFieldError, id="opaque-past-int32"),
    pytest.param(b'{"code":10,"opaque":1,"version":true}', False, codec.HeaderFieldError, id="version-boolean"),
    pytest.param(b'{"code":"10","opaque":1}', False, {}, id="code-as-text"),
    pytest.param(b'{"opaque":1}', False, codec.HeaderFieldError, id="no-code"),
    pytest.param(b'{"code":10,"opaque":null}', False, codec.HeaderFieldError, id="null-opaque"),
    pytest.param(b'{}', False, codec.HeaderFieldError, id="empty-object"),
    pytest.param(b'[10,1]', False, codec.HeaderSyntaxError, id="not-an-object"),
    pytest.param(b'{"code":10,"opaque":1,}', False, codec.HeaderSyntaxError, id="trailing-comma"),
    pytest.param(b'{"code":10,"opaque":1}x', False, codec.HeaderSyntaxError, id="trailing-text"),
    pytest.param(b'{"code":10,"opaque":1}\x0c', False, codec.HeaderSyntaxError, id="not-json-whitespace"),
    pytest.param(b'\xef\xbb\xbf{"code":10,"opaque":1}', False, codec.HeaderSyntaxError, id="byte-order-mark"),
    pytest.param(b'{"code":10,"opaque":1,"remark":"' + b"r" * 33 + b'"}', False, codec.RemarkTooLargeError,
                 id="remark-past-its-limit"),
    pytest.param(('{"code":10,"opaque":1,"remark":"' + "é" * 17 + '"}').encode(), False,
                 codec.RemarkTooLargeError, id="remark-past-its-limit-in-bytes"),
    pytest.param(('{"code":10,"opaque":1,"extFields":{"k":"' + "é" * 33 + '"}}').encode(), False,
                 codec.ExtFieldValueTooLargeError, id="value-past-its-limit-in-bytes"),
    pytest.param(json.dumps({"code": 10, "opaque": 1, "extFields": {chr(97 + n): str(n) for n in range(13)}}).encode(),
                 False, codec.TooManyExtFieldsError, id="too-many-ext-fields"),
    pytest.param(b'{"code":10,"opaque":1,"extFields":{' + b",".join(b'"%c":"%d"' % (97 + n, n) for n in range(12))
                 + b',"a":"x","z":null}}', False, codec.TooManyExtFieldsError, id="a-null-counts"),
    pytest.param(b'{"code":10,"opaque":1,"extFields":{' + b",".join(b'"%c":"%d"' % (97 + n, n) for n in range(12))
                 + b',"a":"x"}}', True, {"a": "x", **{chr(97 + n): str(n) for n in range(1, 12)}},
                 id="a-repeated-key-counts-once"),
    pytest.param(b'{"code":10,"opaque":1,"remark":"' + b"r" * 32 + b'","extFields":{"k":"' + b"v" * 64 + b'"}}',
                 True, {"k": "v" * 64}, id="values-at-their-limits"),
]
# fmt: on


@pytest.mark.parametrize(("header", "native_takes", "expected"), ROWS)
def test_the_c_reader_takes_what_it_is_sure_of_and_decodes_as_the_reference(
    header: bytes, native_takes: bool, expected: dict[str, str] | type[FrameError] | None
) -> None:
    assert _native is not None and codec._native_header is not None, "protocol._native was not built (setup.py)"
    frame = raw_frame(header, b"body")
    assert (native_reads(frame) is not None) is native_takes
    decoded = outcome(frame, LIMITS)
    assert decoded == reference(frame, LIMITS)
    if expected is None:
        assert isinstance(decoded, tuple) and isinstance(decoded[0], RemotingCommand)
    elif isinstance(expected, dict):
        assert isinstance(decoded, tuple) and isinstance(decoded[0], RemotingCommand), decoded
        assert decoded[1] == tuple(expected.items())
    else:
        assert isinstance(decoded, tuple) and decoded[0] == expected.__name__, decoded


@pytest.mark.parametrize(("header", "native_takes", "expected"), ROWS)
def test_without_the_c_reader_every_row_decodes_the_same(
    header: bytes, native_takes: bool, expected: object, no_native: None
) -> None:
    frame = raw_frame(header, b"body")
    assert outcome(frame, LIMITS) == reference(frame, LIMITS)


def test_the_c_reader_takes_the_send_path_frames_of_every_client() -> None:
    """A request as our client and broker_bench send it, the broker's answer, and the C++ client's send."""
    assert _native is not None, "protocol._native was not built (setup.py)"
    answer = encode_json_answer(5, 0, {"msgId": "7F0000010000A1B2", "queueId": "1", "queueOffset": "12"})
    assert answer is not None
    ours = encode_frame(make_request(RequestCode.SEND_MESSAGE_V2, 9, {"a": "g", "b": "T", "i": "K\x01V\x02"},
                                     b"x" * 1024))
    for frame in (answer, ours, cpp_send_frame()):
        assert native_reads(frame, DEFAULT_LIMITS) is not None
        assert outcome(frame, DEFAULT_LIMITS) == reference(frame, DEFAULT_LIMITS)


def test_the_c_reader_reads_inside_a_larger_buffer_and_checks_its_bounds() -> None:
    assert _native is not None, "protocol._native was not built (setup.py)"
    header = b'{"code":10,"opaque":3,"extFields":{"k":"v"}}'
    buffer = bytearray(b"xx" + header + b"yy")
    assert _native.decode_json_header(buffer, 2, 2 + len(header), 32, 4, 64, "JAVA") == (
        10, "JAVA", 0, 3, 0, None, {"k": "v"})
    assert _native.decode_json_header(buffer, 2, 1 + len(header), 32, 4, 64, "JAVA") is None  # cut short
    for start, end in ((-1, 4), (4, 2), (0, len(buffer) + 1)):
        with pytest.raises(ValueError):
            _native.decode_json_header(buffer, start, end, 32, 4, 64, "JAVA")
    with pytest.raises(TypeError):
        _native.decode_json_header("text", 0, 1, 32, 4, 64, "JAVA")  # type: ignore[arg-type]


def test_a_long_escaped_value_is_read_whole() -> None:
    """The unescaping buffer grows past its first size."""
    value = "\x01\x02é" * 400
    frame = encode_frame(make_request(10, 1, {"k": value}))
    header_length = struct.unpack_from(">I", frame, 4)[0] & 0xFFFFFF
    assert _native is not None, "protocol._native was not built (setup.py)"
    read = _native.decode_json_header(frame, 8, 8 + header_length, 256, 64, 1 << 20, "JAVA")
    assert read is not None and read[6] == {"k": value}


def test_json_dumps_of_random_like_headers_agree() -> None:
    """A few hundred headers json.dumps writes (ASCII and not), through both readers."""
    for index in range(300):
        fields = {f"k{index % 7}": "v" * (index % 70), "é" * (index % 3): chr(0x20 + index) * (index % 5),
                  "n": str(index * 7919)}
        header = json.dumps({"code": index, "opaque": -index, "flag": index % 3, "language": "GO",
                             "remark": None if index % 2 else "r" * (index % 40), "extFields": fields},
                            ensure_ascii=bool(index % 2)).encode()
        frame = raw_frame(header)
        assert outcome(frame, LIMITS) == reference(frame, LIMITS), header
