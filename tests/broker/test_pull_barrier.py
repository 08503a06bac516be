"""A leader moves a consumer's offset (PULL_OFFSET_MOVED) only once it is sure it is not merely behind:
found in a chaos run (mixed, seed 3), where a just-elected leader answered a consumer that had read offset
960 from its predecessor with OFFSET_MOVED to 0 (OFFSET_OVERFLOW_BADLY, max 960): a stock consumer adopts
that and consumes the whole queue again. No processes: a pull processor over a stand-in member whose store
catches up when the barrier command applies."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

from broker.config import load_node_file
from broker.consumers import ConsumerManager
from broker.context import BrokerContext
from broker.offsets import OffsetCommitter
from broker.pull import PullProcessor, PullWaiters
from broker.remoting.server import RequestContext
from commitlog.outcomes import GetResult, GetStatus
from dledger.apply import ApplyResult
from dledger.command import Command, LeaderStamp, TopicConfig
from dledger.group_clock import GroupClock
from dledger.group_commit import NotLeaderError
from dledger.member import GroupMember, MemberStatus
from dledger.stages import StageHistograms
from protocol.codes import RequestCode, ResponseCode
from protocol.command import RemotingCommand, make_request
from tests.broker.helpers import NODE_FILE_HEAD, run

TOPIC = "Orders"
NODE = NODE_FILE_HEAD + """listen_address = "127.0.0.1:10911"
"""


class LaggingStore:
    """One queue holding offsets [0, max_offset); the barrier's apply brings it to ``caught_up_offset``."""

    def __init__(self, max_offset: int, caught_up_offset: int) -> None:
        self.max_offset = max_offset
        self.caught_up_offset = caught_up_offset

    def get_messages(self, topic: str, queue_id: int, queue_offset: int, max_count: int, max_bytes: int,
                     tag_codes: object) -> GetResult:
        high = self.max_offset
        if queue_offset == high:
            return GetResult(GetStatus.OFFSET_OVERFLOW_ONE, queue_offset, 0, high)
        if queue_offset > high:
            return GetResult(GetStatus.OFFSET_OVERFLOW_BADLY, 0, 0, high)
        raise AssertionError("these tests only pull at or past the end")

    def max_queue_offset(self, topic: str, queue_id: int) -> int:
        return self.max_offset


class StandInMember:
    def __init__(self, store: LaggingStore, leader: bool = True) -> None:
        self.store = store
        self.state = SimpleNamespace(topics={TOPIC: TopicConfig(TOPIC, 4, 4, 6)}, groups={})
        self.is_leader = leader
        self.group_clock = GroupClock(1)  # the barrier's leader stamp is in the group's time
        self.proposals: list[Command] = []
        self.refuse_proposals = False
        self.stages = StageHistograms()
        self.release = threading.Event()
        self.release.set()

    def status(self) -> MemberStatus:
        return MemberStatus("n0", "leader" if self.is_leader else "follower", 7, None, 0, 0, 0, 0)

    def leader_name(self) -> str | None:
        return None

    def propose(self, command: Command, timeout_seconds: float = 10.0) -> ApplyResult:
        self.release.wait(5.0)
        if self.refuse_proposals:
            raise NotLeaderError(None)
        self.proposals.append(command)
        self.store.max_offset = self.store.caught_up_offset  # applying up to the barrier catches up
        return ApplyResult(raft_index=len(self.proposals))


def processor(tmp_path: Path, member: StandInMember) -> tuple[BrokerContext, PullProcessor]:
    path = tmp_path / "node.toml"
    path.write_text(NODE)
    node, config = load_node_file(path)
    broker = BrokerContext(node, config, cast(GroupMember, member))
    return broker, PullProcessor(broker, ConsumerManager(), OffsetCommitter(broker),
                                 PullWaiters(member.store.max_queue_offset))


async def pull(pull_processor: PullProcessor, queue_offset: int) -> RemotingCommand:
    request = make_request(RequestCode.PULL_MESSAGE, 1, {
        "consumerGroup": "g", "topic": TOPIC, "queueId": "0", "queueOffset": str(queue_offset), "maxMsgNums": "32",
        "sysFlag": "0", "commitOffset": "0", "suspendTimeoutMillis": "0", "subVersion": "0", "expressionType": "TAG"})
    response = await pull_processor(RequestContext(request, cast(Any, None)))
    assert response is not None
    return response


def test_a_leader_behind_its_consumer_catches_up_instead_of_moving_it_to_zero(tmp_path: Path) -> None:
    member = StandInMember(LaggingStore(max_offset=960, caught_up_offset=961))
    _, pull_processor = processor(tmp_path, member)
    response = run(pull(pull_processor, 961))
    assert response.code == ResponseCode.PULL_NOT_FOUND, response.remark  # at the end, not moved
    assert response.ext_fields["nextBeginOffset"] == "961"
    (barrier,) = member.proposals
    assert isinstance(barrier.operations[0], LeaderStamp) and barrier.operations[0].term == 7


def test_an_offset_past_the_end_after_the_barrier_is_moved_as_java_does(tmp_path: Path) -> None:
    member = StandInMember(LaggingStore(max_offset=960, caught_up_offset=960))
    _, pull_processor = processor(tmp_path, member)
    response = run(pull(pull_processor, 5000))
    assert response.code == ResponseCode.PULL_OFFSET_MOVED and response.ext_fields["nextBeginOffset"] == "0"
    assert len(member.proposals) == 1


def test_a_leader_that_cannot_pass_the_barrier_answers_as_a_follower(tmp_path: Path) -> None:
    member = StandInMember(LaggingStore(max_offset=960, caught_up_offset=961))
    member.refuse_proposals = True  # deposed between the read and the barrier
    _, pull_processor = processor(tmp_path, member)
    response = run(pull(pull_processor, 961))
    assert response.code == ResponseCode.PULL_RETRY_IMMEDIATELY and response.ext_fields["nextBeginOffset"] == "961"
    assert member.proposals == []


def test_overlapping_barriers_share_one_proposal(tmp_path: Path) -> None:
    member = StandInMember(LaggingStore(max_offset=960, caught_up_offset=961))
    broker, _ = processor(tmp_path, member)

    async def many() -> None:
        member.release.clear()
        first = asyncio.ensure_future(broker.barrier())
        await asyncio.sleep(0)  # the first barrier's proposal is under way (held back)
        others = [asyncio.ensure_future(broker.barrier()) for _ in range(20)]
        await asyncio.sleep(0)
        member.release.set()
        await asyncio.gather(first, *others)

    run(many())
    assert len(member.proposals) == 2  # the one in flight, and one covering every call made meanwhile
