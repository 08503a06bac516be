"""Three (or five) real member processes on loopback for the replication tests."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cli.cluster import free_ports
from tests.support.stores import SMALL_STORE
from tests.support.waiting import wait_for

REPO = Path(__file__).resolve().parents[2]
SECRET = "replication-test-secret-0123456789"


@dataclass
class Node:
    node_id: str
    config: Path
    ack_log: Path
    data_dir: Path
    process: subprocess.Popen[str] | None = None
    stopped: bool = False  # SIGSTOP'ed

    def request(self, command: str, timeout_seconds: float = 30.0) -> dict[str, Any]:
        assert self.process is not None and self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        if not line:
            raise ConnectionError(f"{self.node_id} exited (code {self.process.poll()})")
        reply: dict[str, Any] = json.loads(line)
        return reply

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None


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
        ports = free_ports(2 * self.size)
        members = [(f"n{i}", f"127.0.0.1:{ports[2 * i]}", f"127.0.0.1:{ports[2 * i + 1]}") for i in range(self.size)]
        for node_id, raft_address, catchup_address in members:
            directory = self.root / node_id
            directory.mkdir(parents=True, exist_ok=True)
            lines = ["[node]", f'id = "{node_id}"', f'raft_address = "{raft_address}"',
                     f'catchup_address = "{catchup_address}"', f'data_dir = "{directory}"', f'secret = "{SECRET}"']
            if self.preferred_leader is not None:
                lines.append(f'preferred_leader = "{self.preferred_leader}"')
            for other_id, other_raft, other_catchup in members:
                if other_id != node_id:
                    lines += ["[[peers]]", f'id = "{other_id}"', f'raft_address = "{other_raft}"',
                              f'catchup_address = "{other_catchup}"']
            for section, values in (("raft", self.raft), ("group_commit", self.group_commit), ("store", self.store)):
                if values:
                    lines.append(f"[{section}]")
                    lines += [f"{key} = {json.dumps(value)}" for key, value in values.items()]
            config = self.root / f"{node_id}.toml"
            config.write_text("\n".join(lines) + "\n")
            self.nodes.append(Node(node_id, config, self.root / f"{node_id}.acks", directory))

    def start(self, node: Node) -> None:
        log = open(self.root / f"{node.node_id}.log", "a")  # noqa: SIM115 - handed to the child
        node.process = subprocess.Popen(
            [sys.executable, "-m", "tests.dledger.member_node", str(node.config), str(node.ack_log)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True, cwd=REPO,
            env={**os.environ, **self.env,
                 "PYTHONPATH": os.pathsep.join(filter(None, (str(REPO), os.environ.get("PYTHONPATH"))))},
        )
        log.close()
        node.stopped = False

    def kill(self, node: Node, signal_number: int = signal.SIGKILL) -> None:
        assert node.process is not None
        if node.stopped:
            node.process.send_signal(signal.SIGCONT)
        node.process.send_signal(signal_number)
        node.process.wait(timeout=30)

    def pause(self, node: Node) -> None:
        assert node.process is not None
        node.process.send_signal(signal.SIGSTOP)
        node.stopped = True

    def resume(self, node: Node) -> None:
        assert node.process is not None
        node.process.send_signal(signal.SIGCONT)
        node.stopped = False

    def running(self) -> list[Node]:
        return [n for n in self.nodes if n.alive and not n.stopped]

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
                if node.stopped:
                    self.resume(node)
                with suppress(ConnectionError, OSError, ValueError):
                    node.request("stop", timeout_seconds=60)
                assert node.process is not None
                try:
                    node.process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    node.process.kill()
                    node.process.wait()

    def cleanup(self) -> None:
        for node in self.nodes:
            if node.process is not None and node.process.poll() is None:
                node.process.send_signal(signal.SIGCONT)
                node.process.kill()
                node.process.wait()


@contextmanager
def running_group(root: Path, **settings: Any) -> Iterator[Group]:
    group = Group(root, **settings)
    group.configure()
    try:
        for node in group.nodes:
            group.start(node)
        yield group
    finally:
        group.cleanup()
