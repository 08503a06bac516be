"""The stored-record codec: tables, round trips, and a decoder that rejects garbage without crashing."""

from __future__ import annotations

import contextlib
import struct
import zlib
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from commitlog.hosts import decode_host, decode_message_id, encode_host, encode_message_id
from commitlog.message import MessageInput, validate_input
from commitlog.record_codec import (
    MESSAGE_MAGIC,
    RecordError,
    decode_record,
    encode_record,
    pack_record,
    record_size,
)
from commitlog.tag_codes import java_string_hash, tags_hash_code
from protocol.properties import decode_properties, encode_properties

STORE_HOST = encode_host("10.1.2.3", 10911)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", 0),
        ("a", 97),
        ("TagA", 2598919),
        ("hello world", 1794106052),
        ("*", 42),
        ("TagA||TagB", java_string_hash("TagA||TagB")),
        ("中文标签", 622041809),  # ((20013*31 + 25991)*31 + 26631)*31 + 31614: UTF-16 code units
        ("😀", 1772899),  # U+1F600 = D83D DE00: 31*55357 + 56832, two code units
    ],
)
def test_java_string_hash_matches_java(text: str, expected: int) -> None:
    assert java_string_hash(text) == expected


def test_tags_hash_code_is_zero_without_tags() -> None:
    assert tags_hash_code(None) == 0 and tags_hash_code("") == 0


def test_layout_matches_rocketmq_field_positions() -> None:
    message = MessageInput("T", 3, 7, 0, 111, encode_host("1.2.3.4", 5), 222, 1, 0, b"xyz",
                           encode_properties({"TAGS": "a"}))
    raw = encode_record(message, queue_offset=9, physical_offset=4096, store_host=STORE_HOST)
    total, magic, body_crc, queue_id, flag, queue_offset, physical = struct.unpack_from(">iIIiiqq", raw)
    assert (total, magic, body_crc) == (len(raw), MESSAGE_MAGIC, zlib.crc32(b"xyz") & 0x7FFFFFFF)
    assert (queue_id, flag, queue_offset, physical) == (3, 7, 9, 4096)
    assert raw[48:56] == encode_host("1.2.3.4", 5)
    assert struct.unpack_from(">q", raw, 56)[0] == 222
    assert raw[64:72] == STORE_HOST
    assert struct.unpack_from(">iqi", raw, 72) == (1, 0, 3)
    assert raw[88:91] == b"xyz" and raw[91] == 1 and raw[92:93] == b"T"
    assert len(raw) == record_size(3, 1, len(message.properties))


def test_message_id_round_trip_and_format() -> None:
    msg_id = encode_message_id(STORE_HOST, 123456789)
    assert msg_id == "0A01020300002A9F00000000075BCD15"
    assert decode_message_id(msg_id) == (STORE_HOST, 123456789)
    with pytest.raises(ValueError):
        decode_message_id("XYZ")
    with pytest.raises(ValueError):
        decode_message_id("G" * 32)


def test_host_codec() -> None:
    assert decode_host(encode_host("127.0.0.1", 9876)) == ("127.0.0.1", 9876)
    for bad in ("1.2.3", "256.1.1.1", "a.b.c.d"):
        with pytest.raises(ValueError):
            encode_host(bad, 1)
    with pytest.raises(ValueError):
        encode_host("1.1.1.1", 70000)


def test_properties_round_trip_and_malformed_pairs() -> None:
    values = {"TAGS": "a", "KEYS": "k1 k2", "UNIQ_KEY": "ABC", "empty": ""}
    assert decode_properties(encode_properties(values)) == values
    assert decode_properties(b"novalue\x02K\x01V\x02\x01x\x02") == {"K": "V"}


def test_validate_input_reports_each_problem() -> None:
    good = MessageInput("T", 0, 0, 0, 0, encode_host("1.1.1.1", 1), 0, 0, 0, b"", b"")
    assert validate_input(good, 100) is None
    cases: dict[str, dict[str, Any]] = {
        "topic length": dict(topic=""),
        "properties length": dict(properties=b"x" * 40000),
        "body length": dict(body=b"x" * 101),
        "born host": dict(born_host=b"123"),
        "queue id": dict(queue_id=-1),
        "flag": dict(flag=2**31),
        "born_timestamp": dict(born_timestamp=2**63),
    }
    for expected, change in cases.items():
        reason = validate_input(good._replace(**change), 100)
        assert reason is not None and expected in reason, (expected, reason)


inputs = st.builds(
    MessageInput,
    topic=st.from_regex(r"[%|a-zA-Z0-9_-]{1,127}", fullmatch=True),
    queue_id=st.integers(0, 2**31 - 1),
    flag=st.integers(-(2**31), 2**31 - 1),
    sys_flag=st.sampled_from([0, 1, 2, 4, 8, 12]),
    born_timestamp=st.integers(0, 2**62),
    born_host=st.one_of(st.binary(min_size=8, max_size=8), st.binary(min_size=20, max_size=20)),
    store_timestamp=st.integers(0, 2**62),
    reconsume_times=st.integers(0, 16),
    prepared_transaction_offset=st.integers(0, 2**40),
    body=st.binary(max_size=300),
    properties=st.dictionaries(
        st.text(st.characters(blacklist_characters="\x01\x02", blacklist_categories=["Cs"]), min_size=1, max_size=8),
        st.text(st.characters(blacklist_characters="\x01\x02", blacklist_categories=["Cs"]), max_size=8),
        max_size=5,
    ).map(encode_properties),
)


@settings(derandomize=True, max_examples=300)
@given(inputs, st.integers(0, 2**40), st.integers(0, 2**40))
def test_record_round_trip(message: MessageInput, queue_offset: int, physical_offset: int) -> None:
    raw = encode_record(message, queue_offset, physical_offset, STORE_HOST)
    topic = message.topic.encode()
    assert pack_record(message, bytes((len(topic),)) + topic, len(raw), queue_offset, physical_offset, STORE_HOST,
                       message.store_timestamp) == raw
    decoded = decode_record(raw)
    assert (decoded.topic, decoded.queue_id, decoded.flag, decoded.body, decoded.properties) == (
        message.topic, message.queue_id, message.flag, message.body, message.properties)
    assert (decoded.queue_offset, decoded.physical_offset, decoded.born_host, decoded.store_host) == (
        queue_offset, physical_offset, message.born_host, STORE_HOST)
    assert decoded.total_size == len(raw)
    assert (decoded.born_timestamp, decoded.store_timestamp, decoded.reconsume_times) == (
        message.born_timestamp, message.store_timestamp, message.reconsume_times)
    assert decoded.sys_flag & 0xF == message.sys_flag & 0xF


@settings(derandomize=True, max_examples=500)
@given(st.binary(max_size=400), st.integers(0, 50))
def test_decoder_rejects_random_bytes(data: bytes, offset: int) -> None:
    with contextlib.suppress(RecordError):
        decode_record(data, min(offset, len(data)))


@settings(derandomize=True, max_examples=500)
@given(inputs, st.data())
def test_decoder_rejects_mutations(message: MessageInput, data: st.DataObject) -> None:
    raw = bytearray(encode_record(message, 0, 0, STORE_HOST))
    position = data.draw(st.integers(0, len(raw) - 1))
    raw[position] ^= data.draw(st.integers(1, 255))
    cut = data.draw(st.integers(0, len(raw)))
    with contextlib.suppress(RecordError):
        decode_record(bytes(raw[:cut]))


def test_body_corruption_is_caught_by_crc() -> None:
    raw = bytearray(encode_record(MessageInput("T", 0, 0, 0, 0, bytes(8), 0, 0, 0, b"payload", b""), 0, 0, STORE_HOST))
    raw[90] ^= 0xFF
    with pytest.raises(RecordError, match="CRC"):
        decode_record(bytes(raw))
    assert decode_record(bytes(raw), check_crc=False).body != b"payload"
