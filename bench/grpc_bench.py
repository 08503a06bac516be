"""5.x protocol benchmark: the stock RocketMQ 5.x Python SDK (``rocketmq-python-client``, in a subprocess of its
own venv: ``bench/sdk5_bench_driver.py``) against a three-node group's gRPC endpoint, next to the 4.x figures
of our client against the same group in the same run. Prints one JSON line per measurement, then a table:

* ``produce`` at each in-flight setting (``--inflight``): acknowledged sends of ``--size``-byte messages,
  msgs/s, MB/s and p50/p99 ms per send. 5.x: the SDK's ``Producer.send_async`` with a window of N; 4.x: our
  ``AsyncProducer`` with N tasks awaiting ``send`` (its concurrent sends to one queue leave as batches).
* ``consume``: everything the largest setting produced, msgs/s; 5.x: one SimpleConsumer (pop through Raft:
  every receive and every ack is a replicated command), receives of ``--batch`` messages, each message
  acknowledged with ``ack_async``: p50/p99 ms of the receives that returned messages and of the acks; 4.x:
  our pull consumer, PULL_MESSAGE of 32 per request queue after queue (offsets committed by nobody):
  p50/p99 ms per pull.

Each protocol has its own topic (so each consumer reads exactly what its producer sent) on the one group.

Usage: ``python bench/grpc_bench.py [--count 3000] [--inflight 1,32] [--size 1024] [--batch 32]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Final

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.figures import produce_figures
from bench.sdk_sends import timed_sends
from cli.cluster import LocalCluster
from client.admin import AsyncAdmin
from client.config import ClientConfig, ConsumerConfig, ProducerConfig
from client.figures import percentile
from client.message import Message
from client.producer import AsyncProducer
from client.pull_consumer import AsyncPullConsumer
from tests.interop import sdk5  # the SDK's venv (made from tests/interop/sdk5-requirements.txt)

TOPIC_5X: Final = "GrpcBench5"
TOPIC_4X: Final = "GrpcBench4"
QUEUES: Final = 4
DRIVER: Final = Path(__file__).with_name("sdk5_bench_driver.py")
#: in-flight 1 is slow: it sends at most this many messages whatever ``--count`` says
IN_FLIGHT_1_COUNT_MAX: Final = 1000
#: the longest one SDK run may take
DRIVER_TIMEOUT_SECONDS: Final = 900.0
SDK_LABEL: Final = "rocketmq-python-client 5.1.2"


def milliseconds(values: list[float], fraction: float) -> float:
    return round(1000 * percentile(values, fraction), 2)


def run_driver(command: str, spec: dict[str, Any]) -> dict[str, Any]:
    """One run of the SDK driver in the SDK's venv; its JSON result."""
    sdk_python = sdk5.ensure()
    with tempfile.TemporaryDirectory(prefix="grpc-bench-") as scratch:
        spec_path = Path(scratch) / "spec.json"
        spec_path.write_text(json.dumps(spec))
        environment = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")}
        environment["HOME"] = scratch  # the SDK logs under $HOME/logs
        completed = subprocess.run([str(sdk_python), str(DRIVER), command, str(spec_path)], capture_output=True,
                                   text=True, env=environment, cwd=scratch, timeout=DRIVER_TIMEOUT_SECONDS)
    lines = [line for line in completed.stdout.splitlines() if line.startswith("{")]
    if completed.returncode != 0 or not lines:
        raise RuntimeError(f"the SDK driver's {command} failed (exit {completed.returncode}): {completed.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def produce_5x(endpoint: str, count: int, in_flight: int, size: int) -> dict[str, object]:
    result = run_driver("produce", {"endpoints": endpoint, "topic": TOPIC_5X, "count": count, "in_flight": in_flight,
                                    "body_size": size})
    return {"protocol": "5.x", "client": SDK_LABEL, "mode": "produce", "in_flight": in_flight,
            **produce_figures(result["latencies"], result["errors"], result["seconds"], size)}


def consume_5x(endpoint: str, count: int, batch: int, size: int) -> dict[str, object]:
    result = run_driver("consume", {"endpoints": endpoint, "topic": TOPIC_5X, "group": "bench-grpc-consumer",
                                    "count": count, "batch": batch, "invisible_seconds": 60, "await_seconds": 2,
                                    "seconds": 600})
    seconds = result["seconds"]
    acked = len(result["latencies"])
    return {"protocol": "5.x", "client": SDK_LABEL, "mode": "consume", "batch": batch, "messages": acked,
            "received": result["received"], "errors": result["errors"],
            "receives": len(result["receive_latencies"]), "empty_receives": result["empty_receives"],
            "msgs_per_s": round(acked / seconds) if seconds > 0 else 0,
            "MB_per_s": round(acked * size / seconds / 1e6, 2) if seconds > 0 else 0.0,
            "receive_p50_ms": milliseconds(result["receive_latencies"], 0.5),
            "receive_p99_ms": milliseconds(result["receive_latencies"], 0.99),
            "ack_p50_ms": milliseconds(result["latencies"], 0.5), "ack_p99_ms": milliseconds(result["latencies"], 0.99)}


async def produce_4x(namesrv: str, count: int, in_flight: int, size: int) -> dict[str, object]:
    config = ProducerConfig(group="bench-grpc-4x-producer", inflight_sends_max=max(in_flight, 1),
                            compress_body_over_bytes=0)
    body = os.urandom(size)
    async with AsyncProducer(namesrv, config) as producer:
        await producer.send(Message(TOPIC_4X, body, tags="bench"))  # routes and connections, out of the clock
        latencies, errors, seconds = await timed_sends(producer, lambda: Message(TOPIC_4X, body, tags="bench"),
                                                       count, in_flight)
    return {"protocol": "4.x", "client": "raftmq", "mode": "produce", "in_flight": in_flight,
            **produce_figures(latencies, errors, seconds, size)}


async def consume_4x(namesrv: str, size: int) -> dict[str, object]:
    latencies: list[float] = []
    total = 0
    async with AsyncPullConsumer(ClientConfig.of(namesrv), ConsumerConfig(group="bench-grpc-4x-consumer")) as consumer:
        queues = sorted(await consumer.fetch_subscribe_queues(TOPIC_4X), key=lambda queue: queue.queue_id)
        started = time.perf_counter()
        for queue in queues:
            offset = 0
            while True:
                asked = time.perf_counter()
                result = await consumer.pull(queue, "*", offset, 32)
                if not result.messages:
                    break
                latencies.append(time.perf_counter() - asked)
                total += len(result.messages)
                offset = result.next_begin_offset
        seconds = time.perf_counter() - started
    return {"protocol": "4.x", "client": "raftmq", "mode": "consume", "batch": 32, "messages": total,
            "msgs_per_s": round(total / seconds) if seconds > 0 else 0,
            "MB_per_s": round(total * size / seconds / 1e6, 2) if seconds > 0 else 0.0,
            "receive_p50_ms": milliseconds(latencies, 0.5), "receive_p99_ms": milliseconds(latencies, 0.99)}


async def create_topics(namesrv: str) -> None:
    async with AsyncAdmin(namesrv) as admin:
        for topic in (TOPIC_5X, TOPIC_4X):
            await admin.create_topic(topic, read_queue_nums=QUEUES, write_queue_nums=QUEUES)


def table(records: list[dict[str, object]]) -> str:
    header = ("protocol", "client", "mode", "in-flight/batch", "msgs/s", "MB/s", "p50 ms", "p99 ms", "ack p50/p99 ms")
    rows = [header]
    for record in records:
        setting = record.get("in_flight", record.get("batch", ""))
        p50 = record.get("p50_ms", record.get("receive_p50_ms", ""))
        p99 = record.get("p99_ms", record.get("receive_p99_ms", ""))
        acks = f"{record['ack_p50_ms']}/{record['ack_p99_ms']}" if "ack_p50_ms" in record else ""
        rows.append((str(record["protocol"]), str(record["client"]), str(record["mode"]), str(setting),
                     str(record["msgs_per_s"]), str(record["MB_per_s"]), str(p50), str(p99), acks))
    widths = [max(len(row[column]) for row in rows) for column in range(len(header))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)) for row in rows]
    return "\n".join([*lines, "(consume p50/p99: per receive or pull that returned messages)"])


def stop_on_terminate(signal_number: int, _frame: object) -> None:
    """SIGTERM unwinds like Ctrl-C, through the ``with`` that stops the group."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise SystemExit(128 + signal_number)


def main() -> None:
    signal.signal(signal.SIGTERM, stop_on_terminate)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=3000, help="messages per in-flight setting")
    parser.add_argument("--inflight", default="1,32")
    parser.add_argument("--size", type=int, default=1024, help="body bytes")
    parser.add_argument("--batch", type=int, default=32, help="messages per 5.x receive")
    arguments = parser.parse_args()
    settings = [(in_flight, min(arguments.count, IN_FLIGHT_1_COUNT_MAX) if in_flight == 1 else arguments.count)
                for in_flight in (int(value) for value in arguments.inflight.split(","))]
    sdk5.ensure()  # before the group starts: an install takes a while on a fresh machine
    records: list[dict[str, object]] = []

    def emit(record: dict[str, object]) -> None:
        record = {"bench": "grpc", **record}
        print(json.dumps(record), flush=True)
        records.append(record)

    overrides: dict[str, dict[str, Any]] = {"broker": {"default_topic_queue_nums": QUEUES}}
    with (tempfile.TemporaryDirectory(prefix="raftmq-grpc-bench-") as directory,
          LocalCluster.start(Path(directory) / "cluster", nodes=3, overrides=overrides) as cluster):
        asyncio.run(create_topics(cluster.namesrv))
        leader = cluster.leader_node()
        if leader is None or not leader.grpc_address:
            raise SystemExit("grpc_bench: the group has no leader serving gRPC")
        for in_flight, count in settings:
            emit(produce_5x(leader.grpc_address, count, in_flight, arguments.size))
            emit(asyncio.run(produce_4x(cluster.namesrv, count, in_flight, arguments.size)))
        produced = sum(count + 1 for _, count in settings)  # each run's warm-up send too
        emit(consume_5x(leader.grpc_address, produced, arguments.batch, arguments.size))
        emit(asyncio.run(consume_4x(cluster.namesrv, arguments.size)))
    print()
    print(table(records), flush=True)


if __name__ == "__main__":
    main()
