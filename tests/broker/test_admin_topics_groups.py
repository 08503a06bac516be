"""The admin requests that change topics and offsets (issue 26): DELETE_TOPIC_IN_BROKER,
GET_ALL_SUBSCRIPTIONGROUP_CONFIG and INVOKE_BROKER_TO_RESET_OFFSET, and DELETE_TOPIC_IN_NAMESRV on the name
server's route table. No processes: the admin processor over a stand-in leader whose proposals apply, as
encoded commands, to two replicas (a store, the replicated state and apply each), so what a change leaves in
every replica's state is checked, not only in the leader's."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

from broker.admin import ONLINE_CONSUMERS_FIELD, RESET_WHILE_ONLINE_FIELD, AdminProcessor
from broker.config import load_node_file
from broker.consumers import MESSAGE_MODEL_CLUSTERING, ConsumerManager
from broker.context import BrokerContext
from broker.namesrv.route_table import RouteTable
from broker.offsets import OffsetCommitter
from client.running_info import loads_lenient, queue_of_key
from commitlog.store import MessageStore
from dledger.apply import ApplyResult, StateMachine
from dledger.command import Command, SubscriptionGroup, encode_command, encode_messages_command
from dledger.group_clock import GroupClock
from dledger.member import GroupMember, MemberStatus
from dledger.stages import StageHistograms
from dledger.state import ReplicatedState
from protocol.codes import RequestCode, ResponseCode
from protocol.command import RemotingCommand, make_request
from protocol.route_data import DataVersion
from protocol.route_data import TopicConfig as RouteTopicConfig
from tests.broker.helpers import NODE_FILE_HEAD, run
from tests.commitlog.helpers import message, small_config

T = 1_750_000_000_000
TOPIC = "Orders"


class Replica:
    def __init__(self, directory: Path) -> None:
        self.state = ReplicatedState()
        self.store = MessageStore(small_config(directory), extension_provider=self.state.encode)
        self.machine = StateMachine(self.store, self.state)
        self.index = 0

    def apply(self, data: bytes) -> ApplyResult:
        self.index += 1
        return self.machine.apply(self.index, data)


class StandInLeader:
    """The leader of a two-member group: every proposal applies on both replicas, in order."""

    def __init__(self, leader: Replica, follower: Replica) -> None:
        self.replicas = (leader, follower)
        self.store = leader.store
        self.state = leader.state
        self.is_leader = True
        self.stages = StageHistograms()
        self.group_clock = GroupClock(1)
        self.proposals: list[Command] = []

    def status(self) -> MemberStatus:
        return MemberStatus("n0", "leader" if self.is_leader else "follower", 3, None, 0, 0, 0, 0)

    def leader_name(self) -> str | None:
        return None

    def propose(self, command: Command, timeout_seconds: float = 10.0) -> ApplyResult:
        self.proposals.append(command)
        data = encode_command(command)
        results = [replica.apply(data) for replica in self.replicas]
        return results[0]

    def store_messages(self, queue_id: int, stamps: list[int], topic: str = TOPIC) -> None:
        for number, store_timestamp in enumerate(stamps):
            data = encode_messages_command([message(queue_id * 1000 + number, topic=topic, queue_id=queue_id)],
                                          store_timestamp=store_timestamp)
            for replica in self.replicas:
                replica.apply(data)


@dataclass
class Admin:
    leader: StandInLeader
    consumers: ConsumerManager
    processor: AdminProcessor
    follower_state: ReplicatedState

    async def call(self, code: int, **fields: str) -> RemotingCommand:
        response = await self.processor.handle(make_request(code, 1, fields))
        return response

    async def request(self, code: int, **fields: str) -> RemotingCommand:
        """As the server calls it: a refusal is an answer, not an exception."""
        context = SimpleNamespace(request=make_request(code, 1, fields))
        response = await self.processor(cast(Any, context))
        assert response is not None
        return response

    def go_online(self, group: str, client_id: str, *topics: str) -> SimpleNamespace:
        connection = SimpleNamespace(is_closed=False, remote_address="127.0.0.1:40000")
        self.consumers.register_consumer(group, client_id, cast(Any, connection), dict.fromkeys(topics, "*"),
                                         MESSAGE_MODEL_CLUSTERING)
        return connection


@asynccontextmanager
async def admin_of(tmp_path: Path) -> AsyncIterator[Admin]:
    leader_replica, follower_replica = Replica(tmp_path / "n0"), Replica(tmp_path / "n1")
    member = StandInLeader(leader_replica, follower_replica)
    path = tmp_path / "node.toml"
    path.write_text(NODE_FILE_HEAD + 'listen_address = "127.0.0.1:10911"\n')
    node, config = load_node_file(path)
    broker = BrokerContext(node, config, cast(GroupMember, member), wall_clock_ms=lambda: T)
    offsets = OffsetCommitter(broker)
    offsets.start()
    consumers = ConsumerManager()
    try:
        yield Admin(member, consumers, AdminProcessor(broker, offsets, consumers), follower_replica.state)
    finally:
        await offsets.stop()
        for replica in member.replicas:
            replica.store.close()


async def create_topic(admin: Admin, topic: str = TOPIC, queues: int = 2, perm: int = 6, order: bool = False) -> None:
    response = await admin.call(RequestCode.UPDATE_AND_CREATE_TOPIC, topic=topic, readQueueNums=str(queues),
                                 writeQueueNums=str(queues), perm=str(perm), order="true" if order else "false")
    assert response.code == ResponseCode.SUCCESS, response.remark


async def commit(admin: Admin, group: str, topic: str, queue_id: int, offset: int) -> None:
    response = await admin.call(RequestCode.UPDATE_CONSUMER_OFFSET, consumerGroup=group, topic=topic,
                                queueId=str(queue_id), commitOffset=str(offset))
    assert response.code == ResponseCode.SUCCESS, response.remark


def scenario(tmp_path: Path, body: Callable[[Admin], Any]) -> None:
    async def main() -> None:
        async with admin_of(tmp_path) as admin:
            await body(admin)

    run(main())


# ------------------------------------------------------------------------------------------ delete


def test_a_deleted_topic_leaves_every_replica_with_its_offsets_and_is_no_longer_served(tmp_path: Path) -> None:
    async def body(admin: Admin) -> None:
        await create_topic(admin)
        await create_topic(admin, "Kept")
        admin.leader.store_messages(0, [T, T + 1])
        await commit(admin, "g", TOPIC, 0, 1)
        await commit(admin, "g", "Kept", 0, 0)
        changed: list[str] = []
        admin.processor.broker.on_topics_changed = lambda: changed.append("registered")
        response = await admin.call(RequestCode.DELETE_TOPIC_IN_BROKER, topic=TOPIC)
        assert response.code == ResponseCode.SUCCESS, response.remark
        assert changed == ["registered"]  # re-registered at once, without the topic
        for state in (admin.leader.state, admin.follower_state):
            assert TOPIC not in state.topics and "Kept" in state.topics
            assert state.consumer_offsets == {("g", "Kept", 0): 0}
        stats = await admin.call(RequestCode.GET_TOPIC_STATS_INFO, topic=TOPIC)
        assert stats.code == ResponseCode.TOPIC_NOT_EXIST
        again = await admin.call(RequestCode.DELETE_TOPIC_IN_BROKER, topic=TOPIC)
        assert again.code == ResponseCode.TOPIC_NOT_EXIST

    scenario(tmp_path, body)


def test_system_topics_are_not_deleted_and_nothing_is_proposed(tmp_path: Path) -> None:
    async def body(admin: Admin) -> None:
        before = len(admin.leader.proposals)
        for topic in ("TBW102", "SCHEDULE_TOPIC_XXXX", "RMQ_SYS_TRANS_HALF_TOPIC", "RMQ_SYS_TIMER_TOPIC"):
            response = await admin.request(RequestCode.DELETE_TOPIC_IN_BROKER, topic=topic)
            assert response.code == ResponseCode.SYSTEM_ERROR and "conflict with system topic" in (response.remark or "")
        assert len(admin.leader.proposals) == before

    scenario(tmp_path, body)


# ------------------------------------------------------------------------------------------ groups


def test_the_groups_listed_are_configured_committed_or_live(tmp_path: Path) -> None:
    async def body(admin: Admin) -> None:
        await create_topic(admin)
        await commit(admin, "committed", TOPIC, 0, 0)
        admin.leader.propose(Command((SubscriptionGroup("configured", retry_max_times=3),)))
        admin.go_online("live", "client-1", TOPIC)
        gone = admin.go_online("gone", "client-2", TOPIC)
        gone.is_closed = True
        response = await admin.call(RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG)
        table = json.loads(response.body)["subscriptionGroupTable"]
        assert sorted(table) == ["committed", "configured", "live"]
        assert table["configured"]["retryMaxTimes"] == 3 and table["live"]["retryMaxTimes"] == 16
        assert table["live"]["groupName"] == "live" and table["live"]["consumeEnable"] is True

    scenario(tmp_path, body)


# ------------------------------------------------------------------------------------------ reset


def offsets_of(response: RemotingCommand) -> dict[int, int]:
    assert response.code == ResponseCode.SUCCESS, response.remark
    table = loads_lenient(response.body.decode())["offsetTable"]
    return {queue_of_key(key).queue_id: int(value) for key, value in table.items()}


def test_a_reset_moves_every_read_queue_by_time_through_raft(tmp_path: Path) -> None:
    async def body(admin: Admin) -> None:
        await create_topic(admin)
        admin.leader.store_messages(0, [T, T + 10, T + 20, T + 30])
        admin.leader.store_messages(1, [T + 15])
        await commit(admin, "g", TOPIC, 0, 4)
        await commit(admin, "g", TOPIC, 1, 1)
        reset = await admin.call(RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, topic=TOPIC, group="g",
                                 timestamp=str(T + 11), isForce="true")
        assert offsets_of(reset) == {0: 2, 1: 0}
        for state in (admin.leader.state, admin.follower_state):  # replicated, not only the leader's
            assert state.consumer_offset("g", TOPIC, 0) == 2 and state.consumer_offset("g", TOPIC, 1) == 0
        latest = await admin.call(RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, topic=TOPIC, group="g",
                                  timestamp="-1", isForce="true")
        assert offsets_of(latest) == {0: 4, 1: 1}
        earliest = await admin.call(RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, topic=TOPIC, group="g",
                                    timestamp="0", isForce="true")
        assert offsets_of(earliest) == {0: 0, 1: 0}
        # Java's isForce=false: only back, never forward
        await commit(admin, "g", TOPIC, 0, 1)
        back_only = await admin.call(RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, topic=TOPIC, group="g",
                                     timestamp=str(T + 25), isForce="false")
        assert offsets_of(back_only) == {0: 1, 1: 0}
        # a group that never committed gets offsets too
        fresh = await admin.call(RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, topic=TOPIC, group="new",
                                 timestamp="-1", isForce="true")
        assert offsets_of(fresh) == {0: 4, 1: 1} and admin.follower_state.consumer_offset("new", TOPIC, 1) == 1

    scenario(tmp_path, body)


def test_a_reset_is_refused_while_the_group_consumes_the_topic(tmp_path: Path) -> None:
    async def body(admin: Admin) -> None:
        await create_topic(admin)
        await create_topic(admin, "Other")
        admin.leader.store_messages(0, [T, T + 10])
        await commit(admin, "g", TOPIC, 0, 2)
        admin.go_online("g", "client-1", TOPIC)
        before = len(admin.leader.proposals)
        refused = await admin.request(RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, topic=TOPIC, group="g",
                                      timestamp="0", isForce="true")
        assert refused.code == ResponseCode.SYSTEM_ERROR and refused.ext_fields[ONLINE_CONSUMERS_FIELD] == "client-1"
        assert "live consumer" in (refused.remark or "") and len(admin.leader.proposals) == before
        assert admin.follower_state.consumer_offset("g", TOPIC, 0) == 2
        # a member consuming other topics only holds no queue of this one
        other = await admin.call(RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, topic="Other", group="g",
                                 timestamp="0", isForce="true")
        assert offsets_of(other) == {0: 0, 1: 0}
        forced = await admin.call(RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, topic=TOPIC, group="g", timestamp="0",
                                  isForce="true", **{RESET_WHILE_ONLINE_FIELD: "true"})
        assert offsets_of(forced) == {0: 0, 1: 0}

    scenario(tmp_path, body)


def test_bad_resets_change_nothing(tmp_path: Path) -> None:
    async def body(admin: Admin) -> None:
        await create_topic(admin)
        await commit(admin, "g", TOPIC, 0, 0)
        before = len(admin.leader.proposals)
        cases = [
            ({"topic": "Missing", "group": "g", "timestamp": "0"}, ResponseCode.TOPIC_NOT_EXIST, "not exist"),
            ({"topic": "SCHEDULE_TOPIC_XXXX", "group": "g", "timestamp": "0"}, ResponseCode.SYSTEM_ERROR, "system"),
            ({"topic": TOPIC, "group": "g", "timestamp": "-2"}, ResponseCode.SYSTEM_ERROR, "timestamp"),
            ({"topic": TOPIC, "group": "g", "timestamp": "soon"}, ResponseCode.SYSTEM_ERROR, "timestamp"),
            ({"topic": TOPIC, "group": " ", "timestamp": "0"}, ResponseCode.SYSTEM_ERROR, "blank"),
            ({"topic": TOPIC, "group": "g"}, ResponseCode.SYSTEM_ERROR, "timestamp"),
            ({"topic": TOPIC, "group": "g", "timestamp": "0", "isForce": "maybe"}, ResponseCode.SYSTEM_ERROR, "isForce"),
        ]
        for fields, code, words in cases:
            response = await admin.request(RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, **fields)
            assert response.code == code and words in (response.remark or ""), (fields, response.remark)
        admin.leader.is_leader = False
        follower = await admin.request(RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, topic=TOPIC, group="g", timestamp="0")
        assert follower.code == ResponseCode.SERVICE_NOT_AVAILABLE
        assert len(admin.leader.proposals) == before

    scenario(tmp_path, body)


# ------------------------------------------------------------------------------------------ name server


def test_the_name_server_forgets_a_deleted_topic_of_one_cluster_or_all() -> None:
    routes = RouteTable()
    for cluster, name, port in (("c1", "a", 1), ("c1", "b", 2), ("c2", "c", 3)):
        routes.register_broker(cluster_name=cluster, broker_name=name, broker_address=f"127.0.0.1:{port}",
                               broker_id=0, ha_server_address="", data_version=DataVersion(0, 1), now_seconds=0.0,
                               topic_configs=[RouteTopicConfig(TOPIC), RouteTopicConfig("Kept")])
    assert routes.delete_topic(TOPIC, "c2")
    route = routes.topic_route(TOPIC)
    assert route is not None and [data.broker_name for data in route.queue_datas] == ["a", "b"]
    assert not routes.delete_topic(TOPIC, "elsewhere")
    assert routes.delete_topic(TOPIC) and routes.topic_route(TOPIC) is None
    assert not routes.delete_topic(TOPIC)
    assert routes.topics() == ["Kept"]

