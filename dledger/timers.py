"""Timed messages (arbitrary delivery time, second precision): the stored form and the replicated rules, what
apply and the leader's timer service (``broker.timers``) share.

A timed message is stored in :data:`TIMER_TOPIC` (queue 0) with its real topic and queue in REAL_TOPIC /
REAL_QID, its due time in TIMER_OUT_MS, and the token ``RMQ_TIMER_<second>`` added to its KEYS, so the
store's on-disk key index finds every timer of a second (memory does not grow with pending timers).
The due second is ``ceil(TIMER_OUT_MS / 1000)``: a message is never delivered before its due time.

The replicated timer progress ``"timer" = S`` says every timer due at or before second S has been
delivered. Apply turns a timed message that arrives already due (its second at or below the progress,
e.g. accepted by an old leader just before a failover) into its real message at once, so no timer can
slip behind the progress: the decision reads only the replicated state, so every replica makes it alike.

Due timers are released by the leader's :class:`dledger.command.TimerRelease` (second S, start): apply reads
the timers due after the progress and at or before S from the local store's key index (:func:`release_due`),
so the command stays small and memory does not grow with the timers pending.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Final

from commitlog.message import MessageInput
from commitlog.record_codec import StoredMessage
from commitlog.retries import PROPERTY_TIMER_OUT_MS, TIMER_KEY_PREFIX
from dledger.command import TIMER_RELEASE_STARTS, TimerRelease
from protocol.properties import (
    KEY_SEPARATOR,
    PROPERTY_KEYS,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    decode_properties,
    encode_properties,
)
from protocol.topics import TIMER_TOPIC

TIMER_PROGRESS_KEY: Final = "timer"
#: timers one release operation releases at most (a second's timers can span several operations) ...
TIMER_RELEASE_MAX: Final = 256
#: ... and timers one second may hold at most (a release's start must be able to name each of them)
TIMER_SECOND_MAX: Final = TIMER_RELEASE_STARTS - 1
#: seconds one release may cover (an idle stretch is covered in steps)
TIMER_SPAN_MAX_SECONDS: Final = 3600
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
    properties[PROPERTY_KEYS] = f"{keys}{KEY_SEPARATOR}{timer_key(due_second(due_ms))}".strip()
    return message._replace(topic=TIMER_TOPIC, queue_id=0, properties=encode_properties(properties))


def release(message: MessageInput, store_timestamp: int) -> MessageInput | None:
    """The real message a timed one stands for (None when it names no real topic)."""
    properties = decode_properties(message.properties)
    topic = properties.get(PROPERTY_REAL_TOPIC)
    queue_text = properties.get(PROPERTY_REAL_QUEUE_ID, "")
    if not topic or not queue_text.isdigit():
        return None
    keys = [key for key in properties.get(PROPERTY_KEYS, "").split(KEY_SEPARATOR) if key and not key.startswith(TIMER_KEY_PREFIX)]
    if keys:
        properties[PROPERTY_KEYS] = KEY_SEPARATOR.join(keys)
    else:
        properties.pop(PROPERTY_KEYS, None)
    return message._replace(topic=topic, queue_id=int(queue_text), store_timestamp=store_timestamp,
                            properties=encode_properties(properties))


def starting_progress(store_timestamp: int) -> int:
    """The timer progress of a group whose first messages ever are stored at ``store_timestamp``: the second
    before them (no timer can be due before the group stored anything)."""
    return store_timestamp // 1000 - 1


def release_late(progress: int, messages: Sequence[MessageInput]) -> Sequence[MessageInput]:
    """``messages`` with each timed one already due by the timer ``progress`` (its second at or below it)
    replaced by its real message, stored now."""
    if not any(message.topic == TIMER_TOPIC for message in messages):
        return messages
    released: list[MessageInput] = []
    for message in messages:
        if message.topic == TIMER_TOPIC:
            due = timer_due_second(message.properties)
            if due is not None and due <= progress:
                real = release(message, message.store_timestamp)
                if real is not None:
                    message = real
        released.append(message)
    return released


def release_due(operation: TimerRelease, progress: int | None, last_store_timestamp: int,
                timers_of: Callable[[int], Sequence[StoredMessage]]) -> tuple[list[MessageInput], int | None]:
    """What ``operation`` releases: the real messages of the timers due after the timer ``progress`` and at or
    before its second (in commit-log order, from its start, at most TIMER_RELEASE_MAX), stamped with the due
    second (never below ``last_store_timestamp``), and the new progress when that was the rest of them.
    ``timers_of(second)`` reads the stored timers of a second (``TIMER_SECOND_MAX`` at most). Reads only
    these: the same on every replica."""
    second, start = operation.second, operation.start
    if progress is None or second <= progress or second - progress > TIMER_SPAN_MAX_SECONDS:
        return [], None
    due: list[StoredMessage] = []
    for each in range(progress + 1, second + 1):
        due.extend(timers_of(each))
    due.sort(key=lambda stored: stored.physical_offset)
    chunk = due[start : start + TIMER_RELEASE_MAX]
    store_timestamp = max(last_store_timestamp, second * 1000)
    released = []
    for stored in chunk:
        real = release(MessageInput(stored.topic, stored.queue_id, stored.flag, stored.sys_flag,
                                    stored.born_timestamp, stored.born_host, store_timestamp, stored.reconsume_times,
                                    stored.prepared_transaction_offset, stored.body, stored.properties), store_timestamp)
        if real is not None:
            released.append(real)
    return released, (second if start + TIMER_RELEASE_MAX >= len(due) else None)
