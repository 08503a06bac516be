"""The NATS comparison's checker (chaos.nats_check), as tables: what it calls lost, reordered, stored twice,
phantom and moved, from publishes and a stream read back. No NATS needed."""

from __future__ import annotations

import pytest

from chaos.nats_check import NatsCheck, Publish, Stored, check


def acked(producer: int, sequence: int, ack_sequence: int) -> Publish:
    return Publish(f"p{producer}-{sequence}", producer, sequence, 1, float(sequence), ack_sequence, sequence + 0.1)


def unacked(producer: int, sequence: int) -> Publish:
    return Publish(f"p{producer}-{sequence}", producer, sequence, 4, float(sequence))


def stream(*message_ids: str) -> list[Stored]:
    return [Stored(position, message_id) for position, message_id in enumerate(message_ids, start=1)]


def figures(result: NatsCheck) -> dict[str, int]:
    return {"lost": result.lost, "reordered": result.reordered, "stored_twice": result.stored_twice,
            "phantom": result.phantom, "moved": result.moved}


NOTHING = {"lost": 0, "reordered": 0, "stored_twice": 0, "phantom": 0, "moved": 0}

CASES = [
    ("every ack stored where it said",
     [acked(0, 0, 1), acked(1, 0, 2), acked(0, 1, 3)], stream("p0-0", "p1-0", "p0-1"), NOTHING),
    ("an acked message missing is lost",
     [acked(0, 0, 1), acked(0, 1, 2)], stream("p0-0"), {**NOTHING, "lost": 1}),
    ("a message gone from the middle: lost, and the one after it moved",
     [acked(0, 0, 1), acked(0, 1, 2), acked(1, 0, 3)], stream("p0-0", "p1-0"), {**NOTHING, "lost": 1, "moved": 1}),
    ("a lost tail whose sequence was handed out again: lost only",
     [acked(0, 0, 1), acked(0, 1, 2), acked(1, 0, 2)], stream("p0-0", "p1-0"), {**NOTHING, "lost": 1}),
    ("a producer's later message stored before its earlier one",
     [acked(0, 0, 1), acked(0, 1, 2)], stream("p0-1", "p0-0"), {**NOTHING, "reordered": 1, "moved": 2}),
    ("the order of two producers' messages between them is free",
     [acked(0, 0, 2), acked(1, 0, 1)], stream("p1-0", "p0-0"), NOTHING),
    ("an unacknowledged message stored or not: no violation",
     [acked(0, 0, 1), unacked(0, 1), unacked(0, 2)], stream("p0-0", "p0-2"), NOTHING),
    ("an unacknowledged message out of order: no violation",
     [acked(0, 0, 2), unacked(0, 1)], stream("p0-1", "p0-0"), NOTHING),
    ("one id at two sequences",
     [acked(0, 0, 1)], stream("p0-0", "p0-0"), {**NOTHING, "stored_twice": 1}),
    ("an id nobody sent",
     [acked(0, 0, 1)], stream("p0-0", "p9-9"), {**NOTHING, "phantom": 1}),
    ("the stream gone: every ack lost",
     [acked(0, 0, 1), acked(0, 1, 2), unacked(0, 2)], [], {**NOTHING, "lost": 2}),
]


@pytest.mark.parametrize(("publishes", "stored", "expected"), [case[1:] for case in CASES],
                         ids=[case[0] for case in CASES])
def test_check_counts(publishes: list[Publish], stored: list[Stored], expected: dict[str, int]) -> None:
    result = check(publishes, stored)
    assert figures(result) == expected
    assert result.clean == (expected["lost"] + expected["reordered"] + expected["stored_twice"]
                            + expected["phantom"] == 0)
    assert result.acked == sum(1 for publish in publishes if publish.acked)


def test_check_counts_each_reordered_message_once_and_names_examples() -> None:
    """A message stored ahead of three earlier ones of its producer counts once (it is the one out of
    place), and so does the next one stored ahead of them too."""
    publishes = [acked(0, sequence, sequence + 1) for sequence in range(5)]
    result = check(publishes, stream("p0-3", "p0-4", "p0-0", "p0-1", "p0-2"))
    assert result.reordered == 2 and result.examples["reordered"] == ("p0-3", "p0-4")
    document = result.to_json()
    assert document["reordered"] == 2 and document["clean"] is False


def test_check_figures_of_retries_and_unacked_stored() -> None:
    publishes = [acked(0, 0, 1), Publish("p0-1", 0, 1, 3, 1.0, 2, 1.5), unacked(0, 2), unacked(0, 3)]
    result = check(publishes, stream("p0-0", "p0-1", "p0-2"))
    assert (result.messages, result.acked, result.unacked, result.unacked_stored, result.retried, result.stored) == (
        4, 2, 2, 1, 3, 3)
    assert result.clean
