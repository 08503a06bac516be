"""Subscription groups as admin tools see them: RocketMQ's SubscriptionGroupConfig JSON, read from the body of
UPDATE_AND_CREATE_SUBSCRIPTIONGROUP and written into GET_ALL_SUBSCRIPTIONGROUP_CONFIG's table. Pure functions:
no broker, no socket.

The replicated :class:`~dledger.command.SubscriptionGroup` keeps consumeEnable (pulls and receives of a
disabled group are refused, :func:`check_consume_enabled`), consumeMessageOrderly (pop delivers each queue in
order, 5.x FIFO groups), retryMaxTimes (deliveries before the dead-letter queue, both protocols; a 4.x
send-back that names its own maxReconsumeTimes keeps it, as with Java's broker), consumeBroadcastEnable and
brokerId (kept and reported; broadcast consumers are not refused, and every member serves reads). The other
fields of Java's config (retryQueueNums, whichBrokerWhenConsumeSlowly, notifyConsumerIdsChangedEnable,
groupSysFlag, consumeTimeoutMinute, consumeFromMinEnable, attributes, groupRetryPolicy, subscriptionDataSet) are
checked for their type when present, not stored, and reported with Java's defaults: raftmq has one retry queue
per group, one broker per group, and no consume timeout on the broker side.

As Java's broker, a field missing from the body takes Java's default (fastjson fills a new
SubscriptionGroupConfig): an update sends the whole configuration (``mqadmin updateSubGroup`` and
:meth:`client.admin.Admin.update_group` read it first and change only what they are given).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Final

from broker.requests import INT32_MAX, RequestError
from dledger.command import SubscriptionGroup
from protocol.codes import ResponseCode
from protocol.topics import TOPIC_PATTERN

#: RocketMQ's Validators.CHARACTER_MAX_LENGTH, for group names
GROUP_NAME_MAX_CHARS: Final = 255
#: the body of one UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, at most (Java's config is well under 1 KiB)
GROUP_CONFIG_MAX_BYTES: Final = 64 * 1024
#: retryMaxTimes at most (a 5.x client's max attempts, retryMaxTimes + 1, is an int32)
RETRY_MAX_TIMES_MAX: Final = INT32_MAX - 1
#: Java's defaults of the fields raftmq does not store, as GET_ALL_SUBSCRIPTIONGROUP_CONFIG reports them
UNSTORED_DEFAULTS: Final[Mapping[str, object]] = {
    "consumeFromMinEnable": True, "retryQueueNums": 1, "whichBrokerWhenConsumeSlowly": 1,
    "notifyConsumerIdsChangedEnable": True, "groupSysFlag": 0, "consumeTimeoutMinute": 15,
    "subscriptionDataSet": None, "attributes": {},
}
_BOOLEAN_FIELDS: Final = ("consumeEnable", "consumeBroadcastEnable", "consumeMessageOrderly", "consumeFromMinEnable",
                          "notifyConsumerIdsChangedEnable")
_INTEGER_FIELDS: Final = ("retryQueueNums", "retryMaxTimes", "brokerId", "whichBrokerWhenConsumeSlowly",
                          "groupSysFlag", "consumeTimeoutMinute")


def check_group_name(group: str) -> str | None:
    """Why ``group`` is not a valid consumer group name (RocketMQ's Validators.checkGroup), or None."""
    if not group or not group.strip():
        return "the specified group is blank"
    if len(group) > GROUP_NAME_MAX_CHARS:
        return f"the specified group is longer than group max length {GROUP_NAME_MAX_CHARS}"
    if not TOPIC_PATTERN.match(group):
        return f"the specified group[{group}] contains illegal characters, allowing only ^[%|a-zA-Z0-9_-]+$"
    return None


def _refuse(remark: str) -> RequestError:
    return RequestError(ResponseCode.SYSTEM_ERROR, remark)


def parse_group_config(body: bytes, default_retry_max_times: int = 16) -> SubscriptionGroup:
    """The replicated group of an UPDATE_AND_CREATE_SUBSCRIPTIONGROUP body, or :class:`RequestError`
    (SYSTEM_ERROR, as Java answers a bad config) naming what is wrong. Missing fields take Java's defaults,
    a missing retryMaxTimes the broker's (``max_reconsume_times``, what an unconfigured group gets)."""
    if len(body) > GROUP_CONFIG_MAX_BYTES:
        raise _refuse(f"subscription group config of {len(body)} bytes exceeds {GROUP_CONFIG_MAX_BYTES}")
    try:
        config = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise _refuse(f"subscription group config is not JSON: {exc}") from None
    if not isinstance(config, dict):
        raise _refuse("subscription group config is not a JSON object")
    name = config.get("groupName")
    if not isinstance(name, str):
        raise _refuse("subscription group config has no groupName")
    problem = check_group_name(name)
    if problem is not None:
        raise _refuse(problem)
    for key in _BOOLEAN_FIELDS:
        if key in config and not isinstance(config[key], bool):
            raise _refuse(f"{key} must be true or false, got {config[key]!r}")
    for key in _INTEGER_FIELDS:
        value = config.get(key, 0)
        if isinstance(value, bool) or not isinstance(value, int) or not -2**63 <= value < 2**63:
            raise _refuse(f"{key} must be an integer, got {value!r}")
    if "attributes" in config and not isinstance(config["attributes"], (dict, type(None))):
        raise _refuse(f"attributes must be an object, got {config['attributes']!r}")
    retry_max = config.get("retryMaxTimes", default_retry_max_times)
    if not 0 <= retry_max <= RETRY_MAX_TIMES_MAX:
        raise _refuse(f"retryMaxTimes must be within [0, {RETRY_MAX_TIMES_MAX}], got {retry_max}")
    broker_id = config.get("brokerId", 0)
    if broker_id < 0:
        raise _refuse(f"brokerId must not be negative, got {broker_id}")
    return SubscriptionGroup(
        name,
        consume_enable=config.get("consumeEnable", True),
        consume_broadcast_enable=config.get("consumeBroadcastEnable", True),
        retry_max_times=retry_max,
        broker_id=broker_id,
        consume_orderly=config.get("consumeMessageOrderly", False),
    )


def group_config_json(name: str, group: SubscriptionGroup | None, default_retry_max_times: int) -> dict[str, object]:
    """Java's SubscriptionGroupConfig of ``name``: the configured ``group``, or Java's defaults for a group
    that is not configured (then retryMaxTimes is the broker's ``max_reconsume_times``, what it applies)."""
    return {
        "groupName": name,
        "consumeEnable": group.consume_enable if group else True,
        "consumeBroadcastEnable": group.consume_broadcast_enable if group else True,
        "consumeMessageOrderly": group.consume_orderly if group else False,
        "retryMaxTimes": group.retry_max_times if group else default_retry_max_times,
        "brokerId": group.broker_id if group else 0,
        **UNSTORED_DEFAULTS,
    }


def check_consume_enabled(groups: Mapping[str, SubscriptionGroup], group: str) -> None:
    """:class:`RequestError` NO_PERMISSION when ``group`` is configured with consumeEnable false (Java's pull
    and pop processors refuse such a group; a 5.x client gets FORBIDDEN)."""
    configured = groups.get(group)
    if configured is not None and not configured.consume_enable:
        raise RequestError(ResponseCode.NO_PERMISSION, f"subscription group no permission, {group}")
