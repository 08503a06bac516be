"""Broker pieces without processes: batch decoding, properties, tag expressions, header parsing, timers,
node configuration."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.admin import record_store_timestamp
from broker.config import load_node_file
from broker.consumers import CONSUME_FROM_WHERE, CONSUME_TYPES, _enum_name
from broker.pull import tag_codes
from broker.requests import RequestError, SendHeader
from broker.send import batch_messages
from broker.timers import due_time_ms
from client.consumer_api import parse_subscription
from commitlog.config import ConfigError
from commitlog.hosts import encode_host
from commitlog.message import MessageInput
from commitlog.record_codec import decode_record, encode_record
from commitlog.tag_codes import java_string_hash
from protocol.codes import ResponseCode
from protocol.properties import find_uniq_key, parse_properties
from protocol.subscription import SUBSCRIBE_ALL, expression_tags
from tests.broker.wire import batch_body


def test_batch_round_trip_and_every_malformed_batch_is_message_illegal() -> None:
    body = batch_body([(b"one", {"UNIQ_KEY": "A", "TAGS": "t"}), (b"", {}), (b"three", {"KEYS": "k"})])
    items = batch_messages(body)
    assert [(item.body, item.properties) for item in items] == [
        (b"one", {"UNIQ_KEY": "A", "TAGS": "t"}), (b"", {}), (b"three", {"KEYS": "k"})]
    for bad in (b"", body[:-1], body + b"\x00", body[:10], b"\x00" * 22):
        with pytest.raises(RequestError) as caught:
            batch_messages(bad)
        assert caught.value.code == ResponseCode.MESSAGE_ILLEGAL


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_any_batch_body_decodes_or_is_refused(body: bytes) -> None:
    try:
        batch_messages(body)
    except RequestError as error:
        assert error.code == ResponseCode.MESSAGE_ILLEGAL and error.remark


def test_properties_are_parsed_leniently_as_java_does() -> None:
    assert parse_properties("A\x011\x02B\x012\x02") == {"A": "1", "B": "2"}
    assert parse_properties("A\x011\x02junk\x02\x02A\x013") == {"A": "3"}
    assert parse_properties("") == {}


def test_the_uniq_key_is_read_from_encoded_properties_without_parsing_them() -> None:
    assert find_uniq_key(b"A\x011\x02UNIQ_KEY\x01U1\x02UNIQ_KEY\x01U2\x02") == b"U1"  # the first one
    assert find_uniq_key(b"UNIQ_KEY\x01U\x02") == b"U" and find_uniq_key(b"UNIQ_KEY\x01U") == b"U"
    assert find_uniq_key(b"UNIQ_KEY\x01\x02UNIQ_KEY\x01V\x02") == b"V"  # an empty one is no key
    assert find_uniq_key(b"XUNIQ_KEY\x01U\x02") is None and find_uniq_key(b"KEYS\x01k\x02") is None
    assert find_uniq_key(b"") is None


def test_tag_expressions_select_java_hash_codes() -> None:
    assert tag_codes(None) is None and tag_codes("*") is None and tag_codes(" ") is None
    assert tag_codes("TagA || TagB") == frozenset({java_string_hash("TagA"), java_string_hash("TagB")})


@pytest.mark.parametrize(
    ("expression", "tags"),
    [(None, None), ("", None), ("  ", None), ("*", None), (" * ", None), ("TagA", frozenset({"TagA"})),
     (" TagA ||TagB|| ", frozenset({"TagA", "TagB"})), ("||", frozenset()), ("A||A", frozenset({"A"}))],
)
def test_the_client_and_both_broker_sides_read_a_tag_expression_alike(expression: str | None,
                                                                      tags: frozenset[str] | None) -> None:
    assert expression_tags(expression) == tags
    # the 4.x pull: hash codes, and an expression naming no tag selects nothing
    assert tag_codes(expression) == (None if tags is None else frozenset(java_string_hash(tag) for tag in tags))
    # the client: a subscription to every message when the expression names no tag
    subscription = parse_subscription("T", expression, 0)
    assert subscription.tags == (tags or frozenset())
    assert subscription.expression == (SUBSCRIBE_ALL if not tags else (expression or "").strip())


def test_send_header_reads_both_name_forms_and_refuses_bad_fields() -> None:
    long_form = {"producerGroup": "g", "topic": "T", "queueId": "2", "bornTimestamp": "5", "batch": "true"}
    short_form = {"a": "g", "b": "T", "e": "2", "g": "5", "m": "1"}
    assert SendHeader.parse(long_form, v2=False) == SendHeader.parse(short_form, v2=True)
    assert SendHeader.parse(short_form, v2=False).batch  # Java's batches: code 320 with short names
    for bad in ({**long_form, "queueId": "x"}, {**long_form, "bornTimestamp": ""}, {"topic": "T"},
                {**long_form, "batch": "maybe"}, {**long_form, "queueId": str(2**31)}):
        with pytest.raises(RequestError) as caught:
            SendHeader.parse(bad, v2=False)
        assert caught.value.code == ResponseCode.SYSTEM_ERROR


def test_delivery_times() -> None:
    now = 1_700_000_000_000
    assert due_time_ms({}, now) is None
    assert due_time_ms({"TIMER_DELAY_SEC": "5"}, now) == now + 5000
    assert due_time_ms({"TIMER_DELAY_MS": "250"}, now) == now + 250
    assert due_time_ms({"__STARTDELIVERTIME": str(now + 10)}, now) == now + 10
    assert due_time_ms({"TIMER_DELIVER_MS": str(now - 10)}, now) == now - 10  # past: delivered at once
    for bad in ({"TIMER_DELAY_SEC": "-1"}, {"TIMER_DELAY_SEC": "1.5"}, {"TIMER_DELIVER_MS": str(now + 31 * 86_400_000)}):
        with pytest.raises(RequestError) as caught:
            due_time_ms(bad, now)
        assert caught.value.code == ResponseCode.MESSAGE_ILLEGAL


NODE = """
[node]
id = "n0"
raft_address = "127.0.0.1:20010"
catchup_address = "127.0.0.1:20011"
data_dir = "data"
secret = "0123456789abcdef0123"

[[peers]]
id = "n1"
raft_address = "127.0.0.1:20020"
catchup_address = "127.0.0.1:20021"

[broker]
listen_address = "127.0.0.1:10911"
namesrv = ["127.0.0.1:9876"]
peer_addresses = { n1 = "127.0.0.1:10921" }
"""


def test_node_file_with_a_broker_table(tmp_path: Path) -> None:
    path = tmp_path / "node.toml"
    path.write_text(NODE)
    node, broker = load_node_file(path)
    assert node.id == "n0" and broker.listen_address == "127.0.0.1:10911" and broker.broker_name == "broker-a"
    assert broker.peer_addresses == {"n1": "127.0.0.1:10921"}
    for change, message in (
        (NODE.replace("[broker]", "[brokers]"), "a \\[broker\\] table is required"),
        (NODE.replace('listen_address = "127.0.0.1:10911"', 'listen_address = "nowhere"'), "listen_address"),
        (NODE.replace("n1 = ", "n7 = "), "non-members"),
        (NODE + "auto_create_topic = 3\n", "auto_create_topic"),
        (NODE + "colour = 'blue'\n", "unknown key"),
        (NODE.replace("[broker]", "[broker]\nbroker_name = 'a b'"), "broker_name"),
    ):
        path.write_text(change)
        with pytest.raises(ConfigError, match=message):
            load_node_file(path)


def test_pulls_spot_a_damaged_record() -> None:
    from broker.pull import first_damaged
    from commitlog.hosts import encode_host
    from commitlog.message import MessageInput
    from commitlog.record_codec import encode_record

    def record(body: bytes, offset: int, born_host: bytes = encode_host("127.0.0.1", 1)) -> bytes:
        message = MessageInput("T", 0, 0, 0, 1, born_host, 2, 0, 0, body, b"TAGS\x01a\x02")
        return encode_record(message, 0, offset, encode_host("127.0.0.1", 2))

    good = [record(b"x" * 100, 0), record(b"", 200), record(b"v6", 400, bytes(16) + b"\x00\x00\x00\x01")]
    assert first_damaged(good) is None
    damaged = bytearray(good[0])
    damaged[-20] ^= 0x01  # a body byte
    assert first_damaged([good[1], bytes(damaged)]) == 0


def test_pulls_spot_a_damaged_record_with_an_ipv6_store_host() -> None:
    """The body starts 12 bytes later with an IPv6 store host (sysFlag 0x20), 24 with both hosts IPv6."""
    from broker.pull import first_damaged
    from commitlog.hosts import encode_address
    from commitlog.message import MessageInput
    from commitlog.record_codec import encode_record

    store_host = encode_address("[fd00::3]:10911")
    good = [encode_record(MessageInput("T", 0, 0, 0, 1, born_host, 2, 0, 0, b"y" * 50, b"TAGS\x01a\x02"), 0, offset,
                          store_host) for offset, born_host in ((0, encode_host("127.0.0.1", 1)), (300, bytes(20)))]
    assert first_damaged(good) is None
    for record in good:
        damaged = bytearray(record)
        damaged[-20] ^= 0x01  # the last body byte
        assert first_damaged([bytes(damaged)]) == int.from_bytes(record[28:36], "big")


@pytest.mark.parametrize("born_host", [encode_host("10.0.0.1", 5000), bytes(15) + b"\x01" + (5000).to_bytes(4, "big")])
def test_store_timestamp_of_a_record_after_either_born_host(born_host: bytes) -> None:
    message = MessageInput("T", 0, 0, 0, 111, born_host, 1_700_000_000_123, 0, 0, b"body", b"")
    record = encode_record(message, 0, 0, encode_host("127.0.0.1", 10911))
    assert record_store_timestamp(record) == 1_700_000_000_123 == decode_record(record).store_timestamp


@pytest.mark.parametrize("value, name", [
    ("CONSUME_FROM_TIMESTAMP", "CONSUME_FROM_TIMESTAMP"), (4, "CONSUME_FROM_FIRST_OFFSET"),
    ("0", "CONSUME_FROM_LAST_OFFSET"), (6, "DEFAULT"), (-1, "DEFAULT"), (True, "DEFAULT"), (None, "DEFAULT"),
    ("CONSUME_SOMEHOW", "DEFAULT"), (2.0, "DEFAULT"),
])
def test_heartbeat_enums_by_name_or_ordinal(value: object, name: str) -> None:
    assert _enum_name(value, CONSUME_FROM_WHERE, "DEFAULT") == name
    assert _enum_name(1, CONSUME_TYPES, "DEFAULT") == "CONSUME_PASSIVELY"


def test_a_clients_born_host_keeps_its_ip_family() -> None:
    """broker.send: an IPv6 client's born host is its own 20 bytes (RocketMQ's 0x10 sysflag layout), an
    IPv4-mapped one (a dual-stack socket's IPv4 client) is stored as IPv4, what is no IP address as
    127.0.0.1:0."""
    from broker.send import _born_host
    from commitlog.hosts import encode_peer, format_address

    assert format_address(_born_host("[2001:db8::5]:4242")) == "[2001:db8::5]:4242"
    assert len(_born_host("[2001:db8::5]:4242")) == 20
    assert _born_host("[::ffff:10.0.0.7]:99") == _born_host("10.0.0.7:99") == bytes((10, 0, 0, 7)) + (99).to_bytes(4, "big")
    assert format_address(_born_host("[fe80::1%eth0]:7")) == "[fe80::1]:7"
    assert format_address(_born_host("somewhere:7")) == "127.0.0.1:0"
    with pytest.raises(ValueError, match="port"):
        encode_peer("10.0.0.1", 70000)
