"""The way into a runner: every delivery of its subscriptions goes into its band's buffer.

All of a band's queues (its queue, or each of its shards) feed the band's one buffer in the
dispatcher, so the waterfall sees a sharded band as one band; inside it, each shard keeps its
own order and a slot starts the best head (`consumers.merge`). A delivery that arrives while
the runner stops, or while its queue is being handed back, is not taken in but given back
(`consumers.handback`). Arrivals are counted per band for the start-up (`consumers.startup`
waits for each band's first prefetch) and reported to the headroom. A queue whose consumer
is lost (the broker cancelled it) is consumed again (`consumers.resubscribe`).
"""

from __future__ import annotations

import asyncio

from bandgate.consumers.delivery import Delivery, partition_key
from bandgate.consumers.dispatch import Dispatcher
from bandgate.consumers.handback import HandBack
from bandgate.consumers.headroom import Headroom
from bandgate.consumers.incoming import Incoming
from bandgate.consumers.lifetime import Lifetime
from bandgate.consumers.resubscribe import Resubscriber
from bandgate.consumers.subscription import Subscription


class Intake:
    """The `Receiver` of every subscription of a runner."""

    def __init__(
        self,
        bands: int,
        dispatcher: Dispatcher[Delivery],
        handback: HandBack,
        lifetime: Lifetime,
        resubscriber: Resubscriber,
        headroom: Headroom | None = None,
    ) -> None:
        self.dispatcher = dispatcher
        self.handback = handback
        self.lifetime = lifetime
        self.resubscriber = resubscriber
        self.headroom = headroom
        self._coldest = bands - 1
        self._arrived = [0] * bands
        self._arrival = asyncio.Event()

    async def receive(self, subscription: Subscription, incoming: Incoming) -> None:
        delivery = Delivery(subscription, incoming, partition_key(incoming))
        if self.lifetime.stopping or subscription.releasing:
            # Sent before the broker saw our cancel, or while the queue goes back.
            await self.handback.give_back(delivery)
            return
        subscription.active = True
        band = subscription.band
        if self.headroom is not None and band < self._coldest:
            self.headroom.hotter_arrived()
        self._arrived[band] += 1
        self._arrival.set()
        self.dispatcher.put(band, delivery)

    def lost(self, subscription: Subscription, reason: str) -> None:
        self.resubscriber.lost(subscription, reason)

    def arrived(self, band: int) -> int:
        """How many deliveries of `band` were taken in so far."""
        return self._arrived[band]

    async def arrival(self, band: int, count: int) -> None:
        """Wait until `count` deliveries of `band` were taken in, in all."""
        while self._arrived[band] < count:
            self._arrival.clear()
            await self._arrival.wait()


__all__ = ["Intake"]
