"""A delivery on its way through a runner: where it came from, the key it runs under, and how
it ranks against the heads of the other shards of its band.

The dispatcher runs one message per partition key at a time (`consumers.dispatch`); a strictly
serial queue (`ordering_required`) gives all its messages one key, so they run one at a time.
Within a sharded band it starts the best head among the shards (`consumers.merge`), ranked by
the priority the handler will see (the header of ordered queues, `wire.read_priority`) and the
enqueue time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from aio_pika.exceptions import ChannelInvalidStateError

from bandgate.consumers.incoming import Delivered
from bandgate.consumers.merge import Rank, ShardMerge
from bandgate.consumers.message import read_enqueued_millis, read_priority
from bandgate.consumers.subscription import Subscription
from bandgate.topology import wire
from bandgate.topology.model import QueueSpec

# The key every message of a strictly serial queue has: one runs at a time.
SERIAL_KEY = ""


@dataclass(eq=False)
class Delivery:
    subscription: Subscription
    incoming: Delivered
    key: str | None
    _rank: Rank | None = field(default=None, repr=False)  # read once, when first compared

    @property
    def band(self) -> int:
        return self.subscription.band

    @property
    def channel_gone(self) -> bool:
        """True when its channel closed (the broker took the message back then)."""
        try:
            return self.incoming.channel.is_closed
        except ChannelInvalidStateError:
            return True


def partition_key(incoming: Delivered) -> str | None:
    return wire.header_text((incoming.headers or {}).get(wire.PARTITION_KEY))


def shard_merge(spec: QueueSpec) -> ShardMerge[Delivery]:
    """How the dispatcher merges the shards of each band of a queue (`consumers.merge`)."""

    def rank(delivery: Delivery) -> Rank:
        if delivery._rank is None:
            incoming = delivery.incoming
            priority = read_priority(incoming, spec.bands[delivery.band])
            delivery._rank = (-priority, read_enqueued_millis(incoming))
        return delivery._rank

    return ShardMerge(
        shards=tuple(band.shards for band in spec.bands),
        source=lambda delivery: delivery.subscription.shard,
        rank=rank,
    )


def dispatch_key(spec: QueueSpec) -> Callable[[Delivery], str | None]:
    """The key the dispatcher runs a queue's deliveries under, one at a time per key."""
    if spec.ordering_required:
        return lambda _: SERIAL_KEY
    return lambda delivery: delivery.key


__all__ = ["SERIAL_KEY", "Delivery", "dispatch_key", "partition_key", "shard_merge"]
