"""Status codes of the 5.x protocol, and the error every RPC handler raises for an operating error.

Every answer carries a ``Status``; the gRPC call itself succeeds (as the RocketMQ proxy answers). Our own
operating errors (``broker.requests.RequestError``, raised by the 4.x processors we reuse) map onto the codes
the proxy gives the broker's response codes, made finer where the 4.x code says more (topic missing,
permission, bad message).
"""

from __future__ import annotations

from typing import Final

from broker.requests import RequestError
from broker.v2.protocol.definition_pb2 import Code, Status
from protocol.codes import ResponseCode

#: 4.x response code -> 5.x code; anything else is INTERNAL_SERVER_ERROR (the proxy's ResponseBuilder default)
CODE_BY_RESPONSE_CODE: Final[dict[int, Code]] = {
    ResponseCode.SUCCESS: Code.OK,
    ResponseCode.SYSTEM_BUSY: Code.TOO_MANY_REQUESTS,
    ResponseCode.REQUEST_CODE_NOT_SUPPORTED: Code.NOT_IMPLEMENTED,
    ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST: Code.CONSUMER_GROUP_NOT_FOUND,
    ResponseCode.TOPIC_NOT_EXIST: Code.TOPIC_NOT_FOUND,
    ResponseCode.NO_PERMISSION: Code.FORBIDDEN,
    ResponseCode.MESSAGE_ILLEGAL: Code.BAD_REQUEST,
}


class StatusError(Exception):
    """An operating error answered with ``code`` and ``message`` (nothing was stored)."""

    def __init__(self, code: Code, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    @classmethod
    def of(cls, error: RequestError) -> StatusError:
        return cls(CODE_BY_RESPONSE_CODE.get(error.code, Code.INTERNAL_SERVER_ERROR), error.remark or str(error.code))

    def status(self) -> Status:
        return Status(code=self.code, message=self.message)


def ok() -> Status:
    return Status(code=Code.OK, message="OK")
