"""A member of the Raft group: a pysyncobj node, the local store, the apply loop, group commit, snapshots
and catch-up, and role-change events.

Threads: pysyncobj's tick thread runs Raft, apply, the capture of a snapshot and the deserializer (and so
a catch-up copy); a snapshot thread makes each captured snapshot durable (store flush, file) off it; the
group-commit thread packs and proposes; the catch-up server serves peers; callers submit from anywhere.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, NoReturn

import pysyncobj.syncobj
from pysyncobj import SyncObj, replicated
from pysyncobj.monotonic import monotonic as pysyncobj_monotonic
from pysyncobj.pipe_notifier import PipeNotifier

from commitlog.checkpoint import read_checkpoint
from commitlog.errors import CorruptionError, DiskFullError, StoreError
from commitlog.message import MessageInput, RecordError
from commitlog.records import RecordBuilder
from commitlog.store import (
    CHECKPOINT_NAME,
    EXIT_DAMAGED_RECORD,
    AppendResult,
    DamagedRecordError,
    MessageStore,
)
from dledger.apply import (
    EXIT_BYTE_CONFIG_MISMATCH,
    ApplyResult,
    ByteConfigMismatchError,
    OwnBatch,
    StateMachine,
    check_byte_config,
)
from dledger.catchup import CatchupError, CatchupServer, fetch, fetch_range
from dledger.command import ByteConfig, Command, encode_command
from dledger.config import NodeConfig, parse_address
from dledger.framing import ENTRY_DIGESTS
from dledger.future import AppendFuture
from dledger.group_clock import GroupClock, replicated_floor_ms
from dledger.group_commit import GroupCommitter, NotLeaderError, OutcomeUnknownError, request_bytes
from dledger.journal import SegmentedJournal, create_journal
from dledger.log_matching import plan_append
from dledger.snapshot import (
    SNAPSHOT_HEAD_BYTES,
    BackgroundSnapshots,
    Snapshot,
    SnapshotError,
    peek_last_entry,
    read_snapshot,
)
from dledger.state import ReplicatedState, StateError
from dledger.timers import TIMER_TOPIC
from dledger.transport import OUT_OF_BAND_MIN_BYTES, transport_class
from dledger.tuning import tuned_conf

log = logging.getLogger(__name__)

#: pysyncobj builds its journal inside SyncObj.__init__ by calling this module global: ours instead, a
#: checksummed, segmented journal (dledger.journal; pysyncobj's own file journal is imported once)
pysyncobj.syncobj.createJournal = create_journal

#: how long stop() waits for pysyncobj's tick thread to finish its last tick (a catch-up copy may be running)
STOP_TICK_WAIT_SECONDS = 30.0
#: exit status when apply meets a programmer error: stopping beats a replica stalled or diverged
EXIT_APPLY_INVARIANT = 70
RAFT_STATES = {0: "follower", 1: "candidate", 2: "leader"}
_LEADING: Final[tuple[bool, str | None]] = (True, None)
RAFT_STATE_LEADER = 2
RAFT_STATE_FOLLOWER = 0
#: how long a member whose journal found the disk full stays out of elections after the last failure
DISK_FULL_HOLD_SECONDS = 5.0
#: a command carries more than its messages: operation heads, version, pickling
ENTRY_OVERHEAD_BYTES = 4096
#: entries this leader proposed and remembers decoded, until they apply
OWN_ENTRIES_MAX = 1024
#: how often a leader that is not the preferred one offers leadership to it
PREFERENCE_CHECK_SECONDS = 1.0
TRANSFER_TIMEOUT_SECONDS = 5.0
TRANSFER_RETRY_SECONDS = 0.05
#: the scrubber validates this much of the commit log per step, then pauses (about 4 MB/s, a few
#: percent of a core: a GB is re-validated every four minutes or so; 1 MB/s while writes are heavier)
SCRUB_BYTES = 1 << 20
SCRUB_PAUSE_SECONDS = 0.25


@dataclass(frozen=True, slots=True)
class RoleChange:
    role: str
    term: int
    leader: str | None


@dataclass(frozen=True, slots=True)
class MemberStatus:
    node_id: str
    role: str
    term: int
    leader: str | None
    commit_index: int
    applied_index: int
    commit_log_max_offset: int
    commit_log_min_offset: int
    #: sends stored as new messages though their UNIQ_KEY matched a recent message's (dledger.apply)
    uniq_key_collisions: int = 0
    #: Raft journal flushes made so far (the "durable" journal policy makes one per batch of new entries)
    journal_syncs: int = 0
    #: why this member does not vote until it re-fetched its log (damage found on its disk), or None
    damage: str | None = None


#: how our commands sit in pysyncobj's log: its REGULAR command type byte, then a byte no pickle starts
#: with (protocol 2+ begins with 0x80, protocol 0 with an opcode character), then our command's bytes.
#: pysyncobj would pickle the arguments of a ``@replicated`` call and unpickle them again at apply; binary
#: data had to travel as one big int (the cheapest protocol-2 carrier), and converting 300 KB entries to
#: and from ints and pickles cost ~1.5 ms per entry on the leader, ~0.8 ms on each follower.
RAW_COMMAND_PREFIX = b"\x00\xfe"


def encode_payload(data: bytes) -> int:
    """The older carrier: the command as one Python int (0x01 prefix keeps leading zero bytes). Entries
    written that way by earlier versions still replay through ``apply_command``."""
    return int.from_bytes(b"\x01" + data, "big")


def decode_payload(payload: int) -> bytes:
    return payload.to_bytes((payload.bit_length() + 7) // 8, "big")[1:]


def _byte_config_in(encoded_state: bytes) -> ByteConfig | None:
    """The group's byte configuration in encoded replicated state (None when it has none or cannot be read:
    what reads it next decides about damage)."""
    if not encoded_state:
        return None
    try:
        return ReplicatedState.decode(encoded_state).byte_config
    except StateError:
        return None


class _JournalFlusher:
    """Makes a journal durable on a thread of its own (group fsync: one fdatasync covers everything appended
    since the last one), so that a follower's tick thread goes on receiving while the disk writes; then wakes
    the tick thread through pysyncobj's poller to send the replies that waited for it."""

    def __init__(self, journal: Any, poller: Any, on_durable: Callable[[], None]) -> None:
        self._journal = journal
        self._wake = threading.Event()
        self._stopped = False
        self._notifier = PipeNotifier(poller, on_durable)  # on the tick thread: the poller is not thread-safe
        self._thread = threading.Thread(target=self._run, name="journal-flusher", daemon=True)
        self._thread.start()

    def request(self) -> None:
        self._wake.set()

    def stop(self) -> None:
        """Stop after the flush in progress, if any (before the journal is closed)."""
        self._stopped = True
        self._wake.set()
        self._thread.join()

    def _run(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            if self._stopped:
                return
            self._journal.make_durable()  # a failed flush stops the process (stop_on_sync_error)
            self._notifier.notify()


class _RaftNode(SyncObj):  # type: ignore[misc]  # pysyncobj ships no type hints
    def __init__(self, member: GroupMember, self_address: str, peers: list[str], conf: Any, transport: Any,
                 durable_journal: bool = True) -> None:
        self._member = member
        self._serializer: BackgroundSnapshots | None = None
        #: success replies waiting for the flusher: node -> (term, index claimed, its term, next index)
        self._pending_replies: dict[Any, tuple[int, int, int | None, int]] = {}
        self._durable_journal = durable_journal
        super().__init__(self_address, peers, conf=conf, transportClass=transport)

    @replicated  # type: ignore[untyped-decorator]
    def apply_command(self, payload: int) -> ApplyResult:
        """Entries of the older int carrier (journals written before RAW_COMMAND_PREFIX)."""
        # pysyncobj advances raftLastApplied after this returns: this entry's index is one more
        return self._member.apply(self.raftLastApplied + 1, decode_payload(payload))

    def propose_raw(self, command: bytes, callback: Callable[[ApplyResult | None, int], None]) -> None:
        """Append ``command`` (RAW_COMMAND_PREFIX + our bytes) to the Raft log as is: no pickling."""
        self._applyCommand(command, callback)

    # pysyncobj keeps its Serializer in a private attribute, built in __init__ before its tick thread
    # starts: assigning it hands the member's BackgroundSnapshots (which wraps it) back to every use.
    @property
    def _SyncObj__serializer(self) -> BackgroundSnapshots:
        assert self._serializer is not None  # set in SyncObj.__init__
        return self._serializer

    @_SyncObj__serializer.setter
    def _SyncObj__serializer(self, base: Any) -> None:
        self._serializer = self._member._snapshots(base)

    def _SyncObj__doApplyCommand(self, command: bytes) -> Any:
        if command[:2] == RAW_COMMAND_PREFIX:
            return self._member.apply_raw(self.raftLastApplied + 1, command)
        return SyncObj._SyncObj__doApplyCommand(self, command)

    # Safety fixes to pysyncobj 0.3.17's follower side, made by overriding its name-mangled private
    # methods (the transport callback is looked up on the instance, so these are the ones called):
    #
    # 1. An append_entries without ``prevLogIdx`` (a snapshot chunk, or the "no snapshot ready yet"
    #    message) is not checked against the follower's log, yet pysyncobj raises the follower's commit
    #    index to min(leader's commit index, its own log end). A deposed leader's uncommitted entries at
    #    the end of its log were then applied: its store diverged from the group's for good (found by the
    #    partition-leader chaos scenario). Such messages now carry no commit index beyond our own.
    # 2. After a snapshot that failed to load (our deserializer raised: catch-up could not finish),
    #    pysyncobj still answers success with its own log end, so the leader counted entries this member
    #    does not have towards a majority. A failed load now answers failure and asks for the snapshot again.
    # 3. pysyncobj deletes every entry after ``prevLogIdx`` when the log is longer, even entries identical
    #    to the leader's, and installs any snapshot it receives, even one older than what it has applied
    #    (the leader rewinds a follower's next index on stale replies and sends its snapshot when that
    #    falls below its log start). A restarted follower cut applied entries, went back to an older
    #    snapshot, and a compaction finished just before then deleted up to its index on the shortened
    #    log: the log was empty and every tick raised IndexError. Now the log is truncated only from the
    #    first conflicting entry (dledger.log_matching), a snapshot whose last entry we already hold is not
    #    installed (nor written over ours), and a success reply claims no more than the message proved.
    #
    # And one to its leader side:
    #
    # 4. The leader advances a follower's next index as it sends (pipelining), yet every success reply set
    #    it back to just after what that reply acknowledged: everything sent since was sent again. Under
    #    load that was 0.64 re-sent entries per new one (measured on the followers), each re-hashed, parsed
    #    and dropped. A success reply now only moves the next index forward; a failure (``reset``) still
    #    moves it back, as Raft's consistency check asks.

    #: the highest next index a success reply to the message being handled may claim (None: no cap)
    _reply_index_max: int | None = None
    #: flushes a journal that allows it off the tick thread (built on the first tick: see _onTick)
    _flusher: _JournalFlusher | None = None
    #: the log index this member must hold again before it votes (fix 8), or None
    _refetch_index: int | None = None
    #: why (fix 8), for the member's status
    damage: str | None = None
    _journal_checked = False
    #: until when (pysyncobj's monotonic clock) a full disk keeps this member out of elections (fix 9)
    _disk_full_until = 0.0
    #: the last index of the leader's snapshot now arriving that we are not installing (fix 3)
    _ignored_snapshot_index: int | None = None
    #: entries received in append_entries with a matching previous entry, and how many of them this member
    #: held already (sent again: after a failure reply, or a reconnection)
    entries_received = 0
    entries_already_held = 0

    def _SyncObj__onMessageReceived(self, node: Any, message: Any) -> None:
        if (isinstance(message, dict) and message.get("type") == "next_node_idx" and message.get("success")
                and not message.get("reset") and self._SyncObj__raftState == RAFT_STATE_LEADER):
            self._on_success_reply(node, int(message["next_node_idx"]))  # fix 4
            return
        held_snapshot_index = None
        if not self._journal_checked:
            self._check_journal_once()
        if isinstance(message, dict) and message.get("type") == "request_vote" and self._refetch_index is not None:
            return  # fix 8: no vote while the log may lack what this member acknowledged
        if isinstance(message, dict) and message.get("type") == "append_entries":
            message, held_snapshot_index = self._checked_append(message)
        try:
            SyncObj._SyncObj__onMessageReceived(self, node, message)
        except DiskFullError as exc:
            self._on_disk_full(exc)  # no reply: the entries not written are sent again
            return
        finally:
            self._reply_index_max = None
        if held_snapshot_index is not None:  # as pysyncobj answers an installed one, claiming only its index
            self._SyncObj__sendNextNodeIdx(node, nextNodeIdx=held_snapshot_index + 1, success=True)

    def _on_success_reply(self, node: Any, next_index: int) -> None:
        """A follower holds the log up to ``next_index - 1``: pysyncobj's handling, except that the next
        index never moves back (fix 4)."""
        match_index = self._SyncObj__raftMatchIndex
        if match_index[node] < next_index - 1:
            match_index[node] = next_index - 1
            next_indexes = self._SyncObj__raftNextIndex
            next_indexes[node] = max(next_indexes[node], next_index)
        self._SyncObj__lastResponseTime[node] = pysyncobj_monotonic()

    def _checked_append(self, message: dict[str, Any]) -> tuple[dict[str, Any], int | None]:
        """The message pysyncobj is given instead, and the index of a held snapshot whose last chunk it is."""
        if message["term"] < self.raftCurrentTerm:
            return message, None  # ignored by pysyncobj
        if "prevLogIdx" not in message:
            message, held_snapshot_index = self._checked_snapshot_chunk(message)
            return {**message, "commit_index": min(int(message.get("commit_index", 0)), self.raftCommitIndex)}, \
                held_snapshot_index
        if message.get("transmission") is not None:
            # a chunked entry: never sent here, as tuned_conf keeps every entry below half the batch size
            # (and pysyncobj's chunking is broken anyway, see DESIGN.md)
            return message, None
        raft_log = self._SyncObj__raftLog
        plan = plan_append(self._term_at, (raft_log[-1][1], raft_log[-1][2]), message["prevLogIdx"],
                           message["prevLogTerm"], message.get("entries", []), message["commit_index"])
        if plan is None:
            return message, None  # the previous entry does not match: pysyncobj's failure reply is right
        self.entries_received += len(message.get("entries", ()))
        self.entries_already_held += plan.held
        self._reply_index_max = plan.reply_index_max
        return {**message, "prevLogIdx": plan.prev_index, "prevLogTerm": plan.prev_term, "entries": plan.entries,
                "commit_index": plan.commit_index}, None

    def _checked_snapshot_chunk(self, message: dict[str, Any]) -> tuple[dict[str, Any], int | None]:
        """A chunk of the leader's snapshot, unless that snapshot is not newer than what we hold: then its
        chunks are dropped before pysyncobj writes them over our own snapshot file (which must go on
        matching our log) and its last chunk is answered for it. Decided on the first chunk, which holds
        the snapshot's last entry."""
        serialized = message.get("serialized")
        if serialized is None:
            return message, None
        data, is_first, is_last = serialized
        if is_first:
            self._ignored_snapshot_index = self._held_snapshot_index(bytes(data[:SNAPSHOT_HEAD_BYTES]))
        held_index = self._ignored_snapshot_index
        if held_index is None:
            return message, None
        if is_last:
            self._ignored_snapshot_index = None
        return {key: value for key, value in message.items() if key != "serialized"}, held_index if is_last else None

    def _held_snapshot_index(self, head: bytes) -> int | None:
        """The index of a snapshot (from its first bytes) whose last entry is applied here (so committed,
        the same on every member) or in our log with the same term; None for a newer one. Installing an
        older one would clear our log and take our applied index back (Raft §7 keeps the log then)."""
        try:
            index, term = peek_last_entry(head)
        except SnapshotError:
            return None  # pysyncobj receives it, the load fails, and that is answered as a failure (fix 2)
        if index > self.raftLastApplied and self._term_at(index) != term:
            return None
        log.info("the leader's snapshot at index %d is not newer than our log (applied %d): not installed",
                 index, self.raftLastApplied)
        return index

    def _term_at(self, index: int) -> int | None:
        raft_log = self._SyncObj__raftLog
        first = raft_log[0][1]
        if not first <= index < first + len(raft_log):
            return None
        return int(raft_log[index - first][2])

    # Durability: an entry counts as held by this member only once its journal is flushed with it.
    #
    # 5. A follower answers success only for entries on its disk (the leader counts that answer toward a
    #    majority). With our journal, whose flush may run off the tick thread (``concurrent_sync``), the reply
    #    waits in ``_pending_replies`` while the flusher thread syncs, and the tick thread goes on receiving
    #    the next entries meanwhile (group fsync); otherwise the flush runs right there.
    # 6. The leader flushes the entries it appends right after sending them to the followers (the flush and
    #    the round trip overlap) and the no-op it appends on becoming leader; and a leader's every tick starts
    #    with a flush of anything still unflushed, so its count of itself in the tick's commit step covers
    #    only flushed entries.
    # 7. Apply takes only entries on this member's disk, so the store is never ahead of its own log.
    #
    # pysyncobj counts the leader itself in every commit step without asking; these hooks are the calls that
    # precede each such step (tests/dledger/test_durable_journal.py checks that the pinned pysyncobj still
    # calls them).

    def _make_durable(self) -> None:
        """Flush the journal's new records (pysyncobj's tick thread starts before __init__ returns, so this
        looks the journal up each time; a journal in memory, as some tests use, has nothing to flush)."""
        journal = self._SyncObj__raftLog
        if isinstance(journal, SegmentedJournal):
            journal.make_durable()

    def _check_journal_once(self) -> None:
        """On the tick thread, before the first tick or message: the journal policy, and whether the journal
        found damage when it opened (or the store is ahead of it: the log lost entries this member applied),
        which holds this member out of votes until it re-fetched them (fix 8)."""
        self._journal_checked = True
        journal = self._SyncObj__raftLog
        if not isinstance(journal, SegmentedJournal):
            return
        journal.sync_enabled = self._durable_journal
        refetch = journal.refetch_index if journal.damage is not None else None
        reason = journal.damage
        store = getattr(self._member, "store", None)
        applied = store.applied_raft_index if store is not None else 0
        if applied > journal.last_index:
            refetch = max(refetch or 0, applied)
            reason = f"the store applied index {applied}, beyond the journal's last entry {journal.last_index}"
        if refetch is not None:
            self._refetch_index = refetch
            self.damage = reason
            log.critical("the Raft log may lack entries this member acknowledged (%s): it will not vote until it "
                         "holds the log up to index %d again", reason, refetch)

    def _durable_index(self) -> int | None:
        """The last index on disk here, once the flusher thread runs; None while every flush is made on the
        tick thread (before the first tick), or there is nothing to flush (page_cache policy, memory journal)."""
        journal = self._SyncObj__raftLog
        if self._flusher is None or not journal.sync_enabled:
            return None
        return int(journal.durable_index)

    def _onTick(self, timeToWait: float = 0.0) -> None:  # pysyncobj's name
        if not self._journal_checked:
            self._check_journal_once()
        journal = self._SyncObj__raftLog
        if self._flusher is None and isinstance(journal, SegmentedJournal) and journal.sync_enabled:
            self._flusher = _JournalFlusher(journal, self._poller, self._send_durable_replies)
        if self._SyncObj__raftState == RAFT_STATE_LEADER or self._flusher is None:
            self._make_durable()  # fix 6; a follower's flushes run on the flusher thread (fix 5)
        self._send_durable_replies()
        if self._refetch_index is not None:
            self._hold_back_election()
        if self._disk_full_until > pysyncobj_monotonic():
            # a member whose journal cannot take entries does not stand for election (fix 9)
            deadline: float = getattr(self, "_SyncObj__raftElectionDeadline")  # noqa: B009  (pysyncobj's field)
            setattr(self, "_SyncObj__raftElectionDeadline", max(deadline, self._disk_full_until))  # noqa: B010
        try:
            SyncObj._onTick(self, timeToWait)
        except DiskFullError as exc:  # a leader appending proposals (or its no-op): the rest of this tick is skipped
            self._on_disk_full(exc)

    # Full disk (fix 9): a journal append that finds no space raises DiskFullError (nothing half-written).
    # A leader steps down (its pending proposals fail by timeout, unacknowledged); a follower does not answer
    # (the leader sends the entries again); neither stands for election while its disk stays full, so the
    # group goes on with the other members instead of wedging behind this one.

    def _on_disk_full(self, exc: DiskFullError) -> None:
        now = pysyncobj_monotonic()
        if now >= self._disk_full_until:
            log.error("the Raft journal is out of disk space (%s): %s", exc,
                      "stepping down" if self._SyncObj__raftState == RAFT_STATE_LEADER else "not answering")
        self._disk_full_until = now + DISK_FULL_HOLD_SECONDS
        if self._SyncObj__raftState == RAFT_STATE_LEADER:
            self._SyncObj__setState(RAFT_STATE_FOLLOWER)
            setattr(self, "_SyncObj__raftLeader", None)  # noqa: B010  (pysyncobj's field)

    def _doDestroy(self) -> None:  # pysyncobj's name: closes the transport and the journal
        if self._flusher is not None:
            self._flusher.stop()
        SyncObj._doDestroy(self)

    # 10. At start-up pysyncobj loads our snapshot and, unless the journal's first two entries are the
    #     snapshot's last two, clears the journal down to those two. A member stopped after its snapshot was
    #     renamed into place but before the journal was compacted to it (the next tick does that) held the
    #     snapshot's entries further in, and lost every entry after them: entries it had acknowledged. The
    #     journal is now compacted to the snapshot first (atomically), keeping what follows.

    def _SyncObj__loadDumpFile(self, clearJournal: bool) -> None:
        if not clearJournal:
            self._compact_to_snapshot()
        SyncObj._SyncObj__loadDumpFile(self, clearJournal)

    def _compact_to_snapshot(self) -> None:
        path = self._SyncObj__conf.fullDumpFile
        journal = self._SyncObj__raftLog
        if path is None or len(journal) < 3:
            return
        try:
            snapshot = read_snapshot(Path(path))
        except (OSError, SnapshotError):
            return  # pysyncobj's load fails the same way and says so
        previous, last = snapshot.previous_entry, snapshot.last_entry
        position = previous[1] - journal[0][1]
        if not 0 < position < len(journal) - 1:
            return
        held_previous, held_last = journal[position], journal[position + 1]
        if (held_previous[1:], held_last[1:]) == (tuple(previous[1:]), tuple(last[1:])):
            log.info("compacting the Raft journal to the snapshot at index %d before loading it", last[1])
            journal.deleteEntriesTo(position)

    def _SyncObj__getEntries(self, fromIDx: int | None, count: int | None = None,
                             maxSizeBytes: int | None = None) -> list[tuple[bytes, int, int]]:
        """pysyncobj's, reading no further than it returns: pysyncobj sliced the log to its end, then cut
        the slice to a batch, which on a journal that reads entries from disk read the whole rest."""
        journal = self._SyncObj__raftLog
        if isinstance(journal, SegmentedJournal):
            return journal.get_entries(fromIDx, count, maxSizeBytes)
        return list(SyncObj._SyncObj__getEntries(self, fromIDx, count, maxSizeBytes))

    def _SyncObj__applyLogEntries(self) -> bool:
        """Apply only entries on disk here (fix 7): a follower's flush runs off the tick thread, and the
        store must never be ahead of its own log."""
        durable = self._durable_index()
        commit_index: int = getattr(self, "_SyncObj__raftCommitIndex")  # noqa: B009  (pysyncobj's private field)
        if durable is None or durable >= commit_index:
            return bool(SyncObj._SyncObj__applyLogEntries(self))
        assert self._flusher is not None  # (durable is None without it)
        self._flusher.request()  # the rest applies once it is on disk
        setattr(self, "_SyncObj__raftCommitIndex", durable)  # noqa: B010  (for this apply only)
        try:
            return bool(SyncObj._SyncObj__applyLogEntries(self))
        finally:
            setattr(self, "_SyncObj__raftCommitIndex", commit_index)  # noqa: B010

    def _send_durable_replies(self) -> None:
        """Answer the success replies held back until what they claim was on disk (fix 5). A reply whose
        entry was cut meanwhile, or whose term passed, is dropped: it would claim entries no longer held."""
        if not self._pending_replies:
            return
        durable = self._durable_index()
        for node, (term, index, entry_term, next_index) in list(self._pending_replies.items()):
            if term != self.raftCurrentTerm or self._term_at(index) not in (entry_term, None):
                del self._pending_replies[node]
            elif durable is None or durable >= index:
                del self._pending_replies[node]
                SyncObj._SyncObj__sendNextNodeIdx(self, node, nextNodeIdx=next_index, success=True)

    # Damage (fix 8): a member whose journal lost or damaged entries it may have acknowledged (found when it
    # opened the journal, or a store ahead of its log) neither votes nor stands for election until it holds
    # the log up to everything it could have acknowledged again, committed by a leader. Otherwise its vote
    # could elect a member that lacks an entry that only it and the old leader held.

    def _hold_back_election(self) -> None:
        refetch = self._refetch_index
        assert refetch is not None
        held = self._SyncObj__getCurrentLogIndex()
        durable = self._durable_index()
        if (self.raftCommitIndex >= refetch and held >= refetch and (durable is None or durable >= refetch)
                and self._SyncObj__raftLeader is not None):
            log.warning("the Raft log is whole again up to index %d (committed %d): voting again", refetch,
                        self.raftCommitIndex)
            self._refetch_index = None
            self.damage = None
            journal = self._SyncObj__raftLog
            if isinstance(journal, SegmentedJournal):
                journal.clear_damage()
            return
        # pysyncobj starts an election when this deadline passes: pushed a whole timeout on while held back
        setattr(self, "_SyncObj__raftElectionDeadline",  # noqa: B010  (pysyncobj's field)
                pysyncobj_monotonic() + self._SyncObj__generateRaftTimeout())

    def _SyncObj__onBecomeLeader(self) -> None:
        SyncObj._SyncObj__onBecomeLeader(self)
        self._make_durable()

    def _checkCommandsToApply(self) -> None:
        """Commit latency: in batch mode pysyncobj sends new entries only every ``appendEntriesPeriod``, so
        an entry waited up to a period (5 ms) before it left. Entries this tick added are now sent at once.
        pysyncobj advances a follower's next index as it sends (pipelining), so this sends only the new
        entries, not what is in flight; group commit already made them large, so it is about one message
        per entry and follower. Measured at 1,000 msgs/s: p50 5.4 -> 2.3 ms, p99 ~10 -> 6.4-8.8 ms;
        throughput unchanged within noise. Sending an append_entries early is always safe in Raft."""
        before = self._SyncObj__getCurrentLogIndex()
        SyncObj._checkCommandsToApply(self)
        if self._SyncObj__raftState != RAFT_STATE_LEADER or self._SyncObj__getCurrentLogIndex() <= before:
            return
        self._SyncObj__sendAppendEntries()
        self._make_durable()  # fix 6

    def _SyncObj__sendNextNodeIdx(self, node: Any, reset: bool = False, nextNodeIdx: int | None = None,
                                  success: bool = False) -> None:
        if success and self._member.snapshot_load_failed:
            self._member.snapshot_load_failed = False
            SyncObj._SyncObj__sendNextNodeIdx(self, node, reset=True, nextNodeIdx=1, success=False)
            return
        if success and self._reply_index_max is not None:
            if nextNodeIdx is None:
                nextNodeIdx = self._SyncObj__getCurrentLogIndex() + 1
            nextNodeIdx = min(nextNodeIdx, self._reply_index_max)
        if success:
            if nextNodeIdx is None:
                nextNodeIdx = self._SyncObj__getCurrentLogIndex() + 1
            durable = self._durable_index()
            if durable is None:
                self._make_durable()  # fix 5, on this thread
            elif durable < nextNodeIdx - 1:  # fix 5: answered once the flusher has it on disk
                index = nextNodeIdx - 1
                self._pending_replies[node] = (self.raftCurrentTerm, index, self._term_at(index), nextNodeIdx)
                assert self._flusher is not None
                self._flusher.request()
                return
        SyncObj._SyncObj__sendNextNodeIdx(self, node, reset=reset, nextNodeIdx=nextNodeIdx, success=success)


class GroupMember:
    def __init__(self, config: NodeConfig, on_role_change: Callable[[RoleChange], None] | None = None) -> None:
        self.config = config.validate()
        self._refuse_other_recorded_byte_config()  # first: a member that must not start writes nothing
        self.on_role_change = on_role_change
        #: called on the Raft thread after every applied entry (long polling wake-ups): must be quick
        self.on_applied: Callable[[], None] | None = None
        #: the last snapshot install failed (see _RaftNode): answered as a failure, not pysyncobj's success
        self.snapshot_load_failed = False
        self.raft_dir = config.data_dir / "raft"
        self.raft_dir.mkdir(parents=True, exist_ok=True)
        self.snapshot_path = self.raft_dir / "snapshot"
        #: pysyncobj's compaction and snapshot transfers (set while pysyncobj starts, see _RaftNode)
        self.snapshots: BackgroundSnapshots
        self.state = ReplicatedState()
        #: held around every change to self.state; a store flush (any thread) encodes it under this lock
        self._state_lock = threading.Lock()
        self.store = MessageStore(config.store_config, extension_provider=self._encode_state)
        if self.store.extension:
            try:
                self.state = ReplicatedState.decode(self.store.extension)
            except StateError as exc:
                log.warning("replicated state in the checkpoint is unreadable (%s): rebuilding from Raft", exc)
        self.machine = StateMachine(self.store, self.state, state_lock=self._state_lock, repair=self._repair)
        self._role = RoleChange("follower", 0, None)
        self._apply_lock = threading.Lock()
        self._own_lock = threading.Lock()
        self._leader_name: tuple[object, str] = (None, "")  # (pysyncobj's leader node, its name)
        #: pysyncobj's state is leader: set first thing by its state-change callback (on its tick thread)
        self._leading = False
        #: bytes of entries applied since the last forced compaction (tick thread only)
        self._uncompacted_bytes = 0
        #: id(raw command) -> (the raw command, what it encodes); the command is held, so the id stays unique
        self._own_entries: OrderedDict[int, tuple[bytes, OwnBatch]] = OrderedDict()
        self.catchup_server = CatchupServer(parse_address(config.catchup_address, "catchup_address"),
                                            config.secret, self.store)
        store_config = config.store_config
        self.entry_bytes_max = max(config.group_commit.batch_bytes_max, store_config.body_size_max_bytes + 65536)
        raft = config.raft
        conf = tuned_conf(
            append_entries_period_seconds=raft.append_entries_period_ms / 1000,
            raft_min_timeout_seconds=raft.election_timeout_min_ms / 1000,
            raft_max_timeout_seconds=raft.election_timeout_max_ms / 1000,
            entry_size_max_bytes=self.entry_bytes_max + ENTRY_OVERHEAD_BYTES,
            journal_file=str(self.raft_dir / "journal"),
            full_dump_file=str(self.snapshot_path),
            serializer=self._write_snapshot,
            deserializer=self._load_snapshot,
            log_compaction_min_entries=raft.log_compaction_entries,
            log_compaction_min_time_seconds=raft.log_compaction_seconds,
            extra={"onStateChanged": self._on_state_changed},
        )
        peers = [peer.raft_address for peer in config.peers]
        builder = RecordBuilder(store_config.store_host_bytes, store_config.segment_size_bytes,
                                store_config.body_size_max_bytes, excluded_topics=(TIMER_TOPIC,))
        #: the group's time (a majority of the members' clocks, fed by the transport): what the leader stamps
        #: and what the broker's services run by, never one member's clock (dledger.group_clock)
        self.group_clock = GroupClock(1 + len(config.peers), lambda: replicated_floor_ms(self.state))
        self.committer = GroupCommitter(config.group_commit, self._propose_raw, self._leadership, self.entry_bytes_max,
                                        store_config.body_size_max_bytes, wall_clock_ms=self.group_clock.now_ms,
                                        prepare=builder.build, command_prefix=RAW_COMMAND_PREFIX)
        self._transfer: tuple[str, float] | None = None  # (target address or "" for any, deadline)
        self._next_transfer_attempt = 0.0
        self._next_preference_check = 0.0
        preferred = [p.raft_address for p in config.peers if p.id == config.preferred_leader]
        self._preferred_address: str | None = preferred[0] if preferred else None
        #: the group's byte configuration is applied here (and is ours): until then this member proposes
        #: nothing else (the committer holds sends back, propose() waits), so nothing is stored before it
        self._byte_config_applied = threading.Event()
        self._byte_config_term: int | None = None  # the term this member proposed its configuration in
        self._note_byte_config()
        self.raft = _RaftNode(self, config.raft_address, peers, conf,
                              transport_class(config.secret, group_clock=self.group_clock),
                              durable_journal=raft.journal_flush == "durable")
        self.raft.addOnTickCallback(self._on_tick)
        self._stop_scrubber = threading.Event()
        self._scrubber = threading.Thread(target=self._scrub_loop, name="scrubber", daemon=True)
        self._scrubber.start()

    # ------------------------------------------------------------------ apply (tick thread)

    def apply_raw(self, raft_index: int, command: bytes) -> ApplyResult:
        """A raw command from the log. On the leader, the very object it proposed comes back: its decoded
        form is looked up by identity (no hashing of the entry's bytes)."""
        with self._own_lock:
            entry = self._own_entries.pop(id(command), None)
        own = entry[1] if entry is not None and entry[0] is command else None
        self._uncompacted_bytes += len(command)
        if self._uncompacted_bytes >= self.config.raft.log_compaction_bytes:
            self._uncompacted_bytes = 0
            self.raft.forceLogCompaction()  # taken up by pysyncobj on its next tick (this thread)
        if own is not None:  # nothing to decode: not even a copy of the entry without its prefix
            return self.apply(raft_index, b"", own)
        return self.apply(raft_index, command[len(RAW_COMMAND_PREFIX):])

    def apply(self, raft_index: int, data: bytes, own: OwnBatch | None = None) -> ApplyResult:
        """Total: a programmer error stops the process (a stalled or diverged replica is worse)."""
        try:
            with self._apply_lock:
                result = self.machine.apply(raft_index, data, own)
            if not self._byte_config_applied.is_set():
                self._note_byte_config()
            if self.on_applied is not None:
                self.on_applied()
            return result
        except ByteConfigMismatchError as exc:
            self._stop_for_byte_config(exc)
        except DamagedRecordError as exc:
            log.critical("apply at index %d needs a damaged record no peer could repair: %s. Stopping this member "
                         "before it decides anything from it; on restart the entry applies again and the repair "
                         "is tried again", raft_index, exc)
            logging.shutdown()
            os._exit(EXIT_DAMAGED_RECORD)
        except Exception:
            log.critical("apply failed at index %d: stopping this member", raft_index, exc_info=True)
            logging.shutdown()
            os._exit(EXIT_APPLY_INVARIANT)

    # ------------------------------------------------------------------ snapshots (tick thread)

    def _encode_state(self) -> bytes:
        """The replicated state for the store's checkpoint: whole, whichever thread flushes."""
        with self._state_lock:
            return self.state.encode()

    def _snapshots(self, base: Any) -> BackgroundSnapshots:
        """What pysyncobj's compaction and snapshot transfers go through (see _RaftNode)."""
        self.snapshots = BackgroundSnapshots(base, self.snapshot_path, self._capture_snapshot, self.store.flush)
        return self.snapshots

    def _capture_snapshot(self, data: Any) -> Snapshot:
        """pysyncobj's log compaction, on the tick thread: ``data`` is (last applied entry, previous entry,
        cluster). The store is flushed (its checkpoint then covers the index) and the file written by
        BackgroundSnapshots, off this thread."""
        last_entry, previous_entry, cluster = data
        with self._apply_lock:
            if self.state.applied_index < last_entry[1]:
                with self._state_lock:  # pysyncobj-internal entries (no-ops) apply nothing
                    self.state.applied_index = last_entry[1]
            return Snapshot(
                last_entry=(bytes(last_entry[0]), last_entry[1], last_entry[2]),
                previous_entry=(bytes(previous_entry[0]), previous_entry[1], previous_entry[2]),
                commit_log_min=self.store.commit_log.min_offset,
                commit_log_end=self.store.max_physical_offset,
                members=tuple(sorted(str(node) for node in cluster)),
                state=self.state.encode(),
            )

    def _write_snapshot(self, file_name: str, data: Any) -> None:
        """pysyncobj's ``serializer`` setting. It must be set (without it pysyncobj gathers its own
        attributes for every compaction), but BackgroundSnapshots.serialize takes over: never called."""
        raise AssertionError("snapshots are written by BackgroundSnapshots")

    def _load_snapshot(self, file_name: str) -> tuple[Any, Any, Any]:
        """Install a snapshot: at start-up our own; on a lagging follower, the leader's, after copying the
        commit-log bytes it lacks from a peer. Raising leaves everything as it was (pysyncobj logs it; the
        leader is told the install failed and sends the snapshot again)."""
        try:
            return self._install_snapshot(file_name)
        except BaseException:
            self.snapshot_load_failed = True
            raise

    def _install_snapshot(self, file_name: str) -> tuple[Any, Any, Any]:
        snapshot = read_snapshot(Path(file_name))
        # before any byte is copied: the peers' bytes are laid out with the group's settings
        self._stop_unless_groups_byte_config(_byte_config_in(snapshot.state),
                                             f"the group's, in the snapshot {file_name}")
        with self._apply_lock:
            if self.store.applied_raft_index < snapshot.index:
                peers = [parse_address(peer.catchup_address, "catchup_address") for peer in self.config.peers]
                log.info("catching up to index %d (commit log end %d) from peers", snapshot.index,
                         snapshot.commit_log_end)
                fetch(peers, self.config.secret, self.store, snapshot.commit_log_end, snapshot.index)
            if self.state.applied_index < snapshot.index:
                installed = ReplicatedState.decode(snapshot.state)
                with self._state_lock:
                    for state_field in dataclasses.fields(ReplicatedState):
                        setattr(self.state, state_field.name, getattr(installed, state_field.name))
                self.store.flush()
        if not self._byte_config_applied.is_set():
            self._note_byte_config()
        return snapshot.last_entry, snapshot.previous_entry, frozenset(snapshot.members)

    # ------------------------------------------------------------------ the group's byte configuration

    def _refuse_other_recorded_byte_config(self) -> None:
        """Before anything is opened or written: the group's byte configuration this member recorded (in its
        store's checkpoint, or in its Raft snapshot) must be its own settings', or it stops at once. A file
        that cannot be read is left to the store's recovery and to Raft."""
        checkpoint_path = self.config.store_config.data_dir / CHECKPOINT_NAME
        snapshot_path = self.config.data_dir / "raft" / "snapshot"
        try:
            checkpoint = read_checkpoint(checkpoint_path)
        except (CorruptionError, OSError):
            checkpoint = None
        if checkpoint is not None:
            self._stop_unless_groups_byte_config(_byte_config_in(checkpoint.extension),
                                                 f"the group's, recorded in {checkpoint_path}")
        try:
            snapshot = read_snapshot(snapshot_path) if snapshot_path.exists() else None
        except (SnapshotError, OSError):
            snapshot = None
        if snapshot is not None:
            self._stop_unless_groups_byte_config(_byte_config_in(snapshot.state),
                                                 f"the group's, recorded in {snapshot_path}")

    def _stop_unless_groups_byte_config(self, group: ByteConfig | None, source: str) -> None:
        try:
            check_byte_config(ByteConfig.of(self.config.store_config), group, source)
        except ByteConfigMismatchError as exc:
            self._stop_for_byte_config(exc)

    def _stop_for_byte_config(self, exc: ByteConfigMismatchError) -> NoReturn:
        """A member whose settings are not the group's stops (a supervisor that restarts it gets the same
        answer until its configuration is fixed): nothing was written with them."""
        log.critical("%s; stopping (exit code %d)", exc, EXIT_BYTE_CONFIG_MISMATCH)
        logging.shutdown()
        os._exit(EXIT_BYTE_CONFIG_MISMATCH)

    def _note_byte_config(self) -> None:
        """Hold the committer back while the group's byte configuration is not applied here; let it go (unless
        a leadership transfer holds it) once it is. It is ours then: apply stops a member whose is not."""
        if self.state.byte_config is None:
            self.committer.pause()
            return
        if not self._byte_config_applied.is_set():
            self._byte_config_applied.set()
            if self._transfer is None:
                self.committer.resume()

    def _propose_byte_config(self) -> None:
        """On the tick thread, while the group's byte configuration is not applied here: as leader, propose
        our own, once per term (again after a failed proposal). Nothing else this member proposes goes before
        it. A leader that has not applied an earlier one yet proposes a second: the first applied stays the
        group's, and a leader whose settings differ from it stops when it applies it."""
        if not self._leading:
            return
        term = int(self.raft.raftCurrentTerm)
        if self._byte_config_term == term:
            return
        self._byte_config_term = term
        config = ByteConfig.of(self.config.store_config)

        def proposed(result: ApplyResult | None, reason: int) -> None:
            if reason != 0 and self._byte_config_term == term:
                self._byte_config_term = None

        log.info("proposing this member's byte configuration as the group's (term %d): %s", term,
                 ", ".join(f"{name} = {value}" for name, value in config.settings))
        self._propose(encode_command(Command((config,))), proposed)

    # ------------------------------------------------------------------ roles

    def _on_state_changed(self, old_state: int, new_state: int) -> None:
        if new_state != RAFT_STATE_LEADER:
            self._leading = False  # first: sends are no longer taken on the fast path
        status = self.raft.getStatus() if hasattr(self, "raft") else {}
        leader = status.get("leader")
        change = RoleChange(RAFT_STATES.get(new_state, str(new_state)), int(status.get("raft_term", 0)),
                            str(leader) if leader is not None else None)
        self._role = change
        if change.role == "leader":
            self.committer.raise_stamp_floor(self.state.last_store_timestamp)
            self._leading = True
        else:
            self.committer.step_down()
        log.info("role %s -> %s (term %d)", RAFT_STATES.get(old_state), change.role, change.term)
        if self.on_role_change is not None:
            self.on_role_change(change)

    def _leadership(self) -> tuple[bool, str | None]:
        """(whether this member leads, the leader's name when it does not and one is known). Read on every
        send: while leading, one attribute (~2% of the leader's time when it asked pysyncobj twice). It can
        be a step behind pysyncobj's state for as long as the callback takes to run; an append accepted in
        that moment gets its answer from pysyncobj (not leader), as one accepted just before would."""
        if self._leading:
            return _LEADING
        leader = self.raft._getLeader()
        is_leader = self.raft._isLeader()
        if leader is None:
            return bool(is_leader), None
        named = self._leader_name
        if named[0] is not leader:  # the name is built once per leader, not on every send
            named = self._leader_name = (leader, str(leader))
        return bool(is_leader), named[1]

    @property
    def is_leader(self) -> bool:
        return self._leadership()[0]

    def status(self) -> MemberStatus:
        raft_status = self.raft.getStatus()
        leader = raft_status.get("leader")
        return MemberStatus(
            node_id=self.config.id,
            role=RAFT_STATES.get(int(raft_status.get("state", 0)), "unknown"),
            term=int(raft_status.get("raft_term", 0)),
            leader=str(leader) if leader is not None else None,
            commit_index=int(raft_status.get("commit_idx", 0)),
            applied_index=self.machine.applied_index,
            commit_log_max_offset=self.store.max_physical_offset,
            commit_log_min_offset=self.store.commit_log.min_offset,
            uniq_key_collisions=self.machine.key_collisions,
            journal_syncs=self.journal_syncs,
            damage=self.raft.damage,
        )

    @property
    def journal_syncs(self) -> int:
        journal = self.raft._SyncObj__raftLog
        return journal.syncs if isinstance(journal, SegmentedJournal) else 0

    # ------------------------------------------------------------------ writes

    def _propose(self, data: bytes, callback: Callable[[ApplyResult | None, int], None],
                 own: OwnBatch | None = None) -> None:
        self._propose_raw(RAW_COMMAND_PREFIX + data, callback, own)

    def _propose_raw(self, command: bytes, callback: Callable[[ApplyResult | None, int], None],
                     own: OwnBatch | None = None) -> None:
        """Propose ``command``: RAW_COMMAND_PREFIX and our command's bytes (group commit encodes them so,
        in one piece: adding the prefix here copied every entry once more)."""
        if len(command) >= OUT_OF_BAND_MIN_BYTES:
            # hashed here, off the Raft thread, which then finds the digest for each follower it sends to
            ENTRY_DIGESTS.remember(command)
        if own is not None:
            # remembered so apply need not decode what this leader encoded (bounded: an entry that never
            # applies here, after a leader change, just falls out)
            with self._own_lock:
                self._own_entries[id(command)] = (command, own)
                while len(self._own_entries) > OWN_ENTRIES_MAX:
                    self._own_entries.popitem(last=False)
        self.raft.propose_raw(command, callback)

    def append(self, messages: Sequence[MessageInput],
               callback: Callable[[AppendFuture[tuple[AppendResult, ...]]], object] | None = None,
               ) -> AppendFuture[tuple[AppendResult, ...]]:
        """Replicate ``messages`` (one send or one atomic batch) through group commit; ``callback``, if
        given, runs when the future is done (as ``add_done_callback``, without its lock)."""
        return self.committer.submit(messages, callback)

    def propose(self, command: Command, timeout_seconds: float = 10.0) -> ApplyResult:
        """Replicate a command other than plain messages (offsets, config, retention) and wait for it."""
        is_leader, leader = self._leadership()
        if not is_leader:
            raise NotLeaderError(leader)
        if not self._byte_config_applied.wait(timeout_seconds):  # nothing goes before the byte configuration
            raise OutcomeUnknownError("the group's byte configuration is not applied here yet: "
                                      "nothing was proposed")
        data = encode_command(command)
        if len(data) > self.entry_bytes_max:
            raise ValueError(f"command of {len(data)} bytes exceeds one entry")
        done = threading.Event()
        outcome: list[tuple[ApplyResult | None, int]] = []

        def on_result(result: ApplyResult | None, reason: int) -> None:
            outcome.append((result, reason))
            done.set()

        self._propose(data, on_result)
        if not done.wait(timeout_seconds):
            raise OutcomeUnknownError(f"no apply within {timeout_seconds} s")
        result, reason = outcome[0]
        if reason != 0 or result is None:
            raise OutcomeUnknownError(f"proposal failed (reason {reason})")
        return result

    def request_bytes(self, messages: Sequence[MessageInput]) -> int:
        return request_bytes(messages)

    def transfer_leadership(self, target_node_id: str | None = None) -> None:
        """Hand leadership to ``target_node_id`` (or the most caught-up follower) before a planned restart.

        As DLedger does, new entries are held back (callers wait; nothing fails) until the target has
        caught up and leadership moved, for at most TRANSFER_TIMEOUT_SECONDS. Carried out on the Raft
        thread; poll :meth:`status` to see it done."""
        is_leader, leader = self._leadership()
        if not is_leader:
            raise NotLeaderError(leader)
        target = ""
        if target_node_id is not None:
            matches = [peer.raft_address for peer in self.config.peers if peer.id == target_node_id]
            if not matches:
                raise ValueError(f"no member named {target_node_id!r}")
            target = matches[0]
        self.committer.pause()
        self._transfer = (target, time.monotonic() + TRANSFER_TIMEOUT_SECONDS)

    def _on_tick(self) -> None:
        """On pysyncobj's thread (its state and transport are not thread-safe): a pending transfer, and
        the preferred leader taking leadership back once it is connected and caught up (as DLedger's
        preferred leader does: to restart the preferred member, stop it; it leads again when back). And the
        group's byte configuration, proposed by a leader before anything else."""
        if not self._byte_config_applied.is_set():
            self._propose_byte_config()
        now = time.monotonic()
        if now < self._next_transfer_attempt:
            return
        self._next_transfer_attempt = now + TRANSFER_RETRY_SECONDS
        is_leader = self.raft._isLeader()
        if self._transfer is not None:
            target, deadline = self._transfer
            if not is_leader or now > deadline:
                self._transfer = None  # done (or given up): proposing resumes, or a new leader takes over
                if self._byte_config_applied.is_set():  # else it resumes once the configuration applies
                    self.committer.resume()
            else:
                self.raft.transferLeadership(target or None)  # denied until the target has caught up
            return
        if self._preferred_address is None or not is_leader or now < self._next_preference_check:
            return
        self._next_preference_check = now + PREFERENCE_CHECK_SECONDS
        self.raft.transferLeadership(self._preferred_address)

    # ------------------------------------------------------------------ lifecycle

    def wait_ready(self, timeout_seconds: float) -> bool:
        """Poll until this member knows a leader and has applied what it knows is committed."""
        deadline = time.monotonic() + timeout_seconds
        while time.monotonic() < deadline:
            status = self.raft.getStatus()
            if status.get("leader") is not None and self.raft.raftLastApplied >= status.get("leader_commit_idx", 1 << 62):
                return True
            time.sleep(0.02)
        return False

    # ------------------------------------------------------------------ scrubbing (its own thread)

    def _scrub_loop(self) -> None:
        """Walk the commit log validating every record, again and again, at a bounded pace; a damaged
        record (a byte gone bad on disk) is put back from a peer's copy, which is byte-identical."""
        position = 0
        end = self.store.max_physical_offset
        while not self._stop_scrubber.wait(SCRUB_PAUSE_SECONDS):
            # while the group writes faster than the scrubber reads, it yields the GIL to the write path
            # and reads a quarter as much (pulls check what they serve meanwhile)
            previous_end, end = end, self.store.max_physical_offset
            step = SCRUB_BYTES // 4 if end - previous_end >= SCRUB_BYTES else SCRUB_BYTES
            try:
                damaged, position = self.store.scrub(position, step)
                if damaged is not None:
                    self._repair(damaged)
                    position = damaged
            except (StoreError, OSError, ValueError) as exc:
                log.warning("scrubbing stopped at %d: %s", position, exc)
                position = 0

    def _repair(self, physical_offset: int) -> None:
        size = self.store.record_extent(physical_offset)
        peers = [parse_address(peer.catchup_address, "catchup_address") for peer in self.config.peers]
        if not 0 < size <= self.entry_bytes_max:
            raise StoreError(f"the damaged record at {physical_offset} has no usable size ({size})")
        log.critical("damaged record at commit-log offset %d: repairing it from a peer", physical_offset)
        try:
            data = fetch_range(peers, self.config.secret, physical_offset, physical_offset + size)
            self.store.repair_record(physical_offset, data)
        except (CatchupError, RecordError) as exc:
            raise StoreError(f"cannot repair the record at {physical_offset}: {exc}") from exc

    def stop(self) -> None:
        self._stop_scrubber.set()
        self.committer.stop()
        self.raft.destroy()  # the tick thread stops at its next tick: wait for it, so that nothing applies
        tick_thread = self.raft._SyncObj__thread  # or starts a compaction once the store is closed
        if tick_thread is not None and tick_thread is not threading.current_thread():
            tick_thread.join(STOP_TICK_WAIT_SECONDS)
        self.snapshots.settle()  # a compaction in flight flushes the store: let it finish first
        self.catchup_server.close()
        with self._apply_lock:
            self.store.close()
