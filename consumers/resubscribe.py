"""A lost consumer comes back: its queue is consumed again on a new channel.

The broker cancels a consumer (a basic.cancel of its own, the channel left open) when the queue
is deleted and, from RabbitMQ 4.3 on, when the consumer held a message past its consumer
timeout (`consumer_timeout` in rabbitmq.conf, the `consumer-timeout` policy key, the
`x-consumer-timeout` argument): the quorum queue returns the message and cancels the consumer.
Earlier versions close the channel instead, which the robust channel reopens and the
subscription consumes again on (`Subscription._restore`); when that fails (the queue is gone),
the consumer is lost too. Without this module a lost consumer would just stop: the band would
silently no longer be consumed by this worker.

It is treated like a lost channel. The subscription's buffered messages stop being candidates at
once, its channel closes (the broker takes back whatever of it is unacked), and a new channel
consumes the queue. Delivery tags of the old channel cannot be acked on the new one: a handler
still running on a message of the old channel finishes, and its ack is dropped (see
`consumers.settle`); the broker has the message back and delivers it again, so nothing is lost.
When the queue is gone, consuming again fails, and it is tried again after `interval` seconds,
doubling up to `MAX_INTERVAL`, until the queue is back or the runner stops.
"""

from __future__ import annotations

import logging

from aio_pika.abc import AbstractConnection

from bandgate.consumers.delivery import Delivery
from bandgate.consumers.dispatch import Dispatcher
from bandgate.consumers.lifetime import Lifetime
from bandgate.consumers.subscription import Subscription

log = logging.getLogger(__name__)

MAX_INTERVAL = 30.0


class Resubscriber:
    def __init__(
        self,
        connection: AbstractConnection,
        dispatcher: Dispatcher[Delivery],
        lifetime: Lifetime,
        interval: float,
    ) -> None:
        self.connection = connection
        self.dispatcher = dispatcher
        self.lifetime = lifetime
        self.interval = interval

    def lost(self, subscription: Subscription, reason: str) -> None:
        """`subscription` has no consumer any more (`reason`): consume its queue again.

        Called from the channel's frame reader, so the work happens in a task of its own.
        """
        if self.lifetime.stopping or subscription.releasing:
            return  # its channel closes anyway: the shutdown, or a handover that consumes again
        log.warning(
            "%s: %s; consuming it again on a new channel (the messages it held are delivered "
            "again)",
            subscription.queue,
            reason,
        )
        subscription.releasing = True  # what still arrives on the old channel is given back
        subscription.active = False
        self.dispatcher.discard(subscription.band, lambda d: d.subscription is subscription)
        self.lifetime.spawn(self._again(subscription))

    async def _again(self, subscription: Subscription) -> None:
        await subscription.close()
        wait = self.interval
        while not self.lifetime.stopping:
            try:
                await subscription.reopen(self.connection)
            except Exception as exc:
                log.warning(
                    "cannot consume %s again (%r); trying again in %g s",
                    subscription.queue,
                    exc,
                    wait,
                )
                if not await self.lifetime.pause(wait):
                    return
                wait = min(2 * wait, max(self.interval, MAX_INTERVAL))
                continue
            log.info("consuming %s again", subscription.queue)
            return


__all__ = ["MAX_INTERVAL", "Resubscriber"]
