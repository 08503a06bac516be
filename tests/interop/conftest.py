"""Fixtures of the C++ interop tests: each test's driver processes, always ended, and reported on failure."""

from __future__ import annotations

import re
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

from tests.interop.harness import DriverPool


@pytest.fixture
def drivers(tmp_path: Path) -> Iterator[DriverPool]:
    """The C++ client processes of one test; every one is stopped at teardown, even after a failure."""
    pool = DriverPool(tmp_path / "drivers")
    try:
        yield pool
    finally:
        pool.close()


@pytest.fixture
def topic(request: pytest.FixtureRequest) -> str:
    """A topic name of its own for each test (RocketMQ topic characters only)."""
    return "interop_" + re.sub(r"[^A-Za-z0-9_-]+", "_", request.node.name.removeprefix("test_")).strip("_")[:100]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """On a failure, add what each C++ client process wrote (events, stderr, native log tail)."""
    report: pytest.TestReport = yield
    pool = getattr(item, "funcargs", {}).get("drivers")
    if report.failed and isinstance(pool, DriverPool) and pool.drivers:
        report.sections.append(("C++ client processes", pool.report()))
    return report
