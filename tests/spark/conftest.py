"""One Spark session for the whole test run (starting one costs seconds), and one clean cluster that
the defect tests copy before damaging it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from spark_analytics.session import build_session
from tests.spark.cluster import DUPLICATED_BATCH, build_cluster


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    session = build_session()
    yield session
    session.stop()


@pytest.fixture(scope="session")
def clean_cluster(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three replicas written with the same appends. Never modified: copy it first."""
    root = tmp_path_factory.mktemp("clean") / "cluster"
    build_cluster(root)
    return root


@pytest.fixture(scope="session")
def duplicated_cluster(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three replicas where n2 applied the entry of batch 10 twice, as a non-idempotent apply of a
    replayed entry would: its messages are stored twice there. Never modified."""
    root = tmp_path_factory.mktemp("duplicated") / "cluster"
    build_cluster(root, extra_apply={"n2": DUPLICATED_BATCH})
    return root
