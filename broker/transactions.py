"""Transactional messages: END_TRANSACTION and the leader's check-back service, through Raft.

A half message (sysFlag PREPARED) is stored in RMQ_SYS_TRANS_HALF_TOPIC queue 0 with its real topic and
queue in REAL_TOPIC / REAL_QID (the send processor does that); it is invisible to consumers of the real
topic. Its queue offset in the half queue names it (RocketMQ's ``tranStateTableOffset``).

* Commit: one command holds the real message (same properties, so the same UNIQ_KEY; sysFlag COMMIT;
  preparedTransactionOffset = the half's commit-log offset), an op record in RMQ_SYS_TRANS_OP_HALF_TOPIC
  (body: the half's queue offset; TAGS "d") and ``TransactionOp(half, COMMIT)``. Apply refuses the whole
  command when the half is already resolved, so a commit sent twice, or racing a check-back's discard,
  applies once.
* Rollback: the op record and ``TransactionOp(half, ROLLBACK)``.
* Check-back (leader only): halves older than the transaction timeout (or their
  CHECK_IMMUNITY_TIME_IN_SECONDS) and unresolved are checked with CHECK_TRANSACTION_STATE on a live
  connection of a producer of their group; each check is counted through Raft
  (``TransactionOp(half, CHECK)``), so a new leader neither forgets pending checks nor exceeds the maximum.
  Without a live 4.x producer of the group, a 5.x producer of the half's topic is asked over its Telemetry
  stream (``recover_orphaned``: broker.v2.telemetry), as RocketMQ's proxy does.
  After the maximum, the half is copied to TRANS_CHECK_MAX_TIME_TOPIC and resolved as DISCARD (reported).
  The replicated progress (every half below it resolved) moves forward as halves resolve.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Final

from broker.consumers import ConsumerManager
from broker.context import BrokerContext
from broker.remoting.server import Connection, RequestContext
from broker.requests import INT64_MAX, RequestError, integer, text
from commitlog.errors import StoreError
from commitlog.hosts import encode_peer
from commitlog.message import MessageInput
from commitlog.record_codec import StoredMessage, decode_record, encode_record
from commitlog.sys_flags import TRANSACTION_COMMIT_TYPE, TRANSACTION_TYPE_MASK
from dledger.command import Command, Messages, TimerProgress, TransactionAction, TransactionOp
from dledger.state import TRANSACTION_PROGRESS_KEY
from protocol.codes import RequestCode, ResponseCode
from protocol.command import RemotingCommand, make_response
from protocol.connection import RemotingError
from protocol.properties import (
    PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS,
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_TAGS,
    PROPERTY_TRANSACTION_PREPARED,
    PROPERTY_UNIQ_KEY,
    encode_properties,
    encode_properties_text,
)
from protocol.topics import TRANS_CHECK_MAX_TIME_TOPIC, TRANS_HALF_TOPIC, TRANS_OP_HALF_TOPIC

log = logging.getLogger(__name__)

#: END_TRANSACTION's commitOrRollback values (MessageSysFlag)
COMMIT_OR_ROLLBACK_UNKNOWN: Final = 0
COMMIT: Final = 0x8
ROLLBACK: Final = 0xC
#: halves one check round looks at, at most
CHECK_SCAN_MAX: Final = 10_000
OP_TAG: Final = "d"
#: an op record's properties: its tag alone
_OP_PROPERTIES: Final = encode_properties({PROPERTY_TAGS: OP_TAG})


def op_record(half_queue_offset: int, born_host: bytes, now_ms: int) -> MessageInput:
    """The op record of a resolved half (TransactionalMessageBridge.putOpMessage)."""
    return MessageInput(TRANS_OP_HALF_TOPIC, 0, 0, 0, now_ms, born_host, now_ms, 0, 0,
                        str(half_queue_offset).encode(), _OP_PROPERTIES)


def committed_message(half: StoredMessage, now_ms: int) -> MessageInput:
    """The real message a committed half becomes (EndTransactionProcessor.endMessageTransaction)."""
    properties = half.property_map
    topic = properties.pop(PROPERTY_REAL_TOPIC, "")
    queue_id = int(properties.pop(PROPERTY_REAL_QUEUE_ID, "0") or 0)
    properties.pop(PROPERTY_TRANSACTION_PREPARED, None)
    return MessageInput(
        topic=topic, queue_id=queue_id, flag=half.flag,
        sys_flag=(half.sys_flag & ~TRANSACTION_TYPE_MASK) | TRANSACTION_COMMIT_TYPE,
        born_timestamp=half.born_timestamp, born_host=half.born_host, store_timestamp=now_ms,
        reconsume_times=half.reconsume_times, prepared_transaction_offset=half.physical_offset, body=half.body,
        properties=encode_properties_text(properties).encode("utf-8", "surrogatepass"),
    )


def own_born_host(broker: BrokerContext) -> bytes:
    """The born host of the messages this broker makes itself (a committed half's final message, a
    discarded half): its listen address when that is an IP literal, else the group's store host (a host
    name has no bytes)."""
    host, _, port = broker.config.listen_address.rpartition(":")
    try:
        return encode_peer(host, int(port))
    except ValueError:
        return broker.node.store_config.store_host_bytes


class EndTransactionProcessor:
    def __init__(self, broker: BrokerContext) -> None:
        self.broker = broker
        self.born_host = own_born_host(broker)

    async def __call__(self, context: RequestContext) -> RemotingCommand | None:
        request = context.request
        try:
            return await self.end(request)
        except RequestError as error:
            return make_response(request, error.code, error.remark, error.ext_fields)

    async def end(self, request: RemotingCommand) -> RemotingCommand:
        broker = self.broker
        fields = request.ext_fields
        group = text(fields, "producerGroup")
        half_offset = integer(fields, "tranStateTableOffset", None, 0, INT64_MAX)
        commit_log_offset = integer(fields, "commitLogOffset", None, 0, INT64_MAX)
        decision = integer(fields, "commitOrRollback", None, 0, 0xFF)
        if decision not in (COMMIT_OR_ROLLBACK_UNKNOWN, COMMIT, ROLLBACK):
            raise RequestError(ResponseCode.SYSTEM_ERROR, f"commitOrRollback must be 0, 8 or 12, got {decision}")
        if decision == COMMIT_OR_ROLLBACK_UNKNOWN:
            return make_response(request, ResponseCode.SUCCESS, "state unknown: the broker will check back")
        broker.require_leader()
        try:
            half = broker.store.read_message(commit_log_offset)
        except (StoreError, ValueError) as exc:
            raise RequestError(ResponseCode.SYSTEM_ERROR,
                               f"Find prepared transaction message failed: {exc}") from None
        if half.topic != TRANS_HALF_TOPIC or half.queue_offset != half_offset:
            raise RequestError(ResponseCode.SYSTEM_ERROR,
                               f"the message at commit-log offset {commit_log_offset} is not the half message "
                               f"{half_offset} (topic {half.topic}, queue offset {half.queue_offset})")
        if half.property_map.get(PROPERTY_PRODUCER_GROUP) != group:
            raise RequestError(ResponseCode.SYSTEM_ERROR, "The producer group wrong")
        now = broker.wall_clock_ms()
        operations: list[Messages | TransactionOp] = []
        if decision == COMMIT:
            operations.append(Messages((committed_message(half, now), op_record(half_offset, self.born_host, now))))
            action = TransactionAction.COMMIT
        else:
            operations.append(Messages((op_record(half_offset, self.born_host, now),)))
            action = TransactionAction.ROLLBACK
        operations.append(TransactionOp(half_offset, action, group, now))
        result = await broker.propose(Command(tuple(operations)))
        if result.noop_reason is not None:
            resolved = broker.state.transactions_resolved.get(half_offset)
            if resolved == action:
                return make_response(request, ResponseCode.SUCCESS, "already resolved the same way")
            raise RequestError(ResponseCode.SYSTEM_ERROR, f"transaction not pending: {result.noop_reason}")
        return make_response(request, ResponseCode.SUCCESS)


class TransactionCheckService:
    def __init__(self, broker: BrokerContext, clients: ConsumerManager,
                 monotonic: Callable[[], float] = time.monotonic,
                 recover_orphaned: Callable[[StoredMessage], str | None] | None = None) -> None:
        """``recover_orphaned``: asks a 5.x producer to resolve a half when no 4.x producer of its group is
        connected; returns the client asked, or None when there is none."""
        self.broker = broker
        self.clients = clients
        self.recover_orphaned = recover_orphaned
        self.monotonic = monotonic
        self.born_host = own_born_host(broker)
        self._last_checked: dict[int, float] = {}
        self._task: asyncio.Task[None] | None = None
        self._background: set[asyncio.Task[None]] = set()
        #: halves discarded after the maximum number of checks, by this member (reported in logs too)
        self.discarded: list[int] = []

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="transaction-check")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        interval = self.broker.config.transaction_check_interval_ms / 1000
        while True:
            await asyncio.sleep(min(interval, 1.0))
            if not self.broker.member.is_leader:
                self._last_checked.clear()
                continue
            try:
                await self.check_round()
            except RequestError as exc:
                log.info("transaction check paused: %s", exc.remark)
            except Exception:
                log.exception("transaction check round failed")

    async def check_round(self) -> None:
        broker = self.broker
        store = broker.store
        config = broker.config
        state = broker.state
        now_ms = broker.wall_clock_ms()
        now = self.monotonic()
        interval = config.transaction_check_interval_ms / 1000
        start = max(state.transaction_progress, store.min_queue_offset(TRANS_HALF_TOPIC, 0))
        end = store.max_queue_offset(TRANS_HALF_TOPIC, 0)
        offset = start
        first_pending: int | None = None
        scanned = 0
        while offset < end and scanned < CHECK_SCAN_MAX:
            result = store.get_messages(TRANS_HALF_TOPIC, 0, offset, 64)
            if not result.messages:
                offset = max(offset + 1, result.next_begin_offset)
                continue
            for half_offset, raw in zip(result.queue_offsets, result.messages, strict=True):
                offset = half_offset + 1
                scanned += 1
                if half_offset in state.transactions_resolved:
                    continue
                if first_pending is None:
                    first_pending = half_offset
                half = decode_record(raw, check_crc=False)
                properties = half.property_map
                immunity_ms = int(properties.get(PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS, "0") or 0) * 1000
                if now_ms - half.store_timestamp < max(config.transaction_timeout_ms, immunity_ms):
                    continue
                if now - self._last_checked.get(half_offset, -interval) < interval:
                    continue
                self._last_checked[half_offset] = now
                await self._check(half, half_offset, properties, now_ms)
        new_progress = first_pending if first_pending is not None else offset
        if new_progress > state.transaction_progress:
            await broker.propose(Command((TimerProgress(TRANSACTION_PROGRESS_KEY, new_progress),)))
            for half_offset in [h for h in self._last_checked if h < new_progress]:
                del self._last_checked[half_offset]

    async def _check(self, half: StoredMessage, half_offset: int, properties: dict[str, str], now_ms: int) -> None:
        broker = self.broker
        group = properties.get(PROPERTY_PRODUCER_GROUP, "")
        checks = broker.state.transaction_checks.get(half_offset, 0)
        if checks >= broker.config.transaction_check_max:
            discarded = MessageInput(
                TRANS_CHECK_MAX_TIME_TOPIC, 0, half.flag, half.sys_flag, half.born_timestamp, half.born_host,
                now_ms, half.reconsume_times, half.physical_offset, half.body, half.properties)
            result = await broker.propose(Command((
                Messages((discarded, op_record(half_offset, self.born_host, now_ms))),
                TransactionOp(half_offset, TransactionAction.DISCARD, group, now_ms),
            )))
            if result.noop_reason is None:
                self.discarded.append(half_offset)
                log.warning("transaction half %d (group %s, UNIQ_KEY %s) discarded after %d checks",
                            half_offset, group, properties.get(PROPERTY_UNIQ_KEY), checks)
            return
        result = await broker.propose(Command((TransactionOp(half_offset, TransactionAction.CHECK, group, now_ms),)))
        if result.noop_reason is not None:
            return
        connections = self.clients.producer_connections(group)
        if not connections:
            asked = self.recover_orphaned(half) if self.recover_orphaned is not None else None
            if asked is None:
                log.info("no live producer of group %s to check half %d", group, half_offset)
            else:
                log.info("asked 5.x producer %s to resolve half %d", asked, half_offset)
            return
        connection = connections[broker.random.randrange(len(connections))]
        unique_key = properties.get(PROPERTY_UNIQ_KEY, "")
        real = MessageInput(properties.get(PROPERTY_REAL_TOPIC, half.topic),
                            int(properties.get(PROPERTY_REAL_QUEUE_ID, "0") or 0), half.flag, half.sys_flag,
                            half.born_timestamp, half.born_host, half.store_timestamp, half.reconsume_times,
                            half.prepared_transaction_offset, half.body, half.properties)
        body = encode_record(real, half_offset, half.physical_offset, broker.store.store_host)
        fields = {"tranStateTableOffset": str(half_offset), "commitLogOffset": str(half.physical_offset),
                  "msgId": unique_key, "transactionId": unique_key, "offsetMsgId": half.msg_id}
        task = asyncio.get_running_loop().create_task(self._send_check(connection, fields, body))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    @staticmethod
    async def _send_check(connection: Connection, fields: dict[str, str], body: bytes) -> None:
        try:
            await connection.send_oneway(RequestCode.CHECK_TRANSACTION_STATE, fields, body)
        except (RemotingError, OSError) as exc:
            log.info("check-back request failed: %s", exc)
