"""The console's memory: what each band looked like over the last minutes, and how long its
work waits.

The worker's `bandgate_wait_seconds` histogram lives in the worker processes, out of the
gateway's sight. The console shows a wait the gateway can see itself, per band, at each sample:
the age of the band's head message where the broker tracks it (classic queues); otherwise an
estimate from the backlog, `ready / delivery rate` (Little's law, with the management API's
delivery rate); and for a backlog nothing drains, how long it has been there. The gateway only
knows that from its own samples, so that figure is a bound, never a measurement: at least the
time since the first sample that showed the backlog (it keeps growing: cold work starving shows
as a rising line); on that first sample, at most the time since the sample before it, when that
one showed the band empty, and unknown (None) when the gateway had not looked before. Pure: no
I/O, so the choice is tested without a broker.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

WaitSource = Literal["empty", "head", "estimate", "backlog"]
WaitBound = Literal["at_least", "at_most"]

WINDOW_SECONDS = 300.0  # what the chart and the percentiles cover


@dataclass(frozen=True)
class BandPoint:
    """A band at one moment, as the broker reported it (None: not known)."""

    ready: int | None
    unacked: int | None
    consumers: int | None
    head_age: float | None
    publish_rate: float | None
    deliver_rate: float | None


@dataclass(frozen=True)
class Wait:
    """A wait, how it was found, and whether `seconds` is only a bound on it."""

    seconds: float | None
    source: WaitSource | None
    bound: WaitBound | None = None


def band_wait(
    point: BandPoint, backlog_since: float | None, now: float, empty_at: float | None = None
) -> Wait:
    """How long work in the band waits now, and how that was found (module docstring).

    `backlog_since`: the first sample that showed the current backlog; `empty_at`: the last
    sample that showed the band empty (None: no sample did)."""
    if point.ready == 0:
        return Wait(0.0, "empty")
    if point.head_age is not None:
        return Wait(point.head_age, "head")
    if point.ready is not None and point.deliver_rate:
        return Wait(round(point.ready / point.deliver_rate, 3), "estimate")
    if point.ready is None or backlog_since is None:
        return Wait(None, None)
    if now > backlog_since:
        return Wait(round(now - backlog_since, 3), "backlog", "at_least")
    if empty_at is not None and empty_at < now:
        return Wait(round(now - empty_at, 3), "backlog", "at_most")
    return Wait(None, "backlog")  # first seen just now, never seen empty: its age is unknown


def percentile(values: Iterable[float], fraction: float) -> float | None:
    """The nearest-rank percentile (`fraction` 0-1) of `values`; None for none."""
    ordered = sorted(values)
    if not ordered:
        return None
    rank = max(1, math.ceil(fraction * len(ordered)))
    return ordered[rank - 1]


def management_rates(view: Mapping[str, Any] | None) -> tuple[float | None, float | None]:
    """Publish and delivery rates (messages/s) of a queue in the management API's view."""
    if view is None:
        return None, None
    stats = view.get("message_stats")
    if not isinstance(stats, Mapping):
        if "messages" not in view:
            return None, None  # the statistics database has not sampled the queue yet
        return 0.0, 0.0  # the broker has counted nothing in or out of this queue yet
    return _rate(stats, "publish_details"), _rate(stats, "deliver_get_details")


def _rate(stats: Mapping[str, Any], key: str) -> float:
    details = stats.get(key)
    rate = details.get("rate") if isinstance(details, Mapping) else None
    return float(rate) if isinstance(rate, int | float) and not isinstance(rate, bool) else 0.0


@dataclass
class BandHistory:
    """One band's samples within the window, and since when it has held a backlog."""

    waits: deque[tuple[float, float | None]] = field(default_factory=deque)
    backlog_since: float | None = None
    empty_at: float | None = None
    last: BandPoint | None = None
    wait: Wait = field(default_factory=lambda: Wait(None, None))

    def record(self, point: BandPoint, now: float, window: float) -> None:
        if point.ready == 0:
            self.backlog_since = None
        elif point.ready is not None and self.backlog_since is None:
            self.backlog_since = now
        self.last = point
        self.wait = band_wait(point, self.backlog_since, now, self.empty_at)
        if point.ready == 0:
            self.empty_at = now
        self.waits.append((now, self.wait.seconds))
        while self.waits and self.waits[0][0] < now - window:
            self.waits.popleft()

    def summary(self) -> dict[str, Any]:
        point = self.last
        seen = [seconds for _, seconds in self.waits if seconds is not None]
        return {
            "ready": point.ready if point else None,
            "unacked": point.unacked if point else None,
            "consumers": point.consumers if point else None,
            "oldest_ready_age_seconds": point.head_age if point else None,
            "publish_rate": point.publish_rate if point else None,
            "deliver_rate": point.deliver_rate if point else None,
            "wait_seconds": self.wait.seconds,
            "wait_source": self.wait.source,
            "wait_bound": self.wait.bound,
            "wait_p50_seconds": percentile(seen, 0.5),
            "wait_p99_seconds": percentile(seen, 0.99),
        }


@dataclass
class QueueHistory:
    """A logical queue's bands over the window, with its dead-lettered count (its delayed
    messages cannot be counted apart: the delay ladder is the whole deployment's)."""

    window: float = WINDOW_SECONDS
    bands: dict[str, BandHistory] = field(default_factory=dict)
    dead_lettered: int | None = None
    sampled_at: float | None = None

    def record(
        self, points: Mapping[str, BandPoint], now: float, dead_lettered: int | None
    ) -> None:
        for band, point in points.items():
            self.bands.setdefault(band, BandHistory()).record(point, now, self.window)
        self.dead_lettered = dead_lettered
        self.sampled_at = now

    def to_json(self, now: float) -> dict[str, Any]:
        """The latest counts and, for the chart, each band's waits as (seconds ago, wait)."""
        return {
            "sampled_at": self.sampled_at,
            "dead_lettered": self.dead_lettered,
            "publish_rate": _sum(point.publish_rate for point in self._latest()),
            "deliver_rate": _sum(point.deliver_rate for point in self._latest()),
            "bands": [{"band": name, **band.summary()} for name, band in self.bands.items()],
            "chart": {
                name: [[round(at - now, 1), wait] for at, wait in band.waits]
                for name, band in self.bands.items()
            },
        }

    def _latest(self) -> list[BandPoint]:
        return [band.last for band in self.bands.values() if band.last is not None]


def _sum(values: Iterable[float | None]) -> float | None:
    total = 0.0
    for value in values:
        if value is None:
            return None
        total += value
    return round(total, 3)


__all__ = [
    "WINDOW_SECONDS",
    "BandHistory",
    "BandPoint",
    "QueueHistory",
    "Wait",
    "WaitBound",
    "band_wait",
    "management_rates",
    "percentile",
]
