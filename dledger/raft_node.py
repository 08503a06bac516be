"""The one place that reaches into pysyncobj's private names: our Raft node (a ``SyncObj`` subclass whose
overrides fix pysyncobj 0.3.17's follower and leader sides and make entries count only once durable), the
flusher thread, our journal in place of pysyncobj's, and how our commands sit in pysyncobj's log.

pysyncobj stays the Raft library; everything here overrides its name-mangled private methods and reads its
private fields (``_SyncObj__...``), which a pysyncobj release may rename: tests/dledger/test_durable_journal.py
(``test_the_pinned_pysyncobj_still_has_what_the_hooks_override``) and tests/dledger/test_segmented_journal.py
(``test_pinned_pysyncobj_still_uses_the_journal_as_we_implement_it``) fail loudly when the pinned version
stops having or calling what we override, and the behaviour tests next to them say what would break.
``dledger.member.GroupMember`` (the member: store, apply, group commit, snapshots) uses only the public
side of :class:`RaftNode`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import pysyncobj.syncobj
from pysyncobj import SyncObj, replicated
from pysyncobj.monotonic import monotonic as pysyncobj_monotonic

from commitlog.errors import DiskFullError
from dledger.apply import ApplyResult
from dledger.journal import SegmentedJournal, create_journal
from dledger.log_matching import plan_append
from dledger.snapshot import (
    SNAPSHOT_HEAD_BYTES,
    BackgroundSnapshots,
    SnapshotError,
    peek_last_entry,
    read_snapshot,
)
from dledger.stages import DurationHistogram, StageHistograms
from dledger.wake_pipe import WakePipe

log = logging.getLogger(__name__)

RAFT_STATES = {0: "follower", 1: "candidate", 2: "leader"}
RAFT_STATE_LEADER = 2
RAFT_STATE_FOLLOWER = 0
#: how long a member whose journal found the disk full stays out of elections after the last failure
DISK_FULL_HOLD_SECONDS = 5.0

#: pysyncobj builds its journal inside SyncObj.__init__ by calling this module global: ours instead, a
#: checksummed, segmented journal (dledger.journal; pysyncobj's own file journal is imported once)
pysyncobj.syncobj.createJournal = create_journal

#: how our commands sit in pysyncobj's log: its REGULAR command type byte, then a byte no pickle starts
#: with (protocol 2+ begins with 0x80, protocol 0 with an opcode character), then our command's bytes.
#: pysyncobj would pickle the arguments of a ``@replicated`` call and unpickle them again at apply; binary
#: data had to travel as one big int (the cheapest protocol-2 carrier), and converting whole entries to
#: and from ints and pickles cost every member CPU for every entry, the leader most.
RAW_COMMAND_PREFIX = b"\x00\xfe"


def encode_payload(data: bytes) -> int:
    """The older carrier: the command as one Python int (0x01 prefix keeps leading zero bytes). Entries
    written that way by earlier versions still replay through ``apply_command``."""
    return int.from_bytes(b"\x01" + data, "big")


def decode_payload(payload: int) -> bytes:
    return payload.to_bytes((payload.bit_length() + 7) // 8, "big")[1:]


class RaftHost(Protocol):
    """What the Raft node needs of its member (dledger.member.GroupMember)."""

    #: the last snapshot install failed: answered as a failure, not pysyncobj's success
    snapshot_load_failed: bool

    def apply(self, raft_index: int, data: bytes) -> ApplyResult: ...

    def apply_raw(self, raft_index: int, command: bytes) -> ApplyResult: ...

    def _snapshots(self, base: Any) -> BackgroundSnapshots: ...


class _JournalFlusher:
    """Makes a journal durable on a thread of its own (group fsync: one fdatasync covers everything appended
    since the last one), so that a follower's tick thread goes on receiving while the disk writes; then wakes
    the tick thread through pysyncobj's poller to send the replies that waited for it."""

    def __init__(self, journal: Any, poller: Any, on_durable: Callable[[], None],
                 on_flushed: Callable[[float], None] = lambda seconds: None) -> None:
        self._journal = journal
        self._on_flushed = on_flushed
        self._wake = threading.Event()
        self._stopped = False
        #: flushes run (tests wait for one to know the flusher is idle)
        self.cycles = 0
        self._notifier = WakePipe(poller, on_durable)  # on the tick thread: the poller is not thread-safe
        self._thread = threading.Thread(target=self._run, name="journal-flusher", daemon=True)
        self._thread.start()

    def request(self) -> None:
        self._wake.set()

    @property
    def pending(self) -> bool:
        """A flush was asked for and has not started."""
        return self._wake.is_set()

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
            syncs = self._journal.syncs
            started = time.monotonic()
            self._journal.make_durable()  # a failed flush stops the process (stop_on_sync_error)
            if self._journal.syncs != syncs:
                self._on_flushed(time.monotonic() - started)
            self._notifier.notify()
            self.cycles += 1


class RaftNode(SyncObj):  # type: ignore[misc]  # pysyncobj ships no type hints
    def __init__(self, member: RaftHost, self_address: str, peers: list[str], conf: Any, transport: Any,
                 durable_journal: bool = True, stages: StageHistograms | None = None) -> None:
        self._member = member
        #: where the send path's time goes (dledger.stages): propose_wait, replication, leader_fsync, apply
        self.stages = stages if stages is not None else StageHistograms()
        #: every fdatasync of the journal made by the flusher thread, whatever the role (broker.metrics)
        self.journal_fsyncs = DurationHistogram()
        #: when each command still in pysyncobj's queue was proposed (its queue is first in, first out)
        self._proposed_at: deque[float] = deque(maxlen=1 << 16)
        #: when the leader appended and sent each entry not applied yet, by index
        self._sent_at: dict[int, float] = {}
        self._serializer: BackgroundSnapshots | None = None
        #: success replies waiting for the flusher: node -> (term, index claimed, its term, next index)
        self._pending_replies: dict[Any, tuple[int, int, int | None, int]] = {}
        self._durable_journal = durable_journal
        super().__init__(self_address, peers, conf=conf, transportClass=transport)

    def journal(self) -> Any:
        """pysyncobj's journal: ours (SegmentedJournal), or its memory journal without a journal file."""
        return self._SyncObj__raftLog

    def follower_lag(self, address: str) -> int | None:
        """On the tick thread, as leader: how many of the log's entries the member at ``address`` is not
        known to hold; None when it is not connected (or not a member)."""
        for node in self._SyncObj__otherNodes:
            if node.address == address:
                if node not in self._SyncObj__connectedNodes:
                    return None
                lag: int = self._SyncObj__getCurrentLogIndex() - self._SyncObj__raftMatchIndex.get(node, 0)
                return lag
        return None

    def tick_thread(self) -> threading.Thread | None:
        """pysyncobj's tick thread (None without autoTick)."""
        thread: threading.Thread | None = self._SyncObj__thread
        return thread


    @replicated  # type: ignore[untyped-decorator]
    def apply_command(self, payload: int) -> ApplyResult:
        """Entries of the older int carrier (journals written before RAW_COMMAND_PREFIX)."""
        # pysyncobj advances raftLastApplied after this returns: this entry's index is one more
        return self._member.apply(self.raftLastApplied + 1, decode_payload(payload))

    def propose_raw(self, command: bytes, callback: Callable[[ApplyResult | None, int], None]) -> None:
        """Append ``command`` (RAW_COMMAND_PREFIX + our bytes) to the Raft log as is: no pickling; the tick
        thread is woken to send it at once (pysyncobj's batch mode wakes it for nothing: a proposal waited
        for the poll timeout, up to ``autoTickPeriod``)."""
        self._proposed_at.append(time.monotonic())
        self._applyCommand(command, callback)
        if not self._taking:
            self._wake_tick_thread()

    def _wake_tick_thread(self) -> None:
        """Cut the tick thread's poll short (any thread): one byte in a pipe, unless one is already on its
        way (the flag is cleared on the tick thread before the tick that takes the queued commands)."""
        notifier = self._proposal_notifier
        if notifier is None or self._wake_pending:
            return  # before the first tick: it takes the commands anyway
        self._wake_pending = True
        notifier.notify()

    def _on_woken(self) -> None:
        self._wake_pending = False

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
        index = self.raftLastApplied + 1
        sent = self._sent_at.pop(index, None) if self._sent_at else None
        if sent is None:
            return self._apply(index, command)
        started = time.monotonic()
        self.stages.record("replication", started - sent)
        result = self._apply(index, command)
        self.stages.record("apply", time.monotonic() - started)
        return result

    def _apply(self, index: int, command: bytes) -> Any:
        if command[:2] == RAW_COMMAND_PREFIX:
            return self._member.apply_raw(index, command)
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
    #    load much of what the followers received was such a repeat, each re-hashed, parsed
    #    and dropped. A success reply now only moves the next index forward; a failure (``reset``) still
    #    moves it back, as Raft's consistency check asks.

    #: the highest next index a success reply to the message being handled may claim (None: no cap)
    _reply_index_max: int | None = None
    #: flushes a journal that allows it off the tick thread (built on the first tick: see _onTick)
    _flusher: _JournalFlusher | None = None
    #: wakes the tick thread when a command is proposed (built on the first tick: the poller is not
    #: thread-safe), and whether a wake-up is on its way
    _proposal_notifier: WakePipe | None = None
    _wake_pending = False
    #: called on the tick thread each tick, right before pysyncobj appends and sends what was proposed, with
    #: whether this member leads: a leader's may propose (group commit takes its batches here, and fails
    #: entries that did not apply in time, whatever the role: GroupCommitter.take_ready)
    take_proposals: Callable[[bool], None] | None = None
    #: take_proposals is running: what it proposes is appended and sent by this very tick (no wake-up)
    _taking = False
    #: the log index this member must hold again before it votes (fix 8), or None
    _refetch_index: int | None = None
    #: why (fix 8), for the member's status
    damage: str | None = None
    _journal_checked = False
    #: pysyncobj's commit step is running on a leader whose flushes run on the flusher thread (fix 6)
    _counting_commit = False
    #: until when (pysyncobj's monotonic clock) a full disk keeps this member out of elections (fix 9)
    _disk_full_until = 0.0
    #: the last index of the leader's snapshot now arriving that we are not installing (fix 3)
    _ignored_snapshot_index: int | None = None
    #: entries received in append_entries with a matching previous entry, and how many of them this member
    #: held already (sent again: after a failure reply, or a reconnection)
    entries_received = 0
    entries_already_held = 0
    #: the leader's heartbeat period once the group is quiet (seconds; 0: pysyncobj's, every
    #: ``appendEntriesPeriod``), and how long after the last new entry or commit the group counts as quiet
    quiet_heartbeat_seconds = 0.0
    quiet_after_seconds = 0.05
    #: the longest the tick thread sleeps once this member is quiet (seconds; 0: always the tick period)
    quiet_tick_seconds = 0.0
    #: the last heartbeat round found the group quiet (a leader's: its next round is put off)
    _heartbeats_quiet = False
    #: a follower's entries received and commit index at its last tick, and when either last moved
    _follower_seen: tuple[int, int] = (-1, -1)
    _follower_active_at = 0.0
    #: rounds of append_entries the leader sent (heartbeats included: status, tests)
    append_entries_rounds = 0
    #: ticks run (status, tests: a quiet member's tick thread sleeps longer)
    ticks = 0
    #: when the leader last sent new entries or saw its commit index move (pysyncobj's clock), and that index
    _active_at = 0.0
    _commit_seen = 0

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
            # (and pysyncobj's chunking is broken anyway, see dledger.tuning)
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
        first = self._SyncObj__raftLog[0][1]
        if index > self.raftLastApplied and self.raftLastApplied + 1 < first:
            # our log starts after what we applied: our own snapshot did not load (damaged on disk), so
            # nothing here can apply until one is installed, however much of the log we hold (fix 11)
            log.warning("installing the leader's snapshot at index %d: ours did not load (applied %d, our log "
                        "starts at %d)", index, self.raftLastApplied, first)
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
    #    the next entries meanwhile (group fsync); otherwise (no flusher yet, or the flusher idle: see
    #    ``_flushed_here``) the flush runs right there.
    # 6. The leader has the entries it appends flushed right after sending them to the followers (the flush
    #    and the round trip overlap), and the no-op it appends on becoming leader. The flush runs on the
    #    flusher thread, as a follower's (the tick thread goes on receiving replies and sending entries
    #    meanwhile), and its commit step counts itself only for entries on its disk: during that step the
    #    log's end is reported as the durable index (``_counting_commit``), so no entry is committed that a
    #    majority does not hold on disk. Before the flusher exists (the first tick) the flush runs here.
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

    def _flushed_here(self, index: int) -> bool:
        """Flush on this (the tick) thread when the flusher is idle, and say whether ``index`` is on disk now.
        A reply then leaves at once, without the two thread hand-offs of the flusher (one to wake it, one to
        wake this thread again), which at low load were most of a follower's answer time. When the flusher
        is busy or asked for, it is left to it, and this thread goes on receiving meanwhile (group fsync)."""
        flusher = self._flusher
        journal = self._SyncObj__raftLog
        if flusher is None or flusher.pending or not isinstance(journal, SegmentedJournal):
            return False
        return journal.make_durable_unless_busy() and int(journal.durable_index) >= index

    def _flush_soon(self) -> None:
        """The leader's entries to disk (fix 6): here before the flusher thread runs, and here too while it is
        idle (the followers write theirs meanwhile, so the flush overlaps the round trip either way, and the
        commit step that follows needs no wake-up from another thread); on the flusher thread when it is busy."""
        flusher = self._flusher
        if flusher is None:
            self._make_durable()
            return
        journal = self._SyncObj__raftLog
        if not flusher.pending and isinstance(journal, SegmentedJournal):
            started = time.monotonic()
            syncs = journal.syncs
            if journal.make_durable_unless_busy():
                if journal.syncs != syncs:
                    self._on_flushed(time.monotonic() - started)
                return
        flusher.request()

    def _on_flushed(self, seconds: float) -> None:
        self.journal_fsyncs.record(seconds)
        if self._SyncObj__raftState == RAFT_STATE_LEADER:
            self.stages.record("leader_fsync", seconds)

    def _SyncObj__getCurrentLogIndex(self) -> int:
        index: int = SyncObj._SyncObj__getCurrentLogIndex(self)
        if self._counting_commit:  # fix 6: the leader's commit step counts it only for what is on its disk
            return min(index, int(self._SyncObj__raftLog.durable_index))
        return index

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
        if self._proposal_notifier is None:
            self._proposal_notifier = WakePipe(self._poller, self._on_woken)
        if self._flusher is None and isinstance(journal, SegmentedJournal) and journal.sync_enabled:
            self._flusher = _JournalFlusher(journal, self._poller, self._send_durable_replies, self._on_flushed)
        if self._flusher is None:
            self._make_durable()  # fix 5 and 6, on this thread until the flusher runs
        elif self._SyncObj__raftState == RAFT_STATE_LEADER and journal.unsynced:
            self._flusher.request()  # fix 6 (whatever is left unflushed: a flush ran while entries came)
        self._send_durable_replies()
        if self._refetch_index is not None:
            self._hold_back_election()
        elif self._cannot_apply():
            # our snapshot did not load (fix 11): as leader this member would commit and never apply; it
            # follows until a leader's snapshot is installed
            setattr(self, "_SyncObj__raftElectionDeadline",  # noqa: B010  (pysyncobj's field)
                    pysyncobj_monotonic() + self._SyncObj__generateRaftTimeout())
        if self._disk_full_until > pysyncobj_monotonic():
            # a member whose journal cannot take entries does not stand for election (fix 9)
            deadline: float = getattr(self, "_SyncObj__raftElectionDeadline")  # noqa: B009  (pysyncobj's field)
            setattr(self, "_SyncObj__raftElectionDeadline", max(deadline, self._disk_full_until))  # noqa: B010
        # fix 6: pysyncobj's commit step comes first in its tick and ends where it applies (our override of
        # its apply clears this): the leader counts itself only for entries on its disk
        self._counting_commit = self._SyncObj__raftState == RAFT_STATE_LEADER and self._durable_index() is not None
        self.ticks += 1
        if self.quiet_tick_seconds > timeToWait:
            timeToWait = self._sleep_seconds(timeToWait)
        try:
            SyncObj._onTick(self, timeToWait)
        except DiskFullError as exc:  # a leader appending proposals (or its no-op): the rest of this tick is skipped
            self._on_disk_full(exc)
        finally:
            self._counting_commit = False

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
        self._counting_commit = False  # the commit step is over (fix 6)
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

    def _cannot_apply(self) -> bool:
        """Our log starts after what we applied, once pysyncobj loaded (or failed to load) our snapshot:
        nothing here applies until a snapshot is installed."""
        if getattr(self, "_SyncObj__needLoadDumpFile", True):
            return False
        raft_log = self._SyncObj__raftLog
        return len(raft_log) > 0 and self.raftLastApplied + 1 < raft_log[0][1]

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
        self._flush_soon()  # its no-op (fix 6)

    def _checkCommandsToApply(self) -> None:
        """Commit latency: in batch mode pysyncobj sends new entries only every ``appendEntriesPeriod``, so
        an entry waited up to a period (5 ms) before it left. Entries this tick added are now sent at once.
        pysyncobj advances a follower's next index as it sends (pipelining), so this sends only the new
        entries, not what is in flight; group commit already made them large, so it is about one message
        per entry and follower. It cut the commit latency at low load, median and tail alike, and left
        throughput as it was. Sending an append_entries early is always safe in Raft.

        First a leader's ``take_proposals`` proposes what waits for it (group commit's batches), so an entry
        taken here leaves in this very tick."""
        take = self.take_proposals
        if take is not None:
            self._taking = True
            try:
                take(self._SyncObj__raftState == RAFT_STATE_LEADER)
            finally:
                self._taking = False
        before = self._SyncObj__getCurrentLogIndex()
        SyncObj._checkCommandsToApply(self)
        after = self._SyncObj__getCurrentLogIndex()
        if self._SyncObj__raftState != RAFT_STATE_LEADER:
            self._proposed_at.clear()  # pysyncobj failed (or forwarded) what was queued
            self._sent_at.clear()
            return
        if after <= before:
            return
        self._SyncObj__sendAppendEntries()
        self._active_at = pysyncobj_monotonic()
        self._note_sent(before + 1, after)
        self._flush_soon()  # fix 6

    # Quiet heartbeats: pysyncobj sends append_entries to every follower each ``appendEntriesPeriod`` (5 ms),
    # as heartbeats when there is nothing new: 200 rounds a second that cost an idle group 4-5% of a core per
    # member. Once the group is quiet (every follower holds the whole log, and nothing was sent or committed
    # for ``quiet_after_seconds``, so the last heartbeats carried the final commit index), the next round is
    # put off to ``quiet_heartbeat_seconds``. New entries still leave at once (_checkCommandsToApply), and a
    # follower that is behind, catching up or taking a snapshot keeps the group out of quiet.

    def _SyncObj__sendAppendEntries(self) -> None:
        SyncObj._SyncObj__sendAppendEntries(self)
        self.append_entries_rounds += 1
        self._heartbeats_quiet = bool(self.quiet_heartbeat_seconds) and self._quiet()
        if self._heartbeats_quiet:
            setattr(self, "_SyncObj__newAppendEntriesTime",  # noqa: B010  (pysyncobj's field)
                    pysyncobj_monotonic() + self.quiet_heartbeat_seconds)

    def _sleep_seconds(self, period: float) -> float:
        """How long this tick may sleep in its poll: ``period`` (the tick period), or up to
        ``quiet_tick_seconds`` once this member is quiet: a leader whose last heartbeat round found the group
        quiet sleeps until its next round is due; a follower that received no entry and saw no commit for
        ``quiet_after_seconds``, with no reply waiting for its disk and nothing held back, sleeps until its
        election deadline at the latest. Anything that arrives (a proposal, a peer's message, a finished
        flush) still wakes the poll at once: only the timers wait, and none past its deadline."""
        state = self._SyncObj__raftState
        now = pysyncobj_monotonic()
        if state == RAFT_STATE_LEADER:
            if not self._heartbeats_quiet:
                return period
            until: float = getattr(self, "_SyncObj__newAppendEntriesTime") - now  # noqa: B009  (pysyncobj's)
        elif state == RAFT_STATE_FOLLOWER:
            seen = (self.entries_received, self.raftCommitIndex)
            if seen != self._follower_seen:
                self._follower_seen = seen
                self._follower_active_at = now
                return period
            if (now - self._follower_active_at < self.quiet_after_seconds or self._pending_replies
                    or self._refetch_index is not None or self._disk_full_until > now):
                return period
            until = getattr(self, "_SyncObj__raftElectionDeadline") - now  # noqa: B009  (pysyncobj's field)
        else:
            return period
        return max(period, min(self.quiet_tick_seconds, until))

    def _quiet(self) -> bool:
        now = pysyncobj_monotonic()
        commit_index = self.raftCommitIndex
        if commit_index != self._commit_seen:
            self._commit_seen = commit_index
            self._active_at = now
        if now - self._active_at < self.quiet_after_seconds:
            return False
        last_index = self._SyncObj__getCurrentLogIndex()
        if commit_index < last_index:
            return False
        # held, and nothing left to send: a follower that answered a failure (it lost entries, or needs the
        # snapshot) has its next index set back while its match index may still claim the whole log
        match_index, next_index = self._SyncObj__raftMatchIndex, self._SyncObj__raftNextIndex
        return all(match_index.get(node, 0) >= last_index and next_index.get(node, 0) > last_index
                   for node in self._SyncObj__otherNodes)

    def _note_sent(self, first: int, last: int) -> None:
        """Stages: entries ``first``..``last`` (proposed in order) left now."""
        now = time.monotonic()
        proposed_at = self._proposed_at
        for index in range(first, last + 1):
            if proposed_at:
                self.stages.record("propose_wait", now - proposed_at.popleft())
            self._sent_at[index] = now

    def _SyncObj__sendNextNodeIdx(self, node: Any, reset: bool = False, nextNodeIdx: int | None = None,
                                  success: bool = False) -> None:
        if success and (self._member.snapshot_load_failed or self._cannot_apply()):
            # ask for the leader's snapshot (again, until one is installed: fix 11; a transfer that broke off
            # would otherwise leave this member holding entries it can never apply)
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
            elif durable < nextNodeIdx - 1 and not self._flushed_here(nextNodeIdx - 1):
                # fix 5: answered once the flusher has it on disk
                index = nextNodeIdx - 1
                self._pending_replies[node] = (self.raftCurrentTerm, index, self._term_at(index), nextNodeIdx)
                assert self._flusher is not None
                self._flusher.request()
                return
        SyncObj._SyncObj__sendNextNodeIdx(self, node, reset=reset, nextNodeIdx=nextNodeIdx, success=success)
