"""A steady 5.x producer or SimpleConsumer (the stock ``rocketmq-python-client`` SDK) that records every operation
as it happens, for the failover test (``test_grpc_v2_failover.py``).

Runs only under the SDK's own venv (:mod:`tests.interop.sdk5`), never in the test process, and imports nothing
of this repository (the SDK's ``apache.rocketmq.v2`` modules and ours cannot share a process).

    <sdk python> sdk5_flow_driver.py produce SPEC.json
    <sdk python> sdk5_flow_driver.py consume SPEC.json

Both run until the file ``stop_file`` exists (or ``deadline_seconds`` passed) and append one JSON line per event
to ``out``, flushed at once, so the test reads progress while they run. Times are ``time.monotonic()``: the
system's monotonic clock, the same in every process of this machine, so the test compares them with its own.

produce SPEC: ``{"endpoints": "h:p;h:p", "topic", "rate_per_second", "body_prefix", "request_timeout_seconds",
"out", "stop_file", "deadline_seconds"}``. One producer sends ``<body_prefix>-<n>`` synchronously (n = 0, 1, ...),
paced at ``rate_per_second`` (a slow send delays the next, never queues them up); a failed send is not retried
by the driver (the SDK retries on its own, with its backoff policy, before it fails). Lines:
``{"event": "send", "n", "body", "start", "end", "ok": true, "message_id", "offset"}`` or ``"ok": false,
"error"``.

consume SPEC: ``{"endpoints", "topic", "group", "invisible_seconds", "await_seconds", "batch",
"request_timeout_seconds", "out", "stop_file", "deadline_seconds"}``. One SimpleConsumer receives and
acknowledges each message at once. Lines: ``{"event": "receive", "seq", "message_id", "body", "attempt", "at"}``
per message, ``{"event": "ack", "seq", "message_id", "body", "ok", "start", "at", "error"}`` per acknowledgement
(``seq`` counts every line of this consumer: one thread does everything, so it orders them),
``{"event": "receive_error", "seq", "at", "error"}`` for a failed receive (the consumer tries again).
Exit 0 when it ran to the stop.
"""

from __future__ import annotations

import importlib
import json
import sys
import time
from pathlib import Path
from typing import IO, Any

#: after a failed receive, before the next (the SDK fails at once on a dead endpoint)
RECEIVE_RETRY_SECONDS = 0.2


def _stopped(spec: dict[str, Any], deadline: float) -> bool:
    return Path(spec["stop_file"]).exists() or time.monotonic() > deadline


def _write(out: IO[str], record: dict[str, Any]) -> None:
    out.write(json.dumps(record) + "\n")
    out.flush()


def _configuration(rocketmq: Any, spec: dict[str, Any]) -> Any:
    return rocketmq.ClientConfiguration(spec["endpoints"], rocketmq.Credentials("", ""),
                                        request_timeout=spec.get("request_timeout_seconds", 3))


def produce(spec: dict[str, Any]) -> None:
    rocketmq = importlib.import_module("rocketmq")  # the SDK's (this runs in its venv)
    topic = spec["topic"]
    producer = rocketmq.Producer(_configuration(rocketmq, spec), (topic,))
    producer.startup()
    deadline = time.monotonic() + spec["deadline_seconds"]
    interval = 1.0 / spec["rate_per_second"]
    next_at = time.monotonic()
    number = 0
    try:
        with Path(spec["out"]).open("a", encoding="utf-8") as out:
            while not _stopped(spec, deadline):
                body = f"{spec['body_prefix']}-{number}"
                message = rocketmq.Message()
                message.topic = topic
                message.body = body.encode()
                message.tag = "failover"
                start = time.monotonic()
                record: dict[str, Any] = {"event": "send", "n": number, "body": body, "start": start}
                try:
                    receipt = producer.send(message)
                    record.update(ok=True, message_id=receipt.message_id, offset=receipt.offset)
                except Exception as error:  # the SDK's errors: recorded, the next message goes on
                    record.update(ok=False, error=f"{type(error).__name__}: {error}"[:300])
                record["end"] = time.monotonic()
                _write(out, record)
                number += 1
                next_at = max(next_at + interval, time.monotonic() - 1.0)
                time.sleep(max(0.0, next_at - time.monotonic()))
    finally:
        producer.shutdown()


def consume(spec: dict[str, Any]) -> None:
    rocketmq = importlib.import_module("rocketmq")
    subscription = {spec["topic"]: rocketmq.FilterExpression("*")}
    consumer = rocketmq.SimpleConsumer(_configuration(rocketmq, spec), spec["group"], subscription,
                                       await_duration=spec["await_seconds"])
    consumer.startup()
    deadline = time.monotonic() + spec["deadline_seconds"]
    sequence = 0
    try:
        with Path(spec["out"]).open("a", encoding="utf-8") as out:
            while not _stopped(spec, deadline):
                try:
                    messages = consumer.receive(spec["batch"], spec["invisible_seconds"])
                except Exception as error:  # a dead or changing leader: recorded, tried again
                    _write(out, {"event": "receive_error", "seq": sequence, "at": time.monotonic(),
                                 "error": f"{type(error).__name__}: {error}"[:300]})
                    sequence += 1
                    time.sleep(RECEIVE_RETRY_SECONDS)
                    continue
                for message in messages or ():
                    body = message.body.decode()
                    _write(out, {"event": "receive", "seq": sequence, "message_id": message.message_id, "body": body,
                                 "attempt": message.delivery_attempt, "at": time.monotonic()})
                    sequence += 1
                    record: dict[str, Any] = {"event": "ack", "seq": sequence, "message_id": message.message_id,
                                              "body": body, "start": time.monotonic()}
                    try:
                        consumer.ack(message)
                        record.update(ok=True, error=None)
                    except Exception as error:
                        record.update(ok=False, error=f"{type(error).__name__}: {error}"[:300])
                    record["at"] = time.monotonic()
                    _write(out, record)
                    sequence += 1
    finally:
        consumer.shutdown()


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[1] not in ("produce", "consume"):
        print(__doc__, file=sys.stderr)
        return 2
    spec = json.loads(Path(argv[2]).read_text())
    if argv[1] == "produce":
        produce(spec)
    else:
        consume(spec)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
