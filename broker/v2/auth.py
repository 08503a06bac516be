"""The 5.x clients' ``authorization`` header against the broker's ACL accounts (``broker.acl``).

Every 5.x call carries ``x-mq-date-time`` and
``authorization: MQv2-HMAC-SHA1 Credential=<access key>, SignedHeaders=x-mq-date-time, Signature=<hex>``,
where the signature is ``hex(HMAC-SHA1(secret key, the x-mq-date-time value))`` (the SDKs send it even with
empty keys). The decision itself (whitelists, account, permissions) is the remoting protocol's:
``AccessValidator.check_signed``, with the same accounts and rules.

The signed date is not checked against the clock, as RocketMQ does not: the Python SDK writes its *local*
time with a literal ``Z``, so no skew bound would hold for every client.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from broker.acl.authorizer import AclRules
from broker.acl.permissions import PUB, SUB, group_resource
from broker.acl.validator import AccessDeniedError
from broker.v2.protocol.definition_pb2 import Code
from broker.v2.status import StatusError

AUTHORIZATION_SCHEME: Final = "MQv2-HMAC-SHA1"
HEADER_AUTHORIZATION: Final = "authorization"
HEADER_DATE_TIME: Final = "x-mq-date-time"
#: an authorization header longer than this is refused unread
AUTHORIZATION_CHARS_MAX: Final = 1024


@dataclass(frozen=True, slots=True)
class Credentials:
    """What one call's headers claim: the access key, the signed date and the signature (lower-case hex)."""

    access_key: str
    date_time: str
    signature: str

    def signed_by(self, secret_key: str) -> bool:
        expected = hmac.new(secret_key.encode("utf-8", "replace"), self.date_time.encode("utf-8", "replace"),
                            hashlib.sha1).hexdigest()
        return hmac.compare_digest(expected.encode("ascii"), self.signature.encode("ascii", "replace"))


def parse_credentials(metadata: Mapping[str, str]) -> Credentials | None:
    """The credentials of a call's headers; None when it carries no authorization header. UNAUTHORIZED
    (as a :class:`StatusError`) for a header that is not ``MQv2-HMAC-SHA1`` with the three fields."""
    header = metadata.get(HEADER_AUTHORIZATION)
    if header is None:
        return None
    if len(header) > AUTHORIZATION_CHARS_MAX:
        raise StatusError(Code.UNAUTHORIZED, "the authorization header is too long")
    scheme, _, rest = header.strip().partition(" ")
    if scheme != AUTHORIZATION_SCHEME:
        raise StatusError(Code.UNAUTHORIZED, f"authorization scheme must be {AUTHORIZATION_SCHEME}")
    fields: dict[str, str] = {}
    for part in rest.split(","):
        name, equals, value = part.strip().partition("=")
        if equals:
            fields[name.strip()] = value.strip()
    if "Credential" not in fields or "Signature" not in fields:
        raise StatusError(Code.UNAUTHORIZED, "the authorization header needs Credential and Signature")
    if fields.get("SignedHeaders", HEADER_DATE_TIME).lower() != HEADER_DATE_TIME:
        raise StatusError(Code.UNAUTHORIZED, f"only {HEADER_DATE_TIME} may be signed")
    access_key = fields["Credential"].split("/", 1)[0]  # some SDKs append a scope after a slash
    return Credentials(access_key, metadata.get(HEADER_DATE_TIME, ""), fields["Signature"].lower())


@dataclass(frozen=True, slots=True)
class Access:
    """What a call touches: topics it publishes or subscribes to, the consumer group it acts for."""

    publish_topics: tuple[str, ...] = ()
    subscribe_topics: tuple[str, ...] = ()
    group: str | None = None

    def needed(self) -> dict[str, int]:
        needed: dict[str, int] = {}
        for topic in self.publish_topics:
            needed[topic] = needed.get(topic, 0) | PUB
        for topic in self.subscribe_topics:
            needed[topic] = needed.get(topic, 0) | SUB
        if self.group:
            needed[group_resource(self.group)] = SUB
        return needed


class Authenticator:
    """Checks one call against the ACL rules in force (nothing when ACL is off)."""

    def __init__(self, rules: AclRules | None) -> None:
        self.rules = rules

    def check(self, metadata: Mapping[str, str], remote_host: str, access: Access, action: str) -> None:
        """Return when the call may proceed; :class:`StatusError` UNAUTHORIZED (bad or missing credentials)
        or FORBIDDEN (a permission it lacks) otherwise."""
        if self.rules is None:
            return
        try:
            validator = self.rules.current()
        except AccessDeniedError as denied:
            raise StatusError(Code.UNAUTHORIZED, str(denied)) from None
        if validator is None:
            return
        credentials = parse_credentials(metadata) or Credentials("", "", "")
        try:
            validator.check_signed(credentials.access_key, remote_host, credentials.signed_by, access.needed(), action)
        except AccessDeniedError as denied:
            remark = str(denied)
            code = Code.FORBIDDEN if remark.startswith("[ACL] No permission") else Code.UNAUTHORIZED
            raise StatusError(code, remark) from None
