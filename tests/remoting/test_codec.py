"""Deterministic tests of the remoting codec: tables of frames, stock-client shapes, stream splitting."""

from __future__ import annotations

import json
import struct
from types import MappingProxyType

import pytest

from protocol.codec import (
    BodyTooLargeError,
    DecoderUsageError,
    EncodeError,
    ExtFieldValueTooLargeError,
    FrameDecoder,
    FrameError,
    FrameLengthError,
    FrameLimitError,
    FrameTooLargeError,
    HeaderEncodingError,
    HeaderFieldError,
    HeaderLengthError,
    HeaderSyntaxError,
    HeaderTooLargeError,
    RemarkTooLargeError,
    TooManyExtFieldsError,
    TruncatedHeaderError,
    UnknownSerializeTypeError,
    decode_frame,
    encode_frame,
    make_error_response,
)
from protocol.codes import (
    LanguageCode,
    RequestCode,
    ResponseCode,
    SerializeType,
    describe_request_code,
    describe_response_code,
)
from protocol.command import (
    ONEWAY_FLAG,
    REMOTING_VERSION,
    RESPONSE_FLAG,
    InvalidCommandError,
    RemotingCommand,
    make_request,
    make_response,
)
from protocol.limits import DEFAULT_LIMITS, CodecLimits
from tests.remoting import CORPUS_DIRECTORY, read_corpus_entry, replay

SMALL_LIMITS = CodecLimits(
    frame_size_max_bytes=4096,
    header_size_max_bytes=1024,
    ext_fields_count_max=4,
    ext_field_value_max_bytes=64,
    remark_max_bytes=32,
    body_size_max_bytes=256,
)


def raw_frame(header: bytes, body: bytes = b"", serialize_type: int = 0) -> bytes:
    return struct.pack(">iI", 4 + len(header) + len(body), serialize_type << 24 | len(header)) + header + body


def json_frame(header: object, body: bytes = b"") -> bytes:
    return raw_frame(json.dumps(header).encode(), body)


def binary_header(
    code: int = 10,
    language: int = 1,
    version: int = 63,
    opaque: int = 21,
    flag: int = 0,
    remark: bytes = b"",
    ext: bytes = b"",
) -> bytes:
    return (
        struct.pack(">hbhii", code, language, version, opaque, flag)
        + struct.pack(">i", len(remark))
        + remark
        + struct.pack(">i", len(ext))
        + ext
    )


def ext_entry(key: bytes, value: bytes) -> bytes:
    return struct.pack(">h", len(key)) + key + struct.pack(">i", len(value)) + value


VALID_TAIL = json_frame({"code": 34, "opaque": 1000, "flag": 0})


def decode_all(data: bytes, limits: CodecLimits = DEFAULT_LIMITS) -> list[RemotingCommand]:
    decoder = FrameDecoder(limits)
    outcomes, commands = replay(decoder, data, max(1, len(data)))
    assert outcomes == ["ok"] * len(commands)
    return commands


# ------------------------------------------------------------------------------------------ round trips

ROUND_TRIP_COMMANDS = [
    make_request(RequestCode.SEND_MESSAGE, 0),
    make_request(
        RequestCode.SEND_MESSAGE_V2, 7, {"a": "group", "b": "Topic", "i": "TAGS\x01A\x02"}, b"payload"
    ),
    make_request(RequestCode.HEART_BEAT, 2**31 - 1, body=b'{"clientID":"x"}', remark="", oneway=True),
    make_request(RequestCode.PULL_MESSAGE, -(2**31), {"topic": "主题", "empty": ""}, remark="ünïcode ✓ 🚀"),
    RemotingCommand(
        code=-1, opaque=5, flag=-(2**31), language="RUST", version=-7, remark="r", body=bytes(range(256))
    ),
    make_response(
        make_request(10, 99), ResponseCode.SUCCESS, ext_fields={"msgId": "ABC", "queueOffset": "12"}
    ),
    make_request(105, 3, {"topic": "TopicTest"}, serialize_type=SerializeType.ROCKETMQ),
    make_request(10, 4, {"k" * 100: "v" * 1000, "": ""}, b"\x00" * 10, remark="why", serialize_type=1),
    RemotingCommand(code=32767, opaque=-1, flag=3, language="OMS", version=-32768, serialize_type=1),
    make_response(make_request(10, 8, serialize_type=1), ResponseCode.SYSTEM_BUSY, remark="busy"),
]


@pytest.mark.parametrize("command", ROUND_TRIP_COMMANDS, ids=repr)
def test_round_trip(command: RemotingCommand) -> None:
    decoded = decode_frame(encode_frame(command))
    assert decoded == command
    assert dict(decoded.ext_fields) == dict(command.ext_fields)
    assert type(decoded.body) is bytes


def test_binary_empty_remark_reads_as_none_like_java() -> None:
    command = make_request(10, 1, remark="", serialize_type=SerializeType.ROCKETMQ)
    assert decode_frame(encode_frame(command)).remark is None


def test_frame_layout_json() -> None:
    command = make_request(10, 5, {"queueId": "1"}, b"BODY")
    frame = encode_frame(command)
    total_length, type_and_length = struct.unpack_from(">iI", frame)
    header_length = type_and_length & 0xFFFFFF
    assert total_length == len(frame) - 4
    assert type_and_length >> 24 == 0
    assert frame[8 + header_length :] == b"BODY"
    header = json.loads(frame[8 : 8 + header_length])
    assert header == {
        "code": 10,
        "language": "PYTHON",
        "version": REMOTING_VERSION,
        "opaque": 5,
        "flag": 0,
        "extFields": {"queueId": "1"},
    }


def test_frame_layout_binary_matches_java_rocketmq_serializable() -> None:
    command = make_request(
        105, 9, {"topic": "T"}, serialize_type=SerializeType.ROCKETMQ, language="JAVA", version=401
    )
    expected_header = binary_header(
        code=105, language=0, version=401, opaque=9, ext=ext_entry(b"topic", b"T")
    )
    assert encode_frame(command) == raw_frame(expected_header, serialize_type=1)


def test_encode_writes_every_ext_value_as_a_json_string_and_omits_empty_parts() -> None:
    frame = encode_frame(
        make_response(make_request(11, 3), 0, ext_fields={"nextBeginOffset": "12", "minOffset": "0"})
    )
    (type_and_length,) = struct.unpack_from(">I", frame, 4)
    header = json.loads(frame[8 : 8 + (type_and_length & 0xFFFFFF)])
    assert header["extFields"] == {"nextBeginOffset": "12", "minOffset": "0"}
    assert all(type(value) is str for value in header["extFields"].values())
    assert "remark" not in header
    bare = encode_frame(make_request(34, 1))
    assert b"extFields" not in bare and b"remark" not in bare


def test_response_uses_the_request_serialize_type_and_echoes_opaque() -> None:
    for serialize_type in SerializeType:
        request = make_request(10, 0, serialize_type=serialize_type, oneway=True)
        response = make_response(request, ResponseCode.SUCCESS)
        assert response.serialize_type == serialize_type
        assert response.opaque == 0
        assert response.flag == RESPONSE_FLAG  # oneway bit not carried over, as Java
        assert response.is_response and not response.is_oneway
        frame = encode_frame(response)
        assert struct.unpack_from(">I", frame, 4)[0] >> 24 == serialize_type
        assert decode_frame(frame) == response


# ------------------------------------------------------------------------------- stock-client shapes


def corpus_commands(name: str) -> list[RemotingCommand]:
    return decode_all(read_corpus_entry(CORPUS_DIRECTORY / name).data)


def test_cpp_send_message_normalizes_numbers_to_strings() -> None:
    (command,) = corpus_commands("cpp_send_message.hex")
    assert command.code == RequestCode.SEND_MESSAGE
    assert (command.language, command.version, command.opaque, command.flag) == ("CPP", 63, 5, 0)
    assert command.remark == ""
    ext = command.ext_fields
    assert all(type(value) is str for value in ext.values())
    assert (ext["queueId"], ext["sysFlag"], ext["flag"], ext["defaultTopicQueueNums"]) == ("1", "0", "0", "4")
    assert (ext["bornTimestamp"], ext["batch"], ext["AccessKey"]) == ("1700000000123", "0", "")
    assert ext["properties"].startswith("UNIQ_KEY\x01") and ext["properties"].endswith("TagA\x02")
    assert command.body == b"Hello RocketMQ from CPP"


def test_cpp_batch_send_keeps_records_body_intact() -> None:
    (command,) = corpus_commands("cpp_send_batch.hex")
    assert command.code == RequestCode.SEND_MESSAGE and command.ext_fields["batch"] == "1"
    position, records = 0, 0
    while position < len(command.body):
        (size,) = struct.unpack_from(">i", command.body, position)
        position += size
        records += 1
    assert position == len(command.body) and records == 3


def test_heartbeats_from_both_clients() -> None:
    (cpp,) = corpus_commands("cpp_heartbeat.hex")
    (java,) = corpus_commands("java_heartbeat.hex")
    assert cpp.code == java.code == RequestCode.HEART_BEAT
    assert json.loads(cpp.body)["consumerDataSet"][0]["messageModel"] == 1
    assert json.loads(java.body)["consumerDataSet"][0]["messageModel"] == "CLUSTERING"
    assert java.ext_fields == {} and java.remark is None


def test_java_send_v2_and_broker_response() -> None:
    (request,) = corpus_commands("java_send_message_v2.hex")
    assert (request.code, request.language, request.version) == (RequestCode.SEND_MESSAGE_V2, "JAVA", 401)
    assert request.ext_fields["i"].count("\x01") == 3 and request.ext_fields["k"] == "false"
    assert request.body.decode() == "Hello RocketMQ, 你好"
    (response,) = corpus_commands("java_broker_send_response.hex")
    assert response.is_response and response.opaque == request.opaque
    assert response.ext_fields["msgId"] == "7F00000100002A9F0000000000000000"


def test_cpp_oneway_send_carries_no_oneway_flag() -> None:
    (command,) = corpus_commands("cpp_update_offset_no_oneway_flag.hex")
    assert command.code == RequestCode.UPDATE_CONSUMER_OFFSET
    assert not command.is_oneway
    assert command.ext_fields["commitOffset"] == "42"


def test_binary_request_decodes() -> None:
    (command,) = corpus_commands("rocketmq_binary_route_request.hex")
    assert command.serialize_type == SerializeType.ROCKETMQ
    assert (command.code, command.language, command.opaque) == (
        RequestCode.GET_ROUTEINFO_BY_TOPIC,
        "JAVA",
        11,
    )
    assert command.ext_fields == {"topic": "TopicTest"} and command.remark is None


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (4, "4"),
        (-9007199254740993, "-9007199254740993"),
        (True, "true"),
        (False, "false"),
        (1.5, "1.5"),
        ({"x": [1, "y"]}, '{"x":[1,"y"]}'),
        ([], "[]"),
        ("text", "text"),
    ],
)
def test_json_ext_values_become_strings(value: object, expected: str) -> None:
    command = decode_frame(json_frame({"code": 10, "opaque": 1, "extFields": {"key": value}}))
    assert command.ext_fields == {"key": expected}


def test_json_null_ext_value_is_absent_as_in_java() -> None:
    command = decode_frame(json_frame({"code": 10, "opaque": 1, "extFields": {"gone": None, "kept": "1"}}))
    assert command.ext_fields == {"kept": "1"}


def test_json_header_leniency_matches_fastjson() -> None:
    command = decode_frame(
        json_frame({"code": "10", "opaque": "-3", "language": 1, "flag": None, "extra": [1]})
    )
    assert (command.code, command.opaque, command.language, command.flag, command.version) == (
        10,
        -3,
        "CPP",
        0,
        0,
    )
    missing_language = decode_frame(json_frame({"code": 10, "opaque": 1, "remark": None, "extFields": None}))
    assert missing_language.language == "JAVA"
    assert missing_language.remark is None and missing_language.ext_fields == {}


def test_json_valid_surrogate_pair_escape_is_accepted() -> None:
    command = decode_frame(raw_frame(b'{"code":10,"opaque":1,"remark":"\\ud83d\\ude80"}'))
    assert command.remark == "🚀"


# ----------------------------------------------------------------------------------- stream handling


def stream_of_frames() -> tuple[bytes, list[RemotingCommand]]:
    commands = [
        make_request(34, 1, {"a": "1"}, b"heartbeat"),
        make_request(105, 2, {"topic": "T"}, serialize_type=1),
        make_response(make_request(10, 3), 0, "done", {"msgId": "X"}, b"r"),
        make_request(10, 4),
    ]
    return b"".join(encode_frame(command) for command in commands), commands


def test_several_frames_in_one_feed() -> None:
    data, commands = stream_of_frames()
    assert decode_all(data) == commands


def test_split_at_every_byte_boundary() -> None:
    data, commands = stream_of_frames()
    for cut in range(len(data) + 1):
        decoder = FrameDecoder()
        decoded: list[RemotingCommand] = []
        for piece in (data[:cut], data[cut:]):
            decoder.feed(piece)
            while (command := decoder.next_frame()) is not None:
                decoded.append(command)
        assert decoded == commands, f"cut at {cut}"
        assert decoder.buffered_bytes == 0


def test_byte_by_byte_feed() -> None:
    data, commands = stream_of_frames()
    outcomes, decoded = replay(FrameDecoder(), data, 1)
    assert outcomes == ["ok"] * len(commands) and decoded == commands


def test_next_frame_without_data_and_empty_feed() -> None:
    decoder = FrameDecoder()
    assert decoder.next_frame() is None
    decoder.feed(b"")
    assert decoder.next_frame() is None
    decoder.feed(b"\x00\x00")
    assert decoder.next_frame() is None and decoder.buffered_bytes == 2


# --------------------------------------------------------------------------------- malformed frames

FATAL_CASES = [
    pytest.param(struct.pack(">i", -1), FrameLengthError, id="negative-length"),
    pytest.param(struct.pack(">i", 0), FrameLengthError, id="zero-length"),
    pytest.param(struct.pack(">i", 3) + b"abc", FrameLengthError, id="length-below-word"),
    pytest.param(struct.pack(">i", 2**31 - 1), FrameTooLargeError, id="huge-length"),
    pytest.param(struct.pack(">i", 4093), FrameTooLargeError, id="one-past-limit"),
]


@pytest.mark.parametrize(("data", "error_type"), FATAL_CASES)
def test_fatal_errors_are_sticky(data: bytes, error_type: type[FrameError]) -> None:
    decoder = FrameDecoder(SMALL_LIMITS)
    decoder.feed(data)
    with pytest.raises(error_type) as caught:
        decoder.next_frame()
    assert caught.value.fatal and caught.value.opaque is None and not caught.value.can_respond
    assert make_error_response(caught.value) is None
    assert decoder.broken
    with pytest.raises(error_type):
        decoder.next_frame()
    with pytest.raises(error_type):
        decoder.feed(VALID_TAIL)


def test_frame_at_the_limit_is_accepted() -> None:
    body = b"x" * (SMALL_LIMITS.body_size_max_bytes)
    header = b'{"code":1,"opaque":2}'
    frame = raw_frame(header, body)
    limits = CodecLimits(
        frame_size_max_bytes=len(frame),
        header_size_max_bytes=64,
        body_size_max_bytes=len(body),
        ext_field_value_max_bytes=64,
        remark_max_bytes=64,
    )
    assert decode_frame(frame, limits).body == body
    with pytest.raises(FrameTooLargeError):
        decode_frame(raw_frame(header, body + b"x"), limits)


def test_too_large_frame_is_refused_before_its_body_arrives() -> None:
    decoder = FrameDecoder(SMALL_LIMITS)
    decoder.feed(struct.pack(">i", 10_000))
    with pytest.raises(FrameTooLargeError):
        decoder.next_frame()
    assert decoder.buffered_bytes == 4


def many_ext_fields(count: int) -> dict[str, str]:
    return {f"k{index}": "v" for index in range(count)}


# fmt: off
RECOVERABLE_CASES = [
    # (frame, error type, opaque, code)
    pytest.param(raw_frame(b'{"code":10,"opaque":1}', serialize_type=2), UnknownSerializeTypeError, None, None,
                 id="serialize-type-2"),
    pytest.param(raw_frame(b"", serialize_type=0xFF), UnknownSerializeTypeError, None, None, id="serialize-type-255"),
    pytest.param(struct.pack(">iI", 10, 50) + b"{}" + b"\x00" * 4, HeaderLengthError, None, None,
                 id="header-past-frame"),
    pytest.param(raw_frame(b" " * 1025), HeaderTooLargeError, None, None, id="header-too-large"),
    pytest.param(raw_frame(b""), HeaderSyntaxError, None, None, id="empty-header"),
    pytest.param(raw_frame(b'{"code":10,'), HeaderSyntaxError, None, None, id="json-truncated"),
    pytest.param(raw_frame(b'{"code":10}{}'), HeaderSyntaxError, None, None, id="json-extra-data"),
    pytest.param(raw_frame(b"[10, 1]"), HeaderSyntaxError, None, None, id="json-array"),
    pytest.param(raw_frame(b'"header"'), HeaderSyntaxError, None, None, id="json-string"),
    pytest.param(raw_frame(b"null"), HeaderSyntaxError, None, None, id="json-null"),
    pytest.param(raw_frame(b'{"code":NaN,"opaque":1}'), HeaderSyntaxError, None, None, id="json-nan"),
    pytest.param(raw_frame(b'{"code":10,"opaque":1,"remark":"\xff"}'), HeaderEncodingError, None, None,
                 id="json-invalid-utf8"),
    pytest.param(raw_frame(b'{"code":10,"opaque":1,"remark":"\xed\xa0\x80"}'), HeaderEncodingError, None, None,
                 id="json-utf8-encoded-surrogate"),
    pytest.param(raw_frame(b'{"code":10,"opaque":4,"remark":"\\ud800"}'), HeaderEncodingError, 4, 10,
                 id="json-lone-surrogate-escape"),
    pytest.param(raw_frame(b'{"code":10,"opaque":4,"extFields":{"\\uDC00":"x"}}'), HeaderEncodingError, 4, 10,
                 id="json-lone-surrogate-key"),
    pytest.param(json_frame({"code": "abc", "opaque": 7}), HeaderFieldError, 7, None, id="code-not-integer"),
    pytest.param(json_frame({"code": " 10", "opaque": 7}), HeaderFieldError, 7, None, id="code-padded-string"),
    pytest.param(json_frame({"code": "1_0", "opaque": 7}), HeaderFieldError, 7, None, id="code-underscore"),
    pytest.param(json_frame({"code": True, "opaque": 7}), HeaderFieldError, 7, None, id="code-boolean"),
    pytest.param(json_frame({"code": 10.0, "opaque": 7}), HeaderFieldError, 7, None, id="code-float"),
    pytest.param(json_frame({"code": 2**31, "opaque": 7}), HeaderFieldError, 7, None, id="code-out-of-range"),
    pytest.param(json_frame({"opaque": 7}), HeaderFieldError, 7, None, id="code-missing"),
    pytest.param(json_frame({"code": None, "opaque": 7}), HeaderFieldError, 7, None, id="code-null"),
    pytest.param(json_frame({"code": 10}), HeaderFieldError, None, None, id="opaque-missing"),
    pytest.param(json_frame({"code": 10, "opaque": 2**31}), HeaderFieldError, None, None, id="opaque-out-of-range"),
    pytest.param(json_frame({"code": 10, "opaque": [1]}), HeaderFieldError, None, None, id="opaque-array"),
    pytest.param(json_frame({"code": 10, "opaque": 3, "flag": "x"}), HeaderFieldError, 3, 10, id="flag-string"),
    pytest.param(json_frame({"code": 10, "opaque": 3, "version": {}}), HeaderFieldError, 3, 10, id="version-object"),
    pytest.param(json_frame({"code": 10, "opaque": 3, "language": 12}), HeaderFieldError, 3, 10,
                 id="language-unknown-ordinal"),
    pytest.param(json_frame({"code": 10, "opaque": 3, "language": ["CPP"]}), HeaderFieldError, 3, 10,
                 id="language-array"),
    pytest.param(json_frame({"code": 10, "opaque": 3, "remark": 5}), HeaderFieldError, 3, 10, id="remark-number"),
    pytest.param(json_frame({"code": 10, "opaque": 3, "extFields": ["a"]}), HeaderFieldError, 3, 10,
                 id="ext-fields-array"),
    pytest.param(json_frame({"code": 10, "opaque": 3, "extFields": many_ext_fields(5)}), TooManyExtFieldsError, 3,
                 10, id="json-too-many-ext-fields"),
    pytest.param(json_frame({"code": 10, "opaque": 3, "extFields": {"k": "v" * 65}}), ExtFieldValueTooLargeError,
                 3, 10, id="json-ext-value-too-large"),
    pytest.param(json_frame({"code": 10, "opaque": 3, "extFields": {"k": "é" * 33}}), ExtFieldValueTooLargeError,
                 3, 10, id="json-ext-value-too-large-in-bytes"),
    pytest.param(json_frame({"code": 10, "opaque": 3, "extFields": {"k": [1] * 40}}), ExtFieldValueTooLargeError,
                 3, 10, id="json-ext-array-value-too-large"),
    pytest.param(json_frame({"code": 10, "opaque": 3, "remark": "r" * 33}), RemarkTooLargeError, 3, 10,
                 id="json-remark-too-large"),
    pytest.param(json_frame({"code": 10, "opaque": 3}, b"b" * 257), BodyTooLargeError, 3, 10, id="body-too-large"),
    pytest.param(raw_frame(binary_header()[:5], serialize_type=1), TruncatedHeaderError, None, 10,
                 id="binary-fixed-truncated"),
    pytest.param(raw_frame(binary_header()[:12], serialize_type=1), TruncatedHeaderError, 21, 10,
                 id="binary-fixed-truncated-after-opaque"),
    pytest.param(raw_frame(binary_header()[:15], serialize_type=1), TruncatedHeaderError, 21, 10,
                 id="binary-remark-length-truncated"),
    pytest.param(raw_frame(binary_header(language=42), serialize_type=1), HeaderFieldError, 21, 10,
                 id="binary-unknown-language"),
    pytest.param(raw_frame(binary_header(language=-1), serialize_type=1), HeaderFieldError, 21, 10,
                 id="binary-negative-language"),
    pytest.param(raw_frame(binary_header()[:13] + struct.pack(">ii", -5, 0), serialize_type=1), HeaderSyntaxError,
                 21, 10, id="binary-negative-remark-length"),
    pytest.param(raw_frame(binary_header()[:13] + struct.pack(">ii", 100, 0), serialize_type=1),
                 TruncatedHeaderError, 21, 10, id="binary-remark-past-end"),
    pytest.param(raw_frame(binary_header(remark=b"r" * 33), serialize_type=1), RemarkTooLargeError, 21, 10,
                 id="binary-remark-too-large"),
    pytest.param(raw_frame(binary_header(remark=b"\xc3\x28"), serialize_type=1), HeaderEncodingError, 21, 10,
                 id="binary-remark-invalid-utf8"),
    pytest.param(raw_frame(binary_header()[:17] + struct.pack(">i", -1), serialize_type=1), HeaderSyntaxError, 21,
                 10, id="binary-negative-ext-length"),
    pytest.param(raw_frame(binary_header() + b"\x00", serialize_type=1), HeaderSyntaxError, 21, 10,
                 id="binary-trailing-bytes"),
    pytest.param(raw_frame(binary_header()[:17] + struct.pack(">i", 8), serialize_type=1), TruncatedHeaderError,
                 21, 10, id="binary-ext-past-end"),
    pytest.param(raw_frame(binary_header(ext=b"\x00"), serialize_type=1), TruncatedHeaderError, 21, 10,
                 id="binary-key-length-truncated"),
    pytest.param(raw_frame(binary_header(ext=struct.pack(">h", -2)), serialize_type=1), HeaderSyntaxError, 21, 10,
                 id="binary-negative-key-length"),
    pytest.param(raw_frame(binary_header(ext=struct.pack(">h", 5) + b"ab"), serialize_type=1), TruncatedHeaderError,
                 21, 10, id="binary-key-truncated"),
    pytest.param(raw_frame(binary_header(ext=struct.pack(">h", 1) + b"k" + struct.pack(">i", -1)), serialize_type=1),
                 HeaderSyntaxError, 21, 10, id="binary-negative-value-length"),
    pytest.param(raw_frame(binary_header(ext=struct.pack(">h", 1) + b"k" + struct.pack(">i", 9) + b"v"),
                           serialize_type=1), TruncatedHeaderError, 21, 10, id="binary-value-past-end"),
    pytest.param(raw_frame(binary_header(ext=ext_entry(b"\xff", b"v")), serialize_type=1), HeaderEncodingError, 21,
                 10, id="binary-key-invalid-utf8"),
    pytest.param(raw_frame(binary_header(ext=ext_entry(b"k", b"\x80")), serialize_type=1), HeaderEncodingError, 21,
                 10, id="binary-value-invalid-utf8"),
    pytest.param(raw_frame(binary_header(ext=b"".join(ext_entry(b"k%d" % i, b"v") for i in range(5))),
                           serialize_type=1), TooManyExtFieldsError, 21, 10, id="binary-too-many-ext-fields"),
    pytest.param(raw_frame(binary_header(ext=ext_entry(b"k", b"v" * 65)), serialize_type=1),
                 ExtFieldValueTooLargeError, 21, 10, id="binary-ext-value-too-large"),
    pytest.param(raw_frame(binary_header(), b"b" * 257, serialize_type=1), BodyTooLargeError, 21, 10,
                 id="binary-body-too-large"),
]
# fmt: on


@pytest.mark.parametrize(("frame", "error_type", "opaque", "code"), RECOVERABLE_CASES)
def test_recoverable_errors_report_and_resume(
    frame: bytes, error_type: type[FrameError], opaque: int | None, code: int | None
) -> None:
    decoder = FrameDecoder(SMALL_LIMITS)
    decoder.feed(frame + VALID_TAIL)
    with pytest.raises(FrameError) as caught:
        decoder.next_frame()
    error = caught.value
    assert type(error) is error_type, str(error)
    assert not error.fatal
    assert (error.opaque, error.code) == (opaque, code)
    assert str(error)  # says what is wrong
    # the bad frame is consumed; the next one decodes and the buffer can still grow (no pinned view)
    command = decoder.next_frame()
    assert command is not None and command.opaque == 1000
    decoder.feed(VALID_TAIL)
    assert decoder.next_frame() is not None
    assert decoder.next_frame() is None and decoder.buffered_bytes == 0


@pytest.mark.parametrize(
    "header",
    [
        b'{"code":' + b"9" * 5000 + b',"opaque":1}',  # beyond Python's int-string digit limit
        b'{"code":10,"opaque":1,"extFields":{"a":' + b"[" * 30_000 + b"]" * 30_000 + b"}}",  # RecursionError
    ],
    ids=["huge-integer", "deep-nesting"],
)
def test_pathological_json_headers(header: bytes) -> None:
    decoder = FrameDecoder()
    decoder.feed(raw_frame(header) + VALID_TAIL)
    with pytest.raises(HeaderSyntaxError):
        decoder.next_frame()
    assert decoder.next_frame() is not None


def test_error_response_for_a_recoverable_error() -> None:
    decoder = FrameDecoder(SMALL_LIMITS)
    decoder.feed(json_frame({"code": "abc", "opaque": 7, "flag": 0}))
    with pytest.raises(HeaderFieldError) as caught:
        decoder.next_frame()
    assert caught.value.can_respond and caught.value.serialize_type == SerializeType.JSON
    response = make_error_response(caught.value)
    assert response is not None
    assert (response.code, response.opaque, response.is_response) == (ResponseCode.SYSTEM_ERROR, 7, True)
    assert response.remark is not None and "'code'" in response.remark
    assert decode_frame(encode_frame(response)) == response


def test_error_response_for_a_limit_in_a_binary_frame() -> None:
    decoder = FrameDecoder(SMALL_LIMITS)
    decoder.feed(raw_frame(binary_header(opaque=33), b"b" * 300, serialize_type=1))
    with pytest.raises(BodyTooLargeError) as caught:
        decoder.next_frame()
    assert isinstance(caught.value, FrameLimitError)
    response = make_error_response(caught.value)
    assert response is not None
    assert (response.code, response.opaque, response.serialize_type) == (ResponseCode.MESSAGE_ILLEGAL, 33, 1)


def test_no_error_response_to_a_bad_response_or_unknown_opaque() -> None:
    decoder = FrameDecoder(SMALL_LIMITS)
    decoder.feed(json_frame({"code": 0, "opaque": 7, "flag": RESPONSE_FLAG, "remark": 1}))
    decoder.feed(b"")
    with pytest.raises(HeaderFieldError) as caught:
        decoder.next_frame()
    assert caught.value.flag == RESPONSE_FLAG and not caught.value.can_respond
    assert make_error_response(caught.value) is None
    decoder.feed(json_frame({"code": 10}))
    with pytest.raises(HeaderFieldError) as missing:
        decoder.next_frame()
    assert make_error_response(missing.value) is None


def test_feeding_without_draining_is_a_usage_error() -> None:
    decoder = FrameDecoder(SMALL_LIMITS)
    frame = encode_frame(make_request(10, 1, body=b"x" * 200))
    with pytest.raises(DecoderUsageError):
        for _ in range(SMALL_LIMITS.frame_size_max_bytes // len(frame) + 2):
            decoder.feed(frame)
    assert decoder.buffered_bytes < SMALL_LIMITS.frame_size_max_bytes + len(frame)


def test_buffer_is_compacted_as_frames_are_consumed() -> None:
    decoder = FrameDecoder(SMALL_LIMITS)
    frame = encode_frame(make_request(10, 1, body=b"x" * 100))
    for _ in range(200):
        decoder.feed(frame + frame[:50])
        while decoder.next_frame() is not None:
            pass
        decoder.feed(frame[50:])
        while decoder.next_frame() is not None:
            pass
        assert decoder.buffered_bytes == 0


def test_decode_frame_wants_exactly_one_frame() -> None:
    frame = encode_frame(make_request(10, 1))
    with pytest.raises(FrameLengthError, match="incomplete"):
        decode_frame(frame[:-1])
    with pytest.raises(FrameLengthError, match="after the frame"):
        decode_frame(frame + b"\x00")


# -------------------------------------------------------------------------------------------- encode


@pytest.mark.parametrize(
    "command",
    [
        make_request(40000, 1, serialize_type=1),
        make_request(10, 1, version=40000, serialize_type=1),
        make_request(10, 1, language="RUST", serialize_type=1),
        make_request(10, 1, {"k" * 40000: "v"}, serialize_type=1),
        make_request(10, 1, remark="\ud800"),
        make_request(10, 1, {"k": "\udfff"}, serialize_type=1),
        make_request(10, 1, body=b"x" * DEFAULT_LIMITS.frame_size_max_bytes),
    ],
    ids=[
        "code-int16",
        "version-int16",
        "language-no-binary-code",
        "key-int16",
        "json-surrogate",
        "binary-surrogate",
        "frame-too-large",
    ],
)
def test_encode_errors(command: RemotingCommand) -> None:
    with pytest.raises(EncodeError):
        encode_frame(command)


def test_encode_respects_a_smaller_frame_limit() -> None:
    command = make_request(10, 1, body=b"x" * 4096)
    with pytest.raises(EncodeError, match="frame_size_max_bytes"):
        encode_frame(command, SMALL_LIMITS)


# ------------------------------------------------------------------------------------------ command


@pytest.mark.parametrize(
    "arguments",
    [
        {"code": "10", "opaque": 1},
        {"code": 10, "opaque": True},
        {"code": 10, "opaque": 2**31},
        {"code": 10, "opaque": 1, "flag": 1.0},
        {"code": 10, "opaque": 1, "version": -(2**31) - 1},
        {"code": 10, "opaque": 1, "language": 3},
        {"code": 10, "opaque": 1, "remark": b"r"},
        {"code": 10, "opaque": 1, "body": "text"},
        {"code": 10, "opaque": 1, "body": bytearray(b"x")},
        {"code": 10, "opaque": 1, "serialize_type": 2},
        {"code": 10, "opaque": 1, "serialize_type": True},
        {"code": 10, "opaque": 1, "serialize_type": 1.0},
        {"code": 10, "opaque": 1, "ext_fields": [("a", "b")]},
        {"code": 10, "opaque": 1, "ext_fields": {"a": 1}},
        {"code": 10, "opaque": 1, "ext_fields": {1: "a"}},
    ],
    ids=repr,
)
def test_command_validates_itself(arguments: dict[str, object]) -> None:
    with pytest.raises(InvalidCommandError):
        RemotingCommand(**arguments)  # type: ignore[arg-type]


def test_command_normalizes_enums_and_freezes_ext_fields() -> None:
    caller_fields = {"a": "1"}
    command = RemotingCommand(
        RequestCode.SEND_MESSAGE, 1, serialize_type=SerializeType.ROCKETMQ, ext_fields=caller_fields
    )
    assert type(command.code) is int and type(command.serialize_type) is int
    caller_fields["b"] = "2"
    assert command.ext_fields == {"a": "1"}
    assert isinstance(command.ext_fields, MappingProxyType)
    with pytest.raises(TypeError):
        command.ext_fields["c"] = "3"  # type: ignore[index]
    assert hash(command) == hash(RemotingCommand(10, 1, serialize_type=1, ext_fields={"other": "x"}))
    assert "body=<0 bytes>" in repr(command)


def test_flags_and_make_response_rules() -> None:
    request = make_request(10, 1, oneway=True)
    assert request.is_oneway and not request.is_response and request.flag == ONEWAY_FLAG
    response = make_response(request, ResponseCode.SUCCESS)
    with pytest.raises(InvalidCommandError):
        make_response(response, ResponseCode.SUCCESS)


# ------------------------------------------------------------------------------------- limits, codes


@pytest.mark.parametrize(
    "arguments",
    [
        {"frame_size_max_bytes": 9},
        {"frame_size_max_bytes": 2**31},
        {"header_size_max_bytes": 1},
        {"header_size_max_bytes": 2**24},
        {"frame_size_max_bytes": 1024, "header_size_max_bytes": 1020},
        {"ext_fields_count_max": -1},
        {"remark_max_bytes": 70_000},
        {"ext_field_value_max_bytes": 70_000},
        {"body_size_max_bytes": DEFAULT_LIMITS.frame_size_max_bytes},
        {"ext_fields_count_max": True},
        {"remark_max_bytes": 1.5},
    ],
    ids=repr,
)
def test_limits_validate(arguments: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        CodecLimits(**arguments)  # type: ignore[arg-type]


def test_limits_from_mapping() -> None:
    assert CodecLimits.from_mapping({"ext_fields_count_max": 8}).ext_fields_count_max == 8
    with pytest.raises(ValueError, match="unknown codec limits: frame_max"):
        CodecLimits.from_mapping({"frame_max": 1})
    with pytest.raises(ValueError, match="must be an int"):
        CodecLimits.from_mapping({"ext_fields_count_max": "8"})
    assert DEFAULT_LIMITS.frame_size_max_bytes == 16 * 1024 * 1024


def test_codes_match_the_java_sources() -> None:
    assert [member.name for member in LanguageCode] == [
        "JAVA",
        "CPP",
        "DOTNET",
        "PYTHON",
        "DELPHI",
        "ERLANG",
        "RUBY",
        "OTHER",
        "HTTP",
        "GO",
        "PHP",
        "OMS",
    ]
    assert [member.value for member in LanguageCode] == list(range(12))
    assert (ResponseCode.SUCCESS, ResponseCode.SYSTEM_ERROR, ResponseCode.SYSTEM_BUSY) == (0, 1, 2)
    assert (
        ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
        ResponseCode.MESSAGE_ILLEGAL,
        ResponseCode.NO_PERMISSION,
    ) == (3, 13, 16)
    assert (
        ResponseCode.SERVICE_NOT_AVAILABLE,
        ResponseCode.TOPIC_NOT_EXIST,
        ResponseCode.PULL_NOT_FOUND,
    ) == (14, 17, 19)
    assert (ResponseCode.PULL_OFFSET_MOVED, ResponseCode.SUBSCRIPTION_NOT_LATEST) == (21, 25)
    assert (
        RequestCode.SEND_MESSAGE_V2,
        RequestCode.SEND_BATCH_MESSAGE,
        RequestCode.GET_CONSUMER_RUNNING_INFO,
    ) == (310, 320, 307)
    assert (RequestCode.CHECK_TRANSACTION_STATE, RequestCode.GET_ROUTEINFO_BY_TOPIC) == (39, 105)
    assert (SerializeType.JSON, SerializeType.ROCKETMQ) == (0, 1)
    assert describe_request_code(10) == "SEND_MESSAGE(10)"
    assert describe_request_code(9999) == "UNKNOWN(9999)"
    assert describe_response_code(17) == "TOPIC_NOT_EXIST(17)"
