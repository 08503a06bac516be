"""The message store: commit log plus the files derived from it, behind the API apply uses.

:class:`MessageStore` is a front over modules of one concept each, sharing one
:class:`~commitlog.state.StoreState`: :mod:`~commitlog.recovery` (opening), :mod:`~commitlog.append` and
:mod:`~commitlog.append_records` (apply), :mod:`~commitlog.dispatch` (the derived files' rule),
:mod:`~commitlog.flush` (durability), :mod:`~commitlog.ingest` (catch-up from a peer),
:mod:`~commitlog.retention`, :mod:`~commitlog.queries` and :mod:`~commitlog.key_lookups` (reads), and
:mod:`~commitlog.scrub` with :mod:`~commitlog.index_upkeep` (finding and repairing damage).

Ordering and durability rules:

* :meth:`MessageStore.append` is called by apply, in Raft-index order, from one thread. It plans every
  position first and creates every file it will need (a full disk fails here, with nothing written), then
  writes the records, dispatches them to the consume queues and the key index, and finally records the
  Raft index in the apply marker. A call with an index already applied changes nothing.
* Appended data is in the page cache when ``append`` returns; with ``flush_policy = "sync"`` it is also
  msync'ed, followed by the checkpoint. With ``"async"`` a flush happens once ``flush_interval_ms`` passed.
* Recovery trusts the checkpoint (durable), validates the tail past it record by record, keeps what the
  apply marker vouches for, cuts the rest, and re-dispatches the tail to the derived files. A derived file
  that is missing or shorter than the checkpoint says is rebuilt from the commit log.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Final

import numpy as np
import numpy.typing as npt

from commitlog import append as append_module
from commitlog import append_records as append_records_module
from commitlog import flush as flush_module
from commitlog import ingest, key_lookups, queries, recovery, retention, scrub
from commitlog.checkpoint import ApplyPositionFile
from commitlog.commit_log import CommitLog
from commitlog.config import StoreConfig
from commitlog.consume_queue import ConsumeQueue
from commitlog.errors import StoreError
from commitlog.hosts import decode_message_id
from commitlog.index_upkeep import trust_index
from commitlog.key_index_files import KeyIndex
from commitlog.message import MessageInput
from commitlog.outcomes import AppendOutcome, AppendResult, GetResult
from commitlog.queue_starts import QueueKey
from commitlog.recent_keys import SEED_SPAN_MS
from commitlog.record_codec import StoredMessage
from commitlog.records import PreparedRecords
from commitlog.retries import KeyCollision
from commitlog.state import StoreState

#: the exit code of a member stopped by a damaged record it had to read and could not repair (EX_DATAERR)
EXIT_DAMAGED_RECORD: Final = 65


class MessageStore:
    """One replica's store. ``append``/``delete_below`` come from the apply thread; reads from any thread."""

    def __init__(
        self,
        config: StoreConfig,
        clock: Callable[[], float] = time.monotonic,
        extension_provider: Callable[[], bytes] | None = None,
        background_flush: bool = True,
        recent_keys_seed_span_ms: int = SEED_SPAN_MS,
    ) -> None:
        """Open (and recover) the store. ``extension_provider`` is called under the store lock at every
        flush; its bytes are written atomically with the checkpoint and read back as :attr:`extension`.
        With the async policy a background thread flushes every ``flush_interval_ms``; without it
        (``background_flush=False``, for deterministic tests) appends flush once the interval passed.
        The recent-keys filter starts with the keys indexed within ``recent_keys_seed_span_ms`` before the
        newest (:meth:`RecentKeys.seed`); the span changes how often the index is read, never an answer."""
        self.config = config.validate()
        self.clock = clock
        self.state = StoreState(self.config, clock, extension_provider)
        self._flusher: flush_module.FlushThread | None = None
        recovery.recover(self.state)
        # after recovery, so the filter holds whatever the undone, re-dispatched or rebuilt index holds:
        # "no" is exact from the first dedupe window after opening on. The files it reads are checked first
        # (and rebuilt if damaged): a key hash gone bad there would be denied by the filter for good
        newest = self.state.index.newest_timestamp()
        if newest is not None:
            trust_index(self.state, newest - recent_keys_seed_span_ms)
        self.state.recent_keys.seed(self.state.index, recent_keys_seed_span_ms)
        if config.flush_policy == "async" and background_flush:
            self._flusher = flush_module.FlushThread(self.state)

    # ------------------------------------------------------------------ what the store holds

    @property
    def extension(self) -> bytes:
        """The extension bytes of the checkpoint found at open (b"" when none)."""
        return self.state.extension

    @property
    def store_host(self) -> bytes:
        return self.state.store_host

    @property
    def root(self) -> Path:
        return self.state.root

    @property
    def commit_log(self) -> CommitLog:
        return self.state.commit_log

    @property
    def queues(self) -> dict[tuple[str, int], ConsumeQueue]:
        return self.state.queues

    @property
    def index(self) -> KeyIndex:
        """The key index (replaced when it is rebuilt whole)."""
        return self.state.index

    @property
    def apply_position(self) -> ApplyPositionFile:
        return self.state.apply_position

    @property
    def applied_raft_index(self) -> int:
        return self.state.applied_raft_index

    @property
    def lock(self) -> threading.RLock:
        """The store lock: apply writes the commit log and the derived files under it, so a reader holding it
        sees them as of one moment (a replica's file comparison)."""
        return self.state.lock

    @property
    def flushed_end(self) -> int:
        """Where the commit log's durable bytes end: everything below was flushed by the store."""
        return self.state.flushed_end

    @property
    def min_physical_offset(self) -> int:
        """Where the commit log begins: retention deleted what lay below."""
        return self.state.min_offset

    @property
    def max_physical_offset(self) -> int:
        return self.state.commit_log.end_offset

    @property
    def unflushed_bytes(self) -> int:
        """Commit-log bytes applied and not yet flushed by the store (the Raft journal holds them durably)."""
        return max(0, self.state.commit_log.end_offset - self.state.flushed_end)

    # ------------------------------------------------------------------ apply

    def append(
        self, raft_index: int, messages: Sequence[MessageInput], store_timestamp: int | None = None
    ) -> AppendOutcome:
        """Store ``messages`` as the effect of Raft entry ``raft_index`` (with ``store_timestamp``, when
        given, as every message's store timestamp: the leader's stamp for a whole batch).

        Returns one result per message, in order; a message that cannot be stored is rejected with a
        reason and takes no offset. Never raises for bad messages. Raises DiskFullError only when a new
        file cannot be allocated, before anything is written: calling again later is safe.
        """
        with self.state.lock:
            if raft_index <= self.state.applied_raft_index:
                return AppendOutcome(raft_index, False)
            outcome = append_module.append_messages(self.state, raft_index, messages, store_timestamp)
        self._flush_when_due()
        return outcome

    def mark_applied(self, raft_index: int) -> bool:
        """Record ``raft_index`` as applied for a command with no commit-log effect."""
        return self.append(raft_index, ()).applied

    def append_records(self, raft_index: int, batch: PreparedRecords, skip: Collection[int] = (),
                       store_timestamp: int | None = None, want_results: bool = True) -> AppendOutcome:
        """Store prepared records (:mod:`commitlog.records`, checked with ``check_layout``) as the effect of
        Raft entry ``raft_index``: the same bytes and derived entries :meth:`append` gives for the same
        messages. ``skip`` holds positions not to store (duplicates: they get no result here), ``store_timestamp``
        a store timestamp that replaces the batch's (raised to the floor). Without ``want_results`` (a
        follower: nobody waits for them) the outcome carries no per-message results."""
        with self.state.lock:
            if raft_index <= self.state.applied_raft_index:
                return AppendOutcome(raft_index, False)
            outcome = append_records_module.append_records(self.state, raft_index, batch, skip, store_timestamp, want_results)
        self._flush_when_due()
        return outcome

    def _flush_when_due(self) -> None:
        """After an apply: a flush under the sync policy, or once the interval passed without a flush thread."""
        if self.config.flush_policy == "sync" or (
            self._flusher is None and self.clock() - self.state.last_flush >= self.config.flush_interval_ms / 1000
        ):
            flush_module.flush_or_stop(self.state, "flush after apply")

    def delete_below(self, raft_index: int, physical_offset: int) -> AppendOutcome:
        """Retention as a replicated command (:func:`commitlog.retention.delete_below`)."""
        return retention.delete_below(self.state, raft_index, physical_offset)

    def recently_stored(self, hashes: dict[int, int], since_timestamp: int) -> list[int]:
        """Of ``hashes`` (any name -> key-index hash), the names whose hash may have been indexed at or
        after ``since_timestamp``: those worth a lookup (:mod:`commitlog.recent_keys`). All of them when
        the filter cannot answer for that time."""
        return key_lookups.recently_stored(self.state, hashes, since_timestamp)

    def recently_stored_mask(self, hashes: npt.NDArray[np.uint32], since_timestamp: int) -> npt.NDArray[np.bool_]:
        """:meth:`recently_stored` for many hashes: for each, whether it is worth a lookup."""
        return key_lookups.recently_stored_mask(self.state, hashes, since_timestamp)

    def find_recent_send(self, topic: str, uniq_key: bytes, reconsume_times: int, digest: bytes,
                         since_timestamp: int) -> AppendResult | KeyCollision | None:
        """The stored message a send is a retry of (:mod:`commitlog.retries`): of ``topic``, with this
        UNIQ_KEY, reconsume count and content ``digest`` (:func:`retry_digest`), stored at or after
        ``since_timestamp``. A :class:`KeyCollision` when messages match all but the content, None when
        none matches. Deterministic: it reads only the key index and the commit log, which are identical on
        every replica at the same applied index; the key-index files it reads are checked first and every
        record it reads is verified (:meth:`query_by_key` with ``verified``): a damaged file is rebuilt from
        the commit log before it answers, and no answer is given from a record whose bytes are not the
        group's (:class:`DamagedRecordError`)."""
        return self.find_recent_sends([(topic, uniq_key, reconsume_times, digest)], since_timestamp)[0]

    def find_recent_sends(self, sends: Sequence[tuple[str, bytes, int, bytes]],
                          since_timestamp: int) -> list[AppendResult | KeyCollision | None]:
        """:meth:`find_recent_send` for each (topic, UNIQ_KEY, reconsume count, digest), under one lock
        (apply asks for every send of a command at once)."""
        return key_lookups.find_recent_sends(self.state, sends, since_timestamp)

    # ------------------------------------------------------------------ catch-up from a peer

    def reset_to(self, start_offset: int) -> None:
        """Drop everything and continue at ``start_offset`` (:func:`commitlog.ingest.reset_to`)."""
        ingest.reset_to(self.state, start_offset)

    def ingest_raw(self, offset: int, data: bytes) -> None:
        """Append raw commit-log bytes copied from a peer at ``offset`` (== the current end). They are not
        visible until :meth:`finish_ingest` validates and dispatches them."""
        ingest.ingest_raw(self.state, offset, data)

    def discard_ingest(self) -> None:
        """Forget raw bytes ingested but not finished (a copy that failed half-way)."""
        ingest.discard_ingest(self.state)

    def queue_starts(self, physical_offset: int) -> dict[QueueKey, int] | None:
        """Where each queue continues for a replica that copies from ``physical_offset``
        (:func:`commitlog.ingest.queue_starts`)."""
        return ingest.queue_starts(self.state, physical_offset)

    def finish_ingest(self, raft_index: int, queue_starts: Mapping[QueueKey, int] | None = None) -> None:
        """Validate the ingested bytes record by record, check they continue the queues (``queue_starts``:
        the peer's, when the copy begins past its retention point), dispatch them, and mark ``raft_index``
        applied. CorruptionError (and nothing made visible) when they do not."""
        ingest.finish_ingest(self.state, raft_index, queue_starts)

    # ------------------------------------------------------------------ durability

    def flush_if_due(self) -> None:
        flush_module.flush_if_due(self.state)

    def flush(self) -> None:
        """Make everything applied so far durable (:func:`commitlog.flush.flush`). Callers must not hold the
        store lock."""
        flush_module.flush(self.state)

    def _stop_flushing(self) -> None:
        if self._flusher is not None:
            self._flusher.stop()
            self._flusher = None

    def abandon(self) -> None:
        """Stop background work and release the directory without flushing or closing: what a killed
        process leaves behind, for tests and demos that reopen a store in the same process."""
        self._stop_flushing()
        self.state.commit_log._allocator.shutdown(wait=True)
        self.state.lock_file.close()

    def close(self) -> None:
        self._stop_flushing()
        self.flush()
        state = self.state
        with state.lock:
            state.commit_log.close()
            for queue in state.queues.values():
                queue.close()
            state.index.close()
            state.apply_position.close()
            state.lock_file.close()

    # ------------------------------------------------------------------ reads

    def queue_ids(self) -> list[tuple[str, int]]:
        with self.state.lock:
            return sorted(self.state.queues)

    def min_queue_offset(self, topic: str, queue_id: int) -> int:
        queue = self.state.queues.get((topic, queue_id))
        return queue.min_offset if queue else 0

    def max_queue_offset(self, topic: str, queue_id: int) -> int:
        queue = self.state.queues.get((topic, queue_id))
        return queue.max_offset if queue else 0

    def get_messages(self, topic: str, queue_id: int, queue_offset: int, max_count: int, max_bytes: int = 4 << 20,
                     tag_codes: Iterable[int] | None = None) -> GetResult:
        """Up to ``max_count`` records (and about ``max_bytes``) of a queue from ``queue_offset``, skipping
        records whose tag code is not in ``tag_codes`` (None = all), as RocketMQ's getMessage does."""
        return queries.get_messages(self.state, topic, queue_id, queue_offset, max_count, max_bytes, tag_codes)

    def read_committed(self, offset: int, max_bytes: int) -> bytes:
        """Raw commit-log bytes from ``offset`` (records and fillers, across segments), at most
        ``max_bytes``, ending at the commit log's end: what a catching-up peer copies."""
        return queries.read_committed(self.state, offset, max_bytes)

    def read_record(self, physical_offset: int) -> bytes:
        """The raw record at ``physical_offset``; StoreError when there is no record there."""
        return queries.read_record(self.state, physical_offset)

    def read_message(self, physical_offset: int) -> StoredMessage:
        return queries.read_message(self.state, physical_offset)

    def view_message_by_id(self, msg_id: str) -> StoredMessage:
        """The message a store-based id names; ValueError for a malformed id, StoreError when absent."""
        host, physical_offset = decode_message_id(msg_id)
        if host != self.state.store_host:
            raise StoreError(f"message id {msg_id} belongs to another store host")
        return self.read_message(physical_offset)

    def query_by_key(
        self, topic: str, key: str, max_count: int, begin_timestamp: int = 0, end_timestamp: int = 2**63 - 1,
        verified: bool = False,
    ) -> list[StoredMessage]:
        """Messages of ``topic`` whose KEYS contain ``key`` or whose UNIQ_KEY is ``key``, newest first
        (:func:`commitlog.key_lookups.query_by_key`: ``verified`` for apply's lookups)."""
        return key_lookups.query_by_key(self.state, topic, key, max_count, begin_timestamp, end_timestamp, verified)

    def store_timestamp_at(self, physical_offset: int) -> int:
        return queries.store_timestamp_at(self.state, physical_offset)

    def offset_by_timestamp(self, topic: str, queue_id: int, timestamp: int) -> int:
        """The first queue offset whose store timestamp is at or after ``timestamp`` (max offset if none)."""
        return queries.offset_by_timestamp(self.state, topic, queue_id, timestamp)

    # ------------------------------------------------------------------ scrub and repair

    def scrub(self, start: int, max_bytes: int) -> tuple[int | None, int]:
        """Validate the records from ``start`` for about ``max_bytes`` and check the derived files made of
        them (:func:`commitlog.scrub.scrub`): (offset of the first damaged record or None, where to continue)."""
        return scrub.scrub(self.state, start, max_bytes)

    def scrub_index(self, max_bytes: int) -> int | None:
        """Check key-index files round-robin, about ``max_bytes`` of them (:func:`commitlog.scrub.scrub_index`):
        the offset of a damaged record a rebuild needs, else None. From the scrubber's thread."""
        return scrub.scrub_index(self.state, max_bytes)

    def record_extent(self, physical_offset: int) -> int:
        """The size field of the record at ``physical_offset`` (which may itself be damaged)."""
        return scrub.record_extent(self.state, physical_offset)

    def repair_record(self, physical_offset: int, data: bytes) -> None:
        """Put back a damaged committed record from a peer's copy (:func:`commitlog.scrub.repair_record`)."""
        scrub.repair_record(self.state, physical_offset, data)
