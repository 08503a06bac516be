"""The grpc.aio shell around :class:`broker.v2.service.MessagingService`: one server per member on
``[broker] grpc_address``.

- Every RPC of ``apache.rocketmq.v2.MessagingService`` has a handler. Consumption (QueryAssignment,
  ReceiveMessage, AckMessage, ChangeInvisibleDuration, ForwardMessageToDeadLetterQueue) is pop through Raft
  (``broker.v2.consumer``, ``broker.pop``): only the leader pops; a follower forwards acks and changes of
  invisibility like sends, and answers a receive with INTERNAL_SERVER_ERROR (retried by the SDKs).
  The offset RPCs (PullMessage, UpdateOffset, GetOffset, QueryOffset: ``broker.v2.pull``) are served by
  every member from its own store and replicated state, but UpdateOffset, a write, is forwarded to the
  leader like sends. RecallMessage and lite subscriptions answer UNSUPPORTED (a server built without the
  consumption or offset services answers their RPCs NOT_IMPLEMENTED); the gRPC call itself succeeds, as
  the proxy answers. An unexpected exception answers INTERNAL_SERVER_ERROR and is logged; a broken
  invariant stops the member (``on_fatal``), as in the remoting server.
- Writes on a follower (SendMessage, EndTransaction) are forwarded once to the leader's gRPC address with
  the client's own headers (the leader checks them again) and the leader's answer is returned: a 5.x
  producer keeps the route it has (refreshed every 30 s) and never sees a change of leader. A call already
  forwarded (header ``x-raftmq-forwarded``) is not forwarded again, and a follower that knows no leader
  answers INTERNAL_SERVER_ERROR (the code the proxy gives a broker's "not available"), which the SDKs retry.
- Limits: ``grpc_in_flight_requests_max`` calls at once (gRPC refuses more with RESOURCE_EXHAUSTED), a
  request at most the store's body limit plus :data:`REQUEST_HEADROOM_BYTES`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Final, Protocol, TypeVar

import grpc
import grpc.aio

from broker.acl.authorizer import AclRules
from broker.context import BrokerContext
from broker.offsets import OffsetCommitter
from broker.pop import PopService
from broker.pull import PullWaiters
from broker.send import SendProcessor
from broker.transactions import EndTransactionProcessor
from broker.v2.auth import Authenticator
from broker.v2.consumer import ConsumerService
from broker.v2.protocol import service_pb2 as pb
from broker.v2.protocol.definition_pb2 import Broker, Code, Status
from broker.v2.pull import PullService
from broker.v2.service import CallInfo, MessagingService, NotLeaderError, endpoints
from broker.v2.status import StatusError
from broker.v2.telemetry import TelemetrySession
from protocol.invariant import InvariantError

log = logging.getLogger(__name__)

SERVICE_NAME: Final = "apache.rocketmq.v2.MessagingService"
FORWARDED_HEADER: Final = "x-raftmq-forwarded"
#: the longest a forwarded call waits for the leader, whatever the client's deadline
FORWARD_TIMEOUT_SECONDS: Final = 10.0
#: what a request may carry besides one largest body (headers, properties, a batch's framing)
REQUEST_HEADROOM_BYTES: Final = 1 << 20
#: the headers a forwarded call carries on: the client's own (the leader checks the signature again)
FORWARDED_HEADER_PREFIXES: Final = ("x-mq-", "authorization")
HOUSEKEEPING_SECONDS: Final = 10.0


class _Response(Protocol):
    """A generated response message: every one of the service's has a ``status``."""

    @property
    def status(self) -> Status: ...

    def SerializeToString(self) -> bytes: ...


_Request = TypeVar("_Request")
_Reply = TypeVar("_Reply", bound=_Response)
Context = grpc.aio.ServicerContext[Any, Any]


def with_status(response_type: type[_Reply], code: Code, message: str) -> _Reply:
    """An empty response of ``response_type`` carrying only a status."""
    response = response_type()
    response.status.CopyFrom(Status(code=code, message=message))
    return response


def parse_peer(peer: str) -> tuple[str, int]:
    """(host, port) of a grpc peer string (``ipv4:127.0.0.1:5000``, ``ipv6:[::1]:5000``); ("", 0) otherwise."""
    kind, _, rest = peer.partition(":")
    if kind not in ("ipv4", "ipv6"):
        return "", 0
    host, _, port = rest.rpartition(":")
    try:
        return host.strip("[]"), int(port)
    except ValueError:
        return "", 0


def call_info(context: Context) -> CallInfo:
    metadata = {key: value for key, value in (context.invocation_metadata() or ()) if isinstance(value, str)}
    host, port = parse_peer(context.peer())
    return CallInfo(metadata, host, port)


class GrpcServer:
    def __init__(self, service: MessagingService, address: str, in_flight_requests_max: int,
                 request_bytes_max: int, client_expiry_seconds: float,
                 on_fatal: Callable[[BaseException], None] | None = None,
                 consumer: ConsumerService | None = None, puller: PullService | None = None) -> None:
        self.service = service
        #: the consumption RPCs (pop through Raft); None: answered as not served
        self.consumer = consumer
        #: the offset RPCs (PullMessage, UpdateOffset, GetOffset, QueryOffset); None: answered as not served
        self.puller = puller
        self.address = address
        self.in_flight_requests_max = in_flight_requests_max
        self.request_bytes_max = request_bytes_max
        self.client_expiry_seconds = client_expiry_seconds
        self.on_fatal = on_fatal
        self._server: grpc.aio.Server | None = None
        #: leader address -> channel (at most one per member of the group)
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._housekeeping: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------------------------ life cycle

    async def start(self) -> None:
        options = [
            ("grpc.max_receive_message_length", self.request_bytes_max),
            ("grpc.max_send_message_length", self.request_bytes_max),
            ("grpc.so_reuseport", 0),  # a second member on the same port must fail to start, not share it
        ]
        server = grpc.aio.server(options=options, maximum_concurrent_rpcs=self.in_flight_requests_max)
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, self._handlers()),))
        try:
            server.add_insecure_port(self.address)
        except RuntimeError as exc:  # grpc's way of saying the port cannot be bound
            raise OSError(f"cannot serve gRPC on {self.address}: {exc}") from exc
        await server.start()
        self._server = server
        self._housekeeping = asyncio.get_running_loop().create_task(self._expire_clients(), name="grpc-clients")

    async def stop(self, grace_seconds: float = 1.0) -> None:
        if self._housekeeping is not None:
            self._housekeeping.cancel()
            await asyncio.gather(self._housekeeping, return_exceptions=True)
        if self._server is not None:
            await self._server.stop(grace_seconds)
        channels, self._channels = self._channels, {}
        for channel in channels.values():
            await channel.close()

    async def _expire_clients(self) -> None:
        while True:
            await asyncio.sleep(HOUSEKEEPING_SECONDS)
            self.service.clients.expire(self.client_expiry_seconds)

    # ------------------------------------------------------------------------------------ handlers

    def _handlers(self) -> dict[str, grpc.RpcMethodHandler[Any, Any]]:
        service = self.service
        handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {
            "QueryRoute": self._unary(pb.QueryRouteRequest, pb.QueryRouteResponse, service.query_route),
            "Heartbeat": self._unary(pb.HeartbeatRequest, pb.HeartbeatResponse, service.heartbeat),
            "SendMessage": self._unary(pb.SendMessageRequest, pb.SendMessageResponse, service.send_message,
                                       "SendMessage"),
            "EndTransaction": self._unary(pb.EndTransactionRequest, pb.EndTransactionResponse,
                                          service.end_transaction, "EndTransaction"),
            "NotifyClientTermination": self._unary(pb.NotifyClientTerminationRequest,
                                                   pb.NotifyClientTerminationResponse,
                                                   service.notify_client_termination),
            "Telemetry": grpc.stream_stream_rpc_method_handler(
                self._telemetry, request_deserializer=pb.TelemetryCommand.FromString,
                response_serializer=pb.TelemetryCommand.SerializeToString),
        }
        not_yet = "is not served by this broker yet"
        not_served: list[tuple[str, type[Any], type[Any]]] = []
        streams: list[tuple[str, type[Any], type[Any]]] = []
        puller = self.puller
        if puller is None:
            not_served += [
                ("UpdateOffset", pb.UpdateOffsetRequest, pb.UpdateOffsetResponse),
                ("GetOffset", pb.GetOffsetRequest, pb.GetOffsetResponse),
                ("QueryOffset", pb.QueryOffsetRequest, pb.QueryOffsetResponse),
            ]
            streams.append(("PullMessage", pb.PullMessageRequest, pb.PullMessageResponse))
        else:
            handlers["UpdateOffset"] = self._unary(pb.UpdateOffsetRequest, pb.UpdateOffsetResponse,
                                                   self._update_offset, "UpdateOffset")
            handlers["GetOffset"] = self._unary(pb.GetOffsetRequest, pb.GetOffsetResponse, puller.get_offset)
            handlers["QueryOffset"] = self._unary(pb.QueryOffsetRequest, pb.QueryOffsetResponse, puller.query_offset)
            handlers["PullMessage"] = grpc.unary_stream_rpc_method_handler(
                self._pull, request_deserializer=pb.PullMessageRequest.FromString,
                response_serializer=pb.PullMessageResponse.SerializeToString)
        consumer = self.consumer
        if consumer is None:
            not_served += [
                ("QueryAssignment", pb.QueryAssignmentRequest, pb.QueryAssignmentResponse),
                ("AckMessage", pb.AckMessageRequest, pb.AckMessageResponse),
                ("ForwardMessageToDeadLetterQueue", pb.ForwardMessageToDeadLetterQueueRequest,
                 pb.ForwardMessageToDeadLetterQueueResponse),
                ("ChangeInvisibleDuration", pb.ChangeInvisibleDurationRequest, pb.ChangeInvisibleDurationResponse),
            ]
        else:
            handlers["QueryAssignment"] = self._unary(pb.QueryAssignmentRequest, pb.QueryAssignmentResponse,
                                                      self._query_assignment)
            handlers["AckMessage"] = self._unary(pb.AckMessageRequest, pb.AckMessageResponse, self._ack, "AckMessage")
            handlers["ChangeInvisibleDuration"] = self._unary(
                pb.ChangeInvisibleDurationRequest, pb.ChangeInvisibleDurationResponse, self._change_invisible,
                "ChangeInvisibleDuration")
            handlers["ForwardMessageToDeadLetterQueue"] = self._unary(
                pb.ForwardMessageToDeadLetterQueueRequest, pb.ForwardMessageToDeadLetterQueueResponse,
                self._forward_to_dead_letter, "ForwardMessageToDeadLetterQueue")
        for name, request, response in not_served:
            handlers[name] = self._refuse_unary(request, response, Code.NOT_IMPLEMENTED, f"{name} {not_yet}")
        unsupported: tuple[tuple[str, type[Any], type[Any]], ...] = (
            ("RecallMessage", pb.RecallMessageRequest, pb.RecallMessageResponse),
            ("SyncLiteSubscription", pb.SyncLiteSubscriptionRequest, pb.SyncLiteSubscriptionResponse),
        )
        for name, request, response in unsupported:
            handlers[name] = self._refuse_unary(request, response, Code.UNSUPPORTED, f"{name} is not supported")
        if consumer is None:
            streams.append(("ReceiveMessage", pb.ReceiveMessageRequest, pb.ReceiveMessageResponse))
        else:
            handlers["ReceiveMessage"] = grpc.unary_stream_rpc_method_handler(
                self._receive, request_deserializer=pb.ReceiveMessageRequest.FromString,
                response_serializer=pb.ReceiveMessageResponse.SerializeToString)
        for name, request, response in streams:
            handlers[name] = self._refuse_stream(request, response, Code.NOT_IMPLEMENTED, f"{name} {not_yet}")
        return handlers

    def _unary(self, request_type: type[_Request], response_type: type[_Reply],
               handler: Callable[[_Request, CallInfo], Awaitable[_Reply]],
               forwardable: str | None = None) -> grpc.RpcMethodHandler[_Request, _Reply]:
        """A unary RPC; ``forwardable`` (the method's name) when a follower forwards it to the leader."""

        async def behaviour(request: _Request, context: Context) -> _Reply:
            call = call_info(context)
            try:
                return await handler(request, call)
            except NotLeaderError as not_leader:
                if forwardable is None:
                    return with_status(response_type, Code.INTERNAL_SERVER_ERROR, not_leader.message)
                return await self._forward(forwardable, request, response_type, call, context, not_leader)
            except InvariantError as error:
                self._fail(error)
                return with_status(response_type, Code.INTERNAL_SERVER_ERROR, "the broker is stopping")
            except Exception as error:
                log.exception("gRPC %s failed for %s", request_type.__name__, context.peer())
                return with_status(response_type, Code.INTERNAL_SERVER_ERROR, f"{type(error).__name__}: {error}")

        return grpc.unary_unary_rpc_method_handler(
            behaviour, request_deserializer=request_type.FromString,  # type: ignore[attr-defined]
            response_serializer=response_type.SerializeToString)

    @staticmethod
    def _refuse_unary(request_type: type[Any], response_type: type[Any], code: Code,
                      message: str) -> grpc.RpcMethodHandler[Any, Any]:
        async def behaviour(request: object, context: Context) -> object:
            return with_status(response_type, code, message)

        return grpc.unary_unary_rpc_method_handler(behaviour, request_deserializer=request_type.FromString,
                                                   response_serializer=response_type.SerializeToString)

    @staticmethod
    def _refuse_stream(request_type: type[Any], response_type: type[Any], code: Code,
                       message: str) -> grpc.RpcMethodHandler[Any, Any]:
        async def behaviour(request: object, context: Context) -> AsyncIterator[object]:
            yield with_status(response_type, code, message)

        return grpc.unary_stream_rpc_method_handler(behaviour, request_deserializer=request_type.FromString,
                                                    response_serializer=response_type.SerializeToString)

    # ------------------------------------------------------------------------------------ consumption

    def _consumer(self) -> ConsumerService:
        if self.consumer is None:  # pragma: no cover - the handlers exist only with a consumer service
            raise RuntimeError("no consumer service")
        return self.consumer

    async def _query_assignment(self, request: pb.QueryAssignmentRequest, call: CallInfo) -> pb.QueryAssignmentResponse:
        leader = self.service.leader_grpc_address()
        if not leader:
            return with_status(pb.QueryAssignmentResponse, Code.INTERNAL_SERVER_ERROR,
                               "the group has no leader serving 5.x clients now")
        broker = Broker(name=self.service.broker.config.broker_name, id=0, endpoints=endpoints(leader))
        return await self._consumer().query_assignment(request, dict(call.metadata), call.peer_host, broker)

    async def _ack(self, request: pb.AckMessageRequest, call: CallInfo) -> pb.AckMessageResponse:
        self.service.require_leader()  # a follower forwards the call to the leader
        return await self._consumer().ack(request, dict(call.metadata), call.peer_host)

    async def _change_invisible(self, request: pb.ChangeInvisibleDurationRequest,
                                call: CallInfo) -> pb.ChangeInvisibleDurationResponse:
        self.service.require_leader()
        return await self._consumer().change_invisible(request, dict(call.metadata), call.peer_host)

    async def _forward_to_dead_letter(self, request: pb.ForwardMessageToDeadLetterQueueRequest,
                                      call: CallInfo) -> pb.ForwardMessageToDeadLetterQueueResponse:
        self.service.require_leader()
        return await self._consumer().forward_to_dead_letter(request, dict(call.metadata), call.peer_host)

    async def _receive(self, request: pb.ReceiveMessageRequest,
                       context: Context) -> AsyncIterator[pb.ReceiveMessageResponse]:
        """ReceiveMessage: only the leader pops (a follower answers INTERNAL_SERVER_ERROR, which the SDKs retry;
        QueryRoute and QueryAssignment name the leader)."""
        call = call_info(context)
        try:
            self.service.require_leader()
        except NotLeaderError as not_leader:
            yield with_status(pb.ReceiveMessageResponse, Code.INTERNAL_SERVER_ERROR, not_leader.message)
            return
        try:
            async for response in self._consumer().receive(request, dict(call.metadata), call.peer_host,
                                                           context.time_remaining()):
                yield response
        except InvariantError as error:
            self._fail(error)
        except Exception as error:
            log.exception("gRPC ReceiveMessage failed for %s", context.peer())
            yield with_status(pb.ReceiveMessageResponse, Code.INTERNAL_SERVER_ERROR, f"{type(error).__name__}: {error}")

    # ------------------------------------------------------------------------------------ offsets

    def _puller(self) -> PullService:
        if self.puller is None:  # pragma: no cover - the handlers exist only with a pull service
            raise RuntimeError("no pull service")
        return self.puller

    async def _update_offset(self, request: pb.UpdateOffsetRequest, call: CallInfo) -> pb.UpdateOffsetResponse:
        self.service.require_leader()  # a follower forwards the call to the leader
        return await self._puller().update_offset(request, call)

    async def _pull(self, request: pb.PullMessageRequest, context: Context) -> AsyncIterator[pb.PullMessageResponse]:
        """PullMessage, on any member (each serves reads of committed data; a follower never moves a consumer)."""
        call = call_info(context)
        try:
            async for response in self._puller().pull(request, call, context.time_remaining()):
                yield response
        except InvariantError as error:
            self._fail(error)
        except Exception as error:
            log.exception("gRPC PullMessage failed for %s", context.peer())
            yield with_status(pb.PullMessageResponse, Code.INTERNAL_SERVER_ERROR, f"{type(error).__name__}: {error}")

    async def _telemetry(self, commands: AsyncIterator[pb.TelemetryCommand],
                         context: Context) -> AsyncIterator[pb.TelemetryCommand]:
        """A client's Telemetry stream: each Settings it sends is answered with the server's, and the server
        writes its own commands on it (transaction recovery: broker.v2.telemetry) until the client ends it.
        One task reads the client's commands; this generator writes what the session's outbox holds."""
        call = call_info(context)
        try:
            session = self.service.sessions.open(call.client_id)
        except StatusError as error:
            yield pb.TelemetryCommand(status=error.status())
            return
        reader = asyncio.get_running_loop().create_task(self._read_telemetry(commands, context, call, session),
                                                        name="grpc-telemetry-read")
        getter: asyncio.Future[pb.TelemetryCommand] | None = None
        try:
            while not (reader.done() and session.outbox.empty()):
                if not session.outbox.empty():
                    yield session.outbox.get_nowait()
                    continue
                getter = asyncio.ensure_future(session.outbox.get())
                await asyncio.wait((getter, reader), return_when=asyncio.FIRST_COMPLETED)
                if getter.done():
                    yield getter.result()
                else:
                    getter.cancel()
        finally:
            if getter is not None:
                getter.cancel()
            self.service.sessions.close(session)
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)

    async def _read_telemetry(self, commands: AsyncIterator[pb.TelemetryCommand], context: Context, call: CallInfo,
                              session: TelemetrySession) -> None:
        """The client's side of a Telemetry stream: answers go to the session's outbox, waiting for room (a
        client that reads slowly makes its own commands wait). Returns once the client ended the stream."""
        try:
            async for command in commands:
                try:
                    reply = await self.service.telemetry(command, call)
                except InvariantError as error:
                    self._fail(error)
                    return
                except Exception as error:
                    log.exception("gRPC Telemetry failed for %s", context.peer())
                    reply = pb.TelemetryCommand(status=Status(code=Code.INTERNAL_SERVER_ERROR,
                                                              message=f"{type(error).__name__}: {error}"))
                if reply is None:
                    continue
                if command.WhichOneof("command") == "settings" and reply.status.code == Code.OK:
                    session.settings = command.settings  # authorized: its topics may be asked to recover
                await session.outbox.put(reply)
        except grpc.aio.AioRpcError as error:
            log.debug("Telemetry stream of %s ended: %s", call.client_id, error.code())
        finally:
            self.service.sessions.close(session)

    def _fail(self, error: InvariantError) -> None:
        log.critical("gRPC server: broken invariant: %s", error, exc_info=error)
        if self.on_fatal is not None:
            self.on_fatal(error)

    # ------------------------------------------------------------------------------------ forwarding

    async def _forward(self, method: str, request: _Request, response_type: type[_Reply], call: CallInfo,
                       context: Context, not_leader: NotLeaderError) -> _Reply:
        leader = not_leader.leader_address
        if leader is None or leader == self.address or FORWARDED_HEADER in call.metadata:
            return with_status(response_type, Code.INTERNAL_SERVER_ERROR, not_leader.message)
        channel = self._channels.get(leader)
        if channel is None:
            channel = self._channels[leader] = grpc.aio.insecure_channel(leader, options=[
                ("grpc.max_send_message_length", self.request_bytes_max),
                ("grpc.max_receive_message_length", self.request_bytes_max)])
        forward = channel.unary_unary(f"/{SERVICE_NAME}/{method}",
                                      request_serializer=_serialize,
                                      response_deserializer=response_type.FromString)  # type: ignore[attr-defined]
        metadata = [(key, value) for key, value in call.metadata.items() if key.startswith(FORWARDED_HEADER_PREFIXES)]
        metadata.append((FORWARDED_HEADER, self.address))
        remaining = context.time_remaining()
        timeout = FORWARD_TIMEOUT_SECONDS if remaining is None else min(FORWARD_TIMEOUT_SECONDS, remaining)
        try:
            response: _Reply = await forward(request, metadata=metadata, timeout=timeout)
        except grpc.aio.AioRpcError as exc:
            return with_status(response_type, Code.INTERNAL_SERVER_ERROR,
                               f"{not_leader.message}; forwarding to it failed: {exc.code().name} {exc.details()}")
        return response


def _serialize(message: Any) -> bytes:
    data: bytes = message.SerializeToString()
    return data


def grpc_server(broker: BrokerContext, sender: SendProcessor, acl_rules: AclRules | None,
                on_fatal: Callable[[BaseException], None] | None = None,
                pops: PopService | None = None, offsets: OffsetCommitter | None = None,
                waiters: PullWaiters | None = None) -> GrpcServer:
    """The gRPC server of a member, on its ``grpc_address``; ``pops`` serves the consumption RPCs, ``offsets``
    and ``waiters`` (the member's, shared with the 4.x path) the offset RPCs."""
    config = broker.config
    authenticator = Authenticator(acl_rules)
    service = MessagingService(broker, sender, EndTransactionProcessor(broker), authenticator)
    consumer = ConsumerService(pops, authenticator) if pops is not None else None
    puller = (PullService(broker, offsets, waiters, authenticator)
              if offsets is not None and waiters is not None else None)
    return GrpcServer(service, config.grpc_address, config.grpc_in_flight_requests_max,
                      broker.store.config.body_size_max_bytes + REQUEST_HEADROOM_BYTES, config.client_expiry_seconds,
                      on_fatal, consumer, puller)


__all__ = ["GrpcServer", "grpc_server", "parse_peer"]
