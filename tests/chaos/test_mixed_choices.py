"""How ``mixed`` runs its disk-full action, and whom disk-full-leader fills, without processes: a stand-in for
:class:`chaos.faults.Faults` records what the action asked for."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pytest

from chaos import disk, scenarios
from chaos.checker import WEDGE_BOUND_SECONDS
from chaos.faults import Faults


class StandInFaults:
    def __init__(self, root: Path, leader: str) -> None:
        self.cluster = type("Cluster", (), {"node_ids": ["n0", "n1", "n2"]})()
        self.root = root
        self.current_leader = leader
        self.notes: list[tuple[str, str]] = []
        self.filled: list[str] = []
        self.filled_as_leader: list[str] = []

    async def caught_up(self, timeout_seconds: float) -> bool:
        return True

    async def leader(self, timeout_seconds: float = 15.0) -> str | None:
        return self.current_leader

    def followers(self) -> list[str]:
        return [node for node in self.cluster.node_ids if node != self.current_leader]

    def node_dir(self, node_id: str) -> Path:
        return self.root / node_id

    def on_tmpfs(self) -> list[str]:
        return [node for node in self.cluster.node_ids if self.node_dir(node) in disk.mounted_tmpfs(self.node_dir(node))]

    def note(self, what: str, detail: str = "") -> None:
        self.notes.append((what, detail))

    async def disk_full(self, node_id: str, hold_seconds: float) -> None:
        self.filled.append(node_id)

    async def disk_full_leader(self, node_id: str, hold_seconds: float) -> None:
        assert scenarios.DISK_FULL_LEADER_HOLD_SECONDS[0] <= hold_seconds <= scenarios.DISK_FULL_LEADER_HOLD_SECONDS[1]
        self.filled_as_leader.append(node_id)


class Picks(random.Random):
    """Chooses ``action`` whenever asked to choose among mixed's actions."""

    def __init__(self, action: Callable[..., Any]) -> None:
        super().__init__(5)
        self.action = action

    def choice(self, sequence: Any) -> Any:
        if self.action in sequence:
            return self.action
        return super().choice(sequence)


def run_mixed(faults: StandInFaults, rng: random.Random) -> None:
    asyncio.run(scenarios.mixed(cast(Faults, faults), rng))


def test_mixed_skips_disk_full_with_a_note_where_no_tmpfs_can_be_mounted(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scenarios, "_tmpfs_unavailable", lambda: "mount -t tmpfs failed: not root")
    faults = StandInFaults(tmp_path, "n0")
    run_mixed(faults, Picks(scenarios.disk_full_one_member))
    assert faults.filled == []
    assert faults.notes == [("disk-full skipped", "cannot mount a tmpfs here: mount -t tmpfs failed: not root")]


@pytest.mark.parametrize(("leader", "filled", "skipped"), [
    ("n0", ["n1"], False),   # the member on a tmpfs follows: filled again
    ("n1", [], True),        # it leads: mixed puts no second member on a tmpfs
])
def test_mixed_fills_one_member_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, leader: str,
                                     filled: list[str], skipped: bool) -> None:
    monkeypatch.setattr(scenarios, "_tmpfs_unavailable", lambda: None)
    monkeypatch.setattr(disk, "mounted_tmpfs",
                        lambda root: [tmp_path / "n1"] if root == tmp_path / "n1" else [])
    faults = StandInFaults(tmp_path, leader)
    run_mixed(faults, Picks(scenarios.disk_full_one_member))
    assert faults.filled == filled
    assert bool(faults.notes) is skipped
    # the disk-full scenario itself moves another follower onto a tmpfs instead
    faults = StandInFaults(tmp_path, "n1")
    asyncio.run(scenarios.disk_full(cast(Faults, faults), random.Random(5)))
    assert faults.filled and faults.filled[0] in ("n0", "n2") and faults.notes == []


def test_mixed_chooses_among_every_kind_of_fault() -> None:
    assert {scenarios.disk_full_one_member, scenarios.corrupt_follower, scenarios.client_link} <= set(scenarios._MIXED)
    assert scenarios.SCENARIOS["mixed"].overrides == scenarios.DISK_FULL_OVERRIDES


@pytest.mark.parametrize(("leader", "mounted", "filled"), [
    ("n1", "n1", ["n1"]),    # the member on a tmpfs leads already
    ("n0", "n1", ["n1"]),    # it follows: it is made the leader (Faults.disk_full_leader)
    ("n0", None, ["n2"]),    # none yet: a follower is moved onto one (the seed picks which)
])
def test_disk_full_leader_fills_the_member_on_a_tmpfs_or_a_follower(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, leader: str, mounted: str | None, filled: list[str]) -> None:
    monkeypatch.setattr(disk, "mounted_tmpfs",
                        lambda root: [root] if mounted is not None and root == tmp_path / mounted else [])
    faults = StandInFaults(tmp_path, leader)
    asyncio.run(scenarios.disk_full_leader(cast(Faults, faults), random.Random(5)))
    assert faults.filled_as_leader == filled and faults.filled == [] and faults.notes == []
    assert scenarios.DISK_FULL_LEADER_HOLD_SECONDS[0] > WEDGE_BOUND_SECONDS  # a leader that keeps leading shows
