"""The Spark session the checks run in: small, local by default, quick to start.

Settings and why:

* ``local[2]``: the machines this runs on have two cores, shared with the rest of the work.
* UI and console progress bars off: nobody looks at them, and the UI costs startup time and a port.
* ``spark.sql.shuffle.partitions`` = 4 (not 200): the checks shuffle small aggregates; 200 tasks of
  nothing each cost more than the work. Adaptive execution off (see below).
* ``PYSPARK_PYTHON`` = this interpreter (for local masters): the executors' Python workers must import
  pyarrow, ``commitlog`` and ``spark_analytics``, which only this interpreter's environment is known to
  have; and this project's root is put on ``PYTHONPATH`` so they import it even when it is not installed.
* ``SPARK_LOCAL_IP`` = 127.0.0.1: no lookup of the host's name, no warning about a loopback address, and
  nothing listens beyond loopback.
* Driver memory 1 GiB by default: in local mode the executors live in the driver's JVM; the checks cache
  only record metadata (no bodies).
* On a cluster (``spark://...``): executors of 512 MiB and one core each (``RAFTMQ_SPARK_EXECUTOR_MEMORY``
  changes the memory), whatever the workers offer beyond. The executors' Python is ``PYSPARK_PYTHON`` as the
  driver's environment names it (the workers need raftmq importable there). The driver binds to loopback only
  when the master is on loopback; otherwise Spark picks the host's address, which executors on other hosts
  connect back to (``SPARK_LOCAL_IP`` and ``spark.driver.host`` choose another).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Final

from pyspark.sql import SparkSession

from spark_analytics.sources import register_sources

MASTER_DEFAULT: Final = "local[2]"
APP_NAME: Final = "raftmq-verify"
SHUFFLE_PARTITIONS: Final = 4
DRIVER_MEMORY_DEFAULT: Final = "1g"
EXECUTOR_MEMORY_DEFAULT: Final = "512m"
LOOPBACK: Final = "127.0.0.1"
PROJECT_ROOT: Final = Path(__file__).resolve().parent.parent


def prepare_environment(master: str) -> None:
    """Environment the JVM and its Python workers inherit; must run before the first session starts."""
    if _on_loopback(master):
        os.environ.setdefault("SPARK_LOCAL_IP", LOOPBACK)
    if master.startswith("local"):
        os.environ["PYSPARK_PYTHON"] = sys.executable
        os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
        paths = [path for path in os.environ.get("PYTHONPATH", "").split(os.pathsep) if path]
        if str(PROJECT_ROOT) not in paths:
            os.environ["PYTHONPATH"] = os.pathsep.join([str(PROJECT_ROOT), *paths])


def _on_loopback(master: str) -> bool:
    """Whether the master is local or listens on loopback (then the driver binds to loopback too)."""
    if master.startswith("local"):
        return True
    host = master.split("://", 1)[-1].rsplit(":", 1)[0]
    return host in (LOOPBACK, "localhost")


def build_session(master: str = MASTER_DEFAULT, driver_memory: str = DRIVER_MEMORY_DEFAULT) -> SparkSession:
    """A session with the raftmq data sources registered. If a session is already active (a test run's
    shared one) it is reused as it is: Spark allows one per JVM, and its settings cannot change."""
    prepare_environment(master)
    builder = SparkSession.builder
    if _on_loopback(master):
        builder = builder.config("spark.driver.host", LOOPBACK).config("spark.driver.bindAddress", LOOPBACK)
    if not master.startswith("local"):
        builder = (builder.config("spark.executor.memory",
                                  os.environ.get("RAFTMQ_SPARK_EXECUTOR_MEMORY", EXECUTOR_MEMORY_DEFAULT))
                   .config("spark.executor.cores", "1"))
    spark = (
        builder.master(master)
        .appName(APP_NAME)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(SHUFFLE_PARTITIONS))
        .config("spark.default.parallelism", "2")
        .config("spark.driver.memory", driver_memory)
        .config("spark.sql.session.timeZone", "UTC")
        # adaptive execution re-plans after every shuffle stage; the checks' plans are fixed and their
        # shuffles are keyed by replica, so it only adds work (without it the integrity check runs faster)
        .config("spark.sql.adaptive.enabled", "false")
        # the checks cache their inputs partitioned by replica; joins keyed by (replica, ...) can use that
        # partitioning instead of shuffling both sides again (rows with equal keys share a partition either
        # way; the violation job runs faster for it)
        .config("spark.sql.requireAllClusterKeysForCoPartition", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register_sources(spark)
    return spark
