"""The chaos scenarios: which faults, on whom, on what schedule. Each scenario's ``drive`` runs on the
event loop while the workload runs, injecting faults from a seeded ``random.Random`` until its deadline
(the fault in progress then finishes its hold and is healed).

Targets that depend on the moment (the leader, a follower) are chosen when the fault starts, from the
leader monitor's view; everything else (gaps, holds, which member, which link) comes from the seed.
"""

from __future__ import annotations

import asyncio
import functools
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Final

from chaos import corruption, disk, powerfs
from chaos.cluster import clock_unavailable
from chaos.faults import Faults
from chaos.toxiproxy_control import Streams

#: seconds between the end of one fault and the start of the next (uniform in this range)
GAP_SECONDS: Final = (2.0, 4.0)
#: how long a wiped follower may take to catch up before the next wipe
CATCH_UP_SECONDS: Final = 60.0
#: how long a power-loss fault keeps the power off before the machines boot (also the NATS comparison's,
#: chaos.nats_power_loss: the same seed draws the same gaps and holds there)
POWER_LOSS_HOLD_SECONDS: Final = (0.5, 2.0)
#: small segments for the disk-full scenario: a full tmpfs shows when the next segment is created, which
#: then happens every few seconds, not once per 64 MiB
DISK_FULL_OVERRIDES: Final[dict[str, dict[str, Any]]] = {
    "store": {"segment_size_bytes": 1 << 20, "body_size_max_bytes": 256 << 10},
}
#: how long disk-full-leader keeps the leader's disk full: longer than chaos.checker.WEDGE_BOUND_SECONDS, so
#: that a leader which kept leading through it (the group wedged) shows as a violation
DISK_FULL_LEADER_HOLD_SECONDS: Final = (12.0, 16.0)

#: how far clock-skew moves a member's clock (ahead or behind): minutes, hours, and the 73 h of the finding
#: ("Time"); small segments and frequent retention checks, so that a retention run by the skewed clock
#: would have whole segments of acknowledged messages to delete
CLOCK_SKEWS_MS: Final = (5 * 60_000, 2 * 3_600_000, 73 * 3_600_000)
CLOCK_SKEW_OVERRIDES: Final[dict[str, dict[str, Any]]] = {
    "store": {"segment_size_bytes": 1 << 20, "body_size_max_bytes": 256 << 10},
    "broker": {"retention_check_seconds": 1.0},
}

#: kill-during-compaction: Raft log compaction every few entries (and every second), and a kill every 0.3-1.5 s
#: (the member restarted 0.2-1 s later), so that many kills land inside a compaction
COMPACTION_OVERRIDES: Final[dict[str, dict[str, Any]]] = {
    "raft": {"log_compaction_entries": 10, "log_compaction_seconds": 1},
}
KILL_GAP_SECONDS: Final = (0.3, 1.5)
KILL_HOLD_SECONDS: Final = (0.2, 1.0)

#: corrupt-minority: small store files (so that each kind has several files, and copies for roll-backs are
#: cheap) and compactions every few seconds (so that members hold a Raft snapshot and compacted journals)
CORRUPT_MINORITY_OVERRIDES: Final[dict[str, dict[str, Any]]] = {
    "store": {"segment_size_bytes": 1 << 20, "body_size_max_bytes": 256 << 10, "consume_queue_units_per_file": 1024,
              "index_slot_count": 1024, "index_entry_capacity": 4096},
    "raft": {"log_compaction_entries": 500, "log_compaction_seconds": 5},
}

Action = Callable[[Faults, random.Random], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    summary: str
    #: network faults: every Raft link and every client link must run through a proxy
    needs_proxies: bool
    action: Action
    #: member settings this scenario needs (under the run's own overrides)
    overrides: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: why this scenario cannot run on this machine, or None (checked before the group starts)
    unavailable: Callable[[], str | None] = lambda: None
    #: every member's data directory on a powerfs mount of its own from the start (chaos.powerfs)
    on_powerfs: bool = False
    #: seconds between the end of one fault and the start of the next (uniform in this range)
    gap_seconds: tuple[float, float] = GAP_SECONDS

    async def drive(self, faults: Faults, rng: random.Random, deadline: float) -> None:
        """Inject ``action`` repeatedly, a random gap apart, until the loop time ``deadline``."""
        loop = asyncio.get_running_loop()
        while True:
            gap = rng.uniform(*self.gap_seconds)
            if loop.time() + gap >= deadline:
                return
            await asyncio.sleep(gap)
            await self.action(faults, rng)


async def kill_leader(faults: Faults, rng: random.Random) -> None:
    leader = await faults.leader()
    if leader is not None:
        await faults.kill(leader, rng.uniform(2.0, 4.0))


async def pause_leader(faults: Faults, rng: random.Random) -> None:
    leader = await faults.leader()
    if leader is not None:
        await faults.pause(leader, rng.uniform(3.0, 6.0))


async def partition_leader(faults: Faults, rng: random.Random) -> None:
    leader = await faults.leader()
    if leader is not None:
        await faults.partition({leader}, rng.uniform(4.0, 7.0))


async def partition_random(faults: Faults, rng: random.Random) -> None:
    """Isolate a random member, or cut one random link (a partial partition: the two ends can still
    hear each other through the third member)."""
    nodes = faults.cluster.node_ids
    if rng.random() < 0.5:
        await faults.partition({rng.choice(nodes)}, rng.uniform(3.0, 6.0))
    else:
        await faults.cut_link(rng.choice(faults.cluster.links), rng.uniform(3.0, 6.0))


async def kill_all_restart(faults: Faults, rng: random.Random) -> None:
    await faults.kill_all(rng.uniform(0.5, 2.0))


async def power_loss(faults: Faults, rng: random.Random) -> None:
    """Every member loses power at once, under load: what none of them fsynced is gone."""
    await faults.power_loss(faults.cluster.node_ids, rng.uniform(*POWER_LOSS_HOLD_SECONDS))


async def power_loss_leader_paused(faults: Faults, rng: random.Random) -> None:
    """A follower is paused, the leader loses power and boots again, then the follower resumes (Jepsen's
    NATS JetStream report): while the follower sleeps, the leader and the other follower are the majority
    every acknowledgement needed, and the leader's unsynced tail is gone."""
    leader = await faults.leader()
    followers = sorted(faults.followers())
    if leader is None or not followers:
        return
    await faults.power_loss([leader], rng.uniform(*POWER_LOSS_HOLD_SECONDS), paused=rng.choice(followers),
                            resume_after_seconds=rng.uniform(1.0, 3.0))


async def wipe_follower(faults: Faults, rng: random.Random) -> None:
    # Wiping a second member while the first still copies would lose a majority's data: wait first.
    if not await faults.caught_up(CATCH_UP_SECONDS):
        return
    if await faults.leader() is None:
        return
    followers = faults.followers()
    if followers:
        await faults.wipe(rng.choice(sorted(followers)))


async def disk_full(faults: Faults, rng: random.Random) -> None:
    """Fill a caught-up follower's disk for 4-8 s: the member whose directory is on a tmpfs already, while
    it is a follower (each member moved onto a tmpfs costs a restart)."""
    await _fill_follower_disk(faults, rng, one_member=False)


async def disk_full_one_member(faults: Faults, rng: random.Random) -> None:
    """:func:`disk_full` as ``mixed`` runs it: never on a second member's tmpfs. A tmpfs only has
    ``TMPFS_HEADROOM_BYTES`` beyond what its member held when moved there, and the other faults (a wipe
    and catch-up, a long soak) keep writing: two of three members on small file systems could both run
    full and stall the majority. While the member already on one leads, the fault is skipped."""
    await _fill_follower_disk(faults, rng, one_member=True)


async def _fill_follower_disk(faults: Faults, rng: random.Random, one_member: bool) -> None:
    if not await faults.caught_up(CATCH_UP_SECONDS) or await faults.leader() is None:
        return
    followers = sorted(faults.followers())
    if not followers:
        return
    mounted = faults.on_tmpfs()
    mounted_followers = [node for node in mounted if node in followers]
    if mounted_followers:
        target = mounted_followers[0]
    elif mounted and one_member:
        faults.note("disk-full skipped", f"{mounted[0]}, the member on a tmpfs, leads")
        return
    else:
        target = rng.choice(followers)
    await faults.disk_full(target, rng.uniform(4.0, 8.0))


async def disk_full_leader(faults: Faults, rng: random.Random) -> None:
    """Make the member on a tmpfs (at first a follower, moved there) the leader, and fill its disk for 12-16 s
    under load: it must step down or stop, and the other two go on acknowledging (the checker's ``wedged``)."""
    if not await faults.caught_up(CATCH_UP_SECONDS) or await faults.leader() is None:
        return
    mounted = faults.on_tmpfs()
    followers = sorted(faults.followers())
    if not mounted and not followers:
        return
    target = mounted[0] if mounted else rng.choice(followers)
    await faults.disk_full_leader(target, rng.uniform(*DISK_FULL_LEADER_HOLD_SECONDS))


async def corrupt_follower(faults: Faults, rng: random.Random) -> None:
    """Flip a byte inside a committed record of a caught-up follower's commit log (stopped, then
    restarted): it must repair itself from its peers or refuse to run."""
    if not await faults.caught_up(CATCH_UP_SECONDS) or await faults.leader() is None:
        return
    followers = sorted(faults.followers())
    if followers:
        await faults.corrupt(rng.choice(followers), rng)


async def kill_during_compaction(faults: Faults, rng: random.Random) -> None:
    """SIGKILL the leader or a follower (half the time each), restart it 0.2-1 s later: with compaction every
    few entries (COMPACTION_OVERRIDES) and a kill every second or so, many land inside a compaction (the
    snapshot being written, the journal's manifest replaced, old segments deleted)."""
    leader = await faults.leader()
    if leader is None:
        return
    followers = sorted(faults.followers())
    target = leader if rng.random() < 0.5 or not followers else rng.choice(followers)
    await faults.kill(target, rng.uniform(*KILL_HOLD_SECONDS), show_interrupted=True)


async def corrupt_minority(faults: Faults, rng: random.Random) -> None:
    """Once the group is caught up: SIGKILL the leader or a follower (half the time each), damage one of its
    files (every kind of file and damage of :mod:`chaos.corruption` but its open findings), restart it and wait
    for what it does (faults.Faults.damage_file): one member at a time, so a majority always holds every
    acknowledged message."""
    await _corrupt_one_member(faults, rng, corruption.SURVIVED_DAMAGE)


async def _corrupt_one_member(faults: Faults, rng: random.Random, choices: tuple[tuple[str, str], ...]) -> None:
    if not await faults.caught_up(CATCH_UP_SECONDS):
        return
    leader = await faults.leader()
    if leader is None:
        return
    followers = sorted(faults.followers())
    target = leader if rng.random() < 0.5 or not followers else rng.choice(followers)
    await faults.damage_file(target, rng, choices)


async def slow_link(faults: Faults, rng: random.Random) -> None:
    links = list(faults.cluster.links)
    chosen = rng.sample(links, rng.randint(1, len(links)))
    latency_ms = rng.randint(50, 250)
    bandwidth = 500 if rng.random() < 0.25 else None
    await faults.slow(chosen, latency_ms, latency_ms // 4, bandwidth, rng.uniform(4.0, 8.0))


# ------------------------------------------------------------------------------------- client links


async def partition_client_leader(faults: Faults, rng: random.Random) -> None:
    """Every client loses its link to the leader (black hole) while Raft is healthy: the leader stays the
    leader, so sends fail or time out until healed; followers still serve reads."""
    leader = await faults.leader()
    if leader is not None:
        await faults.cut_clients({leader}, rng.uniform(4.0, 7.0))


def _client_targets(faults: Faults, rng: random.Random, leader: str) -> set[str]:
    """The leader (half the time), every member, or one member at random."""
    draw = rng.random()
    if draw < 0.5:
        return {leader}
    if draw < 0.75:
        return set(faults.cluster.node_ids)
    return {rng.choice(faults.cluster.node_ids)}


async def client_link_reset(faults: Faults, rng: random.Random) -> None:
    """Reset clients' connections to the leader, to every member or to one (a share of them, as data
    flows on one direction or both) for 3-6 s: answers lost after the broker acted (downstream) are
    retried with the same UNIQ_KEY and must be stored once."""
    leader = await faults.leader()
    if leader is None:
        return
    targets = _client_targets(faults, rng, leader)
    streams: Streams = rng.choice(("downstream", "downstream", "upstream", "both"))
    await faults.reset_clients(targets, streams, round(rng.uniform(0.3, 1.0), 2), rng.randint(0, 200),
                               rng.uniform(3.0, 6.0))


async def slow_client_link(faults: Faults, rng: random.Random) -> None:
    """50-1500 ms latency (sometimes 20 KB/s) on clients' links to the leader, every member or one, for
    4-8 s: above the clients' 2 s request timeout, requests time out after the broker acted and are retried."""
    leader = await faults.leader()
    if leader is None:
        return
    targets = _client_targets(faults, rng, leader)
    latency_ms = rng.randint(50, 1500)
    bandwidth = 20 if rng.random() < 0.25 else None
    await faults.slow_clients(targets, latency_ms, latency_ms // 4, bandwidth, rng.uniform(4.0, 8.0))


async def client_link(faults: Faults, rng: random.Random) -> None:
    """One of the client-link faults above."""
    await rng.choice((partition_client_leader, client_link_reset, slow_client_link))(faults, rng)


async def clock_skew(faults: Faults, rng: random.Random) -> None:
    """One member's wall clock minutes or hours ahead or behind, and that member made the leader."""
    offset_ms = rng.choice(CLOCK_SKEWS_MS) * rng.choice((1, -1))
    await faults.clock_skew(rng.choice(faults.cluster.node_ids), offset_ms, rng.uniform(5.0, 10.0))


# -------------------------------------------------------------------------------------------- mixed


@functools.cache
def _tmpfs_unavailable() -> str | None:
    return disk.tmpfs_unavailable()


_MIXED: Final[tuple[Action, ...]] = (kill_leader, pause_leader, partition_leader, partition_random, kill_all_restart,
                                     wipe_follower, slow_link, disk_full_one_member, corrupt_follower, client_link)


async def mixed(faults: Faults, rng: random.Random) -> None:
    """A random action of :data:`_MIXED`. Disk-full is skipped (with a note) where a tmpfs cannot be mounted,
    so the seed still picks the same sequence of actions everywhere."""
    action = rng.choice(_MIXED)
    if action is disk_full_one_member and (reason := _tmpfs_unavailable()) is not None:
        faults.note("disk-full skipped", f"cannot mount a tmpfs here: {reason}")
        return
    await action(faults, rng)


SCENARIOS: Final[dict[str, Scenario]] = {scenario.name: scenario for scenario in (
    Scenario("kill-leader", "SIGKILL the leader, restart it 2-4 s later", False, kill_leader),
    Scenario("pause-leader", "SIGSTOP the leader for 3-6 s, then SIGCONT", False, pause_leader),
    Scenario("partition-leader", "black-hole every Raft link of the leader for 4-7 s", True, partition_leader),
    Scenario("partition-random", "isolate a random member, or cut one random Raft link, for 3-6 s", True,
             partition_random),
    Scenario("kill-all-restart", "SIGKILL every member, restart all 0.5-2 s later", False, kill_all_restart),
    Scenario("wipe-follower", "SIGKILL a caught-up follower, delete its data, restart it empty", False,
             wipe_follower),
    Scenario("disk-full", "fill a follower's own small tmpfs for 4-8 s (its data directory moved there once)",
             False, disk_full, DISK_FULL_OVERRIDES, disk.tmpfs_unavailable),
    Scenario("disk-full-leader", "make the member on its own small tmpfs the leader, fill it for 12-16 s: it must "
             "step down, acks must resume (a wedge fails the verdict)", False, disk_full_leader, DISK_FULL_OVERRIDES,
             disk.tmpfs_unavailable),
    Scenario("corrupt-follower", "stop a caught-up follower, flip a byte inside a committed record of its "
             "commit log, restart it", False, corrupt_follower),
    Scenario("kill-during-compaction", "Raft log compaction every 10 entries; SIGKILL the leader or a follower "
             "every 0.3-1.5 s, restart it 0.2-1 s later", False, kill_during_compaction, COMPACTION_OVERRIDES,
             gap_seconds=KILL_GAP_SECONDS),
    Scenario("corrupt-minority", "SIGKILL the leader or a follower, bit-flip, truncate or roll back one of its "
             "files (Raft journal, snapshot, commit log, consume queue, key index, checkpoint), restart it, wait "
             "until caught up (not the damage of chaos.corruption.OPEN_FINDINGS)", False, corrupt_minority,
             CORRUPT_MINORITY_OVERRIDES),
    Scenario("slow-link", "50-250 ms latency (sometimes 500 KB/s) on random Raft links for 4-8 s", True, slow_link),
    Scenario("partition-client-leader", "black-hole every client's link to the leader for 4-7 s (Raft healthy)",
             True, partition_client_leader),
    Scenario("client-link-reset", "reset clients' connections (TCP RST as data flows) to the leader, every member "
             "or one, for 3-6 s", True, client_link_reset),
    Scenario("slow-client-link", "50-1500 ms latency (sometimes 20 KB/s) on clients' links to the leader, every "
             "member or one, for 4-8 s", True, slow_client_link),
    Scenario("clock-skew", "restart a member with its wall clock 5 min, 2 h or 73 h ahead or behind, make it "
             "the leader for 5-10 s, restart it with the right clock", False, clock_skew, CLOCK_SKEW_OVERRIDES,
             clock_unavailable),
    Scenario("mixed", "a random fault of every scenario above, one after another (disk-full only where a tmpfs "
             "can be mounted)", True, mixed, DISK_FULL_OVERRIDES),
    # not part of mixed: every member's directory must be on powerfs before the group starts
    Scenario("power-loss", "cut the power of every member at once (powerfs: unsynced writes lost), boot them "
             "0.5-2 s later", False, power_loss, unavailable=powerfs.powerfs_unavailable, on_powerfs=True),
    Scenario("power-loss-leader-paused", "pause a follower, cut the leader's power, boot it 0.5-2 s later, "
             "resume the follower 1-3 s after that", False, power_loss_leader_paused,
             unavailable=powerfs.powerfs_unavailable, on_powerfs=True),
)}
