"""The access check, step by step as RocketMQ's PlainPermissionManager.validate and checkPerm."""

from __future__ import annotations

import json

import pytest

from broker.acl.config import AclConfig
from broker.acl.permissions import PUB
from broker.acl.resources import required_permissions
from broker.acl.validator import AccessDeniedError, AccessValidator
from broker.requests import V2_NAMES, SendHeader
from protocol.codes import RequestCode
from protocol.command import RemotingCommand, make_request
from protocol.signature import sign_fields
from tests.acl.helpers import ADMIN, BASE_ACL, CONSUMER, PRODUCER, Credentials, pull_fields, send_fields

RULES = AccessValidator(AclConfig.from_toml(BASE_ACL))
WHITELISTED = AccessValidator(AclConfig.from_toml(BASE_ACL.replace(
    "globalWhiteRemoteAddresses = []", 'globalWhiteRemoteAddresses = ["10.0.0.*"]')))
CLIENT = "127.0.0.1"


def signed(code: int, fields: dict[str, str], credentials: Credentials | None, body: bytes = b"") -> RemotingCommand:
    if credentials is not None:
        fields = sign_fields(fields, body, credentials.access_key, credentials.secret_key)
    return make_request(code, 1, fields, body)


def refusal(request: RemotingCommand, host: str = CLIENT, rules: AccessValidator = RULES) -> str | None:
    try:
        rules.check(request, host)
    except AccessDeniedError as denied:
        return str(denied)
    return None


def heartbeat_body(group: str, topics: list[str]) -> bytes:
    return json.dumps({"clientID": "c1", "consumerDataSet": [{
        "groupName": group, "subscriptionDataSet": [{"topic": topic, "subString": "*"} for topic in topics]}],
        "producerDataSet": [{"groupName": "p"}]}).encode()


def test_unsigned_unknown_and_forged_requests_are_refused_saying_why() -> None:
    fields = send_fields("orders")
    assert "No accessKey" in (refusal(signed(RequestCode.SEND_MESSAGE, fields, None)) or "")
    assert "No accessKey" in (refusal(make_request(RequestCode.SEND_MESSAGE, 1, {**fields, "AccessKey": ""})) or "")
    stranger = Credentials("stranger1", "whatever1")
    assert "No acl config for stranger1" in (refusal(signed(RequestCode.SEND_MESSAGE, fields, stranger)) or "")
    wrong_secret = Credentials(PRODUCER.access_key, "not-the-secret")
    assert "Check signature failed" in (refusal(signed(RequestCode.SEND_MESSAGE, fields, wrong_secret)) or "")
    tampered = signed(RequestCode.SEND_MESSAGE, fields, PRODUCER, b"body")
    tampered = make_request(tampered.code, 1, tampered.ext_fields, b"other body")
    assert "Check signature failed" in (refusal(tampered) or "")


def test_send_needs_pub_on_the_topic() -> None:
    assert refusal(signed(RequestCode.SEND_MESSAGE, send_fields("orders"), PRODUCER)) is None
    denied = refusal(signed(RequestCode.SEND_MESSAGE, send_fields("audit"), PRODUCER))
    assert denied is not None and "topic:audit" in denied and "needs PUB" in denied and "has DENY" in denied
    default = refusal(signed(RequestCode.SEND_MESSAGE, send_fields("elsewhere"), PRODUCER))
    assert default is not None and "default permission" in default
    # SUB does not grant PUB
    assert refusal(signed(RequestCode.SEND_MESSAGE, send_fields("orders"), CONSUMER)) is not None


def test_send_v2_and_batch_are_checked_on_the_topic_the_processor_reads() -> None:
    short = {name: letter for letter, name in V2_NAMES.items()}
    v2 = {short[name]: value for name, value in send_fields("audit").items()}
    assert refusal(signed(RequestCode.SEND_MESSAGE_V2, v2, PRODUCER)) is not None
    # a SEND_MESSAGE carrying both spellings of the topic: checked on the one the processor goes on to use
    for sneaky in ({**v2, "topic": "orders"}, {"topic": "orders", **v2}):
        processed = SendHeader.parse(sneaky, False).topic
        assert required_permissions(signed(RequestCode.SEND_MESSAGE, sneaky, None)) == {processed: PUB}
    batch = {**send_fields("audit"), "batch": "true"}
    assert refusal(signed(RequestCode.SEND_BATCH_MESSAGE, batch, PRODUCER)) is not None


def test_send_to_a_retry_topic_needs_sub_on_the_group() -> None:
    assert required_permissions(signed(RequestCode.SEND_MESSAGE, send_fields("%RETRY%billing"), None)) == {
        "%RETRY%billing": 8}


def test_pull_needs_sub_on_topic_and_group() -> None:
    assert refusal(signed(RequestCode.PULL_MESSAGE, pull_fields("orders", "billing"), CONSUMER)) is None
    wrong_group = refusal(signed(RequestCode.PULL_MESSAGE, pull_fields("orders", "reporting"), CONSUMER))
    assert wrong_group is not None and "group:reporting" in wrong_group
    wrong_topic = refusal(signed(RequestCode.PULL_MESSAGE, pull_fields("audit", "billing"), CONSUMER))
    assert wrong_topic is not None and "topic:audit" in wrong_topic
    assert refusal(signed(RequestCode.PULL_MESSAGE, pull_fields("orders", "billing"), PRODUCER)) is not None


def test_resetting_a_groups_offsets_needs_sub_on_group_and_topic() -> None:
    fields = {"topic": "orders", "group": "billing", "timestamp": "0", "isForce": "true"}
    assert refusal(signed(RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, fields, CONSUMER)) is None
    other_group = refusal(signed(RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, {**fields, "group": "reporting"},
                                 CONSUMER))
    assert other_group is not None and "group:reporting" in other_group
    assert refusal(signed(RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, fields, PRODUCER)) is not None


def test_heartbeat_needs_sub_on_groups_and_subscriptions() -> None:
    good = heartbeat_body("billing", ["orders", "%RETRY%billing"])
    assert refusal(signed(RequestCode.HEART_BEAT, {}, CONSUMER, good)) is None
    bad = heartbeat_body("billing", ["orders", "audit"])
    assert "topic:audit" in (refusal(signed(RequestCode.HEART_BEAT, {}, CONSUMER, bad)) or "")
    producer_only = json.dumps({"clientID": "c1", "producerDataSet": [{"groupName": "p"}]}).encode()
    assert refusal(signed(RequestCode.HEART_BEAT, {}, PRODUCER, producer_only)) is None
    assert "not JSON" in (refusal(signed(RequestCode.HEART_BEAT, {}, CONSUMER, b"{nope")) or "")


def test_offsets_locks_and_unregister_need_the_group() -> None:
    offset = {"consumerGroup": "billing", "topic": "orders", "queueId": "0", "commitOffset": "5"}
    assert refusal(signed(RequestCode.UPDATE_CONSUMER_OFFSET, offset, CONSUMER)) is None
    assert refusal(signed(RequestCode.QUERY_CONSUMER_OFFSET, {**offset, "consumerGroup": "x"}, CONSUMER)) is not None
    lock = json.dumps({"consumerGroup": "billing", "clientId": "c",
                       "mqSet": [{"topic": "orders", "brokerName": "b", "queueId": 0}]}).encode()
    assert refusal(signed(RequestCode.LOCK_BATCH_MQ, {}, CONSUMER, lock)) is None
    assert refusal(signed(RequestCode.LOCK_BATCH_MQ, {}, PRODUCER, lock)) is not None
    assert refusal(signed(RequestCode.UNREGISTER_CLIENT, {"clientID": "c", "consumerGroup": "x"}, CONSUMER))
    # a producer unregistering names no consumer group: only its signature counts
    assert refusal(signed(RequestCode.UNREGISTER_CLIENT, {"clientID": "c", "producerGroup": "p"}, PRODUCER)) is None
    back = {"group": "billing", "originTopic": "orders", "offset": "0", "delayLevel": "0"}
    assert "needs PUB" in (refusal(signed(RequestCode.CONSUMER_SEND_MSG_BACK, back, CONSUMER)) or "")


def test_admin_codes_need_an_admin_account() -> None:
    create = {"topic": "new-topic", "readQueueNums": "1", "writeQueueNums": "1", "perm": "6"}
    denied = refusal(signed(RequestCode.UPDATE_AND_CREATE_TOPIC, create, PRODUCER))
    assert denied is not None and "Need admin permission" in denied
    assert refusal(signed(RequestCode.UPDATE_AND_CREATE_TOPIC, create, ADMIN)) is None
    for code in (RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, RequestCode.DELETE_SUBSCRIPTIONGROUP):
        assert "Need admin permission" in (refusal(signed(code, {"groupName": "billing"}, CONSUMER)) or "")
        assert refusal(signed(code, {"groupName": "billing"}, ADMIN)) is None
    # an admin without per-resource permissions touches anything
    assert refusal(signed(RequestCode.SEND_MESSAGE, send_fields("anything"), ADMIN)) is None
    # other codes need only a valid signature
    assert refusal(signed(RequestCode.GET_BROKER_RUNTIME_INFO, {}, PRODUCER)) is None


def test_whitelists_skip_signature_and_permissions() -> None:
    unsigned = make_request(RequestCode.SEND_MESSAGE, 1, send_fields("audit"))
    assert refusal(unsigned, "10.0.0.7", WHITELISTED) is None
    assert refusal(unsigned, "10.0.1.7", WHITELISTED) is not None
    # the consumer account's own whitelist (127.0.0.3): its access key, any signature, any resource
    forged = make_request(RequestCode.SEND_MESSAGE, 1, {**send_fields("audit"), "AccessKey": CONSUMER.access_key,
                                                         "Signature": "forged"})
    assert refusal(forged, "127.0.0.3") is None
    assert refusal(forged, "127.0.0.1") is not None
    # an account whitelist never lets in a request without that account's access key
    assert refusal(unsigned, "127.0.0.3") is not None


@pytest.mark.parametrize(("owned", "needed_pub", "needed_sub"), [
    ('"PUB|SUB"', True, True), ('"PUB"', True, False), ('"SUB"', False, True), ('"DENY"', False, False)])
def test_default_topic_permissions(owned: str, needed_pub: bool, needed_sub: bool) -> None:
    rules = AccessValidator(AclConfig.from_toml(f"""
[[accounts]]
accessKey = "account1"
secretKey = "secret01"
defaultTopicPerm = {owned}
defaultGroupPerm = "SUB"
"""))
    account = Credentials("account1", "secret01")
    send = refusal(signed(RequestCode.SEND_MESSAGE, send_fields("t1"), account), rules=rules)
    pull = refusal(signed(RequestCode.PULL_MESSAGE, pull_fields("t1", "g1"), account), rules=rules)
    assert (send is None) is needed_pub and (pull is None) is needed_sub


def test_consumer_running_info_needs_sub_on_the_group() -> None:
    fields = {"consumerGroup": "billing", "clientId": "c1", "jstackEnable": "false"}
    assert required_permissions(signed(RequestCode.GET_CONSUMER_RUNNING_INFO, fields, None)) == {"%RETRY%billing": 8}
    assert refusal(signed(RequestCode.GET_CONSUMER_RUNNING_INFO, fields, CONSUMER)) is None
    denied = refusal(signed(RequestCode.GET_CONSUMER_RUNNING_INFO, {**fields, "consumerGroup": "reporting"}, CONSUMER))
    assert denied is not None and "group:reporting" in denied


def test_admin_reads_of_a_group_or_topic_need_sub() -> None:
    group_only = {"consumerGroup": "billing"}
    assert required_permissions(signed(RequestCode.GET_CONSUMER_CONNECTION_LIST, group_only, None)) == {
        "%RETRY%billing": 8}
    assert required_permissions(signed(RequestCode.GET_CONSUME_STATS, group_only, None)) == {"%RETRY%billing": 8}
    assert required_permissions(signed(RequestCode.GET_CONSUME_STATS, {**group_only, "topic": "orders"}, None)) == {
        "%RETRY%billing": 8, "orders": 8}
    assert required_permissions(signed(RequestCode.GET_TOPIC_STATS_INFO, {"topic": "orders"}, None)) == {"orders": 8}
    assert refusal(signed(RequestCode.GET_TOPIC_STATS_INFO, {"topic": "orders"}, CONSUMER)) is None
    assert refusal(signed(RequestCode.GET_TOPIC_STATS_INFO, {"topic": "audit"}, CONSUMER)) is not None
