"""Where a consumer keeps its progress (Java's ``OffsetStore``): on the brokers for a clustering
group (:class:`RemoteOffsetStore`, replicated by Raft there), in a local file for a broadcasting
consumer (:class:`LocalFileOffsetStore`).

An offset is the next message to consume. ``update`` changes memory only; ``persist`` writes the
offsets that changed since the last persist (periodically, when a queue is dropped, at shutdown).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import zlib
from collections.abc import Iterable
from pathlib import Path
from typing import Final, Protocol

from client.consumer_api import query_consumer_offset, update_consumer_offset
from client.errors import MQClientError
from client.instance import ClientInstance
from client.message import MessageQueue
from protocol.codes import ResponseCode

logger = logging.getLogger(__name__)

OFFSETS_FILE_FORMAT: Final = "raftmq-consumer-offsets"
OFFSETS_FILE_VERSION: Final = 1
OFFSETS_FILE_NAME: Final = "offsets.json"


class OffsetStore(Protocol):
    async def load(self) -> None: ...

    def update(self, queue: MessageQueue, offset: int, *, increase_only: bool = True) -> None: ...

    def read_memory(self, queue: MessageQueue) -> int | None: ...

    async def read_store(self, queue: MessageQueue) -> int | None: ...

    async def persist(self, queues: Iterable[MessageQueue] | None = None) -> None: ...

    def remove(self, queue: MessageQueue) -> None: ...

    def snapshot(self) -> dict[MessageQueue, int]: ...


class _MemoryTable:
    def __init__(self) -> None:
        self._offsets: dict[MessageQueue, int] = {}
        self._dirty: set[MessageQueue] = set()

    def update(self, queue: MessageQueue, offset: int, *, increase_only: bool = True) -> None:
        current = self._offsets.get(queue)
        if increase_only and current is not None and offset <= current:
            return
        if current != offset:
            self._offsets[queue] = offset
            self._dirty.add(queue)

    def read_memory(self, queue: MessageQueue) -> int | None:
        return self._offsets.get(queue)

    def remove(self, queue: MessageQueue) -> None:
        self._offsets.pop(queue, None)
        self._dirty.discard(queue)

    def snapshot(self) -> dict[MessageQueue, int]:
        return dict(self._offsets)


class RemoteOffsetStore(_MemoryTable):
    """Offsets on the brokers (QUERY_CONSUMER_OFFSET / UPDATE_CONSUMER_OFFSET to the leader)."""

    def __init__(self, instance: ClientInstance, group: str) -> None:
        super().__init__()
        self._instance = instance
        self._group = group

    async def load(self) -> None:
        return None

    async def read_store(self, queue: MessageQueue) -> int | None:
        offset = await query_consumer_offset(self._instance, self._group, queue)
        if offset is not None:
            self._offsets[queue] = offset
        return offset

    async def persist(self, queues: Iterable[MessageQueue] | None = None) -> None:
        """Commit the changed offsets (of ``queues``, or all); one failure does not stop the rest,
        and a queue whose commit failed stays dirty for the next persist."""
        wanted = set(self._dirty if queues is None else self._dirty.intersection(queues))
        deadline = self._instance.now() + self._instance.config.request_timeout_seconds * 2
        failures: list[str] = []
        for queue in sorted(wanted):
            offset = self._offsets.get(queue)
            if offset is None:
                continue
            self._dirty.discard(queue)
            try:
                await update_consumer_offset(self._instance, self._group, queue, offset, deadline=deadline)
            except MQClientError as error:
                self._dirty.add(queue)
                failures.append(f"{queue.topic}/{queue.queue_id}: {error}")
        if failures:
            raise MQClientError(ResponseCode.SYSTEM_ERROR, "offset commit failed for " + "; ".join(failures))


class LocalFileOffsetStore(_MemoryTable):
    """Offsets in ``<directory>/<group>/offsets.json``: a JSON document with a format name, a version
    and a CRC32 of its offsets, replaced atomically (temporary file, fsync, rename, fsync of the
    directory). A file that fails its checks is an error, never silently ignored."""

    def __init__(self, directory: Path, group: str) -> None:
        super().__init__()
        self.path = Path(directory) / group / OFFSETS_FILE_NAME
        self._group = group

    async def load(self) -> None:
        offsets = await asyncio.to_thread(read_offsets_file, self.path)
        self._offsets.update(offsets)

    async def read_store(self, queue: MessageQueue) -> int | None:
        return self._offsets.get(queue)

    async def persist(self, queues: Iterable[MessageQueue] | None = None) -> None:
        if not self._dirty:
            return
        self._dirty.clear()
        await asyncio.to_thread(write_offsets_file, self.path, self._group, dict(self._offsets))


def _canonical(entries: list[dict[str, object]]) -> bytes:
    return json.dumps(entries, sort_keys=True, separators=(",", ":")).encode("utf-8")


def write_offsets_file(path: Path, group: str, offsets: dict[MessageQueue, int]) -> None:
    entries: list[dict[str, object]] = [
        {**queue.to_json_object(), "offset": offset} for queue, offset in sorted(offsets.items())
    ]
    document = {
        "format": OFFSETS_FILE_FORMAT,
        "version": OFFSETS_FILE_VERSION,
        "group": group,
        "offsets": entries,
        "crc32": zlib.crc32(_canonical(entries)),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(path.name + ".tmp")
    with open(temporary, "wb") as file:
        file.write(json.dumps(document, indent=1).encode("utf-8"))
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, path)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def read_offsets_file(path: Path) -> dict[MessageQueue, int]:
    """The offsets of a file written by :func:`write_offsets_file`; {} when there is none. Raises
    :class:`MQClientError` for a file that is not ours, of another version, or corrupt."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return {}
    try:
        document = json.loads(raw)
        if not isinstance(document, dict) or document.get("format") != OFFSETS_FILE_FORMAT:
            raise ValueError("not a raftmq consumer offsets file")
        if document.get("version") != OFFSETS_FILE_VERSION:
            raise ValueError(f"unsupported version {document.get('version')!r}")
        entries = document["offsets"]
        if not isinstance(entries, list) or zlib.crc32(_canonical(entries)) != document.get("crc32"):
            raise ValueError("CRC mismatch")
        offsets: dict[MessageQueue, int] = {}
        for entry in entries:
            offset = entry["offset"]
            if type(offset) is not int or offset < 0:
                raise ValueError(f"bad offset {offset!r}")
            offsets[MessageQueue.from_json_object(entry)] = offset
        return offsets
    except (ValueError, KeyError, TypeError) as error:
        raise MQClientError(
            ResponseCode.SYSTEM_ERROR, f"consumer offsets file {path} is unusable ({error}); move it away to start over"
        ) from None
