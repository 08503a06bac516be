"""Faults on a running :class:`~chaos.cluster.ChaosCluster`, each recorded as a
:class:`~chaos.history.FaultEvent` (kind, target, start, end) once it is over.

Process faults act on the members' processes: SIGKILL then restart (``kill``), SIGSTOP then SIGCONT
(``pause``), every member at once (``kill-all``), and ``wipe`` (SIGKILL a member, delete its data, restart
it empty: it must rejoin and become byte-identical). ``power-loss`` cuts the power of members whose data
directories are on powerfs mounts (:mod:`chaos.powerfs`): what they had not fsynced is lost, they are
SIGKILLed and booted again from what their disks kept. Disk faults: ``disk-full`` moves a member's data
directory onto its own small tmpfs (once) and fills it for a while, ``disk-full-leader`` the same to a member
made the leader first (and watches whether it stops leading); ``corrupt`` stops a member, flips one
byte inside a committed record of its commit log and restarts it, then records what the member did about
it (:data:`CORRUPTION_OUTCOMES`); ``damage_file`` does the same with one file of any kind and any damage of
:mod:`chaos.corruption` (also recorded as ``corrupt``, the file and the damage in its detail). Network faults need a proxied cluster: ``partition``
isolates members from the rest (a black hole both ways: connections stay open, bytes vanish, as on a
real network), ``cut-link`` cuts one pair, ``latency`` and ``bandwidth`` slow links. Client-link faults
act on the proxies between every client and some brokers, leaving Raft alone: ``client-cut`` black-holes
them, ``client-reset`` resets their connections (TCP RST) as data flows, ``client-latency`` and
``client-bandwidth`` slow them.

Every fault is undone at the end of its hold; :meth:`Faults.heal_everything` undoes whatever is left
(a scenario interrupted mid-fault). Blocking work (signals with waits, process starts, the Toxiproxy
HTTP API) runs in a worker thread so the workload on the event loop keeps going.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import shutil
import signal
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Final

from chaos import corruption, disk, powerfs
from chaos.cluster import ChaosCluster, ClientLink, RaftLink, restart_with_clock
from chaos.connections import Connections
from chaos.history import FaultEvent, NoteEvent
from chaos.monitor import LeaderMonitor
from chaos.toxiproxy_control import (
    Streams,
    ToxiproxyHandle,
    add_latency,
    heal,
    limit_bandwidth,
    partition,
    reset_peer,
)
from chaos.workload import Recorder
from cli.cluster import is_alive

#: what a wipe keeps in a member's directory: its configuration (and its log, for the post-mortem)
KEPT_ON_WIPE: Final = frozenset({"node.toml", "broker.log"})
#: a follower within this many commit-log bytes of the leader counts as caught up
CAUGHT_UP_SLACK_BYTES: Final = 256 * 1024
RESTART_ATTEMPTS: Final = 5
#: how long a restarted member has to answer (or die) before the restart counts as done
RESTART_ANSWER_SECONDS: Final = 5.0
#: what became of a corrupted member: it put the byte right (from its peers), it refused to run, or it
#: runs and serves the damaged record
CORRUPTION_REPAIRED: Final = "repaired"
CORRUPTION_REFUSED: Final = "refused"
CORRUPTION_UNNOTICED: Final = "unnoticed"
#: how long a corrupted member has, after its restart, to repair itself or exit
CORRUPTION_SETTLE_SECONDS: Final = 20.0
#: what else became of a member with a damaged file (``damage_file``): it reported the damage and kept out of
#: votes until it re-fetched its log; it runs, caught up, with the damage dealt with by its recovery (a file
#: rebuilt, a torn part cut, a stale copy ignored); or it still reported damage or lagged when its time was up
CORRUPTION_REFETCHED: Final = "re-fetched"
CORRUPTION_RECOVERED: Final = "recovered"
CORRUPTION_NOT_SETTLED: Final = "not settled"
#: how long a member with a damaged file has, after its restart, to settle (and a wiped one to catch up)
DAMAGE_SETTLE_SECONDS: Final = 60.0
#: a member counts as settled once it stayed caught up (and applying) this long
SETTLED_FOR_SECONDS: Final = 3.0
#: broker.log lines quoted when a damaged member exits (the last lines that say why)
EXIT_LINES_QUOTED: Final = 3
#: what a member logs when damage keeps it out of votes until it re-fetched its log (dledger.member)
HELD_BACK_LOG_TEXT: Final = "it will not vote until"
CORRUPTION_OUTCOMES: Final = (CORRUPTION_REPAIRED, CORRUPTION_REFUSED, CORRUPTION_UNNOTICED, CORRUPTION_REFETCHED,
                              CORRUPTION_RECOVERED, CORRUPTION_NOT_SETTLED)
#: free space a member's tmpfs has beyond what its directory held when it was moved there, and again
#: before each fill and at heal time (it grows: the member keeps writing, for as long as a soak runs)
TMPFS_HEADROOM_BYTES: Final = 32 << 20
#: how often a member moved onto a tmpfs gets its headroom back between disk-full faults
TMPFS_CHECK_SECONDS: Final = 5.0
#: disk-full-leader: how long the member made leader has to acknowledge a send before its disk is filled (an
#: outage of its own election must not count as the full disk's), and how often it is watched while full
LEADER_ACK_SECONDS: Final = 10.0
FULL_LEADER_WATCH_SECONDS: Final = 0.1


class Faults:
    def __init__(self, cluster: ChaosCluster, monitor: LeaderMonitor, recorder: Recorder) -> None:
        self.cluster = cluster
        self.monitor = monitor
        self.recorder = recorder
        self.paused: set[str] = set()
        self.cut: set[str] = set()
        #: members whose disk is being filled on purpose: their tmpfs is not grown meanwhile
        self.filling: set[str] = set()
        self._tmpfs_lock = asyncio.Lock()
        self._keeper: asyncio.Task[None] | None = None
        #: copies of members' files for roll-backs (damage_file), made on first use, removed by stop()
        self._archive: corruption.RollbackArchive | None = None
        self._connections: Connections | None = None

    def start(self) -> None:
        """Keep the headroom of members moved onto a tmpfs (see :meth:`_keep_headroom`) until :meth:`stop`."""
        self._keeper = asyncio.get_running_loop().create_task(self._keep_headroom(), name="tmpfs-headroom")

    async def stop(self) -> None:
        keeper, self._keeper = self._keeper, None
        if keeper is not None:
            keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await keeper
        if self._connections is not None:
            await self._connections.close()
        if self._archive is not None:
            await asyncio.to_thread(self._archive.remove)

    async def _keep_headroom(self) -> None:
        """A member on a tmpfs keeps writing between disk-full faults; growing its tmpfs only before a fill
        and at heal time let a long soak fill it in between (after ~32 MB), stalling that member until the
        next fault. Every few seconds, each tmpfs not being filled on purpose gets its headroom back."""
        while True:
            await asyncio.sleep(TMPFS_CHECK_SECONDS)
            await self.keep_headroom_once()

    async def keep_headroom_once(self) -> None:
        for node_id in self.cluster.node_ids:
            async with self._tmpfs_lock:
                if node_id not in self.filling:  # half the headroom used: a remount per ~16 MB written
                    await self._grow_tmpfs(node_id, TMPFS_HEADROOM_BYTES // 2)

    # ------------------------------------------------------------------------------------ helpers

    def _record(self, kind: str, target: str, start: float, detail: str = "") -> FaultEvent:
        event = FaultEvent(kind, target, start, self.recorder.now(), detail)
        self.recorder.record(event)
        return event

    def note(self, what: str, detail: str = "") -> None:
        self.recorder.record(NoteEvent(self.recorder.now(), what, detail))

    async def leader(self, timeout_seconds: float = 15.0) -> str | None:
        leader = await self.monitor.wait_leader(timeout_seconds)
        if leader is None:
            self.note("no leader", f"none within {timeout_seconds} s: fault skipped")
        return leader

    def followers(self) -> list[str]:
        return [node for node in self.cluster.node_ids if node != self.monitor.leader]

    def _alive(self, node_id: str) -> bool:
        return is_alive(self.cluster.local.info.node(node_id).pid)

    async def _restart(self, *node_ids: str, clock_offset_ns: int | None = None) -> None:
        """Start the members again (all at once); one whose process exits before it answers (its ports are
        in the ephemeral range, and an outgoing connection may have taken one meanwhile) is tried again.
        ``clock_offset_ns`` moves their wall clocks (chaos.cluster.restart_with_clock)."""
        loop = asyncio.get_running_loop()
        pending = list(node_ids)
        for attempt in range(RESTART_ATTEMPTS):
            for node_id in pending:
                if clock_offset_ns is None:
                    await asyncio.to_thread(self.cluster.local.restart, node_id)
                else:
                    await asyncio.to_thread(restart_with_clock, self.cluster.local, node_id, clock_offset_ns)
            fresh_after = self.monitor.polls + 2  # the poll in progress may have begun before the restarts
            deadline = loop.time() + RESTART_ANSWER_SECONDS
            waiting = set(pending)
            while waiting and loop.time() < deadline:
                for node_id in list(waiting):
                    answered = self.monitor.polls >= fresh_after and self.monitor.views.get(node_id) is not None
                    if answered or not self._alive(node_id):
                        waiting.discard(node_id)
                if waiting:
                    await asyncio.sleep(0.1)
            pending = [node_id for node_id in pending if not self._alive(node_id)]
            if not pending:
                return
            self.note("restart failed", f"{', '.join(pending)} exited after restart attempt {attempt + 1} "
                                        "(see broker.log)")
            await asyncio.sleep(1.0)

    async def _kill(self, node_id: str) -> None:
        if self._alive(node_id):
            self.paused.discard(node_id)
            await asyncio.to_thread(self.cluster.local.kill, node_id, signal.SIGKILL)

    async def caught_up(self, timeout_seconds: float) -> bool:
        """Wait until every member answers and is within CAUGHT_UP_SLACK_BYTES of the leader."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_seconds
        while loop.time() < deadline:
            if self.caught_up_now():
                return True
            await asyncio.sleep(0.2)
        self.note("not caught up", f"members did not catch up within {timeout_seconds} s")
        return False

    def caught_up_now(self) -> bool:
        """Every member answered the monitor's last poll within CAUGHT_UP_SLACK_BYTES of the leader."""
        views = self.monitor.views
        leader = self.monitor.leader
        leader_view = views.get(leader) if leader is not None else None
        return leader_view is not None and all(
            view is not None and view.commit_log_max_offset >= leader_view.commit_log_max_offset
            - CAUGHT_UP_SLACK_BYTES for view in views.values())

    # ------------------------------------------------------------------------------ process faults

    async def kill(self, node_id: str, hold_seconds: float, show_interrupted: bool = False) -> FaultEvent:
        """SIGKILL, restart ``hold_seconds`` later. ``show_interrupted``: the detail names the atomic writes the
        kill interrupted (their temp files, left behind: a snapshot, the journal's manifest, a checkpoint)."""
        start = self.recorder.now()
        await self._kill(node_id)
        interrupted = await asyncio.to_thread(_temp_files, self.node_dir(node_id)) if show_interrupted else []
        await asyncio.sleep(hold_seconds)
        await self._restart(node_id)
        return self._record("kill", node_id, start, f"SIGKILL, restarted after {hold_seconds:.1f} s"
                            + (f"; interrupted: {', '.join(interrupted)}" if interrupted else ""))

    async def pause(self, node_id: str, hold_seconds: float) -> FaultEvent | None:
        if not self._alive(node_id):
            self.note("pause skipped", f"{node_id} is not running")
            return None
        start = self.recorder.now()
        await asyncio.to_thread(self.cluster.local.kill, node_id, signal.SIGSTOP)
        self.paused.add(node_id)
        await asyncio.sleep(hold_seconds)
        await asyncio.to_thread(self.cluster.local.kill, node_id, signal.SIGCONT)
        self.paused.discard(node_id)
        return self._record("pause", node_id, start, f"SIGSTOP for {hold_seconds:.1f} s")

    async def kill_all(self, hold_seconds: float) -> FaultEvent:
        start = self.recorder.now()
        for node_id in self.cluster.node_ids:
            await self._kill(node_id)
        await asyncio.sleep(hold_seconds)
        await self._restart(*self.cluster.node_ids)
        return self._record("kill-all", ",".join(self.cluster.node_ids), start,
                            f"SIGKILL every member, restarted after {hold_seconds:.1f} s")

    async def power_loss(self, node_ids: Sequence[str], hold_seconds: float, paused: str | None = None,
                         resume_after_seconds: float = 0.0) -> FaultEvent:
        """Cut the power of ``node_ids`` at once (their data directories are powerfs mounts; see
        :func:`chaos.powerfs.cut_power` for the order: every disk drops what was not fsynced and goes dark,
        then the members are SIGKILLed, then unmounted), boot their disks again ``hold_seconds`` later and
        restart them. With ``paused``, that member is SIGSTOPped first and resumed ``resume_after_seconds``
        after the restart (a follower asleep through the leader's power loss)."""
        start = self.recorder.now()
        if paused is not None and self._alive(paused):
            await asyncio.to_thread(self.cluster.local.kill, paused, signal.SIGSTOP)
            self.paused.add(paused)
        mounts = [powerfs.PowerLossMount.for_directory(self.node_dir(node_id)) for node_id in node_ids]
        reports = await asyncio.to_thread(powerfs.cut_power, mounts)
        self.paused.difference_update(node_ids)
        await asyncio.sleep(hold_seconds)
        for mount in mounts:
            await asyncio.to_thread(mount.start)
        await self._restart(*node_ids)
        if paused is not None and paused in self.paused:
            await asyncio.sleep(resume_after_seconds)
            await asyncio.to_thread(self.cluster.local.kill, paused, signal.SIGCONT)
            self.paused.discard(paused)
        dropped = ", ".join(f"{node_id} {report['dropped_bytes']} B in {report['dropped_files']} files"
                            + (f" and {report['undone_changes']} namespace changes" if report["undone_changes"] else "")
                            for node_id, report in zip(node_ids, reports, strict=True))
        return self._record("power-loss", ",".join(node_ids), start,
                            f"unsynced lost: {dropped}; restarted after {hold_seconds:.1f} s"
                            + (f"; {paused} paused throughout, resumed {resume_after_seconds:.1f} s after"
                               if paused is not None else ""))

    async def boot_powered_off(self) -> None:
        """Mount again every member's powerfs disk a power cut left unmounted (a scenario interrupted in
        the middle of a power loss), before its member is restarted."""
        for node_id in self.cluster.node_ids:
            mount = powerfs.PowerLossMount.for_directory(self.node_dir(node_id))
            if await asyncio.to_thread(powerfs.powered_off, mount):
                await asyncio.to_thread(mount.start)
                self.note("powerfs", f"{node_id}'s disk mounted again at heal time")

    async def wipe(self, node_id: str) -> FaultEvent:
        start = self.recorder.now()
        await self._kill(node_id)
        node_dir = Path(self.cluster.local.info.node(node_id).config).parent
        await asyncio.to_thread(wipe_directory, node_dir, KEPT_ON_WIPE)
        await self._restart(node_id)
        return self._record("wipe", node_id, start, "SIGKILL, data deleted, restarted empty")

    def node_dir(self, node_id: str) -> Path:
        return Path(self.cluster.local.info.node(node_id).config).parent

    def on_tmpfs(self) -> list[str]:
        """The members whose data directory is on a tmpfs of its own (moved there by a disk-full fault)."""
        return [node_id for node_id in self.cluster.node_ids
                if self.node_dir(node_id).resolve() in disk.mounted_tmpfs(self.node_dir(node_id))]

    async def disk_full(self, node_id: str, hold_seconds: float) -> FaultEvent:
        """Fill the file system of ``node_id``'s data directory for ``hold_seconds``, then free it. The first
        time, the member is stopped (SIGTERM) and its directory moved onto a tmpfs of its own."""
        await self._move_onto_tmpfs(node_id)
        start = self.recorder.now()
        filled = await self._fill(node_id)
        try:
            await asyncio.sleep(hold_seconds)
        finally:
            await self._free(node_id)
        alive = await self._restart_if_exited(node_id)
        return self._record("disk-full", node_id, start, f"{filled} filler bytes for {hold_seconds:.1f} s"
                            + ("" if alive else "; the member exited and was restarted"))

    async def disk_full_leader(self, node_id: str, hold_seconds: float) -> FaultEvent | None:
        """Make ``node_id`` the leader (its directory moved onto a tmpfs of its own first, once), wait until a
        send is acknowledged through it, fill its disk for ``hold_seconds``, then free it. It must step down
        or stop, and the other members go on acknowledging: :func:`chaos.checker.check_full_disk_leaders`
        judges that from the history (leader changes and acks); the detail says what was seen here (when the
        monitor stopped seeing it lead, whether it exited). None when it never led, or led without
        acknowledging anything (an outage of its own election is not the full disk's)."""
        await self._move_onto_tmpfs(node_id)
        if not await self._make_leader(node_id):
            self.note("disk-full-leader skipped", f"{node_id} did not win an election")
            return None
        if not await self._acknowledged_since(self.recorder.now(), LEADER_ACK_SECONDS):
            self.note("disk-full-leader skipped", f"{node_id} leads, but no send was acknowledged within "
                                                  f"{LEADER_ACK_SECONDS:g} s")
            return None
        loop = asyncio.get_running_loop()
        start = self.recorder.now()
        filled = await self._fill(node_id)
        deadline = loop.time() + hold_seconds
        stepped_down: float | None = None
        exited: float | None = None
        try:
            while (remaining := deadline - loop.time()) > 0:
                if stepped_down is None and self.monitor.leader != node_id:
                    stepped_down = self.recorder.now() - start
                if exited is None and not self._alive(node_id):
                    exited = self.recorder.now() - start
                await asyncio.sleep(min(FULL_LEADER_WATCH_SECONDS, remaining))
            led_at_the_end = self.monitor.leader == node_id
        finally:
            await self._free(node_id)
        seen = [f"{filled} filler bytes for {hold_seconds:.1f} s",
                "still led when freed" if stepped_down is None
                else f"{'no longer seen leading' if stepped_down else 'not leading'} after {stepped_down:.1f} s"]
        if stepped_down is not None and led_at_the_end:
            seen.append("led again when freed")
        if exited is not None:
            seen.append(f"exited after {exited:.1f} s, restarted once freed")
        # the fault ends when the disk is freed (the checker's window), before the restart
        event = self._record("disk-full-leader", node_id, start, "; ".join(seen))
        await self._restart_if_exited(node_id)
        return event

    async def _acknowledged_since(self, since: float, timeout_seconds: float) -> bool:
        """Wait until a send that started at ``since`` or later is acknowledged (up to ``timeout_seconds``)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_seconds
        while loop.time() < deadline:
            for send in reversed(self.recorder.history.sends):
                if send.end_time < since:
                    break
                if send.acked and send.send_time >= since:
                    return True
            await asyncio.sleep(0.1)
        return False

    async def _move_onto_tmpfs(self, node_id: str) -> None:
        """Stop ``node_id`` (SIGTERM), move its data directory onto a tmpfs of its own and restart it; once."""
        node_dir = self.node_dir(node_id)
        if node_dir.resolve() in disk.mounted_tmpfs(node_dir):
            return
        if self._alive(node_id):
            await asyncio.to_thread(self.cluster.local.kill, node_id, signal.SIGTERM)
        size = await asyncio.to_thread(disk.directory_bytes, node_dir)
        await asyncio.to_thread(disk.mount_tmpfs, node_dir, size + TMPFS_HEADROOM_BYTES)
        self.note("tmpfs", f"{node_id}'s data directory moved onto a tmpfs of {size + TMPFS_HEADROOM_BYTES} bytes")
        await self._restart(node_id)

    async def _fill(self, node_id: str) -> int:
        """Fill ``node_id``'s tmpfs (its headroom given back first, then kept from growing until :meth:`_free`);
        the filler bytes written."""
        async with self._tmpfs_lock:
            await self._grow_tmpfs(node_id)
            self.filling.add(node_id)
            try:
                return await asyncio.to_thread(disk.fill, self.node_dir(node_id))
            except BaseException:
                self.filling.discard(node_id)
                raise

    async def _free(self, node_id: str) -> None:
        await asyncio.to_thread(disk.unfill, self.node_dir(node_id))
        self.filling.discard(node_id)

    async def _restart_if_exited(self, node_id: str) -> bool:
        """Whether ``node_id`` was still running; restarted (and noted) when it was not."""
        if self._alive(node_id):
            return True
        self.note("member died", f"{node_id} exited while its disk was full (see broker.log)")
        await self._restart(node_id)
        return False

    async def _grow_tmpfs(self, node_id: str, grow_below: int | None = None) -> None:
        """Give the member's tmpfs its headroom back (what it wrote since it was moved there used it up);
        with ``grow_below``, only once less than that is free."""
        size = await asyncio.to_thread(disk.ensure_free, self.node_dir(node_id), TMPFS_HEADROOM_BYTES, grow_below)
        if size is not None:
            self.note("tmpfs", f"{node_id}'s tmpfs grown to {size} bytes")

    async def corrupt(self, node_id: str, rng: random.Random) -> FaultEvent | None:
        """Stop ``node_id`` (SIGTERM: flushed, checkpointed), flip one byte inside a committed record of
        its commit log, restart it, and wait for it to repair itself (the byte back as it was, and caught
        up) or exit; the outcome starts the event's detail."""
        start = self.recorder.now()
        if self._alive(node_id):
            await asyncio.to_thread(self.cluster.local.kill, node_id, signal.SIGTERM)
        corruption = await asyncio.to_thread(disk.corrupt_record, self.node_dir(node_id) / "store", rng)
        if corruption is None:
            self.note("corruption skipped", f"{node_id} has no committed record to corrupt")
            await self._restart(node_id)
            return None
        await self._restart(node_id)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + CORRUPTION_SETTLE_SECONDS
        outcome = CORRUPTION_UNNOTICED
        while loop.time() < deadline:
            if not self._alive(node_id):
                outcome = CORRUPTION_REFUSED
                break
            found = await asyncio.to_thread(disk.byte_at, corruption.segment, corruption.file_offset)
            if found != corruption.flipped and await self.caught_up(1.0):
                outcome = CORRUPTION_REPAIRED
                break
            await asyncio.sleep(0.5)
        self.note("corruption " + outcome, f"{node_id}: {corruption.describe()}")
        return self._record("corrupt", node_id, start, f"{outcome}: {corruption.describe()}")

    async def damage_file(self, node_id: str, rng: random.Random,
                          choices: Sequence[tuple[str, str]]) -> FaultEvent | None:
        """SIGKILL ``node_id``, save a copy of its files (for later roll-backs), damage one of its files (the
        file kind and damage drawn from ``choices``: see :mod:`chaos.corruption`), restart it and wait
        for what it does about it (:meth:`_settle_damage`). A member that refuses to run is wiped and restarted
        empty, as its operator would, so that the group has three members again for the next fault. The
        damage is noted on the timeline when it is made; the fault (kind ``corrupt``) says the outcome first."""
        start = self.recorder.now()
        node_dir = self.node_dir(node_id)
        await self._kill(node_id)
        if self._archive is None:
            self._archive = corruption.RollbackArchive(
                Path(tempfile.mkdtemp(prefix="rollback-copies-", dir=self.cluster.data_dir.parent)))
        archive = self._archive
        await asyncio.to_thread(archive.save, node_id, node_dir, start)
        damaged = await asyncio.to_thread(corruption.damage_some_file, node_dir, node_id, choices,
                                          random.Random(rng.getrandbits(64)), archive)
        if damaged is None:
            self.note("damage skipped", f"{node_id} has no file for any of {len(choices)} kinds of damage")
            await self._restart(node_id)
            return None
        self.note("file damaged", f"{node_id}: {damaged.describe()}")
        log_path = node_dir / "broker.log"
        log_start = log_path.stat().st_size if log_path.exists() else 0
        restarted = self.recorder.now()
        await self._restart(node_id)
        outcome, why = await self._settle_damage(node_id, damaged)
        held_back = await asyncio.to_thread(_log_lines_with, log_path, log_start, HELD_BACK_LOG_TEXT)
        if outcome in (CORRUPTION_REPAIRED, CORRUPTION_RECOVERED) and held_back:
            # it re-fetched its log between two polls of its status: its own log says it held back
            outcome, why = CORRUPTION_REFETCHED, f"broker.log: {held_back[-1][:500]}"
        if outcome == CORRUPTION_REFUSED:
            lines = await asyncio.to_thread(_exit_lines, log_path, log_start)
            why = f"exited {self.recorder.now() - restarted:.1f} s after its restart; broker.log: {lines}"
            await self._kill(node_id)
            await asyncio.to_thread(wipe_directory, node_dir, KEPT_ON_WIPE)
            await self._restart(node_id)
            caught_up = await self.caught_up(DAMAGE_SETTLE_SECONDS)
            why += "; wiped and restarted empty" + ("" if caught_up else " (not caught up in time)")
        detail = f"{outcome}: {damaged.describe()}" + (f" [{why}]" if why else "")
        return self._record("corrupt", node_id, start, detail)

    async def _settle_damage(self, node_id: str, damaged: corruption.FileDamage) -> tuple[str, str]:
        """(outcome, why) of a member restarted with a damaged file, waiting up to DAMAGE_SETTLE_SECONDS:
        refused (it exited), re-fetched (it reported damage, kept out of votes, then was whole again),
        repaired (a replicated file's damaged bytes are the peers' again), recovered (its recovery dealt with
        the damage), unnoticed (a replicated file still differs where it was damaged), or not settled."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + DAMAGE_SETTLE_SECONDS
        address = self.cluster.local.info.node(node_id).broker_address
        if self._connections is None:
            self._connections = Connections()
        reported: str | None = None
        damage_now: str | None = None
        matches = False
        #: (loop time, applied index) when it first looked settled: it must still be, and applying, a while later
        # (a member that cannot apply any more stays within the slack of the leader for a moment)
        settled: tuple[float, int] | None = None
        while loop.time() < deadline:
            if not self._alive(node_id):
                return CORRUPTION_REFUSED, ""
            table = await self._connections.runtime_info(address, 1.0)
            damage_now = (table or {}).get("raftDamage") or None
            reported = reported or damage_now
            if table is not None and damage_now is None and self.caught_up_now():
                matches = await asyncio.to_thread(self._matches_peers, node_id, damaged)
                applied = int((table or {}).get("appliedIndex") or 0)
                if not matches:
                    settled = None
                elif settled is None:
                    settled = (loop.time(), applied)
                elif loop.time() - settled[0] >= SETTLED_FOR_SECONDS and applied > settled[1]:
                    break
            else:
                settled = None
            await asyncio.sleep(0.5)
        else:
            if not self._alive(node_id):
                return CORRUPTION_REFUSED, ""
            if damage_now is not None:
                return CORRUPTION_NOT_SETTLED, f"still reports damage: {damage_now}"
            if not matches and damaged.file_kind in corruption.REPLICATED_KINDS:
                return CORRUPTION_UNNOTICED, "the damaged bytes still differ from every peer's"
            return CORRUPTION_NOT_SETTLED, "not caught up"
        if reported is not None:
            return CORRUPTION_REFETCHED, f"reported: {reported}"
        if damaged.file_kind in corruption.REPLICATED_KINDS:
            return CORRUPTION_REPAIRED, ""
        return CORRUPTION_RECOVERED, ""

    def _matches_peers(self, node_id: str, damaged: corruption.FileDamage) -> bool:
        """For a commit-log or consume-queue file: whether the bytes that were damaged (bit-flip: each flipped
        byte; truncate: from the cut; roll-back: the range that differed) are some peer's again, as far as that
        peer has written the file. Always True for the other kinds (no two members hold them alike)."""
        if damaged.file_kind not in corruption.REPLICATED_KINDS:
            return True
        mine = self.node_dir(node_id) / damaged.path
        if damaged.damage == corruption.BIT_FLIP:
            ranges = [(offset, offset + 1) for offset in damaged.offsets]
        elif damaged.damage == corruption.TRUNCATE:
            ranges = [(damaged.offsets[0], damaged.size_before)]
        else:
            ranges = [(damaged.offsets[0], damaged.offsets[1])]
        for peer in self.cluster.node_ids:
            theirs = self.node_dir(peer) / damaged.path
            if peer == node_id or not theirs.exists():
                continue
            written = corruption.used_bytes(theirs)
            if all(corruption.bytes_match(mine, theirs, low, min(high, written))
                   for low, high in ranges if low < written):
                return True
        return False

    # ------------------------------------------------------------------------------ network faults

    def _require_proxies(self) -> None:
        if self.cluster.toxiproxy is None or not self.cluster.links:
            raise RuntimeError("network faults need a cluster started with Raft proxies")

    async def _cut(self, links: Iterable[RaftLink]) -> list[RaftLink]:
        self._require_proxies()
        handle = self.cluster.toxiproxy
        assert handle is not None
        chosen = list(links)
        for link in chosen:
            await asyncio.to_thread(partition, handle, link.name, "timeout", "both")
            self.cut.add(link.name)
        return chosen

    async def _heal(self, links: Iterable[RaftLink | ClientLink]) -> None:
        handle = self.cluster.toxiproxy
        assert handle is not None
        for link in links:
            await asyncio.to_thread(heal, handle, link.name)
            self.cut.discard(link.name)

    async def partition(self, isolated: set[str], hold_seconds: float) -> FaultEvent:
        """Cut every link between ``isolated`` and the other members for ``hold_seconds``."""
        others = set(self.cluster.node_ids) - isolated
        start = self.recorder.now()
        links = await self._cut(self.cluster.links_between(isolated, others))
        await asyncio.sleep(hold_seconds)
        await self._heal(links)
        return self._record("partition", ",".join(sorted(isolated)), start,
                            f"black hole to {','.join(sorted(others))} for {hold_seconds:.1f} s")

    async def cut_link(self, link: RaftLink, hold_seconds: float) -> FaultEvent:
        start = self.recorder.now()
        await self._cut([link])
        await asyncio.sleep(hold_seconds)
        await self._heal([link])
        return self._record("cut-link", f"{link.dialer}-{link.acceptor}", start,
                            f"black hole for {hold_seconds:.1f} s")

    async def slow(self, links: list[RaftLink], latency_ms: int, jitter_ms: int, bandwidth_kb_s: int | None,
                   hold_seconds: float) -> FaultEvent:
        self._require_proxies()
        handle = self.cluster.toxiproxy
        assert handle is not None
        start = self.recorder.now()
        detail = await self._slow_links(handle, links, latency_ms, jitter_ms, bandwidth_kb_s, hold_seconds)
        return self._record("latency" if bandwidth_kb_s is None else "bandwidth",
                            ",".join(f"{link.dialer}-{link.acceptor}" for link in links), start,
                            f"{detail} for {hold_seconds:.1f} s")

    # --------------------------------------------------------------------------- client-link faults

    def _client_links(self, node_ids: set[str]) -> tuple[ToxiproxyHandle, list[ClientLink]]:
        handle = self.cluster.toxiproxy
        if handle is None or not self.cluster.client_links:
            raise RuntimeError("client-link faults need a cluster started with client proxies")
        return handle, self.cluster.client_links_to(node_ids)

    async def cut_clients(self, node_ids: set[str], hold_seconds: float) -> FaultEvent:
        """Black-hole every client's link to the brokers ``node_ids`` (both ways: connections stay open,
        bytes vanish; healing closes them) for ``hold_seconds``. Raft is untouched: a leader stays the
        leader, and its clients can only wait and retry."""
        handle, links = self._client_links(node_ids)
        start = self.recorder.now()
        for link in links:
            await asyncio.to_thread(partition, handle, link.name, "timeout", "both")
            self.cut.add(link.name)
        await asyncio.sleep(hold_seconds)
        await self._heal(links)
        return self._record("client-cut", ",".join(sorted(node_ids)), start,
                            f"clients' links black-holed for {hold_seconds:.1f} s")

    async def reset_clients(self, node_ids: set[str], streams: Streams, toxicity: float, timeout_ms: int,
                            hold_seconds: float) -> FaultEvent:
        """For ``hold_seconds``, a connection between a client and the brokers ``node_ids`` (a share
        ``toxicity`` of them, drawn per connection) has the next chunk on ``streams`` dropped and is reset
        (TCP RST) ``timeout_ms`` later; reconnections meet the same. Downstream, the broker acted on a
        request whose answer is lost: the client's retry (same UNIQ_KEY) must be deduplicated."""
        handle, links = self._client_links(node_ids)
        start = self.recorder.now()
        for link in links:
            self.cut.add(link.name)
            await asyncio.to_thread(reset_peer, handle, link.name, timeout_ms, streams, toxicity)
        await asyncio.sleep(hold_seconds)
        await self._heal(links)
        return self._record("client-reset", ",".join(sorted(node_ids)), start,
                            f"{streams} reset after {timeout_ms} ms, toxicity {toxicity:.2f}, "
                            f"for {hold_seconds:.1f} s")

    async def _slow_links(self, handle: ToxiproxyHandle, links: Sequence[RaftLink | ClientLink], latency_ms: int,
                          jitter_ms: int, bandwidth_kb_s: int | None, hold_seconds: float) -> str:
        """Delay (and optionally throttle) ``links`` for ``hold_seconds``, then heal them; the fault's detail."""
        for link in links:
            self.cut.add(link.name)
            await asyncio.to_thread(add_latency, handle, link.name, latency_ms, jitter_ms)
            if bandwidth_kb_s is not None:
                await asyncio.to_thread(limit_bandwidth, handle, link.name, bandwidth_kb_s)
        await asyncio.sleep(hold_seconds)
        await self._heal(links)
        return f"{latency_ms}+-{jitter_ms} ms" + (f", {bandwidth_kb_s} KB/s" if bandwidth_kb_s else "")

    async def slow_clients(self, node_ids: set[str], latency_ms: int, jitter_ms: int, bandwidth_kb_s: int | None,
                           hold_seconds: float) -> FaultEvent:
        """Delay (and optionally throttle) every client's link to the brokers ``node_ids``, both ways."""
        handle, links = self._client_links(node_ids)
        start = self.recorder.now()
        detail = await self._slow_links(handle, links, latency_ms, jitter_ms, bandwidth_kb_s, hold_seconds)
        return self._record("client-latency" if bandwidth_kb_s is None else "client-bandwidth",
                            ",".join(sorted(node_ids)), start, f"{detail} for {hold_seconds:.1f} s")

    # -------------------------------------------------------------------------------------- clocks

    async def clock_skew(self, node_id: str, offset_ms: int, hold_seconds: float) -> FaultEvent:
        """Restart ``node_id`` with its wall clock ``offset_ms`` off the others', make it the leader, hold,
        then restart it with the right clock. The group's time must not follow it (dledger.group_clock):
        the checker finds the acknowledged messages a jumped retention or timer would have lost."""
        start = self.recorder.now()
        led = False
        try:
            await self._restart(node_id, clock_offset_ns=offset_ms * 1_000_000)
            led = await self._make_leader(node_id)
            await asyncio.sleep(hold_seconds)
        finally:
            await self._restart(node_id, clock_offset_ns=0)
        return self._record("clock-skew", node_id, start, f"clock {offset_ms / 3_600_000:+.2f} h, "
                            + (f"led for {hold_seconds:.1f} s" if led else "never won an election (held anyway)"))

    async def _make_leader(self, node_id: str, attempts: int = 8) -> bool:
        """Pause whoever else leads until ``node_id`` wins an election (pysyncobj offers no transfer from
        outside the member); each pause lasts until another leader is seen, or a few seconds."""
        loop = asyncio.get_running_loop()
        for _ in range(attempts):
            leader = await self.leader()
            if leader is None or leader == node_id:
                return leader == node_id
            if not self._alive(leader):
                return False
            await asyncio.to_thread(self.cluster.local.kill, leader, signal.SIGSTOP)
            self.paused.add(leader)
            try:
                deadline = loop.time() + 10.0
                while loop.time() < deadline and self.monitor.leader in (None, leader):
                    await asyncio.sleep(0.1)
            finally:
                await asyncio.to_thread(self.cluster.local.kill, leader, signal.SIGCONT)
                self.paused.discard(leader)
        return await self.leader() == node_id

    # -------------------------------------------------------------------------------------- heal

    async def heal_everything(self) -> None:
        """Free filled disks, resume paused members, boot disks left powered off, restart dead members, heal
        every link (Raft and client)."""
        for node_id in self.cluster.node_ids:
            async with self._tmpfs_lock:
                await asyncio.to_thread(disk.unfill, self.node_dir(node_id))
                self.filling.discard(node_id)
                await self._grow_tmpfs(node_id)
        for node_id in sorted(self.paused):
            if self._alive(node_id):
                await asyncio.to_thread(self.cluster.local.kill, node_id, signal.SIGCONT)
        self.paused.clear()
        await self.boot_powered_off()
        for node_id in self.cluster.node_ids:
            if not self._alive(node_id):
                self.note("restarting", f"{node_id} was not running at heal time")
                await self._restart(node_id)
        if self.cluster.toxiproxy is not None:
            await asyncio.to_thread(self.cluster.heal_links)
        self.cut.clear()


def _temp_files(node_dir: Path) -> list[str]:
    """The temp files of atomic writes (``atomic_write``: temp file, fsync, rename) under a member's directory,
    relative to it: after a SIGKILL, the writes it interrupted."""
    return sorted(str(path.relative_to(node_dir)) for path in node_dir.rglob("*.tmp"))


def _log_lines(log_path: Path, start: int) -> list[str]:
    """The non-blank lines a member wrote to its log after byte ``start``."""
    try:
        with log_path.open("rb") as stream:
            stream.seek(start)
            text = stream.read().decode("utf-8", "replace")
    except FileNotFoundError:
        return []
    return [line.strip() for line in text.splitlines() if line.strip()]


def _log_lines_with(log_path: Path, start: int, text: str) -> list[str]:
    return [line for line in _log_lines(log_path, start) if text in line]


def _exit_lines(log_path: Path, start: int) -> str:
    """The last lines a member wrote to its log after ``start`` that say why it exited (its errors, or its
    last lines), joined with " | "."""
    lines = _log_lines(log_path, start)
    errors = [line for line in lines if any(word in line for word in ("CRITICAL", "ERROR", "Error", "error:"))]
    return " | ".join((errors or lines)[-EXIT_LINES_QUOTED:])[:1000] or "(nothing logged)"


def wipe_directory(directory: Path, keep: frozenset[str]) -> None:
    """Delete everything in ``directory`` except the names in ``keep``."""
    for child in directory.iterdir():
        if child.name in keep:
            continue
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()
