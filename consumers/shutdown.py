"""A runner's shutdown, in the steps the worker takes (`consumers.worker`).

1. `stop_taking`: nothing new starts, and what was buffered but not started goes back. Competing
   consumers are cancelled and their buffered messages nacked at once, so other workers can take
   them. Single-active queues keep theirs until their channels close (step 3), after the running
   handlers: that returns them in order (`consumers.handback`).
2. The handlers still running after the grace period are cancelled; their messages go back to
   their bands (`consumers.pipeline`).
3. The channels close.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Sequence
from typing import Any

from aio_pika.abc import AbstractChannel

from bandgate.consumers.delivery import Delivery
from bandgate.consumers.dispatch import Dispatcher
from bandgate.consumers.handback import HandBack
from bandgate.consumers.subscription import Subscription

log = logging.getLogger(__name__)


async def stop_taking(
    bands: Sequence[Sequence[Subscription]],
    dispatcher: Dispatcher[Delivery],
    handback: HandBack,
) -> int:
    """Stop deliveries and starts; give back every message not started; how many there were."""
    for subscription in (s for band in bands for s in band):
        if not subscription.single_active:
            await subscription.cancel()
    returned = dispatcher.close()
    for _, delivery in returned:
        await handback.give_back(delivery)
    return len(returned)


async def cancel(tasks: Iterable[asyncio.Future[Any]]) -> None:
    """Cancel the handler tasks still running and wait for them to give their messages back."""
    cancelled = list(tasks)
    for task in cancelled:
        task.cancel()
    await asyncio.gather(*cancelled, return_exceptions=True)


async def close(bands: Sequence[Sequence[Subscription]], channel: AbstractChannel | None) -> None:
    """Close every subscription's channel (the broker takes back what is unsettled), and the
    runner's own `channel`."""
    for subscription in (s for band in bands for s in band):
        await subscription.close()
    if channel is not None and not channel.is_closed:
        try:
            await channel.close()
        except Exception as exc:
            log.debug("closing the probe channel: %r", exc)


__all__ = ["cancel", "close", "stop_taking"]
