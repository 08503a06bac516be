"""The transactional producer (Java's ``TransactionMQProducer``).

1. The message is sent as a half message (property ``TRAN_MSG=true``, ``PGROUP``, sysFlag 0x4):
   stored, invisible to consumers.
2. Your ``execute_local_transaction(message, arg)`` runs and returns COMMIT_MESSAGE,
   ROLLBACK_MESSAGE or UNKNOW (an exception counts as UNKNOW).
3. END_TRANSACTION tells the broker's leader to commit (8) or roll back (12), as a request that rides
   out a leader change (Java sends it oneway); UNKNOW (0) is sent oneway, as Java does.
4. For a half message left open (UNKNOW, or an END_TRANSACTION lost to a crash or a leader change),
   the broker later sends CHECK_TRANSACTION_STATE to a live producer of the group;
   ``check_local_transaction(message)`` answers, and the producer sends END_TRANSACTION with
   ``fromTransactionCheck=true`` back to the broker that asked.

Listener methods may be plain functions (run in a thread pool) or coroutine functions.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import enum
import inspect
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Final, Protocol

from client.config import ClientConfig, ProducerConfig
from client.errors import MQClientError
from client.instance import check_response
from client.message import Message, MessageExt, SendResult, SendStatus, decode_messages
from client.producer import AsyncProducer, current_time_ms
from commitlog.hosts import decode_message_id
from commitlog.record_codec import RecordError
from protocol.codes import RequestCode
from protocol.command import RemotingCommand
from protocol.properties import (
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_REAL_TOPIC,
    PROPERTY_TRANSACTION_PREPARED,
    PROPERTY_UNIQ_KEY,
)

logger = logging.getLogger(__name__)

#: END_TRANSACTION ``commitOrRollback`` values (MessageSysFlag)
TRANSACTION_NOT_TYPE: Final = 0
TRANSACTION_COMMIT_TYPE: Final = 8
TRANSACTION_ROLLBACK_TYPE: Final = 12
#: check-backs handled at once; more wait (Java: a pool of 1..1 threads with a 2000-entry queue)
CHECKS_IN_FLIGHT_MAX: Final = 16


class LocalTransactionState(enum.Enum):
    COMMIT_MESSAGE = "COMMIT_MESSAGE"
    ROLLBACK_MESSAGE = "ROLLBACK_MESSAGE"
    UNKNOW = "UNKNOW"  # Java's spelling


_END_TYPE: Final = {
    LocalTransactionState.COMMIT_MESSAGE: TRANSACTION_COMMIT_TYPE,
    LocalTransactionState.ROLLBACK_MESSAGE: TRANSACTION_ROLLBACK_TYPE,
    LocalTransactionState.UNKNOW: TRANSACTION_NOT_TYPE,
}

StateOrAwaitable = LocalTransactionState | Awaitable[LocalTransactionState]


class TransactionListener(Protocol):
    def execute_local_transaction(self, message: Message, arg: object) -> StateOrAwaitable: ...

    def check_local_transaction(self, message: MessageExt) -> StateOrAwaitable: ...


@dataclass(frozen=True, slots=True)
class TransactionSendResult:
    """The half message's send result and what the local transaction decided."""

    send_result: SendResult
    local_state: LocalTransactionState

    @property
    def msg_id(self) -> str:
        return self.send_result.msg_id

    @property
    def transaction_id(self) -> str:
        return self.send_result.transaction_id or self.send_result.msg_id


class AsyncTransactionProducer(AsyncProducer):
    def __init__(
        self,
        namesrv: str | ClientConfig,
        config: ProducerConfig | None = None,
        *,
        listener: TransactionListener,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.monotonic,
        clock_ms: Callable[[], int] = current_time_ms,
        id_clock_ms: Callable[[], int] | None = None,
    ) -> None:
        super().__init__(namesrv, config, rng=rng, clock=clock, clock_ms=clock_ms, id_clock_ms=id_clock_ms)
        self.listener = listener
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=CHECKS_IN_FLIGHT_MAX, thread_name_prefix=f"transaction-{self.group}"
        )
        self._checks: asyncio.Semaphore | None = None
        self.instance.register_request_handler(RequestCode.CHECK_TRANSACTION_STATE, self._on_check)

    async def start(self) -> AsyncTransactionProducer:
        self._checks = asyncio.Semaphore(CHECKS_IN_FLIGHT_MAX)
        await super().start()
        return self

    async def close(self) -> None:
        try:
            await super().close()
        finally:
            self._executor.shutdown(wait=False, cancel_futures=True)

    async def _call(self, function: Callable[..., StateOrAwaitable], *arguments: object) -> LocalTransactionState:
        if inspect.iscoroutinefunction(function):
            result = await function(*arguments)
        else:
            loop = asyncio.get_running_loop()
            result = await loop.run_in_executor(self._executor, function, *arguments)
            if inspect.isawaitable(result):
                result = await result
        if not isinstance(result, LocalTransactionState):
            raise TypeError(f"a transaction listener must return a LocalTransactionState, got {result!r}")
        return result

    async def send_message_in_transaction(self, message: Message, arg: object = None) -> TransactionSendResult:
        """Send ``message`` as a half message, run the local transaction, end it on the broker.
        Raises only when the half message could not be sent (nothing to end then)."""
        self._check_running()
        message.delay_level = 0  # Java clears a delay: a transactional message cannot be delayed
        message.deliver_at_ms = None
        result = await self.send(
            message,
            extra_properties={PROPERTY_TRANSACTION_PREPARED: "true", PROPERTY_PRODUCER_GROUP: self.group},
        )
        state = LocalTransactionState.ROLLBACK_MESSAGE
        remark: str | None = None
        if result.status is SendStatus.SEND_OK:
            try:
                state = await self._call(self.listener.execute_local_transaction, message, arg)
            except Exception as error:  # the user's code: its failure leaves the outcome to a check-back
                logger.exception("%s: the local transaction of %s failed", self.group, result.msg_id)
                state = LocalTransactionState.UNKNOW
                remark = f"executeLocalTransactionBranch exception: {error}"
        await self._end_transaction(result, state, remark)
        return TransactionSendResult(result, state)

    async def _end_transaction(self, result: SendResult, state: LocalTransactionState, remark: str | None) -> None:
        try:
            _, commit_log_offset = decode_message_id(result.offset_msg_id or result.msg_id)
        except ValueError:
            logger.warning("%s: cannot end %s: no store message id", self.group, result.msg_id)
            return
        fields = {
            "producerGroup": self.group,
            "tranStateTableOffset": str(result.queue_offset),
            "commitLogOffset": str(commit_log_offset),
            "commitOrRollback": str(_END_TYPE[state]),
            "fromTransactionCheck": "false",
            "msgId": result.msg_id,
            "transactionId": result.transaction_id or result.msg_id,
        }
        if state is LocalTransactionState.UNKNOW:
            # nothing to decide: a oneway note (Java brokers do not answer it); the check-back follows
            address = self.instance.leader_address(result.message_queue.broker_name) or result.broker_address
            try:
                await self.instance.oneway(address, RequestCode.END_TRANSACTION, fields, remark=remark)
            except MQClientError as error:
                logger.info("%s: END_TRANSACTION (unknown) of %s failed: %s", self.group, result.msg_id, error)
            return
        # a decision goes to the leader with failover, and is confirmed (Java sends it oneway: a lost
        # one waits for the check-back; here a leader change costs a retry, not a check period)
        try:
            response, address = await self.instance.invoke_leader(
                result.message_queue.broker_name,
                RequestCode.END_TRANSACTION,
                fields,
                deadline=self.instance.now() + self.config.send_timeout_seconds,
            )
            check_response(response, address)
        except MQClientError as error:
            logger.warning(
                "%s: END_TRANSACTION (%s) of %s failed, the broker's check-back will settle it: %s",
                self.group,
                state.value,
                result.msg_id,
                error,
            )

    async def _on_check(self, address: str, request: RemotingCommand) -> RemotingCommand | None:
        """CHECK_TRANSACTION_STATE (oneway): answer with END_TRANSACTION to the broker that asked."""
        self.instance.spawn(self._check(address, request), f"transaction check from {address}")
        return None

    async def _check(self, address: str, request: RemotingCommand) -> None:
        header = request.ext_fields
        try:
            (message,) = decode_messages(request.body)
        except (RecordError, ValueError) as error:
            logger.warning("%s: unreadable CHECK_TRANSACTION_STATE from %s: %s", self.group, address, error)
            return
        group = message.properties.get(PROPERTY_PRODUCER_GROUP)
        if group is not None and group != self.group:
            logger.warning("%s: check-back for another group %s ignored", self.group, group)
            return
        message = message.with_changes(
            topic=message.properties.get(PROPERTY_REAL_TOPIC, message.topic),
        )
        assert self._checks is not None
        remark: str | None = None
        async with self._checks:
            try:
                state = await self._call(self.listener.check_local_transaction, message)
            except Exception as error:  # the user's code: the broker will ask again
                logger.exception("%s: check_local_transaction failed", self.group)
                state = LocalTransactionState.UNKNOW
                remark = f"checkLocalTransactionState exception: {error}"
        fields = {
            "producerGroup": self.group,
            "tranStateTableOffset": header.get("tranStateTableOffset", "0"),
            "commitLogOffset": header.get("commitLogOffset", str(message.commit_log_offset)),
            "commitOrRollback": str(_END_TYPE[state]),
            "fromTransactionCheck": "true",
            "msgId": message.properties.get(PROPERTY_UNIQ_KEY) or message.msg_id,
            "transactionId": header.get("transactionId") or message.msg_id,
        }
        try:
            await self.instance.oneway(address, RequestCode.END_TRANSACTION, fields, remark=remark)
        except MQClientError as error:
            logger.warning("%s: answering the check-back from %s failed: %s", self.group, address, error)

