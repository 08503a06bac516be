"""Timer benchmark: schedule many timed messages spread over the next hour on a three-node group, then
measure the delivery lateness (store time of the delivered message minus its due time) of those due
within the next minute, and the brokers' resident memory. Prints one JSON line.

Usage: ``python bench/timer_bench.py [--count 1000000] [--inflight 256]``
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

from cli.cluster import LocalCluster, route_master
from client.figures import percentile
from commitlog.record_codec import decode_record
from protocol.client import RemotingClient
from protocol.codes import RequestCode, ResponseCode

TOPIC = "TimerBench"
BODY = b"t" * 256


def rss_mb(pid: int, field: str = "VmRSS:") -> float:
    """Resident memory (VmRSS: everything, mapped store and index files included; RssAnon: the heap)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field):
            return int(line.split()[1]) / 1024
    return 0.0


async def schedule(address: str, due_times: list[int], in_flight: int, first: int) -> int:
    host, _, port = address.rpartition(":")
    clients = [await RemotingClient.connect(host, int(port)) for _ in range(max(1, in_flight // 32))]
    position = 0
    errors = 0

    async def worker(client: RemotingClient) -> None:
        nonlocal position, errors
        while position < len(due_times):
            index = position
            position += 1
            properties = f"TIMER_DELIVER_MS\x01{due_times[index]}\x02UNIQ_KEY\x01TB{first + index:030d}\x02"
            fields = {"a": "timer-bench", "b": TOPIC, "c": "TBW102", "d": "4", "e": str(index % 4), "f": "0",
                      "g": str(int(time.time() * 1000)), "h": "0", "i": properties, "j": "0", "k": "false",
                      "m": "false"}
            response = await client.request(RequestCode.SEND_MESSAGE_V2, fields, BODY, timeout_seconds=60)
            if response.code != ResponseCode.SUCCESS:
                errors += 1

    await asyncio.gather(*(worker(clients[n % len(clients)]) for n in range(in_flight)))
    for client in clients:
        await client.close()
    return errors


async def lateness(address: str, expected: int, deadline: float, first_key: int) -> list[int]:
    """Lateness of the delivered timers whose UNIQ_KEY number is at least ``first_key`` (the near ones)."""
    host, _, port = address.rpartition(":")
    client = await RemotingClient.connect(host, int(port))
    late: list[int] = []
    offsets = [0, 0, 0, 0]
    while len(late) < expected and time.time() < deadline:
        for queue_id in range(4):
            response = await client.request(RequestCode.PULL_MESSAGE, {
                "consumerGroup": "timer-bench", "topic": TOPIC, "queueId": str(queue_id),
                "queueOffset": str(offsets[queue_id]), "maxMsgNums": "32", "sysFlag": "0", "commitOffset": "0",
                "suspendTimeoutMillis": "0", "subVersion": "0", "expressionType": "TAG"}, timeout_seconds=30)
            if response.code != ResponseCode.SUCCESS:
                continue
            offsets[queue_id] = int(response.ext_fields["nextBeginOffset"])
            position = 0
            while position < len(response.body):
                message = decode_record(response.body, position)
                position += message.total_size
                properties = message.property_map
                if int(properties["UNIQ_KEY"][2:]) >= first_key:
                    late.append(message.store_timestamp - int(properties["TIMER_OUT_MS"]))
        await asyncio.sleep(0.2)  # a consumer's poll period, not a test waiting
    await client.close()
    return late


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=1_000_000)
    parser.add_argument("--inflight", type=int, default=256)
    arguments = parser.parse_args()
    near = max(1, arguments.count // 60)  # the share of an hour that falls in one minute
    with (tempfile.TemporaryDirectory(prefix="raftmq-timer-bench-") as directory,
          LocalCluster.start(Path(directory) / "cluster",
                             overrides={"broker": {"default_topic_queue_nums": 4}}) as cluster):
        address = route_master(cluster.namesrv)
        assert address is not None
        started = time.time()
        now_ms = int(started * 1000)
        far = [now_ms + 300_000 + (3_600_000 * n) // (arguments.count - near or 1)
               for n in range(arguments.count - near)]
        errors = asyncio.run(schedule(address, far, arguments.inflight, 0))
        scheduled_seconds = time.time() - started
        now_ms = int(time.time() * 1000)
        soon = [now_ms + 20_000 + (60_000 * n) // near for n in range(near)]
        errors += asyncio.run(schedule(address, soon, arguments.inflight, len(far)))
        late = asyncio.run(lateness(address, near, time.time() + 140, len(far)))
        live = [node for node in cluster.info.nodes if os.path.exists(f"/proc/{node.pid}")]
        rss = {node.id: round(rss_mb(node.pid), 1) for node in live}
        heap = {node.id: round(rss_mb(node.pid, "RssAnon:"), 1) for node in live}
        print(json.dumps({
            "bench": "timers", "scheduled": arguments.count, "errors": errors,
            "schedule_msgs_per_s": round(len(far) / scheduled_seconds),
            "due_next_minute": near, "delivered": len(late),
            "lateness_p50_ms": percentile([float(x) for x in late], 0.5),
            "lateness_p99_ms": percentile([float(x) for x in late], 0.99),
            "lateness_max_ms": max(late, default=0),
            "broker_rss_MB": rss, "broker_heap_MB": heap,
        }), flush=True)


if __name__ == "__main__":
    main()
