"""Cold boost: the coldest band may use every slot while no hotter band has work.

The coldest band's small prefetch (`max(2, C // 4)`, see `consumers.dispatch`) keeps slots free
for hotter work that may arrive at any moment. With no hotter work about, though, it would run a
cold backlog on a quarter of the worker. So once no hotter message has arrived for `idle_after`
seconds, the coldest band is consumed with the hot band's prefetch (`2C`); as soon as a hotter
message arrives, it goes back to the small one. RabbitMQ fixes a consumer's prefetch when it
subscribes, so each change is a basic.cancel, basic.qos and basic.consume on the band's channel
(`Subscription.resize`); messages already delivered stay in hand and are settled as usual.

A hotter band whose backlog just ended boosts it sooner: when a hotter band ran dry and the
broker confirmed it empty (the dispatcher's refill probe), with no hotter message arriving
since, the hotter work is done, and waiting `idle_after` would only leave slots idle; the boost
then comes once hotter bands were quiet for `quiet_after` (the refill wait, 0.1 s). A cold
backlog behind a drained hotter backlog (the drain of a mixed backlog) so runs on every slot
almost at once, while a steady hotter stream (arrivals closer than `quiet_after`) never
boosts it.

Only where it is safe and needed (`boosts`): the strict policy, the coldest band's default small
prefetch (an override turns the boost off), one competing consumer queue for it (not sharded,
not ordered).

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
from collections.abc import Sequence

from bandgate.consumers.options import ConsumerOptions
from bandgate.consumers.subscription import Subscription
from bandgate.topology.model import QueueSpec

log = logging.getLogger(__name__)


def boosts(
    spec: QueueSpec, options: ConsumerOptions, prefetch: Sequence[int], idle_after: float
) -> bool:
    """Whether the coldest band of `spec` gets the full prefetch while hotter bands are idle."""
    coldest = spec.bands[-1]
    return (
        idle_after > 0
        and options.policy == "strict"
        and len(spec.bands) > 1
        and coldest.shards == 1
        and not spec.ordered
        and coldest.name not in options.prefetch_overrides
        and prefetch[-1] < prefetch[0]
    )


class ColdBoost:
    def __init__(
        self,
        subscription: Subscription,
        *,
        full: int,
        idle_after: float,
        quiet_after: float = 0.0,
    ) -> None:
        self.subscription = subscription
        self.small = subscription.prefetch
        self.full = full
        self.idle_after = idle_after
        self.quiet_after = min(quiet_after, idle_after)
        self.boosted = False
        self._last_hotter = time.monotonic()
        self._drained_at = float("-inf")
        self._wake = asyncio.Event()
        self._stopping = False

    def hotter_arrived(self) -> None:
        """A message of a hotter band arrived: shrink the coldest band at once, if boosted."""
        self._last_hotter = time.monotonic()
        if self.boosted:
            self._wake.set()

    def hotter_drained(self) -> None:
        """A hotter band's backlog ended (the broker has none left): boost now, unless a
        hotter message arrives meanwhile."""
        self._drained_at = time.monotonic()
        if not self.boosted:
            self._wake.set()

    def stop(self) -> None:
        """End `run()` once a resize under way is done (never leave one half-way)."""
        self._stopping = True
        self._wake.set()

    async def run(self) -> None:
        """Boost after `idle_after` s without hotter arrivals or once a hotter backlog drained,
        shrink at the next hotter arrival; till `stop()`."""
        self._last_hotter = time.monotonic()  # idle from now on, not since it was made
        while not self._stopping:
            idle = time.monotonic() - self._last_hotter
            drained = self._drained_at > self._last_hotter
            needed = self.quiet_after if drained else self.idle_after
            boost = idle >= needed
            if boost != self.boosted:
                prefetch = self.full if boost else self.small
                try:
                    await self.subscription.resize(prefetch)
                except Exception as exc:  # the channel closed: a reconnect restores it as it was
                    log.debug("resizing %s to %d: %r", self.subscription.queue, prefetch, exc)
                    await asyncio.sleep(self.idle_after)
                    continue
                self.boosted = boost
                log.debug("%s: prefetch %d", self.subscription.queue, prefetch)
                continue
            self._wake.clear()
            timeout = None if boost else needed - idle
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout)
