"""Allocation strategies by table (the Java results), plus the properties every strategy must keep:
the members' shares partition the queues, whatever order the inputs come in."""

from __future__ import annotations

import random

import pytest

from client.allocate import (
    AllocateFunction,
    allocate_averagely,
    allocate_circle,
    allocate_consistent_hash,
    md5_hash,
)
from client.message import MessageQueue


def queues(count: int, broker: str = "broker-a", topic: str = "T") -> list[MessageQueue]:
    return [MessageQueue(topic, broker, index) for index in range(count)]


def shares(allocate: AllocateFunction, queue_count: int, member_count: int) -> list[list[int]]:
    members = [f"c{index}" for index in range(member_count)]
    return [[q.queue_id for q in allocate("G", member, queues(queue_count), members)] for member in members]


@pytest.mark.parametrize(
    ("queue_count", "member_count", "expected"),
    [
        # AllocateMessageQueueAveragelyTest in apache/rocketmq gives these blocks
        (4, 1, [[0, 1, 2, 3]]),
        (4, 2, [[0, 1], [2, 3]]),
        (4, 3, [[0, 1], [2], [3]]),
        (4, 4, [[0], [1], [2], [3]]),
        (4, 5, [[0], [1], [2], [3], []]),
        (8, 3, [[0, 1, 2], [3, 4, 5], [6, 7]]),
        (10, 4, [[0, 1, 2], [3, 4, 5], [6, 7], [8, 9]]),
        (0, 2, [[], []]),
    ],
)
def test_averagely_gives_contiguous_blocks(queue_count: int, member_count: int, expected: list[list[int]]) -> None:
    assert shares(allocate_averagely, queue_count, member_count) == expected


def test_circle_deals_queues_in_turn() -> None:
    assert shares(allocate_circle, 5, 2) == [[0, 2, 4], [1, 3]]


def test_md5_hash_is_the_first_four_digest_bytes() -> None:
    # md5("a") = 0cc175b9 c0f1b6a8 31c399e2 69772661
    assert md5_hash("a") == 0x0CC175B9


@pytest.mark.parametrize("allocate", [allocate_averagely, allocate_circle, allocate_consistent_hash])
@pytest.mark.parametrize(("queue_count", "member_count"), [(1, 1), (4, 3), (16, 5), (7, 9), (32, 2)])
def test_shares_partition_the_queues(allocate: AllocateFunction, queue_count: int, member_count: int) -> None:
    rng = random.Random(queue_count * 100 + member_count)
    all_queues = queues(queue_count // 2, "broker-a") + queues(queue_count - queue_count // 2, "broker-b")
    members = [f"10.0.0.{index}@{index}" for index in range(member_count)]
    seen: list[MessageQueue] = []
    for member in members:
        shuffled_queues, shuffled_members = all_queues[:], members[:]
        rng.shuffle(shuffled_queues)
        rng.shuffle(shuffled_members)
        share = allocate("G", member, shuffled_queues, shuffled_members)
        assert share == allocate("G", member, all_queues, members)  # input order does not matter
        seen.extend(share)
    assert sorted(seen) == sorted(all_queues)


def test_a_member_missing_from_the_list_gets_nothing() -> None:
    for allocate in (allocate_averagely, allocate_circle, allocate_consistent_hash):
        assert allocate("G", "stranger", queues(4), ["a", "b"]) == []


def test_consistent_hash_moves_few_queues_when_a_member_joins() -> None:
    all_queues = queues(64)
    before_members = [f"client-{index}" for index in range(4)]
    after_members = [*before_members, "client-new"]
    owner_before = {q: m for m in before_members for q in allocate_consistent_hash("G", m, all_queues, before_members)}
    owner_after = {q: m for m in after_members for q in allocate_consistent_hash("G", m, all_queues, after_members)}
    moved = [q for q in all_queues if owner_before[q] != owner_after[q]]
    # only queues taken over by the new member move
    assert all(owner_after[q] == "client-new" for q in moved)
    assert 0 < len(moved) < len(all_queues) // 2


def test_consistent_hash_is_a_fixed_function() -> None:
    """A regression table: the ring is MD5 of "<id>-<replica>" and queues hash by Java's toString."""
    share = [q.queue_id for q in allocate_consistent_hash("G", "client-0", queues(16), ["client-0", "client-1"])]
    assert share == [q.queue_id for q in allocate_consistent_hash("G", "client-0", queues(16), ["client-1", "client-0"])]
    other = [q.queue_id for q in allocate_consistent_hash("G", "client-1", queues(16), ["client-0", "client-1"])]
    assert sorted(share + other) == list(range(16))
    assert str(MessageQueue("T", "broker-a", 3)) == "MessageQueue [topic=T, brokerName=broker-a, queueId=3]"
