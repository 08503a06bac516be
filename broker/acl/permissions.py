"""RocketMQ's plain-ACL permissions (``org.apache.rocketmq.acl.common.Permission``), bit for bit.

A resource is a topic, or a consumer group written as its retry topic (``%RETRY%<group>``), as RocketMQ
keys both in one table. ``DENY`` wins over everything; ``ANY`` is satisfied by PUB or SUB.
"""

from __future__ import annotations

from typing import Final

from broker.replica_files import REPLICA_FILES_CODES
from protocol.codes import RequestCode
from protocol.topics import RETRY_PREFIX

DENY: Final = 1
ANY: Final = 1 << 1
PUB: Final = 1 << 2
SUB: Final = 1 << 3

#: the permission texts a configuration may use, and what they mean
PERMISSION_NAMES: Final = {"DENY": DENY, "PUB": PUB, "SUB": SUB, "PUB|SUB": PUB | SUB, "SUB|PUB": PUB | SUB}

#: request codes only an admin account may send (``Permission.ADMIN_CODE``, plus the ACL management codes)
ADMIN_CODES: Final = frozenset({
    RequestCode.UPDATE_AND_CREATE_TOPIC,
    RequestCode.UPDATE_BROKER_CONFIG,
    RequestCode.DELETE_TOPIC_IN_BROKER,
    RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
    RequestCode.DELETE_SUBSCRIPTIONGROUP,
    RequestCode.UPDATE_AND_CREATE_ACL_CONFIG,
    RequestCode.DELETE_ACL_CONFIG,
    RequestCode.UPDATE_GLOBAL_WHITE_ADDRS_CONFIG,
    RequestCode.GET_BROKER_CLUSTER_ACL_CONFIG,
    RequestCode.GET_BROKER_CLUSTER_ACL_INFO,
    *REPLICA_FILES_CODES,  # every replica's files, for audits
})


class AclConfigError(ValueError):
    """An ACL file or document that cannot be used; the message names the offending entry."""


def parse_permission(text: object, where: str) -> int:
    """``"PUB"``, ``"SUB"``, ``"PUB|SUB"`` (or ``"SUB|PUB"``), ``"DENY"``. RocketMQ reads anything else as
    DENY silently; a typo here is a configuration error instead."""
    if not isinstance(text, str) or text.strip() not in PERMISSION_NAMES:
        raise AclConfigError(f"{where}: permission must be one of {', '.join(PERMISSION_NAMES)}, got {text!r}")
    return PERMISSION_NAMES[text.strip()]


def permission_text(permission: int) -> str:
    if permission & DENY:
        return "DENY"
    names = [name for name, bit in (("PUB", PUB), ("SUB", SUB)) if permission & bit]
    if permission & ANY:
        names.append("ANY")
    return "|".join(names) or "NONE"


def check_permission(needed: int, owned: int) -> bool:
    """``Permission.checkPermission``: whether ``owned`` grants ``needed``."""
    if owned & DENY:
        return False
    if needed & ANY:
        return bool(owned & (PUB | SUB))
    return bool(needed & owned)


def group_resource(group: str) -> str:
    """The resource name of a consumer group (``PlainAccessResource.getRetryTopic``)."""
    return RETRY_PREFIX + group


def is_group_resource(resource: str) -> bool:
    return resource.startswith(RETRY_PREFIX)


def describe_resource(resource: str) -> str:
    """``topic:Orders`` or ``group:billing`` (``PlainAccessResource.printStr``)."""
    if is_group_resource(resource):
        return f"group:{resource[len(RETRY_PREFIX):]}"
    return f"topic:{resource}"
