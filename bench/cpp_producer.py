"""The stock C++ client (PyPI ``rocketmq==0.4.4``, librocketmq 1.2.x) sending 1 KB messages to a raftmq
group, for ``broker_bench.py``: msgs/s, p50/p99 and CPU per message next to our own client's.

* ``sync``: ``send_sync`` in a loop (in-flight 1);
* ``async``: ``send_async`` with at most ``--in-flight`` sends awaiting their callback.

Each send is a new ``Message`` (the client gives a message its UNIQ_KEY on its first send and keeps it:
reusing one would make every later send a duplicate the broker answers without storing). Bodies are
printable ASCII, the binding passes bodies as C strings.

The native client can crash or hang at shutdown, so it runs only in a subprocess of its own
(``python bench/cpp_producer.py ...``, ``$HOME`` in a directory of the caller's: it logs there), which
talks to :func:`measure` over its standard streams so that the CPU sampled around the sends covers the
sends alone:

1. it starts the producer and sends one message (the route lookup), then prints ``{"event": "ready"}``;
2. on a line on its standard input it sends, then prints ``{"event": "result", ...}``;
3. at the end of its standard input it shuts the client down and exits (``os._exit``: the binding's
   ``__del__`` methods would shut it down a second time). It ends itself after ``--deadline-seconds``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import select
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any, Final

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import cpu_meter
from bench.figures import produce_figures

MODES: Final = ("sync", "async")
SEND_TIMEOUT_MILLISECONDS: Final = 30_000
DEADLINE_SECONDS: Final = 600.0
#: the native client's shutdown gets this long before the process exits anyway
SHUTDOWN_TIMEOUT_SECONDS: Final = 10.0
#: how long the caller waits for each step's line, and then for the exit
STEP_TIMEOUT_SECONDS: Final = 300.0
BODY_SIZE_BYTES: Final = 1024
GROUP: Final = "bench-cpp-producer"


def printable_body(size_bytes: int) -> bytes:
    """NUL-free bytes (the binding passes the body as a C string), the same on every run."""
    return bytes(random.Random(size_bytes).choices(range(0x21, 0x7F), k=size_bytes))


# ------------------------------------------------------------------------------------------ the caller


def measure(namesrv: str, topic: str, mode: str, count: int, in_flight: int, processes: Mapping[str, int],
            directory: Path) -> dict[str, object]:
    """Run the C++ client in a subprocess (``directory`` its ``$HOME``); its figures with the CPU per
    message of ``processes`` and of the client process itself (``client``) over the sends alone.
    RuntimeError, with the end of its stderr, when it fails."""
    directory.mkdir(parents=True, exist_ok=True)
    stderr_path = directory / "stderr.log"
    with stderr_path.open("wb") as stderr:
        process = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--namesrv", namesrv, "--topic", topic, "--mode", mode,
             "--count", str(count), "--in-flight", str(in_flight)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, cwd=directory, text=True,
            env={**os.environ, "HOME": str(directory)}, start_new_session=True)
    try:
        assert process.stdin is not None and process.stdout is not None
        _read_event(process, "ready", mode, stderr_path)
        labelled = {**processes, "client": process.pid}
        before = cpu_meter.sample(labelled)
        process.stdin.write("go\n")
        process.stdin.flush()
        result = _read_event(process, "result", mode, stderr_path)
        after = cpu_meter.sample(labelled)
        process.stdin.close()
        process.wait(timeout=SHUTDOWN_TIMEOUT_SECONDS + 5)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    result.pop("event")
    return {**result, "cpu_us_per_msg": cpu_meter.microseconds_per_message(before, after, int(result["messages"]))}


def _read_event(process: subprocess.Popen[str], expected: str, mode: str, stderr_path: Path) -> dict[str, Any]:
    assert process.stdout is not None
    readable, _, _ = select.select([process.stdout], [], [], STEP_TIMEOUT_SECONDS)
    line = process.stdout.readline() if readable else ""
    try:
        event: dict[str, Any] = json.loads(line)
    except ValueError:
        event = {}
    if event.get("event") != expected:
        tail = stderr_path.read_text(errors="replace").strip().splitlines()[-5:]
        raise RuntimeError(f"the C++ client ({mode}, pid {process.pid}) gave {line.strip()!r} instead of "
                           f"{expected!r}; stderr: {' | '.join(tail) or '(empty)'}")
    return event


# ------------------------------------------------------------------------------------ the subprocess


def _emit(stream: IO[str], event: str, **fields: object) -> None:
    stream.write(json.dumps({"event": event, **fields}) + "\n")
    stream.flush()


def _send_sync(producer: Any, new_message: Any, count: int) -> tuple[list[float], int]:
    latencies: list[float] = []
    errors = 0
    for _ in range(count):
        message = new_message()
        started = time.perf_counter()
        try:
            producer.send_sync(message)
        except Exception:  # the binding raises its own exception classes only
            errors += 1
            continue
        latencies.append(time.perf_counter() - started)
    return latencies, errors


def _send_async(producer: Any, new_message: Any, count: int, in_flight: int) -> tuple[list[float], int]:
    """At most ``in_flight`` sends without their callback (which comes on a native thread)."""
    window = threading.BoundedSemaphore(in_flight)
    settled = threading.Condition()
    latencies: list[float] = []
    outstanding = [0]

    def finish(started: float | None) -> None:
        with settled:
            if started is not None:
                latencies.append(time.perf_counter() - started)
            outstanding[0] -= 1
            settled.notify_all()
        window.release()

    for _ in range(count):
        if not window.acquire(timeout=SEND_TIMEOUT_MILLISECONDS / 1000 * 2):
            break
        message = new_message()
        started = time.perf_counter()
        with settled:
            outstanding[0] += 1
        try:
            # the message is kept alive by the callbacks' closure until the client is done with it
            producer.send_async(message, lambda _result, s=started, m=message: finish(s),
                                lambda _error, m=message: finish(None))
        except Exception:  # the binding raises its own exception classes only
            finish(None)
    with settled:
        settled.wait_for(lambda: outstanding[0] == 0, timeout=SEND_TIMEOUT_MILLISECONDS / 1000 * 2)
        # failed, never sent (the window did not open in time) or without a callback yet: all errors
        return list(latencies), count - len(latencies)


def run(arguments: argparse.Namespace) -> None:
    from rocketmq.client import Message, Producer

    body = printable_body(BODY_SIZE_BYTES)

    def new_message() -> Any:
        message = Message(arguments.topic)
        message.set_tags("bench")
        message.set_body(body)
        return message

    producer = Producer(GROUP, timeout=SEND_TIMEOUT_MILLISECONDS)
    producer.set_namesrv_addr(arguments.namesrv)
    producer.start()
    producer.send_sync(new_message())  # the route lookup and the first connection: not measured
    _emit(sys.stdout, "ready", pid=os.getpid())
    if not sys.stdin.readline():
        return
    started = time.perf_counter()
    if arguments.mode == "sync":
        latencies, errors = _send_sync(producer, new_message, arguments.count)
    else:
        latencies, errors = _send_async(producer, new_message, arguments.count, arguments.in_flight)
    seconds = time.perf_counter() - started
    _emit(sys.stdout, "result", client="cpp", cpp_mode=arguments.mode,
          in_flight=1 if arguments.mode == "sync" else arguments.in_flight,
          **produce_figures(latencies, errors, seconds, BODY_SIZE_BYTES))
    sys.stdin.read()  # the caller sampled the CPU: wait for the end of our input
    stopped = threading.Thread(target=producer.shutdown, name="cpp-shutdown", daemon=True)
    stopped.start()
    stopped.join(SHUTDOWN_TIMEOUT_SECONDS)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--namesrv", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--mode", choices=MODES, required=True)
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--in-flight", type=int, default=256, help="async: sends awaiting their callback")
    parser.add_argument("--deadline-seconds", type=float, default=DEADLINE_SECONDS)
    arguments = parser.parse_args()
    watchdog = threading.Timer(arguments.deadline_seconds, os._exit, (3,))
    watchdog.daemon = True
    watchdog.start()
    run(arguments)
    sys.stdout.flush()
    # skip interpreter teardown, where the binding's __del__ methods shut the native client down a second
    # time and its threads can hang or crash the exit
    os._exit(0)


if __name__ == "__main__":
    main()
