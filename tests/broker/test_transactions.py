"""Transactional messages as the stock flow sends them (PREPARED sysFlag, TRAN_MSG / PGROUP properties,
END_TRANSACTION), against a real three-node group: commit, rollback, unknown-then-check, failover."""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import Iterator

import pytest

from cli.cluster import LocalCluster, route_master
from commitlog.hosts import decode_message_id
from protocol.client import RemotingClient
from protocol.codes import RequestCode, ResponseCode
from protocol.command import RemotingCommand
from protocol.connection import RemotingError
from tests.broker import wire
from tests.support.stores import small_store
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow
GROUP = "tx-producer"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    overrides = small_store({"broker": {"transaction_timeout_ms": 300, "transaction_check_interval_ms": 300,
                                        "transaction_check_max": 3}})
    with LocalCluster.start(tmp_path_factory.mktemp("tx"), overrides=overrides) as started:
        yield started


def leader(cluster: LocalCluster) -> str:
    return wire.leader_address(cluster.namesrv)


def max_offset(address: str, topic: str, queue_id: int = 0) -> int | None:
    try:
        code, fields, _ = wire.call(address, RequestCode.GET_MAX_OFFSET, {"topic": topic, "queueId": str(queue_id)})
    except RemotingError:
        return None
    return int(fields["offset"]) if code == ResponseCode.SUCCESS else None


def prepare(address: str, topic: str, key: str) -> dict[str, str]:
    code, fields, remark = wire.send(address, topic, f"tx-{key}".encode(), queue_id=0, sys_flag=0x4,
                                     properties={"TRAN_MSG": "true", "PGROUP": GROUP, "UNIQ_KEY": key})
    assert code == ResponseCode.SUCCESS, remark
    assert fields["transactionId"] == key
    return fields


def end(address: str, half: dict[str, str], decision: int, group: str = GROUP) -> tuple[int, str]:
    _, commit_log_offset = decode_message_id(half["msgId"])
    code, fields, _ = wire.call(address, RequestCode.END_TRANSACTION, {
        "producerGroup": group, "tranStateTableOffset": half["queueOffset"], "commitLogOffset": str(commit_log_offset),
        "commitOrRollback": str(decision), "fromTransactionCheck": "false", "msgId": half["msgId"],
        "transactionId": half["transactionId"]})
    return code, fields.get("remark", "")


create_topic = wire.create_topic


def test_commit_is_visible_once_and_rollback_never(cluster: LocalCluster) -> None:
    address = leader(cluster)
    create_topic(address, "TxTopic")
    committed = prepare(address, "TxTopic", "TXCOMMIT0000000000000000000000001")
    rolled_back = prepare(address, "TxTopic", "TXROLLBACK00000000000000000000001")
    assert max_offset(address, "TxTopic") == 0  # halves are invisible
    code, remark = end(address, committed, 8)
    assert code == ResponseCode.SUCCESS, remark
    assert end(address, committed, 8)[0] == ResponseCode.SUCCESS  # sent twice: applied once
    assert end(address, rolled_back, 12)[0] == ResponseCode.SUCCESS
    assert end(address, rolled_back, 8)[0] == ResponseCode.SYSTEM_ERROR  # already rolled back
    _, _, messages = wire.pull(address, "TxTopic", 0, 0)
    assert [m.property_map["UNIQ_KEY"] for m in messages] == ["TXCOMMIT0000000000000000000000001"]
    assert messages[0].sys_flag & 0xC == 0x8
    assert messages[0].prepared_transaction_offset == decode_message_id(committed["msgId"])[1]
    _, _, ops = wire.pull(address, "RMQ_SYS_TRANS_OP_HALF_TOPIC", 0, 0)
    assert sorted(m.body for m in ops) == sorted([committed["queueOffset"].encode(), rolled_back["queueOffset"].encode()])


def test_bad_end_transaction_is_refused_and_stores_nothing(cluster: LocalCluster) -> None:
    address = leader(cluster)
    half = prepare(address, "TxTopic", "TXBAD000000000000000000000000001")
    before = max_offset(address, "RMQ_SYS_TRANS_OP_HALF_TOPIC")
    bad = [
        end(address, {**half, "msgId": half["msgId"][:16] + "0" * 16}, 8),  # unknown commit-log offset 0
        end(address, {**half, "queueOffset": "999999"}, 8),  # wrong half offset
        end(address, half, 8, group="someone-else"),  # wrong producer group
        end(address, half, 5),  # not a decision
    ]
    for code, remark in bad:
        assert code == ResponseCode.SYSTEM_ERROR and remark
    assert max_offset(address, "RMQ_SYS_TRANS_OP_HALF_TOPIC") == before
    assert end(address, half, 12)[0] == ResponseCode.SUCCESS


async def _answer_checks(address: str, decision: int, checks: list[RemotingCommand]) -> None:
    """A producer of GROUP that answers every check-back with ``decision`` (the stock client's flow)."""
    host, _, port = address.rpartition(":")
    connection: list[RemotingClient] = []

    async def on_request(request: RemotingCommand) -> RemotingCommand | None:
        if request.code == RequestCode.CHECK_TRANSACTION_STATE:
            checks.append(request)
            fields = request.ext_fields
            await connection[0].oneway(RequestCode.END_TRANSACTION, {
                "producerGroup": GROUP, "tranStateTableOffset": fields["tranStateTableOffset"],
                "commitLogOffset": fields["commitLogOffset"], "commitOrRollback": str(decision),
                "fromTransactionCheck": "true", "msgId": fields["msgId"], "transactionId": fields["transactionId"]})
        return None

    client = await RemotingClient.connect(host, int(port), request_handler=on_request)
    connection.append(client)
    heartbeat = {"clientID": "tx-client", "producerDataSet": [{"groupName": GROUP}], "consumerDataSet": []}
    await client.request(RequestCode.HEART_BEAT, {}, json.dumps(heartbeat).encode())
    deadline = asyncio.get_running_loop().time() + 30
    while not checks and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.05)  # a client idling until the broker calls it back, not a test waiting
    await asyncio.sleep(0.5)  # let its END_TRANSACTION go out before closing
    await client.close()


def test_unknown_state_is_resolved_by_check_back(cluster: LocalCluster) -> None:
    address = leader(cluster)
    create_topic(address, "TxChecked")
    half = prepare(address, "TxChecked", "TXCHECK0000000000000000000000001")
    assert end(address, half, 0)[0] == ResponseCode.SUCCESS  # unknown: nothing happens yet
    checks: list[RemotingCommand] = []
    asyncio.run(_answer_checks(address, 8, checks))
    assert checks and checks[0].ext_fields["transactionId"] == "TXCHECK0000000000000000000000001"
    wait_for(lambda: max_offset(address, "TxChecked") == 1, "the checked-back commit", timeout_seconds=20)
    _, _, messages = wire.pull(address, "TxChecked", 0, 0)
    assert [m.body for m in messages] == [b"tx-TXCHECK0000000000000000000000001"]


def test_leader_kill_between_prepare_and_commit(cluster: LocalCluster) -> None:
    address = leader(cluster)
    create_topic(address, "TxFailover")
    half = prepare(address, "TxFailover", "TXFAIL00000000000000000000000001")
    old = cluster.leader_node()
    assert old is not None
    cluster.kill(old.id, signal.SIGKILL)

    def new_leader() -> str | None:
        master = route_master(cluster.namesrv)
        return master if master not in (None, address) else None

    new_address = wait_for(new_leader, "a new leader", timeout_seconds=30)
    def commit() -> tuple[int, str] | None:
        outcome = end(new_address, half, 8)
        return None if outcome[0] == ResponseCode.SERVICE_NOT_AVAILABLE else outcome

    code, remark = wait_for(commit, "the commit on the new leader", timeout_seconds=20)
    assert code == ResponseCode.SUCCESS, remark
    _, _, messages = wire.pull(new_address, "TxFailover", 0, 0)
    assert [m.property_map["UNIQ_KEY"] for m in messages] == ["TXFAIL00000000000000000000000001"]
    cluster.restart(old.id)
    wait_for(lambda: max_offset(old.broker_address, "TxFailover") == 1, "the old leader catching up",
             timeout_seconds=60)


def test_half_without_producer_is_discarded_after_max_checks(cluster: LocalCluster) -> None:
    address = leader(cluster)
    create_topic(address, "TxAbandoned")
    prepare(address, "TxAbandoned", "TXGONE00000000000000000000000001")
    wait_for(lambda: (max_offset(address, "TRANS_CHECK_MAX_TIME_TOPIC") or 0) >= 1,
             "the discard after 3 checks", timeout_seconds=60)
    assert max_offset(address, "TxAbandoned") == 0
