"""``[broker] front_address``: with a front (a load balancer in front of every member, cli.front), the leader
registers the front as the group's brokerId 0, marked shared, so the name server keeps it when that leader's
connection closes (it died: the front still reaches the group) and the leader does not unregister it when it
stops. Followers register themselves. A real name server on a free loopback port; no broker processes."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from broker.config import BrokerConfig, load_node_file
from broker.namesrv import NameServer, NameServerConfig
from broker.registration import Registrar
from commitlog.config import ConfigError
from protocol.client import RemotingClient
from protocol.codes import RequestCode, ResponseCode
from protocol.route_data import MASTER_ID
from protocol.route_data import TopicConfig as RouteTopicConfig
from tests.broker.helpers import LOOPBACK, NODE_FILE_HEAD, run
from tests.support.waiting import poll_until

FRONT, LEADER, FOLLOWER = "127.0.0.1:30900", "127.0.0.1:10911", "127.0.0.1:10921"
NODE = NODE_FILE_HEAD + f"""listen_address = "{LEADER}"
front_address = "{FRONT}"
namesrv = ["127.0.0.1:9876"]
"""


def config_with_front(tmp_path: Path) -> BrokerConfig:
    path = tmp_path / "node.toml"
    path.write_text(NODE)
    return load_node_file(path)[1]


def test_the_leader_registers_the_front_which_outlives_it_and_followers_register_themselves(tmp_path: Path) -> None:
    config = config_with_front(tmp_path)
    assert config.front_address == FRONT

    async def scenario() -> None:
        name_server = NameServer(NameServerConfig.from_mapping({"host": LOOPBACK, "port": 0}))
        await name_server.start()
        namesrv = f"{LOOPBACK}:{name_server.port}"
        topics = [RouteTopicConfig("Orders", 4, 4)]
        leading = [False]
        leader = Registrar(dataclasses.replace(config, namesrv=(namesrv,)), lambda: (leading[0], topics, 1, 3))
        follower = Registrar(dataclasses.replace(config, namesrv=(namesrv,), listen_address=FOLLOWER, broker_id=2),
                             lambda: (False, topics, 1, 3))
        client = await RemotingClient.connect(LOOPBACK, name_server.port)

        async def addresses() -> dict[int, str]:
            """The group's addresses by brokerId, as GET_BROKER_CLUSTER_INFO gives them."""
            response = await client.request(RequestCode.GET_BROKER_CLUSTER_INFO)
            assert response.code == ResponseCode.SUCCESS, response.remark
            groups = json.loads(response.body)["brokerAddrTable"]
            return {int(key): value for key, value in groups[config.broker_name]["brokerAddrs"].items()} if groups else {}

        try:
            await leader.register_all()  # as a follower first: itself, under its own id
            assert await addresses() == {1: LEADER}
            leading[0] = True
            await leader.register_all()  # then, elected, the group's front as brokerId 0
            await follower.register_all()
            assert await addresses() == {1: LEADER, MASTER_ID: FRONT, 2: FOLLOWER}
            # the leader dies: its connection closes, the name server forgets what came over it, not the front
            for each in leader._clients.values():
                await each.close()
            await poll_until(lambda: LEADER not in name_server.routes.live_addresses(),
                             "the leader forgotten", timeout_seconds=5.0)
            assert await addresses() == {MASTER_ID: FRONT, 2: FOLLOWER}
            # a leader that stops does not unregister the group's address; a follower unregisters itself
            await leader.stop()
            await follower.stop()
            assert await addresses() == {MASTER_ID: FRONT}
        finally:
            await leader.stop()
            await follower.stop()
            await client.close()
            await name_server.stop()

    run(scenario())


def test_follower_front_hosts_are_ip_addresses(tmp_path: Path) -> None:
    """``[broker] follower_front_hosts``: where a front routing to followers connects from (broker.front_moves)."""
    path = tmp_path / "node.toml"
    path.write_text(NODE + 'follower_front_hosts = ["127.0.0.2", "::1"]\n')
    assert load_node_file(path)[1].follower_front_hosts == ("127.0.0.2", "::1")
    for bad in ('["front.example"]', '[2]', '"not-an-ip"'):
        path.write_text(NODE + f"follower_front_hosts = {bad}\n")
        with pytest.raises(ConfigError, match="follower_front_hosts"):
            load_node_file(path)
