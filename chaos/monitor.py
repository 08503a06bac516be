"""Watches the group's roles during a chaos run and records each leader change.

Every ``period_seconds`` it asks each member for its runtime info (concurrently, each bounded: a paused
member just does not answer). The leader is the member that says LEADER with the highest term; a
deposed leader that has not noticed yet (a partitioned one) says LEADER with an older term and is not
taken. A :class:`~chaos.history.LeaderEvent` is recorded whenever (leader, term) changes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from chaos.connections import Connections
from chaos.history import Event, LeaderEvent

PERIOD_SECONDS: Final = 0.2
ANSWER_TIMEOUT_SECONDS: Final = 0.5


@dataclass(frozen=True, slots=True)
class MemberView:
    node_id: str
    role: str
    term: int
    applied_index: int
    commit_log_max_offset: int


class LeaderMonitor:
    def __init__(self, members: dict[str, str], record: Callable[[Event], None], now: Callable[[], float],
                 period_seconds: float = PERIOD_SECONDS) -> None:
        """``members``: node id -> broker address."""
        self.members = members
        self._record = record
        self._now = now
        self._period_seconds = period_seconds
        self._connections = Connections(connect_timeout_seconds=ANSWER_TIMEOUT_SECONDS)
        self.leader: str | None = None
        self.term = 0
        self.views: dict[str, MemberView | None] = dict.fromkeys(members)
        #: polls completed so far (a view is fresh when a poll that started later has completed)
        self.polls = 0
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="leader-monitor")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self._connections.close()

    async def _run(self) -> None:
        while True:
            await self.poll()
            await asyncio.sleep(self._period_seconds)

    async def poll(self) -> None:
        ids = list(self.members)
        answers = await asyncio.gather(*(self._connections.runtime_info(self.members[node_id], ANSWER_TIMEOUT_SECONDS)
                                         for node_id in ids))
        leader: str | None = None
        term = 0
        for node_id, table in zip(ids, answers, strict=True):
            view = None if table is None else MemberView(
                node_id, table.get("brokerRole", "?").lower(), _int(table.get("raftTerm")),
                _int(table.get("appliedIndex")), _int(table.get("commitLogMaxOffset")))
            self.views[node_id] = view
            if view is not None and view.role == "leader" and (leader is None or view.term > term):
                leader, term = node_id, view.term
        self.polls += 1
        if (leader, term if leader is not None else 0) != (self.leader, self.term):
            self.leader, self.term = leader, term if leader is not None else 0
            self._record(LeaderEvent(self._now(), self.leader, self.term))
            self._changed.set()
            self._changed = asyncio.Event()

    async def wait_leader(self, timeout_seconds: float) -> str | None:
        """The current leader, waiting up to ``timeout_seconds`` for one; None if none appeared."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_seconds
        while self.leader is None:
            remaining = deadline - loop.time()
            if remaining <= 0:
                return None
            try:
                await asyncio.wait_for(self._changed.wait(), remaining)
            except TimeoutError:
                return None
        return self.leader

    def converged(self) -> bool:
        """Every member answered in the last poll, one leads, and all hold the same commit log (offset
        commits keep the applied index moving, but not the commit log)."""
        views = list(self.views.values())
        if any(view is None for view in views) or self.leader is None:
            return False
        return len({view.commit_log_max_offset for view in views if view is not None}) == 1


def _int(text: str | None) -> int:
    try:
        return int(text) if text is not None else 0
    except ValueError:
        return 0
