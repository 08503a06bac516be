"""The stock RocketMQ 5.x Node.js SDK (npm ``rocketmq-client-nodejs``), and runs of its driver.

``tests/interop/sdk5_node/`` holds the driver (``driver.js``) and the SDK's pins (``package.json``, and
``package-lock.json`` with every package's version and integrity hash). ``make test`` installs it first
(``python -m tests.interop.sdk5_nodejs``: ``npm ci`` into ``tests/interop/sdk5_node/node_modules/``, ignored
by git); a test run without it installs it itself. Either way the install happens only when
``node_modules`` is missing or the lock file changed since (a stamp in ``node_modules`` holds the lock file's
hash), so an installed machine needs no network. Concurrent runs wait for each other on a lock file.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Final

from tests.interop.sdk5 import DriverRun

DIRECTORY: Final = Path(__file__).with_name("sdk5_node")
DRIVER: Final = DIRECTORY / "driver.js"
LOCK_FILE: Final = DIRECTORY / "package-lock.json"
MODULES: Final = DIRECTORY / "node_modules"
STAMP: Final = MODULES / ".raftmq-package-lock.sha256"
#: the SDK's package.json asks for this Node.js or newer
NODE_VERSION_MIN: Final = (16, 19)
INSTALL_TIMEOUT_SECONDS: Final = 600.0
#: one driver run beyond what its spec waits for: start (route, settings), sends, shutdown on shared cores
DRIVER_TIMEOUT_SECONDS: Final = 60.0


class NodeMissing(RuntimeError):
    """Node.js or npm is not installed (or too old): the message says what to install."""


def _command(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        raise NodeMissing(f"`{name}` not found: the Node.js 5.x SDK tests need Node.js >= "
                          f"{'.'.join(map(str, NODE_VERSION_MIN))} and npm (Debian: apt-get install nodejs npm; "
                          "`make system-packages` does it as root)")
    return found


def node() -> str:
    """The ``node`` executable, checked against :data:`NODE_VERSION_MIN`."""
    executable = _command("node")
    version = subprocess.run([executable, "--version"], capture_output=True, text=True, timeout=30).stdout.strip()
    match = re.fullmatch(r"v(\d+)\.(\d+)\..*", version)
    if match is None or (int(match[1]), int(match[2])) < NODE_VERSION_MIN:
        raise NodeMissing(f"{executable} is Node.js {version or '(no version)'}: the 5.x SDK needs "
                          f">= {'.'.join(map(str, NODE_VERSION_MIN))}")
    return executable


def _wanted() -> str:
    return hashlib.sha256(LOCK_FILE.read_bytes()).hexdigest()


def ensure() -> str:
    """The ``node`` executable, once the SDK is installed as the lock file pins it (``npm ci`` when
    ``node_modules`` is missing or was installed from another lock file)."""
    executable = node()
    with (DIRECTORY / ".install.lock").open("w") as lock:  # ignored by git with node_modules/
        fcntl.flock(lock, fcntl.LOCK_EX)
        wanted = _wanted()
        if STAMP.exists() and STAMP.read_text().strip() == wanted:
            return executable
        npm = _command("npm")
        # --ignore-scripts: nothing it installs needs one (crc32's native build comes prebuilt, as an
        # optional dependency per platform); npm ci removes node_modules first, the stamp with it
        completed = subprocess.run([npm, "ci", "--ignore-scripts", "--no-audit", "--no-fund", "--loglevel=error"],
                                   cwd=DIRECTORY, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_SECONDS)
        if completed.returncode != 0:
            raise RuntimeError(f"npm ci in {DIRECTORY} failed (exit {completed.returncode}):\n"
                               f"{completed.stdout[-2000:]}{completed.stderr[-3000:]}")
        subprocess.run([executable, "-e", "require('rocketmq-client-nodejs')"], cwd=DIRECTORY, check=True, timeout=60)
        STAMP.write_text(wanted + "\n")
        return executable


def produce(endpoints: str, topic: str, messages: list[dict[str, Any]], *,
            check_answers: dict[str, str] | None = None, await_checks: int = 0,
            await_checks_seconds: float = 0.0) -> DriverRun:
    """Send ``messages`` with one SDK producer (see ``driver.js``); with ``await_checks``, it stays up until
    that many check-backs were answered and their EndTransaction returned."""
    spec = {"endpoints": endpoints, "topic": topic, "messages": messages, "check_answers": check_answers or {},
            "await_checks": await_checks, "await_checks_seconds": await_checks_seconds}
    return run("produce", spec, await_checks_seconds)


def consume(endpoints: str, topic: str, group: str, *, deliveries: int, seconds: float, invisible_ms: int,
            await_ms: int = 2000, tag: str = "*", no_ack_first: list[str] | None = None,
            change_invisible_first: dict[str, int] | None = None, ack_after_change: list[str] | None = None,
            never_ack: list[str] | None = None) -> DriverRun:
    """Receive with one SDK SimpleConsumer (see ``driver.js``): a result per delivery."""
    spec = {"endpoints": endpoints, "topic": topic, "group": group, "tag": tag, "deliveries": deliveries,
            "seconds": seconds, "invisible_ms": invisible_ms, "await_ms": await_ms,
            "no_ack_first": no_ack_first or [], "change_invisible_first": change_invisible_first or {},
            "ack_after_change": ack_after_change or [], "never_ack": never_ack or []}
    return run("consume", spec, seconds)


def push(endpoints: str, topic: str, group: str, *, deliveries: int, seconds: float, tag: str = "*",
         linger_seconds: float = 1.0) -> DriverRun:
    """Consume with one SDK PushConsumer (see ``driver.js``): a result per delivery."""
    spec = {"endpoints": endpoints, "topic": topic, "group": group, "tag": tag, "deliveries": deliveries,
            "seconds": seconds, "linger_seconds": linger_seconds}
    return run("push", spec, seconds + linger_seconds)


def run(command: str, spec: dict[str, Any], waits_seconds: float) -> DriverRun:
    """``node driver.js COMMAND SPEC`` to its end: it gives itself ``waits_seconds`` (what the spec waits
    for) plus :data:`DRIVER_TIMEOUT_SECONDS`, and is killed a little after that if it is still there."""
    executable = ensure()
    deadline_seconds = waits_seconds + DRIVER_TIMEOUT_SECONDS
    with tempfile.TemporaryDirectory(prefix="sdk5-node-") as scratch:
        spec_path = Path(scratch) / "spec.json"
        spec_path.write_text(json.dumps({**spec, "deadline_seconds": deadline_seconds}))
        # the SDK's consume services log to $HOME/logs/rocketmq/: keep it out of the real home
        environment = dict(os.environ, HOME=scratch)
        completed = subprocess.run([executable, str(DRIVER), command, str(spec_path)], capture_output=True,
                                   text=True, env=environment, cwd=DIRECTORY, timeout=deadline_seconds + 15.0)
    results = [json.loads(line) for line in completed.stdout.splitlines() if line.startswith("{")]
    return DriverRun(results, completed.returncode, completed.stderr)


if __name__ == "__main__":
    print(ensure())
