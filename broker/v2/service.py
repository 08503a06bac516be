"""The 5.x RPCs on a broker member: each takes a typed request (and the call's :class:`CallInfo`) and returns
its typed response; nothing here knows gRPC (``broker.v2.server`` is the transport shell).

Writes take the 4.x write path, so both protocols store the same bytes and apply the same rules:

- SendMessage builds each message with ``SendProcessor.build_message`` (size checks, the delay/timer
  rewrite, the transaction half queue) and replicates it with ``BrokerContext.append``, as SEND_MESSAGE does.
  The queue is the proxy's choice: the message group's (``messages.fifo_queue_id``) for FIFO, else random.
  Topics are not created by a 5.x send (the proxy does not either): a missing topic is TOPIC_NOT_FOUND.
- EndTransaction goes through ``EndTransactionProcessor.end``, as END_TRANSACTION does. The transaction id
  a 5.x producer gets is the half message's store-based message id, so every member can find the half
  (the commit log is the same everywhere) without a table in memory.
- On a follower, a write raises :class:`NotLeaderError` naming the leader's gRPC address; the server shell
  forwards the call there.

QueryRoute lists the topic's queues on one broker, id 0, at the leader's gRPC address (5.x clients send
only to id 0), and every queue accepts every message type (``messages.ACCEPTED_MESSAGE_TYPES``).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from broker.context import BrokerContext
from broker.requests import RequestError
from broker.send import SendProcessor
from broker.transactions import COMMIT, ROLLBACK, EndTransactionProcessor
from broker.v2.auth import Access, Authenticator
from broker.v2.clients import ClientTable, SettingsLimits, server_settings
from broker.v2.messages import (
    ACCEPTED_MESSAGE_TYPES,
    SEND_MESSAGES_MAX,
    fifo_queue_id,
    outgoing_message,
    topic_name,
)
from broker.v2.protocol.definition_pb2 import (
    Address,
    AddressScheme,
    Broker,
    ClientType,
    Code,
    Endpoints,
    MessageQueue,
    Permission,
    Settings,
    TransactionResolution,
    TransactionSource,
)
from broker.v2.protocol.service_pb2 import (
    EndTransactionRequest,
    EndTransactionResponse,
    HeartbeatRequest,
    HeartbeatResponse,
    NotifyClientTerminationRequest,
    NotifyClientTerminationResponse,
    QueryRouteRequest,
    QueryRouteResponse,
    SendMessageRequest,
    SendMessageResponse,
    SendResultEntry,
    TelemetryCommand,
)
from broker.v2.status import StatusError, ok
from broker.v2.telemetry import TelemetrySessions
from commitlog.errors import StoreError
from commitlog.hosts import encode_host, encode_peer
from commitlog.outcomes import AppendStatus
from commitlog.sys_flags import TRANSACTION_TYPE_MASK
from dledger.config import parse_address
from dledger.member import GroupMember
from protocol.codes import RequestCode
from protocol.command import make_request
from protocol.properties import (
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_REAL_TOPIC,
    PROPERTY_TIMER_DELIVER_MS,
    PROPERTY_UNIQ_KEY,
)
from protocol.route_data import PERM_READ, PERM_WRITE
from protocol.topics import TRANS_HALF_TOPIC

HEADER_CLIENT_ID: Final = "x-mq-client-id"
#: a born host that cannot be encoded (an IPv6 peer) is stored as this, as the 4.x path does
UNKNOWN_BORN_HOST: Final = encode_host("127.0.0.1", 0)


@dataclass(frozen=True, slots=True)
class CallInfo:
    """What a handler needs of the call besides its request: the headers and the peer."""

    metadata: Mapping[str, str]
    peer_host: str
    peer_port: int

    @property
    def client_id(self) -> str:
        return self.metadata.get(HEADER_CLIENT_ID, "")

    @property
    def born_host(self) -> bytes:
        try:
            return encode_peer(self.peer_host, self.peer_port)
        except ValueError:
            return UNKNOWN_BORN_HOST


class NotLeaderError(Exception):
    """This member is not the leader; ``leader_address`` is the leader's gRPC address when known."""

    def __init__(self, leader_address: str | None, message: str) -> None:
        super().__init__(message)
        self.leader_address = leader_address
        self.message = message


def endpoints(address: str) -> Endpoints:
    """``host:port`` as the Endpoints a route carries."""
    host, port = parse_address(address, "grpc address")
    try:
        version = ipaddress.ip_address(host).version
        scheme = AddressScheme.IPv4 if version == 4 else AddressScheme.IPv6
    except ValueError:
        scheme = AddressScheme.DOMAIN_NAME
    return Endpoints(scheme=scheme, addresses=[Address(host=host, port=port)])


def route_queues(topic: str, read_queue_nums: int, write_queue_nums: int, perm: int, broker: Broker,
                 namespace: str, name: str) -> list[MessageQueue]:
    """The queues of a topic as the proxy lists them (``RouteActivity.genMessageQueueFromQueueData``):
    read-only ones, then write-only ones, then read-write ones, numbered from 0."""
    readable, writable = bool(perm & PERM_READ), bool(perm & PERM_WRITE)
    read_only = write_only = both = none = 0
    if readable and writable:
        both = min(write_queue_nums, read_queue_nums)
        read_only, write_only = read_queue_nums - both, write_queue_nums - both
    elif writable:
        write_only = write_queue_nums
    elif readable:
        read_only = read_queue_nums
    else:
        none = max(1, write_queue_nums, read_queue_nums)
    kinds = ((read_only, Permission.READ), (write_only, Permission.WRITE), (both, Permission.READ_WRITE),
             (none, Permission.NONE))
    queues: list[MessageQueue] = []
    for count, permission in kinds:
        for _ in range(count):
            queue = MessageQueue(id=len(queues), permission=permission, broker=broker,
                                 accept_message_types=ACCEPTED_MESSAGE_TYPES)
            queue.topic.name, queue.topic.resource_namespace = name, namespace
            queues.append(queue)
    return queues


class MessagingService:
    def __init__(self, broker: BrokerContext, sender: SendProcessor, transactions: EndTransactionProcessor,
                 authenticator: Authenticator, clients: ClientTable | None = None) -> None:
        self.broker = broker
        self.sender = sender
        self.transactions = transactions
        self.authenticator = authenticator
        self.clients = clients if clients is not None else ClientTable()
        #: the open Telemetry streams (transaction recovery is written on them)
        self.sessions = TelemetrySessions(rng=broker.random)
        config = broker.config
        #: Raft address -> that member's gRPC address (this member's and the peers' that are configured)
        self.grpc_address_by_raft = {broker.node.raft_address: config.grpc_address}
        for peer in broker.node.peers:
            if peer.id in config.peer_grpc_addresses:
                self.grpc_address_by_raft[peer.raft_address] = config.peer_grpc_addresses[peer.id]

    @property
    def member(self) -> GroupMember:
        return self.broker.member

    def settings_limits(self) -> SettingsLimits:
        config = self.broker.config
        # a redelivery waits as a 4.x consumer's retry does: delay level 3 + attempts (10 s, 30 s, 1 min, ...)
        backoff = config.delay_levels_seconds[2:] or config.delay_levels_seconds
        return SettingsLimits(self.broker.store.config.body_size_max_bytes, config.long_polling_max_ms,
                              config.max_reconsume_times + 1, backoff)

    def leader_grpc_address(self) -> str | None:
        if self.member.is_leader:
            return self.broker.config.grpc_address
        leader = self.member.status().leader
        return None if leader is None else self.grpc_address_by_raft.get(leader)

    def require_leader(self) -> None:
        if self.member.is_leader:
            return
        leader = self.leader_grpc_address()
        message = f"broker {self.broker.config.grpc_address} is not the leader of {self.broker.config.broker_name}"
        raise NotLeaderError(leader, message + (f"; the leader is {leader}" if leader else "; no leader is known"))

    # ---------------------------------------------------------------------------------------- RPCs

    async def query_route(self, request: QueryRouteRequest, call: CallInfo) -> QueryRouteResponse:
        try:
            topic = topic_name(request.topic)
            self.authenticator.check(call.metadata, call.peer_host, Access(), "QueryRoute")
            config = self.broker.topic_config(topic)
            if config is None or config.deleted:
                raise StatusError(Code.TOPIC_NOT_FOUND, f"topic {topic} does not exist")
            leader = self.leader_grpc_address()
            if not leader:
                raise StatusError(Code.INTERNAL_SERVER_ERROR,
                                  f"{self.broker.config.broker_name} has no leader serving 5.x clients now")
            broker = Broker(name=self.broker.config.broker_name, id=0, endpoints=endpoints(leader))
            queues = route_queues(topic, config.read_queue_nums, config.write_queue_nums, config.perm, broker,
                                  request.topic.resource_namespace, request.topic.name)
        except StatusError as error:
            return QueryRouteResponse(status=error.status())
        return QueryRouteResponse(status=ok(), message_queues=queues)

    async def heartbeat(self, request: HeartbeatRequest, call: CallInfo) -> HeartbeatResponse:
        try:
            group = request.group.name if request.HasField("group") else None
            self.authenticator.check(call.metadata, call.peer_host, Access(group=group), "Heartbeat")
            known = self.clients.get(call.client_id)
            client_type = request.client_type
            if client_type == ClientType.CLIENT_TYPE_UNSPECIFIED and known is not None:
                client_type = known.client_type
            if client_type == ClientType.CLIENT_TYPE_UNSPECIFIED:
                raise StatusError(Code.UNRECOGNIZED_CLIENT_TYPE, "the heartbeat names no client type")
            self.clients.heard(call.client_id, client_type)
        except StatusError as error:
            return HeartbeatResponse(status=error.status())
        return HeartbeatResponse(status=ok())

    async def notify_client_termination(self, request: NotifyClientTerminationRequest,
                                        call: CallInfo) -> NotifyClientTerminationResponse:
        try:
            group = request.group.name if request.HasField("group") else None
            self.authenticator.check(call.metadata, call.peer_host, Access(group=group), "NotifyClientTermination")
            self.clients.forget(call.client_id)
        except StatusError as error:
            return NotifyClientTerminationResponse(status=error.status())
        return NotifyClientTerminationResponse(status=ok())

    async def telemetry(self, command: TelemetryCommand, call: CallInfo) -> TelemetryCommand | None:
        """One command of a client's Telemetry stream; the command to answer with, if any."""
        if command.WhichOneof("command") != "settings":
            return None  # thread stack traces and verify results we never asked for
        settings = command.settings
        try:
            access = self._settings_access(settings)
            self.authenticator.check(call.metadata, call.peer_host, access, "Telemetry")
            reply = server_settings(settings, self.settings_limits())
            configured = self.broker.state.groups.get(access.group) if access.group else None
            if configured is not None and settings.HasField("subscription"):
                # the group's own: FIFO delivery (pop keeps each queue in order) and its delivery attempts
                reply.subscription.fifo = configured.consume_orderly
                reply.backoff_policy.max_attempts = configured.retry_max_times + 1
            self.clients.heard(call.client_id, settings.client_type, settings)
        except StatusError as error:
            return TelemetryCommand(status=error.status())
        return TelemetryCommand(status=ok(), settings=reply)

    @staticmethod
    def _settings_access(settings: Settings) -> Access:
        if settings.HasField("publishing"):
            return Access(publish_topics=tuple(topic_name(topic) for topic in settings.publishing.topics))
        if settings.HasField("subscription"):
            subscription = settings.subscription
            return Access(subscribe_topics=tuple(topic_name(entry.topic) for entry in subscription.subscriptions),
                          group=subscription.group.name or None)
        return Access()

    async def send_message(self, request: SendMessageRequest, call: CallInfo) -> SendMessageResponse:
        """Raises :class:`NotLeaderError` on a follower (after the checks that need no leader)."""
        try:
            return await self._send(request, call)
        except RequestError as error:
            return SendMessageResponse(status=StatusError.of(error).status())
        except StatusError as error:
            return SendMessageResponse(status=error.status())

    async def _send(self, request: SendMessageRequest, call: CallInfo) -> SendMessageResponse:
        broker = self.broker
        messages = request.messages
        if not messages:
            raise StatusError(Code.MESSAGE_CORRUPTED, "no message to send")
        if len(messages) > SEND_MESSAGES_MAX:
            raise StatusError(Code.BAD_REQUEST, f"one request carries at most {SEND_MESSAGES_MAX} messages")
        now_ms = broker.wall_clock_ms()
        body_size_max = broker.store.config.body_size_max_bytes
        outgoing = [outgoing_message(message, body_size_max, now_ms) for message in messages]
        topic = outgoing[0].topic
        if any(each.topic != topic for each in outgoing):
            raise StatusError(Code.MESSAGE_CORRUPTED, "topic in message is not same")
        self.authenticator.check(call.metadata, call.peer_host, Access(publish_topics=(topic,)), "SendMessage")
        if len(outgoing) > 1 and any(each.transactional or each.message_group or PROPERTY_TIMER_DELIVER_MS in
                                     each.properties for each in outgoing):
            raise StatusError(Code.BAD_REQUEST, "transactional, FIFO and delayed messages are sent one per request")
        self.require_leader()
        config = broker.topic_config(topic)
        if config is None or config.deleted:
            raise StatusError(Code.TOPIC_NOT_FOUND, f"topic {topic} does not exist")
        if not config.perm & PERM_WRITE or config.write_queue_nums <= 0:
            raise StatusError(Code.FORBIDDEN, f"the topic {topic} does not accept messages")
        group = outgoing[0].message_group
        queue_id = (fifo_queue_id(group, config.write_queue_nums) if group is not None
                    else broker.random.randrange(config.write_queue_nums))
        born_host = call.born_host
        stored = [self.sender.build_message(
            topic, queue_id, 0, each.sys_flag, each.born_timestamp_ms, born_host, each.body, dict(each.properties),
            each.reconsume_times, each.sys_flag & TRANSACTION_TYPE_MASK, producer_group=topic) for each in outgoing]
        results = await broker.append(stored)
        rejected = [result for result in results if result.status is not AppendStatus.OK]
        if rejected:
            raise StatusError(Code.BAD_REQUEST, rejected[0].reason or "message rejected by the store")
        entries = [SendResultEntry(status=ok(), message_id=each.message_id, offset=result.queue_offset,
                                   transaction_id=result.msg_id if each.transactional else "")
                   for each, result in zip(outgoing, results, strict=True)]
        return SendMessageResponse(status=ok(), entries=entries)

    async def end_transaction(self, request: EndTransactionRequest, call: CallInfo) -> EndTransactionResponse:
        """Raises :class:`NotLeaderError` on a follower (after the checks that need no leader)."""
        try:
            await self._end_transaction(request, call)
        except RequestError as error:
            return EndTransactionResponse(status=StatusError.of(error).status())
        except StatusError as error:
            return EndTransactionResponse(status=error.status())
        return EndTransactionResponse(status=ok())

    async def _end_transaction(self, request: EndTransactionRequest, call: CallInfo) -> None:
        topic = topic_name(request.topic)
        self.authenticator.check(call.metadata, call.peer_host, Access(publish_topics=(topic,)), "EndTransaction")
        if request.resolution == TransactionResolution.TRANSACTION_RESOLUTION_UNSPECIFIED:
            return  # unknown yet: the broker checks back later, as for a 4.x UNKNOWN
        self.require_leader()
        try:
            half = self.broker.store.view_message_by_id(request.transaction_id)
        except (ValueError, StoreError) as exc:
            raise StatusError(Code.INVALID_TRANSACTION_ID, f"no half message for transaction id "
                                                           f"{request.transaction_id[:64]!r}: {exc}") from None
        properties = half.property_map
        if (half.topic != TRANS_HALF_TOPIC or properties.get(PROPERTY_UNIQ_KEY) != request.message_id
                or properties.get(PROPERTY_REAL_TOPIC) != topic):
            raise StatusError(Code.INVALID_TRANSACTION_ID,
                              f"transaction id {request.transaction_id} is not the half message of message "
                              f"{request.message_id[:64]!r} on topic {topic}")
        decision = COMMIT if request.resolution == TransactionResolution.COMMIT else ROLLBACK
        fields = {
            "producerGroup": properties.get(PROPERTY_PRODUCER_GROUP, ""),
            "tranStateTableOffset": str(half.queue_offset),
            "commitLogOffset": str(half.physical_offset),
            "commitOrRollback": str(decision),
            "fromTransactionCheck": str(request.source == TransactionSource.SOURCE_SERVER_CHECK).lower(),
            "msgId": request.message_id,
            "transactionId": request.transaction_id,
        }
        response = await self.transactions.end(make_request(RequestCode.END_TRANSACTION, 0, fields))
        if response.code != 0:
            raise RequestError(response.code, response.remark or "end transaction failed")
