"""The pieces that decide which offset is committed: the process queue, and the local offsets file."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from client.errors import MQClientError
from client.message import MessageExt, MessageQueue
from client.offset_store import LocalFileOffsetStore, read_offsets_file, write_offsets_file
from client.process_queue import ProcessQueue

QUEUE = MessageQueue("T", "broker-a", 0)


def message(offset: int) -> MessageExt:
    return MessageExt(
        topic="T", body=b"x", queue_id=0, queue_offset=offset, commit_log_offset=offset * 100,
        msg_id=f"id{offset}", offset_msg_id=f"o{offset}", properties={}, born_timestamp_ms=0,
        store_timestamp_ms=0, born_host="", store_host="", reconsume_times=0, sys_flag=0, flag=0,
        prepared_transaction_offset=0,
    )


def test_commit_offset_waits_for_the_oldest_unconsumed_message() -> None:
    async def scenario() -> None:
        queue = ProcessQueue(QUEUE, threshold=3)
        queue.put([message(5), message(6), message(7)])
        assert not await queue.wait_for_space(0.01)  # at the threshold: pulling pauses
        assert queue.remove([message(6)]) == 5  # 5 is still running: commit stays at 5
        assert await queue.wait_for_space(0.01)
        assert queue.remove([message(5)]) == 7
        assert queue.remove([message(7)]) == 8  # everything consumed: one past the last pulled
        queue.drop()
        assert queue.remove([]) is None  # a dropped queue commits nothing

    asyncio.run(scenario())


def test_orderly_take_commit_and_rollback() -> None:
    async def scenario() -> None:
        queue = ProcessQueue(QUEUE, threshold=100)
        queue.put([message(offset) for offset in range(4)])
        assert [m.queue_offset for m in queue.take(2)] == [0, 1]
        assert queue.commit_offset() == 0
        queue.rollback()
        assert [m.queue_offset for m in queue.take(3)] == [0, 1, 2]
        assert queue.commit() == 3
        assert queue.count == 1

    asyncio.run(scenario())


def test_offsets_file_round_trips_and_rejects_damage(tmp_path: Path) -> None:
    path = tmp_path / "g" / "offsets.json"
    offsets = {QUEUE: 7, MessageQueue("U", "broker-b", 3): 11}
    write_offsets_file(path, "g", offsets)
    assert read_offsets_file(path) == offsets
    assert read_offsets_file(tmp_path / "missing.json") == {}
    document = json.loads(path.read_text())
    document["offsets"][0]["offset"] = 8
    path.write_text(json.dumps(document))
    with pytest.raises(MQClientError, match="CRC mismatch"):
        read_offsets_file(path)
    path.write_text('{"format": "other"}')
    with pytest.raises(MQClientError, match="not a raftmq"):
        read_offsets_file(path)


def test_local_store_persists_only_when_changed(tmp_path: Path) -> None:
    async def scenario() -> None:
        store = LocalFileOffsetStore(tmp_path, "g")
        await store.load()
        store.update(QUEUE, 4)
        store.update(QUEUE, 3)  # increase only
        await store.persist()
        assert read_offsets_file(store.path) == {QUEUE: 4}
        store.update(QUEUE, 2, increase_only=False)
        await store.persist()
        reloaded = LocalFileOffsetStore(tmp_path, "g")
        await reloaded.load()
        assert reloaded.read_memory(QUEUE) == 2

    asyncio.run(scenario())
