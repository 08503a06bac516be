"""What a consumer reports about itself (Java's ``ConsumerRunningInfo``): GET_CONSUMER_RUNNING_INFO, which
an admin sends to a broker and the broker passes to the consumer's connection (``mqadmin consumerStatus``).

The body is the reference clients' JSON, quirks included:

- ``mqTable`` maps each queue to its ``ProcessQueueInfo``, and the queue is the *key*: Java's fastjson and
  the C++ client write it as an object (``{{"brokerName":"b","queueId":0,"topic":"T"}:{...}}``), which is
  not standard JSON. :func:`loads_lenient` reads it (and we write it so, for Java's tools).
- The C++ client writes ``{"mqTable":},...`` when it holds no queue; :func:`decode_running_info` repairs
  exactly that.

:class:`ConsumeStats` keeps what ``statusTable`` reports per topic, over the last minute as Java's
``ConsumerStatsManager`` does: pull and consume rates, their mean times, and the failed messages of the
last hour.
"""

from __future__ import annotations

import importlib.metadata
import json
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from client.config import ConsumerConfig
from client.message import MessageQueue
from protocol.fastjson import object_keyed_json

#: ``ConsumerRunningInfo`` property names (Java's constants; the orderly one has no underscore there)
PROP_NAMESERVER_ADDR: Final = "PROP_NAMESERVER_ADDR"
PROP_THREADPOOL_CORE_SIZE: Final = "PROP_THREADPOOL_CORE_SIZE"
PROP_CONSUME_ORDERLY: Final = "PROP_CONSUMEORDERLY"
PROP_CONSUME_TYPE: Final = "PROP_CONSUME_TYPE"
PROP_CLIENT_VERSION: Final = "PROP_CLIENT_VERSION"
PROP_CONSUMER_START_TIMESTAMP: Final = "PROP_CONSUMER_START_TIMESTAMP"

#: the window of the rates and mean times (Java: the last minute's snapshot)
RATE_WINDOW_SECONDS: Final = 60
#: the window of ``consumeFailedMsgs`` (Java: the last hour)
FAILED_WINDOW_SECONDS: Final = 3600
#: a jstack answer is cut to this many characters
JSTACK_CHARS_MAX: Final = 1 << 20

_CPP_EMPTY_MQ_TABLE: Final = '{"mqTable":},'


class RunningInfoError(ValueError):
    """A running-info body that cannot be read."""


# ------------------------------------------------------------------------------------------ lenient JSON


class _Reader:
    """JSON with fastjson's extension: an object key may be any value. Such a key becomes its canonical
    JSON text (``json.dumps(key, sort_keys=True, separators=(",", ":"))``), so the result is plain JSON data."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.at = 0
        self.scalar = json.JSONDecoder().raw_decode

    def skip(self) -> None:
        text, at = self.text, self.at
        while at < len(text) and text[at] in " \t\r\n":
            at += 1
        self.at = at

    def peek(self) -> str:
        self.skip()
        if self.at >= len(self.text):
            raise RunningInfoError("unexpected end of the body")
        return self.text[self.at]

    def expect(self, char: str) -> None:
        if self.peek() != char:
            raise RunningInfoError(f"expected {char!r} at {self.at}, found {self.text[self.at]!r}")
        self.at += 1

    def value(self, depth: int = 0) -> Any:
        if depth > 64:
            raise RunningInfoError("the body nests too deep")
        char = self.peek()
        if char == "{":
            self.at += 1
            result: dict[str, Any] = {}
            if self.peek() == "}":
                self.at += 1
                return result
            while True:
                key = self.value(depth + 1)
                if not isinstance(key, str):
                    key = json.dumps(key, sort_keys=True, separators=(",", ":"))
                self.expect(":")
                result[key] = self.value(depth + 1)
                if self.peek() == ",":
                    self.at += 1
                    continue
                self.expect("}")
                return result
        if char == "[":
            self.at += 1
            items: list[Any] = []
            if self.peek() == "]":
                self.at += 1
                return items
            while True:
                items.append(self.value(depth + 1))
                if self.peek() == ",":
                    self.at += 1
                    continue
                self.expect("]")
                return items
        try:
            scalar, self.at = self.scalar(self.text, self.at)
        except ValueError as exc:
            raise RunningInfoError(f"not JSON at {self.at}: {exc}") from None
        if isinstance(scalar, (dict, list)):  # raw_decode cannot get here: brackets are handled above
            raise RunningInfoError(f"unexpected value at {self.at}")
        return scalar


def loads_lenient(text: str) -> Any:
    """Parse ``text`` as JSON that may have non-string object keys (see :class:`_Reader`)."""
    reader = _Reader(text)
    result = reader.value()
    reader.skip()
    if reader.at != len(text):
        raise RunningInfoError(f"extra data at {reader.at}")
    return result


# ------------------------------------------------------------------------------------------ statistics


class _Buckets:
    """Counts per whole second over a window: ``add`` at a time, ``total`` since a time."""

    __slots__ = ("_buckets", "_window")

    def __init__(self, window_seconds: int) -> None:
        self._window = window_seconds
        self._buckets: deque[list[float]] = deque()  # [second, *values]

    def add(self, now: float, *values: float) -> None:
        second = int(now)
        buckets = self._buckets
        if buckets and buckets[-1][0] == second:
            bucket = buckets[-1]
            for index, value in enumerate(values, start=1):
                bucket[index] += value
        else:
            buckets.append([second, *values])
        while buckets and buckets[0][0] <= second - self._window:
            buckets.popleft()

    def totals(self, now: float, width: int) -> list[float]:
        second = int(now)
        sums = [0.0] * width
        for bucket in self._buckets:
            if bucket[0] > second - self._window:
                for index in range(width):
                    sums[index] += bucket[index + 1]
        return sums


@dataclass
class _TopicStats:
    pulls: _Buckets = field(default_factory=lambda: _Buckets(RATE_WINDOW_SECONDS))  # (pulls, messages, rt ms)
    consumes: _Buckets = field(default_factory=lambda: _Buckets(RATE_WINDOW_SECONDS))  # (calls, ok, failed, rt)
    failures: _Buckets = field(default_factory=lambda: _Buckets(FAILED_WINDOW_SECONDS))


class ConsumeStats:
    """Pull and consume figures per topic (Java's ``ConsumerStatsManager``), for ``statusTable``."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._topics: dict[str, _TopicStats] = {}

    def _of(self, topic: str) -> _TopicStats:
        stats = self._topics.get(topic)
        if stats is None:
            stats = self._topics[topic] = _TopicStats()
        return stats

    def pulled(self, topic: str, messages: int, rt_ms: float) -> None:
        self._of(topic).pulls.add(self.clock(), 1, messages, rt_ms)

    def consumed(self, topic: str, messages: int, ok: bool, rt_ms: float) -> None:
        stats = self._of(topic)
        now = self.clock()
        stats.consumes.add(now, 1, messages if ok else 0, 0 if ok else messages, rt_ms)
        if not ok:
            stats.failures.add(now, messages)

    def status(self, topic: str) -> dict[str, float | int]:
        """Java's ``ConsumeStatus`` of ``topic``: per second and mean milliseconds over the last minute."""
        stats = self._topics.get(topic)
        if stats is None:
            return {"pullRT": 0.0, "pullTPS": 0.0, "consumeRT": 0.0, "consumeOKTPS": 0.0,
                    "consumeFailedTPS": 0.0, "consumeFailedMsgs": 0}
        now = self.clock()
        pulls, pulled, pull_rt = stats.pulls.totals(now, 3)
        calls, ok, failed, consume_rt = stats.consumes.totals(now, 4)
        (failed_hour,) = stats.failures.totals(now, 1)
        return {
            "pullRT": round(pull_rt / pulls, 3) if pulls else 0.0,
            "pullTPS": round(pulled / RATE_WINDOW_SECONDS, 3),
            "consumeRT": round(consume_rt / calls, 3) if calls else 0.0,
            "consumeOKTPS": round(ok / RATE_WINDOW_SECONDS, 3),
            "consumeFailedTPS": round(failed / RATE_WINDOW_SECONDS, 3),
            "consumeFailedMsgs": int(failed_hour),
        }


# ------------------------------------------------------------------------------------------ the body


@dataclass(frozen=True)
class ConsumerRunningInfo:
    """One consumer's answer. ``queues`` maps each queue it holds to Java's ``ProcessQueueInfo`` fields
    (commitOffset, cachedMsgCount, cachedMsgMinOffset, locked, lastPullTimestamp, ...); ``status`` maps each
    topic to ``ConsumeStatus`` (pullTPS, consumeOKTPS, consumeRT, ...)."""

    client_id: str
    properties: Mapping[str, str]
    subscriptions: tuple[Mapping[str, Any], ...]
    queues: Mapping[MessageQueue, Mapping[str, Any]]
    status: Mapping[str, Mapping[str, Any]]
    jstack: str = ""

    def to_json_object(self) -> dict[str, Any]:
        """Plain JSON (queues as a list, each with its topic, broker and id), for tools and ``--json``."""
        return {
            "clientId": self.client_id,
            "properties": dict(self.properties),
            "subscriptions": [dict(entry) for entry in self.subscriptions],
            "queues": [{"topic": queue.topic, "brokerName": queue.broker_name, "queueId": queue.queue_id, **info}
                       for queue, info in sorted(self.queues.items())],
            "status": {topic: dict(values) for topic, values in sorted(self.status.items())},
            "jstack": self.jstack,
        }


def consumer_properties(config: ConsumerConfig, namesrv_addresses: Iterable[str], client_id: str, *,
                        consume_type: str, orderly: bool, threads: int, start_ms: int) -> dict[str, str]:
    """``properties`` of a consumer's running info: Java's ``PROP_*`` entries and its configuration."""
    try:
        version = importlib.metadata.version("raftmq")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    return {
        PROP_NAMESERVER_ADDR: ";".join(namesrv_addresses),
        PROP_CONSUME_TYPE: consume_type,
        PROP_CONSUME_ORDERLY: "true" if orderly else "false",
        PROP_THREADPOOL_CORE_SIZE: str(threads),
        PROP_CONSUMER_START_TIMESTAMP: str(start_ms),
        PROP_CLIENT_VERSION: f"raftmq {version}",
        "consumerGroup": config.group,
        "messageModel": config.message_model.value,
        "consumeFromWhere": config.consume_from_where.value,
        "allocateMessageQueueStrategy": config.allocate_strategy.value,
        "pullBatchSize": str(config.pull_batch_size),
        "pullThresholdForQueue": str(config.pull_threshold_per_queue),
        "consumeMessageBatchMaxSize": str(config.consume_batch_max),
        "maxReconsumeTimes": str(config.max_reconsume_times),
        "clientId": client_id,
    }


def encode_running_info(properties: Mapping[str, str], subscriptions: Iterable[Mapping[str, Any]],
                        queues: Mapping[MessageQueue, Mapping[str, Any]], status: Mapping[str, Mapping[str, Any]],
                        jstack: str = "") -> bytes:
    """The body as Java writes it: ``mqTable`` keyed by queue objects (fastjson's form)."""

    table = object_keyed_json((queue.to_json_object(), info) for queue, info in sorted(queues.items()))
    rest = json.dumps({"properties": dict(properties), "subscriptionSet": [dict(entry) for entry in subscriptions],
                       "statusTable": {topic: dict(values) for topic, values in status.items()}, "jstack": jstack},
                      separators=(",", ":"), sort_keys=True)
    return ('{"mqTable":' + table + "," + rest[1:]).encode("utf-8")


def queue_of_key(key: str) -> MessageQueue:
    """The queue a fastjson map key names (as :func:`loads_lenient` gives it: the key object's JSON text)."""
    try:
        fields = json.loads(key)
        return MessageQueue(str(fields["topic"]), str(fields["brokerName"]), int(fields["queueId"]))
    except (ValueError, TypeError, KeyError) as exc:
        raise RunningInfoError(f"mqTable key {key[:200]!r} is not a message queue") from exc


def decode_running_info(client_id: str, body: bytes) -> ConsumerRunningInfo:
    """Read a consumer's answer (ours, Java's or the C++ client's). Raises :class:`RunningInfoError`."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RunningInfoError(f"the body is not UTF-8: {exc}") from None
    if text.startswith(_CPP_EMPTY_MQ_TABLE):  # the C++ client, holding no queue
        text = '{"mqTable":{},' + text[len(_CPP_EMPTY_MQ_TABLE):]
    value = loads_lenient(text)
    if not isinstance(value, dict):
        raise RunningInfoError("the body is not an object")

    def member(name: str, default: Any) -> Any:
        found = value.get(name)
        return default if found is None else found

    properties, subscriptions = member("properties", {}), member("subscriptionSet", [])
    table, status = member("mqTable", {}), member("statusTable", {})
    if not (isinstance(properties, dict) and isinstance(subscriptions, list) and isinstance(table, dict)
            and isinstance(status, dict)):
        raise RunningInfoError("properties, subscriptionSet, mqTable or statusTable has the wrong type")
    queues = {queue_of_key(key): (info if isinstance(info, dict) else {}) for key, info in table.items()}
    jstack = value.get("jstack")
    return ConsumerRunningInfo(
        client_id,
        {str(key): str(item) for key, item in properties.items()},
        tuple(entry for entry in subscriptions if isinstance(entry, dict)),
        queues,
        {str(topic): values for topic, values in status.items() if isinstance(values, dict)},
        jstack if isinstance(jstack, str) else "",
    )
