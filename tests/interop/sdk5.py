"""The stock RocketMQ 5.x Python SDK in a venv of its own, and runs of :mod:`tests.interop.sdk5_driver` in it.

The SDK never runs in the test process: its generated ``apache.rocketmq.v2`` modules register the same
protobuf descriptors as ours (``broker.v2.protocol``), and its package ``rocketmq`` is also the C++
binding's name. ``make test`` creates the venv (``python -m tests.interop.sdk5``) before pytest runs; a
test run without it creates it itself. Either way it is made from ``sdk5-requirements.txt`` (every package
pinned) and remade when that file changes. Concurrent runs wait for each other on a lock file.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

REPOSITORY: Final = Path(__file__).resolve().parents[2]
REQUIREMENTS: Final = Path(__file__).with_name("sdk5-requirements.txt")
DRIVER: Final = Path(__file__).with_name("sdk5_driver.py")
#: inside the main venv's directory: ignored by git and removed by `make clean` with it
VENV: Final = REPOSITORY / ".venv" / "rocketmq5"
STAMP: Final = VENV / "requirements.sha256"
INSTALL_TIMEOUT_SECONDS: Final = 600.0
#: one driver run: start, route, some sends and transactions on two shared cores
DRIVER_TIMEOUT_SECONDS: Final = 120.0


def python() -> Path:
    return VENV / "bin" / "python"


def _wanted() -> str:
    return hashlib.sha256(REQUIREMENTS.read_bytes()).hexdigest()


def ensure() -> Path:
    """The SDK venv's python, installing the venv first when it is missing or out of date."""
    VENV.parent.mkdir(parents=True, exist_ok=True)
    with (VENV.parent / "rocketmq5.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        wanted = _wanted()
        if STAMP.exists() and STAMP.read_text().strip() == wanted and python().exists():
            return python()
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(VENV)], check=True,
                       timeout=INSTALL_TIMEOUT_SECONDS)
        subprocess.run([str(python()), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                        "--no-deps", "-r", str(REQUIREMENTS)], check=True, timeout=INSTALL_TIMEOUT_SECONDS)
        subprocess.run([str(python()), "-c", "import rocketmq.v5"], check=True, timeout=60)
        STAMP.write_text(wanted + "\n")
        return python()


@dataclass(frozen=True)
class DriverRun:
    """One finished driver run: a result per message (in order), and what it wrote to stderr."""

    results: list[dict[str, Any]]
    returncode: int
    stderr: str

    def describe(self) -> str:
        return f"exit {self.returncode}; results {self.results}; stderr tail:\n{self.stderr[-3000:]}"


def produce(endpoints: str, topic: str, messages: list[dict[str, Any]], *, access_key: str = "",
            secret_key: str = "", home: Path | None = None, check_answers: dict[str, str] | None = None,
            await_checks: int = 0, await_checks_seconds: float = 0.0) -> DriverRun:
    """Send ``messages`` (see :mod:`tests.interop.sdk5_driver`) with one stock SDK producer; with
    ``await_checks``, it stays up until that many check-backs were answered (``check_answers``)."""
    sdk_python = ensure()
    spec = {"endpoints": endpoints, "topic": topic, "messages": messages, "access_key": access_key,
            "secret_key": secret_key, "check_answers": check_answers or {}, "await_checks": await_checks,
            "await_checks_seconds": await_checks_seconds}
    with tempfile.TemporaryDirectory(prefix="sdk5-") as scratch:
        spec_path = Path(scratch) / "spec.json"
        spec_path.write_text(json.dumps(spec))
        # the SDK logs to $HOME/logs/rocketmq_python/: keep it out of the real home
        environment = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")}
        environment["HOME"] = str(home or scratch)
        completed = subprocess.run([str(sdk_python), str(DRIVER), "produce", str(spec_path)], capture_output=True,
                                   text=True, env=environment, cwd=scratch,
                                   timeout=DRIVER_TIMEOUT_SECONDS + await_checks_seconds)
    results = [json.loads(line) for line in completed.stdout.splitlines() if line.startswith("{")]
    return DriverRun(results, completed.returncode, completed.stderr)


def consume(endpoints: str, topic: str, group: str, *, deliveries: int, seconds: float, invisible_seconds: int,
            await_seconds: int = 5, tag: str = "*", no_ack_first: list[str] | None = None,
            change_invisible_first: dict[str, int] | None = None, never_ack: list[str] | None = None,
            access_key: str = "", secret_key: str = "") -> DriverRun:
    """Receive with one stock SDK SimpleConsumer (see :mod:`tests.interop.sdk5_driver`): a result per delivery."""
    spec = {"endpoints": endpoints, "topic": topic, "group": group, "deliveries": deliveries, "seconds": seconds,
            "invisible_seconds": invisible_seconds, "await_seconds": await_seconds, "tag": tag,
            "no_ack_first": no_ack_first or [], "change_invisible_first": change_invisible_first or {},
            "never_ack": never_ack or [], "access_key": access_key, "secret_key": secret_key}
    return _run("consume", spec, seconds + DRIVER_TIMEOUT_SECONDS)


def push(endpoints: str, topic: str, group: str, *, deliveries: int, seconds: float, tag: str = "*",
         fail_first: list[str] | None = None) -> DriverRun:
    """Consume with one stock SDK PushConsumer (see :mod:`tests.interop.sdk5_driver`): a result per delivery."""
    spec = {"endpoints": endpoints, "topic": topic, "group": group, "deliveries": deliveries, "seconds": seconds,
            "tag": tag, "fail_first": fail_first or []}
    return _run("push", spec, seconds + DRIVER_TIMEOUT_SECONDS)


def _run(command: str, spec: dict[str, Any], timeout_seconds: float, home: Path | None = None) -> DriverRun:
    sdk_python = ensure()
    with tempfile.TemporaryDirectory(prefix="sdk5-") as scratch:
        spec_path = Path(scratch) / "spec.json"
        spec_path.write_text(json.dumps(spec))
        environment = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")}
        environment["HOME"] = str(home or scratch)
        completed = subprocess.run([str(sdk_python), str(DRIVER), command, str(spec_path)], capture_output=True,
                                   text=True, env=environment, cwd=scratch, timeout=timeout_seconds)
    results = [json.loads(line) for line in completed.stdout.splitlines() if line.startswith("{")]
    return DriverRun(results, completed.returncode, completed.stderr)


if __name__ == "__main__":
    print(ensure())
