"""What the stock C++ client puts on the wire, recorded by ``recorder.py`` (no raftmq broker involved).

These pin the quirks README.md lists and the broker has to accept, so a new client build that
changes them shows up here rather than as a puzzling broker failure.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import pytest

from protocol.batch import BATCH_HEAD
from tests.interop.harness import REPOSITORY, DriverPool, Event
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow

PROCESS_SECONDS: Final = 60.0
SEND, HEART_BEAT, UPDATE_OFFSET, LOCK, UNLOCK = 10, 34, 15, 41, 42


@pytest.fixture
def recorder(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A running recorder: its address and the file its frames go to."""
    frames, output = tmp_path / "frames.jsonl", tmp_path / "recorder.out"
    with output.open("wb") as stdout, (tmp_path / "recorder.err").open("wb") as stderr:
        process = subprocess.Popen([sys.executable, "-m", "tests.interop.recorder", "--log", str(frames)],
                                   cwd=REPOSITORY, stdout=stdout, stderr=stderr, stdin=subprocess.DEVNULL)
    try:

        def listening() -> str | None:
            assert process.poll() is None, f"the recorder exited with {process.returncode}"
            line = output.read_text()
            return f"127.0.0.1:{json.loads(line)['port']}" if line.endswith("\n") else None

        yield wait_for(listening, "the recorder to listen", timeout_seconds=30.0), frames
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def requests(frames: Path, code: int) -> list[Event]:
    found = []
    for line in frames.read_text().splitlines():
        entry: dict[str, Any] = json.loads(line)
        if entry["direction"] == "client->server" and entry["header"]["code"] == code:
            found.append(entry)
    return found


def test_what_the_cpp_client_sends(recorder: tuple[str, Path], drivers: DriverPool) -> None:
    address, frames = recorder
    topic, group = "wire", "wire_consumers"
    for mode in ("sync", "batch", "oneway"):
        producer = drivers.start(f"producer-{mode}", "produce", namesrv=address, topic=topic, group="wire_producers",
                                 mode=mode, count=2, run=mode, tags="TagA,TagB")
        assert producer.wait_exit(PROCESS_SECONDS) == 0
    reader = drivers.start("consumer", "consume", namesrv=address, topic=topic, group=group, orderly=True,
                           expression="TagA||TagB", expect=6)
    assert reader.wait_exit(PROCESS_SECONDS) == 0

    sends = requests(frames, SEND)
    assert len(sends) == 5  # 2 sync, 1 batch of 2, 2 oneway
    for send in sends:
        fields = send["header"]["extFields"]
        assert send["header"]["flag"] == 0, "oneway sends carry no oneway flag"
        assert send["header"]["language"] == "CPP" and send["header"]["version"] == 63
        assert isinstance(fields["queueId"], int) and isinstance(fields["sysFlag"], int)
        assert isinstance(fields["bornTimestamp"], str) and fields["defaultTopic"] == "TBW102"
    batch = [send for send in sends if send["header"]["extFields"]["batch"] == "1"]
    assert len(batch) == 1
    assert batch[0]["header"]["extFields"]["properties"] == "WAIT\x01true\x02"
    body = base64.b64decode(batch[0]["body_base64"])
    size, magic, crc, _flag, body_length = BATCH_HEAD.unpack_from(body, 0)
    assert (magic, crc) == (0, 0), "batch records carry neither the magic code nor the body CRC"
    assert body[20:20 + body_length] == b"batch|0|0|0" and size < len(body)

    # the consumer's heartbeat (the producer process heartbeats too, with an empty body or no consumers)
    heartbeat = next(frame["body_json"] for frame in requests(frames, HEART_BEAT)
                     if (frame.get("body_json") or {}).get("consumerDataSet"))
    consumer_data = heartbeat["consumerDataSet"][0]
    assert "producerDataSet" not in heartbeat
    assert (consumer_data["messageModel"], consumer_data["consumeType"], consumer_data["consumeFromWhere"]) == (1, 1, 0)
    subscription = next(item for item in consumer_data["subscriptionDataSet"] if item["topic"] == topic)
    assert subscription["tagsSet"] == ["TagA", "TagB"] and subscription["codeSet"] == [0, 0]
    assert "expressionType" not in subscription and isinstance(subscription["subVersion"], str)

    locks = requests(frames, LOCK)
    assert all(len(lock["body_json"]["mqSet"]) == 1 and "clientId" in lock["body_json"] for lock in locks)
    locked = {(item["topic"], item["queueId"]) for lock in locks for item in lock["body_json"]["mqSet"]}
    unlocked = {(item["topic"], item["queueId"]) for unlock in requests(frames, UNLOCK)
                for item in unlock["body_json"]["mqSet"]}
    assert len(locked - unlocked) == 1, f"unlockAll leaves out exactly one queue: {sorted(locked - unlocked)}"

    updates = requests(frames, UPDATE_OFFSET)
    assert updates and all(update["header"]["flag"] == 0 for update in updates)
    assert {update["header"]["extFields"]["queueId"] for update in updates if
            update["header"]["extFields"]["topic"] == topic} == {0, 1, 2, 3}
