"""Three (or five) real member processes on loopback for the replication tests."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.process_group import (
    MemberConfig,
    MemberProcess,
    member_configs,
    member_environment,
    running_processes,
)
from tests.support.stores import SMALL_STORE
from tests.support.waiting import wait_for

SECRET = "replication-test-secret-0123456789"


class Node(MemberProcess):
    """A ``tests.dledger.member_node`` process: control commands as text lines, answers as JSON lines."""

    def __init__(self, config: MemberConfig, root: Path, environment: dict[str, str]) -> None:
        super().__init__(config.node_id, [sys.executable, "-m", "tests.dledger.member_node", str(config.path),
                                          str(root / f"{config.node_id}.acks")],
                         log_path=root / f"{config.node_id}.log", environment=environment)
        self.node_id = config.node_id
        self.config = config.path
        self.ack_log = root / f"{config.node_id}.acks"
        self.data_dir = config.data_dir

    def request(self, command: str, timeout_seconds: float | None = None) -> dict[str, Any]:
        """The answer to ``command`` (ConnectionError once the member exited); without ``timeout_seconds``,
        however long the member takes: a status under load may take long, and a reply given up on would be
        read as the answer to the next request."""
        return self.ask(command, timeout_seconds)


@dataclass
class Group:
    root: Path
    size: int = 3
    #: [store] settings; small files unless a test sizes them (the defaults preallocate 1 GiB per member)
    store: dict[str, Any] = field(default_factory=lambda: dict(SMALL_STORE))
    group_commit: dict[str, Any] = field(default_factory=dict)
    raft: dict[str, Any] = field(default_factory=dict)
    #: extra environment for the member processes (the load's RAFTMQ_TEST_* knobs)
    env: dict[str, str] = field(default_factory=dict)
    preferred_leader: str | None = None
    nodes: list[Node] = field(default_factory=list)

    def configure(self) -> None:
        sections = {"raft": self.raft, "group_commit": self.group_commit, "store": self.store}
        environment = member_environment(self.env)
        for config in member_configs(self.root, self.size, secret=SECRET, sections=sections,
                                     preferred_leader=self.preferred_leader):
            config.data_dir.mkdir(parents=True, exist_ok=True)
            self.nodes.append(Node(config, self.root, environment))

    def running(self) -> list[Node]:
        return [n for n in self.nodes if n.alive and not n.paused]

    def statuses(self) -> dict[str, dict[str, Any]]:
        result = {}
        for node in self.running():
            try:
                result[node.node_id] = node.request("status")
            except (ConnectionError, OSError, ValueError):
                continue
        return result

    def leader(self, among: list[Node] | None = None) -> Node | None:
        candidates = among if among is not None else self.running()
        for node in candidates:
            try:
                if node.request("status")["role"] == "leader":
                    return node
            except (ConnectionError, OSError, ValueError):
                continue
        return None

    def wait_leader(self, timeout_seconds: float = 30.0, among: list[Node] | None = None) -> Node:
        node: Node = wait_for(lambda: self.leader(among), "a leader", timeout_seconds=timeout_seconds)
        return node

    def wait_converged(self, timeout_seconds: float = 120.0) -> dict[str, dict[str, Any]]:
        def converged() -> dict[str, dict[str, Any]] | None:
            statuses = self.statuses()
            if len(statuses) != len([n for n in self.nodes if n.alive]):
                return None
            applied = {s["raft_applied"] for s in statuses.values()}
            ends = {s["end"] for s in statuses.values()}
            commits = {s["commit_index"] for s in statuses.values()}
            drained = all(s["in_flight"] == 0 for s in statuses.values())
            if drained and len(applied) == 1 and len(ends) == 1 and max(commits) <= min(applied):
                return statuses
            return None

        result: dict[str, dict[str, Any]] = wait_for(converged, "the members to converge",
                                                     timeout_seconds=timeout_seconds)
        return result

    def load(self, on: bool) -> None:
        for node in self.running():
            node.request("load on" if on else "load off")

    def acked(self) -> list[tuple[str, int, int, int, int]]:
        rows = []
        for node in self.nodes:
            if node.ack_log.exists():
                for line in node.ack_log.read_text().splitlines():
                    parts = line.split()
                    if len(parts) == 5:  # a line cut by SIGKILL is incomplete: never counted as acked
                        rows.append((parts[0], int(parts[1]), int(parts[2]), int(parts[3]), int(parts[4])))
        return rows

    def stop_all(self) -> None:
        for node in self.nodes:
            if node.alive:
                if node.paused:
                    node.resume()
                with suppress(ConnectionError, OSError, ValueError):
                    node.request("stop")
                try:
                    node.process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    node.process.kill()
                    node.process.wait()


@contextmanager
def running_group(root: Path, **settings: Any) -> Iterator[Group]:
    """A started group (see :class:`Group` for ``settings``); every member process is killed on leaving."""
    group = Group(root, **settings)
    group.configure()
    with running_processes(group.nodes):
        yield group
