"""Figures reported about a run: one percentile rule for every tool that reports latencies or durations (the
CLI's ``bench``, the benchmarks, the tests' measuring members), so their p50 and p99 mean the same thing."""

from __future__ import annotations

import math
from collections.abc import Iterable


def percentile(values: Iterable[float], fraction: float) -> float:
    """The nearest-rank percentile of ``values``: the smallest value with at least ``fraction`` of the values
    at or below it; ``fraction`` 0 gives the smallest, 1 the largest. 0.0 for no values (a run that measured
    nothing reports zeros, as its counts say)."""
    ordered = sorted(values)
    if not ordered:
        return 0.0
    rank = min(len(ordered), max(1, math.ceil(fraction * len(ordered))))
    return ordered[rank - 1]
