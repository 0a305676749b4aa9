"""Failures on ordered queues: retried in place, and the failure strategy says when to give up.

On an ordered queue a failed message must not be overtaken by the messages behind it, and a
retry through the delay exchanges would let them overtake it. So the worker holds the message
(unacked, its partition key busy) and runs it again after the back-off; `RetryLater` means
exactly that here. The queue's `failure_strategy` decides what a failure does to the line:

| strategy                  | a failure                                   | the key meanwhile |
|---------------------------|---------------------------------------------|-------------------|
| `skip`                    | dead-lettered at once, no retry             | goes on           |
| `block`                   | retried in place with back-off, for ever    | waits             |
| `block_and_dlq` (default) | retried in place up to `max_attempts`, then | waits, then goes  |
|                           | dead-lettered                               | on                |

With every strategy, `Reject` and malformed messages are dead-lettered at once, and so is a
message that crashed workers `max_deliveries` times (it would stop the line for good anyway).
"""

from __future__ import annotations

import random

from bandgate.consumers.errors import Retry
from bandgate.consumers.message import Message
from bandgate.consumers.outcome import (
    DeadLetter,
    Outcome,
    RetryLater,
    after_handler,
    backoff_delay,
    describe,
)
from bandgate.topology.model import FailureStrategy, RetryPolicy


def ordered_outcome(
    error: BaseException | None,
    message: Message,
    policy: RetryPolicy,
    strategy: FailureStrategy,
    rng: random.Random | None = None,
) -> Outcome:
    """The outcome of a handler run on an ordered queue (`RetryLater`: again, in place)."""
    outcome = after_handler(error, message, policy, rng)
    if error is None:
        return outcome
    if strategy == "skip" and isinstance(outcome, RetryLater):
        return DeadLetter(
            cause="skipped",
            reason=f"{outcome.reason} (failure_strategy skip: dead-lettered at the first "
            "failure, the messages behind it went on)",
            error_type=type(error).__name__,
        )
    if strategy == "block" and isinstance(outcome, DeadLetter) and outcome.cause == "max-attempts":
        if isinstance(error, Retry) and error.delay is not None:
            delay = error.delay
        else:
            delay = backoff_delay(policy, message.attempt, rng)
        return RetryLater(delay=delay, attempt=message.attempt + 1, reason=describe(error))
    return outcome


__all__ = ["ordered_outcome"]
