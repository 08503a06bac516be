"""The continuous audit checks across rounds (spark_analytics.rounds): a round reads each replica from the
segment the previous cut fell in, yet a UNIQ_KEY stored twice within the window, or a store timestamp going
back, with the earlier record in an older segment, is still found. The members are served in this process
(the member API over each store, as ``bench/verify_bench.py`` serves them), so the test controls exactly
what is appended between rounds."""

from __future__ import annotations

import asyncio
import io
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from pyspark.sql import SparkSession

from broker.remoting.server import RemotingServer
from broker.replica_files import REPLICA_FILES_CODES, ReplicaFilesProcessor
from commitlog.message import MessageInput
from commitlog.store import MessageStore
from spark_analytics.live import audit_continuously
from spark_analytics.remote import Access
from tests.commitlog.helpers import message, small_config

SECRET = b"rounds-test-group-secret-0123456789"
MEMBERS = ("n0", "n1")
#: store timestamps of tests.commitlog.helpers.message: 1_700_000_100_000 + number * 10
BASE_TIMESTAMP = 1_700_000_100_000


class ServedMember:
    def __init__(self, name: str, store: MessageStore) -> None:
        self.name = name
        self.store = store

    def status(self) -> SimpleNamespace:
        applied = self.store.applied_raft_index
        return SimpleNamespace(node_id=self.name, role="follower", commit_index=applied, applied_index=applied)


class Group:
    """Stores appended to alike, each served by a remoting server on a loop in a thread."""

    def __init__(self, root: Path) -> None:
        self.stores = [MessageStore(small_config(root / name / "store"), background_flush=False) for name in MEMBERS]
        self.raft_index = 0
        self.loop = asyncio.new_event_loop()
        self.servers: list[RemotingServer] = []
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        for name, store in zip(MEMBERS, self.stores, strict=True):
            server = RemotingServer("127.0.0.1", 0)
            server.register(REPLICA_FILES_CODES, ReplicaFilesProcessor(ServedMember(name, store), SECRET,
                                                                       lambda: False),
                            queue_max=64, workers=4, name="replica-files")
            asyncio.run_coroutine_threadsafe(server.start(), self.loop).result(10)
            self.servers.append(server)
        self.addresses = [f"127.0.0.1:{server.port}" for server in self.servers]

    def append(self, messages: list[MessageInput]) -> list[int]:
        """Append to every store; the physical offsets (alike on every store)."""
        self.raft_index += 1
        offsets: list[int] = []
        for store in self.stores:
            results = store.append(self.raft_index, messages).results
            store.flush()
            offsets = [result.physical_offset for result in results]
        return offsets

    def close(self) -> None:
        for server in self.servers:
            asyncio.run_coroutine_threadsafe(server.stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        for store in self.stores:
            store.close()


@pytest.fixture
def group(tmp_path: Path) -> Iterator[Group]:
    served = Group(tmp_path)
    yield served
    served.close()


def findings(report: dict[str, Any], invariant: str) -> tuple[int, list[int]]:
    """Violations of ``invariant`` on the first replica, and the offsets of its examples."""
    replica = report["integrity"]["replicas"][0]
    found = next(result for result in replica["invariants"] if result["name"] == invariant)
    return found["violations"], [example["physical_offset"] for example in found["examples"]]


@pytest.mark.slow
def test_a_copy_and_a_timestamp_going_back_across_rounds_are_found(spark: SparkSession, group: Group,
                                                                   tmp_path: Path) -> None:
    body = bytes(1000)
    # round 1: three segments (128 KiB each); message 10 (the one copied later) and message 20, stored
    # 60 s ahead of the rest (a leader's clock that jumped), both in the first segment
    first = [message(number, body=body) for number in range(300)]
    first[20] = first[20]._replace(store_timestamp=BASE_TIMESTAMP + 60_000)
    offsets = [offset for low in range(0, 300, 50) for offset in group.append(first[low : low + 50])]
    segment_size = group.stores[0].config.segment_size_bytes
    assert offsets[20] < segment_size < 2 * segment_size < offsets[-1]
    added: list[int] = []

    def between_rounds(_: float) -> None:
        # round 2 starts at the segment the first cut fell in (the third): message 10 and message 20 are
        # before it. A copy of message 10, 4 s later (within the window), and more messages, all stored
        # before message 20's timestamp
        copy = message(10, body=body)._replace(store_timestamp=BASE_TIMESTAMP + 4_000)
        added.extend(group.append([message(number, body=body) for number in range(300, 340)] + [copy]))

    output = io.StringIO()
    access = Access.from_secret(SECRET)
    worst = audit_continuously(group.addresses, lambda: access, tmp_path, 0.0, rounds_max=2, sleep=between_rounds,
                               output=output)
    assert worst == 1, output.getvalue()  # round 1 finds the timestamps after message 20 already
    reports = sorted(tmp_path.glob("verify-report-*.json"), key=lambda path: int(path.stem.rsplit("-", 1)[1]))
    first_round, second_round = (json.loads(path.read_text()) for path in reports)
    assert second_round["live"]["since"] == first_round["live"]["cut"] > 2 * segment_size
    assert second_round["byte_equality"]["ok"] and second_round["byte_equality"]["hashed_by"] == "members"
    # the copy is compared with message 10, which round 2 did not read
    count, examples = findings(second_round, "unique_keys")
    assert count == 1 and examples == [added[-1]]
    detail = next(result for result in second_round["integrity"]["replicas"][0]["invariants"]
                  if result["name"] == "unique_keys")["examples"][0]["detail"]
    assert f"already stored at physical offset {offsets[10]}" in detail
    # every message round 2 read was stored before message 20's timestamp, which round 2 did not read
    count, _ = findings(second_round, "store_timestamps")
    read_in_round_2 = sum(1 for offset in offsets if offset >= 2 * segment_size) + len(added)
    assert count == read_in_round_2
    assert first_round["integrity"]["replicas"][0]["ok"] is False
    assert findings(first_round, "unique_keys")[0] == 0
