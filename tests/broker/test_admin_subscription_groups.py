"""Subscription groups from admin tools: UPDATE_AND_CREATE_SUBSCRIPTIONGROUP and DELETE_SUBSCRIPTIONGROUP go
through Raft (both replicas apply them), read back through GET_ALL_SUBSCRIPTIONGROUP_CONFIG; bad configs
leave no trace; the pop FIFO flag and the retry max follow the group's configuration."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from broker.requests import RequestError
from broker.subscription_groups import check_consume_enabled, parse_group_config
from dledger.command import SubscriptionGroup
from protocol.codes import RequestCode, ResponseCode
from protocol.command import RemotingCommand, make_request
from tests.broker.test_admin_topics_groups import Admin, scenario

#: a body as mqadmin updateSubGroup sends it (fastjson writes every field of SubscriptionGroupConfig)
JAVA_BODY = {
    "groupName": "Billing", "consumeEnable": True, "consumeFromMinEnable": True, "consumeBroadcastEnable": True,
    "consumeMessageOrderly": True, "retryQueueNums": 1, "retryMaxTimes": 2, "brokerId": 0,
    "whichBrokerWhenConsumeSlowly": 1, "notifyConsumerIdsChangedEnable": True, "groupSysFlag": 0,
    "consumeTimeoutMinute": 15, "subscriptionDataSet": None, "attributes": {},
    "groupRetryPolicy": {"type": "CUSTOMIZED", "customizedRetryPolicy": {"next": [1000], "max": 16}},
}


async def update(admin: Admin, config: object) -> RemotingCommand:
    body = config if isinstance(config, bytes) else json.dumps(config).encode()
    return await admin.processor.handle(make_request(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, 1, {}, body))


async def table(admin: Admin) -> dict[str, dict[str, object]]:
    response = await admin.call(RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG)
    assert response.code == ResponseCode.SUCCESS
    result: dict[str, dict[str, object]] = json.loads(response.body)["subscriptionGroupTable"]
    return result


def test_a_group_is_created_changed_and_deleted_through_raft(tmp_path: Path) -> None:
    async def body(admin: Admin) -> None:
        response = await update(admin, JAVA_BODY)
        assert response.code == ResponseCode.SUCCESS, response.remark
        expected = SubscriptionGroup("Billing", retry_max_times=2, consume_orderly=True)
        assert admin.leader.state.groups["Billing"] == expected == admin.follower_state.groups["Billing"]
        listed = (await table(admin))["Billing"]
        assert listed["retryMaxTimes"] == 2 and listed["consumeMessageOrderly"] is True
        assert listed["retryQueueNums"] == 1 and listed["consumeTimeoutMinute"] == 15
        # a missing field takes Java's default, a missing retryMaxTimes the broker's
        assert (await update(admin, {"groupName": "Billing", "consumeEnable": False})).code == ResponseCode.SUCCESS
        assert admin.follower_state.groups["Billing"] == SubscriptionGroup("Billing", consume_enable=False)
        deleted = await admin.call(RequestCode.DELETE_SUBSCRIPTIONGROUP, groupName="Billing")
        assert deleted.code == ResponseCode.SUCCESS, deleted.remark
        assert "Billing" not in admin.leader.state.groups and "Billing" not in admin.follower_state.groups
        proposals = len(admin.leader.proposals)
        again = await admin.call(RequestCode.DELETE_SUBSCRIPTIONGROUP, groupName="Billing")
        assert again.code == ResponseCode.SUCCESS and len(admin.leader.proposals) == proposals
        refused = await admin.request(RequestCode.DELETE_SUBSCRIPTIONGROUP, groupName="Billing", cleanOffset="true")
        assert refused.code == ResponseCode.SYSTEM_ERROR and "cleanOffset" in (refused.remark or "")

    scenario(tmp_path, body)


def test_a_follower_refuses_a_group_change(tmp_path: Path) -> None:
    async def body(admin: Admin) -> None:
        admin.leader.is_leader = False
        with pytest.raises(RequestError):
            await update(admin, JAVA_BODY)
        assert not admin.leader.proposals

    scenario(tmp_path, body)


@pytest.mark.parametrize(("config", "why"), [
    (b"not json", "not JSON"),
    (b"[]", "not a JSON object"),
    ({"consumeEnable": True}, "groupName"),
    ({"groupName": "bad name!"}, "illegal characters"),
    ({"groupName": ""}, "blank"),
    ({"groupName": "g", "retryMaxTimes": -1}, "retryMaxTimes"),
    ({"groupName": "g", "retryMaxTimes": "3"}, "retryMaxTimes"),
    ({"groupName": "g", "consumeMessageOrderly": "true"}, "consumeMessageOrderly"),
    ({"groupName": "g", "brokerId": -2}, "brokerId"),
    ({"groupName": "g", "attributes": []}, "attributes"),
    (b"{" + b" " * 70_000 + b"}", "exceeds"),
])
def test_a_bad_config_is_refused_and_leaves_no_trace(tmp_path: Path, config: object, why: str) -> None:
    async def body(admin: Admin) -> None:
        body = config if isinstance(config, bytes) else json.dumps(config).encode()
        context = type("Context", (), {"request": make_request(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, 1, {},
                                                               body)})()
        response = await admin.processor(context)
        assert response is not None and response.code == ResponseCode.SYSTEM_ERROR
        assert why in (response.remark or "")
        assert not admin.leader.proposals and not admin.leader.state.groups

    scenario(tmp_path, body)


def test_parse_keeps_what_raftmq_acts_on() -> None:
    parsed = parse_group_config(json.dumps(JAVA_BODY | {"consumeBroadcastEnable": False, "brokerId": 1}).encode(), 5)
    assert parsed == SubscriptionGroup("Billing", True, False, 2, 1, consume_orderly=True)
    assert parse_group_config(b'{"groupName": "g"}', 5).retry_max_times == 5


def test_a_group_with_consume_disabled_is_refused() -> None:
    groups = {"Off": SubscriptionGroup("Off", consume_enable=False), "On": SubscriptionGroup("On")}
    check_consume_enabled(groups, "On")
    check_consume_enabled(groups, "Unconfigured")
    with pytest.raises(RequestError) as refused:
        check_consume_enabled(groups, "Off")
    assert refused.value.code == ResponseCode.NO_PERMISSION
