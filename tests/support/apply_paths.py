"""Both ways the store takes prepared records and index entries, as a fixture."""

from __future__ import annotations

import pytest

import commitlog.records as records_module

__all__ = ["both_apply_paths"]


@pytest.fixture(params=["record by record", "column-wise"])
def both_apply_paths(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run a test both ways of storing prepared records and index entries (``commitlog.records.COLUMNS_MIN``):
    use with ``pytestmark = pytest.mark.usefixtures("both_apply_paths")`` after importing it."""
    if request.param == "column-wise":
        monkeypatch.setattr(records_module, "COLUMNS_MIN", 1)
    return str(request.param)
