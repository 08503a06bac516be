"""What one replica's store holds, shared by the modules that work on it (recovery, append, dispatch, flush,
catch-up, retention, queries, scrub): the commit log, the files derived from it, the applied position and
the locks. The modules take this object; none reaches into another's privates.

Locks: :attr:`StoreState.lock` (re-entrant) guards every field; :attr:`StoreState.flush_lock` serialises
flushes and is taken before the store lock, never while holding it."""

from __future__ import annotations

import fcntl
import threading
from collections.abc import Callable
from pathlib import Path
from typing import IO, Final

import numpy as np

from commitlog.checkpoint import ApplyPositionFile
from commitlog.commit_log import CommitLog
from commitlog.config import StoreConfig
from commitlog.consume_queue import UNIT_BYTES, ConsumeQueue
from commitlog.dispatch import topic_prefix_crc
from commitlog.errors import StoreError
from commitlog.key_index_files import KeyIndex
from commitlog.message import TOPIC_BYTES_MAX
from commitlog.recent_keys import RecentKeys
from commitlog.tag_codes import cached_tag_code
from protocol.invariant import invariant
from protocol.topics import TOPIC_NAME_MAX_CHARS, TOPIC_PATTERN, check_topic_name

CHECKPOINT_NAME: Final = "checkpoint"
LOCK_NAME: Final = "lock"
APPLY_POSITION_NAME: Final = "apply.pos"
#: bound on the tag-code and topic caches
CACHE_ENTRIES_MAX: Final = 100_000
#: :data:`commitlog.consume_queue.CQ_UNIT` as a numpy record
CQ_UNIT_DTYPE: Final = np.dtype([("offset", ">i8"), ("size", ">i4"), ("tag", ">i8")])
invariant(CQ_UNIT_DTYPE.itemsize == UNIT_BYTES, "the unit dtype is the unit struct")
# a valid topic name is ASCII, one byte per character: every name the rule admits fits a record's topic
invariant(TOPIC_NAME_MAX_CHARS <= TOPIC_BYTES_MAX, "a valid topic name must fit a record's topic length")


class StoreState:
    """One replica's store: its files and positions. Fields are read and written under :attr:`lock`."""

    def __init__(self, config: StoreConfig, clock: Callable[[], float],
                 extension_provider: Callable[[], bytes] | None) -> None:
        self.config = config
        self.clock = clock
        #: called under the store lock at every flush: its bytes are written atomically with the checkpoint
        self.extension_provider = extension_provider
        #: the extension bytes of the checkpoint found at open (b"" when none)
        self.extension = b""
        self.store_host = config.store_host_bytes
        self.root = config.data_dir
        self.root.mkdir(parents=True, exist_ok=True)
        self.lock_file = lock_directory(self.root)
        self.lock = threading.RLock()
        self.flush_lock = threading.Lock()
        self.tag_codes: dict[bytes, int] = {}
        self.topics: dict[str, tuple[bytes, int]] = {}  # topic -> (length + bytes, prefix CRC)
        self.commit_log = CommitLog(self.root / "commitlog", config.segment_size_bytes, config.page_cache_keep_bytes)
        self.queues: dict[tuple[str, int], ConsumeQueue] = {}
        self.open_queues()
        self.index = self.new_key_index()
        #: which key hashes were indexed lately: spares find_recent_sends most index reads
        self.recent_keys = RecentKeys()
        self.apply_position = ApplyPositionFile(self.root / APPLY_POSITION_NAME)
        self.applied_raft_index = 0
        self.min_offset = 0
        self.next_queue_offsets: dict[tuple[str, int], int] = {}
        #: where the last flush made the commit log durable up to
        self.flushed_end = 0
        self.dirty_queues: set[ConsumeQueue] = set()
        self.last_flush = clock()
        #: end of raw bytes copied from a peer and not yet dispatched (-1: none)
        self.ingested_end = -1
        #: where the scrubber's next check of key-index files starts (a file name's offset)
        self.index_scrub_next = 0

    def new_key_index(self) -> KeyIndex:
        return KeyIndex(self.root / "index", self.config.index_slot_count, self.config.index_entry_capacity)

    def queue_directory(self, topic: str, queue_id: int) -> Path:
        return self.root / "consumequeue" / topic / str(queue_id)

    def open_queues(self) -> None:
        base = self.root / "consumequeue"
        if not base.is_dir():
            return
        for topic_dir in sorted(base.iterdir()):
            if not topic_dir.is_dir() or not TOPIC_PATTERN.match(topic_dir.name):
                continue
            for queue_dir in sorted(topic_dir.iterdir()):
                if queue_dir.is_dir() and queue_dir.name.isdigit():
                    queue_id = int(queue_dir.name)
                    self.queues[(topic_dir.name, queue_id)] = ConsumeQueue(
                        queue_dir, topic_dir.name, queue_id, self.config.consume_queue_units_per_file
                    )

    def queue(self, topic: str, queue_id: int) -> ConsumeQueue:
        """The consume queue of ``(topic, queue_id)``, created when it does not exist yet."""
        queue = self.queues.get((topic, queue_id))
        if queue is None:
            queue = ConsumeQueue(
                self.queue_directory(topic, queue_id), topic, queue_id, self.config.consume_queue_units_per_file
            )
            self.queues[(topic, queue_id)] = queue
        return queue

    def tag_code(self, tags: bytes | None) -> int:
        return cached_tag_code(self.tag_codes, tags)

    def topic_entry(self, topic: str) -> tuple[bytes, int] | str:
        """(length byte + topic bytes, CRC of ``topic#``) for a valid topic, else why it is invalid."""
        entry = self.topics.get(topic)
        if entry is None:
            # the record's topic width first, in the store's words; then the name rule every layer keeps
            try:
                encoded = topic.encode()
            except UnicodeEncodeError:
                return "topic is not valid unicode"
            if not 0 < len(encoded) <= TOPIC_BYTES_MAX:
                return f"topic length {len(encoded)} outside 1..{TOPIC_BYTES_MAX} bytes"
            reason = check_topic_name(topic)
            if reason is not None:
                return reason
            entry = (bytes((len(encoded),)) + encoded, topic_prefix_crc(topic))
            if len(self.topics) < CACHE_ENTRIES_MAX:
                self.topics[topic] = entry
        return entry

    def mark_applied(self, raft_index: int, end: int) -> None:
        """Record ``raft_index`` as applied with the commit log ending at ``end``: last, once the command's
        effects are in place, so that the apply marker vouches only for what is there."""
        self.commit_log.end_offset = end
        self.applied_raft_index = raft_index
        self.apply_position.write(raft_index, end)


def lock_directory(root: Path) -> IO[bytes]:
    """Hold an exclusive lock on ``root`` for the store's lifetime (the kernel drops it if the process
    dies): two stores writing one directory would corrupt it."""
    handle = open(root / LOCK_NAME, "ab")  # noqa: SIM115 - held until close() or abandon()
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError as exc:
        handle.close()
        raise StoreError(f"{root} is in use by another store (another process or instance)") from exc
    return handle
