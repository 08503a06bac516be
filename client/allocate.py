"""Queue allocation among the members of a clustering consumer group: pure functions of the group's
queues and member ids, identical to Java's ``AllocateMessageQueueAveragely`` and
``AllocateMessageQueueConsistentHash``, so Python and Java members of one group agree on who
consumes what.

Every member computes its own share from the same sorted inputs; the shares partition the queues.
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Callable, Sequence
from typing import Final

from client.message import MessageQueue

#: (consumer group, this member's id, every queue, every member id) -> this member's queues
AllocateFunction = Callable[[str, str, Sequence[MessageQueue], Sequence[str]], list[MessageQueue]]
#: Java's default ``virtualNodeCnt`` of the consistent-hash strategy
VIRTUAL_NODES: Final = 10


def allocate_averagely(
    group: str, current_id: str, queues: Sequence[MessageQueue], member_ids: Sequence[str]
) -> list[MessageQueue]:
    """Contiguous blocks: the first ``len(queues) % len(members)`` members get one more queue."""
    all_queues = sorted(queues)
    members = sorted(member_ids)
    if current_id not in members or not all_queues:
        return []
    index = members.index(current_id)
    queue_count, member_count = len(all_queues), len(members)
    mod = queue_count % member_count
    if queue_count <= member_count:
        average = 1
    elif mod > 0 and index < mod:
        average = queue_count // member_count + 1
    else:
        average = queue_count // member_count
    start = index * average if mod > 0 and index < mod else index * average + mod
    count = min(average, queue_count - start)
    return [all_queues[(start + offset) % queue_count] for offset in range(count)]


def allocate_circle(
    group: str, current_id: str, queues: Sequence[MessageQueue], member_ids: Sequence[str]
) -> list[MessageQueue]:
    """``AllocateMessageQueueAveragelyByCircle``: queue i goes to member i mod n."""
    all_queues = sorted(queues)
    members = sorted(member_ids)
    if current_id not in members:
        return []
    index = members.index(current_id)
    return [queue for position, queue in enumerate(all_queues) if position % len(members) == index]


def md5_hash(key: str) -> int:
    """``ConsistentHashRouter.MD5Hash``: the first 4 bytes of the MD5 digest, big-endian, unsigned."""
    digest = hashlib.md5(key.encode("utf-8"), usedforsecurity=False).digest()
    return int.from_bytes(digest[:4], "big")


def allocate_consistent_hash(
    group: str,
    current_id: str,
    queues: Sequence[MessageQueue],
    member_ids: Sequence[str],
    virtual_nodes: int = VIRTUAL_NODES,
) -> list[MessageQueue]:
    """Each member owns ``virtual_nodes`` points ``"<id>-<i>"`` on an MD5 ring; a queue (hashed by
    its Java ``toString``) goes to the first point at or after its hash, wrapping around. A point
    that collides replaces the earlier one, as Java's ``TreeMap.put`` does."""
    members = sorted(member_ids)
    if current_id not in members or not queues:
        return []
    ring: dict[int, str] = {}
    for member in members:
        for replica in range(virtual_nodes):
            ring[md5_hash(f"{member}-{replica}")] = member
    points = sorted(ring)
    result: list[MessageQueue] = []
    for queue in sorted(queues):
        position = bisect.bisect_left(points, md5_hash(str(queue)))
        owner = ring[points[position if position < len(points) else 0]]
        if owner == current_id:
            result.append(queue)
    return result
