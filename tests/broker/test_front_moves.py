"""A leader hands its front connections to the followers (broker.front_moves): which connections it moves and
when, and how a connection closes when idle (the last answer and the close together, no request cut off)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest

from broker.front_moves import MOVE_AFTER_SECONDS, FrontMover, front_host_set
from broker.remoting import RequestContext
from broker.remoting.server import ServerConnection
from protocol.client import RemotingClient
from protocol.codes import ResponseCode
from protocol.command import RemotingCommand, make_response
from tests.broker.helpers import LOOPBACK, run, running_server
from tests.support.waiting import poll_until


@dataclass
class FakeConnection:
    remote_host: str
    connection_id: int
    through_front: bool = field(init=False)
    is_closed: bool = False
    closing_when_idle: bool = False

    def __post_init__(self) -> None:
        self.through_front = self.remote_host == "127.0.0.2"

    def close_when_idle(self) -> bool:
        self.closing_when_idle = True
        return True


@dataclass
class World:
    connections: list[FakeConnection]
    member_links: set[int] = field(default_factory=set)
    leads: bool = False
    majority: bool = True
    now: float = 100.0
    kept: list[int] = field(default_factory=list)

    def mover(self, enabled: bool = True) -> FrontMover:
        return FrontMover(lambda: self.connections,  # type: ignore[arg-type,return-value]
                          enabled, lambda connection: connection.connection_id in self.member_links,
                          lambda: self.leads, lambda: self.majority,
                          lambda connection: self.kept.append(connection.connection_id), clock=lambda: self.now)


def test_a_leader_moves_only_its_front_connections_once_the_front_has_seen_the_election() -> None:
    front, direct, link, gone = (FakeConnection("127.0.0.2", 1), FakeConnection("127.0.0.1", 2),
                                 FakeConnection("127.0.0.2", 3), FakeConnection("127.0.0.2", 4, is_closed=True))
    world = World([front, direct, link, gone], member_links={3})
    mover = world.mover()
    assert mover.step() == 0  # a follower moves nothing
    world.leads = True
    assert mover.step() == 0  # just elected: the front may still send new connections here
    world.now += MOVE_AFTER_SECONDS / 2
    assert mover.step() == 0
    world.majority = False
    world.now += MOVE_AFTER_SECONDS
    assert mover.step() == 0  # no majority: maybe no follower to go to
    world.majority = True
    assert mover.step() == 1
    assert (front.closing_when_idle, direct.closing_when_idle, link.closing_when_idle) == (True, False, False)
    assert world.kept == [1]  # its client stays registered until it heartbeats through its follower
    assert mover.step() == 0 and mover.moved == 1  # once
    # a new leadership starts the wait again
    world.leads = False
    assert mover.step() == 0
    world.leads = True
    late = FakeConnection("127.0.0.2", 5)
    world.connections.append(late)
    assert mover.step() == 0 and not late.closing_when_idle


def test_without_front_hosts_nothing_moves_and_bad_hosts_are_refused() -> None:
    world = World([FakeConnection("127.0.0.2", 1)], leads=True)
    mover = world.mover(enabled=False)
    assert not mover.enabled
    world.now += 10 * MOVE_AFTER_SECONDS
    mover.step()
    assert mover.step() == 0
    assert front_host_set(["::1", "[::1]", "10.0.0.1"]) == frozenset({"::1", "10.0.0.1"})
    with pytest.raises(ValueError, match=r"front\.example"):
        front_host_set(["front.example"])


def test_a_connection_closes_right_after_the_answer_that_leaves_it_idle() -> None:
    gate = asyncio.Event()

    async def slow(context: RequestContext) -> RemotingCommand:
        await gate.wait()
        return make_response(context.request, ResponseCode.SUCCESS, "done")

    async def scenario() -> None:
        async with running_server({10: slow}) as server:
            client = await RemotingClient.connect(LOOPBACK, server.port)
            try:
                pending = asyncio.ensure_future(client.request(10, timeout_seconds=10.0))
                await poll_until(lambda: any(each.in_flight for each in server.connections),
                                 "the request in progress", timeout_seconds=5.0)
                connection: ServerConnection = server.connections[0]
                assert connection.close_when_idle() is False  # busy: not now
                assert connection.closing_when_idle and not client.is_closed
                gate.set()
                answer = await pending  # the answer arrives, then the close
                assert (answer.code, answer.remark) == (ResponseCode.SUCCESS, "done")
                await asyncio.wait_for(client.wait_closed(), 5.0)
                # an idle connection closes at once
                other = await RemotingClient.connect(LOOPBACK, server.port)
                await poll_until(lambda: len(server.connections) == 1, "the second connection",
                                 timeout_seconds=5.0)
                assert server.connections[0].close_when_idle() is True
                await asyncio.wait_for(other.wait_closed(), 5.0)
            finally:
                await client.close()

    run(scenario())
