"""Toxics: what each Toxiproxy toxic does to the bytes of one direction of one proxied connection.

A :class:`ToxicSpec` is the validated, immutable description the API stores and shows (Toxiproxy's
JSON shape: name, type, stream, toxicity, attributes). A :class:`ToxicStage` is its runtime on one
direction of one connection; the stages of a direction form a chain that every chunk read from the
source goes through, in order, before it is written to the destination.

Semantics follow Toxiproxy 2.x (toxics/*.go):

- toxicity is rolled once when a stage starts on a connection (and again when the toxic is updated):
  with probability 1 - toxicity the stage passes data through untouched for that connection;
- ``latency``: each chunk leaves ``latency`` ms (+/- up to ``jitter`` ms) after it was read;
- ``bandwidth``: at most ``rate`` KB/s (1 KB = 1000 bytes; 0 = unlimited), in 100 ms slices;
- ``timeout``: data is dropped; the connection closes once no data came for ``timeout`` ms (each dropped
  chunk restarts the wait, as in Toxiproxy); 0 = never closes while the toxic is there. Removing the
  toxic closes the connections it applied to (Toxiproxy's Cleanup), so no stream continues with a hole;
- ``reset_peer``: the first chunk after the toxic starts is dropped, then the connection is reset
  (TCP RST) ``timeout`` ms later;
- ``slicer``: chunks are cut into pieces of about ``average_size`` +/- ``size_variation`` bytes, with
  ``delay`` microseconds after each piece;
- ``limit_data``: the connection closes once ``bytes`` bytes have passed in this direction.

When a toxic is removed or updated, a chunk it is holding is released at once ("don't drop data on
the floor"); a removed stage passes the chunk on, and later chunks take the new chain.

Time and randomness are injected: a :class:`Clock` and one seeded ``random.Random``.
"""

from __future__ import annotations

import asyncio
import itertools
import random
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

from protocol.invariant import invariant

#: attribute names of each toxic type, in the order Toxiproxy shows them; all are integers, default 0
TOXIC_ATTRIBUTES: Mapping[str, tuple[str, ...]] = {
    "latency": ("latency", "jitter"),
    "bandwidth": ("rate",),
    "timeout": ("timeout",),
    "reset_peer": ("timeout",),
    "slicer": ("average_size", "size_variation", "delay"),
    "limit_data": ("bytes",),
}
#: Toxiproxy stores attributes as int64
ATTRIBUTE_VALUE_MAX = 2**63 - 1
TOXIC_NAME_LENGTH_MAX = 256
BANDWIDTH_SLICE_SECONDS = 0.1


class Stream(StrEnum):
    """Toxiproxy's stream: ``upstream`` is client to upstream server, ``downstream`` the way back."""

    UPSTREAM = "upstream"
    DOWNSTREAM = "downstream"


class InvalidToxic(ValueError):
    """Bad toxic input (an operating error the API answers with 400 and this message)."""


@dataclass(frozen=True)
class ToxicSpec:
    name: str
    type: str
    stream: Stream
    toxicity: float
    #: every attribute of the type, in TOXIC_ATTRIBUTES order
    attributes: tuple[tuple[str, int], ...]

    def __post_init__(self) -> None:
        invariant(self.type in TOXIC_ATTRIBUTES, f"unknown toxic type {self.type!r}")
        invariant(
            tuple(key for key, _ in self.attributes) == TOXIC_ATTRIBUTES[self.type],
            f"attributes of {self.type} toxic {self.name!r} out of schema",
        )
        invariant(0.0 <= self.toxicity <= 1.0, f"toxicity {self.toxicity} outside [0, 1]")

    def attribute(self, key: str) -> int:
        return dict(self.attributes)[key]

    def to_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "type": self.type,
            "stream": str(self.stream),
            "toxicity": self.toxicity,
            "attributes": dict(self.attributes),
        }


def parse_toxic(body: Mapping[str, object]) -> ToxicSpec:
    """A new toxic from the API's JSON body (Toxiproxy's defaults: downstream, toxicity 1, name
    ``<type>_<stream>``, attributes 0). Unknown keys are refused: a misspelt attribute would
    otherwise silently inject nothing."""
    _refuse_unknown_keys(body, ("name", "type", "stream", "toxicity", "attributes"), "toxic")
    stream = _parse_stream(body.get("stream", "downstream"))
    toxic_type = body.get("type")
    if not isinstance(toxic_type, str) or toxic_type not in TOXIC_ATTRIBUTES:
        raise InvalidToxic("invalid toxic type")
    name = body.get("name") or f"{toxic_type}_{stream}"
    if not isinstance(name, str) or len(name) > TOXIC_NAME_LENGTH_MAX or "/" in name:
        raise InvalidToxic(
            f"bad request body: toxic name must be a string of at most "
            f"{TOXIC_NAME_LENGTH_MAX} characters without '/'"
        )
    toxicity = _parse_toxicity(body.get("toxicity", 1.0))
    attributes = _parse_attributes(toxic_type, {}, body.get("attributes", {}))
    return ToxicSpec(name, toxic_type, stream, toxicity, attributes)


def update_toxic(spec: ToxicSpec, body: Mapping[str, object]) -> ToxicSpec:
    """``spec`` with the body's toxicity and attributes merged over it (Toxiproxy's ToxicUpdate).
    Name, type and stream cannot change; they may be repeated unchanged."""
    _refuse_unknown_keys(body, ("name", "type", "stream", "toxicity", "attributes"), "toxic")
    for key, current in (("name", spec.name), ("type", spec.type), ("stream", str(spec.stream))):
        if key in body and body[key] != current:
            raise InvalidToxic(f"bad request body: a toxic's {key} cannot be changed")
    toxicity = _parse_toxicity(body.get("toxicity", spec.toxicity))
    attributes = _parse_attributes(spec.type, dict(spec.attributes), body.get("attributes", {}))
    return ToxicSpec(spec.name, spec.type, spec.stream, toxicity, attributes)


def _refuse_unknown_keys(body: Mapping[str, object], known: tuple[str, ...], what: str) -> None:
    unknown = sorted(set(body) - set(known))
    if unknown:
        raise InvalidToxic(f"bad request body: unknown {what} field(s) {', '.join(unknown)}")


def _parse_stream(value: object) -> Stream:
    if isinstance(value, str) and value.lower() in (Stream.UPSTREAM, Stream.DOWNSTREAM):
        return Stream(value.lower())
    raise InvalidToxic("stream was invalid, can be either upstream or downstream")


def _parse_toxicity(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 <= value <= 1.0:
        raise InvalidToxic("bad request body: toxicity must be a number in [0, 1]")
    return float(value)


def _parse_attributes(toxic_type: str, current: dict[str, int], value: object) -> tuple[tuple[str, int], ...]:
    if not isinstance(value, dict):
        raise InvalidToxic("bad request body: attributes must be an object")
    schema = TOXIC_ATTRIBUTES[toxic_type]
    _refuse_unknown_keys(value, schema, f"{toxic_type} attribute")
    merged = {key: current.get(key, 0) for key in schema}
    for key, number in value.items():
        if isinstance(number, bool) or not isinstance(number, int) or not 0 <= number <= ATTRIBUTE_VALUE_MAX:
            raise InvalidToxic(f"bad request body: {toxic_type} attribute {key} must be an integer >= 0")
        merged[key] = number
    if toxic_type == "slicer" and not merged["size_variation"] < merged["average_size"]:
        # Toxiproxy loops or panics otherwise; its docs ask for size_variation < average_size
        raise InvalidToxic("bad request body: slicer needs 0 <= size_variation < average_size")
    return tuple((key, merged[key]) for key in schema)


# -- runtime -----------------------------------------------------------------------------------


class Clock(Protocol):
    def now_s(self) -> float: ...

    async def sleep_until(self, deadline_s: float, interrupt: asyncio.Event | None = None) -> bool:
        """Wait until ``now_s() >= deadline_s`` or ``interrupt`` is set; True if interrupted."""
        ...


class LoopClock:
    """The running event loop's monotonic clock."""

    def now_s(self) -> float:
        return asyncio.get_running_loop().time()

    async def sleep_until(self, deadline_s: float, interrupt: asyncio.Event | None = None) -> bool:
        # asyncio may wake a timer a clock tick early: loop until the deadline has really passed,
        # so "at least latency" holds exactly
        while True:
            if interrupt is not None and interrupt.is_set():
                return True
            remaining_s = deadline_s - self.now_s()
            if remaining_s <= 0:
                return False
            if interrupt is None:
                await asyncio.sleep(remaining_s)
                continue
            try:
                async with asyncio.timeout(remaining_s):
                    await interrupt.wait()
            except TimeoutError:
                continue


@dataclass(frozen=True)
class Piece:
    """Bytes on their way through a chain, stamped with when they were read (or when a latency
    stage released them) so latency counts from arrival, not from when the stage got to them."""

    data: bytes
    timestamp_s: float


Emit = Callable[[Piece], Awaitable[None]]


class LinkControl(Protocol):
    """What a stage may do to its connection."""

    def close_link(self, reset: bool) -> None:
        """Close both sides of the connection: gracefully (pending data flushed) or with TCP RST."""
        ...

    def spawn(self, coroutine: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        """Run ``coroutine`` as a task the connection cancels and awaits when it closes."""
        ...


class ToxicStage:
    """A toxic on one direction of one connection. The base class passes data through."""

    def __init__(self, spec: ToxicSpec, rng: random.Random, clock: Clock, control: LinkControl) -> None:
        self.spec = spec
        self._rng = rng
        self._clock = clock
        self._control = control
        self.applied = self._roll()
        self.detached = False
        self._interrupt = asyncio.Event()

    def _roll(self) -> bool:
        # random() is in [0, 1): toxicity 0 never applies, toxicity 1 always does
        return self._rng.random() < self.spec.toxicity

    def start(self) -> None:
        """Called once the stage is in a running chain (starts timers)."""

    def update(self, spec: ToxicSpec) -> None:
        """New settings: release what the stage holds, roll toxicity again, restart timers."""
        invariant(spec.type == self.spec.type and spec.name == self.spec.name, "update changes identity")
        self._release_held()
        self._stop_timers()
        self.spec = spec
        self.applied = self._roll()
        self.start()

    def detach(self) -> None:
        """The toxic was removed: release what the stage holds, then pass everything through."""
        self.detached = True
        self._release_held()
        self._stop_timers()

    def _release_held(self) -> None:
        self._interrupt.set()
        self._interrupt = asyncio.Event()

    def _stop_timers(self) -> None:
        """Subclasses with timers cancel them here."""

    async def process(self, piece: Piece, emit: Emit) -> None:
        if self.detached or not self.applied:
            await emit(piece)
        else:
            await self._apply(piece, emit, self._interrupt)

    async def _apply(self, piece: Piece, emit: Emit, interrupt: asyncio.Event) -> None:
        await emit(piece)


class LatencyStage(ToxicStage):
    async def _apply(self, piece: Piece, emit: Emit, interrupt: asyncio.Event) -> None:
        delay_ms = self.spec.attribute("latency")
        jitter_ms = self.spec.attribute("jitter")
        if jitter_ms > 0:
            delay_ms += self._rng.randrange(2 * jitter_ms) - jitter_ms
        deadline_s = piece.timestamp_s + delay_ms / 1000
        if await self._clock.sleep_until(deadline_s, interrupt):
            await emit(piece)  # released early: no latency added
        else:
            await emit(Piece(piece.data, max(deadline_s, piece.timestamp_s)))


class BandwidthStage(ToxicStage):
    def __init__(self, spec: ToxicSpec, rng: random.Random, clock: Clock, control: LinkControl) -> None:
        super().__init__(spec, rng, clock, control)
        #: time owed for bytes already passed (negative: credit for oversleeping)
        self._debt_s = 0.0

    async def _apply(self, piece: Piece, emit: Emit, interrupt: asyncio.Event) -> None:
        rate_kb_s = self.spec.attribute("rate")
        if rate_kb_s <= 0:
            self._debt_s = 0.0
            await emit(piece)
            return
        data = piece.data
        self._debt_s += len(data) / (rate_kb_s * 1000)
        slice_size_bytes = round(rate_kb_s * 1000 * BANDWIDTH_SLICE_SECONDS)
        while len(data) > slice_size_bytes:
            if await self._clock.sleep_until(self._clock.now_s() + BANDWIDTH_SLICE_SECONDS, interrupt):
                break
            await emit(Piece(data[:slice_size_bytes], piece.timestamp_s))
            data = data[slice_size_bytes:]
            self._debt_s -= BANDWIDTH_SLICE_SECONDS
        else:
            start_s = self._clock.now_s()
            await self._clock.sleep_until(start_s + self._debt_s, interrupt)
            self._debt_s -= self._clock.now_s() - start_s
        await emit(Piece(data, piece.timestamp_s))


class TimeoutStage(ToxicStage):
    def __init__(self, spec: ToxicSpec, rng: random.Random, clock: Clock, control: LinkControl) -> None:
        super().__init__(spec, rng, clock, control)
        self._timer: asyncio.Task[None] | None = None
        self._data_seen = asyncio.Event()
        self._last_data_s = 0.0

    def start(self) -> None:
        if self.applied and self.spec.attribute("timeout") > 0:
            self._last_data_s = self._clock.now_s()
            self._timer = self._control.spawn(self._expire(), f"timeout toxic {self.spec.name}")

    def _stop_timers(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def detach(self) -> None:
        super().detach()
        if self.applied:
            self._control.close_link(reset=False)

    async def _apply(self, piece: Piece, emit: Emit, interrupt: asyncio.Event) -> None:
        # the data is dropped on the ground
        self._last_data_s = self._clock.now_s()
        self._data_seen.set()

    async def _expire(self) -> None:
        timeout_s = self.spec.attribute("timeout") / 1000
        while True:
            self._data_seen.clear()
            if not await self._clock.sleep_until(self._last_data_s + timeout_s, self._data_seen):
                self._control.close_link(reset=False)
                return


class ResetPeerStage(ToxicStage):
    async def _apply(self, piece: Piece, emit: Emit, interrupt: asyncio.Event) -> None:
        # the chunk that triggers the reset is dropped; later chunks wait behind this one
        deadline_s = self._clock.now_s() + self.spec.attribute("timeout") / 1000
        if not await self._clock.sleep_until(deadline_s, interrupt):
            self._control.close_link(reset=True)


def slice_bounds(size: int, average_size: int, size_variation: int, rng: random.Random) -> list[int]:
    """Cut points for ``size`` bytes: ``[0, a, b, ..., size]``, each piece within ``size_variation``
    of ``average_size`` or smaller (Toxiproxy's SlicerToxic.chunk: halve with a random offset until
    small enough). Needs ``0 <= size_variation < average_size`` so every cut is strictly inside."""
    invariant(0 <= size_variation < average_size, "slicer needs 0 <= size_variation < average_size")
    bounds = [0]
    pending = [(0, size)]  # a stack of ranges, the leftmost on top
    while pending:
        start, end = pending.pop()
        if end - start - average_size <= size_variation:
            bounds.append(end)
            continue
        offset = rng.randrange(2 * size_variation) - size_variation if size_variation > 0 else 0
        middle = start + (end - start) // 2 + offset
        invariant(start < middle < end, "slicer cut outside its range")
        pending.append((middle, end))
        pending.append((start, middle))
    return bounds


class SlicerStage(ToxicStage):
    async def _apply(self, piece: Piece, emit: Emit, interrupt: asyncio.Event) -> None:
        bounds = slice_bounds(
            len(piece.data),
            self.spec.attribute("average_size"),
            self.spec.attribute("size_variation"),
            self._rng,
        )
        delay_s = self.spec.attribute("delay") / 1_000_000
        for start, end in itertools.pairwise(bounds):
            await emit(Piece(piece.data[start:end], piece.timestamp_s))
            if await self._clock.sleep_until(self._clock.now_s() + delay_s, interrupt):
                if end < len(piece.data):
                    await emit(Piece(piece.data[end:], piece.timestamp_s))
                return


class LimitDataStage(ToxicStage):
    def __init__(self, spec: ToxicSpec, rng: random.Random, clock: Clock, control: LinkControl) -> None:
        super().__init__(spec, rng, clock, control)
        #: kept across updates, as Toxiproxy keeps the stub's state
        self.transmitted_bytes = 0

    async def _apply(self, piece: Piece, emit: Emit, interrupt: asyncio.Event) -> None:
        remaining = max(0, self.spec.attribute("bytes") - self.transmitted_bytes)
        data = piece.data[:remaining]
        if data:
            self.transmitted_bytes += len(data)
            await emit(Piece(data, piece.timestamp_s))
        if self.transmitted_bytes >= self.spec.attribute("bytes"):
            self._control.close_link(reset=False)


_STAGES: Mapping[str, type[ToxicStage]] = {
    "latency": LatencyStage,
    "bandwidth": BandwidthStage,
    "timeout": TimeoutStage,
    "reset_peer": ResetPeerStage,
    "slicer": SlicerStage,
    "limit_data": LimitDataStage,
}
invariant(set(_STAGES) == set(TOXIC_ATTRIBUTES), "every toxic type has a stage")


def make_stage(spec: ToxicSpec, rng: random.Random, clock: Clock, control: LinkControl) -> ToxicStage:
    return _STAGES[spec.type](spec, rng, clock, control)
