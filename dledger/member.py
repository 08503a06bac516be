"""A member of the Raft group: a Raft node (pysyncobj, adapted in dledger.raft_node), the local store, the
apply loop, group commit, snapshots and catch-up, and role-change events.

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
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, NoReturn

from isal.isal_zlib import crc32

from commitlog.checkpoint import read_checkpoint
from commitlog.errors import CorruptionError, DamagedRecordError, StoreError
from commitlog.message import MessageInput
from commitlog.outcomes import AppendResult
from commitlog.record_codec import RecordError
from commitlog.records import RecordBuilder
from commitlog.state import CHECKPOINT_NAME
from commitlog.store import EXIT_DAMAGED_RECORD, MessageStore
from dledger.apply import (
    EXIT_BYTE_CONFIG_MISMATCH,
    ApplyResult,
    ByteConfigMismatchError,
    StateMachine,
    check_byte_config,
)
from dledger.catchup import CatchupError, CatchupServer, fetch, fetch_digest, fetch_range
from dledger.command import ByteConfig, Command, encode_command
from dledger.config import NodeConfig, parse_address
from dledger.future import AppendFuture
from dledger.group_clock import GroupClock, replicated_floor_ms
from dledger.group_commit import GroupCommitter, NotLeaderError, OutcomeUnknownError, request_bytes
from dledger.journal import SegmentedJournal
from dledger.raft_node import RAFT_STATE_LEADER, RAFT_STATES, RAW_COMMAND_PREFIX, RaftNode
from dledger.secure_channel import ENTRY_DIGESTS
from dledger.snapshot import (
    BackgroundSnapshots,
    Snapshot,
    SnapshotError,
    read_snapshot,
)
from dledger.stages import StageHistograms
from dledger.state import ReplicatedState, StateError
from dledger.transport import OUT_OF_BAND_MIN_BYTES, transport_class
from dledger.tuning import tuned_conf
from protocol.topics import TIMER_TOPIC

log = logging.getLogger(__name__)

#: how long stop() waits for pysyncobj's tick thread to finish its last tick (a catch-up copy may be running)
STOP_TICK_WAIT_SECONDS = 30.0
#: exit status when apply meets a programmer error: stopping beats a replica stalled or diverged
EXIT_APPLY_INVARIANT = 70
_LEADING: Final[tuple[bool, str | None]] = (True, None)
#: a command carries more than its messages: operation heads, version, pickling
ENTRY_OVERHEAD_BYTES = 4096
#: entries this leader proposed and remembers decoded, until they apply
BUILT_ENTRIES_MAX = 1024
#: how often a leader that is not the preferred one offers leadership to it
PREFERENCE_CHECK_SECONDS = 1.0
#: how far behind (in entries) a connected preferred member may be for the leader to start handing over:
#: new entries are held back then, so it catches up (DLedger's maxLeadershipTransferWaitIndex, in spirit)
PREFERENCE_LAG_ENTRIES_MAX = 64
#: after a handover to the preferred member gave up, the leader leaves writes alone this long
PREFERENCE_BACKOFF_SECONDS = 30.0
TRANSFER_TIMEOUT_SECONDS = 5.0
TRANSFER_RETRY_SECONDS = 0.05
#: the scrubber validates this much of the commit log per step, then pauses (about 4 MB/s, a small
#: share of a core: a GB is re-validated every four minutes or so; 1 MB/s while writes are heavier)
SCRUB_BYTES = 1 << 20
SCRUB_PAUSE_SECONDS = 0.25
#: key-index bytes the scrubber checks per step (header, checksum, links, slots: a file's used part is copied
#: under the store lock, then checked without it)
INDEX_SCRUB_BYTES = 4 << 20
#: ... once this often: each check copies a file's slot table (4 MB at the default size) and entries under
#: the store lock, which the apply path waits for; at every scrub step it cost the leader acknowledged
#: sends and lengthened the commit latency's tail (bench/replication_bench.py shows both)
INDEX_SCRUB_INTERVAL_SECONDS = 10.0
#: at most one warning this often that a peer did not answer a digest request
DIGEST_WARNING_SECONDS = 60.0


class BuiltCommands:
    """The commands this leader built for the entries it proposed (group commit's batches), so that apply
    takes them as they are instead of decoding the entry's bytes again: each is exactly what decoding its
    entry gives (``dledger.group_commit``), so the leader applies what the followers apply.

    An entry is found by the very bytes object proposed, which pysyncobj's log holds and hands back to
    apply (``is``: neither hashing nor comparing the entry's bytes). Entries reach the log in the order
    they are proposed here (:meth:`proposing` is held around both), and apply in log order: when one
    applies, those remembered before it never will (their proposals failed) and are let go. Bounded by
    ``entries_max``: an entry that falls out is decoded like any other."""

    def __init__(self, entries_max: int = BUILT_ENTRIES_MAX) -> None:
        self._entries: deque[tuple[bytes, Command]] = deque(maxlen=entries_max)
        #: held around remembering an entry and proposing it, and around taking one
        self.proposing = threading.Lock()

    def remember(self, entry: bytes, command: Command) -> None:
        """``command`` is what ``entry`` (about to be proposed, under :attr:`proposing`) decodes to."""
        self._entries.append((entry, command))

    def take(self, entry: bytes) -> Command | None:
        """The command built for ``entry`` (this very object), or None (an entry of another leader's, or one
        that fell out)."""
        with self.proposing:
            entries = self._entries
            for position, (held, command) in enumerate(entries):
                if held is entry:
                    for _ in range(position + 1):
                        entries.popleft()
                    return command
            return None

    def clear(self) -> None:
        """No longer leading: what was not applied yet is decoded if it ever applies here."""
        with self.proposing:
            self._entries.clear()


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


def _byte_config_in(encoded_state: bytes) -> ByteConfig | None:
    """The group's byte configuration in encoded replicated state (None when it has none or cannot be read:
    what reads it next decides about damage)."""
    if not encoded_state:
        return None
    try:
        return ReplicatedState.decode(encoded_state).byte_config
    except StateError:
        return None


class GroupMember:
    def __init__(self, config: NodeConfig, on_role_change: Callable[[RoleChange], None] | None = None) -> None:
        self.config = config.validate()
        self._refuse_other_recorded_byte_config()  # first: a member that must not start writes nothing
        self.on_role_change = on_role_change
        #: called on the Raft thread after every applied entry (long polling wake-ups): must be quick
        self.on_applied: Callable[[], None] | None = None
        #: the last snapshot install failed (see dledger.raft_node.RaftNode): answered as a failure, not pysyncobj's success
        self.snapshot_load_failed = False
        self.raft_dir = config.data_dir / "raft"
        self.raft_dir.mkdir(parents=True, exist_ok=True)
        self.snapshot_path = self.raft_dir / "snapshot"
        #: pysyncobj's compaction and snapshot transfers (set while pysyncobj starts, see dledger.raft_node.RaftNode)
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
        self._leader_name: tuple[object, str] = (None, "")  # (pysyncobj's leader node, its name)
        #: pysyncobj's state is leader: set first thing by its state-change callback (on its tick thread)
        self._leading = False
        #: bytes of entries applied since the last forced compaction (tick thread only)
        self._uncompacted_bytes = 0
        #: the commands this member built for the entries it proposed as leader, until they apply
        self._built = BuiltCommands()
        self.catchup_server = CatchupServer(parse_address(config.catchup_address, "catchup_address"),
                                            config.secret, self.store)
        store_config = config.store_config
        self.entry_bytes_max = max(config.group_commit.batch_bytes_max, store_config.body_size_max_bytes + 65536)
        raft = config.raft
        conf = tuned_conf(
            append_entries_period_seconds=raft.append_entries_period_ms / 1000,
            auto_tick_period_seconds=raft.tick_period_ms / 1000,
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
        #: where the send path's time goes (dledger.stages), recorded by the committer, Raft and the broker
        self.stages = StageHistograms()
        self.committer = GroupCommitter(config.group_commit, self._propose_built, self._leadership, self.entry_bytes_max,
                                        store_config.body_size_max_bytes, wall_clock_ms=self.group_clock.now_ms,
                                        prepare=builder.build, command_prefix=RAW_COMMAND_PREFIX, stages=self.stages,
                                        wake=self._wake_proposer if config.group_commit.proposer == "tick" else None)
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
        self.raft = RaftNode(self, config.raft_address, peers, conf,
                              transport_class(config.secret, group_clock=self.group_clock),
                              durable_journal=raft.journal_flush == "durable", stages=self.stages)
        if config.group_commit.proposer == "tick":
            self.raft.take_proposals = self.committer.take_ready
        self.raft.quiet_heartbeat_seconds = raft.quiet_heartbeat_period_ms / 1000
        self.raft.quiet_tick_seconds = raft.quiet_tick_period_ms / 1000
        self.raft.quiet_after_seconds = 10 * raft.append_entries_period_ms / 1000
        self.raft.addOnTickCallback(self._on_tick)
        self._stop_scrubber = threading.Event()
        self._next_digest_warning = 0.0  # (the scrubber's: when it may say again that a peer did not answer)
        self._scrubber = threading.Thread(target=self._scrub_loop, name="scrubber", daemon=True)
        self._scrubber.start()

    # ------------------------------------------------------------------ apply (tick thread)

    def apply_raw(self, raft_index: int, command: bytes) -> ApplyResult:
        """A raw command from the log. On the leader, the very object it proposed comes back, with the
        command it built for it (:class:`BuiltCommands`)."""
        built = self._built.take(command)
        self._uncompacted_bytes += len(command)
        if self._uncompacted_bytes >= self.config.raft.log_compaction_bytes:
            self._uncompacted_bytes = 0
            self.raft.forceLogCompaction()  # taken up by pysyncobj on its next tick (this thread)
        retained_from = self.store.min_physical_offset
        if built is not None:  # nothing to decode: not even a copy of the entry without its prefix
            result = self.apply(raft_index, b"", built)
        else:
            result = self.apply(raft_index, command[len(RAW_COMMAND_PREFIX):])
        if self.store.min_physical_offset != retained_from:
            # a snapshot from before a retention cannot be installed (dledger.catchup.fetch refuses it: the
            # entries after it need records retention deleted): a member that needs one gets this newer one
            self.raft.forceLogCompaction()
        return result

    def apply(self, raft_index: int, data: bytes, built: Command | None = None) -> ApplyResult:
        """:meth:`StateMachine.apply`, total: a programmer error stops the process (a stalled or diverged
        replica is worse). ``built``: the command this member built for the entry (``data`` is not read then);
        only its proposer waits for the per-message results of records (nobody waits for a follower's)."""
        try:
            with self._apply_lock:
                result = self.machine.apply(raft_index, data, built, want_results=built is not None)
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
        """What pysyncobj's compaction and snapshot transfers go through (see dledger.raft_node.RaftNode)."""
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
                fetch(peers, self.config.secret, self.store, snapshot.commit_log_end, snapshot.index,
                      snapshot.commit_log_min)
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
            self._built.clear()
        log.info("role %s -> %s (term %d)", RAFT_STATES.get(old_state), change.role, change.term)
        if self.on_role_change is not None:
            self.on_role_change(change)

    def _leadership(self) -> tuple[bool, str | None]:
        """(whether this member leads, the leader's name when it does not and one is known). Read on every
        send: while leading, one attribute (asking pysyncobj twice per send cost the leader). It can
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

    def leader_name(self) -> str | None:
        """The leader's Raft address as this member knows it (its own when it leads), None when none is
        known: as ``status().leader``, without building a status (a follower asks on every forwarded send)."""
        is_leader, name = self._leadership()
        return self.config.raft_address if is_leader else name

    def write_refusal(self) -> str | None:
        """Why this member does not take writes now, or None when it leads and does (the leader check a
        load balancer makes: broker.probes). Reads flags only: cheap enough for every health check."""
        if not self._leadership()[0]:
            return "not the leader"
        if not self._byte_config_applied.is_set():
            return "the group's byte configuration is not applied here yet"
        if self._transfer is not None:
            return "handing leadership over"
        return None

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
        journal = self.raft.journal()
        return journal.syncs if isinstance(journal, SegmentedJournal) else 0

    # ------------------------------------------------------------------ writes

    def _propose(self, data: bytes, callback: Callable[[ApplyResult | None, int], None]) -> None:
        self.raft.propose_raw(RAW_COMMAND_PREFIX + data, callback)

    def _wake_proposer(self) -> None:
        """Group commit has work for the tick thread, which takes it (``proposer = "tick"``)."""
        raft = getattr(self, "raft", None)  # None while __init__ builds it: its first tick takes anyway
        if raft is not None:
            raft._wake_tick_thread()

    def _propose_built(self, command: bytes, callback: Callable[[ApplyResult | None, int], None],
                       built: Command) -> None:
        """Propose ``command`` (RAW_COMMAND_PREFIX and our command's bytes: group commit encodes them so, in
        one piece, as adding the prefix here copied every entry once more), which decodes to ``built``:
        remembered, so that apply takes ``built`` instead of decoding the entry."""
        if len(command) >= OUT_OF_BAND_MIN_BYTES:
            # hashed here, once (BLAKE3 lets go of the GIL), and found for each follower it is sent to
            ENTRY_DIGESTS.remember(command)
        with self._built.proposing:
            self._built.remember(command, built)
            self.raft.propose_raw(command, callback)

    def append(self, messages: Sequence[MessageInput],
               callback: Callable[[AppendFuture[tuple[AppendResult, ...]]], object] | None = None,
               ) -> AppendFuture[tuple[AppendResult, ...]]:
        """Replicate ``messages`` (one send or one atomic batch) through group commit; ``callback``, if
        given, runs when the future is done (as ``add_done_callback``, without its lock), possibly on the Raft
        tick thread: it must return at once (``GroupCommitter.submit``)."""
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
        self._begin_transfer(target)

    def _begin_transfer(self, target: str) -> None:
        """Hold new entries back until ``target`` ("" for the most caught-up follower) holds the whole log
        and is told to stand (pysyncobj denies the transfer before that), or the transfer times out."""
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
                if is_leader and target == self._preferred_address:
                    self._next_preference_check = now + PREFERENCE_BACKOFF_SECONDS
                if self._byte_config_applied.is_set():  # else it resumes once the configuration applies
                    self.committer.resume()
            else:
                self.raft.transferLeadership(target or None)  # denied until the target has caught up
            return
        if self._preferred_address is None or not is_leader or now < self._next_preference_check:
            return
        self._next_preference_check = now + PREFERENCE_CHECK_SECONDS
        # Under a steady load the log grows between any two ticks, so the preferred member is never caught
        # up at the moment of asking: once it is close, new entries wait (as in a requested transfer)
        lag = self.raft.follower_lag(self._preferred_address)
        if lag is not None and lag <= PREFERENCE_LAG_ENTRIES_MAX:
            self._begin_transfer(self._preferred_address)

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
        record (a byte gone bad on disk) is put back from a peer's copy, which is byte-identical. The records'
        consume-queue units and key-index entries are checked on the way (``MessageStore.scrub``), and the
        key-index files one after the other (``MessageStore.scrub_index``): a damaged one is rebuilt from the
        commit log."""
        position = 0
        end = self.store.max_physical_offset
        pause = SCRUB_PAUSE_SECONDS
        next_index_scrub = time.monotonic() + INDEX_SCRUB_INTERVAL_SECONDS
        while not self._stop_scrubber.wait(pause):
            pause = SCRUB_PAUSE_SECONDS
            # while the group writes faster than the scrubber reads, it yields the GIL to the write path
            # and reads a quarter as much (pulls check what they serve meanwhile)
            previous_end, end = end, self.store.max_physical_offset
            step = SCRUB_BYTES // 4 if end - previous_end >= SCRUB_BYTES else SCRUB_BYTES
            try:
                start = max(position, self.store.commit_log.min_offset)
                damaged, position = self.store.scrub(position, step)
                if damaged is not None:
                    if damaged > start:  # what was validated before the damage is compared too
                        self._compare_with_peers(start, damaged)
                    self._repair(damaged)
                    position = damaged
                    # no pause after a repair: a damaged region (a segment rolled back to an older copy, its
                    # newer records zeros) is put back record after record, not one every pause
                    pause = 0.0
                elif position > start:
                    self._compare_with_peers(start, position)
                if time.monotonic() >= next_index_scrub:
                    next_index_scrub = time.monotonic() + INDEX_SCRUB_INTERVAL_SECONDS
                    needed = self.store.scrub_index(INDEX_SCRUB_BYTES)
                    if needed is not None:  # a record a key-index file is rebuilt from
                        self._repair(needed)
                        next_index_scrub = 0.0  # rebuilt on the next step
            except (StoreError, OSError, ValueError) as exc:
                log.warning("scrubbing stopped at %d: %s", position, exc)
                position = 0

    def _compare_with_peers(self, start: int, end: int) -> None:
        """Anti-entropy: the CRC-32 of the committed range ``[start, end)`` (just validated here) against the
        peers'. Replicas hold it byte for byte, and only a record's body carries a CRC: a byte gone bad in a
        record's head or properties passes validation and only shows as a difference. When a majority of the
        group (the peers alone) agree on other bytes than ours, each record of ours that differs from their
        copy is put back from it; when only some peers differ, it is theirs to find."""
        peers = [parse_address(peer.catchup_address, "catchup_address") for peer in self.config.peers]
        try:
            ours = self.store.read_committed(start, end - start)
        except StoreError:
            return  # retention moved past it meanwhile
        local = crc32(ours)
        reasons: list[str] = []
        digests = [fetch_digest(peer, self.config.secret, start, end, reasons) for peer in peers]
        if reasons and time.monotonic() >= self._next_digest_warning:
            self._next_digest_warning = time.monotonic() + DIGEST_WARNING_SECONDS
            log.warning("comparing commit-log bytes [%d, %d) with the peers: no answer from %s", start, end,
                        "; ".join(reasons))
        others = [digest for digest in digests if digest is not None and digest != local]
        if not others:
            return
        majority = (len(peers) + 1) // 2 + 1
        if len(others) < majority or len(set(others)) != 1:
            log.warning("commit-log bytes [%d, %d) differ between replicas without a majority against ours: "
                        "left to the others' scrubbers", start, end)
            return
        try:
            theirs = fetch_range(peers, self.config.secret, start, end)
        except CatchupError as exc:
            log.warning("cannot fetch [%d, %d) to compare it: %s", start, end, exc)
            return
        if crc32(theirs) != others[0]:
            return  # the peer that served differs from the majority: try again on the next round
        position = 0
        while position + 4 <= len(theirs):
            size = int.from_bytes(theirs[position:position + 4], "big", signed=True)
            if not 0 < size <= len(theirs) - position:
                break  # a segment's filler and what follows it
            if theirs[position:position + size] != ours[position:position + size]:
                log.critical("the record at commit-log offset %d differs from a majority of the replicas (a byte "
                             "outside its body went bad): repairing it from a peer", start + position)
                try:
                    self.store.repair_record(start + position, theirs[position:position + size])
                except (StoreError, RecordError) as exc:
                    log.warning("cannot repair the record at %d: %s", start + position, exc)
            position += size

    def _repair(self, physical_offset: int) -> None:
        """Put the damaged record at ``physical_offset`` back from a peer's byte-identical copy. Its size is
        read from the peer's copy too: the damage may be in our size field (a flipped byte, or a segment
        rolled back to zeros), which then named no record or the wrong one."""
        peers = [parse_address(peer.catchup_address, "catchup_address") for peer in self.config.peers]
        log.critical("damaged record at commit-log offset %d: repairing it from a peer", physical_offset)
        try:
            head = fetch_range(peers, self.config.secret, physical_offset, physical_offset + 4)
            size = int.from_bytes(head[:4], "big", signed=True)
            if not 0 < size <= self.entry_bytes_max:
                raise StoreError(f"the peers' record at {physical_offset} has no usable size ({size})")
            data = fetch_range(peers, self.config.secret, physical_offset, physical_offset + size)
            self.store.repair_record(physical_offset, data)
        except (CatchupError, RecordError) as exc:
            raise StoreError(f"cannot repair the record at {physical_offset}: {exc}") from exc

    def stop(self) -> None:
        self._stop_scrubber.set()
        self.committer.stop()
        self.raft.destroy()  # the tick thread stops at its next tick: wait for it, so that nothing applies
        tick_thread = self.raft.tick_thread()  # or starts a compaction once the store is closed
        if tick_thread is not None and tick_thread is not threading.current_thread():
            tick_thread.join(STOP_TICK_WAIT_SECONDS)
        self.snapshots.settle()  # a compaction in flight flushes the store: let it finish first
        self.catchup_server.close()
        with self._apply_lock:
            self.store.close()
