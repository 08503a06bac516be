"""A Spark standalone cluster (one master, some workers) started from the installed pyspark, on loopback,
for the live-audit test and ``make audit-cluster``: real JVM daemons and executors, as a Spark cluster on
other hosts runs ``verify``'s jobs, on one machine.

    with SparkStandalone.start(work_dir, workers=2) as spark_cluster:
        ... verify --master spark_cluster.master_url ...

Each daemon is ``spark-class org.apache.spark.deploy.master.Master`` or ``...worker.Worker`` with small
memory and free ports, its output in ``work_dir``; start-up waits (with a deadline) until the master lists
every worker alive, and anything started is stopped again when start-up fails. Executors run the Python
workers with this interpreter and this project on ``PYTHONPATH`` (:func:`executor_environment`), as a
real deployment installs raftmq on its workers.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from cli.cluster import free_ports
from spark_analytics.session import PROJECT_ROOT

HOST: Final = "127.0.0.1"
#: memory of each daemon's JVM (the master and workers only book-keep)
DAEMON_MEMORY: Final = "256m"
#: what each worker offers executors; ``verify`` asks for less (session.EXECUTOR_MEMORY_DEFAULT)
WORKER_MEMORY: Final = "768m"
WORKER_CORES: Final = 1
START_TIMEOUT_SECONDS: Final = 120.0
STOP_TIMEOUT_SECONDS: Final = 20.0
POLL_SECONDS: Final = 0.25


class StandaloneError(Exception):
    """The Spark cluster could not start (no spark-class, no Java, a daemon exited); the message says which."""


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def executor_environment() -> dict[str, str]:
    """What the daemons (and so the executors and their Python workers) and the driver need: this
    interpreter, this project importable, loopback only."""
    paths = [path for path in os.environ.get("PYTHONPATH", "").split(os.pathsep) if path]
    if str(PROJECT_ROOT) not in paths:
        paths.insert(0, str(PROJECT_ROOT))
    return {"PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
            "PYTHONPATH": os.pathsep.join(paths), "SPARK_LOCAL_IP": HOST, "SPARK_HOME": str(spark_home()),
            "SPARK_DAEMON_MEMORY": DAEMON_MEMORY}


@dataclass
class SparkStandalone:
    work_dir: Path
    master_port: int
    master_ui_port: int
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def master_url(self) -> str:
        return f"spark://{HOST}:{self.master_port}"

    @classmethod
    def start(cls, work_dir: Path, workers: int = 2, timeout_seconds: float = START_TIMEOUT_SECONDS) -> SparkStandalone:
        spark_class = spark_home() / "bin" / "spark-class"
        if not os.access(spark_class, os.X_OK):
            raise StandaloneError(f"{spark_class} is missing or not executable")
        work_dir.mkdir(parents=True, exist_ok=True)
        ports = free_ports(2 + 2 * workers)
        cluster = cls(work_dir, ports[0], ports[1])
        try:
            cluster._spawn("master", [str(spark_class), "org.apache.spark.deploy.master.Master", "--host", HOST,
                                      "--port", str(ports[0]), "--webui-port", str(ports[1])])
            for number in range(workers):
                port, ui_port = ports[2 + 2 * number : 4 + 2 * number]
                directory = work_dir / f"worker-{number}"
                directory.mkdir(exist_ok=True)
                cluster._spawn(f"worker-{number}", [
                    str(spark_class), "org.apache.spark.deploy.worker.Worker", "--host", HOST, "--port", str(port),
                    "--webui-port", str(ui_port), "--cores", str(WORKER_CORES), "--memory", WORKER_MEMORY,
                    "--work-dir", str(directory), cluster.master_url])
            cluster.wait_workers(workers, timeout_seconds)
        except BaseException:
            cluster.stop()
            raise
        return cluster

    def _spawn(self, name: str, arguments: list[str]) -> None:
        log = open(self.work_dir / f"{name}.log", "ab")  # noqa: SIM115 - handed to the child
        try:
            self.processes.append(subprocess.Popen(
                arguments, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=self.work_dir,
                start_new_session=True, env={**os.environ, **executor_environment()}))
        finally:
            log.close()

    def alive_workers(self) -> int:
        """Workers the master lists alive (its web UI's JSON), 0 while it does not answer."""
        try:
            with urllib.request.urlopen(f"http://{HOST}:{self.master_ui_port}/json/", timeout=2.0) as answer:
                document = json.loads(answer.read())
        except (OSError, urllib.error.URLError, ValueError):
            return 0
        return int(document.get("aliveworkers", 0))

    def wait_workers(self, workers: int, timeout_seconds: float) -> None:
        deadline = time.monotonic() + timeout_seconds
        while self.alive_workers() < workers:
            exited = [str(process.args) for process in self.processes if process.poll() is not None]
            if exited:
                raise StandaloneError(f"a Spark daemon exited: {exited}; see the logs in {self.work_dir}")
            if time.monotonic() > deadline:
                raise StandaloneError(f"{workers} Spark workers not registered after {timeout_seconds:.0f} s; see "
                                      f"the logs in {self.work_dir}")
            time.sleep(POLL_SECONDS)

    def stop(self) -> None:
        """Stop the daemons (their process groups: a worker's executors with it), TERM then KILL."""
        for process in reversed(self.processes):
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_SECONDS
        for process in self.processes:
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        self.processes.clear()

    def __enter__(self) -> SparkStandalone:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
