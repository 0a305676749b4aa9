"""Repeated runs: this machine is shared and its broker stalls now and then, so a single run
of a contender can be far off. Compared contenders run `ROUNDS` times, interleaved, and each
row is the median run, with every run's figure beside it."""

from __future__ import annotations

import statistics
from typing import Any

ROUNDS = 3


def median_run(runs: list[dict[str, Any]], key: str, fmt: str = "{:.0f}") -> dict[str, Any]:
    """The run with the median `key`, with `<key>_runs` listing every run's, in run order."""
    ordered = sorted(runs, key=lambda row: row[key])
    median = dict(ordered[(len(ordered) - 1) // 2])
    median[f"{key}_runs"] = "/".join(fmt.format(row[key]) for row in runs)
    return median


def with_median(row: dict[str, Any], runs: list[dict[str, Any]], key: str) -> dict[str, Any]:
    """`row` with `key` replaced by the median over `runs`, each run's listed in `<key>_runs`."""
    return {
        **row,
        key: statistics.median(run[key] for run in runs),
        f"{key}_runs": "/".join(f"{run[key]:.1f}" for run in runs),
    }
