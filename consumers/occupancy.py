"""A consumer's slots as gauges, sampled on the event loop once a second.

`bandgate_wait_seconds` says how long messages waited, not where. A hot message waits for a
slot either because cold work holds it, which the headroom's reserve bounds, or because hotter
work holds every slot it may have, which only more concurrency shortens (`consumers.headroom`:
Erlang C). These gauges tell the two apart: each band's `busy_slots` against `slots`, the
`reserved_slots` the headroom keeps free for hotter arrivals, and `hotter_load`, the slots
hotter work held on average over the last second. When `hotter_load` nears the slots cold work
cannot hold (`slots - max(2, slots // 4)`: 12 of 16), hot messages queue for their own slots;
add concurrency or workers. Messages `at_hand` pile up in a band whose slots are all taken.

Sampled on the loop, not when scraped: the metrics server answers from a thread of its own,
and the headroom's averages are the loop's to update.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from bandgate.consumers.dispatch import Dispatcher
from bandgate.consumers.headroom import Headroom
from bandgate.consumers.lifetime import Lifetime
from bandgate.consumers.subscription import Subscription
from bandgate.core.telemetry import Telemetry

INTERVAL_SECONDS = 1.0


class Occupancy:
    def __init__(
        self,
        telemetry: Telemetry,
        queue: str,
        bands: Sequence[str],
        subscriptions: Sequence[Sequence[Subscription]],
        dispatcher: Dispatcher[Any],
        headroom: Headroom | None,
    ) -> None:
        """`subscriptions`: each band's queues (its shards), hottest band first."""
        self._dispatcher = dispatcher
        self._subscriptions = subscriptions
        self._headroom = headroom
        series = telemetry.series
        self._slots = series(telemetry.slots, queue)
        self._busy = [series(telemetry.busy_slots, queue, band) for band in bands]
        self._at_hand = [series(telemetry.at_hand, queue, band) for band in bands]
        self._reserved = series(telemetry.reserved_slots, queue)
        self._hotter_load = series(telemetry.hotter_load, queue) if headroom else None

    def sample(self) -> None:
        self._slots.set(self._dispatcher.concurrency)
        for band, queues in enumerate(self._subscriptions):
            self._busy[band].set(sum(subscription.running for subscription in queues))
            self._at_hand[band].set(self._dispatcher.buffered(band))
        headroom = self._headroom
        self._reserved.set(0 if headroom is None else headroom.reserve())
        if headroom is not None and self._hotter_load is not None:
            self._hotter_load.set(headroom.load())

    async def run(self, lifetime: Lifetime) -> None:
        """Sample every `INTERVAL_SECONDS` until the runner stops."""
        while True:
            self.sample()
            if not await lifetime.pause(INTERVAL_SECONDS):
                return


__all__ = ["INTERVAL_SECONDS", "Occupancy"]
