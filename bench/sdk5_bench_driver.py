"""Drives the stock RocketMQ 5.x Python SDK for ``bench/grpc_bench.py``, in the SDK's own venv (its generated
``apache.rocketmq.v2`` modules and ours cannot share a process). Imports nothing of this repository.

    <sdk python> sdk5_bench_driver.py produce SPEC.json
    <sdk python> sdk5_bench_driver.py consume SPEC.json

produce SPEC: ``{"endpoints", "topic", "count", "in_flight", "body_size"}``: one Producer keeps ``in_flight``
``send_async`` calls outstanding (a window) until ``count`` were answered.
consume SPEC: ``{"endpoints", "topic", "group", "count", "batch", "invisible_seconds", "await_seconds",
"seconds", "ack_threads"}``: one SimpleConsumer receives batches and acknowledges each message, until ``count``
were acknowledged or ``seconds`` passed (the SDK's ``ack_async`` returns no future in 5.1.2: synchronous
``ack`` calls from a thread pool instead).

Prints one JSON line: ``{"seconds", "errors", "latencies"}`` (seconds each, of every acknowledged send; of
every receive that returned messages and every ack for consume, as ``receive_latencies`` and ``latencies``;
acks go out from ``ack_threads`` threads, 8 unless the spec says),
measured after the client started (routes, settings and connections are not in the clock).
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

REQUEST_TIMEOUT_SECONDS = 30


def produce(spec: dict[str, Any]) -> dict[str, Any]:
    rocketmq = importlib.import_module("rocketmq")
    configuration = rocketmq.ClientConfiguration(spec["endpoints"], rocketmq.Credentials("", ""),
                                                 request_timeout=REQUEST_TIMEOUT_SECONDS)
    producer = rocketmq.Producer(configuration, (spec["topic"],))
    producer.startup()
    body = os.urandom(spec["body_size"])
    window = threading.Semaphore(spec["in_flight"])
    lock = threading.Lock()
    latencies: list[float] = []
    errors = [0]
    done = threading.Semaphore(0)

    def message() -> Any:
        built = rocketmq.Message()
        built.topic = spec["topic"]
        built.body = body
        built.tag = "bench"
        return built

    try:
        producer.send(message())  # warm-up: the route and the channel, out of the clock
        started = time.perf_counter()
        for _ in range(spec["count"]):
            window.acquire()
            sent_at = time.perf_counter()
            future = producer.send_async(message())

            def finished(result: Any, sent_at: float = sent_at) -> None:
                elapsed = time.perf_counter() - sent_at
                with lock:
                    if result.exception() is None:
                        latencies.append(elapsed)
                    else:
                        errors[0] += 1
                window.release()
                done.release()

            future.add_done_callback(finished)
        for _ in range(spec["count"]):
            done.acquire()
        seconds = time.perf_counter() - started
    finally:
        producer.shutdown()
    return {"seconds": seconds, "errors": errors[0], "latencies": latencies}


def consume(spec: dict[str, Any]) -> dict[str, Any]:
    rocketmq = importlib.import_module("rocketmq")
    configuration = rocketmq.ClientConfiguration(spec["endpoints"], rocketmq.Credentials("", ""),
                                                 request_timeout=REQUEST_TIMEOUT_SECONDS)
    consumer = rocketmq.SimpleConsumer(configuration, spec["group"],
                                       {spec["topic"]: rocketmq.FilterExpression("*")},
                                       await_duration=spec["await_seconds"])
    consumer.startup()
    lock = threading.Lock()
    receive_latencies: list[float] = []
    ack_latencies: list[float] = []
    errors = [0]
    acks: list[Future[None]] = []
    # the SDK's ack_async returns None (5.1.2): synchronous acks from a pool, ``ack_threads`` at once
    pool = ThreadPoolExecutor(spec.get("ack_threads", 8), thread_name_prefix="ack")

    def timed_ack(message: Any) -> None:
        acked_at = time.perf_counter()
        try:
            consumer.ack(message)
        except Exception:  # the SDK's errors (none expected): counted
            with lock:
                errors[0] += 1
            return
        elapsed = time.perf_counter() - acked_at
        with lock:
            ack_latencies.append(elapsed)

    try:
        started = time.perf_counter()
        deadline = started + spec["seconds"]
        received = 0
        empty_receives = 0
        while received < spec["count"] and time.perf_counter() < deadline:
            asked_at = time.perf_counter()
            try:
                messages = consumer.receive(spec["batch"], spec["invisible_seconds"]) or []
            except Exception:  # the SDK's errors (none expected): counted, the loop goes on
                with lock:
                    errors[0] += 1
                continue
            if messages:
                receive_latencies.append(time.perf_counter() - asked_at)
            else:
                empty_receives += 1
            for message in messages:
                received += 1
                acks.append(pool.submit(timed_ack, message))
        for future in acks:
            future.result()
        seconds = time.perf_counter() - started
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        consumer.shutdown()
    return {"seconds": seconds, "errors": errors[0], "received": received, "latencies": ack_latencies,
            "receive_latencies": receive_latencies, "empty_receives": empty_receives}


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[1] not in ("produce", "consume"):
        print(__doc__, file=sys.stderr)
        return 2
    spec = json.loads(Path(argv[2]).read_text())
    result = produce(spec) if argv[1] == "produce" else consume(spec)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
