"""Pure parts of the client: configuration, unique ids, messages and their encodings, routes,
selectors, errors. No network."""

from __future__ import annotations

from pathlib import Path

import pytest

from client.config import (
    ClientConfig,
    ConfigError,
    ConsumeFromWhere,
    ConsumerConfig,
    MessageModel,
    ProducerConfig,
    parse_namesrv_addresses,
)
from client.errors import (
    ClientErrorCode,
    MessageValidationError,
    MQBrokerError,
    NotLeaderError,
    broker_error,
    describe_code,
)
from client.message import (
    Message,
    MessageQueue,
    decode_messages,
    encode_batch_record,
    message_from_record,
)
from client.route import borrowed_route, topic_route_from_data
from client.selector import RoundRobin, java_hash_code, select_by_hash, select_by_sharding_key
from commitlog.hosts import encode_host
from commitlog.message import MessageInput
from commitlog.record_codec import decode_record, encode_record
from commitlog.sys_flags import SYSFLAG_COMPRESSED
from protocol.batch import BatchError, BatchMessage, decode_batch
from protocol.codes import ResponseCode
from protocol.properties import encode_properties
from protocol.route_data import PERM_READ, PERM_WRITE, BrokerData, QueueData, TopicRouteData

# ----------------------------------------------------------------------------------- configuration


def test_namesrv_addresses_parse_java_and_comma_separators() -> None:
    assert parse_namesrv_addresses("a:1; b:2,c:3") == ("a:1", "b:2", "c:3")
    assert ClientConfig("h:9876").namesrv_addresses == ("h:9876",)  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        parse_namesrv_addresses(" ; ")
    with pytest.raises(ConfigError):
        ClientConfig(("nohost",))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"request_timeout_seconds": 0}, "request_timeout_seconds"),
        ({"route_refresh_interval_seconds": float("inf")}, "route_refresh_interval_seconds"),
        ({"failover_backoff_min_seconds": 2.0}, "failover_backoff_min_seconds cannot exceed"),
        ({"instance_name": "a@b"}, "instance_name"),
        ({"outbound_requests_max": 0}, "outbound_requests_max"),
    ],
)
def test_client_config_rejects_bad_values(overrides: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        ClientConfig.from_mapping({"namesrv_addresses": ("h:1",), **overrides})


def test_configs_reject_unknown_keys() -> None:
    with pytest.raises(ConfigError, match="unknown ClientConfig keys: colour"):
        ClientConfig.from_mapping({"namesrv_addresses": ("h:1",), "colour": 1})
    with pytest.raises(ConfigError, match="unknown ProducerConfig keys"):
        ProducerConfig.from_mapping({"retries": 3})


def test_producer_and_consumer_configs_validate() -> None:
    with pytest.raises(ConfigError, match="group"):
        ProducerConfig(group="bad group")
    with pytest.raises(ConfigError, match="compress_level"):
        ProducerConfig(compress_level=10)
    config = ConsumerConfig.from_mapping(
        {"group": "g", "message_model": "broadcasting", "consume_from_where": "consume_from_first_offset",
         "offset_store_dir": "/tmp/x"}
    )
    assert config.message_model is MessageModel.BROADCASTING
    assert config.consume_from_where is ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET
    assert config.offset_store_dir == Path("/tmp/x")
    with pytest.raises(ConfigError, match="message_model"):
        ConsumerConfig(message_model="sideways")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="pull_threshold_per_queue"):
        ConsumerConfig(pull_batch_size=64, pull_threshold_per_queue=10)


# ---------------------------------------------------------------------------------------- messages


def test_message_accepts_key_strings_and_builds_wire_properties() -> None:
    message = Message("T", "text", tags="TagA", keys="k1 k2", properties={"color": "red"}, delay_level=3)  # type: ignore[arg-type]
    assert message.body == b"text" and message.keys == ("k1", "k2")
    message.unique_id = "ID"
    assert message.wire_properties() == {
        "TAGS": "TagA", "KEYS": "k1 k2", "WAIT": "true", "DELAY": "3", "UNIQ_KEY": "ID", "color": "red"
    }
    timed = Message("T", b"x", deliver_at_ms=123, sharding_key="s")
    assert timed.wire_properties()["__STARTDELIVERTIME"] == "123"
    assert timed.wire_properties()["TIMER_DELIVER_MS"] == "123"
    assert timed.wire_properties()["SHARDING_KEY"] == "s"


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        (Message("", b"x"), "blank"),
        (Message("bad topic", b"x"), "characters"),
        (Message("T" * 128, b"x"), "longer than topic max length 127"),
        (Message("T", b""), "empty"),
        (Message("T", b"x" * 11), "over the limit"),
        (Message("T", b"x", tags="a\x01b"), "separators"),
        (Message("T", b"x", keys=("a b",)), "without spaces"),
        (Message("T", b"x", properties={"UNIQ_KEY": "x"}), "reserved"),
        (Message("T", b"x", delay_level=19), "delay_level"),
        (Message("T", b"x", delay_level=1, deliver_at_ms=5), "exclusive"),
    ],
)
def test_message_validation(message: Message, reason: str) -> None:
    with pytest.raises(MessageValidationError, match=reason) as caught:
        message.validate(body_size_max_bytes=10)
    assert caught.value.code == ResponseCode.MESSAGE_ILLEGAL


def test_batch_records_have_java_layout_and_round_trip() -> None:
    record = encode_batch_record(b"body", {"UNIQ_KEY": "U"}, flag=7)
    properties = b"UNIQ_KEY\x01U\x02"
    assert record == (
        (20 + 4 + 2 + len(properties)).to_bytes(4, "big") + bytes(8) + (7).to_bytes(4, "big")
        + (4).to_bytes(4, "big") + b"body" + len(properties).to_bytes(2, "big") + properties
    )
    body = record + encode_batch_record(b"second", {})
    assert decode_batch(body) == [BatchMessage(7, b"body", {"UNIQ_KEY": "U"}), BatchMessage(0, b"second", {})]
    with pytest.raises(BatchError):
        decode_batch(body[:-1])


def stored(body: bytes, properties: dict[str, str], *, physical: int = 0, sys_flag: int = 0) -> bytes:
    return encode_record(
        MessageInput("T", 2, 0, sys_flag, 1000, encode_host("1.2.3.4", 5), 2000, 1, 0, body,
                     encode_properties(properties)),
        queue_offset=9, physical_offset=physical, store_host=encode_host("10.0.0.1", 10911),
    )


def test_received_messages_decode_from_stored_records() -> None:
    import zlib

    first = stored(b"hello", {"TAGS": "a", "KEYS": "x y", "UNIQ_KEY": "U1", "color": "red"})
    second = stored(zlib.compress(b"big" * 100), {}, physical=len(first), sys_flag=SYSFLAG_COMPRESSED)
    messages = decode_messages(first + second, "broker-a")
    assert [m.body for m in messages] == [b"hello", b"big" * 100]
    head = messages[0]
    assert (head.topic, head.queue_id, head.queue_offset, head.tags, head.keys) == ("T", 2, 9, "a", ("x", "y"))
    assert head.msg_id == "U1" and head.offset_msg_id == "0A00000100002A9F0000000000000000"
    assert head.user_properties == {"color": "red"}
    assert head.born_host == "1.2.3.4:5" and head.reconsume_times == 1
    assert head.message_queue == MessageQueue("T", "broker-a", 2)
    # without UNIQ_KEY the id is the store-based one
    assert messages[1].msg_id == messages[1].offset_msg_id
    assert message_from_record(decode_record(first)).to_json_object()["body"] == "hello"


# ------------------------------------------------------------------------------------------ routes


def route_data(*queue_datas: QueueData, masters: dict[str, dict[int, str]] | None = None) -> TopicRouteData:
    addresses = masters or {q.broker_name: {0: f"{q.broker_name}:1"} for q in queue_datas}
    return TopicRouteData(
        queue_datas=queue_datas,
        broker_datas=tuple(BrokerData("c", name, ids) for name, ids in addresses.items()),
    )


def test_route_publish_and_subscribe_queues_follow_perms_and_counts() -> None:
    data = route_data(
        QueueData("b", 2, 3, PERM_READ | PERM_WRITE),
        QueueData("a", 1, 2, PERM_WRITE),
        QueueData("c", 2, 2, PERM_READ),
    )
    route = topic_route_from_data("T", data)
    assert [(q.broker_name, q.queue_id) for q in route.publish_queues] == [
        ("a", 0), ("a", 1), ("b", 0), ("b", 1), ("b", 2)
    ]
    assert [(q.broker_name, q.queue_id) for q in route.subscribe_queues] == [
        ("b", 0), ("b", 1), ("c", 0), ("c", 1)
    ]
    assert route.master_address("a") == "a:1"


def test_route_keeps_a_group_without_leader_and_borrows_for_new_topics() -> None:
    data = route_data(QueueData("a", 4, 4, 6), masters={"a": {1: "f:1", 2: "f:2"}})
    route = topic_route_from_data("TBW102", data)
    assert len(route.publish_queues) == 4 and route.master_address("a") is None
    borrowed = borrowed_route("New", route, queue_nums=2)
    assert [q for q in borrowed.publish_queues] == [MessageQueue("New", "a", 0), MessageQueue("New", "a", 1)]


def test_order_topic_conf_fixes_the_publish_queues() -> None:
    data = TopicRouteData(
        queue_datas=(QueueData("a", 4, 4, 6),), broker_datas=(BrokerData("c", "a", {0: "a:1"}),),
        order_topic_conf="a:2;b:1",
    )
    route = topic_route_from_data("T", data)
    assert route.ordered
    assert [(q.broker_name, q.queue_id) for q in route.publish_queues] == [("a", 0), ("a", 1), ("b", 0)]


# --------------------------------------------------------------------------------------- selectors

QUEUES = [MessageQueue("T", "a", index) for index in range(4)]


@pytest.mark.parametrize(
    ("argument", "java_hash"),
    [("", 0), ("a", 97), ("order-1", -1207111310), (2**40 + 3, 259), ("hello world", 1794106052), (5, 5), (-7, -7)],
)
def test_java_hash_codes(argument: object, java_hash: int) -> None:
    assert java_hash_code(argument) == java_hash


def test_hash_selectors_are_stable_and_java_compatible() -> None:
    message = Message("T", b"x", sharding_key="order-1")
    # Java: Math.abs("order-1".hashCode() % 4) == abs(-1207111310 % 4) == 2
    assert select_by_hash(QUEUES, message, "order-1") == QUEUES[2]
    assert select_by_sharding_key(QUEUES, message, None) == QUEUES[2]
    assert select_by_hash(QUEUES, message, -7) == QUEUES[3]
    with pytest.raises(MessageValidationError):
        select_by_sharding_key(QUEUES, Message("T", b"x"), None)


def test_round_robin_rotates_and_avoids_the_failed_broker() -> None:
    robin = RoundRobin(start=0)
    assert [robin.select(QUEUES).queue_id for _ in range(5)] == [1, 2, 3, 0, 1]
    mixed = [MessageQueue("T", "a", 0), MessageQueue("T", "b", 0)]
    assert all(robin.select(mixed, avoid_broker="a").broker_name == "b" for _ in range(4))
    assert robin.select(QUEUES, avoid_broker="a").broker_name == "a"  # nothing else left


# ------------------------------------------------------------------------------------------ errors


def test_errors_carry_codes() -> None:
    not_leader = broker_error(14, "not leader", "h:1", {"leaderAddress": "h:2"})
    assert isinstance(not_leader, NotLeaderError) and not_leader.leader_address == "h:2"
    assert not_leader.code == ResponseCode.SERVICE_NOT_AVAILABLE
    busy = broker_error(2, None, "h:1", {})
    assert type(busy) is MQBrokerError and busy.code == 2 and "SYSTEM_BUSY" in str(busy)
    assert describe_code(ClientErrorCode.NOT_FOUND_TOPIC_EXCEPTION) == "NOT_FOUND_TOPIC_EXCEPTION(10005)"
