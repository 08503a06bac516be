"""The checker: pure functions over a :class:`~chaos.history.History`.

What counts as a violation (each breaks a promise the group makes its users about failures):

- ``lost``: a message acknowledged to its producer that a consumer group never received.
- ``stored_twice``: one UNIQ_KEY at two different queue positions. Retries carry the UNIQ_KEY and the
  broker deduplicates them for ``DEDUPE_WINDOW_SECONDS``, so this is a broker fault, unless the attempts
  of that message spanned more than the window (then it is counted, not a violation).
- ``queue_order``: within one consumer session, queue offsets of one queue did not strictly increase.
- ``key_order``: the acknowledged messages of one sharding key are not stored in the order they were
  sent (the producer sends one key's messages one at a time, so send order is the key's order).
- ``ack_mismatch``: a message was found at a queue position other than the one its ack named.
- ``position_conflict``: two deliveries of the same queue position carry different messages (replicas or
  reads disagree about what is stored there).
- ``phantom``: a message received that no producer ever sent.
- ``rolled_back_consumed``: a transactional message whose local transaction decided to roll back was
  received (whether it answered at once or only to the check-back; whether or not its half was acked).
- ``reused_id``: one UNIQ_KEY given to two different messages (another producer, sharding key or
  sequence). Every other check folds a message's attempts by UNIQ_KEY, so a reused id would hide the
  loss of one of its messages; a client's ids must not repeat, whatever the date or the send rate.
- ``acked_redelivered``: a 5.x consumer's acknowledgement (AckMessage, pop through Raft) was answered OK, and
  a receive of its group sent after that answer got the message again. An ack the leader answered is committed:
  no leader, old or new, may hand the message out again (a receive already on its way when the ack was
  answered may still carry it: only receives sent after the answer count).
- ``wedged``: while the leader's disk was full (a ``disk-full-leader`` fault: that member's disk alone, the
  other members healthy), no send was acknowledged for longer than ``WEDGE_BOUND_SECONDS``, or the full
  member went on leading that long. A full disk on the leader makes it step down or stop, never wedge the
  group (see :func:`check_full_disk_leaders`).

A transactional message whose half was acknowledged and whose local transaction decided to commit counts
as an acknowledged send: ``lost`` and ``stored_twice`` apply to it (each group receives it, from one
position). Its ack names the half's position, so ``ack_mismatch`` and ``key_order`` leave it out, as they
leave out delayed messages.

5.x operations (chaos.grpc_workload) are checked the same way: a 5.x producer's acknowledged send must reach
every group, 4.x and 5.x alike, at one position, in its sharding key's order (it sends each key as a FIFO
message group), and a 5.x consumer group (pop) must receive every acknowledged message. Its ack names no queue
(SendResultEntry carries only the queue offset), so ``ack_mismatch`` compares the offset alone for it;
``queue_order`` leaves pop deliveries out (pop hands out what is visible, redeliveries included).

Not violations, but counted: the same position delivered again to a group (``redeliveries``: consumer
sessions restart from the committed offset), messages that were never acknowledged but are stored
(``unacked_stored``: allowed, an unknown outcome), retries, and unavailability: the longest gap between
successful acks, and per fault the time from its start to the first ack after it and the longest ack gap
around it.

:func:`check` returns a :class:`CheckResult`; :func:`describe` renders it with the seed and, for each
violation, the slice of the history that shows it.
"""

from __future__ import annotations

import bisect
import itertools
import json
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from chaos.history import (
    TRANSACTION_COMMIT,
    TRANSACTION_ROLLBACK,
    DeliveryEvent,
    Event,
    FaultEvent,
    History,
    PopAckEvent,
    SendEvent,
    encode_event,
    event_time,
)

#: the broker deduplicates a retried send (same topic, UNIQ_KEY, reconsume count) within this window
DEDUPE_WINDOW_SECONDS: Final = 120.0
#: how long after a fault ends its unavailability window still counts (a healed node can disrupt once)
FAULT_SETTLE_SECONDS: Final = 5.0
#: events of a slice shown at most per violation, and violations described at most
SLICE_EVENTS_MAX: Final = 40
VIOLATIONS_SHOWN_MAX: Final = 20
#: how far around a violation's own events a slice reaches for faults, leader changes and sessions
SLICE_MARGIN_SECONDS: Final = 2.0

#: the fault a full disk on the leader is recorded as (chaos.faults.Faults.disk_full_leader)
FULL_DISK_LEADER_FAULT: Final = "disk-full-leader"
#: while the leader's disk is full, acknowledgements stop and the full member leads no longer than this. The
#: leader finds the disk full at its next journal append (at once under load) and steps down; the followers
#: stand after an election timeout without heartbeats (``[raft] election_timeout_max_ms``, 2 s), twice with a
#: split vote (4 s); a send the full leader had taken waits out the client's timeout (the workload's
#: ``send_timeout_seconds``, 5 s) before its retry reaches the new leader, while sends that meet the old one
#: later get "not leader" and go to the new one at once. 4 + 5 s: every fill lasts longer
#: (chaos.scenarios.DISK_FULL_LEADER_HOLD_SECONDS), so a leader that keeps leading through it is caught.
WEDGE_BOUND_SECONDS: Final = 9.0

VIOLATION_KINDS: Final = ("lost", "stored_twice", "queue_order", "key_order", "ack_mismatch", "position_conflict",
                          "phantom", "rolled_back_consumed", "reused_id", "acked_redelivered", "wedged")


@dataclass(frozen=True, slots=True)
class Violation:
    kind: str
    detail: str
    uniq_keys: tuple[str, ...] = ()
    group: str | None = None
    queue: int | None = None
    #: the span of the events that show it (seconds since the run started)
    start: float = 0.0
    end: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "detail": self.detail, "uniq_keys": list(self.uniq_keys), "group": self.group,
                "queue": self.queue, "start": round(self.start, 6), "end": round(self.end, 6)}


@dataclass(frozen=True, slots=True)
class SentMessage:
    """Every attempt of one UNIQ_KEY, folded."""

    uniq_key: str
    sharding_key: str
    sequence: int
    delay_level: int
    attempts: int
    first_send_time: float
    last_end_time: float
    #: the first successful attempt, if any
    ack: SendEvent | None
    #: "" for a plain send, else the local transaction's decision (see SendEvent.transaction)
    transaction: str = ""
    checked_back: bool = False

    @property
    def acked(self) -> bool:
        return self.ack is not None

    @property
    def must_be_consumed(self) -> bool:
        """Acknowledged, and not a transaction that rolled back."""
        return self.ack is not None and self.transaction != TRANSACTION_ROLLBACK

    @property
    def stored_elsewhere(self) -> bool:
        """Consumers find it somewhere other than where its ack said (delayed, or a transaction's half)."""
        return bool(self.delay_level or self.transaction)


@dataclass(frozen=True, slots=True)
class Gap:
    start: float
    end: float

    @property
    def seconds(self) -> float:
        return self.end - self.start

    def to_json(self) -> dict[str, float]:
        return {"start": round(self.start, 3), "end": round(self.end, 3), "seconds": round(self.seconds, 3)}


@dataclass(frozen=True, slots=True)
class FaultWindow:
    fault: FaultEvent
    #: seconds from the fault's start to the first ack that ended after it (None: no ack after it)
    first_ack_after_seconds: float | None
    #: the longest gap between consecutive acks that is this fault's (see :func:`fault_windows`)
    longest_gap: Gap | None

    @property
    def recovery_seconds(self) -> float | None:
        """From the fault's start to the first ack that ended its longest gap (unlike the first ack after
        it, an answer that was already on its way when the fault struck does not count); None when that
        gap began after the fault was over (the fault caused no outage of its own)."""
        gap = self.longest_gap
        if gap is None or gap.end < self.fault.start or gap.start > self.fault.end:
            return None
        return gap.end - self.fault.start

    def to_json(self) -> dict[str, Any]:
        recovery = self.recovery_seconds
        return {"kind": self.fault.kind, "target": self.fault.target, "start": round(self.fault.start, 3),
                "end": round(self.fault.end, 3),
                "recovery_seconds": None if recovery is None else round(recovery, 3),
                "first_ack_after_seconds": None if self.first_ack_after_seconds is None
                else round(self.first_ack_after_seconds, 3),
                "longest_gap": None if self.longest_gap is None else self.longest_gap.to_json()}


@dataclass(frozen=True, slots=True)
class Unavailability:
    #: the longest gap between consecutive successful acks over the whole run
    longest_gap: Gap | None
    faults: tuple[FaultWindow, ...]

    def to_json(self) -> dict[str, Any]:
        return {"longest_gap": None if self.longest_gap is None else self.longest_gap.to_json(),
                "faults": [window.to_json() for window in self.faults]}


@dataclass(frozen=True, slots=True)
class FullDiskLeader:
    """What one full disk on the leader (a ``disk-full-leader`` fault, from its fill to its freeing) did to the
    group: the acks and who led, as the history shows them."""

    fault: FaultEvent
    #: the longest gap between acks that overlaps the time the disk was full (to the fault's end when no
    #: ack came after its start)
    longest_gap: Gap | None
    #: from the fill to the ack that ended that gap; None: no ack came after the fill
    acks_resumed_after_seconds: float | None
    #: from the fill to the end of the full member's first stretch as leader (0: it did not lead when its
    #: disk was filled); None: it led until the disk was freed
    stepped_down_after_seconds: float | None
    #: the longest stretch the full member led while its disk was full (a gap in the monitor's view between
    #: two of its stretches counts as leading)
    led_seconds: float

    @property
    def wedged(self) -> bool:
        gap = self.longest_gap
        return (self.acks_resumed_after_seconds is None or (gap is not None and gap.seconds > WEDGE_BOUND_SECONDS)
                or self.led_seconds > WEDGE_BOUND_SECONDS)

    def to_json(self) -> dict[str, Any]:
        def rounded(value: float | None) -> float | None:
            return None if value is None else round(value, 3)

        return {"node": self.fault.target, "start": round(self.fault.start, 3), "end": round(self.fault.end, 3),
                "longest_gap": None if self.longest_gap is None else self.longest_gap.to_json(),
                "acks_resumed_after_seconds": rounded(self.acks_resumed_after_seconds),
                "stepped_down_after_seconds": rounded(self.stepped_down_after_seconds),
                "led_seconds": round(self.led_seconds, 3), "bound_seconds": WEDGE_BOUND_SECONDS,
                "wedged": self.wedged, "detail": self.fault.detail}


@dataclass(frozen=True, slots=True)
class GroupFigures:
    deliveries: int
    distinct_messages: int
    redeliveries: int
    sessions: int

    def to_json(self) -> dict[str, int]:
        return {"deliveries": self.deliveries, "distinct_messages": self.distinct_messages,
                "redeliveries": self.redeliveries, "sessions": self.sessions}


@dataclass(frozen=True, slots=True)
class CheckResult:
    seed: int | None
    violations: tuple[Violation, ...]
    messages: int
    acked: int
    unacked: int
    unacked_stored: int
    send_attempts: int
    retried_messages: int
    stored_twice_outside_dedupe_window: int
    groups: dict[str, GroupFigures] = field(default_factory=dict)
    transactions: dict[str, int] = field(default_factory=dict)
    unavailability: Unavailability = field(default_factory=lambda: Unavailability(None, ()))
    full_disk_leaders: tuple[FullDiskLeader, ...] = ()

    @property
    def clean(self) -> bool:
        return not self.violations

    def counts(self) -> dict[str, int]:
        counts = dict.fromkeys(VIOLATION_KINDS, 0)
        for violation in self.violations:
            counts[violation.kind] = counts.get(violation.kind, 0) + 1
        return counts

    def to_json(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "clean": self.clean,
            "violation_counts": self.counts(),
            "violations": [violation.to_json() for violation in self.violations],
            "messages": self.messages,
            "acked": self.acked,
            "unacked": self.unacked,
            "unacked_stored": self.unacked_stored,
            "send_attempts": self.send_attempts,
            "retried_messages": self.retried_messages,
            "stored_twice_outside_dedupe_window": self.stored_twice_outside_dedupe_window,
            "groups": {name: figures.to_json() for name, figures in sorted(self.groups.items())},
            "transactions": self.transactions,
            "unavailability": self.unavailability.to_json(),
            "full_disk_leaders": [window.to_json() for window in self.full_disk_leaders],
        }


# ------------------------------------------------------------------------------------------ folding


def fold_messages(sends: Iterable[SendEvent]) -> dict[str, SentMessage]:
    """Every UNIQ_KEY's attempts folded into one :class:`SentMessage`."""
    attempts: dict[str, list[SendEvent]] = defaultdict(list)
    for send in sends:
        attempts[send.uniq_key].append(send)
    messages = {}
    for uniq_key, events in attempts.items():
        acks = sorted((event for event in events if event.acked), key=lambda event: event.end_time)
        first = min(events, key=lambda event: event.send_time)
        messages[uniq_key] = SentMessage(
            uniq_key=uniq_key,
            sharding_key=first.sharding_key,
            sequence=first.sequence,
            delay_level=first.delay_level,
            attempts=len(events),
            first_send_time=first.send_time,
            last_end_time=max(event.end_time for event in events),
            ack=acks[0] if acks else None,
            transaction=first.transaction,
            checked_back=first.checked_back,
        )
    return messages


def _positions(deliveries: Iterable[DeliveryEvent]) -> dict[str, dict[tuple[int, int], list[DeliveryEvent]]]:
    """UNIQ_KEY -> (queue, queue offset) -> its deliveries (any group)."""
    positions: dict[str, dict[tuple[int, int], list[DeliveryEvent]]] = defaultdict(lambda: defaultdict(list))
    for delivery in deliveries:
        positions[delivery.uniq_key][(delivery.queue, delivery.queue_offset)].append(delivery)
    return positions


def _span(events: Iterable[SendEvent | DeliveryEvent]) -> tuple[float, float]:
    times = [event.send_time if isinstance(event, SendEvent) else event.time for event in events]
    times += [event.end_time for event in events if isinstance(event, SendEvent)]
    return (min(times), max(times)) if times else (0.0, 0.0)


# ----------------------------------------------------------------------------------------- checks


def check_lost(history: History, messages: dict[str, SentMessage] | None = None) -> list[Violation]:
    """Acknowledged messages some group never received (one violation per message, naming the groups)."""
    messages = fold_messages(history.sends) if messages is None else messages
    received: dict[str, set[str]] = defaultdict(set)
    for delivery in history.deliveries:
        received[delivery.uniq_key].add(delivery.group)
    groups = set(history.groups)
    violations = []
    for message in sorted(messages.values(), key=lambda item: item.first_send_time):
        if message.ack is None or not message.must_be_consumed:
            continue
        missing = sorted(groups - received.get(message.uniq_key, set()))
        if missing:
            ack = message.ack
            if message.transaction:
                where = "a committed transaction" + (" (checked back)" if message.checked_back else "")
            elif message.delay_level:
                where = f"delay level {message.delay_level}"
            else:
                where = f"queue {ack.queue} offset {ack.queue_offset}"
            violations.append(Violation(
                "lost", f"acknowledged at {ack.end_time:.3f} s ({where}), never received by {', '.join(missing)}",
                (message.uniq_key,), missing[0] if len(missing) == 1 else None, ack.queue,
                message.first_send_time, ack.end_time))
    return violations


def check_stored_twice(history: History, messages: dict[str, SentMessage] | None = None
                       ) -> tuple[list[Violation], int]:
    """UNIQ_KEYs found at more than one queue position; the count of those whose attempts spanned more
    than the dedupe window (not violations) comes second."""
    messages = fold_messages(history.sends) if messages is None else messages
    violations = []
    outside_window = 0
    for uniq_key, positions in _positions(history.deliveries).items():
        if len(positions) < 2:
            continue
        message = messages.get(uniq_key)
        if message is not None and message.last_end_time - message.first_send_time > DEDUPE_WINDOW_SECONDS:
            outside_window += 1
            continue
        deliveries = [delivery for found in positions.values() for delivery in found]
        groups = sorted({delivery.group for delivery in deliveries})
        places = ", ".join(f"queue {queue} offset {offset}" for queue, offset in sorted(positions))
        start, end = _span(deliveries)
        if message is not None:
            start = min(start, message.first_send_time)
        violations.append(Violation(
            "stored_twice", f"stored at {places} (seen by {', '.join(groups)}; "
            f"{message.attempts if message else 0} send attempt(s))",
            (uniq_key,), groups[0] if len(groups) == 1 else None, None, start, end))
    return violations, outside_window


def check_queue_order(history: History) -> list[Violation]:
    """Within each (group, session, queue), delivered queue offsets strictly increase (4.x pulls; pop
    deliveries aside)."""
    last: dict[tuple[str, int, int], DeliveryEvent] = {}
    violations = []
    for delivery in history.deliveries:
        if delivery.pop:
            continue
        key = (delivery.group, delivery.session, delivery.queue)
        previous = last.get(key)
        if previous is not None and delivery.queue_offset <= previous.queue_offset:
            violations.append(Violation(
                "queue_order", f"session {delivery.session} of {delivery.group} received queue {delivery.queue} "
                f"offset {delivery.queue_offset} after offset {previous.queue_offset}",
                (previous.uniq_key, delivery.uniq_key), delivery.group, delivery.queue, previous.time, delivery.time))
        last[key] = delivery
    return violations


def _stored_position(message: SentMessage, positions: dict[tuple[int, int], list[DeliveryEvent]] | None
                     ) -> tuple[int, int] | None:
    if positions:
        return min(positions)
    ack = message.ack
    if ack is not None and not message.stored_elsewhere and ack.queue is not None and ack.queue_offset is not None:
        return ack.queue, ack.queue_offset
    return None


def check_key_order(history: History, messages: dict[str, SentMessage] | None = None) -> list[Violation]:
    """Acknowledged messages of one sharding key (delayed and transactional ones aside) sit in one queue, in
    send order."""
    messages = fold_messages(history.sends) if messages is None else messages
    positions = _positions(history.deliveries)
    by_key: dict[str, list[SentMessage]] = defaultdict(list)
    for message in messages.values():
        if message.acked and not message.stored_elsewhere:
            by_key[message.sharding_key].append(message)
    violations = []
    for sharding_key, members in sorted(by_key.items()):
        members.sort(key=lambda item: item.sequence)
        previous: tuple[SentMessage, tuple[int, int]] | None = None
        for message in members:
            position = _stored_position(message, positions.get(message.uniq_key))
            if position is None:
                continue  # lost: reported by check_lost
            if previous is not None:
                earlier, earlier_position = previous
                if position[0] != earlier_position[0] or position[1] <= earlier_position[1]:
                    ack = message.ack
                    violations.append(Violation(
                        "key_order", f"sharding key {sharding_key!r}: sequence {message.sequence} is at queue "
                        f"{position[0]} offset {position[1]}, sequence {earlier.sequence} at queue "
                        f"{earlier_position[0]} offset {earlier_position[1]}",
                        (earlier.uniq_key, message.uniq_key), None, position[0], earlier.first_send_time,
                        ack.end_time if ack is not None else message.last_end_time))
            previous = (message, position)
    return violations


def check_ack_positions(history: History, messages: dict[str, SentMessage] | None = None) -> list[Violation]:
    """A message is received where its ack said it was stored (delayed and transactional messages aside)."""
    messages = fold_messages(history.sends) if messages is None else messages
    violations = []
    for uniq_key, positions in _positions(history.deliveries).items():
        message = messages.get(uniq_key)
        if message is None or message.ack is None or message.stored_elsewhere:
            continue
        ack = message.ack
        acked_at = (ack.queue, ack.queue_offset)
        if ack.queue is None:  # a 5.x ack names the queue offset only
            elsewhere = sorted(position for position in positions if position[1] != ack.queue_offset)
        else:
            elsewhere = sorted(position for position in positions if position != acked_at)
        if elsewhere and len(positions) == 1:  # several positions are stored_twice's to report
            queue, offset = elsewhere[0]
            deliveries = positions[elsewhere[0]]
            violations.append(Violation(
                "ack_mismatch", f"acknowledged at queue {ack.queue} offset {ack.queue_offset}, "
                f"received at queue {queue} offset {offset}", (uniq_key,), None, queue,
                ack.send_time, max(delivery.time for delivery in deliveries)))
    return violations


def check_position_conflicts(history: History) -> list[Violation]:
    """Every delivery of one (queue, offset) carries the same message."""
    seen: dict[tuple[int, int], DeliveryEvent] = {}
    violations = []
    reported: set[tuple[int, int]] = set()
    for delivery in history.deliveries:
        position = (delivery.queue, delivery.queue_offset)
        first = seen.setdefault(position, delivery)
        if first.uniq_key != delivery.uniq_key and position not in reported:
            reported.add(position)
            violations.append(Violation(
                "position_conflict", f"queue {position[0]} offset {position[1]} held {first.uniq_key} "
                f"(from {first.node or '?'} to {first.group}) and {delivery.uniq_key} (from {delivery.node or '?'} "
                f"to {delivery.group})", (first.uniq_key, delivery.uniq_key), None, position[0], first.time,
                delivery.time))
    return violations


def check_phantoms(history: History) -> list[Violation]:
    """Messages received that no producer sent."""
    sent = {send.uniq_key for send in history.sends}
    first: dict[str, DeliveryEvent] = {}
    for delivery in history.deliveries:
        if delivery.uniq_key not in sent:
            first.setdefault(delivery.uniq_key, delivery)
    return [Violation("phantom", f"received from queue {delivery.queue} offset {delivery.queue_offset} by "
                      f"{delivery.group}, never sent", (uniq_key,), delivery.group, delivery.queue, delivery.time,
                      delivery.time)
            for uniq_key, delivery in first.items()]


def check_rolled_back(history: History, messages: dict[str, SentMessage] | None = None) -> list[Violation]:
    """Transactional messages whose local transaction rolled back, received by any group (one violation
    per message, at its first delivery)."""
    messages = fold_messages(history.sends) if messages is None else messages
    first: dict[str, DeliveryEvent] = {}
    for delivery in history.deliveries:
        message = messages.get(delivery.uniq_key)
        if message is not None and message.transaction == TRANSACTION_ROLLBACK:
            first.setdefault(delivery.uniq_key, delivery)
    violations = []
    for uniq_key, delivery in first.items():
        message = messages[uniq_key]
        how = "after UNKNOW, to the check-back" if message.checked_back else "at once"
        violations.append(Violation(
            "rolled_back_consumed", f"rolled back ({how}; half {'acked' if message.acked else 'not acked'}), "
            f"received from queue {delivery.queue} offset {delivery.queue_offset} by {delivery.group}",
            (uniq_key,), delivery.group, delivery.queue, message.first_send_time, delivery.time))
    return violations


def check_reused_ids(history: History) -> list[Violation]:
    """UNIQ_KEYs sent for more than one message (producer, sharding key, sequence)."""
    named: dict[str, dict[tuple[str, str, int], SendEvent]] = defaultdict(dict)
    for send in history.sends:
        named[send.uniq_key].setdefault((send.producer, send.sharding_key, send.sequence), send)
    violations = []
    for uniq_key, messages in named.items():
        if len(messages) > 1:
            firsts = sorted(messages.values(), key=lambda send: send.send_time)
            which = ", ".join(f"{send.producer} {send.sharding_key}#{send.sequence}" for send in firsts[:4])
            violations.append(Violation("reused_id", f"one UNIQ_KEY named {len(messages)} messages: {which}",
                                        (uniq_key,), None, None, firsts[0].send_time, firsts[-1].end_time))
    return violations


def check_acked_redelivered(history: History) -> list[Violation]:
    """5.x deliveries to a group of a stored message (a UNIQ_KEY at one position: a message stored twice is
    stored_twice's to report) whose acknowledgement that group's consumer had already been answered OK when the
    receive was sent (one violation per message and group, at its first such delivery)."""
    first_ack: dict[tuple[str, str, int, int], PopAckEvent] = {}
    for pop_ack in history.pop_acks:
        if pop_ack.acked:
            key = (pop_ack.group, pop_ack.uniq_key, pop_ack.queue, pop_ack.queue_offset)
            earlier = first_ack.get(key)
            if earlier is None or pop_ack.end_time < earlier.end_time:
                first_ack[key] = pop_ack
    reported: set[tuple[str, str, int, int]] = set()
    violations = []
    for delivery in sorted(history.deliveries, key=event_time):
        key = (delivery.group, delivery.uniq_key, delivery.queue, delivery.queue_offset)
        acked = first_ack.get(key)
        if (acked is None or key in reported or delivery.requested is None
                or delivery.requested <= acked.end_time):
            continue
        reported.add(key)
        violations.append(Violation(
            "acked_redelivered", f"acknowledged by {delivery.group} at {acked.end_time:.3f} s (queue {acked.queue} "
            f"offset {acked.queue_offset}, by {acked.node or '?'}), delivered again by {delivery.node or '?'} to a "
            f"receive sent at {delivery.requested:.3f} s (attempt {delivery.attempt}, queue {delivery.queue} offset "
            f"{delivery.queue_offset})", (delivery.uniq_key,), delivery.group, delivery.queue, acked.send_time,
            delivery.time))
    return violations


def transaction_figures(messages: dict[str, SentMessage], delivered: set[str]) -> dict[str, int]:
    """Transactional messages by decision, and how many of each were acked (half) and received."""
    figures = dict.fromkeys(("messages", "committed", "committed_acked", "committed_received", "rolled_back",
                             "rolled_back_acked", "rolled_back_received", "checked_back"), 0)
    for message in messages.values():
        if not message.transaction:
            continue
        figures["messages"] += 1
        figures["checked_back"] += message.checked_back
        name = "committed" if message.transaction == TRANSACTION_COMMIT else "rolled_back"
        figures[name] += 1
        figures[f"{name}_acked"] += message.acked
        figures[f"{name}_received"] += message.uniq_key in delivered
    return figures


# --------------------------------------------------------------------------------- unavailability


def ack_times(sends: Iterable[SendEvent]) -> list[float]:
    """End times of successful attempts, sorted."""
    return sorted(send.end_time for send in sends if send.acked)


def longest_gap(times: Sequence[float], start: float | None = None, end: float | None = None) -> Gap | None:
    """The longest gap between consecutive ``times`` (sorted) among the gaps overlapping [start, end]
    (either bound may be None); None when no gap overlaps."""
    if not times:
        return None
    best: Gap | None = None
    for earlier, later in itertools.pairwise(times):
        if start is not None and later < start:
            continue
        if end is not None and earlier > end:
            break
        if best is None or later - earlier > best.seconds:
            best = Gap(earlier, later)
    return best


def fault_windows(faults: Sequence[FaultEvent], times: Sequence[float]) -> tuple[FaultWindow, ...]:
    """Per fault: the first ack after its start, and the longest ack gap that is its own: a gap that ends
    after the fault started (and not after the next fault started: then it is the next one's), and starts
    no later than ``FAULT_SETTLE_SECONDS`` after the fault ended."""
    ordered = sorted(faults, key=lambda fault: fault.start)
    windows = []
    for index, fault in enumerate(ordered):
        after = bisect.bisect_right(times, fault.start)
        first = times[after] - fault.start if after < len(times) else None
        next_start = ordered[index + 1].start if index + 1 < len(ordered) else None
        best: Gap | None = None
        for earlier, later in itertools.pairwise(times[max(0, after - 1):]):
            if earlier > fault.end + FAULT_SETTLE_SECONDS or (next_start is not None and later > next_start):
                break
            if best is None or later - earlier > best.seconds:
                best = Gap(earlier, later)
        windows.append(FaultWindow(fault, first, best))
    return tuple(windows)


def unavailability(history: History) -> Unavailability:
    times = ack_times(history.sends)
    return Unavailability(longest_gap(times), fault_windows(history.faults, times))


# ------------------------------------------------------------------------------ full disk on the leader


def leader_segments(history: History, start: float, end: float) -> list[tuple[float, float, str | None]]:
    """Who the monitor saw leading over [start, end]: (from, to, leader or None) in time order."""
    events = sorted(history.leaders, key=event_time)
    current: str | None = None
    for event in events:
        if event.time > start:
            break
        current = event.leader
    segments = []
    at = start
    for event in events:
        if start < event.time < end:
            segments.append((at, event.time, current))
            at, current = event.time, event.leader
    segments.append((at, end, current))
    return segments


def led_stretches(segments: Sequence[tuple[float, float, str | None]], node: str) -> list[tuple[float, float]]:
    """The stretches ``node`` led in ``segments``: a time nobody was seen leading between two of its own
    segments is part of the stretch (a poll it did not answer in time), another leader ends it."""
    stretches = []
    begin: float | None = None
    last = 0.0
    for low, high, leader in segments:
        if leader == node:
            begin = low if begin is None else begin
            last = high
        elif leader is not None and begin is not None:
            stretches.append((begin, last))
            begin = None
    if begin is not None:
        stretches.append((begin, last))
    return stretches


def full_disk_leaders(history: History, times: Sequence[float] | None = None) -> tuple[FullDiskLeader, ...]:
    """Per ``disk-full-leader`` fault: the longest ack gap while the disk was full, when acks resumed, and how
    long the full member went on leading."""
    times = ack_times(history.sends) if times is None else times
    windows = []
    for fault in sorted(history.faults, key=lambda fault: fault.start):
        if fault.kind != FULL_DISK_LEADER_FAULT:
            continue
        after = bisect.bisect_right(times, fault.start)
        if after < len(times):
            gap = longest_gap(times, fault.start, fault.end)
            resumed = None if gap is None else max(0.0, gap.end - fault.start)
        else:  # nothing acknowledged after the fill, up to the end of the run
            gap = Gap(times[after - 1] if after else fault.start, fault.end)
            resumed = None
        stretches = led_stretches(leader_segments(history, fault.start, fault.end), fault.target)
        if not stretches or stretches[0][0] > fault.start:
            stepped_down: float | None = 0.0
        else:
            stepped_down = None if stretches[0][1] >= fault.end else stretches[0][1] - fault.start
        led = max((high - low for low, high in stretches), default=0.0)
        windows.append(FullDiskLeader(fault, gap, resumed, stepped_down, led))
    return tuple(windows)


def check_full_disk_leaders(windows: Iterable[FullDiskLeader]) -> list[Violation]:
    """A full disk on the leader that wedged the group: no ack, or the full member leading, for longer than
    ``WEDGE_BOUND_SECONDS`` (the other members were healthy throughout)."""
    violations = []
    for window in windows:
        if not window.wedged:
            continue
        fault, gap = window.fault, window.longest_gap
        what = [f"{fault.target}'s disk full from {fault.start:.3f} to {fault.end:.3f} s"]
        if window.acks_resumed_after_seconds is None:
            what.append("no send acknowledged after it was filled")
        elif gap is not None and gap.seconds > WEDGE_BOUND_SECONDS:
            what.append(f"no ack for {gap.seconds:.1f} s ({gap.start:.3f}-{gap.end:.3f} s)")
        if window.led_seconds > WEDGE_BOUND_SECONDS:
            what.append(f"{fault.target} led for {window.led_seconds:.1f} s of it")
        violations.append(Violation(
            "wedged", "; ".join(what) + f" (bound {WEDGE_BOUND_SECONDS:g} s; {fault.detail})", (), None, None,
            fault.start, fault.end))
    return violations


# ------------------------------------------------------------------------------------------- all


def group_figures(history: History) -> dict[str, GroupFigures]:
    figures = {}
    for group in history.groups:
        deliveries = [delivery for delivery in history.deliveries if delivery.group == group]
        positions = {(delivery.uniq_key, delivery.queue, delivery.queue_offset) for delivery in deliveries}
        figures[group] = GroupFigures(
            deliveries=len(deliveries),
            distinct_messages=len({delivery.uniq_key for delivery in deliveries}),
            redeliveries=len(deliveries) - len(positions),
            sessions=len({(session.session, session.queue) for session in history.sessions if session.group == group}),
        )
    return figures


def check(history: History) -> CheckResult:
    messages = fold_messages(history.sends)
    stored_twice, outside_window = check_stored_twice(history, messages)
    full_disks = full_disk_leaders(history)
    violations = [
        *check_lost(history, messages),
        *stored_twice,
        *check_queue_order(history),
        *check_key_order(history, messages),
        *check_ack_positions(history, messages),
        *check_position_conflicts(history),
        *check_phantoms(history),
        *check_rolled_back(history, messages),
        *check_reused_ids(history),
        *check_acked_redelivered(history),
        *check_full_disk_leaders(full_disks),
    ]
    delivered = {delivery.uniq_key for delivery in history.deliveries}
    acked = sum(1 for message in messages.values() if message.acked)
    return CheckResult(
        seed=history.seed,
        violations=tuple(violations),
        messages=len(messages),
        acked=acked,
        unacked=len(messages) - acked,
        unacked_stored=sum(1 for message in messages.values() if not message.acked and message.uniq_key in delivered),
        send_attempts=len(history.sends),
        retried_messages=sum(1 for message in messages.values() if message.attempts > 1),
        stored_twice_outside_dedupe_window=outside_window,
        groups=group_figures(history),
        transactions=transaction_figures(messages, delivered),
        unavailability=unavailability(history),
        full_disk_leaders=full_disks,
    )


# --------------------------------------------------------------------------------------- slices


def history_slice(violation: Violation, history: History, limit: int = SLICE_EVENTS_MAX) -> list[Event]:
    """The events that show ``violation``: every send and delivery of its messages, the deliveries of its
    queue position neighbours in its group's sessions, and the faults, leader changes, sessions and notes
    around its time span. Ordered by time; at most ``limit`` (the message's own events first)."""
    keys = set(violation.uniq_keys)
    start, end = violation.start - SLICE_MARGIN_SECONDS, violation.end + SLICE_MARGIN_SECONDS
    own: list[Event] = [send for send in history.sends if send.uniq_key in keys]
    own += [delivery for delivery in history.deliveries if delivery.uniq_key in keys]
    own += [pop_ack for pop_ack in history.pop_acks if pop_ack.uniq_key in keys]
    context: list[Event] = [fault for fault in history.faults if fault.start <= end and fault.end >= start]
    context += [leader for leader in history.leaders if start <= leader.time <= end]
    context += [session for session in history.sessions
                if start <= session.time <= end and (violation.group is None or session.group == violation.group)
                and (violation.queue is None or session.queue == violation.queue)]
    context += [note for note in history.notes if start <= note.time <= end]
    chosen = own[:limit] + context[: max(0, limit - len(own))]
    chosen.sort(key=event_time)
    return chosen


def describe(result: CheckResult, history: History, limit: int = VIOLATIONS_SHOWN_MAX) -> str:
    """The verdict with the seed; for each violation (at most ``limit``) its history slice as JSON lines."""
    scenario = history.run.scenario if history.run is not None else "?"
    lines = [f"scenario {scenario} seed {result.seed}: "
             + ("clean" if result.clean else f"{len(result.violations)} violation(s) "
                + json.dumps({kind: count for kind, count in result.counts().items() if count}))]
    for violation in result.violations[:limit]:
        lines.append(f"- {violation.kind}: {violation.detail}")
        lines += [f"    {encode_event(event)}" for event in history_slice(violation, history)]
    if len(result.violations) > limit:
        lines.append(f"... and {len(result.violations) - limit} more (report.json lists them all)")
    return "\n".join(lines)
