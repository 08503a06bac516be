"""Figures reported about a run of sends: one percentile rule for every tool that reports latencies (the
CLI's ``bench``, and any tool above the client), so their p50 and p99 mean the same thing."""

from __future__ import annotations

import math
from collections.abc import Iterable


def percentile(values: Iterable[float], fraction: float) -> float:
    """The nearest-rank percentile of ``values`` (not empty): the smallest value with at least ``fraction``
    of the values at or below it; ``fraction`` 0 gives the smallest, 1 the largest."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("a percentile of no values")
    rank = min(len(ordered), max(1, math.ceil(fraction * len(ordered))))
    return ordered[rank - 1]
