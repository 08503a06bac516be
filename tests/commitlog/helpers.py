"""Builders shared by the store tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from commitlog.config import StoreConfig
from commitlog.hosts import encode_host
from commitlog.mapped_file import ALLOCATING_SUFFIX
from commitlog.message import MessageInput
from commitlog.retries import retry_digest
from commitlog.store import MessageStore
from protocol.properties import decode_properties, encode_properties

BORN_HOST = encode_host("192.168.0.10", 40123)


def small_config(directory: Path, **overrides: Any) -> StoreConfig:
    """Small files so tests cross segment, consume-queue and index-file boundaries quickly."""
    values: dict[str, Any] = {
        "data_dir": directory,
        "store_host": "10.1.2.3:10911",
        "segment_size_bytes": 128 * 1024,
        "consume_queue_units_per_file": 64,
        "index_slot_count": 64,
        "index_entry_capacity": 256,
        "body_size_max_bytes": 32 * 1024,
        "flush_interval_ms": 3_600_000,
    }
    values.update(overrides)
    return StoreConfig(**values).validate()


def message(
    number: int,
    topic: str = "TopicTest",
    queue_id: int = 0,
    body: bytes | None = None,
    tags: str | None = "TagA",
    keys: str | None = None,
    sys_flag: int = 0,
    born_host: bytes = BORN_HOST,
    **properties: str,
) -> MessageInput:
    values = {"UNIQ_KEY": f"C0A8000A9CB3{number:020X}", "WAIT": "true"}
    if tags is not None:
        values["TAGS"] = tags
    values["KEYS"] = keys if keys is not None else f"key-{number}"
    values.update(properties)
    return MessageInput(
        topic=topic,
        queue_id=queue_id,
        flag=0,
        sys_flag=sys_flag,
        born_timestamp=1_700_000_000_000 + number,
        born_host=born_host,
        store_timestamp=1_700_000_100_000 + number * 10,
        reconsume_times=0,
        prepared_transaction_offset=0,
        body=body if body is not None else f"body-{number}-".encode() * 20,
        properties=encode_properties(values),
    )


def store_past_retention(directory: Path) -> MessageStore:
    """A store whose queue 1 holds one message, in a segment retention deleted, and whose queue 0 holds many,
    its first kept one several consume-queue files into the queue."""
    store = MessageStore(small_config(directory))
    store.append(1, [message(0, queue_id=1)])
    index = 2
    while len(store.commit_log.starts) < 5:
        store.append(index, [message(index, body=bytes(range(256)) + f"{index}".encode() * 20)])
        index += 1
    store.delete_below(index, sorted(store.commit_log.starts)[3])
    return store


def tree_bytes(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` (relative path -> content), for byte-equality checks. A segment the commit log
    is allocating in the background (``*.allocating``, renamed into place once allocated) is not one yet: it
    is left out, and so is a file that went between listing and reading (that rename)."""
    files: dict[str, bytes] = {}
    for path in sorted(root.rglob("*")):
        if path.name.endswith(ALLOCATING_SUFFIX) or not path.is_file():
            continue
        try:
            files[str(path.relative_to(root))] = path.read_bytes()
        except FileNotFoundError:
            continue
    return files


def data_bytes(root: Path) -> dict[str, bytes]:
    """The replicated data files (commit log, consume queues, key index), without local bookkeeping
    (the apply marker's sequence number differs between a replica that applied and one that copied)."""
    return {name: data for name, data in tree_bytes(root).items()
            if name.startswith(("commitlog/", "consumequeue/", "index/"))}


def retry_of(stored: MessageInput) -> tuple[str, bytes, int, bytes]:
    """What apply asks the store of a send that may be a retry of ``stored``: (topic, UNIQ_KEY, reconsume
    count, content digest)."""
    uniq_key = decode_properties(stored.properties)["UNIQ_KEY"].encode()
    return stored.topic, uniq_key, stored.reconsume_times, retry_digest(stored.flag, stored.body, stored.properties)
