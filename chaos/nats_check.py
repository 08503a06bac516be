"""The checker of the NATS JetStream power-loss comparison: pure functions over what the producers were told
(:class:`Publish`) and what the stream holds afterwards (:class:`Stored`, in stream order).

The figures are the ones the raftmq ``power-loss`` verdict gives, so the two runs can be put side by side:

- ``lost``: a publish that got a PubAck (the stream's Raft group stored it, JetStream says) and whose
  message id is nowhere in the stream.
- ``reordered``: a producer publishes one message at a time (the next only after the previous one's ack or
  give-up), so its acknowledged messages must be stored in the order it sent them; each acknowledged message
  found before an acknowledged message the same producer sent earlier counts once (raftmq's ``key_order``;
  a JetStream stream is one ordered log, so every producer's messages are one "key").
- ``stored_twice``: one message id at two stream sequences (retries carry the id in ``Nats-Msg-Id``, and the
  stream deduplicates them within its duplicate window, as raftmq does by UNIQ_KEY).
- ``phantom``: a message id in the stream that no producer sent.

Counted, not violations: ``moved`` (an acknowledged message found at a sequence other than its PubAck's:
after a tail was lost, sequences are handed out again), unacknowledged messages that are stored anyway (an
unknown outcome), retries.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final

#: the examples of each kind kept in a result (the counts are always complete)
EXAMPLES_MAX: Final = 20


@dataclass(frozen=True, slots=True)
class Publish:
    """One message as its producer saw it, every attempt folded: ``ack_sequence`` is the stream sequence of
    the first PubAck (None: no attempt was acknowledged, an unknown outcome)."""

    message_id: str
    producer: int
    #: the producer's own count, in send order
    sequence: int
    attempts: int
    first_send_time: float
    ack_sequence: int | None = None
    ack_time: float | None = None

    @property
    def acked(self) -> bool:
        return self.ack_sequence is not None

    def to_json(self) -> dict[str, Any]:
        return {"message_id": self.message_id, "producer": self.producer, "sequence": self.sequence,
                "attempts": self.attempts, "first_send_time": round(self.first_send_time, 6),
                "ack_sequence": self.ack_sequence,
                "ack_time": None if self.ack_time is None else round(self.ack_time, 6)}


@dataclass(frozen=True, slots=True)
class Stored:
    """One message read back from the stream."""

    stream_sequence: int
    message_id: str


@dataclass(frozen=True, slots=True)
class NatsCheck:
    messages: int
    acked: int
    unacked: int
    unacked_stored: int
    retried: int
    stored: int
    lost: int
    reordered: int
    stored_twice: int
    phantom: int
    moved: int
    #: a few message ids of each kind, for the post-mortem
    examples: dict[str, tuple[str, ...]]

    @property
    def clean(self) -> bool:
        return not (self.lost or self.reordered or self.stored_twice or self.phantom)

    def to_json(self) -> dict[str, Any]:
        return {"clean": self.clean, "messages": self.messages, "acked": self.acked, "unacked": self.unacked,
                "unacked_stored": self.unacked_stored, "retried": self.retried, "stored": self.stored,
                "lost": self.lost, "reordered": self.reordered, "stored_twice": self.stored_twice,
                "phantom": self.phantom, "moved": self.moved,
                "examples": {kind: list(ids) for kind, ids in sorted(self.examples.items())}}


def check(publishes: Iterable[Publish], stored: Sequence[Stored]) -> NatsCheck:
    """Compare the acknowledged publishes with the stream as read (``stored`` in stream order)."""
    sent = {publish.message_id: publish for publish in publishes}
    positions: dict[str, list[int]] = defaultdict(list)
    for message in stored:
        positions[message.message_id].append(message.stream_sequence)
    acked = [publish for publish in sent.values() if publish.acked]
    lost = sorted((publish for publish in acked if publish.message_id not in positions),
                  key=lambda publish: (publish.producer, publish.sequence))
    twice = sorted(message_id for message_id, found in positions.items() if len(found) > 1)
    phantom = sorted(message_id for message_id in positions if message_id not in sent)
    moved = sorted(publish.message_id for publish in acked
                   if publish.message_id in positions and positions[publish.message_id][0] != publish.ack_sequence)
    reordered = _reordered(acked, positions)
    examples = {"lost": tuple(publish.message_id for publish in lost[:EXAMPLES_MAX]),
                "reordered": tuple(reordered[:EXAMPLES_MAX]), "stored_twice": tuple(twice[:EXAMPLES_MAX]),
                "phantom": tuple(phantom[:EXAMPLES_MAX]), "moved": tuple(moved[:EXAMPLES_MAX])}
    return NatsCheck(
        messages=len(sent), acked=len(acked), unacked=len(sent) - len(acked),
        unacked_stored=sum(1 for publish in sent.values() if not publish.acked and publish.message_id in positions),
        retried=sum(1 for publish in sent.values() if publish.attempts > 1), stored=len(stored),
        lost=len(lost), reordered=len(reordered), stored_twice=len(twice), phantom=len(phantom), moved=len(moved),
        examples={kind: ids for kind, ids in examples.items() if ids})


def _reordered(acked: Iterable[Publish], positions: dict[str, list[int]]) -> list[str]:
    """Per producer, in send order, the acknowledged messages found at a stream sequence lower than one an
    earlier acknowledged message of that producer was found at (its first position)."""
    by_producer: dict[int, list[Publish]] = defaultdict(list)
    for publish in acked:
        if publish.message_id in positions:
            by_producer[publish.producer].append(publish)
    reordered = []
    for producer in sorted(by_producer):
        highest = 0
        for publish in sorted(by_producer[producer], key=lambda publish: publish.sequence):
            position = positions[publish.message_id][0]
            if position < highest:
                reordered.append(publish.message_id)
            highest = max(highest, position)
    return reordered
