"""GET_CONSUMER_RUNNING_INFO on the broker: passed to the named consumer's connection, its answer passed
back, and a clear answer when the consumer is not there, does not answer in time or its connection fails."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import pytest

from broker.consumers import ConsumerCallProcessor, ConsumerManager
from broker.remoting.server import RequestContext
from protocol.codes import RequestCode, ResponseCode
from protocol.command import RemotingCommand, make_request
from protocol.connection import ConnectionClosedError, RequestTimeoutError


class FakeConnection:
    """A consumer's connection: answers the requests it is sent with ``answer`` (or raises ``error``)."""

    def __init__(self, answer: RemotingCommand | None = None, error: Exception | None = None) -> None:
        self.answer = answer
        self.error = error
        self.closed = False
        self.sent: list[tuple[int, dict[str, str], bytes, float]] = []

    connection_id = 1
    remote_address = "127.0.0.1:40000"
    remote_host = "127.0.0.1"
    remote_port = 40000

    @property
    def is_closed(self) -> bool:
        return self.closed

    async def send_request(self, code: int, ext_fields: Mapping[str, str] | None = None, body: bytes = b"", *,
                           timeout_seconds: float = 3.0, remark: str | None = None,
                           serialize_type: int = 0) -> RemotingCommand:
        self.sent.append((code, dict(ext_fields or {}), body, timeout_seconds))
        if self.error is not None:
            raise self.error
        assert self.answer is not None
        return self.answer

    async def send_oneway(self, *args: object, **kwargs: object) -> None:
        raise AssertionError("not used")

    def close(self) -> None:
        self.closed = True


FIELDS = {"consumerGroup": "billing", "clientId": "c1", "jstackEnable": "true", "AccessKey": "admin",
          "Signature": "c2lnbmVk"}


def ask(processor: ConsumerCallProcessor, fields: Mapping[str, str], connection: FakeConnection,
        code: int = RequestCode.GET_CONSUMER_RUNNING_INFO) -> RemotingCommand:
    request = make_request(code, 42, fields)
    response = asyncio.run(processor(RequestContext(request, connection)))
    assert response is not None and response.is_response and response.opaque == 42
    return response


def registered(connection: FakeConnection) -> ConsumerCallProcessor:
    consumers = ConsumerManager()
    consumers.register_consumer("billing", "c1", connection, {"orders": "*"}, "CLUSTERING")
    return ConsumerCallProcessor(consumers, timeout_seconds=0.5)


def test_the_consumers_answer_comes_back_and_only_the_header_fields_go_on() -> None:
    answer = RemotingCommand(code=ResponseCode.SUCCESS, opaque=7, flag=1, remark="fine", body=b'{"mqTable":{}}',
                             ext_fields={"extra": "1"})
    connection = FakeConnection(answer)
    response = ask(registered(connection), FIELDS, connection)
    assert (response.code, response.remark, response.body, dict(response.ext_fields)) == (
        ResponseCode.SUCCESS, "fine", b'{"mqTable":{}}', {"extra": "1"})
    # the admin's signature is not passed to the consumer; the broker's own wait bound is used
    assert connection.sent == [(RequestCode.GET_CONSUMER_RUNNING_INFO,
                                {"consumerGroup": "billing", "clientId": "c1", "jstackEnable": "true"}, b"", 0.5)]
    # the consumer's own error code is passed back too
    connection.answer = RemotingCommand(code=ResponseCode.SYSTEM_ERROR, opaque=8, flag=1,
                                        remark="The Consumer Group <billing> not exist in this consumer")
    response = ask(registered(connection), FIELDS, connection)
    assert response.code == ResponseCode.SYSTEM_ERROR and "not exist in this consumer" in (response.remark or "")


@pytest.mark.parametrize("fields, remark", [
    ({**FIELDS, "clientId": "c2"}, "The Consumer <billing> <c2> not online"),
    ({**FIELDS, "consumerGroup": "other"}, "The Consumer <other> <c1> not online"),
])
def test_a_consumer_not_connected_here_is_not_online(fields: Mapping[str, str], remark: str) -> None:
    connection = FakeConnection(error=AssertionError("must not be asked"))
    response = ask(registered(connection), fields, connection)
    assert (response.code, response.remark) == (ResponseCode.SYSTEM_ERROR, remark)
    assert connection.sent == []


def test_a_closed_connection_is_not_online() -> None:
    connection = FakeConnection(error=AssertionError("must not be asked"))
    processor = registered(connection)
    connection.closed = True
    response = ask(processor, FIELDS, connection)
    assert (response.code, response.remark) == (ResponseCode.SYSTEM_ERROR, "The Consumer <billing> <c1> not online")


def test_missing_header_fields_are_refused() -> None:
    connection = FakeConnection(error=AssertionError("must not be asked"))
    for missing in ("consumerGroup", "clientId"):
        fields = {key: value for key, value in FIELDS.items() if key != missing}
        response = ask(registered(connection), fields, connection)
        assert response.code != ResponseCode.SUCCESS and f"<{missing}> is null" in (response.remark or "")
    assert connection.sent == []
    response = ask(registered(connection), FIELDS, connection, code=RequestCode.HEART_BEAT)
    assert response.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED


def test_a_consumer_that_does_not_answer_in_time_or_fails() -> None:
    connection = FakeConnection(error=RequestTimeoutError("no response within 0.5 s"))
    response = ask(registered(connection), FIELDS, connection)
    assert response.code == ResponseCode.CONSUME_MSG_TIMEOUT
    assert response.remark == "consumer <billing> <c1> Timeout: no response within 0.5 s"
    connection = FakeConnection(error=ConnectionClosedError("connection to 127.0.0.1:40000 closed"))
    response = ask(registered(connection), FIELDS, connection)
    assert response.code == ResponseCode.SYSTEM_ERROR
    assert response.remark == "invoke consumer <billing> <c1> Exception: connection to 127.0.0.1:40000 closed"
