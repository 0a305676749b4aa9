"""Samples for the console: every queue's bands, read from the broker at most once per
interval however many consoles are open, and only while one is (nothing is read when nobody
looks).

Counts come from `core.queue_stats.collect_queue_stats` (the numbers `GET .../stats` gives);
publish and delivery rates from the management API's `message_stats`, when the gateway has a
management URL (without one, rates and estimated waits are null). The delayed count is the
delay ladder's, which every queue shares: it is kept once, for the deployment, never per queue.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import Any

import httpx
from starlette.datastructures import State

from bandgate.core.broker import BrokerLink
from bandgate.core.queue_stats import BandStats, StatsError, collect_queue_stats
from bandgate.gateway.console_history import (
    WINDOW_SECONDS,
    BandPoint,
    QueueHistory,
    management_rates,
)
from bandgate.topology.model import Topology

SAMPLE_INTERVAL_SECONDS = 2.0

log = logging.getLogger(__name__)


class ConsoleSampler:
    def __init__(
        self,
        topology: Topology,
        interval: float = SAMPLE_INTERVAL_SECONDS,
        window: float = WINDOW_SECONDS,
    ) -> None:
        self.topology = topology
        self.interval = interval
        self.histories = {name: QueueHistory(window) for name in topology.queues}
        self.problems: dict[str, str] = {}
        self.delayed: int | None = None  # the whole deployment's delay ladder
        self._lock = asyncio.Lock()
        self._last: float | None = None

    async def refresh(self, link: BrokerLink) -> None:
        """Take a sample unless one was taken less than `interval` ago; concurrent callers
        share one. A queue the broker cannot describe keeps its last sample, with a problem."""
        async with self._lock:
            if self._last is not None and time.monotonic() - self._last < self.interval:
                return
            self._last = time.monotonic()
            connection = link.connection
            if connection is None or not link.connected:
                problem = link.problem or "not connected to the broker"
                self.problems = dict.fromkeys(self.topology.queues, problem)
                return
            views = await _views(link)
            problems: dict[str, str] = {}
            for spec in self.topology.queues.values():
                try:
                    stats = await collect_queue_stats(
                        connection, self.topology, spec, link.management
                    )
                except StatsError as exc:
                    problems[spec.name] = str(exc)
                    continue
                points = {band["band"]: _point(band, views) for band in stats["bands"]}
                self.histories[spec.name].record(points, time.time(), stats["dead_lettered"])
                self.delayed = stats["delayed"]
            self.problems = problems


def _point(band: BandStats, views: Mapping[str, Mapping[str, Any]] | None) -> BandPoint:
    """A band's counts, with the rates summed over its queues (its shards, or the one)."""
    names = [shard["queue"] for shard in band["shards"]] or [band["queue"]]
    publish: float | None = 0.0
    deliver: float | None = 0.0
    for name in names:
        one_publish, one_deliver = management_rates(views.get(name) if views else None)
        publish = None if publish is None or one_publish is None else publish + one_publish
        deliver = None if deliver is None or one_deliver is None else deliver + one_deliver
    return BandPoint(
        ready=band["ready"],
        unacked=band["unacked"],
        consumers=band["consumers"],
        head_age=band["oldest_ready_age_seconds"],
        publish_rate=publish,
        deliver_rate=deliver,
    )


async def _views(link: BrokerLink) -> dict[str, Mapping[str, Any]] | None:
    """The management API's view of every queue of the vhost, by name (None without one)."""
    if link.management is None:
        return None
    try:
        queues = await link.management.queues()
    except (httpx.HTTPError, ValueError) as exc:
        log.warning("console: the management API did not answer: %s", exc)
        return None
    return {item["name"]: item for item in queues if isinstance(item, dict) and "name" in item}


def sampler_of(state: State) -> ConsoleSampler:
    """The app's sampler, made on first use (the topology is known once the lifespan ran)."""
    sampler: ConsoleSampler | None = getattr(state, "console_sampler", None)
    if sampler is None:
        sampler = ConsoleSampler(state.topology)
        state.console_sampler = sampler
    return sampler


__all__ = ["SAMPLE_INTERVAL_SECONDS", "ConsoleSampler", "sampler_of"]
