"""The name server's route table, without sockets: registration, leader replacement, expiry, limits."""

from __future__ import annotations

import pytest

from broker.namesrv import RouteLimitError, RouteTable
from broker.namesrv.route_table import StaleLeaderError
from protocol.route_data import MASTER_ID, PERM_READ, PERM_WRITE, DataVersion, TopicConfig

CLUSTER = "DefaultCluster"
GROUP = "raft-group-a"
LEADER, FOLLOWER_ONE, FOLLOWER_TWO = "127.0.0.1:10911", "127.0.0.1:10921", "127.0.0.1:10931"
TOPICS = (TopicConfig("orders", 4, 4), TopicConfig("audit", 2, 2, PERM_READ))


def register(
    table: RouteTable,
    address: str,
    broker_id: int,
    now: float,
    *,
    group: str = GROUP,
    topics: tuple[TopicConfig, ...] = TOPICS,
    connection_id: int | None = None,
) -> None:
    table.register_broker(
        cluster_name=CLUSTER,
        broker_name=group,
        broker_address=address,
        broker_id=broker_id,
        ha_server_address=address.replace("109", "209"),
        topic_configs=topics,
        data_version=DataVersion(timestamp=1, counter=1),
        now_seconds=now,
        connection_id=connection_id,
    )


def addresses(table: RouteTable, topic: str = "orders") -> dict[int, str]:
    route = table.topic_route(topic)
    assert route is not None
    (broker_data,) = route.broker_datas
    return dict(broker_data.broker_addresses)


def group_of_three(now: float = 0.0) -> RouteTable:
    table = RouteTable()
    register(table, LEADER, MASTER_ID, now)
    register(table, FOLLOWER_ONE, 1, now)
    register(table, FOLLOWER_TWO, 2, now)
    return table


def test_route_lists_queues_and_addresses_of_the_group() -> None:
    table = group_of_three()
    route = table.topic_route("orders")
    assert route is not None
    (queue_data,) = route.queue_datas
    assert (queue_data.broker_name, queue_data.read_queue_nums, queue_data.write_queue_nums) == (GROUP, 4, 4)
    assert queue_data.perm == PERM_READ | PERM_WRITE
    (broker_data,) = route.broker_datas
    assert broker_data.cluster == CLUSTER
    assert broker_data.master_address == LEADER
    assert dict(broker_data.broker_addresses) == {0: LEADER, 1: FOLLOWER_ONE, 2: FOLLOWER_TWO}
    audit = table.topic_route("audit")
    assert audit is not None and audit.queue_datas[0].perm == PERM_READ
    assert table.topics() == ["audit", "orders"]


def test_unknown_topic_has_no_route() -> None:
    assert group_of_three().topic_route("nope") is None
    assert RouteTable().topic_route("orders") is None


def test_only_the_master_registration_sets_queues() -> None:
    table = RouteTable()
    register(table, FOLLOWER_ONE, 1, 0.0, topics=(TopicConfig("orders", 8, 8),))
    assert table.topic_route("orders") is None
    register(table, LEADER, MASTER_ID, 0.0, topics=(TopicConfig("orders", 4, 4),))
    route = table.topic_route("orders")
    assert route is not None and route.queue_datas[0].write_queue_nums == 4


def test_slave_learns_its_live_master() -> None:
    table = RouteTable()
    result = table.register_broker(
        cluster_name=CLUSTER,
        broker_name=GROUP,
        broker_address=FOLLOWER_ONE,
        broker_id=1,
        ha_server_address="x",
        topic_configs=(),
        data_version=DataVersion(),
        now_seconds=0.0,
    )
    assert result.master_address is None
    register(table, LEADER, MASTER_ID, 0.0)
    result = table.register_broker(
        cluster_name=CLUSTER,
        broker_name=GROUP,
        broker_address=FOLLOWER_ONE,
        broker_id=1,
        ha_server_address="x",
        topic_configs=(),
        data_version=DataVersion(),
        now_seconds=1.0,
    )
    assert result.master_address == LEADER
    assert result.ha_server_address == "127.0.0.1:20911"


def test_new_leader_registering_as_zero_replaces_the_old_leader() -> None:
    table = group_of_three()
    # follower one wins the election and registers as the master at once
    register(table, FOLLOWER_ONE, MASTER_ID, 5.0)
    assert addresses(table) == {0: FOLLOWER_ONE, 2: FOLLOWER_TWO}
    # the old leader comes back as a follower under its own id
    register(table, LEADER, 1, 6.0)
    assert addresses(table) == {0: FOLLOWER_ONE, 1: LEADER, 2: FOLLOWER_TWO}
    # the old leader's stale unregistration of id 0 must not remove its successor
    assert not table.unregister_broker(
        cluster_name=CLUSTER, broker_name=GROUP, broker_address=LEADER, broker_id=0
    )
    assert addresses(table)[0] == FOLLOWER_ONE


def test_unregister_removes_the_address_and_an_emptied_group() -> None:
    table = group_of_three()
    assert table.unregister_broker(
        cluster_name=CLUSTER, broker_name=GROUP, broker_address=FOLLOWER_TWO, broker_id=2
    )
    assert addresses(table) == {0: LEADER, 1: FOLLOWER_ONE}
    for address, broker_id in ((FOLLOWER_ONE, 1), (LEADER, 0)):
        table.unregister_broker(
            cluster_name=CLUSTER, broker_name=GROUP, broker_address=address, broker_id=broker_id
        )
    assert table.topic_route("orders") is None
    assert table.topics() == []
    info = table.cluster_info()
    assert dict(info.broker_datas) == {} and dict(info.cluster_broker_names) == {}
    assert table.live_addresses() == []


def test_brokers_expire_after_the_expiry_period_without_registration() -> None:
    table = group_of_three(now=0.0)
    register(table, LEADER, MASTER_ID, 100.0)
    register(table, FOLLOWER_ONE, 1, 100.0)
    assert table.expire_brokers(now_seconds=120.0, expiry_seconds=120.0) == []
    # follower two last registered at 0: silent for more than 120 s at 120.5
    assert table.expire_brokers(now_seconds=120.5, expiry_seconds=120.0) == [FOLLOWER_TWO]
    assert addresses(table) == {0: LEADER, 1: FOLLOWER_ONE}
    assert table.expire_brokers(now_seconds=221.0, expiry_seconds=120.0) == [LEADER, FOLLOWER_ONE]
    assert table.topic_route("orders") is None


def test_expiry_of_a_displaced_leader_leaves_its_successor() -> None:
    table = group_of_three(now=0.0)
    register(table, FOLLOWER_ONE, MASTER_ID, 100.0)
    register(table, FOLLOWER_TWO, 2, 100.0)
    # the old leader died without unregistering: its live entry goes, the new id 0 stays
    assert table.expire_brokers(now_seconds=121.0, expiry_seconds=120.0) == [LEADER]
    assert addresses(table) == {0: FOLLOWER_ONE, 2: FOLLOWER_TWO}


def test_closed_connection_removes_the_brokers_registered_over_it() -> None:
    table = RouteTable()
    register(table, LEADER, MASTER_ID, 0.0, connection_id=7)
    register(table, FOLLOWER_ONE, 1, 0.0, connection_id=8)
    assert table.remove_connection(8) == [FOLLOWER_ONE]
    assert table.remove_connection(99) == []
    assert addresses(table) == {0: LEADER}
    # re-registered over a new connection: closing the old one changes nothing
    register(table, LEADER, MASTER_ID, 1.0, connection_id=9)
    assert table.remove_connection(7) == []
    assert addresses(table) == {0: LEADER}


def test_a_shared_front_address_outlives_the_connection_of_the_leader_that_registered_it() -> None:
    front = "127.0.0.1:10900"
    table = RouteTable()
    for connection_id, term in ((7, 1), (8, 2)):  # a leader, then its successor, register the group's front
        table.register_broker(cluster_name=CLUSTER, broker_name=GROUP, broker_address=front, broker_id=MASTER_ID,
                              ha_server_address=front, topic_configs=TOPICS,
                              data_version=DataVersion(timestamp=1, counter=1), now_seconds=0.0,
                              connection_id=connection_id, raft_term=term, shared=True)
        assert table.remove_connection(connection_id) == []  # the member died, the group's address stays
    register(table, FOLLOWER_ONE, 1, 0.0, connection_id=9)
    assert addresses(table) == {0: front, 1: FOLLOWER_ONE}
    assert table.remove_connection(9) == [FOLLOWER_ONE]
    # expiry still applies: a front no member registers any more goes
    assert table.expire_brokers(now_seconds=121.0, expiry_seconds=120.0) == [front]


def test_several_groups_share_a_topic() -> None:
    table = RouteTable()
    register(table, LEADER, MASTER_ID, 0.0, group="group-b")
    register(table, FOLLOWER_ONE, MASTER_ID, 0.0, group="group-a")
    route = table.topic_route("orders")
    assert route is not None
    assert [queue_data.broker_name for queue_data in route.queue_datas] == ["group-a", "group-b"]
    assert [broker_data.broker_name for broker_data in route.broker_datas] == ["group-a", "group-b"]
    assert dict(table.cluster_info().cluster_broker_names) == {CLUSTER: ("group-a", "group-b")}


def test_limits_refuse_without_changing_anything() -> None:
    table = RouteTable(broker_addresses_max=2, topics_max=2)
    register(table, LEADER, MASTER_ID, 0.0)
    register(table, FOLLOWER_ONE, 1, 0.0)
    with pytest.raises(RouteLimitError, match="broker_addresses_max"):
        register(table, FOLLOWER_TWO, 2, 0.0)
    register(table, LEADER, MASTER_ID, 1.0)  # a known address re-registers freely
    with pytest.raises(RouteLimitError, match="topics_max"):
        register(table, LEADER, MASTER_ID, 2.0, topics=(TopicConfig("third"),))
    assert table.topics() == ["audit", "orders"]
    assert addresses(table) == {0: LEADER, 1: FOLLOWER_ONE}


def test_a_deposed_leader_cannot_take_the_master_id_back() -> None:
    table = RouteTable()

    def claim(address: str, term: int) -> None:
        table.register_broker(cluster_name=CLUSTER, broker_name=GROUP, broker_address=address,
                              broker_id=MASTER_ID, ha_server_address=address, topic_configs=TOPICS,
                              data_version=DataVersion(), now_seconds=0.0, raft_term=term)

    claim(LEADER, 3)
    claim(FOLLOWER_ONE, 4)  # elected in term 4
    with pytest.raises(StaleLeaderError):
        claim(LEADER, 3)  # the old leader's timer fires before it learns it was deposed
    assert addresses(table)[MASTER_ID] == FOLLOWER_ONE
    register(table, LEADER, 1, 0.0)  # once it steps down it registers under its own id
    assert addresses(table) == {MASTER_ID: FOLLOWER_ONE, 1: LEADER}
    claim(LEADER, 5)  # and leads again after a later election
    assert addresses(table)[MASTER_ID] == LEADER
