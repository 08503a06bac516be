"""A group across hosts: three members, each in a network namespace of its own (its own interfaces, ports
and /etc/hosts), a fourth namespace for the name server and the clients, all on one bridge. Every address
in the node files is a host name that only the namespaces' hosts files resolve (one member's name and the
name server's are IPv6-only; the members name the name server by its bracketed IPv6 literal). A send is
acknowledged, the leader is killed, the group goes on acknowledging, and everything acknowledged is read
back. The killed member then comes back under another address with its name moved there: the others reach
it by resolving its name again on reconnecting, and it catches up.

Needs root (CAP_NET_ADMIN, `ip netns`); skipped, saying why, where namespaces cannot be made. Everything it
makes (namespaces, links, /etc/netns/<name>/, processes) is removed at the end, whatever happens.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import pytest

from cli.cluster import NodeInfo, node_toml
from commitlog.hosts import decode_message_id, format_address
from tests.support.stores import small_store
from tests.support.waiting import wait_for

REPO: Final = Path(__file__).resolve().parents[2]
NETNS_CONFIG_DIR: Final = Path("/etc/netns")  # `ip netns exec NAME` mounts /etc/netns/NAME/hosts on /etc/hosts
MEMBERS: Final = 3
DOMAIN: Final = "raftmq.test"
BROKER_PORT, RAFT_PORT, CATCHUP_PORT, NAMESRV_PORT = 10911, 20010, 20011, 9876
STEP_TIMEOUT_SECONDS: Final = 60.0
#: each poll runs `raftmq cluster status`, a process of its own
STEP_POLL_SECONDS: Final = 0.5


def _ip(*arguments: str, namespace: str | None = None) -> None:
    command = ["ip", *(["-n", namespace] if namespace else []), *arguments]
    result = subprocess.run(command, capture_output=True, text=True, timeout=30)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)}: {result.stderr.strip()}")


@dataclass
class Hosts:
    """The namespaces, their addresses and names, and the processes started in them."""

    tag: str
    subnet: tuple[int, int]
    namespaces: list[str] = field(default_factory=list)
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    #: member index -> the host number it has moved to (its name then resolves there)
    moved: dict[int, int] = field(default_factory=dict)

    @property
    def bridge(self) -> str:
        return f"{self.tag}br"

    def ipv4(self, index: int) -> str:
        return f"10.{self.subnet[0]}.{self.subnet[1]}.{index + 1}"

    def ipv6(self, index: int) -> str:
        return f"fd00:{self.subnet[0]}:{self.subnet[1]}::{index + 1}"

    def member_address(self, index: int) -> str:
        host = self.moved.get(index, index)
        return self.ipv6(host) if index == 1 else self.ipv4(host)

    def move(self, index: int, host: int) -> None:
        """Give member ``index`` another address and point its name there in every namespace's hosts file
        (rewritten in place: `ip netns exec` bind-mounted these very files over the processes' /etc/hosts)."""
        old_address, inside = self.member_address(index), f"{self.tag}n{index}"
        self.moved[index] = host
        family, prefix = ("-6", 64) if index == 1 else ("-4", 24)
        # the old one goes first: deleting a subnet's primary IPv4 address deletes its secondaries too
        _ip(family, "addr", "del", f"{old_address}/{prefix}", "dev", inside, namespace=self.namespaces[index])
        _ip(family, "addr", "add", f"{self.member_address(index)}/{prefix}", "dev", inside,
            *(["nodad"] if index == 1 else []), namespace=self.namespaces[index])
        for namespace in self.namespaces:
            (NETNS_CONFIG_DIR / namespace / "hosts").write_text(self.hosts_file())

    def hosts_file(self) -> str:
        lines = ["127.0.0.1 localhost", "::1 localhost"]
        for index in range(MEMBERS):  # member-1 has an IPv6 address only: its peers and clients reach it over IPv6
            lines.append(f"{self.member_address(index)} member-{index}.{DOMAIN}")
        lines.append(f"{self.ipv6(MEMBERS)} namesrv.{DOMAIN}")  # it listens on IPv6 only ("::")
        return "\n".join(lines) + "\n"

    def create(self) -> None:
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("link", "set", self.bridge, "up")
        for index in range(MEMBERS + 1):
            namespace = f"{self.tag}-{index}"
            _ip("netns", "add", namespace)
            self.namespaces.append(namespace)
            (NETNS_CONFIG_DIR / namespace).mkdir(parents=True, exist_ok=True)
            (NETNS_CONFIG_DIR / namespace / "hosts").write_text(self.hosts_file())
            outside, inside = f"{self.tag}h{index}", f"{self.tag}n{index}"
            _ip("link", "add", outside, "type", "veth", "peer", "name", inside)
            _ip("link", "set", inside, "netns", namespace)
            _ip("link", "set", outside, "master", self.bridge)
            _ip("link", "set", outside, "up")
            _ip("link", "set", "lo", "up", namespace=namespace)
            _ip("addr", "add", f"{self.ipv4(index)}/24", "dev", inside, namespace=namespace)
            _ip("-6", "addr", "add", f"{self.ipv6(index)}/64", "dev", inside, "nodad", namespace=namespace)
            _ip("link", "set", inside, "up", namespace=namespace)

    def start(self, index: int, arguments: list[str], log: Path, cwd: Path) -> subprocess.Popen[bytes]:
        with open(log, "ab") as output:
            process = subprocess.Popen(["ip", "netns", "exec", self.namespaces[index], *arguments], stdout=output,
                                       stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=cwd,
                                       env={**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"})
        self.processes.append(process)
        return process

    def run(self, index: int, arguments: list[str], timeout_seconds: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["ip", "netns", "exec", self.namespaces[index], *arguments], capture_output=True,
                              text=True, cwd=REPO, timeout=timeout_seconds, env={**os.environ, "PYTHONPATH": str(REPO)})

    def remove(self) -> None:
        for process in self.processes:  # ours only, by their own handles
            if process.poll() is None:
                process.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=10)
        for namespace in self.namespaces:
            with contextlib.suppress(RuntimeError):
                _ip("netns", "del", namespace)  # its veth ends go with it, and their peers on the bridge
            shutil.rmtree(NETNS_CONFIG_DIR / namespace, ignore_errors=True)
        with contextlib.suppress(RuntimeError):
            _ip("link", "del", self.bridge)
        with contextlib.suppress(OSError):
            NETNS_CONFIG_DIR.rmdir()  # only when empty: others' namespaces may have files there


def _unavailable() -> str | None:
    if sys.platform != "linux":
        return "network namespaces are Linux only"
    if shutil.which("ip") is None:
        return "no `ip` command (iproute2)"
    if os.geteuid() != 0:
        return "making network namespaces needs root (CAP_NET_ADMIN)"
    return None


@pytest.fixture
def hosts() -> Iterator[Hosts]:
    reason = _unavailable()
    if reason is not None:
        pytest.skip(reason)
    rng = random.Random()  # which names and subnet: never part of a result
    made = Hosts(f"rq{rng.randrange(16 ** 4):04x}", (rng.randrange(200, 250), rng.randrange(256)))
    try:
        try:
            made.create()
        except (RuntimeError, OSError) as exc:
            pytest.skip(f"cannot make network namespaces here: {exc}")
        yield made
    finally:
        made.remove()


def _logs(directory: Path, *extra: str) -> str:
    return "\n".join([*extra, *(f"--- {path.name}\n" + "\n".join(path.read_text(errors="replace").splitlines()[-15:])
                     for path in sorted(directory.glob("*.log")))])


@pytest.mark.slow
def test_a_group_across_namespaces_addressed_by_name_survives_its_leader(hosts: Hosts, tmp_path: Path) -> None:
    client = MEMBERS  # the last namespace: name server and clients
    namesrv_name = f"namesrv.{DOMAIN}:{NAMESRV_PORT}"
    secret = tmp_path / "group.secret"
    secret.write_text(os.urandom(24).hex() + "\n")
    nodes = []
    for index in range(MEMBERS):
        host = f"member-{index}.{DOMAIN}"
        (tmp_path / f"m{index}").mkdir()
        nodes.append(NodeInfo(f"m{index}", f"{host}:{BROKER_PORT}", f"{host}:{RAFT_PORT}", f"{host}:{CATCHUP_PORT}",
                              str(tmp_path / f"m{index}" / "node.toml"), str(tmp_path / f"member-{index}.log")))
    # the members name the name server by its IPv6 literal, bracketed; clients by its name
    namesrv_literal = f"[{hosts.ipv6(client)}]:{NAMESRV_PORT}"
    store_host = f"[{hosts.ipv6(MEMBERS + 10)}]:{BROKER_PORT}"  # the group's stable address, IPv6 in records
    for index, node in enumerate(nodes):
        Path(node.config).write_text(node_toml(node, [peer for peer in nodes if peer is not node], namesrv_literal,
                                               index + 1, store_host, str(secret), small_store()))
        # each member's file checks out where it is to run: its names resolve in its namespace
        checked = hosts.run(index, [sys.executable, "-m", "cli.main", "broker", "--config", node.config, "--check"])
        assert checked.returncode == 0, checked.stdout + checked.stderr
        assert f"-> {hosts.ipv6(1)}" in checked.stdout  # member-1's name is IPv6-only
    outside = subprocess.run([sys.executable, "-m", "cli.main", "broker", "--config", nodes[0].config, "--check"],
                             capture_output=True, text=True, cwd=REPO, timeout=60)
    assert outside.returncode == 2 and "cannot resolve 'member-0.raftmq.test'" in outside.stderr  # not out here

    hosts.start(client, [sys.executable, "-m", "broker.namesrv", "--host", "::", "--port", str(NAMESRV_PORT)],
                tmp_path / "namesrv.log", tmp_path)
    members = {node.id: hosts.start(index, [sys.executable, "-m", "broker.node", "--config", node.config],
                                    Path(node.log), Path(node.config).parent)
               for index, node in enumerate(nodes)}

    def raftmq(*arguments: str) -> subprocess.CompletedProcess[str]:
        return hosts.run(client, [sys.executable, "-m", "cli.main", *arguments])

    last_status: list[str] = []

    def status() -> list[dict[str, object]]:
        result = raftmq("cluster", "status", "--namesrv", namesrv_name, "--json", "--timeout", "1")
        last_status[:] = [f"--- the last status (exit {result.returncode})", result.stdout, result.stderr]
        return [json.loads(line) for line in result.stdout.splitlines()] if result.returncode == 0 else []

    def leader(excluded: str = "") -> str | None:
        rows = status()
        leaders = [str(row["node"]) for row in rows if row["role"] == "leader" and row["node"] != excluded]
        return leaders[0] if len(leaders) == 1 and len(rows) >= MEMBERS - (1 if excluded else 0) else None

    def logs() -> str:
        return _logs(tmp_path, *last_status)

    first_leader = wait_for(leader, "a leader among three members reported by name",
                            timeout_seconds=STEP_TIMEOUT_SECONDS,
                            interval_seconds=STEP_POLL_SECONDS, explain=logs)
    assert isinstance(first_leader, str)
    rows = status()
    assert sorted(str(row["address"]) for row in rows) == sorted(node.broker_address for node in nodes)
    assert all(row["reachable"] for row in rows)

    created = raftmq("topic", "create", "Hosts", "--queues", "2", "--namesrv", namesrv_name)
    assert created.returncode == 0, created.stdout + created.stderr + _logs(tmp_path)
    before = raftmq("send", "Hosts", "before the kill", "--json", "--namesrv", namesrv_name)
    assert before.returncode == 0, before.stdout + before.stderr + _logs(tmp_path)
    assert json.loads(before.stdout)["status"] == "SEND_OK"

    members[first_leader].send_signal(signal.SIGKILL)
    members[first_leader].wait(timeout=10)
    second_leader = wait_for(lambda: leader(excluded=first_leader), "a new leader after the kill",
                             timeout_seconds=STEP_TIMEOUT_SECONDS, interval_seconds=STEP_POLL_SECONDS,
                             explain=logs)
    assert second_leader != first_leader
    after = raftmq("send", "Hosts", "after the kill", "--json", "--namesrv", namesrv_name)
    assert after.returncode == 0, after.stdout + after.stderr + _logs(tmp_path)
    assert json.loads(after.stdout)["status"] == "SEND_OK"

    consumed = raftmq("consume", "Hosts", "--group", "hosts", "--from", "first", "--count", "2", "--namesrv",
                      namesrv_name)
    assert consumed.returncode == 0, consumed.stdout + consumed.stderr
    assert sorted(json.loads(line)["body"] for line in consumed.stdout.splitlines()) == ["after the kill",
                                                                                         "before the kill"]
    # the store host in the records and message ids is the group's IPv6 address (RocketMQ's 56-character id)
    for line in consumed.stdout.splitlines():
        stored_host, _ = decode_message_id(json.loads(line)["offsetMsgId"])
        assert format_address(stored_host) == store_host
    # the killed member is gone from the report (it unregistered by losing its connection) or unreachable
    assert all(row["node"] != first_leader or not row["reachable"] for row in status())

    # it comes back under another address, its name moved there: the others find it by resolving the name
    # again when they reconnect, and it catches up
    killed = int(first_leader[1:])
    hosts.move(killed, MEMBERS + 20)
    members[first_leader] = hosts.start(killed, [sys.executable, "-m", "broker.node", "--config", nodes[killed].config],
                                        Path(nodes[killed].log), Path(nodes[killed].config).parent)

    def caught_up() -> bool:
        rows = status()
        back = [row for row in rows if row["node"] == first_leader and row["reachable"]]
        applied = {row["applied_index"] for row in rows}
        return len(rows) == MEMBERS and len(back) == 1 and len(applied) == 1 and back[0]["role"] == "follower"

    wait_for(caught_up, f"{first_leader} back at {hosts.member_address(killed)}, caught up",
             timeout_seconds=STEP_TIMEOUT_SECONDS, interval_seconds=STEP_POLL_SECONDS, explain=logs)
    log = Path(nodes[killed].log).read_text(errors="replace")
    assert f"listening on {hosts.member_address(killed)}" in log.replace("[", "").replace("]", "")
