"""Giving messages back to the broker, unhandled, without changing their place in the queue.

How depends on the queue's consumers (`consumers.subscription`):
- competing consumers: nack with requeue, at once; any worker may take it.
- a single active consumer (ordered queues): the whole queue goes back. Its buffered messages
  stop being candidates at once, and once none of its messages runs its channel closes: the
  broker returns every unacked one to the head of the queue, in order. Then the runner
  subscribes again, at the back of the line of consumers. While the runner stops, nothing is
  done: its channels close when it does, which returns them.
"""

from __future__ import annotations

import logging

from aio_pika.abc import AbstractConnection

from bandgate.consumers.delivery import Delivery
from bandgate.consumers.dispatch import Dispatcher
from bandgate.consumers.lifetime import Lifetime
from bandgate.consumers.settle import Settler
from bandgate.consumers.subscription import Subscription

log = logging.getLogger(__name__)


class HandBack:
    def __init__(
        self,
        connection: AbstractConnection,
        settler: Settler,
        dispatcher: Dispatcher[Delivery],
        lifetime: Lifetime,
    ) -> None:
        self.connection = connection
        self.settler = settler
        self.dispatcher = dispatcher
        self.lifetime = lifetime

    async def give_back(self, delivery: Delivery, *, counted: bool = False) -> None:
        """Return a message to its queue, in its place; `counted`: as a delivery
        (`consumers.settle.Settler.give_back`)."""
        subscription = delivery.subscription
        if not subscription.single_active:
            await self.settler.give_back(delivery.incoming, counted=counted)
        elif not self.lifetime.stopping:
            self.hand_back(subscription)

    def hand_back(self, subscription: Subscription) -> None:
        """Give a single-active queue back to the broker, in order, then subscribe again.

        Its buffered messages stop being candidates at once (synchronously, before the slot of
        whatever called this is freed, so no later message of a key can start); they and
        anything still arriving stay unacked until the channel closes.
        """
        if subscription.releasing:
            return
        subscription.releasing = True
        subscription.active = False
        self.dispatcher.discard(subscription.band, lambda d: d.subscription is subscription)
        self.lifetime.spawn(self._rejoin(subscription))

    async def _rejoin(self, subscription: Subscription) -> None:
        await subscription.idle()
        await subscription.close()
        if self.lifetime.stopping:
            return
        try:
            await subscription.reopen(self.connection)
        except Exception as exc:
            log.error("could not consume %s again: %r", subscription.queue, exc)
            return
        log.info(
            "handed %s back%s",
            subscription.queue,
            " and took it again (no other worker waits for it)" if subscription.active else "",
        )


__all__ = ["HandBack"]
