"""SendProcessor's two ways in (broker/send.py): the queued coroutine and the fast path the server tries
first. They refuse bad sends with the same answer, and the fast path declines while a queued send is still
before its hand-over to the group committer, so a queue's messages are proposed in the order they came."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import pytest

from broker.context import AppendDone, BrokerContext
from broker.remoting.server import RequestContext
from broker.requests import RequestError
from broker.send import SendProcessor
from commitlog.message import MessageInput
from commitlog.outcomes import AppendResult, AppendStatus
from dledger.command import TopicConfig
from dledger.stages import StageHistograms
from protocol.codes import RequestCode, ResponseCode
from protocol.command import RemotingCommand, make_request
from protocol.route_data import PERM_READ, PERM_WRITE
from tests.broker import wire


@dataclass
class FakeMember:
    is_leader: bool = True
    stages: StageHistograms = field(default_factory=StageHistograms)


@dataclass
class FakeState:
    topics: dict[str, TopicConfig] = field(default_factory=dict)


@dataclass
class FakeStoreConfig:
    body_size_max_bytes: int = 4 << 20


@dataclass
class FakeStore:
    config: FakeStoreConfig = field(default_factory=FakeStoreConfig)


@dataclass
class FakeConfig:
    cluster_name: str = "DefaultCluster"
    delay_levels_seconds: tuple[int, ...] = (1, 5, 10)
    max_reconsume_times: int = 16


class FakeBroker:
    """What SendProcessor asks of a BrokerContext; appends are recorded in the order they are handed over
    and answered at once. ``topic_for_send`` waits for ``topics_ready`` (a topic being created)."""

    def __init__(self) -> None:
        self.member = FakeMember()
        self.state = FakeState({"T": TopicConfig("T", 2, 2, PERM_READ | PERM_WRITE),
                                "ReadOnly": TopicConfig("ReadOnly", 2, 2, PERM_READ)})
        self.store = FakeStore()
        self.config = FakeConfig()
        self.random = random.Random(1)
        self.topics_ready = asyncio.Event()
        self.topics_ready.set()
        self.handed_over: list[bytes] = []

    def wall_clock_ms(self) -> int:
        return 1_700_000_000_000

    def require_leader(self) -> None:
        if not self.member.is_leader:
            raise RequestError(ResponseCode.SYSTEM_ERROR, "not the leader")

    async def topic_for_send(self, topic: str, default_queue_nums: int) -> TopicConfig:
        await self.topics_ready.wait()
        config = self.state.topics.get(topic)
        if config is None:
            raise RequestError(ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist, apply first please!")
        if not config.perm & PERM_WRITE:
            raise RequestError(ResponseCode.NO_PERMISSION, f"the topic[{topic}] sending message is forbidden")
        return config

    def _results(self, messages: Sequence[MessageInput]) -> tuple[AppendResult, ...]:
        self.handed_over += [message.body for message in messages]
        host = bytes([127, 0, 0, 1, 0, 0, 0x2A, 0x9F])
        return tuple(AppendResult(AppendStatus.OK, physical_offset=index * 100, queue_offset=index, size=100,
                                  store_host=host) for index, _ in enumerate(messages))

    def append_started(self, messages: Sequence[MessageInput]) -> asyncio.Future[tuple[AppendResult, ...]]:
        waiter: asyncio.Future[tuple[AppendResult, ...]] = asyncio.get_running_loop().create_future()
        waiter.set_result(self._results(messages))
        return waiter

    async def appended(self, waiter: asyncio.Future[tuple[AppendResult, ...]]) -> tuple[AppendResult, ...]:
        return await waiter

    def append_then(self, messages: Sequence[MessageInput], then: AppendDone) -> None:
        results = self._results(messages)
        asyncio.get_running_loop().call_soon(then, results, None)


@dataclass
class FakeConnection:
    remote_address: str = "127.0.0.1:5555"


def send_request(topic: str, body: bytes, queue_id: int = 0, opaque: int = 1, sys_flag: int = 0,
                 batch: bool = False) -> RemotingCommand:
    fields = {"a": "g", "b": topic, "c": "TBW102", "d": "4", "e": str(queue_id), "f": str(sys_flag), "g": "1",
              "h": "0", "i": wire.properties_text({"UNIQ_KEY": f"U{opaque}"}), "j": "0", "m": str(batch).lower()}
    return make_request(RequestCode.SEND_MESSAGE_V2, opaque, fields, body)


def context(request: RemotingCommand) -> RequestContext:
    return RequestContext(request, cast(Any, FakeConnection()), 0.0)


def processor_for(broker: FakeBroker) -> SendProcessor:
    return SendProcessor(cast(BrokerContext, broker))


def run(coroutine: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coroutine, 10))


def test_the_fast_path_declines_while_a_queued_send_is_before_its_append() -> None:
    async def scenario() -> None:
        broker = FakeBroker()
        processor = processor_for(broker)
        broker.topics_ready.clear()  # the queued send waits in topic_for_send, as for a topic being created
        queued = asyncio.create_task(processor(context(send_request("T", b"first", opaque=1))))
        while not broker.topics_ready.is_set() and processor._queued_before_append == 0:
            await asyncio.sleep(0)
        assert processor.fast(context(send_request("T", b"second", opaque=2))) is None
        broker.topics_ready.set()
        first = await queued
        assert first is not None and first.code == ResponseCode.SUCCESS
        taken = processor.fast(context(send_request("T", b"third", opaque=3)))
        assert taken is not None and not isinstance(taken, RemotingCommand)
        answers: list[RemotingCommand | bytes | Exception | None] = []
        taken(answers.append)
        while not answers:
            await asyncio.sleep(0)
        assert broker.handed_over == [b"first", b"third"]
        assert isinstance(answers[0], bytes)  # framed at once: the request's header is JSON

    run(scenario())


class CreatingBroker(FakeBroker):
    """A topic not in the state yet is being created: ``topic_for_send`` waits for ``topics_ready``; a topic
    in the state is taken at once."""

    async def topic_for_send(self, topic: str, default_queue_nums: int) -> TopicConfig:
        if topic not in self.state.topics:
            await self.topics_ready.wait()
        return self.state.topics[topic]


def test_a_queued_send_that_finds_its_topic_created_waits_for_the_send_that_created_it() -> None:
    """The creation applies (the topic exists here) before the send that proposed it resumes; a send taken
    up in between must not be handed over first."""
    async def scenario() -> None:
        broker = CreatingBroker()
        processor = processor_for(broker)
        broker.topics_ready.clear()
        first = asyncio.create_task(processor(context(send_request("New", b"first", opaque=1))))
        while processor._queued_before_append == 0:
            await asyncio.sleep(0)
        broker.state.topics["New"] = TopicConfig("New", 2, 2, PERM_READ | PERM_WRITE)  # the creation applied
        second = asyncio.create_task(processor(context(send_request("New", b"second", opaque=2))))
        refused = await processor(context(send_request("New", b"x", queue_id=9, opaque=3)))
        assert refused is not None and refused.code == ResponseCode.SYSTEM_ERROR  # refused without waiting
        for _ in range(10):  # as far as the second send gets on its own
            await asyncio.sleep(0)
        assert broker.handed_over == []
        broker.topics_ready.set()  # the first send resumes
        answers = await asyncio.gather(first, second)
        assert [answer.code if answer is not None else None for answer in answers] == [ResponseCode.SUCCESS] * 2
        assert broker.handed_over == [b"first", b"second"]
        assert processor._last_turn is None
        third = await processor(context(send_request("New", b"third", opaque=4)))  # nothing to wait for now
        assert third is not None and third.code == ResponseCode.SUCCESS
        assert broker.handed_over == [b"first", b"second", b"third"]

    run(scenario())


def test_the_fast_path_leaves_what_needs_waiting_to_the_queue() -> None:
    broker = FakeBroker()
    processor = processor_for(broker)
    for topic in ("Unknown", "%RETRY%g", "%DLQ%g", "TBW102"):
        assert processor.fast(context(send_request(topic, b"x"))) is None, topic
    broker.member.is_leader = False
    assert processor.fast(context(send_request("T", b"x"))) is None


@pytest.mark.parametrize("request_", [
    send_request("ReadOnly", b"x"),                         # no write permission
    send_request("T", b"x", queue_id=9),                    # queue id out of range
    send_request("T", b"x", sys_flag=0x8),                  # a commit type on a send
    send_request("T", wire.batch_body([(b"m", {})]), sys_flag=0x4, batch=True),  # a transactional batch
    send_request("T", b"\x00" * 30, batch=True),            # a batch whose sizes do not add up
    send_request("T", b"x" * (4 * 1024 * 1024 + 1)),        # a body over the limit
    make_request(RequestCode.SEND_MESSAGE_V2, 5, {"a": "g", "b": "T"}),  # a header without bornTimestamp
], ids=["perm", "queue", "commit-type", "transactional-batch", "bad-batch", "body", "header"])
def test_both_ways_refuse_a_bad_send_with_the_same_answer(request_: RemotingCommand) -> None:
    broker = FakeBroker()
    processor = processor_for(broker)
    fast = processor.fast(context(request_))
    queued = run(processor(context(request_)))
    assert isinstance(fast, RemotingCommand)
    assert queued is not None and queued.code != ResponseCode.SUCCESS
    assert (fast.code, fast.remark) == (queued.code, queued.remark)
    assert broker.handed_over == []
