"""Testing handlers without a broker.

A decorated handler is a plain function, so the simplest test builds a `Message` with
`make_message` and calls it. `deliver` goes one step further and runs the app's handler the way
the worker would (sync handlers in a thread, the time limit, the retry policy) and returns the
outcome the worker would settle: `Ack()`, `RetryLater(...)` or `DeadLetter(...)`. It decides
through the worker's own `bandgate.consumers.decision.Attempt`, so the two cannot disagree.

```python
from bandgate.consumers.testing import Ack, DeadLetter, deliver, make_message

async def test_order_without_id_is_rejected() -> None:
    outcome = await deliver(app, make_message({"sku": "A-1"}, queue="orders"))
    assert isinstance(outcome, DeadLetter) and outcome.cause == "rejected"
```
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from bandgate.consumers.app import ConsumerApp
from bandgate.consumers.decision import Ack, Attempt, DeadLetter, Outcome, RetryLater
from bandgate.consumers.message import Message
from bandgate.topology import wire
from bandgate.topology.model import QueueSpec, Topology
from bandgate.topology.priority import DEFAULT_PRIORITY


def make_message(
    payload: Any = None,
    *,
    queue: str = "orders",
    priority: int = DEFAULT_PRIORITY,
    band: str | None = None,
    topology: Topology | None = None,
    message_id: str | None = None,
    attempt: int = 1,
    headers: Mapping[str, Any] | None = None,
    partition_key: str | None = None,
    enqueued_at: datetime | None = None,
    redelivered: bool = False,
    delivery_count: int = 0,
) -> Message:
    """A `Message` as a handler would receive it.

    The band defaults to the one `priority` maps to, in `topology`'s queue when given, else
    in the default bands (hot 7-9, warm 4-6, cold 0-3).
    """
    spec = topology.queue(queue) if topology is not None else QueueSpec(name=queue)
    home = spec.band_for(priority)
    consumed_from = spec.band(band) if band is not None else home
    return Message(
        payload=payload,
        queue=queue,
        band=consumed_from.name,
        priority=priority,
        message_id=message_id or wire.new_message_id(),
        attempt=attempt,
        headers=dict(headers or {}),
        partition_key=partition_key,
        enqueued_at=enqueued_at or wire.now(),
        redelivered=redelivered or delivery_count > 0,
        delivery_count=delivery_count,
        promoted=spec.bands.index(consumed_from) < spec.bands.index(home),
    )


async def deliver(app: ConsumerApp, message: Message, *, seed: int | None = None) -> Outcome:
    """Run the app's handler for `message.queue` as the worker would; return the outcome.

    `seed` makes the back-off jitter of a `RetryLater` reproducible. On an ordered queue the
    outcome follows its failure strategy, and `RetryLater` means the worker would run the
    message again in place after `delay` seconds.
    """
    consumer = app.consumer_for(message.queue)
    longest = app.topology.ladder.max_delay_ms / 1000  # as the worker's retries (`decide`)
    attempt = Attempt(consumer, message, longest_delay=longest)
    return await attempt.run(rng=random.Random(seed))


__all__ = ["Ack", "DeadLetter", "Outcome", "RetryLater", "deliver", "make_message"]
