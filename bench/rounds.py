"""Repeated runs: this machine is shared and its broker stalls now and then, so a single run
of a contender can be far off. Compared contenders run `ROUNDS` times, interleaved, and each
row is the median run, with every run's figure beside it.

A ratio against the baseline is taken within each round (the runs of one round are minutes
apart at most, so they share the machine's state; the speed of the machine was seen to drift
by a third between rounds) and the row shows the median of the rounds' ratios."""

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


def paired_ratios(
    runs: dict[str, list[dict[str, Any]]], baseline: str, key: str = "rate"
) -> dict[str, tuple[float, str]]:
    """Per contender: the median over rounds of `key` / the baseline's `key` in that round,
    and every round's ratio."""
    base = [run[key] for run in runs[baseline]]
    out = {}
    for name, done in runs.items():
        ratios = [run[key] / b for run, b in zip(done, base, strict=True)]
        out[name] = (statistics.median(ratios), "/".join(f"{r:.2f}" for r in ratios))
    return out
