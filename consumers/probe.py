"""Asking the broker whether a band that ran dry has more: the dispatcher's `questions`.

A band that had a backlog and ran dry keeps its claim on free slots for the refill wait, since
its refill is most likely on the way (`consumers.dispatch`). When a free slot waits for it, the
probe asks the broker (a passive declare on its own channel): if no queue of the band has a
message ready, the dispatcher stops waiting (`Dispatcher.settle`) and the headroom learns that
the hotter work is done. Only queues this worker is the active consumer of can refill it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from aio_pika.abc import AbstractChannel

from bandgate.consumers.delivery import Delivery
from bandgate.consumers.dispatch import Dispatcher
from bandgate.consumers.headroom import Headroom
from bandgate.consumers.lifetime import Lifetime
from bandgate.consumers.subscription import Subscription

log = logging.getLogger(__name__)


class RefillProbe:
    def __init__(
        self,
        bands: Sequence[Sequence[Subscription]],
        dispatcher: Dispatcher[Delivery],
        lifetime: Lifetime,
        refill_wait: float,
        headroom: Headroom | None = None,
    ) -> None:
        self.bands = bands
        self.dispatcher = dispatcher
        self.lifetime = lifetime
        self.refill_wait = refill_wait
        self.headroom = headroom
        self.channel: AbstractChannel | None = None
        # A probe that found a band's backlog goes on answers for the next refill wait too.
        self._backlog_seen_at = [float("-inf")] * len(bands)
        self._probing = [False] * len(bands)

    def start(self, channel: AbstractChannel) -> None:
        """Answer the dispatcher's questions, asking the broker on `channel`."""
        self.channel = channel
        self.lifetime.spawn(self._answer())

    async def _answer(self) -> None:
        while True:
            band = await self.dispatcher.questions.get()
            if self.lifetime.stopping or self._probing[band]:
                continue
            # The broker had more for it a moment ago: its refill is most likely on the way,
            # so ask only once the refill wait since then is over (one question per wait).
            since = asyncio.get_running_loop().time() - self._backlog_seen_at[band]
            self._probing[band] = True
            self.lifetime.spawn(self._probe(band, after=max(0.0, self.refill_wait - since)))

    async def _probe(self, band: int, after: float) -> None:
        try:
            if after:
                await asyncio.sleep(after)
            if not self.lifetime.stopping:
                await self._ask_broker(band)
        finally:
            self._probing[band] = False

    async def _ask_broker(self, band: int) -> None:
        assert self.channel is not None
        ready = 0
        for subscription in self.bands[band]:
            if not subscription.active:
                continue
            try:
                channel = await self.channel.get_underlay_channel()
                declared = await channel.queue_declare(subscription.queue, passive=True)
            except Exception as exc:  # the wait just runs its course
                log.debug("probing %s: %r", subscription.queue, exc)
                return
            ready += declared.message_count or 0
        if ready:
            self._backlog_seen_at[band] = asyncio.get_running_loop().time()
        else:
            self.dispatcher.settle(band)
            if self.headroom is not None and band < len(self.bands) - 1:
                self.headroom.hotter_drained()


__all__ = ["RefillProbe"]
