"""The 5.x offset RPCs: PullMessage, UpdateOffset, GetOffset, QueryOffset. Typed requests in, typed responses
out; nothing here knows gRPC (``broker.v2.server`` is the shell).

The mapping is the proxy's (``proxy/grpc/v2/consumer/PullMessageActivity``, ``processor/ConsumerProcessor``):
each RPC is the 4.x request the proxy would have sent the broker, served from the same store and the same
replicated offsets as the 4.x path.

- PullMessage is PULL_MESSAGE (``broker.pull``): a stream of a status, then each message (as
  ``broker.v2.consumer.v2_stored_message`` builds it, without a receipt handle), then the next offset.
  Nothing to read at the offset: MESSAGE_NOT_FOUND once the long-polling time is up, woken by every apply
  (``broker.pull.PullWaiters``). Messages the tag filter skips move the next offset on, and polling goes on
  from there until something matches. An offset outside the queue (below its first message, or past its
  end on the leader) is ILLEGAL_OFFSET with the offset to continue from, after the leader made sure it is
  not merely behind (``BrokerContext.barrier``); a follower never moves a consumer (it may just lag): it
  answers MESSAGE_NOT_FOUND at the requested offset. Every member serves pulls (its store holds only
  committed data).
- UpdateOffset is UPDATE_CONSUMER_OFFSET: the leader commits the offset through Raft
  (``broker.offsets.OffsetCommitter``) and answers once it applied; a follower forwards the call to the
  leader (the server shell). An offset past the queue's end is ILLEGAL_OFFSET.
- GetOffset is QUERY_CONSUMER_OFFSET on this member's replicated state; OFFSET_NOT_FOUND for a group
  that never committed one on that queue (the 4.x answer of 0 for a queue that still starts at 0 is for
  4.x clients that treat "not found" as "start at the end"; a 5.x caller gets the protocol's code).
- QueryOffset is GET_MIN_OFFSET (BEGINNING), GET_MAX_OFFSET (END) or SEARCH_OFFSET_BY_TIMESTAMP
  (TIMESTAMP, which needs a timestamp) on this member's store.

Consumer groups exist implicitly (as with RocketMQ's ``autoCreateSubscriptionGroup``): a group is refused
only for an illegal name, or for pulls while it is configured with consumption disabled.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Final

from broker.context import BrokerContext
from broker.offsets import OffsetCommitter
from broker.pull import HELD_PULLS_MAX, PullWaiters
from broker.requests import RequestError
from broker.subscription_groups import check_consume_enabled
from broker.v2.auth import Access, Authenticator
from broker.v2.consumer import (
    DEADLINE_MARGIN_SECONDS,
    TagFilter,
    duration_ms,
    group_name,
    tag_filter,
    v2_stored_message,
)
from broker.v2.messages import timestamp_ms, topic_name
from broker.v2.protocol.definition_pb2 import Code, Message, MessageQueue, QueryOffsetPolicy, Resource, Status
from broker.v2.protocol.service_pb2 import (
    GetOffsetRequest,
    GetOffsetResponse,
    PullMessageRequest,
    PullMessageResponse,
    QueryOffsetRequest,
    QueryOffsetResponse,
    UpdateOffsetRequest,
    UpdateOffsetResponse,
)
from broker.v2.service import CallInfo
from broker.v2.status import StatusError, ok
from commitlog.outcomes import GetResult, GetStatus
from commitlog.record_codec import RecordError, decode_record
from protocol.properties import PROPERTY_TAGS
from protocol.route_data import PERM_READ

log = logging.getLogger(__name__)

#: reads of a queue one pull makes without waiting, skipping what its tag filter does not select: a queue
#: full of other tags is answered MESSAGE_NOT_FOUND with the offset reached, and the client pulls on from there
PULL_SCANS_MAX: Final = 16

#: store answers that mean the requested offset lies outside the queue
_MOVED: Final = frozenset({GetStatus.OFFSET_TOO_SMALL, GetStatus.OFFSET_OVERFLOW_BADLY})
#: store answers after which the leader makes sure it is not behind before moving a consumer
_MAYBE_BEHIND: Final = frozenset({GetStatus.OFFSET_OVERFLOW_BADLY, GetStatus.NO_MESSAGE_IN_QUEUE,
                                   GetStatus.NO_MATCHED_LOGIC_QUEUE})


@dataclass(frozen=True, slots=True)
class PullOutcome:
    """What one pull answers: its status, the messages found, and the offset to pull from next."""

    code: Code
    message: str
    next_offset: int
    messages: list[Message] = field(default_factory=list)


def _status(code: Code, message: str) -> Status:
    return Status(code=code, message=message)


def _is_moved(status: GetStatus, offset: int) -> bool:
    """Whether the store's answer means ``offset`` is outside the queue (``broker.pull.moves_offset``, plus a
    queue that starts above it)."""
    if status in _MOVED:
        return True
    return offset != 0 and status in (GetStatus.NO_MESSAGE_IN_QUEUE, GetStatus.NO_MATCHED_LOGIC_QUEUE)


class PullService:
    def __init__(self, broker: BrokerContext, offsets: OffsetCommitter, waiters: PullWaiters,
                 authenticator: Authenticator) -> None:
        self.broker = broker
        self.offsets = offsets
        self.waiters = waiters
        self.authenticator = authenticator

    def _queue_id(self, topic: str, queue: MessageQueue, *, read: bool) -> int:
        """The queue a request names, checked against the topic: TOPIC_NOT_FOUND, FORBIDDEN (``read``: a topic
        that cannot be read) or BAD_REQUEST (no such queue), as the 4.x path checks (``topic_for_read``)."""
        config = self.broker.topic_config(topic)
        if config is None or config.deleted:
            raise StatusError(Code.TOPIC_NOT_FOUND, f"topic {topic} does not exist")
        if read and not config.perm & PERM_READ:
            raise StatusError(Code.FORBIDDEN, f"the topic {topic} cannot be read")
        queue_nums = max(config.read_queue_nums, config.write_queue_nums)
        if not 0 <= queue.id < queue_nums:
            raise StatusError(Code.BAD_REQUEST, f"topic {topic} has no queue {queue.id} (it has {queue_nums})")
        return queue.id

    # ---------------------------------------------------------------------------------- PullMessage

    async def pull(self, request: PullMessageRequest, call: CallInfo,
                   remaining_seconds: float | None) -> AsyncIterator[PullMessageResponse]:
        """The response stream of one PullMessage. ``remaining_seconds``: the client's deadline, if any."""
        try:
            topic, group = topic_name(request.message_queue.topic), group_name(request.group)
            self.authenticator.check(call.metadata, call.peer_host, Access(subscribe_topics=(topic,), group=group),
                                     "PullMessage")
            selector = tag_filter(request.filter_expression)
            if request.batch_size <= 0:
                raise StatusError(Code.BAD_REQUEST, f"batch size {request.batch_size} is not positive")
            if request.offset < 0:
                raise StatusError(Code.ILLEGAL_OFFSET, f"offset {request.offset} is negative")
            polling = request.long_polling_timeout
            if polling.seconds < 0 or polling.nanos < 0:
                raise StatusError(Code.ILLEGAL_POLLING_TIME, "the long-polling timeout is negative")
            polling_seconds = min(duration_ms(polling), self.broker.config.long_polling_max_ms) / 1000
            if remaining_seconds is not None:
                polling_seconds = min(polling_seconds, max(0.0, remaining_seconds - DEADLINE_MARGIN_SECONDS))
            queue_id = self._queue_id(topic, request.message_queue, read=True)
            check_consume_enabled(self.broker.state.groups, group)
            count = min(request.batch_size, self.broker.config.pull_messages_max)
            outcome = await self._pull(topic, queue_id, request.offset, count, selector, polling_seconds,
                                       request.message_queue.topic)
        except StatusError as error:
            yield PullMessageResponse(status=error.status())
            return
        except RequestError as error:
            yield PullMessageResponse(status=StatusError.of(error).status())
            return
        yield PullMessageResponse(status=_status(outcome.code, outcome.message))
        for message in outcome.messages:
            yield PullMessageResponse(message=message)
        yield PullMessageResponse(next_offset=outcome.next_offset)

    async def _pull(self, topic: str, queue_id: int, offset: int, count: int, selector: TagFilter,
                    polling_seconds: float, resource: Resource) -> PullOutcome:
        broker = self.broker
        store = broker.store
        loop = asyncio.get_running_loop()
        deadline = loop.time() + polling_seconds
        barrier_passed = False
        scans = 0  # reads since the last wait
        while True:
            result = store.get_messages(topic, queue_id, offset, count, broker.config.pull_bytes_max, selector.codes)
            status = result.status
            scans += 1
            moved = _is_moved(status, offset)
            # below the queue's first message is final on any member (retention only ever raises it); past its
            # end only on the leader, once it made sure it is not merely behind what the consumer read elsewhere
            if moved and (status is GetStatus.OFFSET_TOO_SMALL or broker.member.is_leader):
                if not barrier_passed and status in _MAYBE_BEHIND:
                    await broker.barrier()
                    barrier_passed = True
                    continue
                return PullOutcome(Code.ILLEGAL_OFFSET, f"offset {offset} is outside the queue "
                                   f"[{result.min_offset}, {result.max_offset}]", result.next_begin_offset)
            if status is GetStatus.FOUND:
                messages = self._messages(result, selector, resource)
                if messages:
                    return PullOutcome(Code.OK, "OK", result.next_begin_offset, messages)
                offset = result.next_begin_offset  # only other tags with a matching hash: look further
            elif status is GetStatus.NO_MATCHED_MESSAGE:
                offset = result.next_begin_offset
            # else nothing new at the offset or, on a follower, past what it holds yet (it may lag): a follower
            # never moves a consumer, it waits and at worst answers at the requested offset
            more = not moved and offset < store.max_queue_offset(topic, queue_id)
            if more and scans < PULL_SCANS_MAX:
                continue  # skipped messages of other tags: read on
            remaining = deadline - loop.time()
            if more or remaining <= 0 or self.waiters.held >= HELD_PULLS_MAX:
                return PullOutcome(Code.MESSAGE_NOT_FOUND, "no new message", offset)
            # woken once the queue holds a message at ``offset``
            await self.waiters.wait(topic, queue_id, offset - 1 if moved else offset, remaining)
            scans = 0

    @staticmethod
    def _messages(result: GetResult, selector: TagFilter, resource: Resource) -> list[Message]:
        messages = []
        for raw in result.messages:
            try:
                stored = decode_record(raw)
            except RecordError as exc:
                # never hand out bytes that are not what was committed: this replica needs repair
                log.critical("damaged record in a 5.x pull: %s", exc)
                raise StatusError(Code.INTERNAL_SERVER_ERROR,
                                  f"this replica holds a damaged record ({exc}); pull from another member") from None
            if not selector.accepts(stored.property_map.get(PROPERTY_TAGS)):
                continue
            message = v2_stored_message(stored, resource)
            message.system_properties.delivery_attempt = stored.reconsume_times + 1
            messages.append(message)
        return messages

    # ---------------------------------------------------------------------------------- offsets

    async def update_offset(self, request: UpdateOffsetRequest, call: CallInfo) -> UpdateOffsetResponse:
        """On the leader only (the server shell forwards a follower's call): answered once the offset applied."""
        try:
            topic, group = topic_name(request.message_queue.topic), group_name(request.group)
            self.authenticator.check(call.metadata, call.peer_host, Access(subscribe_topics=(topic,), group=group),
                                     "UpdateOffset")
            queue_id = self._queue_id(topic, request.message_queue, read=False)
            offset = request.offset
            if offset < 0:
                raise StatusError(Code.ILLEGAL_OFFSET, f"offset {offset} is negative")
            store = self.broker.store
            if offset > store.max_queue_offset(topic, queue_id):
                await self.broker.barrier()  # not merely behind what the consumer read elsewhere
                high = store.max_queue_offset(topic, queue_id)
                if offset > high:
                    raise StatusError(Code.ILLEGAL_OFFSET, f"offset {offset} is past the end of queue {queue_id} "
                                                           f"of {topic} ({high})")
            await self.offsets.submit(group, topic, queue_id, offset)
        except StatusError as error:
            return UpdateOffsetResponse(status=error.status())
        except RequestError as error:
            return UpdateOffsetResponse(status=StatusError.of(error).status())
        return UpdateOffsetResponse(status=ok())

    async def get_offset(self, request: GetOffsetRequest, call: CallInfo) -> GetOffsetResponse:
        """The offset this member's replicated state holds (and, on the leader, one committed but not applied yet)."""
        try:
            topic, group = topic_name(request.message_queue.topic), group_name(request.group)
            self.authenticator.check(call.metadata, call.peer_host, Access(subscribe_topics=(topic,), group=group),
                                     "GetOffset")
            queue_id = self._queue_id(topic, request.message_queue, read=False)
            offset = self.offsets.pending_offset(group, topic, queue_id)
            if offset is None:
                offset = self.broker.state.consumer_offset(group, topic, queue_id)
            if offset is None:
                raise StatusError(Code.OFFSET_NOT_FOUND,
                                  f"group {group} has no committed offset on queue {queue_id} of {topic}")
        except StatusError as error:
            return GetOffsetResponse(status=error.status())
        return GetOffsetResponse(status=ok(), offset=offset)

    async def query_offset(self, request: QueryOffsetRequest, call: CallInfo) -> QueryOffsetResponse:
        try:
            topic = topic_name(request.message_queue.topic)
            self.authenticator.check(call.metadata, call.peer_host, Access(subscribe_topics=(topic,)), "QueryOffset")
            queue_id = self._queue_id(topic, request.message_queue, read=False)
            store = self.broker.store
            policy = request.query_offset_policy
            if policy == QueryOffsetPolicy.BEGINNING:
                offset = store.min_queue_offset(topic, queue_id)
            elif policy == QueryOffsetPolicy.END:
                offset = store.max_queue_offset(topic, queue_id)
            elif policy == QueryOffsetPolicy.TIMESTAMP:
                if not request.HasField("timestamp"):
                    raise StatusError(Code.BAD_REQUEST, "timestamp is required for the TIMESTAMP query offset policy")
                at = request.timestamp
                offset = store.offset_by_timestamp(topic, queue_id, timestamp_ms(at.seconds, at.nanos))
            else:
                raise StatusError(Code.BAD_REQUEST, f"unknown query offset policy {policy}")
        except StatusError as error:
            return QueryOffsetResponse(status=error.status())
        return QueryOffsetResponse(status=ok(), offset=offset)
