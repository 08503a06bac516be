"""The name server over real loopback connections, with an injected clock for expiry."""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from broker.namesrv import (
    DeleteTopicRequestHeader,
    GetRouteInfoRequestHeader,
    NameServer,
    NameServerConfig,
    RegisterBrokerRequestHeader,
    RegisterBrokerResponseHeader,
    UnregisterBrokerRequestHeader,
)
from protocol.client import RemotingClient
from protocol.codes import RequestCode, ResponseCode
from protocol.command import RemotingCommand
from protocol.route_data import (
    MASTER_ID,
    ClusterInfo,
    DataVersion,
    InvalidRequestError,
    RegisterBrokerBody,
    TopicConfig,
    TopicRouteData,
    decode_topic_list,
    java_crc32,
)
from tests.broker.helpers import LOOPBACK, RawConnection, run
from tests.support.waiting import poll_until

CLUSTER = "DefaultCluster"
GROUP = "raft-group-a"
LEADER, FOLLOWER_ONE, FOLLOWER_TWO = "127.0.0.1:10911", "127.0.0.1:10921", "127.0.0.1:10931"
BODY = RegisterBrokerBody(
    topic_configs=(TopicConfig("orders", 4, 4), TopicConfig("TBW102", 8, 8, 7)),
    data_version=DataVersion(timestamp=1_700_000_000_000, counter=3),
)


class FakeClock:
    def __init__(self) -> None:
        self.now_seconds = 1000.0

    def __call__(self) -> float:
        return self.now_seconds


@asynccontextmanager
async def running_name_server(clock: FakeClock, **settings: object) -> AsyncIterator[NameServer]:
    config = NameServerConfig.from_mapping({"host": LOOPBACK, "port": 0, **settings})
    name_server = NameServer(config, clock=clock)
    await name_server.start()
    try:
        yield name_server
    finally:
        await name_server.stop()


def register_header(
    address: str, broker_id: int, *, body: bytes = b"", compressed: bool = False
) -> dict[str, str]:
    return RegisterBrokerRequestHeader(
        broker_name=GROUP,
        broker_address=address,
        cluster_name=CLUSTER,
        ha_server_address=address.replace("109", "209"),
        broker_id=broker_id,
        compressed=compressed,
        body_crc32=java_crc32(body) if body else 0,
    ).to_ext_fields()


async def register(
    client: RemotingClient, address: str, broker_id: int, body: bytes | None = None
) -> RemotingCommand:
    payload = BODY.encode() if body is None else body
    response = await client.request(
        RequestCode.REGISTER_BROKER, register_header(address, broker_id, body=payload), payload
    )
    return response


async def route(client: RemotingClient, topic: str = "orders") -> RemotingCommand:
    return await client.request(
        RequestCode.GET_ROUTEINFO_BY_TOPIC, GetRouteInfoRequestHeader(topic).to_ext_fields()
    )


async def route_addresses(client: RemotingClient, topic: str = "orders") -> dict[int, str]:
    response = await route(client, topic)
    assert response.code == ResponseCode.SUCCESS, response.remark
    (broker_data,) = TopicRouteData.decode(response.body).broker_datas
    return dict(broker_data.broker_addresses)


# -------------------------------------------------------------------------------------------- routes


def test_register_then_route_is_standard_json_with_quoted_ids() -> None:
    async def scenario() -> None:
        async with running_name_server(FakeClock()) as name_server:
            client = await RemotingClient.connect(LOOPBACK, name_server.port)
            leader = await register(client, LEADER, MASTER_ID)
            assert leader.code == ResponseCode.SUCCESS
            assert dict(leader.ext_fields) == {}  # a master learns nothing
            follower = await register(client, FOLLOWER_ONE, 1, body=b"")
            assert RegisterBrokerResponseHeader.from_ext_fields(
                follower.ext_fields
            ) == RegisterBrokerResponseHeader(ha_server_address="127.0.0.1:20911", master_address=LEADER)
            response = await route(client)
            assert response.code == ResponseCode.SUCCESS
            root = json.loads(response.body)  # the standard parser, no fastjson leniency needed
            assert root == {
                "queueDatas": [
                    {
                        "brokerName": GROUP,
                        "readQueueNums": 4,
                        "writeQueueNums": 4,
                        "perm": 6,
                        "topicSysFlag": 0,
                    }
                ],
                "brokerDatas": [
                    {"cluster": CLUSTER, "brokerName": GROUP, "brokerAddrs": {"0": LEADER, "1": FOLLOWER_ONE}}
                ],
                "filterServerTable": {},
            }
            decoded = TopicRouteData.decode(response.body)
            assert decoded.broker_datas[0].master_address == LEADER
            await client.close()

    run(scenario())


def test_unknown_topic_answers_topic_not_exist() -> None:
    async def scenario() -> None:
        async with running_name_server(FakeClock()) as name_server:
            client = await RemotingClient.connect(LOOPBACK, name_server.port)
            response = await route(client, "nobody-serves-this")
            assert response.code == ResponseCode.TOPIC_NOT_EXIST
            assert response.remark is not None and "nobody-serves-this" in response.remark
            await client.close()

    run(scenario())


def test_every_response_ext_field_is_a_json_string_on_the_wire() -> None:
    async def scenario() -> None:
        async with running_name_server(FakeClock()) as name_server:
            client = await RemotingClient.connect(LOOPBACK, name_server.port)
            await register(client, LEADER, MASTER_ID)
            raw = await RawConnection.open(name_server.port)
            # the broker id as a JSON number, as the C++ client mixes numbers and strings
            header = {
                "code": RequestCode.REGISTER_BROKER,
                "language": "CPP",
                "version": 63,
                "opaque": 77,
                "flag": 0,
                "extFields": {**register_header(FOLLOWER_ONE, 1), "brokerId": 1},
            }
            header_bytes = json.dumps(header).encode()
            await raw.send(struct.pack(">iI", 4 + len(header_bytes), len(header_bytes)) + header_bytes)
            frame = await raw.read_frame()
            assert frame.command.opaque == 77 and frame.command.code == ResponseCode.SUCCESS
            assert frame.header_json is not None
            ext_fields = frame.header_json["extFields"]
            assert isinstance(ext_fields, dict) and set(ext_fields) == {"haServerAddr", "masterAddr"}
            assert all(isinstance(value, str) for value in ext_fields.values())
            await raw.close()
            await client.close()

    run(scenario())


def test_leader_change_is_visible_on_the_next_route_fetch() -> None:
    async def scenario() -> None:
        async with running_name_server(FakeClock()) as name_server:
            client = await RemotingClient.connect(LOOPBACK, name_server.port)
            for address, broker_id in ((LEADER, 0), (FOLLOWER_ONE, 1), (FOLLOWER_TWO, 2)):
                assert (await register(client, address, broker_id)).code == ResponseCode.SUCCESS
            assert await route_addresses(client) == {0: LEADER, 1: FOLLOWER_ONE, 2: FOLLOWER_TWO}
            # follower two becomes leader and re-registers as brokerId 0 on the role change
            assert (await register(client, FOLLOWER_TWO, MASTER_ID)).code == ResponseCode.SUCCESS
            assert await route_addresses(client) == {0: FOLLOWER_TWO, 1: FOLLOWER_ONE}
            # the old leader, back as a follower under its own id, learns the new master
            response = await register(client, LEADER, 3)
            assert response.ext_fields.get("masterAddr") == FOLLOWER_TWO
            assert await route_addresses(client) == {0: FOLLOWER_TWO, 1: FOLLOWER_ONE, 3: LEADER}
            await client.close()

    run(scenario())


def test_brokers_expire_by_the_injected_clock() -> None:
    clock = FakeClock()

    async def scenario() -> None:
        async with running_name_server(clock, broker_expiry_seconds=120.0) as name_server:
            client = await RemotingClient.connect(LOOPBACK, name_server.port)
            await register(client, LEADER, MASTER_ID)
            await register(client, FOLLOWER_ONE, 1)
            clock.now_seconds += 100.0
            await register(client, FOLLOWER_ONE, 1)  # the follower keeps heart-beating
            assert name_server.expire_inactive_brokers() == []
            clock.now_seconds += 20.5  # the leader has been silent for 120.5 s
            assert name_server.expire_inactive_brokers() == [LEADER]
            assert await route_addresses(client) == {1: FOLLOWER_ONE}
            clock.now_seconds += 121.0
            assert name_server.expire_inactive_brokers() == [FOLLOWER_ONE]
            assert (await route(client)).code == ResponseCode.TOPIC_NOT_EXIST
            await client.close()

    run(scenario())


def test_unregister_removes_the_broker() -> None:
    async def scenario() -> None:
        async with running_name_server(FakeClock()) as name_server:
            client = await RemotingClient.connect(LOOPBACK, name_server.port)
            await register(client, LEADER, MASTER_ID)
            await register(client, FOLLOWER_ONE, 1)
            header = UnregisterBrokerRequestHeader(GROUP, FOLLOWER_ONE, CLUSTER, 1).to_ext_fields()
            assert (await client.request(RequestCode.UNREGISTER_BROKER, header)).code == ResponseCode.SUCCESS
            assert await route_addresses(client) == {0: LEADER}
            header = UnregisterBrokerRequestHeader(GROUP, LEADER, CLUSTER, 0).to_ext_fields()
            assert (await client.request(RequestCode.UNREGISTER_BROKER, header)).code == ResponseCode.SUCCESS
            assert (await route(client)).code == ResponseCode.TOPIC_NOT_EXIST
            await client.close()

    run(scenario())


def test_delete_topic_removes_its_route_until_a_registration_brings_it_back() -> None:
    async def scenario() -> None:
        async with running_name_server(FakeClock()) as name_server:
            client = await RemotingClient.connect(LOOPBACK, name_server.port)
            await register(client, LEADER, MASTER_ID)
            other_cluster = DeleteTopicRequestHeader("orders", "ElsewhereCluster").to_ext_fields()
            assert (await client.request(RequestCode.DELETE_TOPIC_IN_NAMESRV, other_cluster)).code == ResponseCode.SUCCESS
            assert (await route(client)).code == ResponseCode.SUCCESS  # not a group of that cluster
            header = DeleteTopicRequestHeader("orders").to_ext_fields()
            assert (await client.request(RequestCode.DELETE_TOPIC_IN_NAMESRV, header)).code == ResponseCode.SUCCESS
            assert (await route(client)).code == ResponseCode.TOPIC_NOT_EXIST
            assert (await client.request(RequestCode.DELETE_TOPIC_IN_NAMESRV, header)).code == ResponseCode.SUCCESS
            missing = await client.request(RequestCode.DELETE_TOPIC_IN_NAMESRV, {})
            assert missing.code == ResponseCode.SYSTEM_ERROR and "'topic' is missing" in (missing.remark or "")
            # as Java's: a broker that still holds the topic registers it again (delete on the brokers first)
            await register(client, LEADER, MASTER_ID)
            assert await route_addresses(client) == {0: LEADER}
            await client.close()

    run(scenario())


def test_broker_is_forgotten_when_its_connection_closes() -> None:
    async def scenario() -> None:
        async with running_name_server(FakeClock()) as name_server:
            reader = await RemotingClient.connect(LOOPBACK, name_server.port)
            leader = await RemotingClient.connect(LOOPBACK, name_server.port)
            follower = await RemotingClient.connect(LOOPBACK, name_server.port)
            await register(leader, LEADER, MASTER_ID)
            await register(follower, FOLLOWER_ONE, 1)
            await follower.close()
            await poll_until(
                lambda: name_server.routes.live_addresses() == [LEADER], "the follower to be forgotten",
                timeout_seconds=5.0,
            )
            assert await route_addresses(reader) == {0: LEADER}
            for client in (leader, reader):
                await client.close()

    run(scenario())


def test_cluster_info_and_topic_list() -> None:
    async def scenario() -> None:
        async with running_name_server(FakeClock()) as name_server:
            client = await RemotingClient.connect(LOOPBACK, name_server.port)
            await register(client, LEADER, MASTER_ID)
            await register(client, FOLLOWER_ONE, 1)
            response = await client.request(RequestCode.GET_BROKER_CLUSTER_INFO)
            assert response.code == ResponseCode.SUCCESS
            assert json.loads(response.body)["clusterAddrTable"] == {CLUSTER: [GROUP]}
            info = ClusterInfo.decode(response.body)
            assert dict(info.broker_datas[GROUP].broker_addresses) == {0: LEADER, 1: FOLLOWER_ONE}
            response = await client.request(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER)
            assert decode_topic_list(response.body) == ["TBW102", "orders"]
            await client.close()

    run(scenario())


def test_name_servers_side_by_side_are_independent() -> None:
    async def scenario() -> None:
        async with running_name_server(FakeClock()) as first, running_name_server(FakeClock()) as second:
            clients = [await RemotingClient.connect(LOOPBACK, server.port) for server in (first, second)]
            for client in clients:
                await register(client, LEADER, MASTER_ID)
                await register(client, FOLLOWER_ONE, 1)
            assert [await route_addresses(client) for client in clients] == [{0: LEADER, 1: FOLLOWER_ONE}] * 2
            # a broker that reached only the first one changes only the first one
            await register(clients[0], FOLLOWER_ONE, MASTER_ID)
            assert await route_addresses(clients[0]) == {0: FOLLOWER_ONE}
            assert await route_addresses(clients[1]) == {0: LEADER, 1: FOLLOWER_ONE}
            for client in clients:
                await client.close()

    run(scenario())


# ------------------------------------------------------------------------------------------ bad input


def test_bad_registrations_are_answered_with_a_clear_error() -> None:
    good_body = BODY.encode()
    cases: list[tuple[dict[str, str], bytes, str]] = [
        (
            {key: value for key, value in register_header(LEADER, 0).items() if key != "brokerName"},
            b"",
            "brokerName",
        ),
        ({**register_header(LEADER, 0), "brokerAddr": "no-port"}, b"", "brokerAddr"),
        ({**register_header(LEADER, 0), "brokerId": "-1"}, b"", "brokerId"),
        ({**register_header(LEADER, 0), "brokerId": "zero"}, b"", "brokerId"),
        (register_header(LEADER, 0), b"{not json", "not JSON"),
        (register_header(LEADER, 0), b'{"topicConfigSerializeWrapper": []}', "JSON object"),
        (
            {**register_header(LEADER, 0), "bodyCrc32": str(java_crc32(good_body) ^ 1)},
            good_body,
            "crc32 not match",
        ),
        (register_header(LEADER, 0, compressed=True), b"not zlib", "inflate"),
    ]

    async def scenario() -> None:
        async with running_name_server(FakeClock()) as name_server:
            client = await RemotingClient.connect(LOOPBACK, name_server.port)
            for header, body, expected in cases:
                response = await client.request(RequestCode.REGISTER_BROKER, header, body)
                assert response.code == ResponseCode.SYSTEM_ERROR, (header, body)
                assert response.remark is not None and expected in response.remark, response.remark
            assert name_server.routes.live_addresses() == []
            response = await client.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {})
            assert response.code == ResponseCode.SYSTEM_ERROR and "topic" in (response.remark or "")
            await client.close()

    run(scenario())


def test_compressed_registration_body_is_accepted() -> None:
    async def scenario() -> None:
        async with running_name_server(FakeClock()) as name_server:
            client = await RemotingClient.connect(LOOPBACK, name_server.port)
            body = BODY.encode(compressed=True)
            header = register_header(LEADER, MASTER_ID, body=body, compressed=True)
            response = await client.request(RequestCode.REGISTER_BROKER, header, body)
            assert response.code == ResponseCode.SUCCESS, response.remark
            assert await route_addresses(client, "TBW102") == {0: LEADER}
            await client.close()

    run(scenario())


# ---------------------------------------------------------------------------------------------- bodies

#: a REGISTER_BROKER body as a 4.9 Java broker's fastjson writes it
JAVA_BODY = (
    b'{"filterServerList":[],"topicConfigSerializeWrapper":{"dataVersion":{"counter":2,"timestamp":1690000000000},'
    b'"topicConfigTable":{"TopicTest":{"order":false,"perm":6,"readQueueNums":4,"topicFilterType":"SINGLE_TAG",'
    b'"topicName":"TopicTest","topicSysFlag":0,"writeQueueNums":4},"%RETRY%group":{"perm":6,"readQueueNums":1,'
    b'"topicName":"%RETRY%group","writeQueueNums":1}}}}'
)


def test_java_register_body_and_the_bare_wrapper_decode() -> None:
    limits = {"topics_max": 10, "decompressed_max_bytes": 1 << 20}
    body = RegisterBrokerBody.decode(JAVA_BODY, compressed=False, **limits)
    assert body.data_version == DataVersion(timestamp=1690000000000, counter=2)
    assert {config.topic_name: config.write_queue_nums for config in body.topic_configs} == {
        "TopicTest": 4,
        "%RETRY%group": 1,
    }
    wrapper = json.dumps(json.loads(JAVA_BODY)["topicConfigSerializeWrapper"]).encode()
    assert RegisterBrokerBody.decode(wrapper, compressed=False, **limits).topic_configs == body.topic_configs
    assert RegisterBrokerBody.decode(b"", compressed=False, **limits) == RegisterBrokerBody()


@pytest.mark.parametrize("compressed", [False, True])
def test_register_body_round_trips(compressed: bool) -> None:
    decoded = RegisterBrokerBody.decode(
        BODY.encode(compressed=compressed),
        compressed=compressed,
        topics_max=10,
        decompressed_max_bytes=1 << 20,
    )
    if compressed:
        # the compressed form carries neither topicSysFlag nor order (TopicConfig.encode())
        assert [config.to_compressed_text() for config in decoded.topic_configs] == [
            config.to_compressed_text() for config in BODY.topic_configs
        ]
    else:
        assert decoded == BODY
    assert decoded.data_version == BODY.data_version


def test_register_body_limits() -> None:
    with pytest.raises(InvalidRequestError, match="topics_per_registration_max"):
        RegisterBrokerBody.decode(
            BODY.encode(), compressed=False, topics_max=1, decompressed_max_bytes=1 << 20
        )
    bomb = zlib.compress(b"\x00" * (4 << 20), 9)
    with pytest.raises(InvalidRequestError, match="inflates past"):
        RegisterBrokerBody.decode(bomb, compressed=True, topics_max=10, decompressed_max_bytes=1 << 20)
    bad_topic = b'{"topicConfigSerializeWrapper":{"topicConfigTable":{"t":{"perm":99}}}}'
    with pytest.raises(InvalidRequestError, match="perm"):
        RegisterBrokerBody.decode(bad_topic, compressed=False, topics_max=10, decompressed_max_bytes=1 << 20)


def test_java_crc32_keeps_31_bits() -> None:
    assert java_crc32(b"") == 0
    assert java_crc32(b"123456789") == 0xCBF43926 & 0x7FFFFFFF


def test_name_server_config_validates() -> None:
    config = NameServerConfig.from_mapping({"port": 0, "server": {"connections_max": 10}})
    assert config.server.connections_max == 10
    for bad in (
        {"port": 70000},
        {"broker_expiry_seconds": 0},
        {"topics_max": 1, "topics_per_registration_max": 2},
    ):
        with pytest.raises(ValueError):
            NameServerConfig.from_mapping(bad)
    with pytest.raises(ValueError, match="unknown name server settings: expiry"):
        NameServerConfig.from_mapping({"expiry": 1})
