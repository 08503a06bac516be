"""Any member accepts the group's client traffic: a follower forwards what only the leader may serve.

Stock clients send only to the address registered as brokerId 0 and re-read routes every 30 s, so the group
puts one address in front of all its members (a load balancer, ``[broker] front_address``). Whatever member
that address reaches, a request only the leader may serve (:data:`LEADER_ONLY_CODES`: sends of every kind,
send-back, END_TRANSACTION, consumer-offset updates, queue locks, topic, subscription group and offset administration) is
forwarded by a follower to the current leader, and the leader's answer goes back to the client under the
client's opaque. Reads of committed data and client bookkeeping are served where they arrive.

The forwarded frame is the client's request as received (code, flag, language, version, remark, every
extField, body, header form), plus :data:`~broker.remoting.server.FORWARDED_FOR_FIELD` naming the client's
``host:port``. The leader's server strips that field from every request before anything else sees it and
believes it only on a *member link*: a connection that proved knowledge of the group's secret
(``[node] secret``) in an HMAC-SHA256 challenge-response over nonces from both sides (the same scheme as
the Raft and catch-up links). So the client's ACL signature stays valid and the leader checks it itself,
the message's born host is the client's (stored bytes are those of a direct send: the store host is the
group's ``store_host`` either way), a client cannot pass itself off as forwarded, and a forwarded request
is never forwarded again (a leader that stepped down answers it as it would the client).

With TLS on the remoting port (``[broker] tls_cert_file``), the link speaks TLS too, trusting the member's
own certificate (a group's members share one, or the link cannot be made and the follower answers as before);
host names are not checked, the handshake over the group's secret authenticates the peer.

One long-lived link per leader, at most ``forward_in_flight_max`` forwards at once (more are answered
SYSTEM_BUSY), each bounded by ``forward_timeout_seconds``. No known leader, or a leader that cannot be
reached or does not answer in time: the answer a follower gave before forwarding existed (SERVICE_NOT_AVAILABLE
naming the leader when known); a forward that timed out may have been served, and the client's retry
carries the same UNIQ_KEY (deduplicated).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import hashlib
import hmac
import logging
import secrets
import ssl
from collections.abc import Callable, Coroutine
from typing import Final

from broker.context import BrokerContext
from broker.relay import CLIENT_GONE
from broker.remoting.server import (
    FORWARDED_FOR_FIELD,
    Connection,
    FastPath,
    Finish,
    Processor,
    RequestContext,
)
from dledger.config import parse_address
from protocol.client import RemotingClient
from protocol.codes import RequestCode, ResponseCode
from protocol.command import RemotingCommand, make_response
from protocol.connection import (
    RemotingError,
    RequestHandler,
    RequestTimeoutError,
    TooManyPendingRequestsError,
)

log = logging.getLogger(__name__)

#: requests only the leader may serve: a follower forwards them (see the module docstring)
LEADER_ONLY_CODES: Final = frozenset({
    RequestCode.SEND_MESSAGE, RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE,
    RequestCode.CONSUMER_SEND_MSG_BACK, RequestCode.END_TRANSACTION, RequestCode.UPDATE_CONSUMER_OFFSET,
    RequestCode.LOCK_BATCH_MQ, RequestCode.UNLOCK_BATCH_MQ, RequestCode.UPDATE_AND_CREATE_TOPIC,
    RequestCode.DELETE_TOPIC_IN_BROKER, RequestCode.INVOKE_BROKER_TO_RESET_OFFSET,
    RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, RequestCode.DELETE_SUBSCRIPTIONGROUP,
})
#: raftmq's own request codes of the member-link handshake (not RocketMQ's: no stock client sends them)
MEMBER_LINK_HELLO: Final = 7101
MEMBER_LINK_PROVE: Final = 7102
MEMBER_LINK_CODES: Final = (MEMBER_LINK_HELLO, MEMBER_LINK_PROVE)
NONCE_BYTES: Final = 16
_SERVER_LABEL: Final = b"raftmq-member-link-server"
_CLIENT_LABEL: Final = b"raftmq-member-link-client"
#: the longest the handshake of a new link may take
HANDSHAKE_TIMEOUT_SECONDS: Final = 3.0


def link_proof(secret: bytes, label: bytes, member: str, first: bytes, second: bytes) -> bytes:
    """HMAC-SHA256 of the label, the member's id and both nonces (in the order of the side proving)."""
    return hmac.new(secret, label + member.encode() + b"\x00" + first + second, hashlib.sha256).digest()


class ForwardingError(Exception):
    """A forward that could not be made (no link, refused handshake, no answer in time)."""


@dataclasses.dataclass(frozen=True, slots=True)
class NotForwarded:
    """A request that could not be forwarded, and the answer a follower gives the client instead;
    ``retry``: it did not reach a leader (none known, no link, the link broke), so trying again once a
    leader is known is safe (a send that did reach the old leader carries its UNIQ_KEY: deduplicated)."""

    refusal: RemotingCommand
    retry: bool = False


# ---------------------------------------------------------------------------------------- leader side


class MemberLinks:
    """The server side of the member-link handshake, and which connections completed it.

    HELLO ``{member, nonce}`` is answered with ``{nonce, proof}`` (this side's nonce and its proof of the
    secret); PROVE ``{proof}`` marks the connection a member link when the proof over both nonces is right.
    One challenge per connection at most (a new HELLO replaces it), so pending challenges are bounded by
    the server's ``connections_max``; both go when the connection closes (:meth:`connection_closed`)."""

    def __init__(self, secret: bytes, random_bytes: Callable[[int], bytes] = secrets.token_bytes) -> None:
        self._secret = secret
        self._random_bytes = random_bytes
        #: connection id -> (member, the client's nonce, our nonce)
        self._challenges: dict[int, tuple[str, bytes, bytes]] = {}
        self._trusted: set[int] = set()

    def is_member_link(self, connection: Connection) -> bool:
        return connection.connection_id in self._trusted

    def connection_closed(self, connection: Connection) -> None:
        self._challenges.pop(connection.connection_id, None)
        self._trusted.discard(connection.connection_id)

    async def __call__(self, context: RequestContext) -> RemotingCommand:
        request, connection = context.request, context.connection
        fields = request.ext_fields
        if request.code == MEMBER_LINK_HELLO:
            member = fields.get("member", "")
            try:
                client_nonce = bytes.fromhex(fields.get("nonce", ""))
            except ValueError:
                client_nonce = b""
            if not member or len(member) > 64 or len(client_nonce) != NONCE_BYTES:
                return make_response(request, ResponseCode.SYSTEM_ERROR, "member link: bad hello")
            server_nonce = self._random_bytes(NONCE_BYTES)
            self._challenges[connection.connection_id] = (member, client_nonce, server_nonce)
            proof = link_proof(self._secret, _SERVER_LABEL, member, client_nonce, server_nonce)
            return make_response(request, ResponseCode.SUCCESS, None,
                                 {"nonce": server_nonce.hex(), "proof": proof.hex()})
        challenge = self._challenges.pop(connection.connection_id, None)
        try:
            proof = bytes.fromhex(fields.get("proof", ""))
        except ValueError:
            proof = b""
        if challenge is None or not hmac.compare_digest(
                proof, link_proof(self._secret, _CLIENT_LABEL, challenge[0], challenge[2], challenge[1])):
            log.warning("member link from %s refused: bad proof", connection.remote_address)
            return make_response(request, ResponseCode.NO_PERMISSION, "member link: proof refused")
        self._trusted.add(connection.connection_id)
        log.info("member link from %s (%s) authenticated", challenge[0], connection.remote_address)
        return make_response(request, ResponseCode.SUCCESS)


# -------------------------------------------------------------------------------------- follower side


@dataclasses.dataclass(frozen=True, slots=True)
class ForwardLimits:
    """``in_flight_max`` forwards at once; each answered within ``timeout_seconds``; a link connects within
    ``connect_timeout_seconds``, and after a link to an address failed, forwards to it fail at once for
    ``reconnect_after_seconds`` (a dead leader still named by Raft must not hold every forward for a connect
    timeout, one after the other)."""

    in_flight_max: int = 1024
    timeout_seconds: float = 3.0
    connect_timeout_seconds: float = 1.0
    reconnect_after_seconds: float = 0.2
    #: how long a request that found no leader to forward to is held for one (an election), checked every
    #: ``hold_poll_seconds``; 0: answered at once
    hold_seconds: float = 2.0
    hold_poll_seconds: float = 0.02


class Forwarder:
    """A follower's link to the leader: forwards a request and relays the answer (module docstring)."""

    def __init__(self, broker: BrokerContext, secret: bytes, limits: ForwardLimits | None = None,
                 ssl_context: ssl.SSLContext | None = None, relay_handler: RequestHandler | None = None) -> None:
        self._broker = broker
        self._ssl_context = ssl_context
        self._secret = secret
        self._member = broker.node.id
        self._limits = limits or ForwardLimits()
        self._client: RemotingClient | None = None
        self._client_address = ""
        self._link_lock = asyncio.Lock()
        self._in_flight = 0
        #: (address, loop time) of the last link that could not be made
        self._failed_link: tuple[str, float] = ("", 0.0)
        #: requests the leader sends over the link for this member's clients (broker.relay.ClientRelay)
        self._relay_handler = relay_handler
        #: connection id -> (connection, its client's last heartbeat served here)
        self._heartbeats: dict[int, tuple[Connection, RemotingCommand]] = {}
        self._background: set[asyncio.Task[None]] = set()

    @property
    def in_flight(self) -> int:
        return self._in_flight

    @property
    def limits(self) -> ForwardLimits:
        return self._limits

    async def forward(self, context: RequestContext) -> RemotingCommand | None:
        """The leader's answer to the client's request, or this member's refusal when it cannot be had."""
        answer = await self.try_forward(context)
        return answer if isinstance(answer, RemotingCommand) or answer is None else answer.refusal

    async def try_forward(self, context: RequestContext) -> RemotingCommand | NotForwarded | None:
        """The leader's answer (None for a oneway request), or :class:`NotForwarded` with the refusal to give
        when there is no leader, no link to it, or no answer in time."""
        request = context.request
        if self._in_flight >= self._limits.in_flight_max:
            return NotForwarded(make_response(
                request, ResponseCode.SYSTEM_BUSY,
                f"[OVERLOAD] {self._limits.in_flight_max} requests are being forwarded to the leader, retry later"))
        broker = self._broker
        leader = broker.leader_address()
        if leader is None or leader == broker.config.announced_address:
            return NotForwarded(self._not_leader(request, None), retry=True)
        self._in_flight += 1
        try:
            client = await self._link(leader)
            answer = await client.relay(dataclasses.replace(request, ext_fields=_forwarded_fields(context)),
                                        timeout_seconds=self._limits.timeout_seconds)
        except (RemotingError, ForwardingError, OSError) as error:
            return self._not_forwarded(request, leader, error)
        finally:
            self._in_flight -= 1
        return None if answer is None else dataclasses.replace(answer, opaque=request.opaque)

    def can_forward_now(self) -> bool:
        """Whether :meth:`forward_now` may take a request: the link to the leader this member knows is up,
        and the limit of forwards in flight is not reached."""
        client = self._client
        if client is None or client.is_closed or self._in_flight >= self._limits.in_flight_max:
            return False
        leader = self._broker.leader_address()
        return leader is not None and leader == self._client_address

    def forward_now(self, context: RequestContext,
                    then: Callable[[RemotingCommand | NotForwarded | Exception], None]) -> bool:
        """:meth:`try_forward` without a coroutine, for a request that gets an answer, on the link that is
        up (:meth:`can_forward_now`): sent now, then ``then`` gets the leader's answer (under the leader
        link's opaque: the client's connection answers under the client's), the :class:`NotForwarded`
        :meth:`try_forward` would give, or an unexpected error. False, with nothing sent and ``then`` never
        called, when it cannot go at once: :meth:`try_forward` takes it then."""
        if not self.can_forward_now():
            return False
        client, leader = self._client, self._client_address
        assert client is not None
        request = context.request

        def relayed(answer: RemotingCommand | None, error: BaseException | None) -> None:
            self._in_flight -= 1
            if error is None:
                assert answer is not None  # relay_now takes only requests that get an answer
                then(answer)
            elif isinstance(error, (RemotingError, ForwardingError, OSError)):
                then(self._not_forwarded(request, leader, error))
            elif isinstance(error, Exception):
                then(error)
            else:
                raise error

        self._in_flight += 1
        try:
            if client.relay_now(request, _forwarded_fields(context), self._limits.timeout_seconds, relayed):
                return True
        except BaseException:
            self._in_flight -= 1
            raise
        self._in_flight -= 1
        return False

    def _not_forwarded(self, request: RemotingCommand, leader: str, error: Exception) -> NotForwarded:
        """The refusal for a forward that failed with ``error``: a request's own trouble (no answer in time,
        too many waiting) leaves the link to the others; a broken link is dropped, and the forward may be
        tried again (on a new link, or here if this member was elected meanwhile)."""
        if isinstance(error, (RequestTimeoutError, TooManyPendingRequestsError)):
            return NotForwarded(self._not_leader(request, f"forwarding to it failed: {error}"))
        log.info("cannot forward %s to the leader %s: %s", request.code, leader, error)
        self._drop_link(leader)
        return NotForwarded(self._not_leader(request, f"forwarding to it failed: {error}"), retry=True)

    # ------------------------------------------------------------------ this member's clients (broker.relay)

    def heartbeat_served(self, connection: Connection, request: RemotingCommand) -> None:
        """A client's heartbeat served here: sent again to each new leader this member links to."""
        self._heartbeats[connection.connection_id] = (connection, request)

    def client_unregistered(self, connection: Connection) -> None:
        self._heartbeats.pop(connection.connection_id, None)

    def connection_closed(self, connection: Connection) -> None:
        """A connection of this member closed: if the leader knows its client through this member, it hears
        at once that the client is gone (oneway, on the link as it is: none is made for it)."""
        if self._heartbeats.pop(connection.connection_id, None) is None:
            return
        client = self._client
        if client is None or client.is_closed:
            return
        self._spawn(self._oneway(client, CLIENT_GONE, {"client": connection.remote_address}))

    async def _replay_heartbeats(self, client: RemotingClient) -> None:
        for connection, request in list(self._heartbeats.values()):
            if connection.is_closed or client.is_closed:
                continue
            fields = dict(request.ext_fields)
            fields[FORWARDED_FOR_FIELD] = connection.remote_address
            with contextlib.suppress(RemotingError, OSError):
                await client.relay(dataclasses.replace(request, ext_fields=fields),
                                   timeout_seconds=self._limits.timeout_seconds)

    @staticmethod
    async def _oneway(client: RemotingClient, code: int, fields: dict[str, str]) -> None:
        with contextlib.suppress(RemotingError, OSError):
            await client.oneway(code, fields, timeout_seconds=1.0)

    def _spawn(self, coroutine: Coroutine[object, object, None]) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _not_leader(self, request: RemotingCommand, detail: str | None) -> RemotingCommand:
        error = self._broker.not_leader()
        remark = error.remark if detail is None else f"{error.remark}; {detail}"
        return make_response(request, error.code, remark, error.ext_fields)

    async def _link(self, address: str) -> RemotingClient:
        client = self._client
        if client is not None and not client.is_closed and self._client_address == address:
            return client
        async with self._link_lock:
            client = self._client
            if client is not None and not client.is_closed and self._client_address == address:
                return client
            self._drop_link(self._client_address)
            loop = asyncio.get_running_loop()
            failed_address, failed_at = self._failed_link
            if failed_address == address and loop.time() - failed_at < self._limits.reconnect_after_seconds:
                raise ForwardingError("no link to it (the last attempt failed a moment ago)")
            try:
                host, port = parse_address(address, "leader address")
                client = await RemotingClient.connect(host, port, ssl_context=self._ssl_context,
                                                      connect_timeout_seconds=self._limits.connect_timeout_seconds,
                                                      request_handler=self._relay_handler)
            except (RemotingError, OSError, ValueError) as error:
                self._failed_link = (address, loop.time())
                raise ForwardingError(str(error)) from None
            try:
                await self._handshake(client)
            except BaseException:
                self._failed_link = (address, loop.time())
                await client.close(timeout_seconds=1.0)
                raise
            self._client, self._client_address = client, address
            log.info("member link to the leader at %s established", address)
            if self._heartbeats:  # the new leader learns this member's clients now, not at their next heartbeat
                self._spawn(self._replay_heartbeats(client))
            return client

    async def _handshake(self, client: RemotingClient) -> None:
        client_nonce = secrets.token_bytes(NONCE_BYTES)
        hello = await client.request(MEMBER_LINK_HELLO, {"member": self._member, "nonce": client_nonce.hex()},
                                     timeout_seconds=HANDSHAKE_TIMEOUT_SECONDS)
        if hello.code != ResponseCode.SUCCESS:
            raise ForwardingError(f"member link refused: {hello.remark}")
        try:
            server_nonce = bytes.fromhex(hello.ext_fields.get("nonce", ""))
            server_proof = bytes.fromhex(hello.ext_fields.get("proof", ""))
        except ValueError:
            raise ForwardingError("member link: unreadable hello answer") from None
        expected = link_proof(self._secret, _SERVER_LABEL, self._member, client_nonce, server_nonce)
        if len(server_nonce) != NONCE_BYTES or not hmac.compare_digest(server_proof, expected):
            raise ForwardingError("member link: the peer does not hold the group's secret")
        proof = link_proof(self._secret, _CLIENT_LABEL, self._member, server_nonce, client_nonce)
        proved = await client.request(MEMBER_LINK_PROVE, {"proof": proof.hex()},
                                      timeout_seconds=HANDSHAKE_TIMEOUT_SECONDS)
        if proved.code != ResponseCode.SUCCESS:
            raise ForwardingError(f"member link refused: {proved.remark}")

    def _drop_link(self, address: str) -> None:
        client = self._client
        if client is None or self._client_address != address:
            return
        self._client, self._client_address = None, ""
        if not client.is_closed:
            asyncio.get_running_loop().create_task(client.close(timeout_seconds=1.0))

    async def close(self) -> None:
        for task in list(self._background):
            task.cancel()
        client, self._client = self._client, None
        if client is not None:
            with contextlib.suppress(RemotingError, OSError):
                await client.close(timeout_seconds=1.0)


def member_link_tls(certificate_file: str) -> ssl.SSLContext:
    """The client side of a member link to a TLS remoting port: trusts the member's own certificate."""
    context = ssl.create_default_context(cafile=certificate_file)
    context.check_hostname = False
    return context


def _forwarded_fields(context: RequestContext) -> dict[str, str]:
    """The request's extFields with :data:`FORWARDED_FOR_FIELD` naming its client."""
    fields = dict(context.request.ext_fields)
    fields[FORWARDED_FOR_FIELD] = context.remote_address
    return fields


class LeaderOnly:
    """Wraps a processor: a request of ``codes`` that reaches a follower from a client is forwarded to the
    leader; everything else (and everything on the leader) goes to the processor. On the leader the cost is
    a set lookup and one attribute read."""

    def __init__(self, processor: Processor, broker: BrokerContext, forwarder: Forwarder,
                 codes: frozenset[int] = LEADER_ONLY_CODES) -> None:
        self._processor = processor
        self._member = broker.member
        self._forwarder = forwarder
        self._codes = codes
        #: forwards that went the queued way after a fast start (held through an election), until answered
        self._later: set[asyncio.Task[RemotingCommand | None]] = set()

    async def __call__(self, context: RequestContext) -> RemotingCommand | None:
        if context.request.code in self._codes and not context.forwarded_for and not self._member.is_leader:
            return await self._forward(context)
        return await self._processor(context)

    def fast(self, inner: FastPath | None = None) -> FastPath:
        """The route's synchronous way in (:data:`~broker.remoting.server.FastPath`): on the leader, and for
        what is not forwarded, ``inner`` (the processor's own, if any); on a follower, a client's request
        is forwarded at once on the link that is up, with no queue, worker task or coroutine per request,
        and answered when the leader's answer comes. What cannot go at once (no link yet, no leader known,
        the limit of forwards reached, a oneway request) is declined and takes the queued way, which makes
        the link and holds a request through an election; so does a forward whose link broke."""

        def fast(context: RequestContext) -> RemotingCommand | Callable[[Finish], None] | None:
            request = context.request
            if request.code not in self._codes or context.forwarded_for or self._member.is_leader:
                return None if inner is None else inner(context)
            if request.is_oneway or not self._forwarder.can_forward_now():
                return None
            return functools.partial(self._forward_now, context)

        return fast

    def _forward_now(self, context: RequestContext, finish: Finish) -> None:
        def then(answer: RemotingCommand | NotForwarded | Exception) -> None:
            if isinstance(answer, NotForwarded):
                if answer.retry:  # the link broke: held and tried again as a queued request would be
                    self._finish_later(self._forward(context), finish)
                else:
                    finish(answer.refusal)
            else:
                finish(answer)

        if not self._forwarder.forward_now(context, then):
            self._finish_later(self._forward(context), finish)

    def _finish_later(self, work: Coroutine[object, object, RemotingCommand | None], finish: Finish) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._later.add(task)

        def done(finished: asyncio.Task[RemotingCommand | None]) -> None:
            self._later.discard(finished)
            if finished.cancelled():
                finish(None)
                return
            error = finished.exception()
            finish(finished.result() if error is None else error if isinstance(error, Exception) else None)

        task.add_done_callback(done)

    async def _forward(self, context: RequestContext) -> RemotingCommand | None:
        """Forwarded; while there is no leader to forward to (an election), held for one up to the limits'
        ``hold_seconds`` and then forwarded, or served here if this member was elected: the client's
        connection stays open and its request is answered, instead of an error it must retry."""
        limits = self._forwarder.limits
        loop = asyncio.get_running_loop()
        hold_until = loop.time() + limits.hold_seconds
        while True:
            answer = await self._forwarder.try_forward(context)
            if not isinstance(answer, NotForwarded):
                return answer
            if not answer.retry or loop.time() >= hold_until:
                return answer.refusal
            await asyncio.sleep(limits.hold_poll_seconds)
            if self._member.is_leader:
                return await self._processor(context)


#: a client's registrations: served where they arrive and forwarded to the leader (broker.relay)
REGISTRATION_CODES: Final = frozenset({RequestCode.HEART_BEAT, RequestCode.UNREGISTER_CLIENT})
#: questions about the group's clients: the leader's answer, this member's when the leader cannot be asked
CLIENT_QUERY_CODES: Final = frozenset({
    RequestCode.GET_CONSUMER_LIST_BY_GROUP, RequestCode.GET_CONSUMER_CONNECTION_LIST,
    RequestCode.GET_PRODUCER_CONNECTION_LIST,
})


class ClientsAtTheLeader:
    """Wraps the client processor of a follower so the leader knows every client of the group, whatever
    member it reached (broker.relay): a registration is served here and forwarded (the client gets this
    member's answer, so a heartbeat succeeds during an election); a question about the group's clients gets
    the leader's answer (this member's when the leader cannot be asked). On the leader, and for requests a
    member forwarded, the processor alone."""

    def __init__(self, processor: Processor, broker: BrokerContext, forwarder: Forwarder) -> None:
        self._processor = processor
        self._member = broker.member
        self._forwarder = forwarder

    async def __call__(self, context: RequestContext) -> RemotingCommand | None:
        code = context.request.code
        if context.forwarded_for or self._member.is_leader:
            return await self._processor(context)
        if code in CLIENT_QUERY_CODES:
            answer = await self._forwarder.try_forward(context)
            return await self._processor(context) if isinstance(answer, NotForwarded) else answer
        if code not in REGISTRATION_CODES:
            return await self._processor(context)
        local = await self._processor(context)
        if local is None or local.code != ResponseCode.SUCCESS:
            return local
        if code == RequestCode.HEART_BEAT:
            self._forwarder.heartbeat_served(context.connection, context.request)
        else:
            self._forwarder.client_unregistered(context.connection)
        await self._forwarder.try_forward(context)
        return local


__all__ = [
    "CLIENT_QUERY_CODES",
    "LEADER_ONLY_CODES",
    "MEMBER_LINK_CODES",
    "MEMBER_LINK_HELLO",
    "MEMBER_LINK_PROVE",
    "REGISTRATION_CODES",
    "ClientsAtTheLeader",
    "ForwardLimits",
    "Forwarder",
    "ForwardingError",
    "LeaderOnly",
    "MemberLinks",
    "NotForwarded",
    "link_proof",
    "member_link_tls",
]
