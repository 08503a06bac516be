"""Drive the stock C++ client (PyPI ``rocketmq==0.4.4``, librocketmq 1.2.x) in a process of its own.

    python -m tests.interop.cpp_driver produce --namesrv H:P --topic T --group G --mode sync --count 20 --out F
    python -m tests.interop.cpp_driver consume --namesrv H:P --topic T --group G --expect 20 --out F

The native client can crash, hang at shutdown or leave threads behind, so tests only ever run it
through this module in a subprocess (with ``$HOME`` pointed at a temporary directory: it logs to
``$HOME/logs/rocketmq-cpp/`` and keeps broadcasting offsets under ``$HOME/.rocketmq_offsets/``).

Output: one JSON line per event, appended to ``--out`` and flushed at once, so a test can read
progress while the process runs and keep what it wrote if it dies:

- ``produce``: ``{"event": "ack", ...}`` per acknowledged send (``msg_id``, ``body``, ``queue_id``,
  ``queue_offset``, ``tags``, ``keys``, ``shard``, ``sequence``, ``mode``, ``status``); ``{"event":
  "sent", ...}`` per oneway send (no acknowledgement exists); ``{"event": "error", ...}`` per failed
  send; ``{"event": "done", ...}`` at the end.
  The C++ API's send result holds no queue id: ``queue_id`` is known only for orderly sends (the
  selector here chooses it) and is null otherwise.
- ``consume``: ``{"event": "started"}`` once the consumer started, ``{"event": "delivery", ...}`` per
  message handed to the listener (``msg_id``, ``uniq_key``, ``body``, ``queue_id``, ``queue_offset``,
  ``tags``, ``keys``, ``reconsume_times``, ``delay_level``, ``store_timestamp``, ``born_timestamp``,
  ``seen`` = the process-wide delivery number), ``{"event": "stopping", "reason": ...}`` and
  ``{"event": "stopped"}`` around the client's shutdown.

``--access-key`` / ``--secret-key`` (both commands) set ACL session credentials
(``set_session_credentials``, channel ``--channel``, default ``ALIYUN`` as the client's own default): the
client then signs every request as RocketMQ's ACL hook does.

Bodies are ``<run>|<index>|<shard>|<sequence>`` texts: unique within a run, NUL-free (the binding sends
bodies as C strings), and they carry the sharding key and the sequence within it for order checks.
Exit status: 0 when every send was acknowledged (produce) or ``--expect`` deliveries were seen
(consume), 1 otherwise, 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import random
import re
import signal
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import IO, Any, Final

PRODUCE_MODES: Final = ("sync", "async", "oneway", "batch", "orderly", "oneway_orderly")
MESSAGE_MODELS: Final = {"clustering": 1, "broadcasting": 0}
#: librocketmq's log levels (ffi._CLogLevel)
LOG_LEVELS: Final = {"fatal": 1, "error": 2, "warn": 3, "info": 4, "debug": 5, "trace": 6}
NATIVE_LOG_POLL_SECONDS: Final = 0.05


class EventLog:
    """JSON lines appended to one file, written whole and flushed under a lock (native threads call in)."""

    def __init__(self, path: Path) -> None:
        self._file: IO[str] = path.open("a", encoding="utf-8")
        self._lock = threading.Lock()

    def write(self, event: str, **fields: object) -> None:
        line = json.dumps({"event": event, **fields}, sort_keys=True)
        with self._lock:
            self._file.write(line + "\n")
            self._file.flush()

    def close(self) -> None:
        with self._lock:
            self._file.close()


@dataclass(frozen=True, slots=True)
class PlannedMessage:
    """One message to send: the body says which run, index, shard and place in the shard it is."""

    index: int
    shard: int
    sequence: int
    tags: str
    keys: str

    def body(self, run: str) -> str:
        return f"{run}|{self.index}|{self.shard}|{self.sequence}"


def plan_messages(count: int, tags: list[str], shards: int, seed: int) -> list[PlannedMessage]:
    """``count`` messages; tags cycle through ``tags``; shards are drawn with a seeded generator so a
    shard's messages interleave with others' (sequence = place within the shard)."""
    chooser = random.Random(seed)
    next_sequence = [0] * max(shards, 1)
    planned = []
    for index in range(count):
        shard = chooser.randrange(max(shards, 1))
        planned.append(PlannedMessage(index, shard, next_sequence[shard], tags[index % len(tags)],
                                      f"key-{index}"))
        next_sequence[shard] += 1
    return planned


def _text(value: object) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def _set_credentials(client: Any, arguments: argparse.Namespace) -> None:
    if arguments.access_key is not None:
        client.set_session_credentials(arguments.access_key, arguments.secret_key, arguments.channel)


def _set_log_level(setter_name: str, handle: object, level: str | None) -> None:
    if level is None:
        return
    from rocketmq.ffi import dll

    getattr(dll, setter_name)(handle, LOG_LEVELS[level])


# -------------------------------------------------------------------------------------------- produce


def produce(arguments: argparse.Namespace) -> int:
    from rocketmq.client import Message, Producer

    log = EventLog(arguments.out)
    tags = arguments.tags.split(",") if arguments.tags else [""]
    planned = plan_messages(arguments.count, tags, arguments.shards, arguments.seed)
    producer = Producer(arguments.group, timeout=arguments.send_timeout_ms)
    _set_log_level("SetProducerLogLevel", producer._handle, arguments.log_level)
    producer.set_namesrv_addr(arguments.namesrv)
    _set_credentials(producer, arguments)
    producer.start()
    log.write("started", pid=_pid())

    def message_for(item: PlannedMessage) -> Any:
        message = Message(arguments.topic)
        if item.tags:
            message.set_tags(item.tags)
        message.set_keys(item.keys)
        message.set_body(item.body(arguments.run))
        if arguments.delay_level:
            message.set_delay_time_level(arguments.delay_level)
        return message

    def describe(item: PlannedMessage) -> dict[str, object]:
        return {"mode": arguments.mode, "index": item.index, "body": item.body(arguments.run),
                "tags": item.tags or None, "keys": item.keys, "shard": item.shard, "sequence": item.sequence,
                "delay_level": arguments.delay_level}

    def ack(item: PlannedMessage, result: Any, queue_id: int | None, sent_at: int | None = None) -> None:
        """``sent_at``: this process's wall clock just before the send (ms), as ``received_at`` is the
        consumer's: the C++ client stamps ``born_timestamp`` with its own clock."""
        log.write("ack", msg_id=result.msg_id, queue_offset=result.offset, queue_id=queue_id,
                  status=result.status.name, sent_at=sent_at, **describe(item))

    errors = 0
    if arguments.mode == "batch":
        for start in range(0, len(planned), arguments.batch_size):
            chunk = planned[start:start + arguments.batch_size]
            try:
                result = producer.send_batch([message_for(item) for item in chunk])
            except Exception as error:  # the binding raises its own exception classes only
                errors += len(chunk)
                for item in chunk:
                    log.write("error", error=f"{type(error).__name__}: {error}", **describe(item))
                continue
            ids = result.msg_id.split(",")
            for position, item in enumerate(chunk):
                log.write("ack", msg_id=ids[position] if len(ids) == len(chunk) else None,
                          batch_msg_id=result.msg_id, queue_offset=result.offset + position, queue_id=None,
                          status=result.status.name, batch_start=chunk[0].index, **describe(item))
    elif arguments.mode == "async":
        errors = _produce_async(producer, planned, message_for, describe, ack, log, arguments)
    else:
        chosen: list[int] = []

        def select(queue_count: int, _message: object, argument: object) -> int:
            """The binding's default selector (sharding key % queue count), remembering its choice."""
            shard = int(ctypes.cast(argument, ctypes.POINTER(ctypes.c_int))[0])  # type: ignore[arg-type]
            chosen.append(shard % queue_count)
            return shard % queue_count

        for item in planned:
            try:
                message = message_for(item)
                if arguments.mode == "sync":
                    sent_at = int(time.time() * 1000)
                    ack(item, producer.send_sync(message), None, sent_at)
                elif arguments.mode == "orderly":
                    result = producer.send_orderly(message, item.shard, retry_times=arguments.retries,
                                                   queue_selector=select)
                    ack(item, result, chosen[-1])
                elif arguments.mode == "oneway":
                    producer.send_oneway(message)
                    log.write("sent", msg_id=None, queue_id=None, **describe(item))
                else:  # oneway_orderly
                    producer.send_oneway_orderly(message, item.shard, queue_selector=select)
                    log.write("sent", msg_id=None, queue_id=chosen[-1], **describe(item))
            except Exception as error:  # the binding raises its own exception classes only
                errors += 1
                log.write("error", error=f"{type(error).__name__}: {error}", **describe(item))
    log.write("done", errors=errors, planned=len(planned))
    _shutdown(producer.shutdown, log, arguments.shutdown_timeout_seconds)
    log.close()
    return 0 if errors == 0 else 1


def _produce_async(producer: Any, planned: list[PlannedMessage], message_for: Any, describe: Any, ack: Any,
                   log: EventLog, arguments: argparse.Namespace) -> int:
    """Every send in flight at once; wait (bounded) until each got its callback."""
    finished = threading.Condition()
    outcomes: dict[int, bool] = {}
    keep_alive = []  # the binding frees a Message when its wrapper is collected

    for item in planned:
        def on_success(result: Any, item: PlannedMessage = item) -> None:
            ack(item, result, None)
            with finished:
                outcomes[item.index] = True
                finished.notify_all()

        def on_exception(error: Exception, item: PlannedMessage = item) -> None:
            log.write("error", error=f"{type(error).__name__}: {error}", **describe(item))
            with finished:
                outcomes[item.index] = False
                finished.notify_all()

        message = message_for(item)
        keep_alive.append(message)
        try:
            producer.send_async(message, on_success, on_exception)
        except Exception as error:  # the binding raises its own exception classes only
            on_exception(error)
    with finished:
        finished.wait_for(lambda: len(outcomes) == len(planned), timeout=arguments.deadline_seconds)
    missing = [item.index for item in planned if item.index not in outcomes]
    if missing:
        log.write("error", error="no callback before the deadline", indexes=missing, mode="async")
    return len(missing) + sum(1 for ok in outcomes.values() if not ok)


# ------------------------------------------------------------------------------------- native log tail

#: lines of librocketmq's INFO log that say which queues this client pulls (RebalancePush)
_ADDED: Final = re.compile(
    r"add mq:MessageQueue \[topic=(?P<topic>[^,]*), brokerName=(?P<broker>[^,]*), queueId=(?P<queue>\d+)\], "
    r"request initiall offset:(?P<offset>-?\d+)"
)
#: a queue dropped earlier and allocated again reuses its old pull request (no "add mq" line then)
_RESUMED: Final = re.compile(
    r"after resume the pull handle of this pullRequest, its mq is:MessageQueue \[topic=(?P<topic>[^,]*), "
    r"brokerName=(?P<broker>[^,]*), queueId=(?P<queue>\d+)\], its offset is:(?P<offset>-?\d+)"
)
_DROPPED: Final = re.compile(
    r"drop mq:MessageQueue \[topic=(?P<topic>[^,]*), brokerName=(?P<broker>[^,]*), queueId=(?P<queue>\d+)\]"
)
_CONSUMER_ID: Final = re.compile(r"client id:(?P<client>\S+) of topic:(?P<topic>\S+)\[doRebalance")
_LOCKED: Final = re.compile(
    r"(?P<what>unlockBatchMQ|lockBatchMQ|unlock|lock) success of mq:MessageQueue \[topic=(?P<topic>[^,]*), "
    r"brokerName=(?P<broker>[^,]*), queueId=(?P<queue>\d+)\]"
)


def native_log_path(pid: int) -> Path:
    """Where librocketmq 1.2.x writes this process's log (``$HOME/logs/rocketmq-cpp/<pid>_...``)."""
    return Path.home() / "logs" / "rocketmq-cpp" / f"{pid}_rocketmq-cpp.log.0"


class NativeLogTail(threading.Thread):
    """Turn the native client's queue assignment log lines into events, so a test can wait until a
    rebalance settled (which queues each consumer pulls, from which offset) instead of sleeping."""

    def __init__(self, path: Path, topic: str, log: EventLog, stop: threading.Event) -> None:
        super().__init__(name="native-log-tail", daemon=True)
        self._path = path
        self._topic = topic
        self._log = log
        self._finished = stop

    def run(self) -> None:
        position = 0
        pending = ""
        while True:
            stopping = self._finished.is_set()
            if self._path.exists():
                with self._path.open("rb") as source:
                    source.seek(position)
                    chunk = source.read()
                position += len(chunk)
                pending += chunk.decode("utf-8", "replace")
                *lines, pending = pending.split("\n")
                for line in lines:
                    self._parse(line)
            if stopping:
                return
            self._finished.wait(NATIVE_LOG_POLL_SECONDS)

    def _parse(self, line: str) -> None:
        added = _ADDED.search(line) or _RESUMED.search(line)
        if added and added["topic"] == self._topic:
            self._log.write("queue_added", topic=added["topic"], broker_name=added["broker"],
                            queue_id=int(added["queue"]), offset=int(added["offset"]))
        elif (dropped := _DROPPED.search(line)) and dropped["topic"] == self._topic:
            self._log.write("queue_dropped", topic=dropped["topic"], broker_name=dropped["broker"],
                            queue_id=int(dropped["queue"]))
        elif (consumer := _CONSUMER_ID.search(line)) and consumer["topic"] == self._topic:
            self._log.write("consumer_id_seen", client_id=consumer["client"])
        elif (locked := _LOCKED.search(line)) and locked["topic"] == self._topic:
            self._log.write("queue_unlocked" if locked["what"].startswith("unlock") else "queue_locked",
                            topic=locked["topic"], broker_name=locked["broker"], queue_id=int(locked["queue"]))


# -------------------------------------------------------------------------------------------- consume


def consume(arguments: argparse.Namespace) -> int:
    from rocketmq.client import PushConsumer

    log = EventLog(arguments.out)
    stop = threading.Event()
    reason: list[str] = []
    lock = threading.Lock()
    bodies: set[bytes] = set()
    seen = [0]

    def request_stop(signal_number: int, _frame: FrameType | None) -> None:
        reason.append(signal.Signals(signal_number).name)
        stop.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)

    def on_message(message: Any) -> None:
        body = message.body
        with lock:
            seen[0] += 1
            number = seen[0]
            bodies.add(body)
            enough = 0 < arguments.expect <= len(bodies)
        log.write(
            "delivery", seen=number, msg_id=message.id, uniq_key=_text(message.get_property("UNIQ_KEY")),
            body=_text(body), queue_id=message.queue_id, queue_offset=message.queue_offset,
            tags=_text(message.tags), keys=_text(message.keys), reconsume_times=message.reconsume_times,
            delay_level=message.delay_time_level, store_timestamp=message.store_timestamp,
            born_timestamp=message.born_timestamp, received_at=int(time.time() * 1000),
            thread=threading.get_ident(),
        )
        if enough and not stop.is_set():
            reason.append("expected deliveries seen")
            stop.set()

    consumer = PushConsumer(arguments.group, orderly=arguments.orderly,
                            message_model=MESSAGE_MODELS[arguments.model])
    _set_log_level("SetPushConsumerLogLevel", consumer._handle, arguments.log_level)
    consumer.set_namesrv_addr(arguments.namesrv)
    consumer.set_instance_name(arguments.instance)
    _set_credentials(consumer, arguments)
    if arguments.threads:
        consumer.set_thread_count(arguments.threads)
    consumer.subscribe(arguments.topic, on_message, expression=arguments.expression)
    tail_stop = threading.Event()
    tail = NativeLogTail(native_log_path(_pid()), arguments.topic, log, tail_stop)
    tail.start()
    consumer.start()
    log.write("started", pid=_pid(), instance=arguments.instance)
    if not stop.wait(arguments.deadline_seconds):
        reason.append("deadline")
    log.write("stopping", reason=reason[0] if reason else "unknown", distinct=len(bodies), seen=seen[0])
    _shutdown(consumer.shutdown, log, arguments.shutdown_timeout_seconds)
    tail_stop.set()
    tail.join(timeout=1.0)
    log.close()
    return 0 if arguments.expect <= len(bodies) else 1


# ------------------------------------------------------------------------------------------- plumbing


def _pid() -> int:
    return os.getpid()


def _shutdown(shutdown: Any, log: EventLog, timeout_seconds: float) -> None:
    """Run the client's shutdown on a daemon thread: it can hang, and the caller kills us if it does."""
    done = threading.Event()

    def run() -> None:
        try:
            shutdown()
        finally:
            done.set()

    threading.Thread(target=run, name="cpp-shutdown", daemon=True).start()
    if done.wait(timeout_seconds):
        log.write("stopped")
    else:
        log.write("shutdown_hung", timeout_seconds=timeout_seconds)


def read_events(path: Path) -> Iterator[dict[str, Any]]:
    """The complete lines of a driver's output so far (a partly written last line is skipped)."""
    if not path.exists():
        return
    with path.open(encoding="utf-8") as source:
        for line in source:
            if line.endswith("\n"):
                yield json.loads(line)


def parse_arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tests.interop.cpp_driver")
    commands = parser.add_subparsers(dest="command", required=True)
    for name in ("produce", "consume"):
        command = commands.add_parser(name)
        command.add_argument("--namesrv", required=True, help="name server address, host:port")
        command.add_argument("--topic", required=True)
        command.add_argument("--group", required=True)
        command.add_argument("--out", type=Path, required=True, help="append JSON lines here")
        command.add_argument("--deadline-seconds", type=float, default=60.0)
        command.add_argument("--shutdown-timeout-seconds", type=float, default=15.0)
        command.add_argument("--log-level", choices=sorted(LOG_LEVELS), default=None)
        command.add_argument("--access-key", default=None, help="ACL access key (with --secret-key)")
        command.add_argument("--secret-key", default=None, help="ACL secret key")
        command.add_argument("--channel", default="ALIYUN", help="ACL channel (OnsChannel)")
    produce_command = commands.choices["produce"]
    produce_command.add_argument("--mode", choices=PRODUCE_MODES, required=True)
    produce_command.add_argument("--count", type=int, required=True)
    produce_command.add_argument("--run", default="run", help="prefix of every body (unique per test)")
    produce_command.add_argument("--tags", default="", help="comma-separated tags, used in turn")
    produce_command.add_argument("--shards", type=int, default=1, help="sharding keys for orderly modes")
    produce_command.add_argument("--seed", type=int, default=0)
    produce_command.add_argument("--batch-size", type=int, default=8)
    produce_command.add_argument("--delay-level", type=int, default=0)
    produce_command.add_argument("--retries", type=int, default=3, help="orderly sends' retry times")
    produce_command.add_argument("--send-timeout-ms", type=int, default=5000)
    consume_command = commands.choices["consume"]
    consume_command.add_argument("--model", choices=sorted(MESSAGE_MODELS), default="clustering")
    consume_command.add_argument("--expression", default="*", help="tag expression, e.g. 'A||B'")
    consume_command.add_argument("--orderly", action="store_true")
    consume_command.add_argument("--expect", type=int, default=0,
                                 help="stop after this many distinct bodies (0: run until SIGTERM or deadline)")
    consume_command.add_argument("--instance", default="interop", help="client instance name")
    consume_command.add_argument("--threads", type=int, default=0)
    arguments = parser.parse_args(argv)
    if arguments.command == "produce" and (arguments.count < 0 or arguments.batch_size < 1):
        parser.error("--count must be >= 0 and --batch-size >= 1")
    if (arguments.access_key is None) != (arguments.secret_key is None):
        parser.error("--access-key and --secret-key go together")
    return arguments


def main(argv: list[str] | None = None) -> int:
    arguments = parse_arguments(argv)
    started = time.monotonic()
    status = produce(arguments) if arguments.command == "produce" else consume(arguments)
    print(json.dumps({"command": arguments.command, "status": status,
                      "seconds": round(time.monotonic() - started, 3)}), flush=True)
    sys.stdout.flush()
    return status


if __name__ == "__main__":
    # os._exit: skip interpreter teardown, where the binding's __del__ methods shut the native client
    # down a second time and its threads can hang or crash the exit
    os._exit(main())
