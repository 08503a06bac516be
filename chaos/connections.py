"""Remoting connections the chaos workload and monitor keep to the group's members and name server: one
per address, reused, dropped on any failure (the next request reconnects), every request bounded."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Mapping
from typing import Final

from protocol.client import RemotingClient
from protocol.codes import RequestCode, ResponseCode
from protocol.command import RemotingCommand
from protocol.connection import RemotingError

CONNECT_TIMEOUT_SECONDS: Final = 1.0


class Unreachable(Exception):
    """The address did not answer in time (refused, reset, timed out, closed)."""


class Connections:
    def __init__(self, connect_timeout_seconds: float = CONNECT_TIMEOUT_SECONDS) -> None:
        self._clients: dict[str, RemotingClient] = {}
        self._connect_timeout_seconds = connect_timeout_seconds

    async def request(self, address: str, code: int, fields: Mapping[str, str] | None = None,
                      timeout_seconds: float = 2.0) -> RemotingCommand:
        client = self._clients.get(address)
        try:
            if client is None or client.is_closed:
                host, _, port = address.rpartition(":")
                client = await RemotingClient.connect(host, int(port),
                                                      connect_timeout_seconds=self._connect_timeout_seconds)
                self._clients[address] = client
            return await client.request(code, fields or {}, timeout_seconds=timeout_seconds)
        except (RemotingError, OSError, TimeoutError) as exc:
            await self.drop(address)
            raise Unreachable(f"{address}: {exc}") from exc

    async def drop(self, address: str) -> None:
        client = self._clients.pop(address, None)
        if client is not None:
            with contextlib.suppress(RemotingError, OSError, TimeoutError):
                await client.close(timeout_seconds=0.2)

    async def close(self) -> None:
        await asyncio.gather(*(self.drop(address) for address in list(self._clients)))

    async def route_master(self, namesrv: str, topic: str) -> str | None:
        """The address the name server routes as brokerId 0 for ``topic``, or None."""
        try:
            response = await self.request(namesrv, RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic}, 1.0)
        except Unreachable:
            return None
        if response.code != ResponseCode.SUCCESS:
            return None
        for broker in json.loads(response.body).get("brokerDatas", []):
            address = broker.get("brokerAddrs", {}).get("0")
            if address:
                return str(address)
        return None

    async def runtime_info(self, address: str, timeout_seconds: float) -> dict[str, str] | None:
        """GET_BROKER_RUNTIME_INFO's table, or None when the member does not answer."""
        try:
            response = await self.request(address, RequestCode.GET_BROKER_RUNTIME_INFO, None, timeout_seconds)
        except Unreachable:
            return None
        if response.code != ResponseCode.SUCCESS:
            return None
        table = json.loads(response.body).get("table", {})
        return {str(key): str(value) for key, value in table.items()}
