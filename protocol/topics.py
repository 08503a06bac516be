"""Topic names: RocketMQ's validation rules, system topics, retry and dead-letter topics."""

from __future__ import annotations

import re
from typing import Final

__all__ = [
    "AUTO_CREATE_TOPIC",
    "INTERNAL_TOPIC_QUEUES",
    "SCHEDULE_TOPIC",
    "SYSTEM_TOPICS",
    "TIMER_TOPIC",
    "TOPIC_NAME_MAX_CHARS",
    "TRANS_CHECK_MAX_TIME_TOPIC",
    "TRANS_HALF_TOPIC",
    "TRANS_OP_HALF_TOPIC",
    "check_topic_name",
    "dlq_topic",
    "retry_topic",
]

#: TopicValidator.TOPIC_MAX_LENGTH (4.9)
TOPIC_NAME_MAX_CHARS: Final = 127
#: RocketMQ's topic name rule (TopicValidator): letters, digits and %|_- (a group name follows it too)
TOPIC_PATTERN: Final = re.compile(r"^[%|a-zA-Z0-9_-]+$")
#: the topic whose route a client uses for a topic that does not exist yet (auto-creation)
AUTO_CREATE_TOPIC: Final = "TBW102"
SCHEDULE_TOPIC: Final = "SCHEDULE_TOPIC_XXXX"
TRANS_HALF_TOPIC: Final = "RMQ_SYS_TRANS_HALF_TOPIC"
TRANS_OP_HALF_TOPIC: Final = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
TRANS_CHECK_MAX_TIME_TOPIC: Final = "TRANS_CHECK_MAX_TIME_TOPIC"
#: where timer messages wait for their second (the delay machinery of TIMER_DELIVER_MS and friends)
TIMER_TOPIC: Final = "RMQ_SYS_TIMER_TOPIC"
#: topics clients may not send to directly
SYSTEM_TOPICS: Final = frozenset({
    AUTO_CREATE_TOPIC, TIMER_TOPIC, SCHEDULE_TOPIC, TRANS_HALF_TOPIC, TRANS_OP_HALF_TOPIC, TRANS_CHECK_MAX_TIME_TOPIC,
    "BenchmarkTest", "OFFSET_MOVED_EVENT", "SELF_TEST_TOPIC", "RMQ_SYS_TRACE_TOPIC",
})
#: the broker's own topics and their queue counts (0: one queue per delay level)
INTERNAL_TOPIC_QUEUES: Final = {SCHEDULE_TOPIC: 0, TRANS_HALF_TOPIC: 1, TRANS_OP_HALF_TOPIC: 1,
                                TRANS_CHECK_MAX_TIME_TOPIC: 1, TIMER_TOPIC: 1}
RETRY_PREFIX: Final = "%RETRY%"
DLQ_PREFIX: Final = "%DLQ%"


def check_topic_name(topic: str) -> str | None:
    """Why ``topic`` is not a valid topic name (RocketMQ's TopicValidator), or None: the one rule the broker
    answers with, the client checks before sending and the store keeps to."""
    if not topic or not topic.strip():
        return "The specified topic is blank."
    if len(topic) > TOPIC_NAME_MAX_CHARS:
        return f"The specified topic is longer than topic max length {TOPIC_NAME_MAX_CHARS}."
    if not TOPIC_PATTERN.match(topic):
        return f"The specified topic[{topic}] contains illegal characters, allowing only ^[%|a-zA-Z0-9_-]+$"
    return None


def retry_topic(group: str) -> str:
    return RETRY_PREFIX + group


def dlq_topic(group: str) -> str:
    return DLQ_PREFIX + group
