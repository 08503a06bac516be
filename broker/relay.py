"""Clients behind a follower: the leader knows them, and reaches them, through the follower's member link.

A front that sends clients to followers (``cluster up --front-route followers``) keeps a client's connection
open while the leader dies: the follower holds the request and answers it, so a stock client never waits out
its send timeout on a connection that was cut. Requests only the leader may serve are forwarded
(broker.forwarding); so are a client's registrations, because the leader decides from them:

- HEART_BEAT and UNREGISTER_CLIENT are served where they arrive *and* forwarded, so the follower knows its
  own clients (pull filters, a later election) and the leader knows them all: one consumer list for
  rebalancing whatever member each consumer reached, producers for transaction check-backs.
  A follower that links to a new leader sends it the last heartbeat of each of its clients at once.
- GET_CONSUMER_LIST_BY_GROUP and the connection lists are answered by the leader (the follower's own
  answer when the leader cannot be reached).

The leader registers such a client under a :class:`RelayedConnection`: what it sends the client
(NOTIFY_CONSUMER_IDS_CHANGED, CHECK_TRANSACTION_STATE, GET_CONSUMER_RUNNING_INFO) goes over the member link
with :data:`RELAY_TO_FIELD` naming the client, and the follower passes it on over the client's own
connection (:class:`ClientRelay`), the answer coming back the same way. When the client's connection to the
follower closes, the follower says so (:data:`CLIENT_GONE`, oneway) and the leader drops the client at
once, as it would on its own connection; when the link closes, every client behind it goes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Final

from broker.remoting.server import Connection, RequestContext
from protocol.codec import EncodeError
from protocol.codes import ResponseCode, SerializeType
from protocol.command import RemotingCommand, make_response
from protocol.connection import ConnectionClosedError, RemotingError

log = logging.getLogger(__name__)

#: the extField naming the client (``host:port`` as the follower sees it) a request of the leader is for
RELAY_TO_FIELD: Final = "raftmqRelayTo"
#: raftmq's oneway request, follower to leader on a member link: the client ``{"client": host:port}`` is gone
CLIENT_GONE: Final = 7103
#: how long the leader waits for a relayed request's answer when its caller gives no timeout
RELAY_TIMEOUT_SECONDS: Final = 10.0


class RelayedConnection:
    """A client behind a follower, as the leader's registrations hold it (:class:`~broker.remoting.server.
    Connection`): requests to it travel over ``link`` (the follower's member link) marked for the client.
    Closed when the link is closed or the follower said the client is gone."""

    def __init__(self, link: Connection, client_address: str, connection_id: int) -> None:
        self.link = link
        self._client_address = client_address
        self._connection_id = connection_id
        self.gone = False

    @property
    def connection_id(self) -> int:
        return self._connection_id

    @property
    def remote_address(self) -> str:
        return self._client_address

    @property
    def remote_host(self) -> str:
        return self._client_address.rpartition(":")[0].strip("[]")

    @property
    def remote_port(self) -> int:
        port = self._client_address.rpartition(":")[2]
        return int(port) if port.isdigit() else 0

    @property
    def is_closed(self) -> bool:
        return self.gone or self.link.is_closed

    def _fields(self, ext_fields: Mapping[str, str] | None) -> dict[str, str]:
        fields = dict(ext_fields or {})
        fields[RELAY_TO_FIELD] = self._client_address
        return fields

    async def send_request(self, code: int, ext_fields: Mapping[str, str] | None = None, body: bytes = b"", *,
                           timeout_seconds: float = RELAY_TIMEOUT_SECONDS, remark: str | None = None,
                           serialize_type: int = SerializeType.JSON) -> RemotingCommand:
        return await self.link.send_request(code, self._fields(ext_fields), body, timeout_seconds=timeout_seconds,
                                            remark=remark, serialize_type=serialize_type)

    async def send_oneway(self, code: int, ext_fields: Mapping[str, str] | None = None, body: bytes = b"", *,
                          timeout_seconds: float = RELAY_TIMEOUT_SECONDS, remark: str | None = None,
                          serialize_type: int = SerializeType.JSON) -> None:
        await self.link.send_oneway(code, self._fields(ext_fields), body, timeout_seconds=timeout_seconds,
                                    remark=remark, serialize_type=serialize_type)

    def close(self) -> None:
        """Only the follower closes its client's connection; the leader forgets it."""
        self.gone = True

    def __repr__(self) -> str:
        return f"RelayedConnection({self._client_address} via {self.link.remote_address})"


class DepartedConnection:
    """Where a client's registrations point once the leader moved its connection to a follower
    (broker.front_moves): closed, so nothing is sent to it and connection lists leave it out, while the group's
    consumer list keeps the client until it heartbeats through its follower or expires."""

    def __init__(self, remote_address: str, connection_id: int) -> None:
        self._remote_address = remote_address
        self._connection_id = connection_id

    @property
    def connection_id(self) -> int:
        return self._connection_id

    @property
    def remote_address(self) -> str:
        return self._remote_address

    @property
    def remote_host(self) -> str:
        return self._remote_address.rpartition(":")[0].strip("[]")

    @property
    def remote_port(self) -> int:
        port = self._remote_address.rpartition(":")[2]
        return int(port) if port.isdigit() else 0

    @property
    def is_closed(self) -> bool:
        return True

    async def send_request(self, code: int, ext_fields: Mapping[str, str] | None = None, body: bytes = b"", *,
                           timeout_seconds: float = RELAY_TIMEOUT_SECONDS, remark: str | None = None,
                           serialize_type: int = SerializeType.JSON) -> RemotingCommand:
        raise ConnectionClosedError(f"{self._remote_address} moved to a follower")

    async def send_oneway(self, code: int, ext_fields: Mapping[str, str] | None = None, body: bytes = b"", *,
                          timeout_seconds: float = RELAY_TIMEOUT_SECONDS, remark: str | None = None,
                          serialize_type: int = SerializeType.JSON) -> None:
        raise ConnectionClosedError(f"{self._remote_address} moved to a follower")

    def close(self) -> None:
        pass


class RelayedClients:
    """The leader's :class:`RelayedConnection` objects, one per (link, client address), so a client's
    registration keeps the same connection from heartbeat to heartbeat (a new one would read as the
    group's membership changing). Negative connection ids: never those of a real connection."""

    def __init__(self) -> None:
        self._by_key: dict[tuple[int, str], RelayedConnection] = {}
        self._next_id = -1

    def __len__(self) -> int:
        return len(self._by_key)

    def connection(self, link: Connection, client_address: str) -> RelayedConnection:
        key = (link.connection_id, client_address)
        relayed = self._by_key.get(key)
        if relayed is None or relayed.is_closed:
            relayed = self._by_key[key] = RelayedConnection(link, client_address, self._next_id)
            self._next_id -= 1
        return relayed

    def client_gone(self, link: Connection, client_address: str) -> RelayedConnection | None:
        relayed = self._by_key.pop((link.connection_id, client_address), None)
        if relayed is not None:
            relayed.close()
        return relayed

    def link_closed(self, link: Connection) -> None:
        for key in [key for key in self._by_key if key[0] == link.connection_id]:
            self._by_key.pop(key).close()


def client_connection(relays: RelayedClients, context: RequestContext) -> Connection:
    """The connection to register a client under: its own, or a relay when a member forwarded its request."""
    if context.forwarded_for:
        return relays.connection(context.connection, context.forwarded_for)
    return context.connection


class ClientGoneProcessor:
    """The leader's side of :data:`CLIENT_GONE`: only from a member link; the client's registrations go
    (``on_gone`` with its relayed connection, as a connection close would)."""

    def __init__(self, relays: RelayedClients, is_member_link: Callable[[Connection], bool],
                 on_gone: Callable[[Connection], None]) -> None:
        self._relays = relays
        self._is_member_link = is_member_link
        self._on_gone = on_gone

    async def __call__(self, context: RequestContext) -> RemotingCommand | None:
        request = context.request
        if not self._is_member_link(context.connection):
            return None if request.is_oneway else make_response(request, ResponseCode.NO_PERMISSION,
                                                                "not a member link")
        relayed = self._relays.client_gone(context.connection, request.ext_fields.get("client", ""))
        if relayed is not None:
            self._on_gone(relayed)
        return None if request.is_oneway else make_response(request, ResponseCode.SUCCESS)


class ClientRelay:
    """The follower's side: a request the leader sent over the member link for one of this member's clients
    (:data:`RELAY_TO_FIELD`) goes on over that client's connection, and its answer comes back (nothing for
    a oneway request). ``find_client`` names the open client connection of an address, or None."""

    def __init__(self, find_client: Callable[[str], Connection | None]) -> None:
        self._find_client = find_client

    async def __call__(self, request: RemotingCommand) -> RemotingCommand | None:
        fields = dict(request.ext_fields)
        address = fields.pop(RELAY_TO_FIELD, "")
        client = self._find_client(address) if address else None
        if client is None:
            return None if request.is_oneway else make_response(
                request, ResponseCode.SYSTEM_ERROR, f"no client {address or '(none named)'} connected here")
        try:
            if request.is_oneway:
                await client.send_oneway(request.code, fields, request.body, remark=request.remark)
                return None
            answer = await client.send_request(request.code, fields, request.body, remark=request.remark,
                                               timeout_seconds=RELAY_TIMEOUT_SECONDS)
        except (RemotingError, OSError, EncodeError) as error:
            log.debug("cannot relay %s to %s: %s", request.code, address, error)
            return None if request.is_oneway else make_response(
                request, ResponseCode.SYSTEM_ERROR, f"relaying to client {address} failed: {error}")
        return make_response(request, answer.code, answer.remark, answer.ext_fields, answer.body)


__all__ = [
    "CLIENT_GONE",
    "RELAY_TO_FIELD",
    "ClientGoneProcessor",
    "ClientRelay",
    "DepartedConnection",
    "RelayedClients",
    "RelayedConnection",
    "client_connection",
]
