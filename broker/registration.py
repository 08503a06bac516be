"""Registration with the name servers: the leader as brokerId 0 with the group's topics, followers under
their own ids, under the address clients are to use (``advertised_address``, else the listen address).
Repeated every ``register_interval_seconds`` and at once on every role or topic change, so
clients see a new leader on their next route refresh (stock clients refresh routes only now and then, so the
server side keeps that window short).

Each name server gets one long-lived connection: a name server forgets a broker whose connection closes.

With a front (``[broker] front_address``: a load balancer in front of every member), the leader registers
the front, not itself, as brokerId 0, marked shared: the name server keeps a shared address when the
connection it came over closes (the leader died; the front still reaches the group, and the next leader
registers it again at once), and the leader does not unregister it when it stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from broker.config import BrokerConfig
from broker.namesrv.headers import RegisterBrokerRequestHeader
from dledger.config import parse_address
from protocol.client import RemotingClient
from protocol.codes import RequestCode, ResponseCode
from protocol.connection import RemotingError
from protocol.route_data import DataVersion, RegisterBrokerBody, java_crc32
from protocol.route_data import TopicConfig as RouteTopicConfig

log = logging.getLogger(__name__)

REQUEST_TIMEOUT_SECONDS = 3.0

#: (is leader, topic configurations, data version counter, Raft term)
Snapshot = Callable[[], tuple[bool, list[RouteTopicConfig], int, int]]


class Registrar:
    def __init__(self, config: BrokerConfig, snapshot: Snapshot) -> None:
        self.config = config
        self.snapshot = snapshot
        self._clients: dict[str, RemotingClient] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        #: (is leader) of the last registration every name server accepted
        self.registered_as_leader: bool | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="namesrv-registration")

    def trigger(self) -> None:
        """Register again now (a role or topic change)."""
        self._wake.set()

    async def stop(self) -> None:
        self._stopping = True
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self._unregister()
        for client in self._clients.values():
            await client.close()
        self._clients.clear()

    async def _run(self) -> None:
        while True:
            self._wake.clear()
            await self.register_all()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.config.register_interval_seconds)

    async def register_all(self) -> None:
        is_leader, topics, counter, term = self.snapshot()
        body = RegisterBrokerBody(topic_configs=tuple(topics), data_version=DataVersion(0, counter)).encode()
        address = self.registered_address(is_leader)
        header = RegisterBrokerRequestHeader(
            broker_name=self.config.broker_name,
            broker_address=address,
            cluster_name=self.config.cluster_name,
            ha_server_address=address,
            broker_id=0 if is_leader else self.config.broker_id,
            body_crc32=java_crc32(body),
            raft_term=term if is_leader else None,
            shared_address=is_leader and bool(self.config.front_address),
        )
        results = await asyncio.gather(*(self._register(address, header.to_ext_fields(), body)
                                          for address in self.config.namesrv))
        if all(results):
            self.registered_as_leader = is_leader

    async def _register(self, address: str, fields: dict[str, str], body: bytes) -> bool:
        try:
            client = await self._client(address)
            response = await client.request(RequestCode.REGISTER_BROKER, fields, body,
                                            timeout_seconds=REQUEST_TIMEOUT_SECONDS)
        except (RemotingError, OSError) as exc:
            log.warning("cannot register with name server %s: %s", address, exc)
            self._drop(address)
            return False
        if response.code != ResponseCode.SUCCESS:
            log.warning("name server %s refused the registration: %s", address, response.remark)
            return False
        return True

    def registered_address(self, is_leader: bool) -> str:
        """What this member registers: the group's front while it leads (when there is one), else itself."""
        return self.config.front_address if is_leader and self.config.front_address else self.config.announced_address

    async def _unregister(self) -> None:
        is_leader, _, _, _ = self.snapshot()
        if is_leader and self.config.front_address:
            return  # the front is the group's address: it outlives this member
        fields = {"brokerName": self.config.broker_name, "brokerAddr": self.config.announced_address,
                  "clusterName": self.config.cluster_name,
                  "brokerId": str(0 if is_leader else self.config.broker_id)}
        for address, client in list(self._clients.items()):
            try:
                await client.request(RequestCode.UNREGISTER_BROKER, fields, timeout_seconds=1.0)
            except (RemotingError, OSError) as exc:
                log.info("cannot unregister from %s: %s", address, exc)

    async def _client(self, address: str) -> RemotingClient:
        client = self._clients.get(address)
        if client is None or client.is_closed:
            host, port = parse_address(address, "namesrv")
            client = await RemotingClient.connect(host, port)
            self._clients[address] = client
        return client

    def _drop(self, address: str) -> None:
        client = self._clients.pop(address, None)
        if client is not None and not client.is_closed:
            asyncio.get_running_loop().create_task(client.close())
