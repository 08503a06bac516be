"""Hand-built histories for the checker's tests: a small correct "broker" model that stores sends in
queues and replays them to consumer sessions, and helpers that build single events tersely."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from chaos.history import (
    DeliveryEvent,
    FaultEvent,
    History,
    RunStarted,
    SendEvent,
    SessionEvent,
)

TOPIC = "ChaosTopic"


def run_header(groups: tuple[str, ...] = ("g1",), seed: int = 7, queues: int = 4) -> RunStarted:
    return RunStarted("test", seed, TOPIC, queues, groups, ("n0", "n1", "n2"), 1_700_000_000.0, 10.0)


def ack(uniq_key: str, queue: int, offset: int, at: float, *, key: str = "k", sequence: int = 0,
        attempt: int = 0, delay_level: int = 0) -> SendEvent:
    return SendEvent("p0", uniq_key, key, sequence, attempt, at - 0.01, at, True, None, "", queue, offset,
                     delay_level, "127.0.0.1:1")


def error(uniq_key: str, at: float, *, key: str = "k", sequence: int = 0, attempt: int = 0,
          code: int = 14) -> SendEvent:
    return SendEvent("p0", uniq_key, key, sequence, attempt, at - 0.5, at, False, code, "not leader")


def deliver(uniq_key: str, queue: int, offset: int, at: float, *, group: str = "g1", session: int = 0
            ) -> DeliveryEvent:
    return DeliveryEvent(group, session, uniq_key, queue, offset, at, "127.0.0.1:1")


@dataclass
class Model:
    """A broker that never fails its promises: what a correct run's history looks like.

    ``stored[queue]`` lists UNIQ_KEYs by queue offset. Consumer sessions read a queue from a start
    offset to some point; a later session may start earlier (a redelivery) but never past where the
    previous one stopped, and the last one reads to the end."""

    queues: int
    groups: tuple[str, ...]
    rng: random.Random
    time: float = 0.0
    sends: list[SendEvent] = field(default_factory=list)
    stored: dict[int, list[str]] = field(default_factory=dict)
    sequences: dict[str, int] = field(default_factory=dict)
    faults: list[FaultEvent] = field(default_factory=list)

    def tick(self, seconds: float = 0.01) -> float:
        self.time += seconds
        return round(self.time, 6)

    def send(self, number: int, key: str, outcome: str, attempts: int) -> None:
        """outcome: "ack", "stored" (every attempt failed but one was stored) or "dropped"."""
        uniq_key = f"U{number:06d}"
        sequence = self.sequences.get(key, 0)
        self.sequences[key] = sequence + 1
        queue = sum(map(ord, key)) % self.queues
        offset = len(self.stored.setdefault(queue, []))
        if outcome != "dropped":
            self.stored[queue].append(uniq_key)
        for attempt in range(attempts):
            start = self.tick()
            end = self.tick(self.rng.choice((0.002, 0.01, 0.4)))
            if outcome == "ack" and attempt == attempts - 1:
                self.sends.append(SendEvent("p0", uniq_key, key, sequence, attempt, start, end, True, None, "", queue,
                                            offset, 0, "127.0.0.1:1"))
            else:
                self.sends.append(SendEvent("p0", uniq_key, key, sequence, attempt, start, end, False, 14,
                                            "timeout"))

    def history(self, restarts: int) -> History:
        """Every group reads every queue, with ``restarts`` extra sessions per queue at random points."""
        history = History.of([run_header(self.groups, queues=self.queues)])
        for event in self.sends:
            history.add(event)
        for fault in self.faults:
            history.add(fault)
        session_number = 0
        for group in self.groups:
            for queue in range(self.queues):
                contents = self.stored.get(queue, [])
                start = 0
                for index in range(restarts + 1):
                    last = index == restarts
                    stop = len(contents) if last else self.rng.randint(start, len(contents))
                    history.add(SessionEvent(group, session_number, queue, start, self.tick(), "test"))
                    for offset in range(start, stop):
                        history.add(DeliveryEvent(group, session_number, contents[offset], queue, offset, self.tick(),
                                                  "127.0.0.1:1"))
                    session_number += 1
                    start = self.rng.randint(0, stop) if not last else stop
        return history
