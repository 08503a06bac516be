"""Start, drive and always clean up groups of ``raft_member`` processes on 127.0.0.1."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from cli.cluster import free_ports
from dledger.addresses import format_host_port
from tests.support.waiting import wait_for

REPOSITORY_ROOT = Path(__file__).resolve().parents[2]
#: how long a member may take to start (import pysyncobj, bind)
START_TIMEOUT_SECONDS = 20.0
POLL_INTERVAL_SECONDS = 0.05


def _pump_lines(stream: IO[str], lines: queue.Queue[str]) -> None:
    for line in stream:
        lines.put(line)


@dataclass
class MemberProcess:
    address: str
    process: subprocess.Popen[str]
    log_path: Path
    lines: queue.Queue[str] = field(default_factory=queue.Queue)

    @property
    def port(self) -> int:
        return int(self.address.rsplit(":", 1)[1])

    def read_line(self, timeout_seconds: float) -> dict[str, Any]:
        try:
            line = self.lines.get(timeout=timeout_seconds)
        except queue.Empty:
            raise TimeoutError(f"{self.address} did not answer in {timeout_seconds} s; see {self.log_path}") from None
        result: dict[str, Any] = json.loads(line)
        return result

    def request(self, operation: str, timeout_seconds: float = 10.0, **fields: Any) -> dict[str, Any]:
        stdin = self.process.stdin
        if stdin is None:
            raise RuntimeError("member has no stdin")
        stdin.write(json.dumps({"op": operation, **fields}) + "\n")
        stdin.flush()
        return self.read_line(timeout_seconds)

    def status(self) -> dict[str, Any]:
        return self.request("status")

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")


@dataclass
class MemberGroup:
    members: list[MemberProcess]

    def wait_for_leader(self, timeout_seconds: float = 15.0) -> MemberProcess:
        def agreed_leader() -> MemberProcess | None:
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
    members: list[MemberProcess] = []
    log_files = []
    environment = {**os.environ, "PYTHONPATH": str(REPOSITORY_ROOT)}
    try:
        for address in addresses:
            log_path = log_directory / f"member-{address.rsplit(':', 1)[1]}.log"
            log_file = open(log_path, "w")  # noqa: SIM115 - closed in the finally below
            log_files.append(log_file)
            command = [
                sys.executable,
                "-m",
                "tests.dledger.raft_member",
                "--self",
                address,
                "--secret-hex",
                secret.hex(),
                "--entry-size-max",
                str(entry_size_max_bytes),
                "--handshake-timeout",
                str(handshake_timeout_seconds),
            ]
            if output_buffer_max_bytes is not None:
                command += ["--output-buffer-max", str(output_buffer_max_bytes)]
            for partner in addresses:
                if partner != address:
                    command += ["--partner", partner]
            process = subprocess.Popen(
                command,
                cwd=REPOSITORY_ROOT,
                env=environment,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log_file,
                text=True,
                bufsize=1,
            )
            member = MemberProcess(address=address, process=process, log_path=log_path)
            stdout = process.stdout
            if stdout is None:
                raise RuntimeError("member has no stdout")
            threading.Thread(target=_pump_lines, args=(stdout, member.lines), daemon=True).start()
            members.append(member)
        for member in members:
            started = member.read_line(START_TIMEOUT_SECONDS)
            if started.get("started") != member.address:
                raise RuntimeError(f"unexpected first line from {member.address}: {started}")
        yield MemberGroup(members)
    finally:
        for member in members:
            if member.process.poll() is None:
                member.process.kill()
        for member in members:
            with contextlib.suppress(subprocess.TimeoutExpired):
                member.process.wait(timeout=10)
            for stream in (member.process.stdin, member.process.stdout):
                if stream is not None:
                    with contextlib.suppress(OSError):
                        stream.close()
        for log_file in log_files:
            log_file.close()
