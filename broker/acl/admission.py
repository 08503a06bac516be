"""What the remoting server asks before it queues a request: access control first, then the request
limits no processor checks before doing work (a named limit on everything a client can make grow).

- ``PROPERTIES_COUNT_MAX``: properties of one message (the SEND header's ``properties``, or each record
  of a batch). Their length is bounded already (32767 bytes: the stored ``propertiesLength`` is an
  int16, checked by the send processor); the count bounds the work and the dict each parse builds.

A refusal is answered before a processor sees the request, so nothing is stored: NO_PERMISSION (16) from
ACL, MESSAGE_ILLEGAL (13) for a request over a limit.
"""

from __future__ import annotations

from typing import Final

from broker.acl.authorizer import AclAuthorizer
from broker.remoting.server import Connection
from broker.requests import RequestError, SendHeader
from protocol.batch import BatchError, decode_batch
from protocol.codes import RequestCode, ResponseCode
from protocol.command import RemotingCommand, make_response

PROPERTIES_COUNT_MAX: Final = 512
_SEND_CODES: Final = frozenset({RequestCode.SEND_MESSAGE, RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE})


def _count(properties: str) -> int:
    return sum(1 for pair in properties.split("\x02") if pair)


def properties_problem(request: RemotingCommand, count_max: int = PROPERTIES_COUNT_MAX) -> str | None:
    """Why a send carries too many properties, or None. A header or batch the send processor would refuse
    anyway is left to it (it answers with the precise reason)."""
    if request.code not in _SEND_CODES:
        return None
    if request.code != RequestCode.SEND_BATCH_MESSAGE:
        # the common case without parsing the header (the send processor does that): pairs end with \x02,
        # so a properties string with few of them cannot hold too many pairs
        v2 = request.code == RequestCode.SEND_MESSAGE_V2
        fields = request.ext_fields
        batch = fields.get("m" if v2 else "batch")
        raw = fields.get("i" if v2 else "properties")
        if (batch is None or batch.lower() != "true") and (raw is None or raw.count("\x02") < count_max):
            return None
    try:
        header = SendHeader.parse(request.ext_fields, request.code == RequestCode.SEND_MESSAGE_V2)
    except RequestError:
        return None
    count = _count(header.properties)
    if count > count_max:
        return f"the message has {count} properties; at most {count_max} are allowed"
    # a record's properties end with \x02 each, so this bounds every record's count at once
    if (header.batch or request.code == RequestCode.SEND_BATCH_MESSAGE) and request.body.count(b"\x02") > count_max:
        try:
            items = decode_batch(request.body)
        except BatchError:
            return None
        for position, item in enumerate(items):
            if len(item.properties) > count_max:
                return f"batch message {position} has {len(item.properties)} properties; at most {count_max} are allowed"
    return None


class Admission:
    """The server's pre-dispatch check (``RemotingServer(authorizer=...)``): ACL (when configured), then
    the request limits. Returns the refusal to answer with, or None to queue the request."""

    def __init__(self, authorizer: AclAuthorizer | None = None, properties_count_max: int = PROPERTIES_COUNT_MAX) -> None:
        self.authorizer = authorizer
        self.properties_count_max = properties_count_max

    def __call__(self, request: RemotingCommand, connection: Connection) -> RemotingCommand | None:
        if self.authorizer is not None:
            refusal = self.authorizer(request, connection)
            if refusal is not None:
                return refusal
        problem = properties_problem(request, self.properties_count_max)
        if problem is not None:
            return make_response(request, ResponseCode.MESSAGE_ILLEGAL, problem)
        return None
