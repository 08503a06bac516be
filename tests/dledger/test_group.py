"""The replicated group with real processes on loopback: every acknowledged append survives, in order,
on byte-identical replicas, through leader kills, whole-group crashes, isolation and wiped disks."""

from __future__ import annotations

import shutil
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from commitlog.config import StoreConfig
from commitlog.outcomes import GetStatus
from commitlog.record_codec import decode_record
from commitlog.store import MessageStore
from tests.commitlog.helpers import data_bytes
from tests.dledger.group import Group, running_group
from tests.dledger.member_node import QUEUES
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow

#: Sized for the 100k+ messages these tests write, not tests.support.stores.SMALL_STORE: with its 16k-entry index
#: files (a UNIQ_KEY lookup that finds nothing reads every index file) the preferred-leader test failed 6
#: runs in 7, against 1 in 21 with these sizes (its restarted member's pysyncobj log ended empty: an
#: IndexError on every tick).
STORE = {"segment_size_bytes": 8 << 20, "body_size_max_bytes": 1 << 20, "consume_queue_units_per_file": 100_000,
         "index_slot_count": 100_000, "index_entry_capacity": 400_000}


def wait_acked(group: Group, at_least: int, timeout_seconds: float = 120.0) -> int:
    def enough() -> int:
        total = sum(status["acked"] for status in group.statuses().values())
        return total if total >= at_least else 0

    result: int = wait_for(enough, f"{at_least} acknowledged appends", timeout_seconds=timeout_seconds)
    return result


def verify(group: Group) -> dict[str, Any]:
    """Stop the group, then check byte equality and that every acknowledged append is stored, once, in
    acknowledgement order per queue."""
    group.load(False)
    group.wait_converged()
    group.stop_all()
    stores = [node.data_dir / "store" for node in group.nodes]
    reference = data_bytes(stores[0])
    for other in stores[1:]:
        other_bytes = data_bytes(other)
        assert other_bytes.keys() == reference.keys(), f"{other} has different files"
        for name, content in reference.items():
            assert other_bytes[name] == content, f"{other}/{name} differs"
    acked = group.acked()
    store = MessageStore(StoreConfig(data_dir=stores[0], **group.store))
    stored: dict[tuple[int, int], tuple[int, str]] = {}
    for queue_id in range(QUEUES):
        offset = 0
        while True:
            result = store.get_messages("ReplicationTest", queue_id, offset, 512, max_bytes=64 << 20)
            if result.status is not GetStatus.FOUND:
                break
            for queue_offset, raw in zip(result.queue_offsets, result.messages, strict=True):
                record = decode_record(raw)
                stored[(queue_id, queue_offset)] = (record.physical_offset, record.property_map["UNIQ_KEY"])
            offset = result.next_begin_offset
    keys = [key for _, key in stored.values()]
    assert len(keys) == len(set(keys)), "a message is stored twice"
    per_producer_queue: dict[tuple[str, int], list[tuple[int, int]]] = defaultdict(list)
    for node, sequence, queue_id, queue_offset, physical in acked:
        assert stored.get((queue_id, queue_offset)) == (physical, f"{node}-{sequence}"), (
            f"acknowledged {node}-{sequence} at queue {queue_id} offset {queue_offset} is missing or different")
        per_producer_queue[(node, queue_id)].append((sequence, queue_offset))
    for entries in per_producer_queue.values():
        entries.sort()
        offsets = [queue_offset for _, queue_offset in entries]
        assert offsets == sorted(offsets), "acknowledged appends were reordered within a queue"
    store.close()
    return {"acked": len(acked), "stored": len(stored)}


def test_three_members_replicate_100k_messages_byte_identically(tmp_path: Path) -> None:
    with running_group(tmp_path, store=STORE) as group:
        group.wait_leader()
        group.load(True)
        wait_acked(group, 100_000, timeout_seconds=240)
        figures = verify(group)
    assert figures["acked"] >= 100_000


def test_each_entry_reaches_a_follower_once_under_a_deep_pipeline(tmp_path: Path) -> None:
    """pysyncobj's leader set a follower's next index back to just after each success reply, so what it had
    sent since went again: ~0.64 entries per new one at full speed with 16 entries in flight (as the
    replication benchmark runs). A reconnection may still resend a few."""
    env = {"RAFTMQ_TEST_ACK_LOG": "0", "RAFTMQ_TEST_IN_FLIGHT": "4096"}
    with running_group(tmp_path, store=STORE, group_commit={"in_flight_entries_max": 16}, env=env) as group:
        leader = group.wait_leader()
        group.load(True)
        wait_for(lambda: leader.request("status")["acked"] >= 100_000, "100,000 acknowledged appends",
                 timeout_seconds=240)
        group.load(False)
        statuses = group.wait_converged()
    followers = {node: status for node, status in statuses.items() if status["role"] != "leader"}
    assert len(followers) == 2
    for node, status in followers.items():
        assert status["entries_received"] >= 100, (node, status)
        assert status["entries_already_held"] <= status["entries_received"] // 20, (node, status)


def test_killing_the_leader_under_load_loses_and_reorders_nothing(tmp_path: Path) -> None:
    takeovers = []
    with running_group(tmp_path, store=STORE) as group:
        group.wait_leader()
        group.load(True)
        acked = 0
        for _ in range(3):
            acked = wait_acked(group, acked + 3_000)
            leader = group.wait_leader()
            leader.kill()
            started = time.monotonic()
            survivors = [n for n in group.nodes if n is not leader]
            group.wait_leader(among=survivors)
            takeovers.append(time.monotonic() - started)
            leader.start()  # restarts and catches up while the load goes on
            group.load(True)
        wait_acked(group, acked + 3_000)
        figures = verify(group)
    assert figures["acked"] > 12_000
    print(f"leader takeover seconds: {[round(t, 2) for t in takeovers]}")


def test_killing_every_member_at_once_loses_nothing_acknowledged(tmp_path: Path) -> None:
    with running_group(tmp_path, store=STORE) as group:
        group.wait_leader()
        group.load(True)
        wait_acked(group, 10_000)
        for node in group.nodes:  # as close to simultaneous as signals get
            assert node.process is not None
            node.process.kill()
        for node in group.nodes:
            assert node.process is not None
            node.process.wait()
        for node in group.nodes:
            node.start()
        group.wait_leader()
        figures = verify(group)
    assert figures["acked"] >= 10_000


def test_an_isolated_leader_stops_acknowledging(tmp_path: Path) -> None:
    with running_group(tmp_path, store=STORE) as group:
        leader = group.wait_leader()
        group.load(True)
        wait_acked(group, 5_000)
        followers = [n for n in group.nodes if n is not leader]
        for follower in followers:
            follower.pause()
        # what was in flight settles; after that a minority must never acknowledge
        def settled() -> int | None:
            first = leader.request("status")["acked"]
            time.sleep(0.5)
            second = leader.request("status")["acked"]
            return second if first == second else None

        frozen = wait_for(settled, "in-flight appends to settle", timeout_seconds=30)
        wait_for(lambda: leader.request("status")["role"] != "leader", "the isolated leader to step down",
                 timeout_seconds=30)
        assert leader.request("status")["acked"] == frozen
        for follower in followers:
            follower.resume()
        group.wait_leader()
        group.load(True)
        wait_acked(group, frozen + 2_000)
        verify(group)


def test_a_paused_leader_is_replaced_and_rejoins(tmp_path: Path) -> None:
    with running_group(tmp_path, store=STORE) as group:
        leader = group.wait_leader()
        group.load(True)
        acked = wait_acked(group, 3_000)
        leader.pause()
        group.wait_leader(among=[n for n in group.nodes if n is not leader])
        acked = wait_acked(group, acked + 3_000)
        leader.resume()
        wait_for(lambda: leader.request("status")["role"] != "leader", "the old leader to step down",
                 timeout_seconds=30)
        wait_acked(group, acked + 2_000)
        verify(group)


def test_the_largest_allowed_message_replicates(tmp_path: Path) -> None:
    with running_group(tmp_path, store=STORE) as group:
        leader = group.wait_leader()
        largest = leader.request(f"large {STORE['body_size_max_bytes']}", timeout_seconds=120)
        assert largest["status"] == "ok", largest
        too_large = leader.request(f"large {STORE['body_size_max_bytes'] + 1}", timeout_seconds=120)
        assert too_large.get("status") == "rejected" or "error" in too_large, too_large
        verify(group)


def test_a_wiped_follower_rejoins_through_a_snapshot_and_becomes_identical(tmp_path: Path) -> None:
    with running_group(tmp_path, store=STORE, raft={"log_compaction_entries": 50, "log_compaction_seconds": 5}) as group:
        leader = group.wait_leader()
        group.load(True)
        acked = wait_acked(group, 20_000)
        follower = next(n for n in group.nodes if n is not leader)
        follower.kill()
        shutil.rmtree(follower.data_dir)
        follower.data_dir.mkdir()
        acked = wait_acked(group, acked + 20_000)  # the log moves on and is compacted meanwhile
        follower.start()
        wait_acked(group, acked + 2_000)
        verify(group)
    follower_log = (tmp_path / f"{follower.node_id}.log").read_text()
    assert "catching up to index" in follower_log, "the follower rejoined without installing a snapshot"


def test_compaction_keeps_the_journal_and_memory_bounded(tmp_path: Path) -> None:
    with running_group(tmp_path, store=STORE, raft={"log_compaction_entries": 100, "log_compaction_seconds": 5}) as group:
        leader = group.wait_leader()
        group.load(True)
        journal = leader.data_dir / "raft" / "journal.d"
        assert leader.process is not None
        wait_acked(group, 20_000)
        early_rss = _rss_mb(leader.process.pid)
        journal_sizes = []
        acked = 20_000
        for _ in range(4):
            acked = wait_acked(group, acked + 20_000)
            journal_sizes.append(sum(path.stat().st_size for path in journal.iterdir() if path.is_file()))
        late_rss = _rss_mb(leader.process.pid)
        written = leader.request("status")["end"]
        verify(group)
    print(f"written {written >> 20} MiB, journal sizes {journal_sizes}, leader RSS {early_rss:.0f} -> {late_rss:.0f} MB")
    assert written > 80 << 20
    # 100 entries of at most 1 MiB each, plus slack: never the data written
    assert max(journal_sizes) < 160 << 20, journal_sizes
    assert late_rss < early_rss + 40, (early_rss, late_rss)


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def test_leadership_transfer_before_a_planned_restart(tmp_path: Path) -> None:
    with running_group(tmp_path, store=STORE) as group:
        leader = group.wait_leader()
        group.load(True)
        acked = wait_acked(group, 2_000)
        leader.request("transfer")
        wait_for(lambda: group.leader() not in (None, leader), "the transfer", timeout_seconds=30)
        leader.kill()  # the planned restart, now of a follower
        acked = wait_acked(group, acked + 2_000)
        leader.start()
        wait_acked(group, acked + 2_000)
        verify(group)


def test_the_preferred_leader_takes_leadership_back(tmp_path: Path) -> None:
    with running_group(tmp_path, store=STORE, preferred_leader="n2") as group:
        preferred = group.nodes[2]
        wait_for(lambda: group.leader() is preferred, "the preferred member to lead", timeout_seconds=60)
        group.load(True)
        acked = wait_acked(group, 2_000)
        preferred.kill()
        group.wait_leader(among=group.nodes[:2])
        acked = wait_acked(group, acked + 2_000)
        preferred.start()  # it leads again once it has caught up
        wait_for(lambda: group.leader() is preferred, "the preferred member to lead again",
                 timeout_seconds=60)
        group.load(True)
        wait_acked(group, acked + 2_000)
        verify(group)
