"""The one way tests and benchmarks read a percentile off measured values, so that every figure they print
(p50, p99 of latencies, lock holds, lateness) is computed alike."""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["percentile"]


def percentile(values: Iterable[float], fraction: float) -> float:
    """The value at index ``int(count * fraction)`` of the sorted values (the largest for a fraction of
    1.0), 0.0 for no values. ``fraction=0.5`` is the upper median of an even count."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * fraction))] if ordered else 0.0
