"""What happens to a message after its handler ran: ack, retry later, or dead-letter.

Pure decisions, no broker: the worker settles them (`consumers.settle`), the testing helper
returns them, and unit tests check them directly.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Literal

from bandgate.consumers.errors import MalformedMessage, Reject, Requeue, Retry
from bandgate.consumers.message import Message
from bandgate.core.ledger import Verdict
from bandgate.topology.model import RetryPolicy

# A reason longer than this is cut: it travels in an AMQP header and shows in the UI.
MAX_REASON_CHARS = 1000

DeadLetterCause = Literal["rejected", "max-attempts", "delivery-limit", "malformed", "skipped"]


@dataclass(frozen=True)
class Ack:
    """Handled: acknowledge it."""


@dataclass(frozen=True)
class RetryLater:
    """Publish a copy as attempt `attempt` due in `delay` seconds, then ack the original.

    On an ordered queue the worker instead holds the message and runs it again as attempt
    `attempt` after `delay` seconds (`consumers.ordering`).
    """

    delay: float
    attempt: int
    reason: str


@dataclass(frozen=True)
class DeadLetter:
    """Publish a copy to the queue's dead-letter queue saying why, then ack the original."""

    cause: DeadLetterCause
    reason: str
    error_type: str | None = None


@dataclass(frozen=True)
class GiveBack:
    """Return it to its queue unhandled, counted by the broker as a delivery (`Requeue`)."""

    reason: str


@dataclass(frozen=True)
class Tombstoned:
    """Not run: the ledger says this copy was cancelled, superseded by a replacement, or (for
    a consumer that dedupes) already handled. Acked like a success (`consumers.tombstones`)."""

    verdict: Verdict

    @property
    def reason(self) -> str:
        return f"{self.verdict}, says the tombstone ledger"


Outcome = Ack | RetryLater | DeadLetter | GiveBack | Tombstoned


def describe(error: BaseException) -> str:
    """`Type: message`, cut to `MAX_REASON_CHARS`."""
    text = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
    if len(text) > MAX_REASON_CHARS:
        text = text[: MAX_REASON_CHARS - 3] + "..."
    return text


def backoff_delay(policy: RetryPolicy, attempt: int, rng: random.Random | None = None) -> float:
    """Back-off after failed attempt `attempt`: exponential, capped, with ± jitter."""
    delay = policy.backoff_seconds(attempt)
    if policy.jitter and delay > 0:
        spread = delay * policy.jitter
        delay += (rng or random).uniform(-spread, spread)
    return max(0.0, delay)


def before_handler(message: Message, policy: RetryPolicy) -> DeadLetter | None:
    """Dead-letter a message the broker returned too often, before it can kill another worker.

    Quorum queues count every return in `x-delivery-count`: workers that died on it, and also
    graceful returns (a shutdown giving back what it had not started). On a classic band the
    count is absent and this check never fires.
    """
    if message.delivery_count >= policy.max_deliveries:
        return DeadLetter(
            cause="delivery-limit",
            reason=(
                f"delivered {message.delivery_count + 1} times without an answer "
                f"(x-delivery-count {message.delivery_count} >= max_deliveries "
                f"{policy.max_deliveries}): workers crashed or were stopped while holding it"
            ),
        )
    return None


def after_handler(
    error: BaseException | None,
    message: Message,
    policy: RetryPolicy,
    rng: random.Random | None = None,
) -> Outcome:
    """The outcome of a handler run that raised `error` (None: it returned)."""
    if error is None:
        return Ack()
    if isinstance(error, Requeue):
        return GiveBack(error.reason)
    if isinstance(error, Reject):
        return DeadLetter("rejected", describe(error), type(error).__name__)
    if isinstance(error, MalformedMessage):
        return DeadLetter("malformed", describe(error), type(error).__name__)
    if message.attempt >= policy.max_attempts:
        return DeadLetter(
            cause="max-attempts",
            reason=f"{describe(error)} (attempt {message.attempt} of {policy.max_attempts})",
            error_type=type(error).__name__,
        )
    if isinstance(error, Retry) and error.delay is not None:
        delay = error.delay
    else:
        delay = backoff_delay(policy, message.attempt, rng)
    return RetryLater(delay=delay, attempt=message.attempt + 1, reason=describe(error))


__all__ = [
    "Ack",
    "DeadLetter",
    "DeadLetterCause",
    "GiveBack",
    "Outcome",
    "RetryLater",
    "Tombstoned",
    "after_handler",
    "backoff_delay",
    "before_handler",
    "describe",
]
