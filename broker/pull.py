"""PULL_MESSAGE with long polling and tag filtering by hash (PullMessageProcessor, PullRequestHoldService).

A pull that finds nothing and may be suspended waits, without holding a worker's thread, until the
queue grows past the requested offset (woken after every apply) or its suspend time is up. Every member
serves pulls: its store only ever holds committed data.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import zlib
from collections.abc import Callable
from typing import Final

from broker.consumers import ConsumerManager
from broker.context import BrokerContext
from broker.offsets import OffsetCommitter
from broker.pull_rates import PullRates
from broker.remoting.server import RequestContext
from broker.requests import PULL_COMMIT_OFFSET, PULL_SUBSCRIPTION, PULL_SUSPEND, PullHeader, RequestError
from broker.subscription_groups import check_consume_enabled
from commitlog.outcomes import GetResult, GetStatus
from commitlog.record_codec import body_at
from commitlog.tag_codes import java_string_hash
from protocol.codes import ResponseCode
from protocol.command import RemotingCommand, make_response
from protocol.subscription import expression_tags

log = logging.getLogger(__name__)

#: held pulls at most (each is one waiting coroutine); more are answered at once
HELD_PULLS_MAX: Final = 100_000


def tag_codes(expression: str | None) -> frozenset[int] | None:
    """The tag hash codes an expression such as ``"TagA || TagB"`` selects; None selects everything."""
    tags = expression_tags(expression)
    return None if tags is None else frozenset(java_string_hash(tag) for tag in tags)


def first_damaged(records: list[bytes]) -> int | None:
    """The commit-log offset of the first record whose body CRC does not match, or None. Checked on
    every pull (zlib in C, about a microsecond per KB): recovery validates only the tail past the
    checkpoint, so a byte flipped on disk deeper in a segment would otherwise be served as is."""
    for raw in records:
        head = body_at(int.from_bytes(raw[36:40], "big"))  # 12 more bytes per IPv6 host
        body_length = int.from_bytes(raw[head - 4 : head], "big", signed=True)
        if body_length < 0 or head + body_length > len(raw):
            return int.from_bytes(raw[28:36], "big", signed=True)
        stored = int.from_bytes(raw[8:12], "big")
        crc = zlib.crc32(raw[head : head + body_length])
        if stored not in (crc & 0x7FFFFFFF, crc):
            return int.from_bytes(raw[28:36], "big", signed=True)
    return None


def moves_offset(status: GetStatus, queue_offset: int) -> bool:
    """Whether a leader answers ``status`` with PULL_OFFSET_MOVED because the offset is past what it holds
    (an offset below the queue's minimum is moved too, but retention only ever raises the minimum)."""
    if status is GetStatus.OFFSET_OVERFLOW_BADLY:
        return True
    return queue_offset != 0 and status in (GetStatus.NO_MESSAGE_IN_QUEUE, GetStatus.NO_MATCHED_LOGIC_QUEUE)


class PullWaiters:
    """Pulls waiting for a queue to grow. ``notify`` runs on the event loop (after applies)."""

    def __init__(self, max_offset: Callable[[str, int], int]) -> None:
        self.max_offset = max_offset
        self._waiting: dict[tuple[str, int], list[tuple[int, asyncio.Future[None]]]] = {}
        self.held = 0

    async def wait(self, topic: str, queue_id: int, offset: int, timeout_seconds: float) -> None:
        if self.held >= HELD_PULLS_MAX or timeout_seconds <= 0:
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (offset, future)
        key = (topic, queue_id)
        self._waiting.setdefault(key, []).append(entry)
        self.held += 1
        try:
            if self.max_offset(topic, queue_id) > offset:
                return
            await asyncio.wait_for(asyncio.shield(future), timeout_seconds)
        except TimeoutError:
            pass
        finally:
            self.held -= 1
            entries = self._waiting.get(key)
            if entries is not None:
                with contextlib.suppress(ValueError):
                    entries.remove(entry)
                if not entries:
                    del self._waiting[key]

    def notify(self) -> None:
        for (topic, queue_id), entries in list(self._waiting.items()):
            if not entries:
                continue
            high = self.max_offset(topic, queue_id)
            for offset, future in entries:
                if high > offset and not future.done():
                    future.set_result(None)

    def wake_all(self) -> None:
        for entries in self._waiting.values():
            for _, future in entries:
                if not future.done():
                    future.set_result(None)


class PullProcessor:
    def __init__(self, broker: BrokerContext, consumers: ConsumerManager, offsets: OffsetCommitter,
                 waiters: PullWaiters, rates: PullRates | None = None) -> None:
        self.broker = broker
        self.consumers = consumers
        self.offsets = offsets
        self.waiters = waiters
        #: messages served per group and topic (GET_CONSUME_STATS's consumeTps)
        self.rates = rates if rates is not None else PullRates()

    async def __call__(self, context: RequestContext) -> RemotingCommand | None:
        try:
            return await self.pull(context)
        except RequestError as error:
            return make_response(context.request, error.code, error.remark, error.ext_fields)

    async def pull(self, context: RequestContext) -> RemotingCommand:
        broker = self.broker
        request = context.request
        header = PullHeader.parse(request.ext_fields)
        broker.topic_for_read(header.topic, header.queue_id)
        check_consume_enabled(broker.state.groups, header.consumer_group)
        if header.expression_type.upper() not in ("TAG", ""):
            raise RequestError(ResponseCode.SUBSCRIPTION_PARSE_FAILED,
                               f"filter expression type {header.expression_type!r} is not supported (TAG only)")
        if header.sys_flag & PULL_SUBSCRIPTION and header.subscription is not None:
            codes = tag_codes(header.subscription)
        else:
            codes = tag_codes(self.consumers.subscription(header.consumer_group, header.topic))
        if header.sys_flag & PULL_COMMIT_OFFSET and broker.member.is_leader and header.commit_offset >= 0:
            self.offsets.submit(header.consumer_group, header.topic, header.queue_id, header.commit_offset)
        count = min(header.max_msg_nums, broker.config.pull_messages_max)
        loop = asyncio.get_running_loop()
        suspend = header.sys_flag & PULL_SUSPEND
        deadline = loop.time() + min(header.suspend_timeout_millis, broker.config.long_polling_max_ms) / 1000
        barrier_passed = False
        while True:
            result = broker.store.get_messages(header.topic, header.queue_id, header.queue_offset, count,
                                               broker.config.pull_bytes_max, codes)
            if not barrier_passed and broker.member.is_leader and moves_offset(result.status, header.queue_offset):
                # Before a leader moves a consumer (Java and C++ consumers adopt nextBeginOffset, often 0,
                # and re-consume the queue), it makes sure it is not merely behind what the consumer read
                # elsewhere: a new leader still applying its predecessor's entries, say.
                try:
                    await broker.barrier()
                except RequestError:
                    return self._response(request, header, result, is_leader=False)  # as a follower: retry
                barrier_passed = True
                continue
            waiting = result.status in (GetStatus.NO_MESSAGE_IN_QUEUE, GetStatus.OFFSET_OVERFLOW_ONE) or (
                result.status is GetStatus.NO_MATCHED_LOGIC_QUEUE and header.queue_offset == 0)
            remaining = deadline - loop.time()
            if not (waiting and suspend and remaining > 0):
                damaged = first_damaged(result.messages)
                if damaged is not None:
                    # Never hand out bytes that are not what was committed: this replica needs repair
                    log.critical("damaged record at commit-log offset %d in %s/%d: refusing to serve it",
                                 damaged, header.topic, header.queue_id)
                    raise RequestError(ResponseCode.SYSTEM_ERROR,
                                       f"this replica holds a damaged record at commit-log offset {damaged}; "
                                       "read from another member")
                return self._served(request, header, result, broker.member.is_leader)
            await self.waiters.wait(header.topic, header.queue_id, header.queue_offset, remaining)
            if loop.time() >= deadline and broker.store.max_queue_offset(header.topic, header.queue_id) <= header.queue_offset:
                return self._served(request, header, result, broker.member.is_leader)

    def _served(self, request: RemotingCommand, header: PullHeader, result: GetResult,
                is_leader: bool) -> RemotingCommand:
        if result.status is GetStatus.FOUND:
            self.rates.record(header.consumer_group, header.topic, len(result.messages))
        else:
            self.rates.record_miss()
        return self._response(request, header, result, is_leader)

    @staticmethod
    def _response(request: RemotingCommand, header: PullHeader, result: GetResult,
                  is_leader: bool = True) -> RemotingCommand:
        status = result.status
        next_offset = result.next_begin_offset
        body = b""
        if status is GetStatus.FOUND:
            code = ResponseCode.SUCCESS
            body = b"".join(result.messages)
        elif status is GetStatus.NO_MATCHED_MESSAGE:
            code = ResponseCode.PULL_RETRY_IMMEDIATELY
        elif status is GetStatus.OFFSET_OVERFLOW_ONE:
            code = ResponseCode.PULL_NOT_FOUND
        elif status is GetStatus.NO_MESSAGE_IN_QUEUE or status is GetStatus.NO_MATCHED_LOGIC_QUEUE:
            code = ResponseCode.PULL_NOT_FOUND if header.queue_offset == 0 else ResponseCode.PULL_OFFSET_MOVED
            next_offset = 0
        else:  # OFFSET_TOO_SMALL, OFFSET_OVERFLOW_BADLY
            code = ResponseCode.PULL_OFFSET_MOVED
        if code == ResponseCode.PULL_OFFSET_MOVED and not is_leader:
            # A follower may just lag: it must not move a consumer's offset (RocketMQ's slave answers
            # PULL_RETRY_IMMEDIATELY at the requested offset unless offsetCheckInSlave).
            code = ResponseCode.PULL_RETRY_IMMEDIATELY
            next_offset = header.queue_offset
        fields = {
            "nextBeginOffset": str(next_offset),
            "minOffset": str(result.min_offset),
            "maxOffset": str(result.max_offset),
            "suggestWhichBrokerId": "0",
        }
        return make_response(request, code, None if code == ResponseCode.SUCCESS else status.value, fields, body)
