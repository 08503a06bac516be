"""A stock C++ producer (PyPI ``rocketmq==0.4.4``, librocketmq 1.2.x) sending sync at a steady rate until told
to stop, recording when each send was acknowledged: what ``bench/failover_bench.py`` and
``tests/interop/test_front_failover.py`` measure a leader kill with.

    python bench/cpp_failover_producer.py --namesrv H:P --topic T --group G --rate 50 --run R --out F --stop-file S

One JSON line per send, appended to ``--out`` and flushed at once: ``{"event": "ack", "index", "body",
"msg_id", "at"}`` or ``{"event": "error", "index", "body", "error", "at"}``, where ``at`` is
``time.monotonic()`` when the send returned (CLOCK_MONOTONIC: comparable with the caller's clock on the same
host). Bodies are ``<run>|<index>``. It stops when ``--stop-file`` exists (then writes ``{"event": "done"}``)
or after ``--deadline-seconds``. The native client can crash or hang at shutdown: it runs only in a process
of its own, which skips the interpreter's teardown (``os._exit``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any, Final

#: how long one send may take by default (the client's own default, sendMsgTimeout): a send in flight on a
#: connection that closes is failed only when it runs out, so this bounds what a leader kill costs from below
SEND_TIMEOUT_MILLISECONDS: Final = 3_000
SHUTDOWN_TIMEOUT_SECONDS: Final = 10.0


def _emit(stream: IO[str], event: str, **fields: object) -> None:
    stream.write(json.dumps({"event": event, **fields}, sort_keys=True) + "\n")
    stream.flush()


def run(arguments: argparse.Namespace) -> None:
    from rocketmq.client import Message, Producer

    producer: Any = Producer(arguments.group, timeout=arguments.send_timeout_ms)
    producer.set_namesrv_addr(arguments.namesrv)
    producer.start()
    period = 1.0 / arguments.rate
    with arguments.out.open("a", encoding="utf-8") as out:
        next_send = time.monotonic()
        index = 0
        while not arguments.stop_file.exists():
            body = f"{arguments.run}|{index}"
            message = Message(arguments.topic)  # a new message per send: it gets its own UNIQ_KEY
            message.set_keys(f"key-{index}")
            message.set_body(body)
            try:
                result = producer.send_sync(message)
            except Exception as error:  # the binding raises its own exception types for every failure
                _emit(out, "error", index=index, body=body, error=f"{type(error).__name__}: {error}"[:300],
                      at=time.monotonic())
            else:
                status = int(getattr(result.status, "value", result.status))
                if status == 0:
                    _emit(out, "ack", index=index, body=body, msg_id=str(result.msg_id), at=time.monotonic())
                else:
                    _emit(out, "error", index=index, body=body, error=f"send status {status}", at=time.monotonic())
            index += 1
            next_send = max(next_send + period, time.monotonic() - period)
            delay = next_send - time.monotonic()
            if delay > 0:
                time.sleep(delay)  # pacing the sends: the steady rate this producer stands for
        _emit(out, "done", sent=index, at=time.monotonic())
    stopped = threading.Thread(target=producer.shutdown, name="cpp-shutdown", daemon=True)
    stopped.start()
    stopped.join(SHUTDOWN_TIMEOUT_SECONDS)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--namesrv", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--rate", type=float, default=50.0, help="sends per second")
    parser.add_argument("--run", default="run", help="prefix of every body")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--stop-file", type=Path, required=True)
    parser.add_argument("--send-timeout-ms", type=int, default=SEND_TIMEOUT_MILLISECONDS)
    parser.add_argument("--deadline-seconds", type=float, default=600.0)
    arguments = parser.parse_args()
    watchdog = threading.Timer(arguments.deadline_seconds, os._exit, (3,))
    watchdog.daemon = True
    watchdog.start()
    run(arguments)
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
