"""Which rules hold (replicated over local), the admission check (ACL, then request limits), and the
server hook: a refused request is answered at once and no processor ever sees it."""

from __future__ import annotations

import asyncio
import logging

import pytest

from broker.acl.admission import PROPERTIES_COUNT_MAX, Admission, properties_problem
from broker.acl.authorizer import AclAuthorizer, AclRules
from broker.acl.config import AclConfig
from broker.remoting import RequestContext
from broker.remoting.server import RemotingServer
from protocol.client import RemotingClient
from protocol.codes import RequestCode, ResponseCode
from protocol.command import RemotingCommand, make_request, make_response
from protocol.invariant import InvariantError
from protocol.signature import sign_fields
from tests.acl.helpers import ADMIN, BASE_ACL, PRODUCER, send_fields
from tests.broker import wire
from tests.broker.helpers import LOOPBACK, run

BASE = AclConfig.from_toml(BASE_ACL)
ONLY_ADMIN = AclConfig.from_toml(f'[[accounts]]\naccessKey = "{ADMIN.access_key}"\nsecretKey = "{ADMIN.secret_key}"\n'
                                 "admin = true\n")


class FakeConnection:
    remote_host = "127.0.0.1"
    remote_address = "127.0.0.1:4000"


def check(rules: AclRules, request: RemotingCommand) -> RemotingCommand | None:
    return AclAuthorizer(rules)(request, FakeConnection())  # type: ignore[arg-type]


def producer_send(topic: str = "orders") -> RemotingCommand:
    return make_request(RequestCode.SEND_MESSAGE, 3, sign_fields(send_fields(topic), b"x", PRODUCER.access_key,
                                                                 PRODUCER.secret_key), b"x")


def test_no_rules_means_acl_off() -> None:
    rules = AclRules(None, lambda: b"")
    assert not rules.enabled
    assert check(rules, make_request(RequestCode.SEND_MESSAGE, 1, send_fields("orders"))) is None


def test_local_rules_hold_until_replicated_ones_exist_then_replicated_ones_win() -> None:
    replicated = [b""]
    rules = AclRules(BASE, lambda: replicated[0])
    assert rules.enabled and check(rules, producer_send()) is None
    replicated[0] = ONLY_ADMIN.to_document()
    refusal = check(rules, producer_send())
    assert refusal is not None and refusal.code == ResponseCode.NO_PERMISSION
    assert "No acl config for orders-producer" in (refusal.remark or "")
    assert refusal.opaque == 3 and refusal.is_response
    # a node without its own file still enforces what the group replicated
    assert check(AclRules(None, lambda: replicated[0]), producer_send()) is not None


def test_unreadable_replicated_rules_keep_the_last_readable_ones_or_refuse_everything(
        caplog: pytest.LogCaptureFixture) -> None:
    replicated = [BASE.to_document()]
    rules = AclRules(None, lambda: replicated[0])
    assert check(rules, producer_send()) is None
    replicated[0] = b"not a document"
    with caplog.at_level(logging.ERROR):
        assert check(rules, producer_send()) is None
    assert "keeping the previous rules" in caplog.text
    fresh = AclRules(BASE, lambda: b"not a document")
    refusal = check(fresh, producer_send())
    assert refusal is not None and "cannot read the group's ACL" in (refusal.remark or "")


def test_properties_count_limit() -> None:
    many = {f"k{index}": "v" for index in range(PROPERTIES_COUNT_MAX + 1)}
    request = make_request(RequestCode.SEND_MESSAGE, 1, send_fields("orders", properties=many))
    assert "properties" in (properties_problem(request) or "")
    assert properties_problem(make_request(RequestCode.SEND_MESSAGE, 1, send_fields("orders", properties={"a": "b"})))\
        is None
    batch = wire.batch_body([(b"one", {"a": "b"}), (b"two", many)])
    batch_request = make_request(RequestCode.SEND_MESSAGE, 1, {**send_fields("orders"), "batch": "true"}, batch)
    assert "batch message 1" in (properties_problem(batch_request) or "")
    refusal = Admission(None)(batch_request, FakeConnection())  # type: ignore[arg-type]
    assert refusal is not None and refusal.code == ResponseCode.MESSAGE_ILLEGAL
    # a header the send processor would refuse is left to it (it names the field)
    assert properties_problem(make_request(RequestCode.SEND_MESSAGE, 1, {"topic": "t"})) is None
    assert properties_problem(make_request(RequestCode.PULL_MESSAGE, 1, {})) is None
    # the same limits with SEND_MESSAGE_V2's one-letter field names (i: properties, m: batch)
    exactly = {f"k{index}": "v" for index in range(PROPERTIES_COUNT_MAX)}
    for properties, refused in ((many, True), (exactly, False)):
        fields = send_fields("orders", properties=properties)
        v2 = {"b": fields["topic"], "a": fields["producerGroup"], "i": fields["properties"], "e": "0", "f": "0",
              "g": "0", "h": "0", "j": "0", "d": "4", "c": "TBW102"}
        assert (properties_problem(make_request(RequestCode.SEND_MESSAGE_V2, 1, v2)) is not None) is refused
    v2_batch = {"b": "orders", "a": "g", "i": "", "e": "0", "f": "0", "g": "0", "h": "0", "j": "0", "d": "4",
                "c": "TBW102", "m": "true"}
    assert "batch message 1" in (properties_problem(make_request(RequestCode.SEND_MESSAGE_V2, 1, v2_batch, batch))
                                 or "")


def test_admission_checks_acl_before_limits() -> None:
    many = {f"k{index}": "v" for index in range(PROPERTIES_COUNT_MAX + 1)}
    unsigned = make_request(RequestCode.SEND_MESSAGE, 1, send_fields("orders", properties=many))
    refusal = Admission(AclAuthorizer(AclRules(BASE, lambda: b"")))(unsigned, FakeConnection())  # type: ignore[arg-type]
    assert refusal is not None and refusal.code == ResponseCode.NO_PERMISSION


# ------------------------------------------------------------------------------------ the server hook


def test_refused_requests_never_reach_a_processor_and_oneway_ones_get_no_answer() -> None:
    seen: list[RemotingCommand] = []

    async def processor(context: RequestContext) -> RemotingCommand:
        seen.append(context.request)
        return make_response(context.request, ResponseCode.SUCCESS)

    async def scenario() -> None:
        authorizer = Admission(AclAuthorizer(AclRules(BASE, lambda: b"")))
        server = RemotingServer(LOOPBACK, 0, authorizer=authorizer)
        server.register(RequestCode.SEND_MESSAGE, processor)
        await server.start()
        try:
            async with await RemotingClient.connect(LOOPBACK, server.port) as client:
                refused = await client.request(RequestCode.SEND_MESSAGE, send_fields("orders"), b"x")
                assert refused.code == ResponseCode.NO_PERMISSION and "No accessKey" in (refused.remark or "")
                await client.oneway(RequestCode.SEND_MESSAGE, send_fields("orders"), b"x")
                good = producer_send()
                accepted = await client.request(good.code, good.ext_fields, good.body)
                assert accepted.code == ResponseCode.SUCCESS
                unknown = await client.request(4242, {})  # unknown codes are answered as before
                assert unknown.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
        finally:
            await server.stop(grace_seconds=1.0)

    run(scenario())
    assert [request.ext_fields.get("AccessKey") for request in seen] == [PRODUCER.access_key]


def test_a_failing_authorizer_refuses_the_request_and_a_broken_invariant_stops_the_server(
        caplog: pytest.LogCaptureFixture) -> None:
    async def processor(context: RequestContext) -> RemotingCommand:
        raise AssertionError("must not run")

    def failing(request: RemotingCommand, connection: object) -> RemotingCommand | None:
        raise ValueError("boom")

    def broken(request: RemotingCommand, connection: object) -> RemotingCommand | None:
        raise InvariantError("broken")

    async def scenario() -> None:
        server = RemotingServer(LOOPBACK, 0, authorizer=failing)
        server.register(RequestCode.SEND_MESSAGE, processor)
        await server.start()
        try:
            async with await RemotingClient.connect(LOOPBACK, server.port) as client:
                response = await client.request(RequestCode.SEND_MESSAGE, {})
                assert response.code == ResponseCode.SYSTEM_ERROR and "access check failed" in (response.remark or "")
        finally:
            await server.stop(grace_seconds=1.0)
        server = RemotingServer(LOOPBACK, 0, authorizer=broken)
        server.register(RequestCode.SEND_MESSAGE, processor)
        await server.start()
        async with await RemotingClient.connect(LOOPBACK, server.port) as client:
            response = await client.request(RequestCode.SEND_MESSAGE, {})
            assert response.code == ResponseCode.SYSTEM_ERROR
        with pytest.raises(InvariantError):
            await asyncio.wait_for(server.wait_stopped(), 10)

    with caplog.at_level(logging.CRITICAL):
        run(scenario())
