"""Shard sharing: the shards of an ordered band shared out among the workers.

Each shard of an ordered band has a single active consumer, and RabbitMQ (3.x) makes the
consumer that subscribed first the active one: every worker subscribes to every shard, so the
first worker to start would hold all of them and the others would only stand by. So every worker
holds at most its share, `ceil(shards / workers)` per band, and hands the rest over:

1. It knows which shards it holds: it was the queue's first consumer when it subscribed, or a
   message came. (An idle shard it was handed over may go unnoticed until its first message;
   that costs nothing while the shard is idle.)
2. It knows how many workers there are: each one consumes the queue's workers queue
   (`naming.workers_queue`), which never holds a message, so its consumer count is the number
   of workers.
3. It hands a shard over the way a crash would, but in order: it stops starting the shard's
   messages, waits for the running ones to be settled, and closes the shard's channel. The
   broker returns the unacked rest to the head of the shard, in delivery order, and makes the
   longest-waiting worker active, which gets them before anything newer. The worker subscribes
   again at the back of the line, ready to take over if that worker dies.

Per-key order holds across the handover: all of a key's messages are in one shard, the old
holder settled every one it started, and the new holder starts with the first one it did not.
Each handover counts as a delivery of the returned messages (`x-delivery-count`), so handovers
are kept rare: only a worker above its share hands shards over, checking every
`share_shards_seconds`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

from aio_pika.abc import AbstractChannel, AbstractConnection

from bandgate.consumers.lifetime import Lifetime
from bandgate.consumers.subscription import Subscription

log = logging.getLogger(__name__)


def surplus(held: int, shards: int, workers: int) -> int:
    """How many of a band's `shards` a worker holding `held` of them should hand over."""
    share = -(-shards // max(1, workers))
    return max(0, held - share)


class WorkersQueue:
    """Membership in a queue's workers queue: consumed by every worker, never holds a message."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._channel: AbstractChannel | None = None

    async def join(self, connection: AbstractConnection) -> None:
        self._channel = await connection.channel()
        queue = await self._channel.declare_queue(self.name, passive=True)
        await queue.consume(_nothing_arrives, no_ack=True)

    async def count(self, channel: AbstractChannel) -> int | None:
        """How many workers there are (None when the broker cannot say)."""
        try:
            underlay = await channel.get_underlay_channel()
            declared = await underlay.queue_declare(self.name, passive=True)
        except Exception as exc:
            log.debug("counting the workers on %s: %r", self.name, exc)
            return None
        return declared.consumer_count

    async def leave(self) -> None:
        channel, self._channel = self._channel, None
        if channel is not None and not channel.is_closed:
            try:
                await channel.close()
            except Exception as exc:
                log.debug("leaving %s: %r", self.name, exc)


async def _nothing_arrives(_: object) -> None:
    """Nobody publishes to a workers queue."""


class ShardSharing:
    """A runner's part in the sharing: it holds no more than its share of each band's shards."""

    def __init__(
        self,
        queue: str,
        workers: WorkersQueue,
        bands: Sequence[Sequence[Subscription]],
        hand_over: Callable[[Subscription], None],
        lifetime: Lifetime,
        interval: float,
    ) -> None:
        """`hand_over(subscription)`: hand the queue over to the broker, in order, and
        subscribe again (`ConsumerRunner.hand_over`)."""
        self.queue = queue
        self.workers = workers
        self.bands = bands
        self.hand_over = hand_over
        self.lifetime = lifetime
        self.interval = interval
        self._joined = False

    async def start(self, connection: AbstractConnection, channel: AbstractChannel) -> None:
        """Join the workers queue and check the share every `interval` s, counting the workers
        on `channel`. A worker that cannot join keeps every shard it gets."""
        try:
            await self.workers.join(connection)
        except Exception as exc:
            log.warning(
                "cannot join %s (%r): this worker keeps every shard it gets; run `bandgate "
                "topology apply` to share the shards of %s out",
                self.workers.name,
                exc,
                self.queue,
            )
            await self.workers.leave()
            return
        self._joined = True
        self.lifetime.spawn(self._share(channel))

    async def _share(self, channel: AbstractChannel) -> None:
        while not self.lifetime.stopping:
            await asyncio.sleep(self.interval)
            workers = await self.workers.count(channel)
            if not workers or self.lifetime.stopping:
                continue
            for subscriptions in self.bands:
                held = [s for s in subscriptions if s.active and not s.giving_back]
                extra = surplus(len(held), len(subscriptions), workers)
                if not extra:
                    continue
                # The ones quickest to hand over: fewest running.
                for subscription in sorted(held, key=lambda s: s.running)[:extra]:
                    log.info(
                        "holding %d of %d shards with %d workers: handing %s over",
                        len(held),
                        len(subscriptions),
                        workers,
                        subscription.queue,
                    )
                    self.hand_over(subscription)

    async def leave(self) -> None:
        if self._joined:
            await self.workers.leave()


__all__ = ["ShardSharing", "WorkersQueue", "surplus"]
