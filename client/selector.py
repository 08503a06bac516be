"""Message-queue selectors for orderly sends (Java's ``MessageQueueSelector`` implementations) and the
round-robin choice of ordinary sends. Pure functions: the same arguments pick the same queue in every
process (Python's own ``hash`` is salted per process, so Java's ``hashCode`` is used instead).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

from client.errors import MessageValidationError
from client.message import Message, MessageQueue
from commitlog.tag_codes import java_string_hash

#: (queues of the topic, the message, the caller's argument) -> the queue to send to
MessageQueueSelector = Callable[[Sequence[MessageQueue], Message, object], MessageQueue]


def java_hash_code(value: object) -> int:
    """Java's ``hashCode`` of a String, an Integer (itself) or a Long (its two halves folded)."""
    if isinstance(value, bool):
        return 1231 if value else 1237
    if isinstance(value, int):
        if -(2**31) <= value < 2**31:
            return value  # Integer.hashCode
        folded = (value ^ (value >> 32)) & 0xFFFFFFFF  # Long.hashCode
        return folded - (1 << 32) if folded & 0x80000000 else folded
    return java_string_hash(str(value))


def select_by_hash(queues: Sequence[MessageQueue], message: Message, arg: object) -> MessageQueue:
    """``SelectMessageQueueByHash``: ``abs(arg.hashCode() % len(queues))``."""
    if not queues:
        raise MessageValidationError(f"topic {message.topic!r} has no queue to select from")
    return queues[abs(java_hash_code(arg)) % len(queues)]


def select_by_sharding_key(queues: Sequence[MessageQueue], message: Message, arg: object) -> MessageQueue:
    """The message's ``sharding_key`` (else ``arg``) hashed as :func:`select_by_hash`."""
    key = message.sharding_key if message.sharding_key is not None else arg
    if key is None:
        raise MessageValidationError("an orderly send by sharding key needs message.sharding_key or arg")
    return select_by_hash(queues, message, key)


def random_selector(rng: random.Random) -> MessageQueueSelector:
    """``SelectMessageQueueByRandom`` with an injected random source."""

    def select(queues: Sequence[MessageQueue], message: Message, arg: object) -> MessageQueue:
        if not queues:
            raise MessageValidationError(f"topic {message.topic!r} has no queue to select from")
        return queues[rng.randrange(len(queues))]

    return select


class RoundRobin:
    """Java's ``TopicPublishInfo.selectOneMessageQueue``: the next queue of a rotating counter,
    avoiding the broker group that just failed when another exists."""

    def __init__(self, start: int = 0) -> None:
        self._counter = start

    def select(self, queues: Sequence[MessageQueue], avoid_broker: str | None = None) -> MessageQueue:
        if not queues:
            raise MessageValidationError("no queue to select from")
        for _ in range(len(queues)):
            self._counter = (self._counter + 1) & 0x7FFFFFFF
            queue = queues[self._counter % len(queues)]
            if avoid_broker is None or queue.broker_name != avoid_broker:
                return queue
        self._counter = (self._counter + 1) & 0x7FFFFFFF
        return queues[self._counter % len(queues)]
