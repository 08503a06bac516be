"""The one percentile rule the tools report latencies with: nearest rank, by a table."""

from __future__ import annotations

import pytest

from client.figures import percentile


@pytest.mark.parametrize(
    ("values", "fraction", "expected"),
    [
        ([5.0], 0.5, 5.0),
        ([3.0, 1.0, 2.0], 0.0, 1.0),
        ([3.0, 1.0, 2.0], 0.5, 2.0),
        ([3.0, 1.0, 2.0], 1.0, 3.0),
        ([float(value) for value in range(1, 101)], 0.99, 99.0),
        ([float(value) for value in range(1, 101)], 0.991, 100.0),
        ([1.0, 2.0, 3.0, 4.0], 0.25, 1.0),
        ([1.0, 2.0, 3.0, 4.0], 0.26, 2.0),
    ],
)
def test_percentile_is_the_nearest_rank(values: list[float], fraction: float, expected: float) -> None:
    assert percentile(values, fraction) == expected


def test_percentile_of_no_values_is_zero() -> None:
    assert percentile([], 0.5) == 0.0
