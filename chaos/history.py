"""The recorded history of a chaos run: one JSON object per line, every event stamped with seconds since
the run started (``time.monotonic()`` minus the start; the wall-clock start is in :class:`RunStarted`).

Events, each line ``{"type": <name>, ...fields}``:

- :class:`RunStarted`: the header (scenario, seed, topic, queue count, consumer groups, nodes).
- :class:`SendEvent`: one send *attempt* by a producer: UNIQ_KEY, sharding key and its sequence number,
  attempt number (retries of one message keep its UNIQ_KEY), send and end time, ack or error (with the
  response code), and for an ack the queue and queue offset the broker answered. A transactional send
  (a half message) also carries the decision its local transaction made (``commit`` or ``rollback``,
  decided from the seed and the message) and whether it first answered UNKNOW, leaving the decision to
  the broker's check-back; its ack names the half's position, not where consumers find it.
- :class:`DeliveryEvent`: one message a consumer received: UNIQ_KEY, queue, queue offset, group, the
  consumer session it belongs to, the node that served it. A 5.x receive (pop through Raft, chaos.grpc_workload)
  also names its delivery attempt and when the receive was sent.
- :class:`PopAckEvent`: one acknowledgement of a 5.x receive (AckMessage): UNIQ_KEY, position, group, send and
  end time, whether the leader took it (or the status code or error it answered).
- :class:`SessionEvent`: a consumer session began on a queue at an offset (sessions restart after
  faults and on a schedule, from the group's committed offset).
- :class:`OffsetCommitEvent`: a consumer offset commit the leader acknowledged.
- :class:`FaultEvent`: a fault (kind, target, start, end).
- :class:`LeaderEvent`: the leader the monitor saw changed (node id or None, and the term).
- :class:`NoteEvent`: anything else worth seeing in a slice (a pull answered "offset moved", a drain that
  timed out).

Events are immutable; :class:`History` holds them by type, and :func:`read_history` /
:class:`HistoryWriter` read and append the JSON-lines file.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, ClassVar, Final, TypeAlias

FORMAT_VERSION: Final = 1
#: a line longer than this is not ours (a history line is a few hundred bytes)
LINE_LENGTH_MAX_BYTES: Final = 1 << 20
#: the decisions of a transactional send (:attr:`SendEvent.transaction`)
TRANSACTION_COMMIT: Final = "commit"
TRANSACTION_ROLLBACK: Final = "rollback"
TRANSACTION_DECISIONS: Final = ("", TRANSACTION_COMMIT, TRANSACTION_ROLLBACK)


class HistoryError(ValueError):
    """A history file or line that is not a valid history (an operating error for the reader)."""


@dataclass(frozen=True, slots=True)
class RunStarted:
    type_name: ClassVar[str] = "run"
    scenario: str
    seed: int
    topic: str
    queues: int
    groups: tuple[str, ...]
    nodes: tuple[str, ...]
    started_at_epoch_seconds: float
    duration_seconds: float
    version: int = FORMAT_VERSION

    @property
    def time(self) -> float:
        return 0.0


@dataclass(frozen=True, slots=True)
class SendEvent:
    type_name: ClassVar[str] = "send"
    producer: str
    uniq_key: str
    sharding_key: str
    #: position of this message in its sharding key's sequence (0, 1, 2, ...): the order it was sent in
    sequence: int
    #: 0 for the first attempt; a retry by the workload keeps the UNIQ_KEY and counts up
    attempt: int
    send_time: float
    end_time: float
    acked: bool
    #: the response code of an error (a broker code or a client one); None for an ack
    code: int | None = None
    error: str = ""
    queue: int | None = None
    queue_offset: int | None = None
    #: a delay level (1..18) makes the broker store the message in the schedule topic first: the
    #: ack's queue and offset are then not where consumers find it
    delay_level: int = 0
    broker: str = ""
    #: "" for a plain send; for a transactional one the local transaction's decision: "commit" or "rollback"
    transaction: str = ""
    #: the local transaction answered UNKNOW first: only the broker's check-back learns the decision
    checked_back: bool = False

    @property
    def time(self) -> float:
        return self.end_time


@dataclass(frozen=True, slots=True)
class DeliveryEvent:
    type_name: ClassVar[str] = "deliver"
    group: str
    #: the consumer session (one per queue per restart); queue offsets increase strictly within one
    session: int
    uniq_key: str
    queue: int
    queue_offset: int
    time: float
    node: str = ""
    #: a 5.x receive (pop through Raft): its delivery attempt, 1 for the first; 0 for a 4.x pull. Pop hands
    #: out what is visible, redeliveries included, so offsets need not increase within its session (one
    #: receive call)
    attempt: int = 0
    #: a 5.x receive: when the ReceiveMessage that returned it was sent (``time`` is when it returned)
    requested: float | None = None

    @property
    def pop(self) -> bool:
        return self.attempt > 0


@dataclass(frozen=True, slots=True)
class PopAckEvent:
    """One entry of an AckMessage of a 5.x consumer: ``acked`` when the leader answered it OK (committed through
    Raft: the message must never be delivered to ``group`` again)."""

    type_name: ClassVar[str] = "pop-ack"
    group: str
    uniq_key: str
    queue: int
    queue_offset: int
    send_time: float
    end_time: float
    acked: bool
    #: the entry's status code (apache.rocketmq.v2.Code) when it was answered and not OK, else None
    code: int | None = None
    error: str = ""
    node: str = ""

    @property
    def time(self) -> float:
        return self.end_time


@dataclass(frozen=True, slots=True)
class SessionEvent:
    type_name: ClassVar[str] = "session"
    group: str
    session: int
    queue: int
    start_offset: int
    time: float
    reason: str = ""
    node: str = ""


@dataclass(frozen=True, slots=True)
class OffsetCommitEvent:
    type_name: ClassVar[str] = "commit"
    group: str
    queue: int
    offset: int
    time: float
    node: str = ""


@dataclass(frozen=True, slots=True)
class FaultEvent:
    type_name: ClassVar[str] = "fault"
    kind: str
    target: str
    start: float
    end: float
    detail: str = ""

    @property
    def time(self) -> float:
        return self.start


@dataclass(frozen=True, slots=True)
class LeaderEvent:
    type_name: ClassVar[str] = "leader"
    time: float
    #: the node id, or None while no node says it leads
    leader: str | None
    term: int


@dataclass(frozen=True, slots=True)
class NoteEvent:
    type_name: ClassVar[str] = "note"
    time: float
    what: str
    detail: str = ""


Event: TypeAlias = (
    RunStarted | SendEvent | DeliveryEvent | PopAckEvent | SessionEvent | OffsetCommitEvent | FaultEvent | LeaderEvent
    | NoteEvent
)
EVENT_TYPES: Final[dict[str, type[Any]]] = {
    kind.type_name: kind
    for kind in (RunStarted, SendEvent, DeliveryEvent, PopAckEvent, SessionEvent, OffsetCommitEvent, FaultEvent,
                 LeaderEvent, NoteEvent)
}


def event_time(event: Event) -> float:
    return event.time


def encode_event(event: Event) -> str:
    """One JSON line (without the newline); keys in field order after ``type``."""
    document: dict[str, Any] = {"type": event.type_name}
    for item in dataclasses.fields(event):
        value = getattr(event, item.name)
        document[item.name] = list(value) if isinstance(value, tuple) else value
    return json.dumps(document, separators=(",", ":"))


def decode_event(line: str) -> Event:
    """The event a line holds; :class:`HistoryError` for anything else (unknown type, missing or unknown
    fields, wrong value types)."""
    if len(line) > LINE_LENGTH_MAX_BYTES:
        raise HistoryError(f"a history line of {len(line)} bytes is too long")
    try:
        document = json.loads(line)
    except ValueError as exc:
        raise HistoryError(f"not JSON: {exc}") from None
    if not isinstance(document, dict):
        raise HistoryError("a history line must be a JSON object")
    kind = EVENT_TYPES.get(str(document.pop("type", "")))
    if kind is None:
        raise HistoryError(f"unknown event type in {line[:80]!r}")
    fields = {item.name: item for item in dataclasses.fields(kind)}
    unknown = sorted(set(document) - set(fields))
    if unknown:
        raise HistoryError(f"unknown field(s) {', '.join(unknown)} in a {kind.type_name} event")
    values: dict[str, Any] = {}
    for name, item in fields.items():
        if name not in document:
            if item.default is dataclasses.MISSING:
                raise HistoryError(f"a {kind.type_name} event lacks {name!r}")
            continue
        values[name] = _checked(kind.type_name, name, str(item.type), document[name])
    return kind(**values)  # type: ignore[no-any-return]


def _checked(kind: str, name: str, annotation: str, value: object) -> object:
    """The value converted to the field's type (JSON has no tuples; an int is a valid float)."""
    wanted: dict[str, tuple[type, ...]] = {
        "str": (str,), "int": (int,), "float": (int, float), "bool": (bool,),
        "int | None": (int, type(None)), "str | None": (str, type(None)), "float | None": (int, float, type(None)),
    }
    if annotation == "tuple[str, ...]":
        if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
            raise HistoryError(f"{kind}.{name} must be a list of strings")
        return tuple(value)
    types = wanted.get(annotation)
    if types is None:
        raise HistoryError(f"{kind}.{name} has an unsupported type {annotation}")
    is_bool = isinstance(value, bool)
    if not isinstance(value, types) or (is_bool and bool not in types):
        raise HistoryError(f"{kind}.{name} must be {annotation}, got {value!r}")
    if annotation in ("float", "float | None") and isinstance(value, int | float) and not is_bool:
        return float(value)
    return value


@dataclass
class History:
    """A run's events by type, each list in recording order."""

    run: RunStarted | None = None
    sends: list[SendEvent] = field(default_factory=list)
    deliveries: list[DeliveryEvent] = field(default_factory=list)
    pop_acks: list[PopAckEvent] = field(default_factory=list)
    sessions: list[SessionEvent] = field(default_factory=list)
    commits: list[OffsetCommitEvent] = field(default_factory=list)
    faults: list[FaultEvent] = field(default_factory=list)
    leaders: list[LeaderEvent] = field(default_factory=list)
    notes: list[NoteEvent] = field(default_factory=list)

    @classmethod
    def of(cls, events: Iterable[Event]) -> History:
        history = cls()
        for event in events:
            history.add(event)
        return history

    def add(self, event: Event) -> None:
        match event:
            case RunStarted():
                if self.run is not None:
                    raise HistoryError("a history has one run header")
                self.run = event
            case SendEvent():
                self.sends.append(event)
            case DeliveryEvent():
                self.deliveries.append(event)
            case PopAckEvent():
                self.pop_acks.append(event)
            case SessionEvent():
                self.sessions.append(event)
            case OffsetCommitEvent():
                self.commits.append(event)
            case FaultEvent():
                self.faults.append(event)
            case LeaderEvent():
                self.leaders.append(event)
            case NoteEvent():
                self.notes.append(event)

    def events(self) -> list[Event]:
        """Every event, ordered by time (the header first; ties keep recording order by type)."""
        body: list[Event] = [*self.sends, *self.deliveries, *self.pop_acks, *self.sessions, *self.commits, *self.faults,
                             *self.leaders, *self.notes]
        body.sort(key=event_time)
        return ([self.run] if self.run is not None else []) + body

    @property
    def seed(self) -> int | None:
        return None if self.run is None else self.run.seed

    @property
    def groups(self) -> tuple[str, ...]:
        """The consumer groups of the run (from the header, else those that received anything)."""
        if self.run is not None and self.run.groups:
            return self.run.groups
        return tuple(sorted({delivery.group for delivery in self.deliveries}))


def read_history(path: Path) -> History:
    with path.open(encoding="utf-8") as stream:
        return History.of(iter_events(stream, str(path)))


def iter_events(stream: IO[str], where: str = "history") -> Iterator[Event]:
    for number, line in enumerate(stream, 1):
        if not line.strip():
            continue
        try:
            yield decode_event(line)
        except HistoryError as exc:
            raise HistoryError(f"{where} line {number}: {exc}") from None


def write_history(path: Path, history: History) -> None:
    with HistoryWriter(path) as writer:
        for event in history.events():
            writer.write(event)


class HistoryWriter:
    """Appends events to a JSON-lines file as they happen (a crashed run still leaves its history).
    Lines are flushed every ``flush_every`` events and on close."""

    def __init__(self, path: Path, flush_every: int = 256) -> None:
        self.path = path
        self._stream: IO[str] = path.open("a", encoding="utf-8")
        self._flush_every = flush_every
        self._unflushed = 0

    def write(self, event: Event) -> None:
        self._stream.write(encode_event(event) + "\n")
        self._unflushed += 1
        if self._unflushed >= self._flush_every:
            self.flush()

    def flush(self) -> None:
        self._stream.flush()
        self._unflushed = 0

    def close(self) -> None:
        if not self._stream.closed:
            self._stream.close()

    def __enter__(self) -> HistoryWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
