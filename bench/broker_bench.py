"""Broker benchmark: a three-node group (a name server and three broker processes) on this machine, driven
through the RocketMQ wire protocol by one client process. Prints one JSON line per setting:

* ``produce`` at in-flight 1, 32 and 256: acked SEND_MESSAGE_V2 of 1 KB messages (msgs/s, MB/s, p50/p99 ms);
* ``consume``: PULL_MESSAGE of everything produced, 32 messages per pull, one queue after another.

Each line names its ``journal_flush``: the durable default, then (unless ``--journal-flush durable``) a
second group with ``page_cache`` in the same run, for the ratio (README.md, "Flush policy").

Usage: ``python bench/broker_bench.py [--count 20000] [--inflight 1,32,256] [--journal-flush both]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from broker.remoting.client import RemotingClient
from broker.remoting.codes import RequestCode, ResponseCode
from cli.cluster import LocalCluster, route_master

TOPIC = "BenchTopic"
QUEUES = 4
BODY = os.urandom(1024)


def send_fields(sequence: int) -> dict[str, str]:
    return {"a": "bench-producer", "b": TOPIC, "c": "TBW102", "d": "4", "e": str(sequence % QUEUES), "f": "0",
            "g": str(int(time.time() * 1000)), "h": "0",
            "i": f"UNIQ_KEY\x01BENCH{os.getpid():08X}{sequence:020X}\x02TAGS\x01bench\x02", "j": "0", "k": "false",
            "m": "false"}


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * fraction))] if ordered else 0.0


async def produce(address: str, count: int, in_flight: int, first: int) -> dict[str, object]:
    host, _, port = address.rpartition(":")
    connections = max(1, min(8, in_flight // 32))
    clients = [await RemotingClient.connect(host, int(port)) for _ in range(connections)]
    latencies: list[float] = []
    errors = 0
    next_sequence = first
    end = first + count

    async def worker(client: RemotingClient) -> None:
        nonlocal next_sequence, errors
        while next_sequence < end:
            sequence = next_sequence
            next_sequence += 1
            started = time.perf_counter()
            response = await client.request(RequestCode.SEND_MESSAGE_V2, send_fields(sequence), BODY,
                                            timeout_seconds=30)
            if response.code != ResponseCode.SUCCESS:
                errors += 1
                continue
            latencies.append(time.perf_counter() - started)

    started = time.perf_counter()
    await asyncio.gather(*(worker(clients[n % connections]) for n in range(in_flight)))
    seconds = time.perf_counter() - started
    for client in clients:
        await client.close()
    acked = len(latencies)
    return {"bench": "broker", "mode": "produce", "in_flight": in_flight, "messages": acked, "errors": errors,
            "msgs_per_s": round(acked / seconds), "MB_per_s": round(acked * len(BODY) / seconds / 1e6, 2),
            "p50_ms": round(1000 * percentile(latencies, 0.5), 2),
            "p99_ms": round(1000 * percentile(latencies, 0.99), 2)}


async def consume(address: str) -> dict[str, object]:
    host, _, port = address.rpartition(":")
    client = await RemotingClient.connect(host, int(port))
    total = 0
    pulls = 0
    started = time.perf_counter()
    for queue_id in range(QUEUES):
        offset = 0
        while True:
            response = await client.request(RequestCode.PULL_MESSAGE, {
                "consumerGroup": "bench-consumer", "topic": TOPIC, "queueId": str(queue_id),
                "queueOffset": str(offset), "maxMsgNums": "32", "sysFlag": "0", "commitOffset": "0",
                "suspendTimeoutMillis": "0", "subVersion": "0", "expressionType": "TAG"}, timeout_seconds=30)
            pulls += 1
            if response.code != ResponseCode.SUCCESS:
                break
            offset = int(response.ext_fields["nextBeginOffset"])
            position = 0
            body = response.body
            while position < len(body):
                position += int.from_bytes(body[position : position + 4], "big")
                total += 1
    seconds = time.perf_counter() - started
    await client.close()
    return {"bench": "broker", "mode": "consume", "messages": total, "pulls": pulls,
            "msgs_per_s": round(total / seconds), "MB_per_s": round(total * len(BODY) / seconds / 1e6, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=20_000, help="messages per in-flight setting")
    parser.add_argument("--inflight", default="1,32,256")
    parser.add_argument("--journal-flush", choices=("durable", "page_cache", "both"), default="both")
    arguments = parser.parse_args()
    settings = [int(value) for value in arguments.inflight.split(",")]
    policies = ("durable", "page_cache") if arguments.journal_flush == "both" else (arguments.journal_flush,)
    for policy in policies:
        with (tempfile.TemporaryDirectory(prefix="raftmq-broker-bench-") as directory,
              LocalCluster.start(Path(directory) / "cluster",
                                 overrides={"broker": {"default_topic_queue_nums": QUEUES},
                                            "raft": {"journal_flush": policy}}) as cluster):
            address = route_master(cluster.namesrv)
            assert address is not None
            sent = 0
            for in_flight in settings:
                count = min(arguments.count, 2000) if in_flight == 1 else arguments.count
                figures = asyncio.run(produce(address, count, in_flight, sent))
                print(json.dumps({**figures, "journal_flush": policy}), flush=True)
                sent += count
            print(json.dumps({**asyncio.run(consume(address)), "journal_flush": policy}), flush=True)


if __name__ == "__main__":
    main()
