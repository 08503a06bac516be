"""What the C++ interop tests share: driver subprocesses, admin requests, and the delivery checks.

The stock client only ever runs in :mod:`tests.interop.cpp_driver` subprocesses, each with its own
``$HOME`` (its native log and broadcasting offsets land there). A :class:`DriverPool` owns every
process a test starts and ends them all at teardown, whatever happened; :meth:`DriverPool.report`
gathers each one's output and native log for the failure message.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections import Counter, defaultdict
from collections.abc import Awaitable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, TypeVar

from client import ConsumerConfig, PullConsumer
from client.message import MessageExt, PullStatus
from protocol.client import RemotingClient
from protocol.codes import RequestCode, ResponseCode
from protocol.command import RemotingCommand
from tests.interop.cpp_driver import read_events
from tests.support.waiting import wait_for

REPOSITORY: Final = Path(__file__).resolve().parents[2]
#: SIGTERM, then this long for the native client's shutdown, then SIGKILL
STOP_GRACE_SECONDS: Final = 10.0
#: lines of each native log and stderr quoted in a failure report
REPORT_TAIL_LINES: Final = 40
REQUEST_TIMEOUT_SECONDS: Final = 5.0
#: a driver ends itself after this long whatever happens (a backstop behind the pool's teardown)
DRIVER_DEADLINE_SECONDS: Final = 90.0
#: a driver gives the native client's shutdown this long before exiting anyway
DRIVER_SHUTDOWN_SECONDS: Final = 5.0

Result = TypeVar("Result")
Event = dict[str, Any]


# ----------------------------------------------------------------------------------------- processes


@dataclass
class Driver:
    """One ``cpp_driver`` subprocess and the files it writes."""

    name: str
    arguments: list[str]
    directory: Path
    process: subprocess.Popen[bytes]

    @property
    def out(self) -> Path:
        return self.directory / "events.jsonl"

    @property
    def home(self) -> Path:
        return self.directory / "home"

    def events(self, kind: str | None = None) -> list[Event]:
        return [event for event in read_events(self.out) if kind is None or event["event"] == kind]

    def running(self) -> bool:
        return self.process.poll() is None

    def wait_exit(self, timeout_seconds: float) -> int:
        """The exit status, polled until ``timeout_seconds`` (AssertionError naming the driver then)."""
        wait_for(lambda: not self.running(), f"{self.name} to exit", timeout_seconds=timeout_seconds)
        return int(self.process.returncode)

    def stop(self, timeout_seconds: float = STOP_GRACE_SECONDS) -> int:
        """SIGTERM (the driver shuts the client down cleanly); SIGKILL if it is still there after
        ``timeout_seconds``. Returns the exit status (negative: killed by that signal)."""
        if self.running():
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout_seconds)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return int(self.process.returncode)

    def report(self) -> str:
        """Command, status, stderr, events and native log tail: what a failure message needs."""
        lines = [f"=== {self.name}: {' '.join(self.arguments)}",
                 f"exit status: {self.process.poll()}"]
        stderr = self.directory / "stderr.txt"
        if stderr.exists():
            lines.append("--- stderr (tail)")
            lines.extend(stderr.read_text(errors="replace").splitlines()[-REPORT_TAIL_LINES:])
        events = self.events()
        counts = Counter(event["event"] for event in events)
        lines.append(f"--- events: {dict(counts)}")
        lines.extend(json.dumps(event) for event in events if event["event"] not in ("delivery", "ack", "sent"))
        lines.extend(json.dumps(event) for event in events if event["event"] in ("delivery", "ack", "sent"))
        for native_log in sorted((self.home / "logs" / "rocketmq-cpp").glob("*.log*")):
            lines.append(f"--- {native_log.name} (tail)")
            lines.extend(native_log.read_text(errors="replace").splitlines()[-REPORT_TAIL_LINES:])
        return "\n".join(lines)


@dataclass
class DriverPool:
    """Every driver of one test; :meth:`close` stops those still running (always called by the fixture)."""

    directory: Path
    drivers: list[Driver] = field(default_factory=list)

    def start(self, name: str, command: str, *, namesrv: str, topic: str, group: str,
              **options: object) -> Driver:
        """Start ``python -m tests.interop.cpp_driver <command>``; options become ``--flags``
        (``True`` is a bare flag, ``False``/``None`` are left out). Unless told otherwise a driver
        gives up after :data:`DRIVER_DEADLINE_SECONDS`, so none outlives a test run for long."""
        directory = self.directory / name
        (directory / "home").mkdir(parents=True)
        arguments = [sys.executable, "-m", "tests.interop.cpp_driver", command,
                     "--namesrv", namesrv, "--topic", topic, "--group", group,
                     "--out", str(directory / "events.jsonl")]
        options.setdefault("deadline_seconds", DRIVER_DEADLINE_SECONDS)
        options.setdefault("shutdown_timeout_seconds", DRIVER_SHUTDOWN_SECONDS)
        for key, value in options.items():
            flag = "--" + key.replace("_", "-")
            if value is True:
                arguments.append(flag)
            elif value is not None and value is not False:
                arguments.extend((flag, str(value)))
        environment = dict(os.environ, HOME=str(directory / "home"),
                           PYTHONPATH=os.pathsep.join(filter(None, (str(REPOSITORY), os.environ.get("PYTHONPATH")))))
        with (directory / "stdout.txt").open("wb") as stdout, (directory / "stderr.txt").open("wb") as stderr:
            process = subprocess.Popen(arguments, cwd=REPOSITORY, env=environment, stdout=stdout,
                                       stderr=stderr, stdin=subprocess.DEVNULL)
        driver = Driver(name, arguments[1:], directory, process)
        self.drivers.append(driver)
        return driver

    def report(self) -> str:
        return "\n".join(driver.report() for driver in self.drivers)

    def close(self) -> None:
        for driver in self.drivers:
            if driver.running():
                driver.process.send_signal(signal.SIGTERM)
        for driver in self.drivers:
            driver.stop()


# ---------------------------------------------------------------------------------- admin requests


def run_async(coroutine: Awaitable[Result], timeout_seconds: float = 30.0) -> Result:
    async def bounded() -> Result:
        async with asyncio.timeout(timeout_seconds):
            return await coroutine

    return asyncio.run(bounded())


def _split(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


async def request(address: str, code: int, fields: Mapping[str, str] | None = None,
                  body: bytes = b"") -> RemotingCommand:
    """One request on a fresh connection (what an admin tool does)."""
    host, port = _split(address)
    client = await RemotingClient.connect(host, port)
    try:
        return await client.request(code, fields, body, timeout_seconds=REQUEST_TIMEOUT_SECONDS)
    finally:
        await client.close()


def call(address: str, code: int, fields: Mapping[str, str] | None = None, body: bytes = b"") -> RemotingCommand:
    return run_async(request(address, code, fields, body))


def stored_messages(namesrv: str, topic: str) -> list[MessageExt]:
    """Every message of ``topic``, read queue by queue from offset 0 with raftmq's own pull consumer."""
    messages: list[MessageExt] = []
    with PullConsumer(namesrv, ConsumerConfig(group=f"{topic}_readers")) as reader:
        for queue in reader.fetch_subscribe_queues(topic):
            offset = 0
            while True:
                result = reader.pull(queue, "*", offset, 32)
                if result.status is not PullStatus.FOUND:
                    break
                messages.extend(result.messages)
                offset = result.next_begin_offset
    return messages


def member_ready(http_address: str) -> bool:
    """``GET /readyz`` of a member answers 200: it knows a leader and applied what the group committed."""
    try:
        with urllib.request.urlopen(f"http://{http_address}/readyz", timeout=2.0) as answer:
            return bool(answer.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def describe(response: RemotingCommand) -> str:
    return (f"code {response.code} remark {response.remark!r} fields {dict(response.ext_fields)} "
            f"body {response.body[:300]!r}")


def create_topic(broker_address: str, topic: str, queues: int) -> RemotingCommand:
    """UPDATE_AND_CREATE_TOPIC as ``mqadmin updateTopic`` sends it (read/write queues, perm RW)."""
    return call(broker_address, RequestCode.UPDATE_AND_CREATE_TOPIC, {
        "topic": topic, "defaultTopic": "TBW102", "readQueueNums": str(queues),
        "writeQueueNums": str(queues), "perm": "6", "topicFilterType": "SINGLE_TAG", "topicSysFlag": "0",
        "order": "false",
    })


def route(namesrv: str, topic: str) -> dict[str, Any] | None:
    """The name server's TopicRouteData for ``topic``, None while it has none."""
    response = call(namesrv, RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})
    if response.code != ResponseCode.SUCCESS:
        return None
    data: dict[str, Any] = json.loads(response.body)
    return data


def master_address(route_data: Mapping[str, Any]) -> str | None:
    for broker in route_data.get("brokerDatas", []):
        address = broker.get("brokerAddrs", {}).get("0")
        if address:
            return str(address)
    return None


def consumer_offset(broker_address: str, group: str, topic: str, queue_id: int) -> RemotingCommand:
    return call(broker_address, RequestCode.QUERY_CONSUMER_OFFSET,
                {"consumerGroup": group, "topic": topic, "queueId": str(queue_id)})


def max_offset(broker_address: str, topic: str, queue_id: int) -> RemotingCommand:
    return call(broker_address, RequestCode.GET_MAX_OFFSET, {"topic": topic, "queueId": str(queue_id)})


def lock_batch(broker_address: str, code: int, group: str, client_id: str,
               queues: Iterable[tuple[str, str, int]]) -> RemotingCommand:
    """LOCK_BATCH_MQ / UNLOCK_BATCH_MQ with the body the C++ client sends (``clientId``, ``mqSet``)."""
    body = {"consumerGroup": group, "clientId": client_id,
            "mqSet": [{"topic": topic, "brokerName": broker, "queueId": queue_id}
                      for topic, broker, queue_id in queues]}
    return call(broker_address, code, body=json.dumps(body).encode())


def locked_queue_ids(response: RemotingCommand) -> set[int]:
    assert response.code == ResponseCode.SUCCESS, describe(response)
    return {int(entry["queueId"]) for entry in json.loads(response.body or b"{}").get("lockOKMQSet", [])}


# ------------------------------------------------------------------------------------------ checks


def assignment(driver: Driver) -> set[int]:
    """The queues a consumer pulls now, from its native log (added minus dropped, in order)."""
    queues: set[int] = set()
    for event in driver.events():
        if event["event"] == "queue_added":
            queues.add(int(event["queue_id"]))
        elif event["event"] == "queue_dropped":
            queues.discard(int(event["queue_id"]))
    return queues


def bodies(events: Iterable[Event]) -> set[str]:
    return {str(event["body"]) for event in events}


def check_deliveries(sent: Sequence[Event], deliveries: Mapping[str, Sequence[Event]], *,
                     expected_bodies: set[str] | None = None, orderly: bool = False,
                     compare_offsets: bool = True) -> list[str]:
    """Every problem with one consumer group's deliveries (``deliveries`` per consumer, each in the
    order it consumed), against the sends (``ack`` and ``sent`` events):

    - each expected body (by default: every sent body) delivered exactly once in the group, nothing else;
    - what was delivered is what was sent: tags, keys, message id (the UNIQ_KEY), the queue id when
      the producer chose it, and the queue offset the send was acknowledged with;
    - per consumer and queue, queue offsets strictly increase in consumption order;
    - ``orderly``: per sharding key, the sequence numbers arrive in order (0, 1, 2, ...).
    """
    problems: list[str] = []
    by_body = {str(event["body"]): event for event in sent}
    wanted = set(by_body) if expected_bodies is None else expected_bodies
    counts = Counter(str(event["body"]) for events in deliveries.values() for event in events)
    missing = sorted(wanted - set(counts))
    if missing:
        problems.append(f"{len(missing)} of {len(wanted)} messages never delivered: {missing[:10]}")
    duplicated = sorted(body for body, count in counts.items() if count > 1)
    if duplicated:
        problems.append(f"{len(duplicated)} messages delivered more than once: "
                        f"{[(body, counts[body]) for body in duplicated[:10]]}")
    unexpected = sorted(set(counts) - wanted)
    if unexpected:
        problems.append(f"{len(unexpected)} deliveries of messages not expected here: {unexpected[:10]}")
    for consumer, events in deliveries.items():
        last_offset: dict[int, int] = {}
        next_sequence: dict[int, int] = defaultdict(int)
        for event in events:
            body = str(event["body"])
            queue_id, queue_offset = int(event["queue_id"]), int(event["queue_offset"])
            if queue_id in last_offset and queue_offset <= last_offset[queue_id]:
                problems.append(f"{consumer}: queue {queue_id} went from offset {last_offset[queue_id]} "
                                f"to {queue_offset} ({body})")
            last_offset[queue_id] = queue_offset
            if event.get("reconsume_times"):
                problems.append(f"{consumer}: {body} delivered with reconsume_times {event['reconsume_times']}")
            origin = by_body.get(body)
            if origin is None:
                continue
            for name in ("tags", "keys"):
                if event.get(name) != origin.get(name):
                    problems.append(f"{consumer}: {body} {name} {event.get(name)!r}, sent {origin.get(name)!r}")
            if origin.get("msg_id") and event.get("msg_id") != origin["msg_id"]:
                problems.append(f"{consumer}: {body} msg id {event.get('msg_id')}, acknowledged {origin['msg_id']}")
            if origin.get("queue_id") is not None and queue_id != origin["queue_id"]:
                problems.append(f"{consumer}: {body} in queue {queue_id}, sent to queue {origin['queue_id']}")
            if compare_offsets and origin.get("queue_offset") is not None and queue_offset != origin["queue_offset"]:
                problems.append(f"{consumer}: {body} at queue offset {queue_offset}, acknowledged at "
                                f"{origin['queue_offset']}")
            if orderly:
                shard, sequence = int(origin["shard"]), int(origin["sequence"])
                if sequence != next_sequence[shard]:
                    problems.append(f"{consumer}: sharding key {shard} delivered sequence {sequence}, "
                                    f"expected {next_sequence[shard]} ({body})")
                next_sequence[shard] = sequence + 1
    return problems
