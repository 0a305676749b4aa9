"""Start-up: consume every band hottest first, each band's first prefetch in hand before the next.

Waiting for it keeps the start order of a backlog strict: otherwise colder deliveries could
reach the free slots before the hotter ones (see `consumers.dispatch`). Only queues this worker
is the active consumer of deliver anything to wait for.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from aio_pika.abc import AbstractConnection

from bandgate.consumers.consumer import Consumer
from bandgate.consumers.intake import Intake
from bandgate.consumers.subscription import Subscription

log = logging.getLogger(__name__)


async def subscribe(
    bands: Sequence[Sequence[Subscription]],
    connection: AbstractConnection,
    intake: Intake,
    prime_timeout: float,
) -> None:
    """Open every subscription into `intake`, hottest band first, waiting up to
    `prime_timeout` s for each band's first prefetch."""
    for index, subscriptions in enumerate(bands):
        expected = 0
        for subscription in subscriptions:
            ready = await subscription.open(connection, intake)
            if subscription.active:
                expected += min(ready, subscription.prefetch)
        if expected:
            try:
                async with asyncio.timeout(prime_timeout):
                    await intake.arrival(index, expected)
            except TimeoutError:
                log.debug("band %d: %d of %d arrived", index, intake.arrived(index), expected)


def log_started(
    consumer: Consumer,
    concurrency: int,
    prefetch: Sequence[int],
    bands: Sequence[Sequence[Subscription]],
) -> None:
    spec = consumer.spec
    log.info(
        "consuming %s with %s (concurrency %d, policy %s, prefetch %s%s)",
        spec.name,
        consumer.name,
        concurrency,
        consumer.options.policy,
        {
            band.name: prefetch[index]
            if band.shards == 1
            else f"{band.shards} shards x {bands[index][0].prefetch}"
            for index, band in enumerate(spec.bands)
        },
        ", strictly serial"
        if spec.ordering_required
        else (", ordered per key" if spec.ordered else ""),
    )


__all__ = ["log_started", "subscribe"]
