"""Three ``nats-server`` processes (Debian's) with JetStream, each with its store directory on a powerfs mount
of its own (:mod:`chaos.powerfs`), routed to each other on free loopback ports: the machines whose power the
NATS side of the power-loss comparison cuts.

Each server's directory ``nN/`` holds ``nats.conf`` and ``nats.log`` on the real disk (as a log server would
keep a log) and ``store/`` on powerfs. :meth:`NatsCluster.cut_power` cuts every server's power at once in
the order :func:`chaos.powerfs.cut_power` uses (every disk drops what was not fsynced and goes dark, then the
servers are SIGKILLed, then the disks are unmounted); :meth:`NatsCluster.boot` mounts the disks again and
starts the servers on the same ports. :meth:`NatsCluster.stop` (also on the way out of ``with``) SIGTERMs the
servers, SIGKILLs what is left and gives every mount back (:func:`chaos.powerfs.release_mounts`), whatever
happened before.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import re
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from chaos import powerfs
from cli.cluster import HOST, free_ports

BINARY: Final = "nats-server"
CLUSTER_NAME: Final = "raftmq-chaos"
STORE_DIRECTORY: Final = "store"
CONFIG_FILE: Final = "nats.conf"
LOG_FILE: Final = "nats.log"
#: the pids of the servers, for a later run to find one still running in the same directory
PIDS_FILE: Final = "nats-servers.json"
START_TIMEOUT_SECONDS: Final = 30.0
STOP_TIMEOUT_SECONDS: Final = 10.0
MONITOR_TIMEOUT_SECONDS: Final = 5.0
POLL_SECONDS: Final = 0.05


def binary_path() -> str | None:
    return shutil.which(BINARY)


def nats_unavailable() -> str | None:
    """Why the NATS side cannot run here (no nats-server, no nats-py, no FUSE mounts), or None."""
    if binary_path() is None:
        return "no nats-server on PATH (Debian: apt-get install nats-server; `make bench-packages` does it)"
    if importlib.util.find_spec("nats") is None:
        return "no nats-py (a dev dependency: pip install -e '.[dev]')"
    return powerfs.powerfs_unavailable()


def server_version(binary: str) -> str:
    """``2.9.10`` from ``nats-server: v2.9.10``; the whole answer when it has no version in it."""
    answer = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10, check=False)
    text = (answer.stdout or answer.stderr).strip()
    found = re.search(r"v?(\d+\.\d+\.\d+\S*)", text)
    return found.group(1) if found else text


def server_config(name: str, client_port: int, cluster_port: int, route_ports: Sequence[int], store_dir: Path, *,
                  monitor_port: int | None = None, sync_interval: str | None = None,
                  cluster_name: str = CLUSTER_NAME) -> str:
    """One server's configuration: JetStream with its own store (the server's default sync unless
    ``sync_interval``), clustered over loopback routes, with a monitoring port if given (``/jsz``: its own
    replica's state). bench/nats_bench.py uses it too."""
    routes = ", ".join(json.dumps(f"nats-route://{HOST}:{port}") for port in route_ports)
    jetstream = [f"store_dir: {json.dumps(str(store_dir))}"]
    if sync_interval is not None:
        jetstream.append(f"sync_interval: {sync_interval}")
    return "\n".join([
        f"server_name: {json.dumps(name)}",
        f"listen: {json.dumps(f'{HOST}:{client_port}')}",
        *([f"http: {json.dumps(f'{HOST}:{monitor_port}')}"] if monitor_port is not None else []),
        "jetstream {", *(f"  {line}" for line in jetstream), "}",
        "cluster {",
        f"  name: {json.dumps(cluster_name)}",
        f"  listen: {json.dumps(f'{HOST}:{cluster_port}')}",
        f"  routes: [{routes}]",
        "}",
    ]) + "\n"


@dataclass(frozen=True, slots=True)
class ServerPorts:
    client: int
    cluster: int
    monitor: int


@dataclass
class NatsServer:
    name: str
    directory: Path
    ports: ServerPorts
    process: subprocess.Popen[bytes] | None = None

    @property
    def client_url(self) -> str:
        return f"nats://{HOST}:{self.ports.client}"

    @property
    def log(self) -> Path:
        return self.directory / LOG_FILE

    @property
    def mount(self) -> powerfs.PowerLossMount:
        return powerfs.PowerLossMount.for_directory(self.directory / STORE_DIRECTORY, write_through=())

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None


class NatsCluster:
    """``members`` servers under ``directory`` (``n0``, ``n1``, ...). ``with NatsCluster(...) as cluster:``
    starts them (stores on powerfs) and always stops them and releases the mounts."""

    def __init__(self, binary: str, directory: Path, members: int = 3) -> None:
        self.binary = binary
        self.directory = directory
        ports = free_ports(3 * members)
        self.servers = [NatsServer(f"n{index}", directory / f"n{index}",
                                   ServerPorts(ports[index], ports[members + index], ports[2 * members + index]))
                        for index in range(members)]

    def __enter__(self) -> NatsCluster:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def client_urls(self) -> list[str]:
        return [server.client_url for server in self.servers]

    def start(self) -> None:
        """Write each server's configuration, put its store on powerfs (empty) and start them all."""
        route_ports = [server.ports.cluster for server in self.servers]
        for server in self.servers:
            server.directory.mkdir(parents=True, exist_ok=True)
            (server.directory / CONFIG_FILE).write_text(server_config(
                server.name, server.ports.client, server.ports.cluster, route_ports,
                server.directory / STORE_DIRECTORY, monitor_port=server.ports.monitor))
            powerfs.mount_directory(server.directory / STORE_DIRECTORY, write_through=())
        self._start_servers()

    def _start_servers(self) -> None:
        for server in self.servers:
            with server.log.open("ab") as log_file:
                server.process = subprocess.Popen([self.binary, "-c", str(server.directory / CONFIG_FILE)],
                                                  stdout=log_file, stderr=subprocess.STDOUT,
                                                  stdin=subprocess.DEVNULL, start_new_session=True)
        (self.directory / PIDS_FILE).write_text(json.dumps(
            {server.name: server.process.pid for server in self.servers if server.process is not None}) + "\n")
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        for server in self.servers:
            while not _accepts(server.ports.client):
                if server.process is not None and server.process.poll() is not None:
                    raise RuntimeError(f"nats-server {server.name} exited ({server.process.returncode}); "
                                       f"see {server.log}:\n{powerfs.describe_log(server.log)}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"nats-server {server.name} not listening after "
                                       f"{START_TIMEOUT_SECONDS:.0f} s; see {server.log}")
                time.sleep(POLL_SECONDS)

    def sync(self) -> None:
        """``sync(1)`` on every server's machine: what they hold becomes durable."""
        for server in self.servers:
            server.mount.sync()

    def cut_power(self) -> dict[str, dict[str, Any]]:
        """Cut every server's power at once: each disk drops what was not fsynced and goes dark, then every
        server is SIGKILLed (and anything else still using a disk), then the disks are unmounted. Per server,
        what its disk dropped (:meth:`chaos.powerfs.PowerLossMount.power_off`)."""
        mounts = [server.mount for server in self.servers]
        reports = {server.name: mount.power_off() for server, mount in zip(self.servers, mounts, strict=True)}
        for server in self.servers:
            self._kill(server, signal.SIGKILL)
        powerfs.kill_users([mount.mountpoint for mount in mounts])
        for mount in mounts:
            mount.unmount()
        return reports

    def boot(self) -> None:
        """Mount every disk again (what the cut left of it) and start the servers on their ports."""
        for server in self.servers:
            server.mount.start()
        self._start_servers()

    def _kill(self, server: NatsServer, signal_number: int) -> None:
        process = server.process
        if process is None or process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal_number)
        try:
            process.wait(timeout=STOP_TIMEOUT_SECONDS)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=STOP_TIMEOUT_SECONDS)

    def stop(self) -> None:
        """SIGTERM every server (SIGKILL after the grace period), then give every powerfs mount back cleanly
        (the stores back in place on the real disk). Idempotent; runs on failure too."""
        try:
            for server in self.servers:
                with contextlib.suppress(ProcessLookupError):
                    if server.alive() and server.process is not None:
                        server.process.send_signal(signal.SIGTERM)
            for server in self.servers:
                self._kill(server, signal.SIGKILL)
        finally:
            if self.directory.is_dir():
                powerfs.release_mounts(self.directory)

    def replica_state(self, server: NatsServer, stream: str) -> dict[str, Any] | None:
        """``stream``'s state as ``server`` holds its own replica (its ``/jsz`` monitoring page: messages,
        first and last sequence, deleted count); None when the server does not answer or holds no replica."""
        url = f"http://{HOST}:{server.ports.monitor}/jsz?accounts=true&streams=true"
        try:
            with urllib.request.urlopen(url, timeout=MONITOR_TIMEOUT_SECONDS) as answer:
                document = json.loads(answer.read())
        except (OSError, ValueError):
            return None
        for account in document.get("account_details") or []:
            for detail in account.get("stream_detail") or []:
                if detail.get("name") == stream:
                    state = detail.get("state") or {}
                    return {key: state.get(key) for key in ("messages", "bytes", "first_seq", "last_seq",
                                                             "num_deleted")}
        return None


def running_servers(directory: Path) -> list[int]:
    """Pids a previous run under ``directory`` started that still run a nats-server."""
    try:
        pids = json.loads((directory / PIDS_FILE).read_text())
    except (OSError, ValueError):
        return []
    left = []
    for pid in pids.values() if isinstance(pids, dict) else []:
        try:
            command = Path(f"/proc/{int(pid)}/cmdline").read_bytes()
        except (OSError, ValueError):
            continue
        if BINARY.encode() in command:
            left.append(int(pid))
    return left


def _accepts(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.settimeout(0.2)
        return probe.connect_ex((HOST, port)) == 0
