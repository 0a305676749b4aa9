"""Cold boost: the coldest band holds more when hotter work leaves slots unused.

The coldest band's small prefetch (`max(2, C // 4)`, see `consumers.dispatch`) keeps slots free
for hotter work that may arrive at any moment. But hotter work often needs far fewer slots than
it leaves free (hot at 50/s with 5 ms handlers uses a quarter of one), and with none about at
all, a cold backlog would run on a quarter of the worker. So the coldest band's prefetch
follows what hotter work uses:

- no hotter message for `idle_after` seconds: `2C` (every slot);
- the first hotter message after that: back to the small prefetch at once;
- while hotter work flows: every `idle_after` seconds, `C` minus a reserve of twice the most
  hotter messages at hand at once (running or waiting) in the last two periods, plus two;
  never below the small prefetch. It changes only by steps of at least `max(2, C // 4)`.

RabbitMQ fixes a consumer's prefetch when it subscribes, so each change is a basic.qos and
basic.consume, then a basic.cancel of the old consumer, on the band's channel
(`Subscription.resize`); messages already delivered stay in hand and are settled as usual.

The price: hotter work that grows faster than the reserve may find every slot busy with cold
work and wait for the first to finish (at most one handler run) until the next period shrinks
the band; the inversion window stays `W_hot = C`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from consumers.subscription import OnDelivery, Subscription

log = logging.getLogger(__name__)


class ColdBoost:
    def __init__(
        self,
        subscription: Subscription,
        on_delivery: OnDelivery,
        *,
        concurrency: int,
        full: int,
        idle_after: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.subscription = subscription
        self.small = subscription.prefetch
        self.full = full
        self.concurrency = concurrency
        self.idle_after = idle_after
        self._on_delivery = on_delivery
        self._clock = clock
        self._step = max(2, concurrency // 4)
        self._last_hotter = clock()
        self._demand = 0  # hotter messages at hand (running or waiting) now
        self._peaks = [0, 0]  # the most at once in the previous and the current period
        self._wake = asyncio.Event()
        self._stopping = False

    @property
    def boosted(self) -> bool:
        """Consuming with every slot's worth of prefetch (no hotter work about)."""
        return self.subscription.prefetch == self.full

    def hotter_arrived(self) -> None:
        """A hotter message arrived: shrink the coldest band at once, if it is at full."""
        self._last_hotter = self._clock()
        self._demand += 1
        self._peaks[1] = max(self._peaks[1], self._demand)
        if self.boosted:
            self._wake.set()

    def hotter_done(self) -> None:
        """A hotter message was settled (or given back)."""
        self._demand = max(0, self._demand - 1)

    def stop(self) -> None:
        """End `run()` once a resize under way is done (never leave one half-way)."""
        self._stopping = True
        self._wake.set()

    def target(self) -> int:
        """The coldest band's prefetch for what hotter work did lately (see the docstring)."""
        if self._clock() - self._last_hotter >= self.idle_after:
            return self.full
        if self.boosted:
            return self.small  # hotter work is back after a pause: make room at once
        reserve = 2 * max(self._peaks) + 2
        wanted = max(self.small, min(self.full, self.concurrency - reserve))
        current = self.subscription.prefetch
        if wanted < current or wanted - current >= self._step:
            return wanted
        return current

    async def run(self) -> None:
        """Resize when the target changes, checked every `idle_after` s; till `stop()`."""
        period_ends = self._clock() + self.idle_after
        while not self._stopping:
            prefetch = self.target()
            if prefetch != self.subscription.prefetch:
                try:
                    await self.subscription.resize(prefetch, self._on_delivery)
                except Exception as exc:  # the channel closed: a reconnect restores it as it was
                    log.debug("resizing %s to %d: %r", self.subscription.queue, prefetch, exc)
                    await asyncio.sleep(self.idle_after)
                    continue
                log.debug("%s: prefetch %d", self.subscription.queue, prefetch)
                continue
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), max(0.0, period_ends - self._clock()))
            if self._clock() >= period_ends:
                self._peaks = [self._peaks[1], self._demand]
                period_ends = self._clock() + self.idle_after
