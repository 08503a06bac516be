"""Client links of a proxied chaos group: every broker advertises its Toxiproxy proxy, so clients that find
brokers through the name server reach them only through those proxies (and a cut there is a real cut),
while the members keep listening on their own addresses.

One real three-member group (the proxies live on the session's in-process Toxiproxy server); free ports
at run time, every wait is a poll with a deadline, and the group is stopped whatever happens."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from chaos.cluster import ChaosCluster
from chaos.toxiproxy_control import ToxiproxyHandle, get_proxy, heal, partition
from chaos.toxiproxy_server import ToxiproxyServer
from cli.cluster import node_status, request
from client import ClientConfig, Message, MQClientError, Producer, ProducerConfig
from protocol.codes import RequestCode, ResponseCode
from tests.support.stores import small_store
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow

WAIT_SECONDS = 30.0


def route_addresses(namesrv: str, topic: str) -> dict[int, str]:
    code, _, body = request(namesrv, RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})
    if code != ResponseCode.SUCCESS:
        return {}
    (broker,) = json.loads(body)["brokerDatas"]
    return {int(broker_id): address for broker_id, address in broker["brokerAddrs"].items()}


@pytest.fixture
def cluster(tmp_path: Path, toxiproxy_server: ToxiproxyServer, toxiproxy: object) -> Iterator[ChaosCluster]:
    handle = ToxiproxyHandle(toxiproxy_server.host, toxiproxy_server.port)
    with ChaosCluster.start(tmp_path / "cluster", 3, handle, overrides=small_store()) as started:
        yield started


def test_the_name_server_and_the_members_name_brokers_by_their_proxies(cluster: ChaosCluster) -> None:
    proxies = {link.node_id: link for link in cluster.client_links}
    assert sorted(proxies) == ["n0", "n1", "n2"]
    for node in cluster.local.info.nodes:
        link = cluster.client_link(node.id)
        assert link.upstream == node.broker_address and link.listen == node.client_address != node.broker_address
        assert cluster.node_by_address(link.listen) == node.id == cluster.node_by_address(node.broker_address)
    # every member registers (followers too): the route names each by its proxy, the leader as id 0
    routes = wait_for(lambda: found if len(found := route_addresses(cluster.namesrv, "TBW102")) == 3 else None,
                      "every member to register", timeout_seconds=WAIT_SECONDS)
    assert set(routes.values()) == {link.listen for link in proxies.values()}
    leader = cluster.local.leader_id()
    assert leader is not None and routes[0] == proxies[leader].listen
    for node in cluster.local.info.nodes:
        status = node_status(node)  # asked directly: the member listens on its own address
        assert status is not None
        assert status["brokerAddress"] == proxies[node.id].listen and status["listenAddress"] == node.broker_address
    # a follower, reached through its proxy, forwards a write to the leader (through the leader's proxy: the
    # address it names the leader by; broker.forwarding)
    follower = next(link for node_id, link in proxies.items() if node_id != leader)
    code, fields, _ = request(follower.listen, RequestCode.UPDATE_AND_CREATE_TOPIC,
                              {"topic": "Forwarded", "readQueueNums": "1", "writeQueueNums": "1", "perm": "6"})
    assert code == ResponseCode.SUCCESS, fields


def test_a_send_fails_while_the_client_links_are_disabled_and_succeeds_once_enabled(cluster: ChaosCluster) -> None:
    handle = cluster.toxiproxy
    assert handle is not None
    client = ClientConfig((cluster.namesrv,), request_timeout_seconds=1.0, connect_timeout_seconds=1.0,
                          instance_name="client-links")
    with Producer(client, ProducerConfig(group="client-links", send_timeout_seconds=3.0)) as producer:
        before = producer.send(Message("ClientLinks", b"before"))
        assert before.broker_address in {link.listen for link in cluster.client_links}
        for link in cluster.client_links:
            partition(handle, link.name, "disable")
            assert get_proxy(handle, link.name).enabled is False
        with pytest.raises(MQClientError):
            producer.send(Message("ClientLinks", b"cut off"))
        # the members are up and the group has a leader: only the clients' way in is closed
        assert wait_for(lambda: cluster.local.leader_id(), "a leader answering directly",
                        timeout_seconds=WAIT_SECONDS) in cluster.node_ids
        for link in cluster.client_links:
            heal(handle, link.name)
        after = producer.send(Message("ClientLinks", b"after"))
        assert after.broker_address in {link.listen for link in cluster.client_links}
        assert after.queue_offset >= 1 or after.message_queue != before.message_queue
