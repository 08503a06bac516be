"""The asyncio core every producer, consumer and admin stands on (Java's ``MQClientInstance`` and
``MQClientAPIImpl``): name-server access, the route cache, one connection per broker address, leader
failover, heartbeats, and the requests brokers send to clients.

Failover (raftmq's contract): a follower answers writes with SERVICE_NOT_AVAILABLE
(14) and names the leader in the extField ``leaderAddress`` when it knows it. :meth:`invoke_leader`
then goes straight to that address and refreshes the routes at once; a connection failure or timeout
marks the address suspect for a few seconds and refreshes the routes too, so a leader change costs
seconds rather than Java's 30-second route refresh period.

Everything here runs on one event loop; nothing is thread-safe. The sync facade (:mod:`client.sync`)
runs that loop in a background thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
import random
import socket
import ssl
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Final

from client.config import ClientConfig
from client.errors import (
    BrokerUnavailableError,
    ClientNotRunningError,
    MessageValidationError,
    MQBrokerError,
    MQClientError,
    NameServerUnavailableError,
    NotLeaderError,
    RequestTimeoutError,
    TopicNotFoundError,
    broker_error,
)
from client.route import TopicRoute, borrowed_route, topic_route_from_data
from protocol.client import ClientLimits, RemotingClient
from protocol.codec import EncodeError
from protocol.codes import RequestCode, ResponseCode
from protocol.command import RemotingCommand, make_response
from protocol.connection import (
    ConnectionClosedError,
    InvalidResponseError,
    RemotingConnectError,
    TooManyPendingRequestsError,
)
from protocol.connection import RequestTimeoutError as RemotingTimeoutError
from protocol.route_data import MASTER_ID, PERM_READ, PERM_WRITE, ClusterInfo, QueueData, TopicRouteData
from protocol.signature import sign_fields

logger = logging.getLogger(__name__)

#: a server-initiated request, with the broker address it came from; None = no answer
ServerRequestHandler = Callable[[str, RemotingCommand], Awaitable[RemotingCommand | None]]
#: what a producer or consumer adds to every heartbeat: (producerDataSet items, consumerDataSet items)
HeartbeatSource = Callable[[], tuple[list[dict[str, object]], list[dict[str, object]]]]

#: redirects to a named leader followed at once, before waiting between attempts
_IMMEDIATE_REDIRECTS_MAX: Final = 3
_instance_counter = itertools.count(1)


def split_address(address: str) -> tuple[str, int]:
    """``"host:port"`` / ``"[v6]:port"`` -> (host, port); ValueError when malformed."""
    host, separator, port = address.rpartition(":")
    if not separator or not host or not port.isdigit():
        raise ValueError(f"not a host:port address: {address!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)


def local_ip_towards(address: str) -> str:
    """The local IPv4 address the kernel would use to reach ``address`` (no packet is sent)."""
    try:
        host, port = split_address(address)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((host, port))
            ip = probe.getsockname()[0]
            return str(ip)
    except (OSError, ValueError):
        return "127.0.0.1"


@dataclass(slots=True)
class _LeaderHint:
    address: str
    expires_at: float


class ClientInstance:
    """Shared machinery of one producer, consumer or admin. ``clock`` (monotonic seconds) and ``rng``
    (backoff jitter) are injected for deterministic tests."""

    def __init__(
        self,
        config: ClientConfig,
        *,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        self.config = config.validate()
        self._clock = clock
        self._rng = rng if rng is not None else random.Random(os.urandom(8))
        self.client_ip = config.client_ip or local_ip_towards(config.namesrv_addresses[0])
        instance = config.instance_name or f"{os.getpid()}#{next(_instance_counter)}#{time.time_ns()}"
        #: Java's ``ip@instanceName``: how brokers tell clients apart (rebalance, locks, check-backs)
        self.client_id = f"{self.client_ip}@{instance}"
        self._limits = ClientLimits(outbound_requests_max=config.outbound_requests_max)
        #: brokers only: name servers speak plain TCP
        self._tls_context = ssl.create_default_context(cafile=config.tls_ca_file) if config.tls else None
        self._routes: dict[str, TopicRoute] = {}
        self._borrowed_routes: dict[str, TopicRoute] = {}
        self._brokers: dict[str, dict[int, str]] = {}
        self._leader_hints: dict[str, _LeaderHint] = {}
        self._suspects: dict[str, float] = {}
        self._connections: dict[str, RemotingClient] = {}
        self._connecting: dict[str, asyncio.Task[RemotingClient]] = {}
        self._handlers: dict[int, ServerRequestHandler] = {}
        self._heartbeat_sources: list[HeartbeatSource] = []
        self._heartbeated_addresses: set[str] = set()
        self._namesrv_index = 0
        self._refresh_task: asyncio.Task[None] | None = None
        self._background: set[asyncio.Task[None]] = set()
        self._service_tasks: list[asyncio.Task[None]] = []
        self._started = False
        self._closed = False

    # ------------------------------------------------------------------------------- life cycle

    @property
    def is_running(self) -> bool:
        return self._started and not self._closed

    def now(self) -> float:
        return self._clock()

    async def start(self) -> None:
        """Start the periodic route refresh and heartbeat; idempotent."""
        if self._closed:
            raise ClientNotRunningError("the client was closed")
        if self._started:
            return
        self._started = True
        loop = asyncio.get_running_loop()
        self._service_tasks = [
            loop.create_task(
                self._every(self.config.route_refresh_interval_seconds, self._refresh_routes_once),
                name="route refresh",
            ),
            loop.create_task(
                self._every(self.config.heartbeat_interval_seconds, self.send_heartbeat_to_all),
                name="heartbeat",
            ),
        ]

    async def close(self) -> None:
        """Stop background work and close every connection; idempotent."""
        if self._closed:
            return
        self._closed = True
        tasks = [*self._service_tasks, *self._background, *self._connecting.values()]
        if self._refresh_task is not None:
            tasks.append(self._refresh_task)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        connections = list(self._connections.values())
        self._connections.clear()
        await asyncio.gather(*(connection.close(1.0) for connection in connections), return_exceptions=True)

    def _check_running(self) -> None:
        if self._closed:
            raise ClientNotRunningError("the client was closed")

    async def _every(self, period_seconds: float, action: Callable[[], Awaitable[object]]) -> None:
        while True:
            await asyncio.sleep(period_seconds)
            try:
                await action()
            except MQClientError as error:
                logger.info("%s failed: %s", getattr(action, "__name__", "periodic task"), error)

    def spawn(self, coroutine: Awaitable[None], name: str) -> asyncio.Task[None]:
        """A background task owned by this instance (cancelled at :meth:`close`)."""

        async def wrapper() -> None:
            await coroutine

        task = asyncio.get_running_loop().create_task(wrapper(), name=name)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    # ------------------------------------------------------------------------------ connections

    def register_request_handler(self, code: int, handler: ServerRequestHandler) -> None:
        """Handle a request brokers send to this client (CHECK_TRANSACTION_STATE, ...)."""
        self._handlers[int(code)] = handler

    async def _connection(self, address: str) -> RemotingClient:
        self._check_running()
        connection = self._connections.get(address)
        if connection is not None and not connection.is_closed:
            return connection
        pending = self._connecting.get(address)
        if pending is None:
            pending = asyncio.get_running_loop().create_task(self._connect(address), name=f"connect {address}")
            self._connecting[address] = pending
            pending.add_done_callback(lambda _: self._connecting.pop(address, None))
        return await asyncio.shield(pending)

    async def _connect(self, address: str) -> RemotingClient:
        try:
            host, port = split_address(address)
        except ValueError as error:
            raise BrokerUnavailableError(str(error), address) from None

        async def handle(request: RemotingCommand) -> RemotingCommand | None:
            return await self._on_server_request(address, request)

        try:
            connection = await RemotingClient.connect(
                host,
                port,
                limits=self._limits,
                request_handler=handle,
                connect_timeout_seconds=self.config.connect_timeout_seconds,
                ssl_context=None if address in self.config.namesrv_addresses else self._tls_context,
            )
        except RemotingConnectError as error:
            raise BrokerUnavailableError(str(error), address) from None
        if self._closed:
            await connection.close(1.0)
            raise ClientNotRunningError("the client was closed")
        self._connections[address] = connection
        if address in self._heartbeated_addresses and self._heartbeat_sources and self.is_running:
            # a reconnection: the broker knows this client's producers and consumers by connection, so it
            # learns the new one now, not at the next periodic heartbeat (a broker's transaction check-back
            # and consumer-change notices would otherwise miss this client for up to an interval)
            self.spawn(self._heartbeat_addresses([address]), f"heartbeat reconnected {address}")
        return connection

    async def _on_server_request(self, address: str, request: RemotingCommand) -> RemotingCommand | None:
        handler = self._handlers.get(request.code)
        if handler is None:
            return make_response(
                request, ResponseCode.REQUEST_CODE_NOT_SUPPORTED, f"client does not handle code {request.code}"
            )
        return await handler(address, request)

    def _drop_connection(self, address: str) -> None:
        connection = self._connections.get(address)
        if connection is not None and connection.is_closed:
            del self._connections[address]

    def _signed(self, ext_fields: Mapping[str, str] | None, body: bytes) -> Mapping[str, str] | None:
        """With ACL credentials, the fields plus AccessKey and Signature (``AclClientRPCHook``), signed
        now, at send time: a retried request is signed again."""
        if self.config.access_key is None or self.config.secret_key is None:
            return ext_fields
        return sign_fields(ext_fields, body, self.config.access_key, self.config.secret_key)

    async def invoke(
        self,
        address: str,
        code: int,
        ext_fields: Mapping[str, str] | None = None,
        body: bytes = b"",
        *,
        timeout_seconds: float | None = None,
    ) -> RemotingCommand:
        """One request to one address; any response code is returned. Transport failures raise
        :class:`BrokerUnavailableError` or :class:`RequestTimeoutError` (and mark the address suspect)."""
        timeout = self.config.request_timeout_seconds if timeout_seconds is None else timeout_seconds
        try:
            connection = await self._connection(address)
        except BrokerUnavailableError:
            self.mark_suspect(address)
            raise
        try:
            return await connection.request(code, self._signed(ext_fields, body), body,
                                            timeout_seconds=max(timeout, 0.001))
        except RemotingTimeoutError as error:
            self.mark_suspect(address)
            raise RequestTimeoutError(str(error), address) from None
        except (ConnectionClosedError, InvalidResponseError) as error:
            self._drop_connection(address)
            self.mark_suspect(address)
            raise BrokerUnavailableError(str(error), address) from None
        except TooManyPendingRequestsError as error:
            raise MQClientError(ResponseCode.SYSTEM_BUSY, str(error)) from None
        except EncodeError as error:
            raise MessageValidationError(f"the request cannot be framed: {error}") from None

    async def oneway(
        self,
        address: str,
        code: int,
        ext_fields: Mapping[str, str] | None = None,
        body: bytes = b"",
        *,
        remark: str | None = None,
    ) -> None:
        connection = await self._connection(address)
        try:
            await connection.oneway(
                code, self._signed(ext_fields, body), body, timeout_seconds=self.config.request_timeout_seconds,
                remark=remark,
            )
        except RemotingTimeoutError as error:
            raise RequestTimeoutError(str(error), address) from None
        except ConnectionClosedError as error:
            self._drop_connection(address)
            raise BrokerUnavailableError(str(error), address) from None

    # ----------------------------------------------------------------------------- name servers

    async def namesrv_request(
        self, code: int, ext_fields: Mapping[str, str] | None = None, body: bytes = b""
    ) -> RemotingCommand:
        """Ask the name servers in turn, starting with the last that answered."""
        addresses = self.config.namesrv_addresses
        errors: list[str] = []
        for attempt in range(len(addresses)):
            index = (self._namesrv_index + attempt) % len(addresses)
            try:
                response = await self.invoke(addresses[index], code, ext_fields, body)
            except (BrokerUnavailableError, RequestTimeoutError) as error:
                errors.append(str(error))
                continue
            self._namesrv_index = index
            return response
        raise NameServerUnavailableError("no name server answered: " + "; ".join(errors))

    async def fetch_route_data(self, topic: str) -> TopicRouteData | None:
        """GET_ROUTEINFO_BY_TOPIC; None when the topic has no route (TOPIC_NOT_EXIST)."""
        response = await self.namesrv_request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})
        if response.code == ResponseCode.TOPIC_NOT_EXIST:
            return None
        if response.code != ResponseCode.SUCCESS:
            raise MQBrokerError(response.code, response.remark or "route query failed", "name server")
        try:
            return TopicRouteData.decode(response.body)
        except ValueError as error:
            raise MQClientError(ResponseCode.SYSTEM_ERROR, f"bad route of {topic!r}: {error}") from None

    async def fetch_cluster_info(self) -> ClusterInfo:
        response = await self.namesrv_request(RequestCode.GET_BROKER_CLUSTER_INFO)
        if response.code != ResponseCode.SUCCESS:
            raise MQBrokerError(response.code, response.remark or "cluster info failed", "name server")
        try:
            return ClusterInfo.decode(response.body)
        except ValueError as error:
            raise MQClientError(ResponseCode.SYSTEM_ERROR, f"bad cluster info: {error}") from None

    # ----------------------------------------------------------------------------------- routes

    async def topic_route(self, topic: str, *, refresh: bool = False) -> TopicRoute:
        """The topic's route, from the cache unless ``refresh``; raises :class:`TopicNotFoundError`."""
        self._check_running()
        route = None if refresh else self._routes.get(topic)
        if route is not None:
            return route
        data = await self.fetch_route_data(topic)
        if data is None:
            self._routes.pop(topic, None)
            raise TopicNotFoundError(topic)
        return self._store_route(topic, data)

    def cached_route(self, topic: str) -> TopicRoute | None:
        return self._routes.get(topic)

    async def publish_route(self, topic: str, *, create_topic_key: str, queue_nums: int) -> TopicRoute:
        """The route a producer sends by. A topic unknown to the name servers borrows the route of
        ``create_topic_key`` (TBW102), or failing that every broker group of the cluster: the broker
        creates the topic on the first send (Java's auto-create path)."""
        route = self._routes.get(topic)
        if route is not None and route.publish_queues:
            return route
        borrowed = self._borrowed_routes.get(topic)
        if borrowed is not None:
            return borrowed
        try:
            route = await self.topic_route(topic, refresh=True)
            if route.publish_queues:
                return route
        except TopicNotFoundError:
            pass
        try:
            template = await self.topic_route(create_topic_key)
        except TopicNotFoundError:
            template = await self._cluster_route(create_topic_key)
        borrowed = borrowed_route(topic, template, queue_nums)
        if not borrowed.publish_queues:
            raise TopicNotFoundError(topic, f"no writable queue for topic {topic!r} and no broker to create it on")
        self._borrowed_routes[topic] = borrowed
        return borrowed

    async def _cluster_route(self, topic: str) -> TopicRoute:
        info = await self.fetch_cluster_info()
        data = TopicRouteData(
            queue_datas=tuple(
                QueueData(name, 1024, 1024, PERM_READ | PERM_WRITE) for name in sorted(info.broker_datas)
            ),
            broker_datas=tuple(info.broker_datas[name] for name in sorted(info.broker_datas)),
        )
        route = topic_route_from_data(topic, data)
        self._remember_brokers(route)
        return route

    def _store_route(self, topic: str, data: TopicRouteData) -> TopicRoute:
        route = topic_route_from_data(topic, data)
        self._routes[topic] = route
        self._borrowed_routes.pop(topic, None)
        self._remember_brokers(route)
        return route

    def _remember_brokers(self, route: TopicRoute) -> None:
        now = self._clock()
        new_addresses: list[str] = []
        for name, addresses in route.broker_addresses.items():
            self._brokers[name] = dict(addresses)
            hint = self._leader_hints.get(name)
            master = addresses.get(MASTER_ID)
            if hint is not None and (master == hint.address or hint.expires_at <= now):
                del self._leader_hints[name]
            new_addresses.extend(a for a in addresses.values() if a not in self._heartbeated_addresses)
        if new_addresses and self._heartbeat_sources and self.is_running:
            self.spawn(self._heartbeat_addresses(new_addresses), "heartbeat new brokers")

    def forget_topic(self, topic: str) -> None:
        self._routes.pop(topic, None)
        self._borrowed_routes.pop(topic, None)

    def request_route_refresh(self) -> asyncio.Task[None]:
        """Refresh every cached route now (one refresh at a time: callers share the running one)."""
        if self._refresh_task is None or self._refresh_task.done():
            self._refresh_task = asyncio.get_running_loop().create_task(
                self._refresh_routes_once(), name="route refresh (on demand)"
            )
        return self._refresh_task

    async def refresh_routes_now(self) -> None:
        with contextlib.suppress(MQClientError):
            await asyncio.shield(self.request_route_refresh())

    async def _refresh_routes_once(self) -> None:
        topics = list(dict.fromkeys([*self._routes, *self._borrowed_routes]))
        for topic in topics:
            try:
                data = await self.fetch_route_data(topic)
            except NameServerUnavailableError:
                raise
            except MQClientError as error:
                logger.info("route refresh of %s failed: %s", topic, error)
                continue
            # a topic the name servers forgot keeps its last known route: a registration lost for a
            # moment should not stop sends that may still succeed through a redirect
            if data is not None:
                self._store_route(topic, data)

    # ---------------------------------------------------------------------- addresses and leaders

    def broker_addresses(self, broker_name: str) -> dict[int, str]:
        return dict(self._brokers.get(broker_name, {}))

    def known_broker_names(self) -> list[str]:
        return sorted(self._brokers)

    def all_broker_addresses(self) -> list[str]:
        return sorted({address for addresses in self._brokers.values() for address in addresses.values()})

    def remember_broker(self, broker_name: str, addresses: Mapping[int, str]) -> None:
        """Addresses learned outside a topic route (cluster info)."""
        self._brokers.setdefault(broker_name, {}).update(addresses)

    def mark_suspect(self, address: str) -> None:
        self._suspects[address] = self._clock() + self.config.suspect_address_seconds
        for name, hint in list(self._leader_hints.items()):
            if hint.address == address:
                del self._leader_hints[name]

    def is_suspect(self, address: str) -> bool:
        until = self._suspects.get(address)
        if until is None:
            return False
        if until <= self._clock():
            del self._suspects[address]
            return False
        return True

    def set_leader_hint(self, broker_name: str, address: str) -> None:
        self._leader_hints[broker_name] = _LeaderHint(
            address, self._clock() + self.config.leader_hint_ttl_seconds
        )

    def leader_address(self, broker_name: str) -> str | None:
        """Where writes of the group go: a fresh leader hint, else the registered master, unless
        suspect. None when neither is usable."""
        hint = self._leader_hints.get(broker_name)
        if hint is not None:
            if hint.expires_at > self._clock() and not self.is_suspect(hint.address):
                return hint.address
            del self._leader_hints[broker_name]
        master = self._brokers.get(broker_name, {}).get(MASTER_ID)
        if master is not None and not self.is_suspect(master):
            return master
        return None

    def candidate_addresses(self, broker_name: str, preferred_id: int = MASTER_ID) -> list[str]:
        """Every address of the group in the order to try: the preferred id (or the leader), the
        others by id, suspects last."""
        addresses = self._brokers.get(broker_name, {})
        ordered: list[str] = []
        leader = self.leader_address(broker_name)
        preferred = addresses.get(preferred_id)
        for address in (
            preferred if preferred_id != MASTER_ID else leader,
            leader,
            *(addresses[each] for each in sorted(addresses)),
        ):
            if address is not None and address not in ordered:
                ordered.append(address)
        return sorted(ordered, key=self.is_suspect)  # stable: suspects move last

    async def _backoff(self, attempt: int, deadline: float) -> None:
        low, high = self.config.failover_backoff_min_seconds, self.config.failover_backoff_max_seconds
        delay = min(high, low * (2 ** min(attempt, 16)))
        delay = delay * self._rng.uniform(0.5, 1.0)
        remaining = deadline - self._clock()
        if remaining > 0:
            await asyncio.sleep(min(delay, remaining))

    async def invoke_leader(
        self,
        broker_name: str,
        code: int,
        ext_fields: Mapping[str, str] | None = None,
        body: bytes = b"",
        *,
        deadline: float,
    ) -> tuple[RemotingCommand, str]:
        """A write to the group's leader, riding out a leader change until ``deadline`` (a
        :meth:`now` value): not-leader answers are followed to the named leader, connection failures
        and timeouts refresh the routes and try again. Returns the first answer that is not
        SERVICE_NOT_AVAILABLE, with the address that gave it; raises the last failure at the deadline.
        """
        last_error: MQClientError | None = None
        attempt = 0
        redirects = 0
        redirect_to: str | None = None
        while True:
            self._check_running()
            remaining = deadline - self._clock()
            if remaining <= 0:
                if last_error is not None:
                    raise last_error
                raise RequestTimeoutError(f"no leader of broker group {broker_name!r} answered in time")
            # a member's redirect is followed even to a suspect address: it is the freshest news
            address = redirect_to or self.leader_address(broker_name)
            redirect_to = None
            if address is None:
                # no usable leader: any member answers with a redirect to the leader it knows
                candidates = self.candidate_addresses(broker_name)
                address = candidates[0] if candidates else None
            if address is None:
                last_error = BrokerUnavailableError(f"no address known for broker group {broker_name!r}")
                await self.refresh_routes_now()
                await self._backoff(attempt, deadline)
                attempt += 1
                continue
            request_timeout = min(self.config.request_timeout_seconds, remaining)
            try:
                response = await self.invoke(address, code, ext_fields, body, timeout_seconds=request_timeout)
            except (BrokerUnavailableError, RequestTimeoutError) as error:
                logger.info("%s: %s; refreshing routes", broker_name, error)
                last_error = error
                self.request_route_refresh()
                await self._backoff(attempt, deadline)
                attempt += 1
                continue
            if response.code != ResponseCode.SERVICE_NOT_AVAILABLE:
                return response, address
            leader = response.ext_fields.get("leaderAddress") or None
            last_error = NotLeaderError(response.remark or "not the leader", address, leader)
            self.request_route_refresh()
            if leader is not None and leader != address and redirects < _IMMEDIATE_REDIRECTS_MAX:
                redirects += 1
                self.set_leader_hint(broker_name, leader)
                redirect_to = leader
                continue
            redirects = 0
            self.mark_suspect(address)
            await self._backoff(attempt, deadline)
            attempt += 1

    async def invoke_any(
        self,
        broker_name: str,
        code: int,
        ext_fields: Mapping[str, str] | None = None,
        body: bytes = b"",
        *,
        preferred_id: int = MASTER_ID,
        timeout_seconds: float | None = None,
    ) -> tuple[RemotingCommand, str]:
        """A read from the group: the preferred member (the leader by default), then the others. A
        member that answers SERVICE_NOT_AVAILABLE or cannot be reached is skipped."""
        self._check_running()
        candidates = self.candidate_addresses(broker_name, preferred_id)
        if not candidates:
            await self.refresh_routes_now()
            candidates = self.candidate_addresses(broker_name, preferred_id)
        if not candidates:
            raise BrokerUnavailableError(f"no address known for broker group {broker_name!r}")
        last_error: MQClientError | None = None
        for address in candidates:
            try:
                response = await self.invoke(address, code, ext_fields, body, timeout_seconds=timeout_seconds)
            except (BrokerUnavailableError, RequestTimeoutError) as error:
                last_error = error
                self.request_route_refresh()
                continue
            if response.code == ResponseCode.SERVICE_NOT_AVAILABLE:
                last_error = broker_error(response.code, response.remark, address, dict(response.ext_fields))
                leader = response.ext_fields.get("leaderAddress")
                if leader:
                    self.set_leader_hint(broker_name, leader)
                continue
            return response, address
        assert last_error is not None
        raise last_error

    # ------------------------------------------------------------------------------- heartbeats

    def add_heartbeat_source(self, source: HeartbeatSource) -> None:
        self._heartbeat_sources.append(source)

    def remove_heartbeat_source(self, source: HeartbeatSource) -> None:
        with contextlib.suppress(ValueError):
            self._heartbeat_sources.remove(source)

    def heartbeat_body(self) -> bytes:
        producers: list[dict[str, object]] = []
        consumers: list[dict[str, object]] = []
        for source in self._heartbeat_sources:
            producer_items, consumer_items = source()
            producers.extend(producer_items)
            consumers.extend(consumer_items)
        return json.dumps(
            {"clientID": self.client_id, "producerDataSet": producers, "consumerDataSet": consumers},
            separators=(",", ":"),
        ).encode("utf-8")

    async def send_heartbeat_to_all(self) -> None:
        """HEART_BEAT to every known broker address (leader and followers); failures are logged."""
        await self._heartbeat_addresses(self.all_broker_addresses())

    async def _heartbeat_addresses(self, addresses: Iterable[str]) -> None:
        if not self._heartbeat_sources:
            return
        body = self.heartbeat_body()

        async def beat(address: str) -> None:
            try:
                response = await self.invoke(address, RequestCode.HEART_BEAT, {}, body)
            except MQClientError as error:
                logger.debug("heartbeat to %s failed: %s", address, error)
                return
            if response.code == ResponseCode.SUCCESS:
                self._heartbeated_addresses.add(address)
            else:
                logger.debug("heartbeat to %s answered %d %s", address, response.code, response.remark)

        await asyncio.gather(*(beat(address) for address in addresses))

    async def unregister_client(self, producer_group: str | None, consumer_group: str | None) -> None:
        """UNREGISTER_CLIENT to every known broker (best effort, at shutdown)."""
        fields = {"clientID": self.client_id}
        if producer_group:
            fields["producerGroup"] = producer_group
        if consumer_group:
            fields["consumerGroup"] = consumer_group

        async def unregister(address: str) -> None:
            with contextlib.suppress(MQClientError):
                await self.invoke(address, RequestCode.UNREGISTER_CLIENT, fields, timeout_seconds=1.0)

        await asyncio.gather(*(unregister(address) for address in self.all_broker_addresses()))


def check_response(response: RemotingCommand, address: str, *accepted: int) -> RemotingCommand:
    """``response`` when its code is SUCCESS (or one of ``accepted``); else the typed broker error."""
    if response.code == ResponseCode.SUCCESS or response.code in accepted:
        return response
    raise broker_error(response.code, response.remark, address, dict(response.ext_fields))


def int_field(response: RemotingCommand, name: str, address: str) -> int:
    """An integer extField of an answer; a missing or malformed one is the broker's protocol error."""
    value = response.ext_fields.get(name)
    try:
        return int(value) if value is not None else _missing(name, address)
    except ValueError:
        raise MQBrokerError(
            ResponseCode.SYSTEM_ERROR, f"answer field {name!r} is not an integer: {value!r}", address
        ) from None


def _missing(name: str, address: str) -> int:
    raise MQBrokerError(ResponseCode.SYSTEM_ERROR, f"answer lacks field {name!r}", address)
