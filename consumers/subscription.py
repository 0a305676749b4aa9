"""One RabbitMQ queue a runner consumes (a band's queue or one shard of it, on its own channel),
and the deliveries it brings.

Each queue gets its own channel (the prefetch is per consumer, and a queue with a single active
consumer is handed over by closing its channel, which must not touch the others).

Giving a message back differs with the queue's consumers:
- competing consumers (unordered queues): nack with requeue, at once; any worker may take it.
- a single active consumer (ordered queues): never nack while subscribed. The broker would
  deliver the message again behind the ones this worker already holds, and a basic.cancel
  would make the next consumer active while this one still holds messages (both seen on
  3.10.8). Messages are given back by closing the channel once nothing of the queue is running
  any more: the broker returns everything unacked to the head of the queue, in the order it
  was delivered, before the next active consumer gets anything.

Deliveries are pushed: aiormq calls the subscription for each one, and it hands them to its
`Receiver` (the runner, `bandgate.consumers.runner`) as a `Delivery` from itself. The receiver
is an object given to `open`, not a closure, and the one place deliveries enter a runner. It
also hears when the consumer is lost, and consumes the queue again.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from dataclasses import dataclass, field
from typing import Any, Protocol

from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractRobustChannel
from aio_pika.exceptions import ChannelInvalidStateError
from aiormq.abc import DeliveredMessage
from pamqp.commands import Basic

from bandgate.core.protocol.acks import Unsettled
from bandgate.core.protocol.deliveries import Delivered, Incoming
from bandgate.topology import wire

REOPEN_TIMEOUT_SECONDS = 10.0
"""How long `resume` waits for a robust channel that is reopening after a reconnection."""

log = logging.getLogger(__name__)


class Receiver(Protocol):
    async def receive(self, delivery: Delivery) -> None:
        """A delivery came on its subscription's queue."""
        ...

    def lost(self, subscription: Subscription, reason: str) -> None:
        """`subscription` has no consumer any more, though its channel may be open: the
        broker cancelled it (a consumer timeout, the queue deleted), or consuming again after
        a reconnect failed."""
        ...


@dataclass(eq=False)
class Subscription:
    band: int  # index of the band, hottest first
    queue: str
    prefetch: int
    single_active: bool
    shard: int = 0  # its index among the queues of its band (`QueueSpec.band_queues`)
    # Believed to be the queue's active consumer: it was the first consumer when it subscribed,
    # or a message came. Always true for competing consumers.
    active: bool = False
    # What arrives is given back and nothing buffered starts: it is paused, lost, or being
    # handed over (its channel closes once none of its messages runs).
    giving_back: bool = False
    running: int = 0
    channel: AbstractChannel | None = None
    _consumer_tag: str | None = None
    _receiver: Receiver | None = None
    _unsettled: Unsettled | None = None  # of the channel deliveries last came on
    _idle: asyncio.Event = field(default_factory=asyncio.Event)

    async def open(self, connection: AbstractConnection, receiver: Receiver) -> int:
        """Consume the queue on a new channel; the number of messages ready just before.

        It consumes with aiormq (`bandgate.core.protocol.deliveries` says why), so a robust
        channel's own restore does not know the consumer: after a reconnect, `_restore`
        subscribes again.
        The queue is looked up with aiormq too: a robust channel would declare a queue it
        looked up again at every reconnect, and a reconnect would fail while the queue is gone
        (the subscription, not the connection, waits for it: the runner consumes it again).
        """
        channel = await connection.channel()
        self.channel = channel
        try:
            await channel.set_qos(prefetch_count=self.prefetch)
            underlay = await channel.get_underlay_channel()
            declared = await underlay.queue_declare(self.queue, passive=True)
        except BaseException:
            await self.close()
            raise
        self.active = not self.single_active or not declared.consumer_count
        self.giving_back = False
        self._receiver = receiver
        if isinstance(channel, AbstractRobustChannel):
            channel.reopen_callbacks.add(self._restore)
        await self._consume()
        return declared.message_count or 0

    async def reopen(self, connection: AbstractConnection) -> int:
        """`open` again, with the same receiver, once `close`d."""
        assert self._receiver is not None, "never opened"
        return await self.open(connection, self._receiver)

    async def _consume(self) -> None:
        assert self.channel is not None
        underlay = await self.channel.get_underlay_channel()
        underlay.on_consumer_cancel_callbacks.add(self._cancelled)  # a set: once per channel
        # A tag of our own: aiormq draws its tags from the `random` module, which an
        # application (or Hypothesis) may seed, and a tag used again on a channel makes
        # RabbitMQ 3.10 close the whole connection (541 INTERNAL_ERROR).
        tag = f"bandgate.{secrets.token_hex(12)}"
        consumed = await underlay.basic_consume(self.queue, self._deliver, consumer_tag=tag)
        self._consumer_tag = consumed.consumer_tag

    async def _deliver(self, delivered: DeliveredMessage) -> None:
        assert self._receiver is not None
        unsettled = self._unsettled
        if unsettled is None or unsettled.channel is not delivered.channel:
            unsettled = self._unsettled = Unsettled(delivered.channel)  # a new tag space
        incoming = Incoming(delivered, unsettled)
        await self._receiver.receive(Delivery(self, incoming, partition_key(incoming)))

    def _cancelled(self, frame: Basic.Cancel) -> None:
        """A basic.cancel from the broker (a consumer this worker cancelled gets a CancelOk)."""
        if frame.consumer_tag != self._consumer_tag:
            return  # a consumer cancelled or closed meanwhile
        self._lost(
            "the broker cancelled its consumer (a message was held past the queue's consumer "
            "timeout, or the queue was deleted)"
        )

    async def _restore(self, channel: Any) -> None:
        """The robust channel came back (its prefetch restored): consume again."""
        if self.channel is not channel or self._consumer_tag is None:
            return  # closed or cancelled meanwhile
        try:
            await self._consume()
        except Exception as exc:  # the queue is gone, or the connection again
            self._lost(f"consuming it on its reopened channel failed ({exc!r})")

    def _lost(self, reason: str) -> None:
        self._consumer_tag = None  # gone: nothing to restore or cancel on this channel
        if self._receiver is not None:
            self._receiver.lost(self, reason)

    async def pause(self) -> None:
        """Stop deliveries for a while (competing consumers only); the receiver gives back
        what arrives meanwhile (`giving_back`). An HTTP receiver pauses while no client waits, so
        that it holds no messages another gateway process's clients could take."""
        self.giving_back = True
        await self.cancel()

    async def resume(self) -> int:
        """Consume again after `pause`; the number of messages ready just before."""
        assert self.channel is not None, "never opened"
        if isinstance(self.channel, AbstractRobustChannel):
            # The connection is back a moment before its channels are: wait for this one
            # rather than fail on it (`TimeoutError` if it does not come back).
            async with asyncio.timeout(REOPEN_TIMEOUT_SECONDS):
                await self.channel.ready()
        underlay = await self.channel.get_underlay_channel()
        declared = await underlay.queue_declare(self.queue, passive=True)
        self.giving_back = False
        await self._consume()
        return declared.message_count or 0

    def started(self) -> None:
        self.running += 1
        self._idle.clear()

    def finished(self) -> None:
        self.running -= 1
        if self.running == 0:
            self._idle.set()

    async def idle(self) -> None:
        """Wait until none of its messages is running."""
        if self.running:
            await self._idle.wait()

    async def cancel(self) -> None:
        """Stop deliveries (competing consumers only: see the module docstring)."""
        assert not self.single_active
        tag, self._consumer_tag = self._consumer_tag, None
        if tag is None or self.channel is None:
            return
        try:
            underlay = await self.channel.get_underlay_channel()
            await underlay.basic_cancel(tag)
        except Exception as exc:  # a closed channel has no consumer left to cancel
            log.debug("cancelling the consumer of %s: %r", self.queue, exc)

    async def close(self) -> None:
        """Close the channel: the broker takes back every message of it not settled yet.

        Even a channel the broker closed: a robust one would reopen itself, unused, unless
        closed on purpose."""
        channel, self.channel, self._consumer_tag = self.channel, None, None
        if channel is not None:
            try:
                await channel.close()
            except Exception as exc:
                log.debug("closing the channel of %s: %r", self.queue, exc)


@dataclass(eq=False)
class Delivery:
    """A delivery on its way through a runner: the subscription it came on, what the broker
    delivered, and the partition key it runs under."""

    subscription: Subscription
    incoming: Delivered
    key: str | None
    _rank: tuple[int, float] | None = field(default=None, repr=False)  # for the shard merge

    @property
    def band(self) -> int:
        return self.subscription.band

    @property
    def body(self) -> bytes:
        return self.incoming.body

    @property
    def channel_gone(self) -> bool:
        """True when its channel closed (the broker took the message back then)."""
        try:
            return self.incoming.channel.is_closed
        except ChannelInvalidStateError:
            return True


def partition_key(incoming: Delivered) -> str | None:
    return wire.header_text((incoming.headers or {}).get(wire.PARTITION_KEY))


__all__ = ["REOPEN_TIMEOUT_SECONDS", "Delivery", "Receiver", "Subscription", "partition_key"]
