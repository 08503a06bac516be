"""A follower forwards what only the leader may serve (broker.forwarding), over real loopback sockets: two
remoting servers stand for a follower and the leader, with processors that record what they were given.

Every wait polls a condition with a deadline; nothing sleeps for a fixed time to let things happen.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import cast

import pytest

from broker.context import BrokerContext
from broker.forwarding import (
    MEMBER_LINK_CODES,
    MEMBER_LINK_HELLO,
    MEMBER_LINK_PROVE,
    Forwarder,
    ForwardLimits,
    LeaderOnly,
    MemberLinks,
    NotForwarded,
)
from broker.remoting import RequestContext
from broker.remoting.server import FORWARDED_FOR_FIELD, RemotingServer
from broker.requests import RequestError
from protocol.client import RemotingClient
from protocol.codes import RequestCode, ResponseCode
from protocol.command import ONEWAY_FLAG, RemotingCommand, make_response
from tests.broker.helpers import LOOPBACK, run
from tests.support.waiting import poll_until

SECRET = b"s" * 32


@dataclass
class FakeMember:
    is_leader: bool


@dataclass
class FakeNode:
    id: str


@dataclass
class FakeConfig:
    announced_address: str


@dataclass
class FakeBroker:
    """What the forwarder and LeaderOnly read of a BrokerContext."""

    node_id: str
    is_leader: bool
    leader: str | None = None
    address: str = ""
    member: FakeMember = field(init=False)
    node: FakeNode = field(init=False)
    config: FakeConfig = field(init=False)

    def __post_init__(self) -> None:
        self.member = FakeMember(self.is_leader)
        self.node = FakeNode(self.node_id)
        self.config = FakeConfig(self.address)

    def leader_address(self) -> str | None:
        return self.leader

    def not_leader(self) -> RequestError:
        return RequestError(ResponseCode.SERVICE_NOT_AVAILABLE, f"{self.node_id} is not the leader",
                            {"leaderAddress": self.leader} if self.leader else None)


class Recorder:
    """A leader's processor: answers with what it was given (the client address it sees, the fields)."""

    def __init__(self, gate: asyncio.Event | None = None) -> None:
        self.seen: list[RequestContext] = []
        self.gate = gate

    async def __call__(self, context: RequestContext) -> RemotingCommand:
        self.seen.append(context)
        if self.gate is not None:
            await self.gate.wait()
        return make_response(context.request, ResponseCode.SUCCESS, "served",
                             {"client": context.remote_address, "forwarded": context.forwarded_for})


@dataclass
class Group:
    follower: RemotingServer
    leader: RemotingServer
    follower_broker: FakeBroker
    leader_recorder: Recorder
    follower_recorder: Recorder
    forwarder: Forwarder
    leader_fast: FastSeen


class FastSeen:
    """The leader's own fast way in, as SendProcessor.fast is: records what it is offered, then declines (the
    Recorder answers it the queued way), or with ``answers`` answers it at once."""

    def __init__(self) -> None:
        self.seen: list[RequestContext] = []
        self.answers = False

    def __call__(self, context: RequestContext) -> RemotingCommand | None:
        self.seen.append(context)
        if not self.answers:
            return None
        return make_response(context.request, ResponseCode.SUCCESS, "fast",
                             {"client": context.remote_address, "forwarded": context.forwarded_for})


@pytest.fixture(params=[False, True], ids=["queued", "fast"])
def fast(request: pytest.FixtureRequest) -> bool:
    """Whether the servers have LeaderOnly's fast way in (broker.node registers it for sends); with it, the
    follower's link to the leader is made first, so that forwards go the fast way from the first one."""
    return bool(request.param)


@asynccontextmanager
async def group(*, leader_secret: bytes = SECRET, limits: ForwardLimits | None = None,
                gate: asyncio.Event | None = None, leader_known: bool = True,
                fast: bool = False) -> AsyncIterator[Group]:
    """A leader and a follower server, both with member links; the follower forwards SEND_MESSAGE."""
    leader_links, follower_links = MemberLinks(leader_secret), MemberLinks(SECRET)
    leader = RemotingServer(LOOPBACK, 0, is_member_link=leader_links.is_member_link)
    follower = RemotingServer(LOOPBACK, 0, is_member_link=follower_links.is_member_link)
    leader_recorder, follower_recorder = Recorder(gate), Recorder()
    await leader.start()
    await follower.start()
    leader_address = f"{LOOPBACK}:{leader.port}"
    follower_broker = FakeBroker("n1", False, leader_address if leader_known else None, f"{LOOPBACK}:{follower.port}")
    leader_broker = FakeBroker("n0", True, leader_address, leader_address)
    forwarder = Forwarder(cast(BrokerContext, follower_broker), SECRET, limits)
    leader_forwarder = Forwarder(cast(BrokerContext, leader_broker), leader_secret, limits)
    leader_fast = FastSeen()
    for server, links, recorder, broker, each in ((leader, leader_links, leader_recorder, leader_broker, leader_forwarder),
                                                  (follower, follower_links, follower_recorder, follower_broker, forwarder)):
        server.register(MEMBER_LINK_CODES, links, workers=2)
        server.add_close_listener(links.connection_closed)
        leader_only = LeaderOnly(recorder, cast(BrokerContext, broker), each)
        server.register(RequestCode.SEND_MESSAGE, leader_only, workers=8,
                        fast=leader_only.fast(leader_fast if server is leader else None) if fast else None)
    try:
        if fast and leader_known and leader_secret == SECRET:
            await forwarder._link(leader_address)
        yield Group(follower, leader, follower_broker, leader_recorder, follower_recorder, forwarder, leader_fast)
    finally:
        await forwarder.close()
        await follower.stop(grace_seconds=1.0)
        await leader.stop(grace_seconds=1.0)


async def client_of(server: RemotingServer) -> RemotingClient:
    return await RemotingClient.connect(LOOPBACK, server.port)


def test_a_follower_forwards_to_the_leader_and_relays_its_answer_under_the_clients_opaque(fast: bool) -> None:
    async def scenario() -> None:
        async with group(fast=fast) as members:
            client = await client_of(members.follower)
            try:
                fields = {"topic": "T", "b": "1"}
                answer = await client.request(RequestCode.SEND_MESSAGE, fields, b"body", remark="r")
                assert answer.code == ResponseCode.SUCCESS and answer.remark == "served"
                (seen,) = members.leader_recorder.seen
                assert not members.follower_recorder.seen  # the follower's processor never ran
                # the leader saw the request as the client sent it, and the client's own address
                assert dict(seen.request.ext_fields) == fields and seen.request.body == b"body"
                assert seen.request.remark == "r"
                local = client._connection._transport.get_extra_info("sockname")  # type: ignore[union-attr]
                assert seen.remote_address == f"{local[0]}:{local[1]}" == answer.ext_fields["client"]
                assert seen.forwarded_for == seen.remote_address
                # a second request goes over the same member link
                await client.request(RequestCode.SEND_MESSAGE, fields)
                links = {context.connection.connection_id for context in members.leader_recorder.seen}
                assert len(links) == 1
            finally:
                await client.close()

    run(scenario())


def test_a_clients_own_forwarded_for_marker_is_stripped_and_ignored(fast: bool) -> None:
    async def scenario() -> None:
        async with group(fast=fast) as members:
            client = await client_of(members.leader)
            try:
                answer = await client.request(RequestCode.SEND_MESSAGE, {FORWARDED_FOR_FIELD: "6.6.6.6:66", "x": "1"})
                assert answer.code == ResponseCode.SUCCESS
                (seen,) = members.leader_recorder.seen
                assert dict(seen.request.ext_fields) == {"x": "1"}
                assert seen.forwarded_for == "" and not seen.remote_address.startswith("6.6.6.6")
            finally:
                await client.close()

    run(scenario())


def test_a_forwarded_request_that_reaches_a_follower_is_not_forwarded_again(fast: bool) -> None:
    async def scenario() -> None:
        async with group(fast=fast) as members:
            # the follower believes the leader is itself elsewhere; a request already forwarded (from a
            # member link) that reaches it is answered by its own processor (which would say "not leader")
            link = await client_of(members.follower)
            try:
                await members.forwarder._handshake(link)
                answer = await link.request(RequestCode.SEND_MESSAGE, {FORWARDED_FOR_FIELD: "10.0.0.1:5"})
                assert answer.code == ResponseCode.SUCCESS
                (seen,) = members.follower_recorder.seen
                assert seen.forwarded_for == "10.0.0.1:5" and not members.leader_recorder.seen
            finally:
                await link.close()

    run(scenario())


def test_a_member_link_needs_the_groups_secret(fast: bool) -> None:
    async def scenario() -> None:
        async with group(fast=fast, leader_secret=b"x" * 32) as members:
            client = await client_of(members.follower)
            try:
                answer = await client.request(RequestCode.SEND_MESSAGE, {"a": "1"})
                # the follower cannot authenticate the link: the answer of a follower that cannot forward
                assert answer.code == ResponseCode.SERVICE_NOT_AVAILABLE
                assert "forwarding to it failed" in (answer.remark or "")
                assert answer.ext_fields["leaderAddress"] == f"{LOOPBACK}:{members.leader.port}"
                assert not members.leader_recorder.seen
            finally:
                await client.close()
            # and a proof that is not over the leader's nonce is refused
            raw = await client_of(members.leader)
            try:
                hello = await raw.request(MEMBER_LINK_HELLO, {"member": "n9", "nonce": "00" * 16})
                assert hello.code == ResponseCode.SUCCESS
                proved = await raw.request(MEMBER_LINK_PROVE, {"proof": "00" * 32})
                assert proved.code == ResponseCode.NO_PERMISSION
            finally:
                await raw.close()

    run(scenario())


def test_no_known_leader_or_an_unreachable_one_is_answered_as_before(fast: bool) -> None:
    """... once the hold for an election is over (kept short here)."""
    async def scenario() -> None:
        async with group(fast=fast, leader_known=False, limits=ForwardLimits(hold_seconds=0.1)) as members:
            client = await client_of(members.follower)
            try:
                answer = await client.request(RequestCode.SEND_MESSAGE, {})
                assert answer.code == ResponseCode.SERVICE_NOT_AVAILABLE
                assert "leaderAddress" not in answer.ext_fields
                members.follower_broker.leader = f"{LOOPBACK}:1"  # nothing listens there
                answer = await client.request(RequestCode.SEND_MESSAGE, {})
                assert answer.code == ResponseCode.SERVICE_NOT_AVAILABLE
                assert answer.ext_fields["leaderAddress"] == f"{LOOPBACK}:1"
            finally:
                await client.close()

    run(scenario())


def test_forwards_beyond_the_in_flight_limit_are_answered_busy(fast: bool) -> None:
    async def scenario() -> None:
        gate = asyncio.Event()
        async with group(fast=fast, limits=ForwardLimits(in_flight_max=2), gate=gate) as members:
            client = await client_of(members.follower)
            try:
                held = [asyncio.ensure_future(client.request(RequestCode.SEND_MESSAGE, {"n": str(n)}))
                        for n in range(2)]
                await poll_until(lambda: members.forwarder.in_flight == 2, "two forwards in flight",
                                 timeout_seconds=5.0)
                busy = await client.request(RequestCode.SEND_MESSAGE, {"n": "2"})
                assert busy.code == ResponseCode.SYSTEM_BUSY
                gate.set()
                assert [answer.code for answer in await asyncio.gather(*held)] == [ResponseCode.SUCCESS] * 2
            finally:
                await client.close()

    run(scenario())


def test_a_forward_that_gets_no_answer_in_time_is_answered_as_before(fast: bool) -> None:
    async def scenario() -> None:
        gate = asyncio.Event()
        async with group(fast=fast, limits=ForwardLimits(timeout_seconds=0.2), gate=gate) as members:
            client = await client_of(members.follower)
            try:
                answer = await client.request(RequestCode.SEND_MESSAGE, {})
                assert answer.code == ResponseCode.SERVICE_NOT_AVAILABLE
                assert "forwarding to it failed" in (answer.remark or "")
                gate.set()
                # one slow answer is that request's trouble: the link stays, the next forward uses it
                assert (await client.request(RequestCode.SEND_MESSAGE, {})).code == ResponseCode.SUCCESS
                assert len({context.connection.connection_id for context in members.leader_recorder.seen}) == 1
            finally:
                await client.close()

    run(scenario())


def test_a_oneway_request_is_forwarded_oneway(fast: bool) -> None:
    async def scenario() -> None:
        async with group(fast=fast) as members:
            client = await client_of(members.follower)
            try:
                await client.oneway(RequestCode.SEND_MESSAGE, {"o": "1"})
                await poll_until(lambda: len(members.leader_recorder.seen) == 1,
                                 "the oneway send at the leader", timeout_seconds=5.0)
                assert members.leader_recorder.seen[0].request.flag & ONEWAY_FLAG
            finally:
                await client.close()

    run(scenario())


def test_a_request_that_finds_no_leader_is_held_until_one_is_known_then_forwarded(fast: bool) -> None:
    """An election: the request is answered by the new leader, not refused (a stock client would retry it, or
    wait out its send timeout); the client's connection stays as it was."""
    async def scenario() -> None:
        async with group(fast=fast, leader_known=False, limits=ForwardLimits(hold_seconds=30.0)) as members:
            client = await client_of(members.follower)
            try:
                pending = asyncio.ensure_future(client.request(RequestCode.SEND_MESSAGE, {"n": "1"},
                                                               timeout_seconds=30.0))
                await poll_until(lambda: any(each.in_flight for each in members.follower.connections),
                                 "the request held by the follower", timeout_seconds=5.0)
                assert not pending.done()
                members.follower_broker.leader = f"{LOOPBACK}:{members.leader.port}"  # elected
                answer = await pending
                assert (answer.code, answer.remark) == (ResponseCode.SUCCESS, "served")
                assert [context.request.ext_fields["n"] for context in members.leader_recorder.seen] == ["1"]
                assert members.follower_recorder.seen == []
            finally:
                await client.close()

    run(scenario())


def test_a_held_request_is_served_by_its_follower_when_that_follower_is_elected(fast: bool) -> None:
    async def scenario() -> None:
        async with group(fast=fast, leader_known=False, limits=ForwardLimits(hold_seconds=30.0)) as members:
            client = await client_of(members.follower)
            try:
                pending = asyncio.ensure_future(client.request(RequestCode.SEND_MESSAGE, {"n": "2"},
                                                               timeout_seconds=30.0))
                await poll_until(lambda: any(each.in_flight for each in members.follower.connections),
                                 "the request held by the follower", timeout_seconds=5.0)
                members.follower_broker.member.is_leader = True
                answer = await pending
                assert (answer.code, answer.remark) == (ResponseCode.SUCCESS, "served")
                assert [context.request.ext_fields["n"] for context in members.follower_recorder.seen] == ["2"]
                assert members.leader_recorder.seen == []
            finally:
                await client.close()

    run(scenario())


def test_on_a_live_link_forwards_take_the_fast_way_at_both_ends(monkeypatch: pytest.MonkeyPatch) -> None:
    """Once the link is up, a follower forwards a client's request from the read callback (no queue, worker
    task or coroutine: Forwarder.try_forward is not called), and the leader offers the forwarded request to
    its own fast way, with the client it was forwarded for."""
    async def scenario() -> None:
        async with group(fast=True) as members:
            queued: list[RequestContext] = []
            try_forward = members.forwarder.try_forward

            async def counted(context: RequestContext) -> RemotingCommand | NotForwarded | None:
                queued.append(context)
                return await try_forward(context)

            monkeypatch.setattr(members.forwarder, "try_forward", counted)
            members.leader_fast.answers = True
            client = await client_of(members.follower)
            try:
                answers = await asyncio.gather(*(client.request(RequestCode.SEND_MESSAGE, {"n": str(n)}, b"b%d" % n)
                                                 for n in range(5)))
                assert [(answer.code, answer.remark) for answer in answers] == [(ResponseCode.SUCCESS, "fast")] * 5
                assert queued == []
                local = client._connection._transport.get_extra_info("sockname")  # type: ignore[union-attr]
                expected = f"{local[0]}:{local[1]}"
                assert [context.forwarded_for for context in members.leader_fast.seen] == [expected] * 5
                assert [context.request.ext_fields["n"] for context in members.leader_fast.seen] == \
                    [str(n) for n in range(5)]  # in the order the client sent them
                assert [answer.ext_fields["client"] for answer in answers] == [expected] * 5
                assert members.leader_recorder.seen == [] and members.follower_recorder.seen == []
                assert members.forwarder.in_flight == 0
            finally:
                await client.close()

    run(scenario())


def test_a_forward_whose_link_breaks_is_held_and_sent_again_on_a_new_one(fast: bool) -> None:
    """The leader's end of the member link goes away while a forward waits for its answer: the follower
    drops the link, makes a new one and sends the request again (a send carries its UNIQ_KEY: the leader
    deduplicates), and the client gets the answer, not an error."""
    async def scenario() -> None:
        gate = asyncio.Event()
        async with group(fast=fast, gate=gate, limits=ForwardLimits(hold_seconds=30.0)) as members:
            client = await client_of(members.follower)
            try:
                pending = asyncio.ensure_future(client.request(RequestCode.SEND_MESSAGE, {"n": "7"},
                                                               timeout_seconds=30.0))
                await poll_until(lambda: len(members.leader_recorder.seen) == 1, "the forward at the leader",
                                 timeout_seconds=5.0)
                for connection in members.leader.connections:  # only member links reach the leader here
                    connection.abort()
                await poll_until(lambda: len(members.leader_recorder.seen) == 2, "the forward sent again",
                                 timeout_seconds=10.0)
                gate.set()
                answer = await pending
                assert (answer.code, answer.remark) == (ResponseCode.SUCCESS, "served")
                links = {context.connection.connection_id for context in members.leader_recorder.seen}
                assert len(links) == 2 and members.follower_recorder.seen == []
            finally:
                await client.close()

    run(scenario())
