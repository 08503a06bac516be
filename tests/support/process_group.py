"""Groups of member processes on loopback that tests and benchmarks start, drive and always clean up.

A member process takes one request per line on its stdin and answers each with one line (JSON, for most)
on its stdout; its stderr goes to a log file of its own, or where this process's goes.
:func:`running_processes` starts the members and, however the block ends, kills every one still running
(resuming a paused one first) and reaps it, so no member outlives its test. Ports are picked free when
the group is configured (:func:`member_configs`), never fixed, so groups of parallel runs do not collide.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from cli.cluster import free_ports

__all__ = ["REPOSITORY_ROOT", "MemberConfig", "MemberProcess", "member_configs", "member_environment",
           "running_processes"]

REPOSITORY_ROOT = Path(__file__).resolve().parents[2]
#: how long a killed member may take to exit before a restart or a signal gives up on it
KILL_WAIT_SECONDS = 30.0


def member_environment(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment with ``extra`` over it, and the repository first on PYTHONPATH ahead of
    what was there (``make test-at`` puts tests/clock there for every process of the run)."""
    python_path = os.pathsep.join(filter(None, (str(REPOSITORY_ROOT), os.environ.get("PYTHONPATH"))))
    return {**os.environ, **(extra or {}), "PYTHONPATH": python_path}


def _pump_lines(stream: IO[str], lines: queue.Queue[str | None]) -> None:
    # None marks the end of the member's output: a reader waiting for an answer learns that it exited
    with contextlib.suppress(ValueError, OSError):  # the stream closed under us at cleanup
        for line in stream:
            lines.put(line)
    lines.put(None)


class MemberProcess:
    """One member process, started (and restarted) from the same command line."""

    def __init__(self, name: str, command: Sequence[str], *, log_path: Path | None = None,
                 environment: Mapping[str, str] | None = None) -> None:
        self.name = name
        self.command = list(command)
        #: the member's stderr, appended to across restarts (``os.devnull``: discarded); None: this process's
        self.log_path = log_path
        self.environment = dict(environment) if environment is not None else member_environment()
        self.paused = False  # SIGSTOP'ed
        self._process: subprocess.Popen[str] | None = None
        self._lines: queue.Queue[str | None] = queue.Queue()

    @property
    def process(self) -> subprocess.Popen[str]:
        if self._process is None:
            raise RuntimeError(f"{self.name} was never started")
        return self._process

    @property
    def alive(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self) -> None:
        """Start the member (again, after it exited: a new process with a new output)."""
        self._close_streams()
        log = open(self.log_path, "a") if self.log_path is not None else None  # noqa: SIM115 - the child's
        try:
            self._process = subprocess.Popen(
                self.command, cwd=REPOSITORY_ROOT, env=self.environment, stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=log, text=True, bufsize=1)
        finally:
            if log is not None:
                log.close()  # the child holds its own descriptor
        self.paused = False
        self._lines = queue.Queue()
        stdout = self._process.stdout
        if stdout is None:
            raise RuntimeError(f"{self.name} has no stdout")
        threading.Thread(target=_pump_lines, args=(stdout, self._lines), daemon=True).start()

    def read_line(self, timeout_seconds: float | None) -> str:
        """The member's next line of output; TimeoutError after ``timeout_seconds`` (None: wait as long as
        it runs), ConnectionError once it exited."""
        try:
            line = self._lines.get(timeout=timeout_seconds)
        except queue.Empty:
            where = "" if self.log_path in (None, Path(os.devnull)) else f"; see {self.log_path}"
            raise TimeoutError(f"{self.name} did not answer in {timeout_seconds} s{where}") from None
        if line is None:
            self._lines.put(None)  # and so will every later read
            raise ConnectionError(f"{self.name} exited (code {self.process.poll()})")
        return line

    def read_answer(self, timeout_seconds: float | None) -> dict[str, Any]:
        """The member's next line as a JSON object (see :meth:`read_line`)."""
        answer: dict[str, Any] = json.loads(self.read_line(timeout_seconds))
        return answer

    def ask(self, line: str, timeout_seconds: float | None) -> dict[str, Any]:
        """Send one request line and read its answer (see :meth:`read_answer`)."""
        stdin = self.process.stdin
        if stdin is None:
            raise RuntimeError(f"{self.name} has no stdin")
        stdin.write(line + "\n")
        stdin.flush()
        return self.read_answer(timeout_seconds)

    def pause(self) -> None:
        self.process.send_signal(signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        self.process.send_signal(signal.SIGCONT)
        self.paused = False

    def kill(self, signal_number: int = signal.SIGKILL) -> None:
        """Send ``signal_number`` (to a paused member too) and wait for the member to exit."""
        if self.paused:
            self.resume()
        self.process.send_signal(signal_number)
        self.process.wait(timeout=KILL_WAIT_SECONDS)

    def clean_up(self) -> None:
        """Kill the member if it still runs, reap it and close its pipes."""
        if self._process is None:
            return
        if self._process.poll() is None:
            self._process.send_signal(signal.SIGCONT)  # resumed first, as kill() does
            self._process.kill()
        self._process.wait()
        self.paused = False
        self._close_streams()

    def log_text(self) -> str:
        return "" if self.log_path is None else self.log_path.read_text(errors="replace")

    def _close_streams(self) -> None:
        if self._process is None:
            return
        for stream in (self._process.stdin, self._process.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()


@contextlib.contextmanager
def running_processes(members: Sequence[MemberProcess]) -> Iterator[Sequence[MemberProcess]]:
    """Start ``members``; on leaving, whatever happened (a member that did not start, a failed assertion),
    kill and reap every one of them, those restarted in the block included."""
    try:
        for member in members:
            member.start()
        yield members
    finally:
        for member in members:
            member.clean_up()


@dataclass(frozen=True)
class MemberConfig:
    """One member's TOML file (``dledger.config.NodeConfig``) and what it names."""

    node_id: str
    raft_address: str
    catchup_address: str
    path: Path
    data_dir: Path


def member_configs(root: Path, size: int, *, secret: str, sections: Mapping[str, Mapping[str, Any]],
                   preferred_leader: str | None = None) -> list[MemberConfig]:
    """Write ``root/n<i>.toml`` (making ``root`` if need be) for ``size`` members on free loopback ports,
    each data directory ``root/n<i>`` and every other member its peer; ``sections`` (``raft``,
    ``group_commit``, ``store``, in that order) are written when not empty, values as JSON (which TOML
    reads alike)."""
    root.mkdir(parents=True, exist_ok=True)
    ports = free_ports(2 * size)
    addresses = [(f"n{index}", f"127.0.0.1:{ports[2 * index]}", f"127.0.0.1:{ports[2 * index + 1]}")
                 for index in range(size)]
    configs = []
    for node_id, raft_address, catchup_address in addresses:
        data_dir = root / node_id
        lines = ["[node]", f'id = "{node_id}"', f'raft_address = "{raft_address}"',
                 f'catchup_address = "{catchup_address}"', f'data_dir = "{data_dir}"', f'secret = "{secret}"']
        if preferred_leader is not None:
            lines.append(f'preferred_leader = "{preferred_leader}"')
        for other_id, other_raft, other_catchup in addresses:
            if other_id != node_id:
                lines += ["[[peers]]", f'id = "{other_id}"', f'raft_address = "{other_raft}"',
                          f'catchup_address = "{other_catchup}"']
        for section, values in sections.items():
            if values:
                lines.append(f"[{section}]")
                lines += [f"{key} = {json.dumps(value)}" for key, value in values.items()]
        path = root / f"{node_id}.toml"
        path.write_text("\n".join(lines) + "\n")
        configs.append(MemberConfig(node_id, raft_address, catchup_address, path, data_dir))
    return configs
