"""The tenants benchmark's hot p99 interval (`bench.tenants.ratio_interval`): it must cover
1 when both sides are drawn from one distribution, and leave it out when one side is twice
as slow, or the acceptance row's interval says nothing."""

from __future__ import annotations

import random

from bench.tenants import pooled_p99, ratio_interval


def runs(scale: float, seed: int, rounds: int = 4, size: int = 600) -> list[list[float]]:
    chance = random.Random(seed)
    return [[chance.expovariate(1 / scale) for _ in range(size)] for _ in range(rounds)]


def test_the_interval_covers_one_when_both_sides_are_alike() -> None:
    low, high = ratio_interval(runs(2.0, seed=1), runs(2.0, seed=2))
    assert low < 1.0 < high
    assert high - low < 0.3  # 2,400 a side: narrow enough to say something of 10 %


def test_the_interval_leaves_one_out_when_one_side_is_twice_as_slow() -> None:
    slow, base = runs(4.0, seed=3), runs(2.0, seed=4)
    low, high = ratio_interval(slow, base)
    assert low < pooled_p99(slow) / pooled_p99(base) < high
    assert low > 1.5
    assert high < 2.7
