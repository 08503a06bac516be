"""A ``SyncObjConf`` tuned for throughput on this transport, with every choice explained.

Rules found by measuring (3 members and a client on 2 cores): group-commit many messages per entry with
a few entries' worth of bytes in flight, ``appendEntriesPeriod`` 2-10 ms, ``autoTickPeriod`` 1 ms,
4 MB socket buffers. ``bench/raft_transport_bench.py`` measures the result.

The entry size contract (the chunking trap)
-------------------------------------------
pysyncobj sends an entry whose command is at least ``appendEntriesBatchSizeBytes`` long in chunks, and
decides which chunk is the last by comparing with the *unpickled* length: followers then fail with
"pickle data was truncated" and retry forever. Any entry strictly below that size is sent whole, so the
rule is: every command pysyncobj stores (1 type byte + ``pickle.dumps((method_id, args), protocol=2)``)
must stay below ``appendEntriesBatchSizeBytes``. :func:`tuned_conf` takes the largest entry the caller
will propose, ``entry_size_max_bytes``, and sets ``appendEntriesBatchSizeBytes`` to twice that, so an
estimate that is off (protocol 2 can double a ``bytes`` argument: every byte >= 0x80 becomes two) still
stays clear of the trap. :func:`entry_size_max_bytes` recovers the limit from a conf.
"""

from __future__ import annotations

import gc
from collections.abc import Mapping
from typing import Any, Final

from pysyncobj import SyncObjConf

MEBIBYTE: Final = 1024 * 1024
APPEND_ENTRIES_PERIOD_MIN_SECONDS: Final = 0.002
APPEND_ENTRIES_PERIOD_MAX_SECONDS: Final = 0.010
#: ``appendEntriesBatchSizeBytes`` = this factor times the largest entry (see the module doc)
BATCH_SIZE_PER_ENTRY_SIZE: Final = 2

#: SyncObjConf keys set here; ``extra`` may not override them (pass the named parameter instead)
_OWNED_KEYS: Final = frozenset(
    {
        "appendEntriesPeriod",
        "autoTick",
        "autoTickPeriod",
        "sendBufferSize",
        "recvBufferSize",
        "appendEntriesBatchSizeBytes",
        "appendEntriesUseBatch",
        "raftMinTimeout",
        "raftMaxTimeout",
        "connectionTimeout",
        "connectionRetryTime",
        "leaderFallbackTimeout",
        "logCompactionBatchSize",
        "journalFile",
        "fullDumpFile",
        "serializer",
        "deserializer",
        "serializeChecker",
        "logCompactionMinEntries",
        "logCompactionMinTime",
        "password",
    }
)


def entry_size_max_bytes(conf: Any) -> int:
    """The largest command (in the log, as pysyncobj stores it) to propose with ``conf``."""
    return int(conf.appendEntriesBatchSizeBytes) // BATCH_SIZE_PER_ENTRY_SIZE


def tuned_conf(
    *,
    append_entries_period_seconds: float = 0.005,
    auto_tick_period_seconds: float = 0.001,
    socket_buffer_bytes: int = 4 * MEBIBYTE,
    entry_size_max_bytes: int = MEBIBYTE,
    raft_min_timeout_seconds: float = 1.0,
    raft_max_timeout_seconds: float = 2.0,
    connection_retry_seconds: float = 0.5,
    snapshot_chunk_bytes: int = MEBIBYTE,
    journal_file: str | None = None,
    full_dump_file: str | None = None,
    serializer: Any = None,
    deserializer: Any = None,
    serialize_checker: Any = None,
    log_compaction_min_entries: int = 5000,
    log_compaction_min_time_seconds: float = 300.0,
    extra: Mapping[str, Any] | None = None,
) -> SyncObjConf:
    """A validated ``SyncObjConf`` for the authenticated transport. Choices:

    * ``appendEntriesPeriod`` = ``append_entries_period_seconds`` (5 ms; 2-10 ms allowed): in batch mode
      the leader sends new entries only every period, so the 100 ms default paces both throughput and
      commit latency (a commit takes about a period or more). It also bounds how long one tick may spend
      sending or taking commands from the queue.
    * ``autoTickPeriod`` = ``auto_tick_period_seconds`` (1 ms here; members use ``tick_period_ms``, 5 ms):
      the longest the tick thread sleeps in ``poll`` with nothing to do. pysyncobj's batch mode wakes it for
      nothing, so with 50 ms a command waited up to 50 ms before the leader saw it; our RaftNode wakes it
      for each proposal (and for each finished flush), so the period only paces its timers.
    * ``sendBufferSize``/``recvBufferSize`` = ``socket_buffer_bytes`` (4 MiB, this host's
      ``net.core.wmem_max``/``rmem_max``): entries are in flight at full rate, and 64 KiB buffers make the
      leader stall on every batch.
    * ``appendEntriesBatchSizeBytes`` = 2 x ``entry_size_max_bytes`` (2 MiB by default): the chunking
      trap, see the module doc. Larger batches also mean fewer messages and responses per entry.
    * ``appendEntriesUseBatch`` = True: False makes every command send its own ``append_entries``.
    * ``raftMinTimeout``/``raftMaxTimeout`` = 1-2 s: elections start 1-2 s after a leader stops. pysyncobj
      requires more than 3 periods; the margin is wide because on 2 shared cores a busy tick thread
      (a large batch, a snapshot, a GC pause) must not look like a dead leader, and a needless leader
      change turns in-flight sends into unknown outcomes.
    * ``connectionTimeout`` = max(3.5 s, 1.5 x max timeout): a peer silent that long is dead (the
      transport's keepalives keep idle connections talking). pysyncobj requires at least the max timeout.
    * ``connectionRetryTime`` = ``connection_retry_seconds`` (0.5 s; default 5 s): a restarted member is
      reconnected within half a second, at the cost of one SYN per retry to a member that is down.
    * ``leaderFallbackTimeout`` = max timeout (default 30 s): a leader cut off from the majority steps down
      once the others may have elected someone, instead of accepting writes that cannot commit for 30 s.
    * ``logCompactionBatchSize`` = ``snapshot_chunk_bytes`` (1 MiB; default 64 KiB): a follower that needs
      the snapshot gets it in fewer round trips.
    * journal, dump, serializer and compaction settings pass through unchanged; ``extra`` may set any
      other ``SyncObjConf`` key (``onReady``, ``onStateChanged``, ``dynamicMembershipChange``, ...).
      Unknown keys, keys set above and ``password`` (the transport authenticates by itself) are refused.
    """
    if not APPEND_ENTRIES_PERIOD_MIN_SECONDS <= append_entries_period_seconds <= APPEND_ENTRIES_PERIOD_MAX_SECONDS:
        raise ValueError(
            f"append_entries_period_seconds must be within {APPEND_ENTRIES_PERIOD_MIN_SECONDS}-"
            f"{APPEND_ENTRIES_PERIOD_MAX_SECONDS} s"
        )
    if not 0 < auto_tick_period_seconds <= append_entries_period_seconds:
        raise ValueError("auto_tick_period_seconds must be positive and at most the append entries period")
    if socket_buffer_bytes < 64 * 1024:
        raise ValueError("socket_buffer_bytes must be at least 64 KiB")
    if entry_size_max_bytes < 1024:
        raise ValueError("entry_size_max_bytes must be at least 1 KiB")
    if not raft_min_timeout_seconds > 3 * append_entries_period_seconds:
        raise ValueError("raft_min_timeout_seconds must exceed three append entries periods")
    if not raft_max_timeout_seconds > raft_min_timeout_seconds:
        raise ValueError("raft_max_timeout_seconds must exceed raft_min_timeout_seconds")
    if connection_retry_seconds < 0:
        raise ValueError("connection_retry_seconds must not be negative")
    if snapshot_chunk_bytes < 1024:
        raise ValueError("snapshot_chunk_bytes must be at least 1 KiB")
    extra = dict(extra or {})
    known_keys = set(vars(SyncObjConf()))
    unknown = sorted(set(extra) - known_keys)
    if unknown:
        raise ValueError(f"unknown SyncObjConf keys: {unknown}")
    owned = sorted(set(extra) & _OWNED_KEYS)
    if owned:
        raise ValueError(f"set these through tuned_conf's parameters, not extra: {owned}")
    conf = SyncObjConf(
        appendEntriesPeriod=append_entries_period_seconds,
        autoTick=True,
        autoTickPeriod=auto_tick_period_seconds,
        sendBufferSize=socket_buffer_bytes,
        recvBufferSize=socket_buffer_bytes,
        appendEntriesBatchSizeBytes=BATCH_SIZE_PER_ENTRY_SIZE * entry_size_max_bytes,
        appendEntriesUseBatch=True,
        raftMinTimeout=raft_min_timeout_seconds,
        raftMaxTimeout=raft_max_timeout_seconds,
        connectionTimeout=max(3.5, 1.5 * raft_max_timeout_seconds),
        connectionRetryTime=connection_retry_seconds,
        leaderFallbackTimeout=raft_max_timeout_seconds,
        logCompactionBatchSize=snapshot_chunk_bytes,
        journalFile=journal_file,
        fullDumpFile=full_dump_file,
        serializer=serializer,
        deserializer=deserializer,
        serializeChecker=serialize_checker,
        logCompactionMinEntries=log_compaction_min_entries,
        logCompactionMinTime=log_compaction_min_time_seconds,
        password=None,
        **extra,
    )
    # pysyncobj's validate() uses asserts, which python -O strips: the rules that matter here are checked
    # explicitly above; this catches the rest whenever asserts are on.
    try:
        conf.validate()
    except AssertionError as error:
        raise ValueError(f"SyncObjConf rejected the combination: {error!r}") from error
    return conf


#: allocations between young-generation collections (CPython's default is 700)
GC_YOUNG_THRESHOLD: Final = 50_000


def tune_process_gc() -> None:
    """For a member process, once it has started: move what start-up built out of the collector's sight
    (``gc.freeze``) and collect the young generation every 50,000 allocations instead of 700. A send
    allocates a few dozen short-lived objects, so the default ran a collection every few dozen sends, and on
    the replication benchmark the leader spent a large share of its CPU in the collector. Reference cycles are
    still collected, just less often."""
    gc.freeze()
    gc.set_threshold(GC_YOUNG_THRESHOLD, 20, 20)
