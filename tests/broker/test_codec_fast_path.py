"""The codec's fast path (orjson headers, commands built without a second check) against its reference
(the stdlib JSON path), one table row per way orjson and the stdlib differ; the send header's errors;
the send response. Fuzzed twins: tests/hardening/test_codec_fast_path_fuzz.py.
"""

from __future__ import annotations

import dataclasses
import json
import os
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import MappingProxyType

import pytest

from broker.requests import RequestError, SendHeader
from broker.send import SendProcessor
from commitlog.hosts import encode_host
from commitlog.outcomes import AppendResult, AppendStatus
from protocol import codec
from protocol.codec import (
    EncodeError,
    FrameDecoder,
    FrameError,
    HeaderEncodingError,
    HeaderFieldError,
    HeaderSyntaxError,
    decode_frame,
    encode_frame,
)
from protocol.codes import RequestCode, ResponseCode
from protocol.command import RemotingCommand, make_request
from protocol.limits import DEFAULT_LIMITS, CodecLimits
from tests.remoting import read_corpus, replay

pytestmark = pytest.mark.skipif(codec._fast_loads is None, reason="orjson is not installed: no fast path to test")

SMALL_LIMITS = CodecLimits(
    frame_size_max_bytes=4096,
    header_size_max_bytes=1024,
    ext_fields_count_max=4,
    ext_field_value_max_bytes=64,
    remark_max_bytes=32,
    body_size_max_bytes=256,
)


def raw_frame(header: bytes, body: bytes = b"") -> bytes:
    return struct.pack(">iI", 4 + len(header) + len(body), len(header)) + header + body


Outcome = tuple[object, ...]


def describe(decode: object, frame: bytes, limits: CodecLimits) -> Outcome:
    """A decode's result, comparable: the command with its extFields order, or the whole error."""
    assert callable(decode)
    try:
        command = decode(frame, 4, len(frame), limits)
    except FrameError as error:
        return (type(error).__name__, error.message, error.opaque, error.code, error.flag, error.serialize_type)
    assert isinstance(command, RemotingCommand)
    return ("ok", command, tuple(command.ext_fields.items()), type(command.body))


def fast(frame: bytes, limits: CodecLimits = DEFAULT_LIMITS) -> Outcome:
    return describe(codec._decode_frame_content, frame, limits)


def reference(frame: bytes, limits: CodecLimits = DEFAULT_LIMITS) -> Outcome:
    return describe(codec._decode_frame_content_reference, frame, limits)


def takes_fast_path(frame: bytes, limits: CodecLimits = DEFAULT_LIMITS) -> bool:
    return codec._decode_json_header_fast(frame[8 : 8 + (struct.unpack_from(">I", frame, 4)[0] & 0xFFFFFF)],
                                          limits) is not None


@pytest.fixture
def stdlib_only(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(codec, "_fast_loads", None)
    monkeypatch.setattr(codec, "_native_header", None)
    monkeypatch.setattr(codec, "_fast_dumps", None)
    yield


# ----------------------------------------------------------------------- where orjson and json differ

BIG = 2**70
# fmt: off
DIFFERENCES = [
    # (header, fast path takes it, what the decode gives: extFields, or the error type)
    pytest.param(b'{"code":10,"opaque":1,"extFields":{"k":%d}}' % BIG, False, {"k": str(BIG)},
                 id="ext-int-beyond-64-bits-stays-exact"),
    pytest.param(b'{"code":10,"opaque":1,"extFields":{"k":%d}}' % -BIG, False, {"k": str(-BIG)},
                 id="ext-negative-int-beyond-64-bits-stays-exact"),
    pytest.param(b'{"code":10,"opaque":1,"extFields":{"k":18446744073709551615}}', True,
                 {"k": "18446744073709551615"}, id="ext-uint64-max-exact-on-both"),
    pytest.param(b'{"code":10,"opaque":1,"extFields":{"k":[%d]}}' % BIG, False, {"k": f"[{BIG}]"},
                 id="ext-nested-big-int-stays-exact"),
    pytest.param(b'{"code":%d,"opaque":1}' % BIG, False, HeaderFieldError, id="code-beyond-64-bits-named-exactly"),
    pytest.param(b'{"code":10,"opaque":1,"extFields":{"k":1e400,"m":-1e400}}', False, {"k": "inf", "m": "-inf"},
                 id="ext-number-beyond-double-is-inf-as-stdlib"),
    pytest.param(b'{"code":10,"opaque":1,"extFields":{"k":1.5,"m":1e5}}', False, {"k": "1.5", "m": "100000.0"},
                 id="ext-floats-through-the-reference"),
    pytest.param(b'{"code":10,"opaque":1,"remark":"\\ud800"}', False, HeaderEncodingError,
                 id="lone-surrogate-escape-remark"),
    pytest.param(b'{"code":10,"opaque":1,"extFields":{"k":"\\udfff\\ud800"}}', False, HeaderEncodingError,
                 id="reversed-surrogate-escapes"),
    pytest.param(b'{"code":10,"opaque":1,"extFields":{"\\ud800\\u0041":"v"}}', False, HeaderEncodingError,
                 id="lone-surrogate-escape-key"),
    pytest.param(b'{"code":10,"opaque":1,"other":"\\ud800","extFields":{"k":"v"}}', False, {"k": "v"},
                 id="lone-surrogate-in-an-ignored-field-accepted-as-stdlib"),
    pytest.param(b'{"code":10,"opaque":1,"extFields":{"k":"\\ud83d\\ude80"}}', True, {"k": "\U0001f680"},
                 id="surrogate-pair-escape-joined-by-both"),
    pytest.param(b'{"code":10,"opaque":1,"remark":"\xed\xa0\x80"}', False, HeaderEncodingError,
                 id="utf8-encoded-surrogate-is-an-encoding-error"),
    pytest.param(b'{"code":10,"opaque":1,"remark":"\xff"}', False, HeaderEncodingError,
                 id="invalid-utf8-is-an-encoding-error-not-syntax"),
    pytest.param(b'\xef\xbb\xbf{"code":10,"opaque":1}', False, HeaderSyntaxError, id="byte-order-mark"),
    pytest.param(b'{"code":10,"opaque":NaN}', False, HeaderSyntaxError, id="nan"),
    pytest.param(b'{"code":10,"opaque":1,"extFields":{"k":' + b"[" * 1100 + b"]" * 1100 + b"}}", False,
                 HeaderSyntaxError, id="nesting-beyond-orjson-depth"),
    pytest.param(b'{"code":10,"opaque":1,"opaque":2,"extFields":{"a":"1","b":"2","a":"3"}}', True,
                 {"a": "3", "b": "2"}, id="duplicate-keys-last-value-first-place"),
    pytest.param(b'{"code":10,"opaque":1,"extFields":{"a":"1"},"extFields":{"b":"2"}}', True, {"b": "2"},
                 id="duplicate-ext-fields-last-one"),
    pytest.param(b'{"code":"10","opaque":1}', False, {}, id="int-as-text-through-the-reference"),
    pytest.param(b'{"code":10,"opaque":1,"language":1,"extFields":{"n":4,"t":true,"f":false,"z":null}}', True,
                 {"n": "4", "t": "true", "f": "false"}, id="cpp-numbers-booleans-nulls"),
    pytest.param(b'{"code":10,"opaque":1,"language":12}', False, HeaderFieldError, id="unknown-language-ordinal"),
    pytest.param(b' \t\r\n{"code":10,"opaque":1}\n', True, {}, id="json-whitespace"),
    pytest.param(b'{"code":10,"opaque":1}\x0c', False, HeaderSyntaxError, id="not-json-whitespace"),
    pytest.param(b'{"code":10,"opaque":1,"remark":"a\x1fb"}', False, HeaderSyntaxError, id="raw-control-character"),
    pytest.param(b'{"code":10,"opaque":01}', False, HeaderSyntaxError, id="leading-zero"),
    pytest.param(b'{"code":10,"opaque":1,}', False, HeaderSyntaxError, id="trailing-comma"),
]
# fmt: on


@pytest.mark.parametrize(("header", "fast_path", "expected"), DIFFERENCES)
def test_fast_path_gives_what_the_reference_gives(
    header: bytes, fast_path: bool, expected: dict[str, str] | type[FrameError]
) -> None:
    frame = raw_frame(header)
    outcome = fast(frame)
    assert outcome == reference(frame)
    assert takes_fast_path(frame) is fast_path
    if isinstance(expected, dict):
        assert outcome[0] == "ok", outcome
        assert list(outcome[2]) == list(expected.items())  # type: ignore[call-overload]
    else:
        assert outcome[0] == expected.__name__, outcome


@pytest.mark.parametrize(
    "header",
    [
        json.dumps({"code": 10, "opaque": 3, "extFields": {f"k{index}": "v" for index in range(5)}}).encode(),
        json.dumps({"code": 10, "opaque": 3, "extFields": {"k": "v" * 65}}).encode(),
        json.dumps({"code": 10, "opaque": 3, "extFields": {"k": "é" * 33}}).encode(),
        json.dumps({"code": 10, "opaque": 3, "extFields": {"k": 10**64}}).encode(),
        json.dumps({"code": 10, "opaque": 3, "remark": "r" * 33}).encode(),
        json.dumps({"code": 10, "opaque": 3, "remark": "é" * 17}).encode(),
        json.dumps({"code": 10, "opaque": 2**31}).encode(),
        json.dumps({"code": 10, "opaque": 3, "flag": -(2**31) - 1}).encode(),
        json.dumps({"code": 10, "opaque": 3, "version": True}).encode(),
        json.dumps({"code": 10, "opaque": 3, "remark": 5}).encode(),
        json.dumps({"code": 10, "opaque": 3, "extFields": []}).encode(),
        json.dumps([10, 3]).encode(),
        json.dumps({"opaque": 3}).encode(),
    ],
    ids=["too-many", "value-long", "value-long-in-bytes", "int-value-long", "remark-long", "remark-long-in-bytes",
         "opaque-range", "flag-range", "version-bool", "remark-number", "ext-array", "not-object", "no-code"],
)
def test_limits_and_field_errors_come_from_the_reference(header: bytes) -> None:
    frame = raw_frame(header)
    assert not takes_fast_path(frame, SMALL_LIMITS)
    outcome = fast(frame, SMALL_LIMITS)
    assert outcome == reference(frame, SMALL_LIMITS) and outcome[0] != "ok"


def test_limits_checked_before_the_header_come_from_the_reference() -> None:
    header = b'{"code":10,"opaque":3}'
    for frame in (raw_frame(header, b"b" * 257), raw_frame(b" " * 1025 + header),
                  struct.pack(">iI", 10, 50) + b"{}" + b"\x00" * 4,
                  struct.pack(">iI", 4 + len(header), 2 << 24 | len(header)) + header):
        outcome = fast(frame, SMALL_LIMITS)
        assert outcome == reference(frame, SMALL_LIMITS) and outcome[0] != "ok"


def test_values_at_the_limits_take_the_fast_path() -> None:
    header = json.dumps({"code": 10, "opaque": 3, "remark": "é" * 16,
                         "extFields": {"a": "é" * 32, "b": "v" * 64, "c": 2**63, "d": None}},
                        ensure_ascii=False).encode()
    frame = raw_frame(header, b"b" * 256)
    assert takes_fast_path(frame, SMALL_LIMITS)
    assert fast(frame, SMALL_LIMITS) == reference(frame, SMALL_LIMITS)


def test_corpus_decodes_the_same_on_both_paths(stdlib_only: None) -> None:
    """The golden corpus through the reference alone gives what its ``# expect:`` lines say (the
    corpus test itself runs the fast path)."""
    for entry in read_corpus():
        outcomes, _ = replay(FrameDecoder(), entry.data, len(entry.data))
        assert tuple(outcomes) == entry.expected_outcomes, entry.name


def test_corpus_commands_equal_on_both_paths() -> None:
    for entry in read_corpus():
        data = entry.data
        while len(data) >= 8:
            (total_length,) = struct.unpack_from(">i", data)
            if not 4 <= total_length <= len(data) - 4:
                break
            frame, data = data[: 4 + total_length], data[4 + total_length :]
            assert fast(frame) == reference(frame), entry.name


# -------------------------------------------------------------------------------------------- encode


def every_code_point_but_surrogates() -> list[str]:
    characters = [chr(point) for point in range(0x110000) if not 0xD800 <= point <= 0xDFFF]
    return ["".join(characters[start : start + 4096]) for start in range(0, len(characters), 4096)]


def test_orjson_writes_the_stdlib_bytes_for_every_code_point(monkeypatch: pytest.MonkeyPatch) -> None:
    commands = [make_request(10, 1, {text: text, "k": text[::-1]}, remark=text, language=text[:8])
                for text in every_code_point_but_surrogates()]
    fast_frames = [encode_frame(command) for command in commands]
    monkeypatch.setattr(codec, "_fast_dumps", None)
    assert fast_frames == [encode_frame(command) for command in commands]


@pytest.mark.parametrize(
    "command",
    [make_request(10, 1, remark="\ud800"), make_request(10, 1, {"k": "a\udfffb"}), make_request(10, 1, {"\udc80": "v"}),
     RemotingCommand(10, 1, language="\ud83d")],
    ids=["remark", "value", "key", "language"],
)
def test_a_lone_surrogate_is_named_as_the_stdlib_names_it(
    command: RemotingCommand, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(EncodeError) as caught:
        encode_frame(command)
    monkeypatch.setattr(codec, "_fast_dumps", None)
    with pytest.raises(EncodeError) as reference_error:
        encode_frame(command)
    assert str(caught.value) == str(reference_error.value) == "header text cannot be written as UTF-8: surrogates not allowed"


def test_encoded_json_header_is_unchanged() -> None:
    """The exact bytes a stock client reads (key order, no spaces, values as strings)."""
    command = make_request(310, 7, {"a": "g", "i": "K\x01V\x02"}, b"x", remark="r\"\\")
    assert encode_frame(command)[8:-1] == (
        b'{"code":310,"language":"PYTHON","version":401,"opaque":7,"flag":0,"remark":"r\\"\\\\",'
        b'"extFields":{"a":"g","i":"K\\u0001V\\u0002"}}'
    )


# ---------------------------------------------------------------------------- commands from the decoder


def test_decoded_command_is_the_validated_command() -> None:
    command = make_request(RequestCode.SEND_MESSAGE_V2, -5, {"a": "g", "b": "T"}, b"body", remark="r")
    decoded = decode_frame(encode_frame(command))
    assert decoded == command and hash(decoded) == hash(command) and repr(decoded) == repr(command)
    assert type(decoded.ext_fields) is MappingProxyType
    with pytest.raises(TypeError):
        decoded.ext_fields["c"] = "d"  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        decoded.code = 11  # type: ignore[misc]
    assert dataclasses.replace(decoded, code=11).code == 11
    for name in codec._COMMAND_FIELDS:
        assert type(getattr(decoded, name)) is type(getattr(command, name)), name


def test_decoded_commands_do_not_share_ext_fields() -> None:
    frame = encode_frame(make_request(10, 1, {"a": "1"}))
    first, second = decode_frame(frame), decode_frame(frame)
    assert first.ext_fields == second.ext_fields
    assert first.ext_fields is not second.ext_fields


def test_codec_without_orjson_is_complete() -> None:
    """Where orjson cannot be imported the codec runs on the stdlib alone: same frames, same errors."""
    script = """
import sys
sys.modules["orjson"] = None  # import orjson now raises ImportError
from protocol import codec
from protocol.command import make_request
assert codec._fast_loads is None and codec._fast_dumps is None
command = make_request(310, 7, {"a": "g", "i": "K\\x01V\\x02"}, b"x", remark="r")
frame = codec.encode_frame(command)
assert codec.decode_frame(frame) == command
try:
    codec.encode_frame(make_request(10, 1, remark="\\ud800"))
except codec.EncodeError as error:
    print(error)
"""
    root = Path(__file__).resolve().parents[2]
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=root,
                            env={**os.environ, "PYTHONPATH": str(root)}, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "header text cannot be written as UTF-8: surrogates not allowed"


# ---------------------------------------------------------------------------------------- send header

SHORT_FIELDS = {"a": "g", "b": "T", "c": "TBW102", "d": "8", "e": "2", "f": "4", "g": "1700000000123", "h": "7",
                "i": "K\x01V\x02", "j": "3", "k": "false", "l": "5", "m": "false", "n": "broker-a"}


def test_send_header_stores_every_field_where_it_is_named() -> None:
    """Its __init__ stores through the slots' setters: each value in its own field, the class still frozen."""
    values = {field.name: f"value of {field.name}" for field in dataclasses.fields(SendHeader)}
    by_name = SendHeader(**values)  # type: ignore[arg-type]
    by_position = SendHeader(*values.values())  # type: ignore[arg-type]
    assert by_name == by_position and hash(by_name) == hash(by_position)
    assert {name: getattr(by_name, name) for name in values} == values
    assert repr(by_name).startswith("SendHeader(producer_group='value of producer_group', topic='value of topic'")
    with pytest.raises(dataclasses.FrozenInstanceError):
        by_name.topic = "other"  # type: ignore[misc]
    assert dataclasses.replace(by_name, topic="other").topic == "other"
    with pytest.raises(TypeError):
        SendHeader(*list(values.values())[:-1])  # type: ignore[arg-type]


def test_send_header_errors_name_the_long_field() -> None:
    with pytest.raises(RequestError) as out_of_range:
        SendHeader.parse({**SHORT_FIELDS, "d": "0"}, v2=True)
    assert out_of_range.value.remark == "the custom field <defaultTopicQueueNums> must be in 1..1024, got 0"
    with pytest.raises(RequestError) as missing:
        SendHeader.parse({"b": "T", "g": "1"}, v2=True)
    assert missing.value.remark == "the custom field <producerGroup> is null"


# -------------------------------------------------------------------------------------- send response

HOST = encode_host("127.0.0.1", 10911)


def stored(physical_offset: int, queue_offset: int) -> AppendResult:
    return AppendResult(AppendStatus.OK, physical_offset, queue_offset, 100, HOST)


def test_send_response_for_one_message_and_a_batch() -> None:
    request = make_request(RequestCode.SEND_MESSAGE_V2, 9, {"a": "g"})
    one = SendProcessor._response(request, (stored(4096, 12),), 3)
    assert (one.code, one.opaque, one.is_response) == (ResponseCode.SUCCESS, 9, True)
    assert dict(one.ext_fields) == {"msgId": stored(4096, 12).msg_id, "queueId": "3", "queueOffset": "12"}
    batch = SendProcessor._response(request, (stored(0, 5), stored(100, 6), stored(200, 7)), 1, "TX")
    assert dict(batch.ext_fields) == {
        "msgId": ",".join(stored(offset, 0).msg_id for offset in (0, 100, 200)),
        "queueId": "1", "queueOffset": "5", "transactionId": "TX",
    }
    assert decode_frame(encode_frame(batch)) == batch


@pytest.mark.parametrize("count", [1, 3])
def test_send_response_refuses_a_rejected_message(count: int) -> None:
    rejected = AppendResult(AppendStatus.REJECTED, reason="too big")
    results = (*(stored(offset, 0) for offset in range(count - 1)), rejected)
    with pytest.raises(RequestError) as caught:
        SendProcessor._response(make_request(310, 1), results, 0)
    assert (caught.value.code, caught.value.remark) == (ResponseCode.MESSAGE_ILLEGAL, "too big")
    with pytest.raises(RequestError, match="message rejected by the store"):
        SendProcessor._response(make_request(310, 1), (AppendResult(AppendStatus.REJECTED),) * count, 0)
