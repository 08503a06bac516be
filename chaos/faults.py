"""Faults on a running :class:`~chaos.cluster.ChaosCluster`, each recorded as a
:class:`~chaos.history.FaultEvent` (kind, target, start, end) once it is over.

Process faults act on the members' processes: SIGKILL then restart (``kill``), SIGSTOP then SIGCONT
(``pause``), every member at once (``kill-all``), and ``wipe`` (SIGKILL a member, delete its data, restart
it empty: it must rejoin and become byte-identical). Disk faults: ``disk-full`` moves a member's data
directory onto its own small tmpfs (once) and fills it for a while; ``corrupt`` stops a member, flips one
byte inside a committed record of its commit log and restarts it, then records what the member did about
it (:data:`CORRUPTION_OUTCOMES`). Network faults need a proxied cluster: ``partition``
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
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Final

from chaos import disk
from chaos.cluster import ChaosCluster, ClientLink, RaftLink
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
CORRUPTION_OUTCOMES: Final = (CORRUPTION_REPAIRED, CORRUPTION_REFUSED, CORRUPTION_UNNOTICED)
#: how long a corrupted member has, after its restart, to repair itself or exit
CORRUPTION_SETTLE_SECONDS: Final = 20.0
#: free space a member's tmpfs has beyond what its directory held when it was moved there, and again
#: before each fill and at heal time (it grows: the member keeps writing, for as long as a soak runs)
TMPFS_HEADROOM_BYTES: Final = 32 << 20
#: how often a member moved onto a tmpfs gets its headroom back between disk-full faults
TMPFS_CHECK_SECONDS: Final = 5.0


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

    def start(self) -> None:
        """Keep the headroom of members moved onto a tmpfs (see :meth:`_keep_headroom`) until :meth:`stop`."""
        self._keeper = asyncio.get_running_loop().create_task(self._keep_headroom(), name="tmpfs-headroom")

    async def stop(self) -> None:
        keeper, self._keeper = self._keeper, None
        if keeper is not None:
            keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await keeper

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

    async def _restart(self, *node_ids: str) -> None:
        """Start the members again (all at once); one whose process exits before it answers (its ports are
        in the ephemeral range, and an outgoing connection may have taken one meanwhile) is tried again."""
        loop = asyncio.get_running_loop()
        pending = list(node_ids)
        for attempt in range(RESTART_ATTEMPTS):
            for node_id in pending:
                await asyncio.to_thread(self.cluster.local.restart, node_id)
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
            views = self.monitor.views
            leader = self.monitor.leader
            leader_view = views.get(leader) if leader is not None else None
            if leader_view is not None and all(
                    view is not None and view.commit_log_max_offset >= leader_view.commit_log_max_offset
                    - CAUGHT_UP_SLACK_BYTES for view in views.values()):
                return True
            await asyncio.sleep(0.2)
        self.note("not caught up", f"members did not catch up within {timeout_seconds} s")
        return False

    # ------------------------------------------------------------------------------ process faults

    async def kill(self, node_id: str, hold_seconds: float) -> FaultEvent:
        start = self.recorder.now()
        await self._kill(node_id)
        await asyncio.sleep(hold_seconds)
        await self._restart(node_id)
        return self._record("kill", node_id, start, f"SIGKILL, restarted after {hold_seconds:.1f} s")

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

    async def wipe(self, node_id: str) -> FaultEvent:
        start = self.recorder.now()
        await self._kill(node_id)
        node_dir = Path(self.cluster.local.info.node(node_id).config).parent
        await asyncio.to_thread(wipe_directory, node_dir, KEPT_ON_WIPE)
        await self._restart(node_id)
        return self._record("wipe", node_id, start, "SIGKILL, data deleted, restarted empty")

    def node_dir(self, node_id: str) -> Path:
        return Path(self.cluster.local.info.node(node_id).config).parent

    async def disk_full(self, node_id: str, hold_seconds: float) -> FaultEvent:
        """Fill the file system of ``node_id``'s data directory for ``hold_seconds``, then free it. The first
        time, the member is stopped (SIGTERM) and its directory moved onto a tmpfs of its own."""
        node_dir = self.node_dir(node_id)
        if node_dir.resolve() not in disk.mounted_tmpfs(node_dir):
            if self._alive(node_id):
                await asyncio.to_thread(self.cluster.local.kill, node_id, signal.SIGTERM)
            size = await asyncio.to_thread(disk.directory_bytes, node_dir)
            await asyncio.to_thread(disk.mount_tmpfs, node_dir, size + TMPFS_HEADROOM_BYTES)
            self.note("tmpfs", f"{node_id}'s data directory moved onto a tmpfs of {size + TMPFS_HEADROOM_BYTES} "
                               "bytes")
            await self._restart(node_id)
        start = self.recorder.now()
        async with self._tmpfs_lock:
            await self._grow_tmpfs(node_id)
            self.filling.add(node_id)
            try:
                filled = await asyncio.to_thread(disk.fill, node_dir)
            except BaseException:
                self.filling.discard(node_id)
                raise
        try:
            await asyncio.sleep(hold_seconds)
        finally:
            await asyncio.to_thread(disk.unfill, node_dir)
            self.filling.discard(node_id)
        alive = self._alive(node_id)
        if not alive:
            self.note("member died", f"{node_id} exited while its disk was full (see broker.log)")
            await self._restart(node_id)
        return self._record("disk-full", node_id, start, f"{filled} filler bytes for {hold_seconds:.1f} s"
                            + ("" if alive else "; the member exited and was restarted"))

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

    # -------------------------------------------------------------------------------------- heal

    async def heal_everything(self) -> None:
        """Free filled disks, resume paused members, restart dead ones, heal every link (Raft and client)."""
        for node_id in self.cluster.node_ids:
            async with self._tmpfs_lock:
                await asyncio.to_thread(disk.unfill, self.node_dir(node_id))
                self.filling.discard(node_id)
                await self._grow_tmpfs(node_id)
        for node_id in sorted(self.paused):
            if self._alive(node_id):
                await asyncio.to_thread(self.cluster.local.kill, node_id, signal.SIGCONT)
        self.paused.clear()
        for node_id in self.cluster.node_ids:
            if not self._alive(node_id):
                self.note("restarting", f"{node_id} was not running at heal time")
                await self._restart(node_id)
        if self.cluster.toxiproxy is not None:
            await asyncio.to_thread(self.cluster.heal_links)
        self.cut.clear()


def wipe_directory(directory: Path, keep: frozenset[str]) -> None:
    """Delete everything in ``directory`` except the names in ``keep``."""
    for child in directory.iterdir():
        if child.name in keep:
            continue
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()
