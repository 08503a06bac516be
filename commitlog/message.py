"""A message as apply hands it to the store (:class:`MessageInput`), and the rules the store checks it by
before it takes an offset: :func:`validate_input` for the fields' widths and limits (the topic name's rule is
:func:`protocol.topics.check_topic_name`, which every layer keeps)."""

from __future__ import annotations

from typing import Final, NamedTuple

from protocol.properties import PROPERTIES_BYTES_MAX

#: a topic's bytes in a record (its length is one signed byte)
TOPIC_BYTES_MAX: Final = 127


class MessageInput(NamedTuple):
    """One message as apply hands it to the store: everything the stored record needs, stamped by the
    leader before proposing, so every replica writes the same bytes. (A NamedTuple: one is built per
    message on every replica, and a frozen dataclass costs several times more to construct.)

    ``properties`` is the encoded ``key\\x01value\\x02`` string exactly as the producer sent it (plus what
    the broker added). ``born_host`` is 8 bytes (IPv4 + port) or 20 bytes (IPv6 + port), as is the store
    host the store adds.
    """

    topic: str
    queue_id: int
    flag: int
    sys_flag: int
    born_timestamp: int
    born_host: bytes
    store_timestamp: int
    reconsume_times: int
    prepared_transaction_offset: int
    body: bytes
    properties: bytes


_I32: Final = 2**31
_I64: Final = 2**63


def validate_input(message: MessageInput, body_size_max_bytes: int) -> str | None:
    """Return why ``message`` cannot be stored, or None. Never raises."""
    # the common case in one pass over the unpacked fields (a quarter cheaper than reading each by name);
    # the checks below name what is wrong
    (topic, queue_id, flag, sys_flag, born_timestamp, born_host, store_timestamp, reconsume_times, prepared_offset,
     body, properties) = message
    if (topic.isascii() and 0 < len(topic) <= TOPIC_BYTES_MAX and len(properties) <= PROPERTIES_BYTES_MAX
            and len(body) <= body_size_max_bytes and len(born_host) in (8, 20)
            and 0 <= queue_id < _I32 and -_I32 <= flag < _I32 and -_I32 <= sys_flag < _I32
            and -_I32 <= reconsume_times < _I32 and -_I64 <= born_timestamp < _I64
            and -_I64 <= store_timestamp < _I64 and -_I64 <= prepared_offset < _I64):
        return None
    try:
        topic_len = len(message.topic.encode())
    except UnicodeEncodeError:
        return "topic is not valid unicode"
    if not 0 < topic_len <= TOPIC_BYTES_MAX:
        return f"topic length {topic_len} outside 1..{TOPIC_BYTES_MAX} bytes"
    if len(message.properties) > PROPERTIES_BYTES_MAX:
        return f"properties length {len(message.properties)} over {PROPERTIES_BYTES_MAX} bytes"
    if len(message.body) > body_size_max_bytes:
        return f"body length {len(message.body)} over {body_size_max_bytes} bytes"
    if len(message.born_host) not in (8, 20):
        return f"born host must be 8 or 20 bytes, got {len(message.born_host)}"
    if not 0 <= message.queue_id < 2**31:
        return f"queue id {message.queue_id} out of range"
    for name, value, bits in (
        ("flag", message.flag, 32),
        ("sys_flag", message.sys_flag, 32),
        ("reconsume_times", message.reconsume_times, 32),
        ("born_timestamp", message.born_timestamp, 64),
        ("store_timestamp", message.store_timestamp, 64),
        ("prepared_transaction_offset", message.prepared_transaction_offset, 64),
    ):
        if not -(2 ** (bits - 1)) <= value < 2 ** (bits - 1):
            return f"{name} {value} does not fit in {bits} bits"
    return None


