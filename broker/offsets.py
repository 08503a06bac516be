"""Consumer offsets go through Raft, so a new leader continues exactly where consumers were.

Offset commits arrive often (every queue of every consumer, every 5 s, plus with pulls), so they are
coalesced: whatever arrived while one command was being replicated goes out in the next one, and the
latest offset per (group, topic, queue) wins. An UPDATE_CONSUMER_OFFSET is answered once its offset applied.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Final

from broker.context import BrokerContext
from broker.requests import RequestError
from dledger.command import Command, ConsumerOffset, ConsumerOffsets
from protocol.codes import ResponseCode

log = logging.getLogger(__name__)

#: distinct queue offsets waiting for one command at most; beyond it commits are refused as busy
PENDING_OFFSETS_MAX: Final = 100_000
#: offsets one command carries at most
COMMAND_OFFSETS_MAX: Final = 10_000

OffsetKey = tuple[str, str, int]


class OffsetCommitter:
    def __init__(self, broker: BrokerContext) -> None:
        self.broker = broker
        self._pending: dict[OffsetKey, int] = {}
        self._waiters: list[tuple[set[OffsetKey], asyncio.Future[None]]] = []
        self._wake = asyncio.Event()
        #: the offsets of the command being replicated now
        self._in_flight: dict[OffsetKey, int] = {}
        self._flushes: list[asyncio.Future[None]] = []
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="offset-committer")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        for _, future in self._waiters:
            if not future.done():
                future.set_exception(RequestError(ResponseCode.SERVICE_NOT_AVAILABLE, "broker is stopping"))
                future.exception()

    def submit(self, group: str, topic: str, queue_id: int, offset: int) -> asyncio.Future[None]:
        """Queue an offset commit; the future resolves once it applied (or fails with RequestError)."""
        key = (group, topic, queue_id)
        if key not in self._pending and len(self._pending) >= PENDING_OFFSETS_MAX:
            raise RequestError(ResponseCode.SYSTEM_BUSY, "too many consumer offsets waiting to be committed")
        self._pending[key] = offset
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(({key}, future))
        self._wake.set()
        return future

    def pending_offset(self, group: str, topic: str, queue_id: int) -> int | None:
        """An offset committed here but not applied yet (read-your-writes for QUERY_CONSUMER_OFFSET)."""
        key = (group, topic, queue_id)
        if key in self._pending:
            return self._pending[key]
        return self._in_flight.get(key)

    def pending_topics(self, group: str) -> set[str]:
        """Topics where ``group`` committed an offset that has not applied yet."""
        return {key[1] for table in (self._pending, self._in_flight) for key in table if key[0] == group}

    async def flush(self) -> None:
        """Wait until every offset committed so far has applied (or failed): a consumer that unregisters
        right after its last commit hands its queues over at the offsets it committed."""
        if not self._pending and not self._in_flight:
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._flushes.append(future)
        self._wake.set()
        await future

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._pending:
                keys = list(self._pending)[:COMMAND_OFFSETS_MAX]
                batch = {key: self._pending.pop(key) for key in keys}
                self._in_flight = batch
                done_keys = set(batch)
                waiters = [entry for entry in self._waiters if entry[0] <= done_keys]
                self._waiters = [entry for entry in self._waiters if not entry[0] <= done_keys]
                command = Command((ConsumerOffsets(tuple(
                    ConsumerOffset(group, topic, queue_id, offset) for (group, topic, queue_id), offset in batch.items()
                )),))
                error: BaseException | None = None
                try:
                    await self.broker.propose(command)
                except RequestError as exc:
                    error = exc
                except Exception as exc:  # an executor failure must not kill the committer
                    log.exception("committing consumer offsets failed")
                    error = RequestError(ResponseCode.SYSTEM_ERROR, f"offset commit failed: {exc}")
                self._in_flight = {}
                for _, future in waiters:
                    if future.done():
                        continue
                    if error is None:
                        future.set_result(None)
                    else:
                        future.set_exception(error)
                        future.exception()  # mark retrieved: pull-piggybacked commits are not awaited
            flushes, self._flushes = self._flushes, []
            for future in flushes:
                if not future.done():
                    future.set_result(None)
