"""Cold boost: the coldest band may use every slot while no hotter band has work.

The coldest band's small prefetch (`max(2, C // 4)`, see `consumers.dispatch`) keeps slots free
for hotter work that may arrive at any moment. With no hotter work about, though, it would run a
cold backlog on a quarter of the worker. So once no hotter message has arrived for `idle_after`
seconds, the coldest band is consumed with the hot band's prefetch (`2C`); as soon as a hotter
message arrives, it goes back to the small one. RabbitMQ fixes a consumer's prefetch when it
subscribes, so each change is a basic.cancel, basic.qos and basic.consume on the band's channel
(`Subscription.resize`); messages already delivered stay in hand and are settled as usual.

The price: while boosted, the first hotter message to arrive may find every slot busy with cold
work and waits for the first to finish (at most one handler run); the inversion window stays
`W_hot = C`. Hotter traffic arriving more often than every `idle_after` seconds keeps the band
small all the time, as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from consumers.subscription import OnDelivery, Subscription

log = logging.getLogger(__name__)


class ColdBoost:
    def __init__(
        self,
        subscription: Subscription,
        on_delivery: OnDelivery,
        *,
        full: int,
        idle_after: float,
    ) -> None:
        self.subscription = subscription
        self.small = subscription.prefetch
        self.full = full
        self.idle_after = idle_after
        self.boosted = False
        self._on_delivery = on_delivery
        self._last_hotter = time.monotonic()
        self._wake = asyncio.Event()
        self._stopping = False

    def hotter_arrived(self) -> None:
        """A message of a hotter band arrived: shrink the coldest band at once, if boosted."""
        self._last_hotter = time.monotonic()
        if self.boosted:
            self._wake.set()

    def stop(self) -> None:
        """End `run()` once a resize under way is done (never leave one half-way)."""
        self._stopping = True
        self._wake.set()

    async def run(self) -> None:
        """Boost after `idle_after` s without hotter arrivals, shrink at the next; till `stop()`."""
        while not self._stopping:
            idle = time.monotonic() - self._last_hotter
            boost = idle >= self.idle_after
            if boost != self.boosted:
                prefetch = self.full if boost else self.small
                try:
                    await self.subscription.resize(prefetch, self._on_delivery)
                except Exception as exc:  # the channel closed: a reconnect restores it as it was
                    log.debug("resizing %s to %d: %r", self.subscription.queue, prefetch, exc)
                    await asyncio.sleep(self.idle_after)
                    continue
                self.boosted = boost
                log.debug("%s: prefetch %d", self.subscription.queue, prefetch)
                continue
            self._wake.clear()
            timeout = None if boost else self.idle_after - idle
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout)
