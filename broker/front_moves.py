"""A leader hands its front connections back to the followers (a front that routes to followers).

With ``cluster up --front-route followers`` the group's front (cli.front) sends each new client connection to
a follower, which forwards what only the leader may serve (broker.forwarding, broker.relay). A SIGKILLed
leader then cuts no client's connection: the follower answers the request in flight (an error the client
retries, or the new leader's answer), where a stock client whose connection was cut waits out its send
timeout (3 s for the C++ client) before it tries again. But a follower's connections stay where they are
when it is elected, and its clients would wait out that timeout when it dies in turn.

So a leader closes the connections that reached it through such a front (``[broker] follower_front_hosts``:
the hosts the front connects from, each connection starting with a PROXY v2 header) once each is idle, right after the answer that leaves it idle
(:meth:`~broker.remoting.server.ServerConnection.close_when_idle`): the client gets its last answer and
the close together, and its next request goes through the front to a follower. It waits
:data:`MOVE_AFTER_SECONDS` after the election (the front stops sending new connections to a member within one
check of it failing ``/readyz?role=follower``), and moves nothing while it does not hear a majority (then
there may be no follower to go to, and the front sends clients to the leader). A moved client keeps its
registrations (consumer group membership, producer group) until it heartbeats again through its follower,
or they expire.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Final

from broker.remoting.server import Connection, ServerConnection

log = logging.getLogger(__name__)

#: how long after its election a leader starts moving front connections (the front's check interval and more)
MOVE_AFTER_SECONDS: Final = 1.0
#: how often a leader looks for front connections to move (the front sends it new ones only while no follower
#: passes its check)
SCAN_SECONDS: Final = 0.5


def front_host_set(hosts: Iterable[str]) -> frozenset[str]:
    """Hosts as the server writes peers' addresses (``ipaddress`` normal form); ValueError for a host that is
    not an IP address."""
    normal = set()
    for host in hosts:
        try:
            if not isinstance(host, str):
                raise ValueError(host)
            normal.add(str(ipaddress.ip_address(host.strip("[]"))))
        except ValueError:
            raise ValueError(f"follower_front_hosts: {host!r} is not an IP address") from None
    return frozenset(normal)


class FrontMover:
    """Moves a leader's front connections to the followers (see the module docstring)."""

    def __init__(self, connections: Callable[[], Sequence[ServerConnection]], enabled: bool,
                 is_member_link: Callable[[Connection], bool], leads: Callable[[], bool],
                 hears_majority: Callable[[], bool], keep_registrations: Callable[[Connection], None],
                 clock: Callable[[], float] | None = None) -> None:
        self._connections = connections
        self._enabled = enabled
        self._is_member_link = is_member_link
        self._leads = leads
        self._hears_majority = hears_majority
        self._keep_registrations = keep_registrations
        self._clock = clock
        self._leader_since: float | None = None
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        #: connections moved so far (closed, or marked to close when idle)
        self.moved = 0

    @property
    def enabled(self) -> bool:
        return self._enabled

    def start(self) -> None:
        if self.enabled and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="front-mover")

    def role_changed(self) -> None:
        self._wake.set()

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def _now(self) -> float:
        return self._clock() if self._clock is not None else asyncio.get_running_loop().time()

    def step(self) -> int:
        """One look: the number of connections moved by it."""
        if not self._enabled or not self._leads():
            self._leader_since = None
            return 0
        now = self._now()
        if self._leader_since is None:
            self._leader_since = now
        if now - self._leader_since < MOVE_AFTER_SECONDS or not self._hears_majority():
            return 0
        moved = 0
        for connection in self._connections():
            if connection.is_closed or connection.closing_when_idle or not connection.through_front:
                continue
            if self._is_member_link(connection):
                continue
            self._keep_registrations(connection)
            connection.close_when_idle()
            moved += 1
        if moved:
            self.moved += moved
            log.info("moving %d front connection(s) to the followers", moved)
        return moved

    async def _run(self) -> None:
        while True:
            self.step()
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(SCAN_SECONDS):
                    await self._wake.wait()


__all__ = ["MOVE_AFTER_SECONDS", "SCAN_SECONDS", "FrontMover", "front_host_set"]
