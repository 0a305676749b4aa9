"""A delivery on its way through a runner: where it came from and the key it runs under.

The dispatcher runs one message per partition key at a time (`consumers.dispatch`); a strictly
serial queue (`ordering_required`) gives all its messages one key, so they run one at a time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from aio_pika.exceptions import ChannelInvalidStateError

from bandgate.consumers.incoming import Delivered
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


def dispatch_key(spec: QueueSpec) -> Callable[[Delivery], str | None]:
    """The key the dispatcher runs a queue's deliveries under, one at a time per key."""
    if spec.ordering_required:
        return lambda _: SERIAL_KEY
    return lambda delivery: delivery.key


__all__ = ["SERIAL_KEY", "Delivery", "dispatch_key", "partition_key"]
