"""Shared helpers of the client tests: a deadline for every coroutine, a fake group."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from typing import TypeVar

from client.config import ClientConfig
from tests.client.fake_broker import FakeGroup

T = TypeVar("T")
#: every test coroutine ends within this, so a hang fails the test instead of the suite
TEST_DEADLINE_SECONDS = 30.0


def run(coroutine: Awaitable[T], timeout_seconds: float = TEST_DEADLINE_SECONDS) -> T:
    async def bounded() -> T:
        async with asyncio.timeout(timeout_seconds):
            return await coroutine

    return asyncio.run(bounded())


def fast_client_config(namesrv: str, **overrides: object) -> ClientConfig:
    """Short timeouts and periods, so failure paths finish quickly in tests."""
    values: dict[str, object] = {
        "namesrv_addresses": (namesrv,),
        "request_timeout_seconds": 1.0,
        "connect_timeout_seconds": 1.0,
        "route_refresh_interval_seconds": 1.0,
        "heartbeat_interval_seconds": 1.0,
        "suspect_address_seconds": 1.0,
        "failover_backoff_min_seconds": 0.01,
        "failover_backoff_max_seconds": 0.1,
        "client_ip": "127.0.0.1",
    }
    values.update(overrides)
    return ClientConfig.from_mapping(values)


@asynccontextmanager
async def fake_group(nodes: int = 1) -> AsyncIterator[FakeGroup]:
    group = FakeGroup(nodes)
    try:
        await group.start()
        yield group
    finally:
        await group.stop()
