"""Retention on a real three-node group: old segments go on every replica alike, consumers are moved
forward, and an unresolved transaction half keeps its segment until it is resolved."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from cli.cluster import LocalCluster
from commitlog.hosts import decode_message_id
from protocol.codes import RequestCode, ResponseCode
from tests.broker import wire
from tests.support.stores import small_store
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow
SEGMENT = 1 << 20
BODY = b"r" * (100 << 10)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    overrides = small_store({"store": {"segment_size_bytes": SEGMENT, "body_size_max_bytes": 256 << 10},
                             "broker": {"file_reserved_seconds": 1, "retention_check_seconds": 0.3}})
    with LocalCluster.start(tmp_path_factory.mktemp("retention"), overrides=overrides) as started:
        yield started


def min_offsets(cluster: LocalCluster) -> list[int]:
    values = []
    for node in cluster.info.nodes:
        code, _, body = wire.call(node.broker_address, RequestCode.GET_BROKER_RUNTIME_INFO)
        assert code == ResponseCode.SUCCESS
        values.append(int(json.loads(body)["table"]["commitLogMinOffset"]))
    return values


def fill(address: str, count: int) -> None:
    for _ in range(count):
        code, _, remark = wire.send(address, "Retained", BODY, queue_id=0)
        assert code == ResponseCode.SUCCESS, remark


def test_old_segments_go_everywhere_alike_but_not_under_an_unresolved_half(cluster: LocalCluster) -> None:
    address = wire.leader_address(cluster.namesrv)
    wire.create_topic(address, "Retained", queues=1)
    fill(address, 25)  # about 2.5 segments
    code, half, remark = wire.send(address, "Retained", b"half", queue_id=0, sys_flag=0x4,
                                   properties={"TRAN_MSG": "true", "PGROUP": "retention", "UNIQ_KEY": "RETHALF"})
    assert code == ResponseCode.SUCCESS, remark
    _, half_offset = decode_message_id(half["msgId"])
    fill(address, 30)
    half_segment = half_offset - half_offset % SEGMENT
    # everything before the half's segment goes, on every replica alike; the half's segment stays
    wait_for(lambda: min_offsets(cluster) == [half_segment] * 3, "retention up to the half's segment",
             timeout_seconds=60)
    code, moved, _ = wire.pull(address, "Retained", 0, 0)
    assert code == ResponseCode.PULL_OFFSET_MOVED and int(moved["nextBeginOffset"]) > 0
    assert all(offset <= half_offset for offset in min_offsets(cluster))
    code, _, _ = wire.call(address, RequestCode.END_TRANSACTION, {
        "producerGroup": "retention", "tranStateTableOffset": half["queueOffset"],
        "commitLogOffset": str(half_offset), "commitOrRollback": "12", "fromTransactionCheck": "false",
        "msgId": half["msgId"], "transactionId": "RETHALF"})
    assert code == ResponseCode.SUCCESS
    # resolved: the half's segment may go too (the transaction progress passes it on the next check)
    wait_for(lambda: all(offset > half_offset for offset in min_offsets(cluster)), "retention past the half",
             timeout_seconds=60)
