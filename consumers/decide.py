"""One run of a handler on a message, and the outcome it comes to: the only decision path.

The worker's pipeline (`consumers.pipeline`) and the handler test helper
(`consumers.testing.deliver`) both run a handler through `Attempt`, so a test sees the very
outcome the worker would settle:

- the handler returns: `Ack`;
- it raises `Reject`: `DeadLetter("rejected")`;
- it raises anything else (`Retry`, `TimeLimitExceeded`, a `CancelledError` of its own):
  `RetryLater` after the back-off (or the `Retry`'s delay), `DeadLetter("max-attempts")` once
  it had `max_attempts`;
- it does not run, because the broker delivered the message too often:
  `DeadLetter("delivery-limit")`.

On an ordered queue its failure strategy applies on top (`consumers.ordering`).
"""

from __future__ import annotations

import asyncio
import random
import time
from concurrent.futures import Executor

from bandgate.consumers.consumer import Consumer
from bandgate.consumers.invoke import invoke
from bandgate.consumers.message import Message
from bandgate.consumers.ordering import ordered_outcome
from bandgate.consumers.outcome import DeadLetter, Outcome, after_handler, before_handler


async def run_handler(
    consumer: Consumer, message: Message, executor: Executor | None = None
) -> BaseException | None:
    """The handler's exception, or None when it returned.

    A `CancelledError` the handler raised on its own is a failure like any other; one that
    cancels the task running it (the worker is stopping) goes on up.
    """
    try:
        await invoke(
            consumer.handler,
            message,
            time_limit=consumer.options.time_limit,
            executor=executor,
            asynchronous=consumer.is_async,
        )
    except asyncio.CancelledError as exc:
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            raise
        return exc
    except Exception as exc:
        return exc
    return None


def decide(
    consumer: Consumer,
    message: Message,
    error: BaseException | None,
    rng: random.Random | None = None,
) -> Outcome:
    """The outcome of a handler run that raised `error` (None: it returned)."""
    policy = consumer.options.retry
    if consumer.spec.ordered:
        strategy = consumer.spec.effective_failure_strategy
        return ordered_outcome(error, message, policy, strategy, rng)
    return after_handler(error, message, policy, rng)


class Attempt:
    """One run of a consumer's handler on a message, and what it came to.

    The delivery limit is checked before a message's first run only: its in-place retries on
    an ordered queue are not deliveries.
    """

    __slots__ = ("consumer", "message", "refused", "error", "seconds")

    def __init__(self, consumer: Consumer, message: Message, *, first: bool = True) -> None:
        self.consumer = consumer
        self.message = message
        # Dead-lettered without running: delivered too often.
        self.refused: DeadLetter | None = (
            before_handler(message, consumer.options.retry) if first else None
        )
        self.error: BaseException | None = None  # what the handler raised
        self.seconds: float | None = None  # how long it ran; None when it did not run

    async def run(
        self, executor: Executor | None = None, rng: random.Random | None = None
    ) -> Outcome:
        """Run the handler (unless refused) and decide; `rng` draws the back-off jitter."""
        if self.refused is not None:
            return self.refused
        started = time.perf_counter()
        self.error = await run_handler(self.consumer, self.message, executor)
        self.seconds = time.perf_counter() - started
        return decide(self.consumer, self.message, self.error, rng)


__all__ = ["Attempt", "decide", "run_handler"]
