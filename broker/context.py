"""What every processor shares: the group member (writes go through Raft), the store (reads of committed
data), the replicated state, the broker's configuration, the group's time, and the mapping of errors to
response codes.

Time: every time a processor or a leader-only service uses (due times, delivery and check-back ages,
retention's cutoff, leader stamps) is the group's time (``dledger.group_clock``: what a majority of the
members' clocks say, never below what the replicated state holds), not this member's clock: a leader whose
clock jumped hours ahead must not release timers or delete segments hours early.

Everything here runs on the broker's event loop. Proposals block until applied, so they run on the
loop's executor; appends return a concurrent future that the loop awaits.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
import threading
import time
from collections.abc import Callable, Sequence

from broker.config import BrokerConfig
from broker.requests import RequestError
from commitlog.message import MessageInput
from commitlog.outcomes import AppendResult
from commitlog.store import MessageStore
from dledger.apply import ApplyResult
from dledger.command import Command, LeaderStamp, TopicConfig
from dledger.config import NodeConfig
from dledger.future import AppendFuture
from dledger.group_commit import (
    AppendError,
    BusyError,
    EntryTooLargeError,
    InvalidMessageError,
    NotLeaderError,
    OutcomeUnknownError,
)
from dledger.member import GroupMember
from dledger.stages import StageHistograms
from dledger.state import ReplicatedState
from protocol.codes import ResponseCode
from protocol.route_data import PERM_READ, PERM_WRITE
from protocol.topics import INTERNAL_TOPIC_QUEUES, SYSTEM_TOPICS, TOPIC_NAME_MAX_CHARS, check_topic_name

log = logging.getLogger(__name__)


class BrokerContext:
    def __init__(self, node: NodeConfig, config: BrokerConfig, member: GroupMember,
                 rng: random.Random | None = None, wall_clock_ms: Callable[[], int] | None = None,
                 corroborated_clock_ms: Callable[[], int | None] | None = None) -> None:
        """``wall_clock_ms`` is the group's time (the member's group clock unless given);
        ``corroborated_clock_ms`` the time for destructive decisions, None while a majority's clocks are
        not heard (the member's group clock, or ``wall_clock_ms`` when only that is given)."""
        self.node = node
        self.config = config
        self.member = member
        self.random = rng if rng is not None else random.Random()
        self.wall_clock_ms: Callable[[], int] = wall_clock_ms or self._group_time_ms
        self.corroborated_clock_ms: Callable[[], int | None] = (
            corroborated_clock_ms or wall_clock_ms or self._corroborated_group_time_ms)
        #: Raft address -> the address clients reach each member at (its advertised address: this member's
        #: from its own config, the others' from ``peer_addresses``), to name the leader to clients
        self.client_address_by_raft = {node.raft_address: config.announced_address}
        for peer in node.peers:
            if peer.id in config.peer_addresses:
                self.client_address_by_raft[peer.raft_address] = config.peer_addresses[peer.id]
        self._topic_creations: dict[str, asyncio.Future[TopicConfig]] = {}
        self._completions = _Completions(member.stages)
        #: barriers asked for, the asks the last applied barrier covered, and the last failed barrier (the
        #: asks it covered, its error): see :meth:`barrier`
        self._barrier_requests = 0
        self._barrier_covered = 0
        self._barrier_failed: tuple[int, RequestError] | None = None
        self._barrier_lock = asyncio.Lock()
        #: called after a topic is created or changed here (re-register with the name servers)
        self.on_topics_changed: Callable[[], None] = lambda: None

    @property
    def store(self) -> MessageStore:
        return self.member.store

    def _group_time_ms(self) -> int:
        return self.member.group_clock.now_ms()

    def _corroborated_group_time_ms(self) -> int | None:
        return self.member.group_clock.corroborated_ms()

    @property
    def state(self) -> ReplicatedState:
        return self.member.state

    # ------------------------------------------------------------------ leadership

    def leader_address(self) -> str | None:
        raft_leader = self.node.raft_address if self.member.is_leader else self.member.leader_name()
        return None if raft_leader is None else self.client_address_by_raft.get(raft_leader)

    def not_leader(self, leader: str | None = None) -> RequestError:
        address = self.client_address_by_raft.get(leader) if leader else self.leader_address()
        remark = f"broker {self.config.announced_address} is not the leader of {self.config.broker_name}"
        if address:
            remark += f"; the leader is {address}"
        return RequestError(ResponseCode.SERVICE_NOT_AVAILABLE, remark,
                            {"leaderAddress": address} if address else None)

    def require_leader(self) -> None:
        if not self.member.is_leader:
            raise self.not_leader()

    async def barrier(self) -> None:
        """Return once this leader has applied a command of its own proposed after the call began: it has
        then applied everything any member had applied before the call. A leader's store can be behind
        what a consumer already read elsewhere: a new leader may still be applying its predecessor's last
        entries, and a follower may apply an entry before the leader does. Calls that overlap share one
        proposal (at most one in flight): the next proposal covers every call made until it starts, and
        its failure fails them all. Raises :class:`RequestError` when this member is not the leader or the
        outcome is unknown."""
        self._barrier_requests += 1
        wanted = self._barrier_requests
        async with self._barrier_lock:
            if self._barrier_covered >= wanted:
                return  # a barrier proposed after this call applied meanwhile
            if self._barrier_failed is not None and self._barrier_failed[0] >= wanted:
                error = self._barrier_failed[1]
                raise RequestError(error.code, error.remark, error.ext_fields)
            covering = self._barrier_requests
            term = self.member.status().term
            try:
                await self.propose(Command((LeaderStamp(term, self.node.id, self.wall_clock_ms()),)))
            except RequestError as error:
                self._barrier_failed = (covering, error)
                raise
            self._barrier_covered = covering

    # ------------------------------------------------------------------ writes

    async def append(self, messages: Sequence[MessageInput]) -> tuple[AppendResult, ...]:
        """Replicate one send (or one atomic batch) and return the leader's apply results."""
        return await self.appended(self.append_started(messages))

    def append_started(self, messages: Sequence[MessageInput]) -> asyncio.Future[tuple[AppendResult, ...]]:
        """Hand ``messages`` to the group committer now; the future is for :meth:`appended`. Raises
        :class:`RequestError` at once when nothing was proposed."""
        waiter, completed = self._completions.expect()
        self._submit(messages, completed)
        return waiter

    async def appended(self, waiter: asyncio.Future[tuple[AppendResult, ...]]) -> tuple[AppendResult, ...]:
        """The results of an append :meth:`append_started` began."""
        try:
            return await waiter
        except AppendError as exc:
            raise self.append_failed(exc) from None

    def append_then(self, messages: Sequence[MessageInput], then: AppendDone) -> None:
        """:meth:`append` without a coroutine: ``then(results, None)`` or ``then(None, error)`` is called on
        the loop once the append is done. Raises :class:`RequestError` at once when nothing was proposed."""
        self._submit(messages, self._completions.expect_call(then))

    def _submit(self, messages: Sequence[MessageInput],
                completed: Callable[[AppendFuture[tuple[AppendResult, ...]]], None]) -> None:
        try:
            self.member.append(messages, completed)  # the callback comes with the send: no lock to add it
        except AppendError as exc:
            raise self.append_failed(exc) from None

    def append_failed(self, exc: AppendError) -> RequestError:
        """The answer to an append that failed with ``exc``."""
        if isinstance(exc, NotLeaderError):
            return self.not_leader(exc.leader)
        if isinstance(exc, BusyError):
            return RequestError(ResponseCode.SYSTEM_BUSY, f"[PCBUSY_CLEAN_QUEUE] broker busy: {exc}")
        if isinstance(exc, EntryTooLargeError | InvalidMessageError):
            return RequestError(ResponseCode.MESSAGE_ILLEGAL, str(exc))
        # May or may not be stored: the client's retry carries the same UNIQ_KEY and is deduplicated.
        return RequestError(ResponseCode.SYSTEM_ERROR, f"send outcome unknown, retry: {exc}")

    async def propose(self, command: Command) -> ApplyResult:
        """Replicate a command other than plain sends and wait until it applied here."""
        self.require_leader()
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(None, self.member.propose, command)
        except NotLeaderError as exc:
            raise self.not_leader(exc.leader) from None
        except OutcomeUnknownError as exc:
            raise RequestError(ResponseCode.SYSTEM_ERROR, f"outcome unknown, retry: {exc}") from None

    # ------------------------------------------------------------------ topics

    def topic_config(self, topic: str) -> TopicConfig | None:
        config = self.state.topics.get(topic)
        if config is None and topic in INTERNAL_TOPIC_QUEUES:
            # the broker's own topics exist on every broker (readable by tools, never sent to by clients)
            queues = INTERNAL_TOPIC_QUEUES[topic] or len(self.config.delay_levels_seconds)
            return TopicConfig(topic, queues, queues, PERM_READ)
        return config

    async def put_topic(self, config: TopicConfig) -> TopicConfig:
        await self.propose(Command((config,)))
        self.on_topics_changed()
        return config

    async def ensure_topic(self, topic: str, queue_nums: int, perm: int = PERM_READ | PERM_WRITE) -> TopicConfig:
        """The topic's configuration, creating it (through Raft) when it does not exist yet. Concurrent
        first sends to one topic share a single creation."""
        existing = self.topic_config(topic)
        if existing is not None:
            return existing
        pending = self._topic_creations.get(topic)
        if pending is not None:
            return await asyncio.shield(pending)
        loop = asyncio.get_running_loop()
        pending = loop.create_future()
        self._topic_creations[topic] = pending
        try:
            config = await self.put_topic(TopicConfig(topic, queue_nums, queue_nums, perm))
            pending.set_result(config)
            return config
        except BaseException as exc:
            pending.set_exception(exc)
            pending.exception()  # retrieved: concurrent waiters get it, nobody else must
            raise
        finally:
            del self._topic_creations[topic]

    async def topic_for_send(self, topic: str, default_queue_nums: int) -> TopicConfig:
        config = self.state.topics.get(topic)
        if config is None or topic in SYSTEM_TOPICS:  # (a topic of the group had its name checked on creation)
            problem = check_topic_name(topic)
            if problem is not None:
                raise RequestError(ResponseCode.SYSTEM_ERROR, problem)
            if topic in SYSTEM_TOPICS:
                raise RequestError(ResponseCode.NO_PERMISSION, f"sending message to system topic {topic} is forbidden")
            config = self.topic_config(topic)
        if config is None:
            if not self.config.auto_create_topic:
                raise RequestError(ResponseCode.TOPIC_NOT_EXIST,
                                   f"topic[{topic}] not exist, apply first please!")
            queue_nums = min(default_queue_nums, self.config.default_topic_queue_nums)
            config = await self.ensure_topic(topic, queue_nums)
        if not config.perm & PERM_WRITE:
            raise RequestError(ResponseCode.NO_PERMISSION, f"the topic[{topic}] sending message is forbidden")
        return config

    def topic_for_read(self, topic: str, queue_id: int) -> TopicConfig:
        if not topic or len(topic) > TOPIC_NAME_MAX_CHARS:
            raise RequestError(ResponseCode.SYSTEM_ERROR, f"invalid topic name {topic[:40]!r}")
        config = self.topic_config(topic)
        if config is None:
            raise RequestError(ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist, apply first please!")
        if not config.perm & PERM_READ:
            raise RequestError(ResponseCode.NO_PERMISSION, f"the topic[{topic}] pulling message is forbidden")
        if not 0 <= queue_id < max(config.read_queue_nums, config.write_queue_nums):
            raise RequestError(ResponseCode.SYSTEM_ERROR,
                               f"queueId[{queue_id}] is illegal, topic:[{topic}] "
                               f"topicConfig.readQueueNums:[{config.read_queue_nums}]")
        return config


#: an append's outcome, on the loop: its results and None, or None and the error it failed with
AppendDone = Callable[[tuple[AppendResult, ...] | None, BaseException | None], None]


def _settle(waiter: asyncio.Future[tuple[AppendResult, ...]], results: tuple[AppendResult, ...] | None,
            error: BaseException | None) -> None:
    if waiter.done():
        return
    if error is not None:
        waiter.set_exception(error)
    else:
        assert results is not None
        waiter.set_result(results)


class _Completions:
    """Hands futures completed on the group-commit thread to the event loop in batches: one loop
    wake-up for every entry's worth of sends, not one per send (asyncio.wrap_future's cost)."""

    def __init__(self, stages: StageHistograms) -> None:
        self._lock = threading.Lock()
        self._done: list[tuple[AppendDone, AppendFuture[tuple[AppendResult, ...]]]] = []
        self._scheduled = False
        self._scheduled_at = 0.0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stages = stages

    def expect(self) -> tuple[asyncio.Future[tuple[AppendResult, ...]],
                              Callable[[AppendFuture[tuple[AppendResult, ...]]], None]]:
        """A waiter on the running loop for one append, and the callback to give that append: the waiter
        gets the append's results or error. If the append is refused, neither is used."""
        waiter: asyncio.Future[tuple[AppendResult, ...]] = asyncio.get_running_loop().create_future()
        return waiter, self.expect_call(functools.partial(_settle, waiter))

    def expect_call(self, then: AppendDone) -> Callable[[AppendFuture[tuple[AppendResult, ...]]], None]:
        """The callback to give one append: ``then`` gets its results or error on the running loop (the loop
        this broker runs on: remembered, as asking for the running loop costs a getpid() system call, which
        was 5% of the event loop's time per one-frame send)."""
        loop = self._loop
        if loop is None or loop.is_closed():
            loop = self._loop = asyncio.get_running_loop()

        def completed(done: AppendFuture[tuple[AppendResult, ...]]) -> None:
            with self._lock:
                self._done.append((then, done))
                if self._scheduled:
                    return
                self._scheduled = True
                self._scheduled_at = time.monotonic()
            loop.call_soon_threadsafe(self._deliver)

        return completed

    def _deliver(self) -> None:
        with self._lock:
            done, self._done = self._done, []
            self._scheduled = False
            scheduled_at = self._scheduled_at
        self._stages.record("answer", time.monotonic() - scheduled_at, len(done))
        for then, future in done:
            error = future.exception()
            try:
                then(None if error is not None else future.result(), error)
            except Exception:  # one caller's failure must not keep the others' answers from them
                log.exception("delivering an append's outcome failed")
