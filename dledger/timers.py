"""Timed messages (arbitrary delivery time, second precision): what apply and the leader's timer service
share.

A timed message is stored in :data:`TIMER_TOPIC` (queue 0) with its real topic and queue in REAL_TOPIC /
REAL_QID, its due time in TIMER_OUT_MS, and the token ``RMQ_TIMER_<second>`` added to its KEYS, so the
store's on-disk key index finds every timer of a second (memory does not grow with pending timers).
The due second is ``ceil(TIMER_OUT_MS / 1000)``: a message is never delivered before its due time.

The replicated timer progress ``"timer" = S`` says every timer due at or before second S has been
delivered. Apply turns a timed message that arrives already due (its second at or below the progress,
e.g. accepted by an old leader just before a failover) into its real message at once, so no timer can
slip behind the progress: the decision reads only the replicated state, so every replica makes it alike.
"""

from __future__ import annotations

import re
from typing import Final

from commitlog.message import MessageInput
from commitlog.retries import PROPERTY_TIMER_OUT_MS, TIMER_KEY_PREFIX
from protocol.properties import decode_properties, encode_properties
from protocol.topics import TIMER_TOPIC

TIMER_PROGRESS_KEY: Final = "timer"
#: timers of the second after the progress already delivered (a second's timers can span commands)
TIMER_CURSOR_KEY: Final = "timer-cursor"
PROPERTY_REAL_TOPIC: Final = "REAL_TOPIC"
PROPERTY_REAL_QUEUE_ID: Final = "REAL_QID"
PROPERTY_KEYS: Final = "KEYS"
_TIMER_OUT = re.compile(rb"(?:^|\x02)TIMER_OUT_MS\x01(\d{1,19})(?:\x02|$)")


def due_second(due_ms: int) -> int:
    return -(-due_ms // 1000)


def timer_key(second: int) -> str:
    return f"{TIMER_KEY_PREFIX}{second}"


def timer_due_second(properties: bytes) -> int | None:
    """The due second of a stored timed message, from its encoded properties (None if it has none)."""
    match = _TIMER_OUT.search(properties)
    return due_second(int(match.group(1))) if match else None


def schedule(message: MessageInput, due_ms: int) -> MessageInput:
    """``message`` (bound for its real topic and queue) as the timed message to store."""
    properties = decode_properties(message.properties)
    properties[PROPERTY_REAL_TOPIC] = message.topic
    properties[PROPERTY_REAL_QUEUE_ID] = str(message.queue_id)
    properties[PROPERTY_TIMER_OUT_MS] = str(due_ms)
    keys = properties.get(PROPERTY_KEYS, "")
    properties[PROPERTY_KEYS] = f"{keys} {timer_key(due_second(due_ms))}".strip()
    return message._replace(topic=TIMER_TOPIC, queue_id=0, properties=encode_properties(properties))


def release(message: MessageInput, store_timestamp: int) -> MessageInput | None:
    """The real message a timed one stands for (None when it names no real topic)."""
    properties = decode_properties(message.properties)
    topic = properties.get(PROPERTY_REAL_TOPIC)
    queue_text = properties.get(PROPERTY_REAL_QUEUE_ID, "")
    if not topic or not queue_text.isdigit():
        return None
    keys = [key for key in properties.get(PROPERTY_KEYS, "").split(" ") if key and not key.startswith(TIMER_KEY_PREFIX)]
    if keys:
        properties[PROPERTY_KEYS] = " ".join(keys)
    else:
        properties.pop(PROPERTY_KEYS, None)
    return message._replace(topic=topic, queue_id=int(queue_text), store_timestamp=store_timestamp,
                            properties=encode_properties(properties))
