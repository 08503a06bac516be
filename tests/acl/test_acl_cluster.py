"""Access control on a real three-node group, as clients see it: our raw requests, our CLI and SDK,
and the stock C++ client (PyPI ``rocketmq==0.4.4``) with good and wrong credentials.

One group for the module (``acl_file = "acl.toml"``: each node reads its own copy). Nothing sleeps to
wait: every condition is polled with a deadline.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pytest
from click.testing import CliRunner

from cli.client_commands import send, topic
from cli.cluster import LocalCluster, route_master
from commitlog.record_codec import decode_record
from protocol.codes import RequestCode, ResponseCode
from protocol.command import RemotingCommand
from tests.acl.helpers import (
    ADMIN,
    BASE_ACL,
    CONSUMER,
    PRODUCER,
    Credentials,
    create_topic_fields,
    probed_cluster,
    pull_fields,
    request,
    runtime_info,
    send_fields,
    source_address_usable,
    write_acl,
)
from tests.interop.harness import DriverPool
from tests.support.stores import small_store
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow

START_SECONDS: Final = 90.0
REPLICATION_SECONDS: Final = 30.0
PROCESS_SECONDS: Final = 60.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    directory = tmp_path_factory.mktemp("acl-group")
    write_acl(directory, BASE_ACL)
    overrides = small_store({"broker": {"acl_file": "acl.toml"}})
    with probed_cluster(ADMIN).start(directory, nodes=3, overrides=overrides,
                                     timeout_seconds=START_SECONDS) as started:
        create = request(leader(started), RequestCode.UPDATE_AND_CREATE_TOPIC, create_topic_fields("orders"),
                         credentials=ADMIN)
        assert create.code == ResponseCode.SUCCESS, create.remark
        create = request(leader(started), RequestCode.UPDATE_AND_CREATE_TOPIC, create_topic_fields("audit"),
                         credentials=ADMIN)
        assert create.code == ResponseCode.SUCCESS, create.remark
        wait_for(lambda: route_master(started.namesrv, "orders"), "a route for orders",
                 timeout_seconds=REPLICATION_SECONDS)
        yield started


def leader(cluster: LocalCluster) -> str:
    return wait_for(lambda: route_master(cluster.namesrv), "a leader in the routes",
                    timeout_seconds=REPLICATION_SECONDS)


def followers(cluster: LocalCluster) -> list[str]:
    master = leader(cluster)
    return [node.broker_address for node in cluster.info.nodes if node.broker_address != master]


def max_offset(address: str, topic_name: str) -> int:
    response = request(address, RequestCode.GET_MAX_OFFSET, {"topic": topic_name, "queueId": "0"}, credentials=ADMIN)
    assert response.code == ResponseCode.SUCCESS, response.remark
    return int(response.ext_fields["offset"])


def refused(response: RemotingCommand, *words: str) -> bool:
    return response.code == ResponseCode.NO_PERMISSION and all(word in (response.remark or "") for word in words)


def test_per_topic_permissions_hold_for_send_and_nothing_refused_is_stored(cluster: LocalCluster) -> None:
    address = leader(cluster)
    before = {name: max_offset(address, name) for name in ("orders", "audit")}
    ok = request(address, RequestCode.SEND_MESSAGE, send_fields("orders"), b"order 1", credentials=PRODUCER)
    assert ok.code == ResponseCode.SUCCESS, ok.remark
    attempts = [
        (request(address, RequestCode.SEND_MESSAGE, send_fields("audit"), b"x", credentials=PRODUCER),
         ("topic:audit", "needs PUB", "has DENY")),
        (request(address, RequestCode.SEND_MESSAGE, send_fields("orders"), b"x", credentials=CONSUMER),
         ("topic:orders", "needs PUB")),
        (request(address, RequestCode.SEND_MESSAGE, send_fields("orders"), b"x"), ("No accessKey",)),
        (request(address, RequestCode.SEND_MESSAGE, send_fields("orders"), b"x",
                 credentials=Credentials(PRODUCER.access_key, "wrong-secret-1")), ("Check signature failed",)),
        (request(address, RequestCode.SEND_MESSAGE, send_fields("orders"), b"x",
                 credentials=Credentials("stranger-key", "stranger-secret")), ("No acl config for stranger-key",)),
        (request(address, RequestCode.UPDATE_AND_CREATE_TOPIC, create_topic_fields("sneaky"), credentials=PRODUCER),
         ("Need admin permission",)),
        (request(address, RequestCode.SEND_MESSAGE, send_fields("brand-new-topic"), b"x", credentials=PRODUCER),
         ("topic:brand-new-topic",)),
    ]
    for response, words in attempts:
        assert refused(response, *words), (response.code, response.remark, words)
    assert max_offset(address, "orders") == before["orders"] + 1
    assert max_offset(address, "audit") == before["audit"]
    for name in ("sneaky", "brand-new-topic"):  # not auto-created by a refused send, not created by a non-admin
        response = request(address, RequestCode.GET_MAX_OFFSET, {"topic": name, "queueId": "0"}, credentials=ADMIN)
        assert response.code != ResponseCode.SUCCESS or int(response.ext_fields["offset"]) == 0


def test_a_follower_forwards_a_signed_send_and_the_leader_checks_the_clients_signature(cluster: LocalCluster) -> None:
    # broker.forwarding: the client's frame goes to the leader as signed (the member's marker is stripped
    # before the leader's check), so the client's own account and permissions decide there too
    address, follower = leader(cluster), followers(cluster)[0]
    before = max_offset(address, "orders")
    ok = request(follower, RequestCode.SEND_MESSAGE, send_fields("orders"), b"via a follower", credentials=PRODUCER)
    assert ok.code == ResponseCode.SUCCESS, ok.remark
    denied = request(follower, RequestCode.SEND_MESSAGE, send_fields("audit"), b"x", credentials=PRODUCER)
    assert refused(denied, "topic:audit"), (denied.code, denied.remark)
    assert max_offset(address, "orders") == before + 1


def test_per_topic_and_group_permissions_hold_for_pull_on_every_member(cluster: LocalCluster) -> None:
    address = leader(cluster)
    sent = request(address, RequestCode.SEND_MESSAGE, send_fields("orders"), b"pull me", credentials=PRODUCER)
    assert sent.code == ResponseCode.SUCCESS
    offset = int(sent.ext_fields["queueOffset"])
    for member in [address, *followers(cluster)]:
        def pulled(member: str = member) -> RemotingCommand | None:
            response = request(member, RequestCode.PULL_MESSAGE, pull_fields("orders", "billing", offset),
                               credentials=CONSUMER)
            return response if response.code == ResponseCode.SUCCESS else None

        response = wait_for(pulled, f"{member} to serve the message", timeout_seconds=REPLICATION_SECONDS)
        assert decode_record(response.body, 0).body == b"pull me"
        for fields, credentials, words in [
            (pull_fields("orders", "reporting", offset), CONSUMER, ("group:reporting",)),
            (pull_fields("audit", "billing"), CONSUMER, ("topic:audit",)),
            (pull_fields("orders", "billing", offset), PRODUCER, ("topic:orders", "needs SUB")),
            (pull_fields("orders", "billing", offset), None, ("No accessKey",)),
        ]:
            response = request(member, RequestCode.PULL_MESSAGE, fields, credentials=credentials)
            assert refused(response, *words), (member, response.code, response.remark)


def test_account_whitelist_skips_signature_and_checks(cluster: LocalCluster) -> None:
    if not source_address_usable("127.0.0.3"):
        pytest.skip("this machine cannot send from 127.0.0.3")
    address = leader(cluster)
    unsigned = {**pull_fields("audit", "reporting"), "AccessKey": CONSUMER.access_key}
    from_whitelisted = request(address, RequestCode.PULL_MESSAGE, unsigned, source_host="127.0.0.3")
    assert from_whitelisted.code != ResponseCode.NO_PERMISSION, from_whitelisted.remark
    from_elsewhere = request(address, RequestCode.PULL_MESSAGE, unsigned, source_host="127.0.0.1")
    assert refused(from_elsewhere, "Check signature failed")
    # the whitelist belongs to the account: no access key, no pass
    anonymous = request(address, RequestCode.PULL_MESSAGE, pull_fields("audit", "reporting"), source_host="127.0.0.3")
    assert refused(anonymous, "No accessKey")


def test_cli_and_sdk_sign_with_credentials_from_the_environment(cluster: LocalCluster) -> None:
    runner = CliRunner()
    namesrv = ["--namesrv", cluster.namesrv]
    admin_env = {"RAFTMQ_ACCESS_KEY": ADMIN.access_key, "RAFTMQ_SECRET_KEY": ADMIN.secret_key}
    producer_env = {"RAFTMQ_ACCESS_KEY": PRODUCER.access_key, "RAFTMQ_SECRET_KEY": PRODUCER.secret_key}
    created = runner.invoke(topic, ["create", "cli-topic", "--queues", "1", *namesrv], env=admin_env)
    assert created.exit_code == 0, created.output
    denied = runner.invoke(topic, ["create", "cli-topic-2", "--queues", "1", *namesrv], env=producer_env)
    assert denied.exit_code == 1 and "NO_PERMISSION" in denied.output and "Traceback" not in denied.output
    sent = runner.invoke(send, ["orders", "from the cli", *namesrv], env=producer_env)
    assert sent.exit_code == 0, sent.output
    unsigned = runner.invoke(send, ["orders", "from the cli", *namesrv], env={})
    assert unsigned.exit_code == 1 and "No accessKey" in unsigned.output, unsigned.output


def test_stock_cpp_client_with_good_credentials_works_and_with_a_wrong_secret_is_refused(
        cluster: LocalCluster, tmp_path: Path) -> None:
    address = leader(cluster)
    pool = DriverPool(tmp_path / "drivers")
    try:
        before = max_offset(address, "orders")
        producer = pool.start("producer", "produce", namesrv=cluster.namesrv, topic="orders", group="acl_producers",
                              mode="sync", count=5, run="good", access_key=PRODUCER.access_key,
                              secret_key=PRODUCER.secret_key)
        assert producer.wait_exit(PROCESS_SECONDS) == 0, pool.report()
        acks = producer.events("ack")
        assert len(acks) == 5 and not producer.events("error"), pool.report()
        batch = pool.start("batch-producer", "produce", namesrv=cluster.namesrv, topic="orders",
                           group="acl_producers", mode="batch", count=4, batch_size=4, run="batch",
                           access_key=PRODUCER.access_key, secret_key=PRODUCER.secret_key)
        assert batch.wait_exit(PROCESS_SECONDS) == 0, pool.report()
        acks += batch.events("ack")
        assert len(acks) == 9 and not batch.events("error"), pool.report()
        assert max_offset(address, "orders") == before + 9
        # orderly: LOCK_BATCH_MQ (a signed body naming the group and the queues) before every pull
        consumer = pool.start("consumer", "consume", namesrv=cluster.namesrv, topic="orders", group="billing",
                              instance="acl-consumer", expect=9 + before, orderly=True,
                              access_key=CONSUMER.access_key, secret_key=CONSUMER.secret_key)
        assert consumer.wait_exit(PROCESS_SECONDS) == 0, pool.report()
        delivered = {str(event["body"]) for event in consumer.events("delivery")}
        assert {str(event["body"]) for event in acks} <= delivered, pool.report()
        forged = pool.start("forger", "produce", namesrv=cluster.namesrv, topic="orders", group="acl_producers",
                            mode="sync", count=2, run="forged", access_key=PRODUCER.access_key,
                            secret_key="wrong-secret-1")
        assert forged.wait_exit(PROCESS_SECONDS) == 1, pool.report()
        assert not forged.events("ack") and len(forged.events("error")) == 2, pool.report()
        assert max_offset(address, "orders") == before + 9
    finally:
        pool.close()


def test_a_change_of_the_leaders_file_is_replicated_to_every_member(cluster: LocalCluster) -> None:
    """Only the leader's copy changes; the followers' files keep the old rules, yet they enforce the new
    ones: the rules travel through Raft. Runs last in the module (it restores the file at the end)."""
    address = leader(cluster)
    leader_node = next(node for node in cluster.info.nodes if node.broker_address == address)
    acl_file = Path(leader_node.config).parent / "acl.toml"
    late = Credentials("late-comer", "late-secret")
    extra = f'\n[[accounts]]\naccessKey = "{late.access_key}"\nsecretKey = "{late.secret_key}"\n'
    whitelist = source_address_usable("127.0.0.2")
    changed = BASE_ACL + extra
    if whitelist:
        changed = changed.replace("globalWhiteRemoteAddresses = []", 'globalWhiteRemoteAddresses = ["127.0.0.2"]')
    members = [node.broker_address for node in cluster.info.nodes]
    for member in members:
        assert runtime_info(member, late) is None
    acl_file.write_text(changed)
    try:
        for member in members:
            wait_for(lambda member=member: runtime_info(member, late),  # type: ignore[misc]
                     f"{member} to accept the new account", timeout_seconds=REPLICATION_SECONDS)
            if whitelist:
                anonymous = request(member, RequestCode.GET_BROKER_RUNTIME_INFO, source_host="127.0.0.2")
                assert anonymous.code == ResponseCode.SUCCESS, anonymous.remark
                assert refused(request(member, RequestCode.GET_BROKER_RUNTIME_INFO, source_host="127.0.0.1"),
                               "No accessKey")
        table = json.loads(request(address, RequestCode.GET_BROKER_RUNTIME_INFO, credentials=ADMIN).body)["table"]
        assert table["brokerRole"] == "LEADER"
    finally:
        acl_file.write_text(BASE_ACL)
    for member in members:
        wait_for(lambda member=member: runtime_info(member, late) is None,  # type: ignore[misc]
                 f"{member} to drop the account again", timeout_seconds=REPLICATION_SECONDS)


def test_cluster_status_probes_sign_with_credentials_from_the_environment(
        cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    plain = LocalCluster.open(cluster.data_dir)
    assert all(row["role"] == "unreachable" for row in plain.status())  # unsigned probes are refused
    monkeypatch.setenv("RAFTMQ_ACCESS_KEY", ADMIN.access_key)
    monkeypatch.setenv("RAFTMQ_SECRET_KEY", ADMIN.secret_key)
    roles = sorted(str(row["role"]) for row in plain.status())
    assert roles == ["follower", "follower", "leader"]


def test_grpc_v2_sends_are_checked_against_the_same_accounts(cluster: LocalCluster) -> None:
    """The stock 5.x Python SDK signs with ``authorization: MQv2-HMAC-SHA1``: the producer's account may
    publish to orders; a wrong secret, or a topic it may not publish to, is refused and stores nothing."""
    from tests.interop import sdk5  # the SDK itself runs in a subprocess of its own venv

    node = wait_for(cluster.leader_node, "a leader", timeout_seconds=REPLICATION_SECONDS)
    master = leader(cluster)
    before = max_offset(master, "orders")
    good = sdk5.produce(node.grpc_address, "orders", [{"body": "5.x with the producer's keys"}],
                        access_key=PRODUCER.access_key, secret_key=PRODUCER.secret_key)
    assert good.returncode == 0 and [result["ok"] for result in good.results] == [True], good.describe()
    wait_for(lambda: max_offset(master, "orders") == before + 1, "the 5.x send stored",
             timeout_seconds=REPLICATION_SECONDS)
    wrong_secret = sdk5.produce(node.grpc_address, "orders", [{"body": "wrong secret"}],
                                access_key=PRODUCER.access_key, secret_key="not-the-secret")
    forbidden = sdk5.produce(node.grpc_address, "audit", [{"body": "not allowed"}],
                             access_key=PRODUCER.access_key, secret_key=PRODUCER.secret_key)
    for run in (wrong_secret, forbidden):
        assert run.returncode == 0 and len(run.results) == 1 and not run.results[0]["ok"], run.describe()
    # a wrong secret is refused from the first call on (QueryRoute: the SDK reports no route); a signed
    # producer gets its route and then FORBIDDEN for the send
    assert "route" in str(wrong_secret.results[0]["error"]), wrong_secret.describe()
    assert forbidden.results[0]["code"] == 40300, forbidden.describe()
    assert max_offset(master, "orders") == before + 1 and max_offset(master, "audit") == 0


def test_replica_files_for_audits_need_an_admin_account(cluster: LocalCluster) -> None:
    from spark_analytics.remote import Access, MemberClient, RemoteError

    member = followers(cluster)[0]
    status = MemberClient(member, Access(access_key=ADMIN.access_key, secret_key=ADMIN.secret_key)).status()
    assert status["applied_end"] >= status["durable_end"] >= 0 and "commitlog" in status["files"]
    with pytest.raises(RemoteError, match="Need admin permission"):
        MemberClient(member, Access(access_key=PRODUCER.access_key, secret_key=PRODUCER.secret_key)).status()
    secret = (cluster.data_dir / "group.secret").read_bytes().strip()
    with pytest.raises(RemoteError, match="No accessKey"):  # with ACL on, the group's audit key alone is not enough
        MemberClient(member, Access.from_secret(secret)).status()
