"""What the store answers: the outcome of an append (one result per message) and of a read of a queue."""

from __future__ import annotations

import enum
import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import repeat
from typing import Final, NamedTuple, overload

import numpy as np
import numpy.typing as npt

from commitlog.hosts import encode_message_id
from protocol.invariant import invariant


class AppendStatus(enum.Enum):
    OK = "ok"
    REJECTED = "rejected"


class AppendResult(NamedTuple):
    """The outcome of one message of an append. ``reason`` says why a rejected message was not stored.
    (A NamedTuple: one is built per message on the apply path.)"""

    status: AppendStatus
    physical_offset: int = -1
    queue_offset: int = -1
    size: int = 0
    store_host: bytes = b""
    reason: str | None = None

    @property
    def msg_id(self) -> str:
        invariant(self.status is AppendStatus.OK, "only stored messages have an id")
        return encode_message_id(self.store_host, self.physical_offset)


#: tuple.__new__(AppendResult, (status, offset, queue offset, size, store host, reason)): every field given
new_result: Final = functools.partial(tuple.__new__, AppendResult)


class StoredRecords(Sequence[AppendResult]):
    """The results of records stored back to back, all OK: each :class:`AppendResult` is made when it is
    read. The leader's Raft thread stores a batch; its completion thread reads the results (an object per
    message is a share of the Raft thread's time worth sparing when it makes them)."""

    __slots__ = ("_offsets", "_queue_offsets", "_sizes", "_store_host")

    def __init__(self, offsets: npt.NDArray[np.int64], queue_offsets: npt.NDArray[np.int64],
                 sizes: npt.NDArray[np.int64], store_host: bytes) -> None:
        self._offsets = offsets
        self._queue_offsets = queue_offsets
        self._sizes = sizes
        self._store_host = store_host

    def __len__(self) -> int:
        return len(self._offsets)

    @overload
    def __getitem__(self, index: int) -> AppendResult: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[AppendResult, ...]: ...

    def __getitem__(self, index: int | slice) -> AppendResult | tuple[AppendResult, ...]:
        ok, store_host = AppendStatus.OK, self._store_host
        if isinstance(index, slice):
            # made by tuple.__new__ from zipped columns: half the cost of calling AppendResult per message
            return tuple(map(new_result, zip(repeat(ok), self._offsets[index].tolist(),
                                              self._queue_offsets[index].tolist(), self._sizes[index].tolist(),
                                              repeat(store_host), repeat(None))))
        if not -len(self) <= index < len(self):
            raise IndexError(index)
        return AppendResult(ok, int(self._offsets[index]), int(self._queue_offsets[index]), int(self._sizes[index]),
                            store_host)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence):
            return NotImplemented
        return self[:] == tuple(other)

    __hash__ = None  # type: ignore[assignment]  # equal to tuples, which hash differently

    def __repr__(self) -> str:
        return f"StoredRecords({self[:]!r})"


@dataclass(frozen=True, slots=True)
class AppendOutcome:
    """``applied`` is False when ``raft_index`` had already been applied (nothing changed)."""

    raft_index: int
    applied: bool
    results: Sequence[AppendResult] = ()


class GetStatus(enum.Enum):
    """RocketMQ's GetMessageStatus, which the pull processor maps to response codes."""

    FOUND = "FOUND"
    NO_MATCHED_MESSAGE = "NO_MATCHED_MESSAGE"
    NO_MESSAGE_IN_QUEUE = "NO_MESSAGE_IN_QUEUE"
    NO_MATCHED_LOGIC_QUEUE = "NO_MATCHED_LOGIC_QUEUE"
    OFFSET_TOO_SMALL = "OFFSET_TOO_SMALL"
    OFFSET_OVERFLOW_ONE = "OFFSET_OVERFLOW_ONE"
    OFFSET_OVERFLOW_BADLY = "OFFSET_OVERFLOW_BADLY"


@dataclass(frozen=True, slots=True)
class GetResult:
    status: GetStatus
    next_begin_offset: int
    min_offset: int
    max_offset: int
    #: raw stored records, in queue order, ready to be concatenated into a PULL response body
    messages: list[bytes] = field(default_factory=list)
    #: queue offset of each record in ``messages``
    queue_offsets: list[int] = field(default_factory=list)
