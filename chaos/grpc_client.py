"""A minimal RocketMQ 5.x client for the chaos workload: grpc.aio calls built on our generated stubs
(``broker.v2.protocol``), one channel per member, and the leader found through QueryRoute.

Not the stock SDK (``rocketmq-python-client``, which the interop tests drive in a subprocess of its own venv):
the checker needs every attempt with its own outcome, status code and times, and the SDK retries inside a
send and folds its attempts into one exception; it also cannot share a process with our generated modules
(the same protobuf descriptors), and it learns a new leader only at its 30 s route refresh. This client
speaks the same wire protocol to the same server and does what a careful 5.x client would: it asks any
member's QueryRoute where the leader is (a route names the leader's endpoint, ``broker.v2.service``) and
asks again, of another member, after a call that failed.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, TypeVar

import grpc
import grpc.aio
from google.protobuf.message import Message as ProtobufMessage

from broker.v2.protocol import service_pb2 as pb
from broker.v2.protocol.definition_pb2 import Code, Message, Resource
from broker.v2.server import SERVICE_NAME

#: the client id a chaos run's 5.x clients send (the server keys client settings by it)
CLIENT_ID_PREFIX: Final = "raftmq-chaos"
#: a route's endpoints are "host:port" of the leader's gRPC server
_Response = TypeVar("_Response", bound=ProtobufMessage)


class GrpcUnreachable(Exception):
    """A call that got no answer: the member is down, cut off, or slower than the timeout (the outcome of a write
    is unknown)."""

    def __init__(self, address: str, detail: str) -> None:
        super().__init__(f"{address}: {detail}")
        self.address = address
        self.detail = detail


@dataclass(frozen=True, slots=True)
class Received:
    """What one ReceiveMessage answered: its status and the messages (possibly none)."""

    code: int
    message: str
    messages: tuple[Message, ...]


def _serialize(message: ProtobufMessage) -> bytes:
    return message.SerializeToString()


class GrpcMembers:
    """Channels to the group's members, and which one leads as far as this client knows."""

    def __init__(self, members: Sequence[str], client_id: str, rng: random.Random) -> None:
        if not members:
            raise ValueError("a 5.x client needs at least one member's gRPC address")
        self.members = list(members)
        self.rng = rng
        self.metadata = (("x-mq-client-id", f"{CLIENT_ID_PREFIX}-{client_id}"), ("x-mq-language", "PYTHON"),
                         ("x-mq-protocol", "v2"))
        self._channels: dict[str, grpc.aio.Channel] = {}
        #: the leader's gRPC address as the last route said; None: ask again
        self.leader: str | None = None

    def _channel(self, address: str) -> grpc.aio.Channel:
        channel = self._channels.get(address)
        if channel is None:
            channel = self._channels[address] = grpc.aio.insecure_channel(address)
        return channel

    async def unary(self, address: str, method: str, request: ProtobufMessage, response_type: type[_Response],
                    timeout_seconds: float) -> _Response:
        """One unary call; :class:`GrpcUnreachable` when no answer came."""
        call = self._channel(address).unary_unary(f"/{SERVICE_NAME}/{method}", request_serializer=_serialize,
                                                  response_deserializer=response_type.FromString)
        try:
            response: _Response = await call(request, metadata=self.metadata, timeout=timeout_seconds)
        except grpc.aio.AioRpcError as error:
            raise GrpcUnreachable(address, f"{method}: {error.code().name} {error.details()}") from None
        return response

    async def receive(self, address: str, request: pb.ReceiveMessageRequest, timeout_seconds: float) -> Received:
        """One ReceiveMessage (a stream: a status, the messages, a delivery timestamp)."""
        call = self._channel(address).unary_stream(f"/{SERVICE_NAME}/ReceiveMessage", request_serializer=_serialize,
                                                   response_deserializer=pb.ReceiveMessageResponse.FromString)
        code, text, messages = Code.OK, "", []
        try:
            async for response in call(request, metadata=self.metadata, timeout=timeout_seconds):
                if response.HasField("status"):
                    code, text = response.status.code, response.status.message
                elif response.HasField("message"):
                    messages.append(response.message)
        except grpc.aio.AioRpcError as error:
            raise GrpcUnreachable(address, f"ReceiveMessage: {error.code().name} {error.details()}") from None
        return Received(code, text, tuple(messages))

    async def find_leader(self, topic: str, timeout_seconds: float) -> str | None:
        """The leader's gRPC address as the first member that answers QueryRoute names it (members asked in a
        random order); None when none could say."""
        order = self.members[:]
        self.rng.shuffle(order)
        request = pb.QueryRouteRequest(topic=Resource(name=topic))
        for address in order:
            try:
                route = await self.unary(address, "QueryRoute", request, pb.QueryRouteResponse, timeout_seconds)
            except GrpcUnreachable:
                continue
            if route.status.code != Code.OK or not route.message_queues:
                continue
            endpoint = route.message_queues[0].broker.endpoints.addresses
            if endpoint:
                self.leader = f"{endpoint[0].host}:{endpoint[0].port}"
                return self.leader
        return None

    async def leader_address(self, topic: str, timeout_seconds: float) -> str | None:
        """The leader as last known, else as a route says now."""
        if self.leader is not None:
            return self.leader
        return await self.find_leader(topic, timeout_seconds)

    def forget_leader(self) -> None:
        self.leader = None

    async def close(self) -> None:
        channels, self._channels = self._channels, {}
        await asyncio.gather(*(channel.close() for channel in channels.values()), return_exceptions=True)


__all__ = ["GrpcMembers", "GrpcUnreachable", "Received"]
