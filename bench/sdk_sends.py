"""Acknowledged sends through our producer SDK, ``in_flight`` tasks awaiting ``send`` in a loop: what
broker_bench.py and grpc_bench.py measure of our client, written once."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from client.errors import MQClientError
from client.message import Message
from client.producer import AsyncProducer


async def timed_sends(producer: AsyncProducer, message: Callable[[], Message], count: int,
                      in_flight: int) -> tuple[list[float], int, float]:
    """Send ``count`` messages (``message()`` makes each) with ``in_flight`` sends outstanding: the latency of
    each acknowledged send, the number that failed, and the seconds the whole took."""
    latencies: list[float] = []
    errors = 0
    remaining = count

    async def worker() -> None:
        nonlocal remaining, errors
        while remaining > 0:
            remaining -= 1
            started = time.perf_counter()
            try:
                await producer.send(message())
            except MQClientError:
                errors += 1
                continue
            latencies.append(time.perf_counter() - started)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(in_flight)))
    return latencies, errors, time.perf_counter() - started
