"""The chaos workload: producers and consumers that run on the runner's event loop throughout a scenario
and record everything they see (:mod:`chaos.history`).

Producers (our client, :class:`client.AsyncProducer`): each owns a few sharding keys and sends
synchronously, one message at a time, at a paced rate, choosing the queue with
:func:`client.select_by_sharding_key`, so one key's messages are sent in order and must be stored in
order. Each message gets its UNIQ_KEY before the first attempt; a failed send is retried by the workload
with the same UNIQ_KEY (the broker deduplicates) up to ``send_attempts_max`` attempts, then given up
(an unknown outcome). A small fraction carries a delay level. Every attempt is recorded.

Ids are the client's own (Java's layout, :mod:`client.unique_id`), and two settings aim at where they once
went wrong: ``id_clock_month_offset_ms`` starts the producers' id clock that far into the current month
(2^31 ms minus a few seconds: the run crosses the wrap of the id's int32 time field, on any day), and
``burst_messages`` makes the first producer send that many messages at the start, in batches, as fast as
the group takes them (more than 65,536 ids of one producer within the broker's dedupe window: the 16-bit
counter wraps). The checker's ``reused_id`` and ``lost`` then show any id that repeats.

Another small fraction is sent as a transaction (:class:`client.transaction.AsyncTransactionProducer`:
every producer is one, in one producer group, so any of them can answer a check-back). The
:class:`ChaosTransactionListener` decides commit or rollback from the run's seed and the UNIQ_KEY alone,
so the producer that answers a check-back, whichever it is, answers what the sender decided; some
messages answer UNKNOW first and are settled only by the broker's check-back. The decision is recorded
on each attempt (:attr:`chaos.history.SendEvent.transaction`).

Consumers: a minimal pull loop per queue per group over raw remoting (PULL_MESSAGE with long polling).
A session starts at the group's committed offset (QUERY_CONSUMER_OFFSET on the leader), reads on,
commits its offset to the leader every ``commit_interval_seconds`` (UPDATE_CONSUMER_OFFSET, answered
once replicated), and ends after a random time (a consumer restart: the next session starts from the
committed offset, so some messages are delivered again). One group reads from the leader, the other
from any member (followers serve committed data; it moves on after every empty long poll, so a member
that lags cannot hold it). A pull that fails moves to another member; an "offset moved" answer is
recorded and never adopted (it would hide a loss).

5.x clients (:mod:`chaos.grpc_workload`, on the members' gRPC servers): the last ``grpc_producers`` of the
producers speak 5.x (FIFO sends, one message group per sharding key), and each group of ``grpc_groups`` is a
5.x consumer group of ``grpc_consumers_per_group`` SimpleConsumers (pop through Raft). The drain waits until
each 5.x group has *acknowledged* every acknowledged message, not only received it, or at least sent an ack
that got no answer (its outcome is unknown: committed, the message never comes back; if not, it comes back
after its invisible time and is acknowledged again). An ack the leader refused does not count: the message
must come back.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import random
import string
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from chaos.connections import Connections, Unreachable
from chaos.grpc_workload import GrpcProducerWorker, PopConsumer
from chaos.history import (
    TRANSACTION_COMMIT,
    TRANSACTION_ROLLBACK,
    DeliveryEvent,
    Event,
    History,
    HistoryWriter,
    NoteEvent,
    OffsetCommitEvent,
    PopAckEvent,
    SendEvent,
    SessionEvent,
)
from client import ClientConfig, Message, MQClientError, ProducerConfig, select_by_sharding_key
from client.message import MessageExt
from client.transaction import AsyncTransactionProducer, LocalTransactionState
from client.unique_id import month_start_ms
from commitlog.record_codec import RecordError, decode_record
from protocol.codes import RequestCode, ResponseCode
from protocol.command import RemotingCommand
from protocol.properties import PROPERTY_UNIQ_KEY, decode_properties

PRODUCER_GROUP: Final = "chaos-producer"
LEADER_READS: Final = "leader"
ANY_READS: Final = "any"
#: pause after a failed request before the next (seconds, jittered up to twice)
BACKOFF_SECONDS: Final = 0.1
#: a cancelled send is recorded with this code (the outcome is unknown)
CANCELLED_CODE: Final = -1
#: how long a burst goes on past the end of the run when it is not done by then (a slow machine)
BURST_GRACE_SECONDS: Final = 60.0
QUERY_NOT_FOUND: Final = 22


@dataclass(frozen=True, slots=True)
class WorkloadConfig:
    topic: str = "ChaosTopic"
    queues: int = 4
    producers: int = 3
    keys_per_producer: int = 4
    #: messages per second each producer aims at (sends are synchronous: slower when the group is)
    rate_per_producer: float = 40.0
    body_bytes: int = 200
    delay_fraction: float = 0.05
    delay_level: int = 1
    #: sends that go through the transactional producer; of those, rollbacks and UNKNOW-first answers
    transaction_fraction: float = 0.05
    transaction_rollback_fraction: float = 0.3
    transaction_unknown_fraction: float = 0.3
    send_timeout_seconds: float = 5.0
    send_attempts_max: int = 4
    #: (consumer group, where it reads: "leader" or "any")
    groups: tuple[tuple[str, str], ...] = (("chaos-leader-reads", LEADER_READS), ("chaos-any-reads", ANY_READS))
    session_seconds_min: float = 3.0
    session_seconds_max: float = 8.0
    commit_interval_seconds: float = 0.5
    pull_batch: int = 32
    long_poll_ms: int = 500
    request_timeout_seconds: float = 2.0
    #: None: the producers' UNIQ_KEY clock is the system's; else it starts this many ms into the current
    #: month (local time) and runs on at the system clock's pace
    id_clock_month_offset_ms: int | None = None
    #: messages the first producer sends at the start in batches of ``burst_batch`` (0: none)
    burst_messages: int = 0
    burst_batch: int = 256
    #: the last this many of ``producers`` speak 5.x (gRPC) instead of 4.x (chaos.grpc_workload)
    grpc_producers: int = 0
    #: 5.x consumer groups (pop through Raft), besides ``groups``; each every message of the topic
    grpc_groups: tuple[str, ...] = ()
    grpc_consumers_per_group: int = 2
    grpc_invisible_seconds: float = 5.0
    grpc_receive_batch: int = 16
    grpc_long_poll_ms: int = 1000
    #: deliveries a 5.x consumer leaves unacknowledged (they come back after the invisible time)
    grpc_unacked_fraction: float = 0.05

    def validate(self) -> WorkloadConfig:
        checks = [
            (1 <= self.queues <= 64, "queues must be 1..64"),
            (1 <= self.producers <= 64, "producers must be 1..64"),
            (1 <= self.keys_per_producer <= 1000, "keys_per_producer must be 1..1000"),
            (0 < self.rate_per_producer <= 10_000, "rate_per_producer must be in (0, 10000]"),
            (16 <= self.body_bytes <= 65_536, "body_bytes must be 16..65536"),
            (0 <= self.delay_fraction <= 1, "delay_fraction must be in [0, 1]"),
            (1 <= self.delay_level <= 18, "delay_level must be 1..18"),
            (0 <= self.delay_fraction + self.transaction_fraction <= 1,
             "transaction_fraction must be in [0, 1 - delay_fraction]"),
            (0 <= self.transaction_rollback_fraction <= 1 and 0 <= self.transaction_unknown_fraction <= 1,
             "transaction rollback and unknown fractions must be in [0, 1]"),
            (self.send_timeout_seconds > 0 and self.send_attempts_max >= 1, "send timeout and attempts must be positive"),
            (bool(self.groups) and all(mode in (LEADER_READS, ANY_READS) for _, mode in self.groups),
             "groups need a name and a mode ('leader' or 'any')"),
            (0 < self.session_seconds_min <= self.session_seconds_max, "session seconds must be positive and ordered"),
            (self.commit_interval_seconds > 0 and self.pull_batch >= 1 and self.long_poll_ms >= 0,
             "commit interval, pull batch and long poll must be positive"),
            (self.id_clock_month_offset_ms is None or 0 <= self.id_clock_month_offset_ms < 28 * 86_400_000,
             "id_clock_month_offset_ms must be within the shortest month"),
            (0 <= self.burst_messages <= 1_000_000 and 1 <= self.burst_batch <= 1024,
             "burst_messages must be 0..1000000 and burst_batch 1..1024"),
            (0 <= self.grpc_producers <= self.producers - (1 if self.burst_messages else 0),
             "grpc_producers must be 0..producers (the first producer sends the burst over 4.x)"),
            (len(set(self.grpc_groups)) == len(self.grpc_groups) and all(self.grpc_groups)
             and not set(self.grpc_groups) & {name for name, _ in self.groups},
             "grpc_groups must be distinct names, none of them a 4.x group's"),
            (1 <= self.grpc_consumers_per_group <= 16, "grpc_consumers_per_group must be 1..16"),
            (1 <= self.grpc_invisible_seconds <= 300 and 1 <= self.grpc_receive_batch <= 32
             and 0 <= self.grpc_long_poll_ms <= 20_000 and 0 <= self.grpc_unacked_fraction < 1,
             "grpc invisible seconds 1..300, receive batch 1..32, long poll 0..20000 ms, unacked fraction [0, 1)"),
        ]
        for holds, message in checks:
            if not holds:
                raise ValueError(f"workload: {message}")
        return self

    @property
    def group_names(self) -> tuple[str, ...]:
        """Every consumer group of the run: the 4.x ones, then the 5.x ones."""
        return tuple(name for name, _ in self.groups) + self.grpc_groups

    @property
    def uses_grpc(self) -> bool:
        return bool(self.grpc_producers or self.grpc_groups)


class Recorder:
    """Timestamps (seconds since the run started), keeps and appends every event; keeps what the drain
    needs to know without scanning the history (acknowledged keys, keys received per group, and per 5.x
    group the keys it acknowledged)."""

    def __init__(self, writer: HistoryWriter | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.started = clock()
        self.history = History()
        self._writer = writer
        self.acked: set[str] = set()
        self.received: dict[str, set[str]] = defaultdict(set)
        #: the 5.x groups (their consumers acknowledge what they receive), what each acknowledged, and what
        #: each sent an ack for that got no answer (it may have been committed)
        self.pop_groups: set[str] = set()
        self.pop_acked: dict[str, set[str]] = defaultdict(set)
        self.pop_unanswered: dict[str, set[str]] = defaultdict(set)

    def now(self) -> float:
        return round(self._clock() - self.started, 6)

    def record(self, event: Event) -> None:
        self.history.add(event)
        if isinstance(event, SendEvent) and event.acked and event.transaction != TRANSACTION_ROLLBACK:
            self.acked.add(event.uniq_key)
        elif isinstance(event, DeliveryEvent):
            self.received[event.group].add(event.uniq_key)
        elif isinstance(event, PopAckEvent):
            if event.acked:
                self.pop_acked[event.group].add(event.uniq_key)
            elif event.code is None:
                self.pop_unanswered[event.group].add(event.uniq_key)
        if self._writer is not None:
            self._writer.write(event)

    def missing(self, group: str) -> int:
        """Acknowledged messages ``group`` has not received yet (a 5.x group: not acknowledged yet, nor given
        an ack whose outcome is unknown)."""
        if group in self.pop_groups:
            return len(self.acked - self.pop_acked[group] - self.pop_unanswered[group])
        return len(self.acked - self.received[group])


# ------------------------------------------------------------------------------------- producers


@dataclass(frozen=True, slots=True)
class TransactionDecision:
    commit: bool
    unknown_first: bool

    @property
    def name(self) -> str:
        return TRANSACTION_COMMIT if self.commit else TRANSACTION_ROLLBACK

    @property
    def state(self) -> LocalTransactionState:
        return LocalTransactionState.COMMIT_MESSAGE if self.commit else LocalTransactionState.ROLLBACK_MESSAGE


def transaction_decision(salt: int, uniq_key: str, config: WorkloadConfig) -> TransactionDecision:
    """A pure function of the run's salt (from its seed) and the UNIQ_KEY: every producer decides alike."""
    digest = hashlib.blake2b(f"{salt}:{uniq_key}".encode(), digest_size=16).digest()
    first, second = int.from_bytes(digest[:8], "big") / 2**64, int.from_bytes(digest[8:], "big") / 2**64
    return TransactionDecision(first >= config.transaction_rollback_fraction,
                               second < config.transaction_unknown_fraction)


class ChaosTransactionListener:
    """Answers the local transaction and the check-back from :func:`transaction_decision`; records every
    check-back it answers (a note naming the UNIQ_KEY)."""

    def __init__(self, salt: int, config: WorkloadConfig, recorder: Recorder) -> None:
        self.salt = salt
        self.config = config
        self.recorder = recorder

    async def execute_local_transaction(self, message: Message, arg: object) -> LocalTransactionState:
        decision = transaction_decision(self.salt, message.unique_id or "", self.config)
        return LocalTransactionState.UNKNOW if decision.unknown_first else decision.state

    async def check_local_transaction(self, message: MessageExt) -> LocalTransactionState:
        uniq_key = message.properties.get(PROPERTY_UNIQ_KEY, "")
        decision = transaction_decision(self.salt, uniq_key, self.config)
        self.recorder.record(NoteEvent(self.recorder.now(), "transaction check-back",
                                       f"{uniq_key}: {decision.name}"))
        return decision.state


class ProducerWorker:
    def __init__(self, index: int, namesrv: str, config: WorkloadConfig, recorder: Recorder, rng: random.Random,
                 transaction_salt: int = 0) -> None:
        self.name = f"p{index}"
        self.index = index
        self.namesrv = namesrv
        self.config = config
        self.recorder = recorder
        self.rng = rng
        self.transaction_salt = transaction_salt
        #: set once the worker sends no more (its producer stays up to answer check-backs)
        self.idle = asyncio.Event()
        self.keys = [f"{self.name}-k{number}" for number in range(config.keys_per_producer)]
        self.sequences = dict.fromkeys(self.keys, 0)

    def _body(self, key: str, sequence: int) -> bytes:
        head = f"{key}#{sequence}#"
        filler = "".join(self.rng.choices(string.ascii_letters, k=max(0, self.config.body_bytes - len(head))))
        return (head + filler).encode()

    async def run(self, stop: asyncio.Event, release: asyncio.Event) -> None:
        """Send until ``stop``; then, idle, keep the producer registered until ``release``: a transaction
        left UNKNOW is settled only by a check-back, which needs a live producer of the group."""
        config = self.config
        client_config = ClientConfig((self.namesrv,), instance_name=f"chaos-{self.name}",
                                     request_timeout_seconds=config.request_timeout_seconds)
        producer = AsyncTransactionProducer(
            client_config, ProducerConfig(group=PRODUCER_GROUP, send_timeout_seconds=config.send_timeout_seconds,
                                          default_topic_queue_nums=config.queues),
            listener=ChaosTransactionListener(self.transaction_salt, config, self.recorder),
            rng=random.Random(self.rng.getrandbits(64)), id_clock_ms=id_clock(config.id_clock_month_offset_ms))
        await producer.start()
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        try:
            if self.index == 0 and config.burst_messages:
                await self.send_burst(producer, stop)
            while not stop.is_set():
                await self.send_one(producer)
                next_at = max(next_at + 1 / config.rate_per_producer, loop.time() - 1.0)
                delay = next_at - loop.time()
                if delay > 0:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), delay)
            self.idle.set()
            await release.wait()
        finally:
            self.idle.set()
            await producer.close()

    async def send_one(self, producer: AsyncTransactionProducer) -> None:
        config = self.config
        key = self.keys[self.rng.randrange(len(self.keys))]
        sequence = self.sequences[key]
        self.sequences[key] = sequence + 1
        draw = self.rng.random()
        delay_level = config.delay_level if draw < config.delay_fraction else 0
        transactional = config.delay_fraction <= draw < config.delay_fraction + config.transaction_fraction
        message = Message(config.topic, self._body(key, sequence), sharding_key=key, delay_level=delay_level)
        message.unique_id = producer.new_unique_id()
        decision = transaction_decision(self.transaction_salt, message.unique_id, config) if transactional else None
        transaction = decision.name if decision is not None else ""
        checked_back = decision is not None and decision.unknown_first
        for attempt in range(config.send_attempts_max):
            started = self.recorder.now()
            try:
                if transactional:
                    # a retry keeps the UNIQ_KEY: the broker deduplicates the half as any other send
                    outcome = await producer.send_message_in_transaction(message)
                    result = outcome.send_result
                    if outcome.local_state is LocalTransactionState.ROLLBACK_MESSAGE:
                        transaction = TRANSACTION_ROLLBACK  # the producer rolls back a half not stored SEND_OK
                else:
                    result = await producer.send(message, selector=select_by_sharding_key)
            except MQClientError as error:
                self.recorder.record(SendEvent(self.name, message.unique_id, key, sequence, attempt, started,
                                               self.recorder.now(), False, error.code, str(error)[:200],
                                               delay_level=delay_level, transaction=transaction,
                                               checked_back=checked_back))
                continue
            except asyncio.CancelledError:
                self.recorder.record(SendEvent(self.name, message.unique_id, key, sequence, attempt, started,
                                               self.recorder.now(), False, CANCELLED_CODE, "cancelled",
                                               delay_level=delay_level, transaction=transaction,
                                               checked_back=checked_back))
                raise
            self.recorder.record(SendEvent(self.name, message.unique_id, key, sequence, attempt, started,
                                           self.recorder.now(), True, None, "", result.message_queue.queue_id,
                                           result.queue_offset, delay_level, result.broker_address, transaction,
                                           checked_back))
            return

    async def send_burst(self, producer: AsyncTransactionProducer, stop: asyncio.Event) -> None:
        """``burst_messages`` messages of one sharding key in batches (each batch is stored whole in the key's
        queue, in order): every message of a batch is recorded as a send, with its own queue offset."""
        config = self.config
        key = f"{self.name}-burst"
        sequence = 0
        filler = b"x" * max(0, config.body_bytes - 32)  # not random: the burst is about ids, not bytes
        loop = asyncio.get_running_loop()
        stopped_at: float | None = None
        while sequence < config.burst_messages:
            # the burst is whole even when a slow machine has not sent it by the end of the run: it goes on
            # up to BURST_GRACE_SECONDS past the stop (checks count on every one of its messages)
            if stop.is_set():
                stopped_at = loop.time() if stopped_at is None else stopped_at
                if loop.time() - stopped_at > BURST_GRACE_SECONDS:
                    break
            count = min(config.burst_batch, config.burst_messages - sequence)
            messages = [Message(config.topic, f"{key}#{sequence + n}#".encode() + filler, sharding_key=key)
                        for n in range(count)]
            for message in messages:
                message.unique_id = producer.new_unique_id()
            queue = select_by_sharding_key(await producer.fetch_publish_queues(config.topic), messages[0], key)
            for attempt in range(config.send_attempts_max):
                started = self.recorder.now()
                try:
                    result = await producer.send_batch(messages, queue=queue)
                except MQClientError as error:
                    for number, message in enumerate(messages):
                        self.recorder.record(SendEvent(self.name, message.unique_id or "", key, sequence + number,
                                                       attempt, started, self.recorder.now(), False, error.code,
                                                       str(error)[:200]))
                    continue
                ended = self.recorder.now()
                for number, message in enumerate(messages):
                    self.recorder.record(SendEvent(self.name, message.unique_id or "", key, sequence + number, attempt,
                                                   started, ended, True, None, "", result.message_queue.queue_id,
                                                   result.queue_offset + number, 0, result.broker_address))
                break
            sequence += count


def id_clock(month_offset_ms: int | None) -> Callable[[], int] | None:
    """The producers' UNIQ_KEY clock: None (the system clock), or one that starts ``month_offset_ms`` into
    the current month and runs at the system clock's pace."""
    if month_offset_ms is None:
        return None
    now_ms = time.time_ns() // 1_000_000
    shift = month_start_ms(now_ms)[0] + month_offset_ms - now_ms
    return lambda: time.time_ns() // 1_000_000 + shift


# ------------------------------------------------------------------------------------- consumers


@dataclass
class SharedConsumers:
    """What the consumers of one run share: session numbers and the drain flag."""

    sessions: itertools.count[int] = field(default_factory=itertools.count)
    draining: bool = False


class QueueConsumer:
    """One group's reader of one queue."""

    def __init__(self, group: str, mode: str, queue: int, members: list[str], namesrv: str, config: WorkloadConfig,
                 recorder: Recorder, rng: random.Random, shared: SharedConsumers) -> None:
        self.group = group
        self.mode = mode
        self.queue = queue
        self.members = members
        self.namesrv = namesrv
        self.config = config
        self.recorder = recorder
        self.rng = rng
        self.shared = shared
        self.connections = Connections()
        #: the next queue offset to read
        self.offset = 0
        self._last_note: tuple[str, str] | None = None
        self._leader: str | None = None

    async def run(self) -> None:
        try:
            while True:
                await self._session()
        finally:
            await self.connections.close()

    def _note(self, what: str, node: str, detail: str) -> None:
        """Record a note, once per run of identical (what, node)."""
        if self._last_note != (what, node):
            self._last_note = (what, node)
            self.recorder.record(NoteEvent(self.recorder.now(), what,
                                           f"{self.group} queue {self.queue} at {node}: {detail}"))

    async def _backoff(self) -> None:
        await asyncio.sleep(BACKOFF_SECONDS * (1 + self.rng.random()))

    async def _leader_address(self, refresh: bool = False) -> str:
        if refresh or self._leader is None:
            self._leader = await self.connections.route_master(self.namesrv, self.config.topic)
        return self._leader if self._leader is not None else self.rng.choice(self.members)

    async def _leader_request(self, code: int, fields: dict[str, str]) -> tuple[RemotingCommand, str]:
        """A request the leader must answer; follows not-leader answers and failures until answered."""
        refresh = False
        while True:
            address = await self._leader_address(refresh)
            try:
                response = await self.connections.request(address, code, fields, self.config.request_timeout_seconds)
            except Unreachable as exc:
                self._note("leader unreachable", address, str(exc)[:120])
                refresh = True
                await self._backoff()
                continue
            if response.code == ResponseCode.SERVICE_NOT_AVAILABLE:
                hint = response.ext_fields.get("leaderAddress")
                self._leader = hint if hint in self.members else None
                refresh = self._leader is None
                await self._backoff()
                continue
            return response, address

    async def _committed_offset(self) -> tuple[int, str]:
        fields = {"consumerGroup": self.group, "topic": self.config.topic, "queueId": str(self.queue)}
        while True:
            response, address = await self._leader_request(RequestCode.QUERY_CONSUMER_OFFSET, fields)
            if response.code == ResponseCode.SUCCESS:
                return int(response.ext_fields.get("offset", "0")), address
            if response.code == QUERY_NOT_FOUND:
                return 0, address
            self._note("offset query refused", address, f"code {response.code} {response.remark}")
            await self._backoff()

    async def _commit(self, offset: int) -> bool:
        fields = {"consumerGroup": self.group, "topic": self.config.topic, "queueId": str(self.queue),
                  "commitOffset": str(offset)}
        address = await self._leader_address()
        try:
            response = await self.connections.request(address, RequestCode.UPDATE_CONSUMER_OFFSET, fields,
                                                      self.config.request_timeout_seconds)
        except Unreachable:
            self._leader = None
            return False
        if response.code != ResponseCode.SUCCESS:
            hint = response.ext_fields.get("leaderAddress")
            self._leader = hint if hint in self.members else None
            return False
        self.recorder.record(OffsetCommitEvent(self.group, self.queue, offset, self.recorder.now(), address))
        return True

    async def _pull_node(self, failed: str | None) -> str:
        if self.mode == LEADER_READS:
            return await self._leader_address(refresh=failed is not None)
        choices = [member for member in self.members if member != failed] or self.members
        return self.rng.choice(choices)

    async def _session(self) -> None:
        config = self.config
        loop = asyncio.get_running_loop()
        start, leader = await self._committed_offset()
        session = next(self.shared.sessions)
        self.offset = committed = start
        self.recorder.record(SessionEvent(self.group, session, self.queue, start, self.recorder.now(),
                                          "start", leader))
        ends_at = loop.time() + self.rng.uniform(config.session_seconds_min, config.session_seconds_max)
        next_commit = loop.time() + config.commit_interval_seconds
        node = await self._pull_node(None)
        fields = {"consumerGroup": self.group, "topic": config.topic, "queueId": str(self.queue),
                  "maxMsgNums": str(config.pull_batch), "sysFlag": "2", "commitOffset": "0",
                  "suspendTimeoutMillis": str(config.long_poll_ms), "subVersion": "0", "expressionType": "TAG"}
        timeout = config.long_poll_ms / 1000 + config.request_timeout_seconds
        while True:
            now = loop.time()
            if now >= ends_at and not self.shared.draining:
                if self.rng.random() < 0.5:  # a clean shutdown commits; a crash does not
                    await self._commit(self.offset)
                return
            if now >= next_commit:
                next_commit = now + config.commit_interval_seconds
                if self.offset != committed and await self._commit(self.offset):
                    committed = self.offset
            try:
                response = await self.connections.request(node, RequestCode.PULL_MESSAGE,
                                                           {**fields, "queueOffset": str(self.offset)}, timeout)
            except Unreachable as exc:
                self._note("pull failed", node, str(exc)[:120])
                await self._backoff()
                node = await self._pull_node(node)
                continue
            if not self._handle_pull(session, node, response):
                await self._backoff()
                node = await self._pull_node(node)
            elif self.mode == ANY_READS and response.code == ResponseCode.PULL_NOT_FOUND:
                node = await self._pull_node(node)  # nothing new here: a lagging member must not hold us

    def _handle_pull(self, session: int, node: str, response: RemotingCommand) -> bool:
        """Record what a pull returned; False when the member should be left for another."""
        code = response.code
        if code == ResponseCode.SUCCESS:
            after_last = self._record_messages(session, node, response.body)
            next_offset = response.ext_fields.get("nextBeginOffset", "")
            self.offset = int(next_offset) if next_offset.isdigit() else max(self.offset, after_last)
            return True
        if code == ResponseCode.PULL_NOT_FOUND:
            return True
        if code == ResponseCode.PULL_RETRY_IMMEDIATELY:
            next_offset = response.ext_fields.get("nextBeginOffset", "")
            if next_offset.isdigit() and int(next_offset) > self.offset:
                self.offset = int(next_offset)
            return True
        what = "offset moved" if code == ResponseCode.PULL_OFFSET_MOVED else "pull refused"
        self._note(what, node, f"code {code} at offset {self.offset} (next {response.ext_fields.get('nextBeginOffset')}, "
                               f"max {response.ext_fields.get('maxOffset')}): {response.remark}")
        return False

    def _record_messages(self, session: int, node: str, body: bytes) -> int:
        """Record each message of a pull's body; returns one past the highest queue offset seen."""
        position = 0
        after_last = 0
        now = self.recorder.now()
        while position < len(body):
            try:
                record = decode_record(body, position)
            except RecordError as exc:
                self._note("undecodable pull", node, str(exc)[:120])
                break
            position += record.total_size
            uniq_key = decode_properties(record.properties).get(PROPERTY_UNIQ_KEY, "")
            self.recorder.record(DeliveryEvent(self.group, session, uniq_key, record.queue_id, record.queue_offset,
                                               now, node))
            after_last = max(after_last, record.queue_offset + 1)
        return after_last


# -------------------------------------------------------------------------------------- workload


class Workload:
    """Every producer and consumer of a run. ``start``, then ``stop_producers``, ``drain``, ``stop``."""

    def __init__(self, namesrv: str, members: list[str], config: WorkloadConfig, recorder: Recorder,
                 rng: random.Random, grpc_members: list[str] | None = None) -> None:
        """``members``: the brokers' client addresses; ``grpc_members``: their gRPC addresses (needed when the
        configuration has 5.x clients)."""
        self.namesrv = namesrv
        self.members = members
        self.config = config.validate()
        self.recorder = recorder
        if config.uses_grpc and not grpc_members:
            raise ValueError("workload: 5.x clients need the members' gRPC addresses")
        transaction_salt = rng.getrandbits(64)
        first_grpc = config.producers - config.grpc_producers
        # one draw per producer whatever its protocol: a run without 5.x clients draws as it always did
        self.producers: list[ProducerWorker | GrpcProducerWorker] = [
            ProducerWorker(index, namesrv, config, recorder, random.Random(rng.getrandbits(64)), transaction_salt)
            if index < first_grpc else
            GrpcProducerWorker(index, list(grpc_members or ()), config, recorder, random.Random(rng.getrandbits(64)))
            for index in range(config.producers)]
        self._shared = SharedConsumers()
        self.consumers = [QueueConsumer(group, mode, queue, members, namesrv, config, recorder,
                                        random.Random(rng.getrandbits(64)), self._shared)
                          for group, mode in config.groups for queue in range(config.queues)]
        recorder.pop_groups.update(config.grpc_groups)
        self.pop_consumers = [PopConsumer(group, index, list(grpc_members or ()), config, recorder,
                                          random.Random(rng.getrandbits(64)), self._shared)
                              for group in config.grpc_groups for index in range(config.grpc_consumers_per_group)]
        self._stop_producing = asyncio.Event()
        self._release_producers = asyncio.Event()
        self._producer_tasks: list[asyncio.Task[None]] = []
        self._consumer_tasks: list[asyncio.Task[None]] = []
        self._connections = Connections()

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._consumer_tasks = [loop.create_task(consumer.run(), name=f"consume {consumer.group} {consumer.queue}")
                                for consumer in self.consumers]
        self._consumer_tasks += [loop.create_task(consumer.run(), name=f"consume {consumer.name} (5.x)")
                                 for consumer in self.pop_consumers]
        self._producer_tasks = [loop.create_task(producer.run(self._stop_producing, self._release_producers),
                                                 name=f"produce {producer.name}")
                                for producer in self.producers]

    def failed_task(self) -> BaseException | None:
        """The error of a workload task that ended by itself (a bug: they run until stopped)."""
        for task in self._producer_tasks + self._consumer_tasks:
            if task.done() and not task.cancelled() and task.exception() is not None:
                return task.exception()
        return None

    async def stop_producers(self, timeout_seconds: float) -> None:
        """Let each producer finish its current message (retries included), then cancel those still
        sending. The idle ones stay connected, to answer check-backs, until :meth:`stop`."""
        self._stop_producing.set()
        if self._producer_tasks:
            waits = [asyncio.ensure_future(producer.idle.wait()) for producer in self.producers]
            await asyncio.wait(waits, timeout=timeout_seconds)
            for wait in waits:
                wait.cancel()
            for producer, task in zip(self.producers, self._producer_tasks, strict=True):
                if not producer.idle.is_set():
                    task.cancel()

    async def max_offsets(self, leader: str) -> list[int] | None:
        offsets = []
        for queue in range(self.config.queues):
            try:
                response = await self._connections.request(leader, RequestCode.GET_MAX_OFFSET,
                                                           {"topic": self.config.topic, "queueId": str(queue)}, 1.0)
            except Unreachable:
                return None
            if response.code != ResponseCode.SUCCESS:
                return None
            offsets.append(int(response.ext_fields.get("offset", "0")))
        return offsets

    async def drain(self, timeout_seconds: float, settle_seconds: float = 2.0) -> bool:
        """Wait until every group received every acknowledged message and read every queue to the leader's
        end, the same end for ``settle_seconds`` (delayed messages keep arriving for their delay)."""
        self._shared.draining = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_seconds
        stable_since: float | None = None
        last_ends: list[int] | None = None
        while loop.time() < deadline:
            leader = await self._connections.route_master(self.namesrv, self.config.topic)
            ends = await self.max_offsets(leader) if leader is not None else None
            caught_up = ends is not None and all(consumer.offset >= ends[consumer.queue] for consumer in self.consumers)
            received = all(self.recorder.missing(group) == 0 for group in self.config.group_names)
            if caught_up and received and ends == last_ends:
                if stable_since is None:
                    stable_since = loop.time()
                elif loop.time() - stable_since >= settle_seconds:
                    return True
            else:
                stable_since = None
            last_ends = ends
            await asyncio.sleep(0.25)
        missing = {group: self.recorder.missing(group) for group in self.config.group_names}
        self.recorder.record(NoteEvent(self.recorder.now(), "drain timed out",
                                       f"acknowledged messages not received per group: {missing}; "
                                       f"offsets {[consumer.offset for consumer in self.consumers]}"))
        return False

    async def stop(self) -> None:
        self._stop_producing.set()
        self._release_producers.set()
        if self._producer_tasks:  # released producers close by themselves (unregistering from the group)
            await asyncio.wait(self._producer_tasks, timeout=5.0)
        for task in self._producer_tasks + self._consumer_tasks:
            task.cancel()
        await asyncio.gather(*self._producer_tasks, *self._consumer_tasks, return_exceptions=True)
        await self._connections.close()
