"""Start, drive and always clean up groups of ``tests.dledger.raft_member`` processes on loopback."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cli.cluster import free_ports
from dledger.addresses import format_host_port
from tests.support.process_group import MemberProcess, running_processes
from tests.support.waiting import wait_for

#: how long a member may take to start (import pysyncobj, bind)
START_TIMEOUT_SECONDS = 20.0


class RaftMember(MemberProcess):
    """A ``raft_member`` process: a request is a JSON object with its ``op``, answered with one."""

    def __init__(self, address: str, command: list[str], log_path: Path) -> None:
        super().__init__(address, command, log_path=log_path)
        self.address = address

    @property
    def port(self) -> int:
        return int(self.address.rsplit(":", 1)[1])

    def request(self, operation: str, timeout_seconds: float = 10.0, **fields: Any) -> dict[str, Any]:
        return self.ask(json.dumps({"op": operation, **fields}), timeout_seconds)

    def status(self) -> dict[str, Any]:
        return self.request("status")


@dataclass
class MemberGroup:
    members: list[RaftMember]

    def wait_for_leader(self, timeout_seconds: float = 15.0) -> RaftMember:
        def agreed_leader() -> RaftMember | None:
            statuses = [member.status() for member in self.members]
            leaders = {status["leader"] for status in statuses}
            if len(leaders) != 1 or None in leaders or not all(status["has_quorum"] for status in statuses):
                return None
            (leader_address,) = leaders
            for member, status in zip(self.members, statuses, strict=True):
                if member.address == leader_address and status["is_leader"]:
                    return member
            return None

        return wait_for(agreed_leader, "all members to agree on one leader", timeout_seconds=timeout_seconds)

    def wait_for_identical_state(self, entry_count: int, timeout_seconds: float = 20.0) -> list[dict[str, Any]]:
        def identical() -> list[dict[str, Any]] | None:
            statuses = [member.status() for member in self.members]
            if all(status["entry_count"] == entry_count for status in statuses):
                return statuses
            return None

        statuses = wait_for(identical, f"every member to apply {entry_count} entries",
                            timeout_seconds=timeout_seconds)
        return statuses


@contextlib.contextmanager
def running_group(
    log_directory: Path,
    *,
    secret: bytes,
    size: int = 3,
    entry_size_max_bytes: int = 256 * 1024,
    handshake_timeout_seconds: float = 1.0,
    output_buffer_max_bytes: int | None = None,
    host: str = "127.0.0.1",
) -> Iterator[MemberGroup]:
    """Start ``size`` members on free loopback ports of ``host`` (an IP literal or a name for a loopback
    address); every process is killed on exit, whatever happens."""
    addresses = [format_host_port(host, port) for port in free_ports(size)]
    members = []
    for address in addresses:
        command = [sys.executable, "-m", "tests.dledger.raft_member", "--self", address,
                   "--secret-hex", secret.hex(), "--entry-size-max", str(entry_size_max_bytes),
                   "--handshake-timeout", str(handshake_timeout_seconds)]
        if output_buffer_max_bytes is not None:
            command += ["--output-buffer-max", str(output_buffer_max_bytes)]
        for partner in addresses:
            if partner != address:
                command += ["--partner", partner]
        log_path = log_directory / f"member-{address.rsplit(':', 1)[1]}.log"
        members.append(RaftMember(address, command, log_path))
    with running_processes(members):
        for member in members:
            started = member.read_answer(START_TIMEOUT_SECONDS)
            if started.get("started") != member.address:
                raise RuntimeError(f"unexpected first line from {member.address}: {started}")
        yield MemberGroup(members)
