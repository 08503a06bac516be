"""The 5.x protocol's pure parts (broker.v2): message conversion and its refusals, FIFO queue selection,
route queues, the Settings reply, the authorization header against ACL accounts. No network, no SDK."""

from __future__ import annotations

import hashlib
import hmac
from typing import Any

import pytest

from broker.acl.authorizer import AclRules
from broker.acl.config import AclConfig
from broker.config import BrokerConfig
from broker.v2.auth import Access, Authenticator, parse_credentials
from broker.v2.clients import (
    PRODUCER_MAX_ATTEMPTS,
    ClientTable,
    SettingsLimits,
    server_settings,
)
from broker.v2.messages import (
    MESSAGE_GROUP_BYTES_MAX,
    USER_PROPERTIES_MAX,
    consistent_hash,
    fifo_queue_id,
    outgoing_message,
)
from broker.v2.protocol.definition_pb2 import (
    Broker,
    ClientType,
    Code,
    Encoding,
    Message,
    MessageType,
    Permission,
    Publishing,
    Resource,
    Settings,
    Subscription,
)
from broker.v2.server import parse_peer
from broker.v2.service import endpoints, route_queues
from broker.v2.status import StatusError
from commitlog.config import ConfigError
from commitlog.sys_flags import SYSFLAG_COMPRESSED, TRANSACTION_PREPARED_TYPE
from protocol.route_data import PERM_READ, PERM_WRITE

NOW_MS = 1_700_000_000_000
BODY_MAX = 1024


def message(topic: str = "orders", body: bytes = b"hello", **system: Any) -> Message:
    built = Message(topic=Resource(name=topic), body=body)
    built.system_properties.message_id = system.pop("message_id", "0102FC000000013FAF0B1A149D00000000")
    for name, value in system.items():
        if name == "keys":
            built.system_properties.keys.extend(value)
        elif name == "delivery_ms":
            built.system_properties.delivery_timestamp.seconds = value // 1000
            built.system_properties.delivery_timestamp.nanos = value % 1000 * 1_000_000
        elif name == "user":
            built.user_properties.update(value)
        else:
            setattr(built.system_properties, name, value)
    return built


def refusal(built: Message) -> Code:
    with pytest.raises(StatusError) as caught:
        outgoing_message(built, BODY_MAX, NOW_MS)
    return caught.value.code


# ------------------------------------------------------------------------------------------- messages


def test_normal_message_gets_the_properties_a_4x_producer_would_send() -> None:
    out = outgoing_message(message(tag="TagA", keys=["k1", "k2"], user={"b": "2", "a": "1"},
                                   message_type=MessageType.NORMAL), BODY_MAX, NOW_MS)
    assert out.topic == "orders" and out.body == b"hello" and out.sys_flag == 0 and not out.transactional
    assert out.properties == {"a": "1", "b": "2", "TAGS": "TagA", "KEYS": "k1 k2",
                              "UNIQ_KEY": "0102FC000000013FAF0B1A149D00000000"}
    assert list(out.properties)[:2] == ["a", "b"]  # user properties in a fixed order, whatever the wire's
    assert out.born_timestamp_ms == NOW_MS  # none given: now


def test_fifo_delay_transaction_and_gzip() -> None:
    fifo = outgoing_message(message(message_group="g1", message_type=MessageType.FIFO), BODY_MAX, NOW_MS)
    assert fifo.message_group == "g1" and fifo.properties["__SHARDINGKEY"] == "g1"
    delayed = outgoing_message(message(delivery_ms=NOW_MS + 5_000), BODY_MAX, NOW_MS)
    assert delayed.properties["TIMER_DELIVER_MS"] == str(NOW_MS + 5_000)
    transaction = message(message_type=MessageType.TRANSACTION, body_encoding=Encoding.GZIP)
    transaction.system_properties.orphaned_transaction_recovery_duration.seconds = 30
    half = outgoing_message(transaction, BODY_MAX, NOW_MS)
    assert half.transactional and half.sys_flag == TRANSACTION_PREPARED_TYPE | SYSFLAG_COMPRESSED
    assert half.properties["TRAN_MSG"] == "true" and half.properties["CHECK_IMMUNITY_TIME_IN_SECONDS"] == "30"


def test_delivery_time_in_milliseconds_where_seconds_belong_is_read_as_milliseconds() -> None:
    """The Python SDK 5.1.2 writes its millisecond delivery time into ``seconds``."""
    built = message()
    built.system_properties.delivery_timestamp.seconds = NOW_MS + 2_000
    assert outgoing_message(built, BODY_MAX, NOW_MS).properties["TIMER_DELIVER_MS"] == str(NOW_MS + 2_000)


@pytest.mark.parametrize(("built", "code"), [
    (message(topic=""), Code.ILLEGAL_TOPIC),
    (message(topic="bad topic"), Code.ILLEGAL_TOPIC),
    (message(topic="RMQ_SYS_TRANS_HALF_TOPIC"), Code.ILLEGAL_TOPIC),
    (message(topic="%DLQ%group"), Code.ILLEGAL_TOPIC),
    (message(body=b""), Code.MESSAGE_BODY_EMPTY),
    (message(body=b"x" * (BODY_MAX + 1)), Code.MESSAGE_BODY_TOO_LARGE),
    (message(message_id=""), Code.ILLEGAL_MESSAGE_ID),
    (message(message_id="id\x01"), Code.ILLEGAL_MESSAGE_ID),
    (message(tag="a|b"), Code.ILLEGAL_MESSAGE_TAG),
    (message(tag="  "), Code.ILLEGAL_MESSAGE_TAG),
    (message(keys=["ok", "\x02"]), Code.ILLEGAL_MESSAGE_KEY),
    (message(user={"UNIQ_KEY": "forged"}), Code.ILLEGAL_MESSAGE_PROPERTY_KEY),
    (message(user={"DELAY": "3"}), Code.ILLEGAL_MESSAGE_PROPERTY_KEY),
    (message(user={"k": "v\x01"}), Code.ILLEGAL_MESSAGE_PROPERTY_KEY),
    (message(user={f"k{i}": "v" for i in range(USER_PROPERTIES_MAX + 1)}), Code.MESSAGE_PROPERTIES_TOO_LARGE),
    (message(user={"k": "v" * 20_000}), Code.MESSAGE_PROPERTIES_TOO_LARGE),
    (message(message_group=" "), Code.ILLEGAL_MESSAGE_GROUP),
    (message(message_group="g" * MESSAGE_GROUP_BYTES_MAX), Code.ILLEGAL_MESSAGE_GROUP),
    (message(message_group="g", delivery_ms=NOW_MS + 5_000), Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE),
    (message(message_group="g", message_type=MessageType.TRANSACTION), Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE),
    (message(message_type=MessageType.FIFO), Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE),
    (message(delivery_ms=NOW_MS + 31 * 86_400_000), Code.ILLEGAL_DELIVERY_TIME),
    (message(lite_topic="lite"), Code.UNSUPPORTED),
], ids=lambda value: value if isinstance(value, str) else None)
def test_bad_messages_are_refused_with_the_proxy_codes(built: Message, code: Code) -> None:
    assert refusal(built) == code


def test_consistent_hash_is_guavas() -> None:
    """Guava's own golden values (HashingTest.testConsistentHash_linearCongruentialGeneratorCompatibility)."""
    golden100 = [0, 55, 62, 8, 45, 59, 86, 97, 82, 59, 73, 37, 17, 56, 86, 21, 90, 37, 38, 83]
    assert [consistent_hash(value, 100) for value in range(len(golden100))] == golden100
    assert consistent_hash(10863919174838991, 11) == 6
    assert consistent_hash(2016238256797177309, 11) == 3
    assert consistent_hash(1673758223894951030, 11) == 5
    assert consistent_hash(2, 100001) == 80343
    assert consistent_hash(2201, 100001) == 22152
    assert consistent_hash(2202, 100001) == 15018


def test_fifo_queue_is_stable_and_in_range() -> None:
    for group in ("g1", "order-42", "ünïcode", "a" * 63):
        queue = fifo_queue_id(group, 8)
        assert 0 <= queue < 8 and fifo_queue_id(group, 8) == queue
    assert fifo_queue_id("anything", 1) == 0


# ---------------------------------------------------------------------------------------------- route


def test_route_queues_follow_the_proxys_numbering() -> None:
    broker = Broker(name="broker-a", id=0, endpoints=endpoints("127.0.0.1:8081"))
    queues = route_queues("orders", 4, 4, PERM_READ | PERM_WRITE, broker, "", "orders")
    assert [queue.id for queue in queues] == [0, 1, 2, 3]
    assert {queue.permission for queue in queues} == {Permission.READ_WRITE}
    assert list(queues[0].accept_message_types) == [MessageType.NORMAL, MessageType.FIFO, MessageType.DELAY,
                                                    MessageType.TRANSACTION]
    assert queues[0].broker.endpoints.addresses[0].port == 8081
    mixed = route_queues("orders", 2, 3, PERM_READ | PERM_WRITE, broker, "", "orders")
    assert [queue.permission for queue in mixed] == [Permission.WRITE, Permission.READ_WRITE, Permission.READ_WRITE]
    assert [queue.permission for queue in route_queues("t", 2, 2, 0, broker, "", "t")] == [Permission.NONE] * 2


def test_parse_peer() -> None:
    assert parse_peer("ipv4:127.0.0.1:5000") == ("127.0.0.1", 5000)
    assert parse_peer("ipv6:[::1]:5000") == ("::1", 5000)
    assert parse_peer("unix:/tmp/socket") == ("", 0)


# ------------------------------------------------------------------------------------------- settings

LIMITS = SettingsLimits(4 << 20, 30_000, 17, (10, 30, 60))


def test_producer_settings_reply_fills_what_the_sdk_copies() -> None:
    client = Settings(client_type=ClientType.PRODUCER, publishing=Publishing(topics=[Resource(name="orders")]))
    reply = server_settings(client, LIMITS)
    assert reply.publishing.max_body_size == 4 << 20 and reply.publishing.validate_message_type
    assert reply.backoff_policy.max_attempts == PRODUCER_MAX_ATTEMPTS
    assert reply.backoff_policy.exponential_backoff.max.seconds == 1
    assert [topic.name for topic in reply.publishing.topics] == ["orders"]


def test_consumer_settings_reply_fills_batch_polling_and_backoff() -> None:
    client = Settings(client_type=ClientType.SIMPLE_CONSUMER, subscription=Subscription(group=Resource(name="g")))
    reply = server_settings(client, LIMITS)
    assert reply.subscription.receive_batch_size > 0
    assert reply.subscription.long_polling_timeout.seconds == 20
    assert reply.backoff_policy.max_attempts == 17
    assert [step.seconds for step in reply.backoff_policy.customized_backoff.next] == [10, 30, 60]
    with pytest.raises(StatusError) as caught:
        server_settings(Settings(client_type=ClientType.PRODUCER), LIMITS)
    assert caught.value.code == Code.BAD_REQUEST


def test_client_table_is_bounded_and_expires() -> None:
    now = [0.0]
    table = ClientTable(clients_max=2, monotonic=lambda: now[0])
    table.heard("a", ClientType.PRODUCER)
    table.heard("b", ClientType.PRODUCER)
    with pytest.raises(StatusError) as caught:
        table.heard("c", ClientType.PRODUCER)
    assert caught.value.code == Code.TOO_MANY_REQUESTS
    with pytest.raises(StatusError):
        table.heard("", ClientType.PRODUCER)
    now[0] = 100.0
    table.heard("a", ClientType.CLIENT_TYPE_UNSPECIFIED)  # a heartbeat naming no type keeps the known one
    assert table.expire(50.0) == ["b"]
    entry = table.get("a")
    assert entry is not None and entry.client_type == ClientType.PRODUCER


# ------------------------------------------------------------------------------------------------ ACL

ACL = AclConfig.from_toml('''
[[accounts]]
accessKey = "producer1"
secretKey = "secret01"
defaultTopicPerm = "DENY"
topicPerms = ["orders=PUB"]
''')


def signed(access_key: str, secret_key: str, date: str = "20260101T101010Z") -> dict[str, str]:
    signature = hmac.new(secret_key.encode(), date.encode(), hashlib.sha1).hexdigest()
    return {"x-mq-date-time": date,
            "authorization": f"MQv2-HMAC-SHA1 Credential={access_key}, SignedHeaders=x-mq-date-time, "
                             f"Signature={signature}"}


def check(metadata: dict[str, str], access: Access) -> Code:
    authenticator = Authenticator(AclRules(ACL, lambda: b""))
    try:
        authenticator.check(metadata, "10.0.0.9", access, "SendMessage")
    except StatusError as error:
        return error.code
    return Code.OK


def test_authorization_header_is_checked_against_the_acl_accounts() -> None:
    orders = Access(publish_topics=("orders",))
    assert check(signed("producer1", "secret01"), orders) == Code.OK
    assert check(signed("producer1", "wrong-secret"), orders) == Code.UNAUTHORIZED
    assert check(signed("nobody12", "secret01"), orders) == Code.UNAUTHORIZED
    assert check({}, orders) == Code.UNAUTHORIZED
    assert check({"authorization": "Basic abc"}, orders) == Code.UNAUTHORIZED
    assert check(signed("producer1", "secret01"), Access(publish_topics=("payments",))) == Code.FORBIDDEN
    assert check(signed("producer1", "secret01"), Access(subscribe_topics=("orders",))) == Code.FORBIDDEN
    # ACL off: anything goes, signed or not
    Authenticator(AclRules(None, lambda: b"")).check({}, "10.0.0.9", orders, "SendMessage")


def test_credentials_parse_the_sdk_header() -> None:
    credentials = parse_credentials(signed("producer1", "secret01"))
    assert credentials is not None and credentials.access_key == "producer1"
    assert credentials.signed_by("secret01") and not credentials.signed_by("secret02")
    assert parse_credentials({}) is None


# --------------------------------------------------------------------------------------------- config


def test_grpc_config_is_validated() -> None:
    base = {"listen_address": "127.0.0.1:10911"}
    assert BrokerConfig.from_mapping(base).grpc_address == ""  # off unless set
    config = BrokerConfig.from_mapping({**base, "grpc_address": "127.0.0.1:8081",
                                        "peer_grpc_addresses": {"n1": "127.0.0.1:8082"}})
    assert config.grpc_address == "127.0.0.1:8081" and config.peer_grpc_addresses == {"n1": "127.0.0.1:8082"}
    for bad, words in (({"grpc_address": "0.0.0.0:8081"}, "wildcard"), ({"grpc_address": "nowhere"}, "grpc_address"),
                       ({"grpc_address": 8081}, "grpc_address"), ({"peer_grpc_addresses": ["x"]}, "peer_grpc_addresses"),
                       ({"grpc_in_flight_requests_max": 0}, "grpc_in_flight_requests_max")):
        with pytest.raises(ConfigError, match=words):
            BrokerConfig.from_mapping({**base, **bad})
