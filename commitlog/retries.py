"""When a send is a retry of a stored message: the rule every dedupe of UNIQ_KEY follows.

A UNIQ_KEY alone never makes a send a retry. Ids are made by clients (ours, Java's, C++'s, ali-ons, 5.x
SDKs), and an id that repeats by accident must not cost a message: a send is a retry of a stored message
only when their topic, UNIQ_KEY and reconsume count match **and** so does their content, the
:func:`retry_digest` of flag, body and properties. A match of key without one of content is a key
collision: the send is stored as a new message.

The digest leaves out what a broker writes differently for each attempt of the same send: the queue a
delayed, timed or half message is bound for (``REAL_QID``: a retry may pick another queue), the due time
of a timed message given as a delay (``TIMER_OUT_MS``) and the timer token that due time adds to KEYS.
Every other property a client sets stays the same on its retries (a client builds a message's properties
once and resends them), and the properties a broker adds are the same for every attempt.

Pure functions of the stored bytes: every replica computes the same digests from its byte-identical
store, so the dedupe state they form is replicated with the log.
"""

from __future__ import annotations

import hashlib
import struct
from typing import Final, NamedTuple

from protocol.properties import (
    KEY_SEPARATOR,
    NAME_VALUE_SEPARATOR,
    PROPERTY_KEYS,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_SEPARATOR,
)

#: the due time of a timed message (epoch ms), which a relative delay makes different on every attempt
PROPERTY_TIMER_OUT_MS: Final = "TIMER_OUT_MS"
#: the KEYS token ``RMQ_TIMER_<second>`` of a timed message (the key index finds a second's timers by it)
TIMER_KEY_PREFIX: Final = "RMQ_TIMER_"
DIGEST_BYTES: Final = 16
_FLAG_AND_LENGTH: Final = struct.Struct(">iI")
#: properties a broker writes differently for each attempt of one send
PER_ATTEMPT_PROPERTIES: Final = (PROPERTY_TIMER_OUT_MS, PROPERTY_REAL_QUEUE_ID)
_PER_ATTEMPT_NAMES: Final = tuple(name.encode() for name in PER_ATTEMPT_PROPERTIES)
_KEYS_NAME: Final = PROPERTY_KEYS.encode()
_TIMER_KEY_PREFIX: Final = TIMER_KEY_PREFIX.encode()
_KEY_SEPARATOR: Final = KEY_SEPARATOR.encode()


def retry_properties(properties: bytes) -> bytes:
    """Encoded properties without what a broker writes differently on each attempt (see the module)."""
    if not any(name in properties for name in _PER_ATTEMPT_NAMES) and _TIMER_KEY_PREFIX not in properties:
        return properties
    kept = []
    for pair in properties.split(PROPERTY_SEPARATOR):
        name, _, value = pair.partition(NAME_VALUE_SEPARATOR)
        if name in _PER_ATTEMPT_NAMES:
            continue
        if name == _KEYS_NAME:
            keys = [key for key in value.split(_KEY_SEPARATOR) if not key.startswith(_TIMER_KEY_PREFIX)]
            if not any(keys):
                continue
            pair = name + NAME_VALUE_SEPARATOR + _KEY_SEPARATOR.join(keys)
        kept.append(pair)
    return PROPERTY_SEPARATOR.join(kept)


def retry_digest(flag: int, body: bytes | memoryview, properties: bytes) -> bytes:
    """What a retry has in common with its first attempt: a digest of flag, body and properties (less the
    per-attempt ones). Equal digests, with equal topic, UNIQ_KEY and reconsume count, make a retry."""
    digest = hashlib.blake2b(digest_size=DIGEST_BYTES)
    kept = retry_properties(properties)
    digest.update(_FLAG_AND_LENGTH.pack(flag, len(body)))
    digest.update(body)
    digest.update(kept)
    return digest.digest()


class KeyCollision(NamedTuple):
    """A stored message with a send's topic, UNIQ_KEY and reconsume count, but other content: the send
    is not its retry."""

    physical_offset: int
