"""``[broker] advertised_address``: the address that names a broker to clients (registration with the name
server, the ``leaderAddress`` a follower hands out, admin runtime info), while the server listens on
``listen_address``. No broker processes: the config is loaded from a node file, the registration talks to
a real name server on a free loopback port, the not-leader answer comes from a context over a stand-in
member."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, cast

import pytest

from broker.config import BrokerConfig, load_node_file
from broker.context import BrokerContext
from broker.namesrv import (
    NameServer,
    NameServerConfig,
    RegisterBrokerRequestHeader,
    RegisterBrokerResponseHeader,
)
from broker.registration import Registrar
from commitlog.config import ConfigError
from dledger.member import GroupMember, MemberStatus
from dledger.stages import StageHistograms
from protocol.client import RemotingClient
from protocol.codes import RequestCode, ResponseCode
from protocol.route_data import MASTER_ID, TopicRouteData
from protocol.route_data import TopicConfig as RouteTopicConfig
from tests.broker.helpers import LOOPBACK, NODE_FILE_HEAD, run

LISTEN, ADVERTISED = "127.0.0.1:10911", "127.0.0.1:30911"
PEER_ADVERTISED = "127.0.0.1:30921"
NODE = NODE_FILE_HEAD + """listen_address = "127.0.0.1:10911"
advertised_address = "127.0.0.1:30911"
namesrv = ["127.0.0.1:9876"]

[broker.peer_addresses]
n1 = "127.0.0.1:30921"
"""


def load(tmp_path: Path, text: str) -> tuple[Any, BrokerConfig]:
    path = tmp_path / "node.toml"
    path.write_text(text)
    return load_node_file(path)


# ------------------------------------------------------------------------------------------ config


def test_advertised_address_defaults_to_the_listen_address(tmp_path: Path) -> None:
    _, broker = load(tmp_path, NODE.replace('advertised_address = "127.0.0.1:30911"\n', ""))
    assert broker.advertised_address == "" and broker.announced_address == LISTEN
    _, broker = load(tmp_path, NODE)
    assert broker.listen_address == LISTEN and broker.announced_address == ADVERTISED


@pytest.mark.parametrize(("value", "message"), [
    ('"nowhere"', "broker.advertised_address must be 'host:port'"),
    ('"127.0.0.1:0"', "broker.advertised_address must have a port in 1..65535"),
    ('"127.0.0.1:65536"', "broker.advertised_address must have a port"),
    ('"broker_example:10911"', "broker.advertised_address must have an IPv4 address, a host name or a bracketed"),
    ('"::1:10911"', "broker.advertised_address an IPv6 host goes between brackets"),
    ('"[::]:10911"', "clients can connect to, not the wildcard"),
    ('"0.0.0.0:10911"', "clients can connect to, not the wildcard"),
    ('""', "leave it out to advertise listen_address"),
    ("10911", "broker.advertised_address must be 'host:port'"),
    ('["127.0.0.1:1"]', "broker.advertised_address must be 'host:port'"),
])
def test_a_bad_advertised_address_is_refused_naming_the_field(tmp_path: Path, value: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", "\\(").replace(".", "\\.")):
        load(tmp_path, NODE.replace('advertised_address = "127.0.0.1:30911"', f"advertised_address = {value}"))


def test_a_listen_address_on_every_interface_may_advertise_a_reachable_one(tmp_path: Path) -> None:
    _, broker = load(tmp_path, NODE.replace('listen_address = "127.0.0.1:10911"', 'listen_address = "0.0.0.0:10911"'))
    assert broker.listen_address == "0.0.0.0:10911" and broker.announced_address == ADVERTISED


# ------------------------------------------------------------------------------------ registration


def test_registration_and_unregistration_carry_the_advertised_address(tmp_path: Path) -> None:
    _, leader_config = load(tmp_path, NODE)

    async def scenario() -> None:
        # brokers are kept when their connection closes: only the unregistration itself may remove one
        name_server = NameServer(NameServerConfig.from_mapping(
            {"host": LOOPBACK, "port": 0, "forget_brokers_on_disconnect": False}))
        await name_server.start()
        namesrv = f"{LOOPBACK}:{name_server.port}"
        config = dataclasses.replace(leader_config, namesrv=(namesrv,))
        topics = [RouteTopicConfig("Orders", 4, 4)]
        registrar = Registrar(config, lambda: (True, topics, 1, 3))
        client = await RemotingClient.connect(LOOPBACK, name_server.port)
        try:
            await registrar.register_all()
            assert registrar.registered_as_leader is True
            response = await client.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "Orders"})
            assert response.code == ResponseCode.SUCCESS, response.remark
            (broker_data,) = TopicRouteData.decode(response.body).broker_datas
            assert dict(broker_data.broker_addresses) == {MASTER_ID: ADVERTISED}
            # a follower registering learns the leader's advertised HA address, not its listen address
            follower = RegisterBrokerRequestHeader(
                broker_name=config.broker_name, broker_address=PEER_ADVERTISED, cluster_name=config.cluster_name,
                ha_server_address=PEER_ADVERTISED, broker_id=1, body_crc32=0)
            answer = await client.request(RequestCode.REGISTER_BROKER, follower.to_ext_fields())
            assert answer.code == ResponseCode.SUCCESS, answer.remark
            assert RegisterBrokerResponseHeader.from_ext_fields(answer.ext_fields) == RegisterBrokerResponseHeader(
                ha_server_address=ADVERTISED, master_address=ADVERTISED)
            await registrar.stop()  # unregisters under the same (advertised) address
            response = await client.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "Orders"})
            (broker_data,) = TopicRouteData.decode(response.body).broker_datas
            assert dict(broker_data.broker_addresses) == {1: PEER_ADVERTISED}
        finally:
            await registrar.stop()
            await client.close()
            await name_server.stop()

    run(scenario())


# ------------------------------------------------------------------------------------- not leader


class StandInMember:
    """What BrokerContext asks a member about leadership, and nothing else."""

    def __init__(self, is_leader: bool, leader: str | None) -> None:
        self.is_leader = is_leader
        self.leader = leader
        self.stages = StageHistograms()

    def status(self) -> MemberStatus:
        return MemberStatus("n0", "leader" if self.is_leader else "follower", 3, self.leader, 0, 0, 0, 0)

    def leader_name(self) -> str | None:
        return self.leader


def test_a_follower_names_the_leader_by_its_advertised_address(tmp_path: Path) -> None:
    node, config = load(tmp_path, NODE)
    follower = BrokerContext(node, config, cast(GroupMember, StandInMember(False, "127.0.0.1:20921")))
    error = follower.not_leader()
    assert error.code == ResponseCode.SERVICE_NOT_AVAILABLE
    assert error.ext_fields == {"leaderAddress": PEER_ADVERTISED}
    assert ADVERTISED in error.remark and LISTEN not in error.remark
    assert follower.not_leader("127.0.0.1:20921").ext_fields == {"leaderAddress": PEER_ADVERTISED}
    leader = BrokerContext(node, config, cast(GroupMember, StandInMember(True, "127.0.0.1:20911")))
    assert leader.leader_address() == ADVERTISED
