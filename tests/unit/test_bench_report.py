"""The benchmarks' own arithmetic and layout: percentiles of latencies, tables per part."""

from __future__ import annotations

import math

from bench.__main__ import tables
from bench.pull import percentile


def test_percentile_interpolates_between_the_nearest_values() -> None:
    values = [float(n) for n in range(1, 102)]  # 1..101: the q-th percentile is q + 1
    assert percentile(values, 50) == 51.0
    assert percentile(values, 99) == 100.0


def test_percentile_never_passes_the_largest_value() -> None:
    values = [1.0, 2.0, 3.0, 50.0]
    assert percentile(values, 99) <= 50.0
    assert percentile(values, 50) == 2.5


def test_percentile_of_one_value_is_that_value_and_of_none_nan() -> None:
    assert percentile([7.0], 99) == 7.0
    assert math.isnan(percentile([], 50))


def test_rows_without_parts_make_one_table() -> None:
    rows = [{"name": "a", "rate": 1.0}, {"name": "b", "rate": 2.0}]
    assert tables("consume", rows) == [("consume", rows)]


def test_rows_with_parts_make_a_table_per_part_in_order_without_the_part() -> None:
    rows = [
        {"part": "drain", "name": "http", "rate": 1.0},
        {"part": "wake", "name": "http", "p99_ms": 3.0},
        {"part": "drain", "name": "worker", "rate": 2.0},
    ]
    assert tables("pull", rows) == [
        ("pull: drain", [{"name": "http", "rate": 1.0}, {"name": "worker", "rate": 2.0}]),
        ("pull: wake", [{"name": "http", "p99_ms": 3.0}]),
    ]
