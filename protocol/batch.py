"""The body of SEND_BATCH_MESSAGE: messages one after another, each as Java's
``MessageDecoder.encodeMessage`` writes it::

    totalSize i32 | magic i32 | bodyCRC i32 | flag i32 | bodyLen i32 + body | propertiesLen i16 + properties

Java and C++ clients write 0 for magic and body CRC, and brokers check neither (the store computes its own
CRC). The magic is read unsigned, as a stored record's magic is (a magic is a bit pattern, not a number),
so any 32-bit pattern round-trips.

:func:`encode_batch_message` writes one message and :func:`decode_batch` reads a whole body back: the
producer, the broker and the tests' fake brokers share them.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final

from protocol.invariant import invariant
from protocol.properties import parse_properties

#: totalSize, magic, bodyCRC, flag, bodyLen
BATCH_HEAD: Final = struct.Struct(">iIiii")
invariant(BATCH_HEAD.size == 20, "a batch message's head must be 20 bytes")
#: propertiesLen, after the body
PROPERTIES_LENGTH: Final = struct.Struct(">h")
invariant(PROPERTIES_LENGTH.size == 2, "a batch message's properties length must be 2 bytes")
#: messages one batch may hold (RocketMQ bounds a batch by its 4 MiB body; we bound the count too)
BATCH_MESSAGES_MAX: Final = 4096


class BatchError(ValueError):
    """A batch body that is not well formed; the text says where (the broker answers MESSAGE_ILLEGAL with it)."""


@dataclass(frozen=True, slots=True)
class BatchMessage:
    flag: int
    body: bytes
    properties: dict[str, str]


def encode_batch_message(body: bytes, encoded_properties: bytes, flag: int = 0, magic: int = 0) -> bytes:
    """One message of a batch body, exactly as Java's ``MessageDecoder.encodeMessage`` writes it (magic and
    body CRC 0, as Java and C++ clients write them; ``magic`` exists for tests). Checking the properties
    (separators, the int16 bound) is the caller's part."""
    total = BATCH_HEAD.size + len(body) + PROPERTIES_LENGTH.size + len(encoded_properties)
    return b"".join(
        (
            BATCH_HEAD.pack(total, magic & 0xFFFFFFFF, 0, flag, len(body)),
            bytes(body),
            PROPERTIES_LENGTH.pack(len(encoded_properties)),
            encoded_properties,
        )
    )


def decode_batch(body: bytes, messages_max: int = BATCH_MESSAGES_MAX) -> list[BatchMessage]:
    """The messages of a batch body (MessageDecoder.decodeMessages), each checked whole before the next is
    read: a message's lengths must stay inside the body and add up to its totalSize, its properties must be
    UTF-8, and the body must hold 1 to ``messages_max`` messages. :class:`BatchError` for anything else."""
    messages: list[BatchMessage] = []
    position = 0
    while position < len(body):
        if len(messages) >= messages_max:
            raise BatchError(f"a batch holds at most {messages_max} messages")
        if len(body) - position < BATCH_HEAD.size + PROPERTIES_LENGTH.size:
            raise BatchError(f"batch message at byte {position} is truncated")
        # magic and body CRC are not checked, as MessageDecoder.decodeMessages does not: the C++ client
        # writes 0 for both (the store computes its own CRC)
        total, _magic, _crc, flag, body_length = BATCH_HEAD.unpack_from(body, position)
        body_start = position + BATCH_HEAD.size
        if body_length < 0 or body_start + body_length + PROPERTIES_LENGTH.size > len(body):
            raise BatchError(f"batch message at byte {position} has a bad body length")
        message_body = body[body_start : body_start + body_length]
        (properties_length,) = PROPERTIES_LENGTH.unpack_from(body, body_start + body_length)
        properties_start = body_start + body_length + PROPERTIES_LENGTH.size
        end = properties_start + properties_length
        if properties_length < 0 or end > len(body):
            raise BatchError(f"batch message at byte {position} has a bad properties length")
        if total != end - position:
            raise BatchError(f"batch message at byte {position} declares {total} bytes but holds {end - position}")
        try:
            properties = parse_properties(body[properties_start:end].decode("utf-8"))
        except UnicodeDecodeError:
            raise BatchError(f"batch message at byte {position} has properties that are not UTF-8") from None
        messages.append(BatchMessage(flag, message_body, properties))
        position = end
    if not messages:
        raise BatchError("the batch is empty")
    return messages
