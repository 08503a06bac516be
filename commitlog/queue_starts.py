"""Where each consume queue continues when a replica copies the commit log from a peer's retention point.

A replica that restarts past a peer's retention point (:meth:`MessageStore.reset_to`) holds none of the
records below it, yet each queue must go on numbering as on every other replica: the queue offset is written
into each record, whose bytes are the same everywhere. So the peer tells, per queue, the queue offset of its
first unit at or after that point (the queue's end when it has none there): the queue's ``min_offset`` once
retention reached the point. Records appended later do not change that answer, so it holds whenever it is
asked, and the copied records must agree with it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from commitlog.dispatch import to_consume_queue
from commitlog.record_codec import StoredMessage

#: (topic, queue id)
QueueKey = tuple[str, int]


def continuation_problem(messages: Iterable[StoredMessage], next_offsets: Mapping[QueueKey, int],
                         starts: Mapping[QueueKey, int] | None) -> str | None:
    """Why copied records (in commit-log order) do not continue the queues, or None when they do.

    ``next_offsets``: the next offset of each queue the store knows. ``starts``: the peer's queue starts when
    the copy begins past its retention point (a queue in neither starts at 0); None when there are none, and
    then a queue the store does not know starts at its first copied record."""
    expected = dict(next_offsets)
    if starts is not None:
        for (topic, queue_id), start in starts.items():
            known = expected.get((topic, queue_id), 0)
            if known > start:
                return f"queue {topic}/{queue_id} goes up to {known} here, and continues at {start} on the peer"
            expected[(topic, queue_id)] = start
    for message in messages:
        if not to_consume_queue(message.sys_flag):
            continue
        key = (message.topic, message.queue_id)
        wanted = expected.get(key, message.queue_offset if starts is None else 0)
        if message.queue_offset != wanted:
            return (f"the record at {message.physical_offset} has offset {message.queue_offset} in queue "
                    f"{message.topic}/{message.queue_id}, which continues at {wanted}")
        expected[key] = wanted + 1
    return None
