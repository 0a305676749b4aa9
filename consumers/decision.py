"""The decision: after the handler, what happens to this message. Pure, no broker.

Everything that answers it lives here, once: the outcomes (`Ack`, `RetryLater`, `DeadLetter`,
`GiveBack`, `Tombstoned`), the delivery limit checked before the handler, the handler's run
under its time limit, the retry policy's back-off, the ordered queues' failure strategies and
the clamp of a retry delay to the delay ladder. The worker's runner (`bandgate.consumers.runner`)
and the handler test helper (`bandgate.consumers.testing.deliver`) both decide through
`Attempt`, so a test sees the very outcome the worker would settle; the settlement
(`bandgate.consumers.settlement`) only carries it out.

- the broker delivered the message too often (quorum `x-delivery-count`): it does not run,
  `DeadLetter("delivery-limit")`;
- the tombstone ledger says the copy was cancelled, superseded or (for a consumer that dedupes)
  already handled: it does not run, `Tombstoned` (acked like a success);
- the handler returns: `Ack`;
- it raises `Requeue`: `GiveBack`, back in its queue at once, counted as a delivery;
- it raises `Reject` (or the message is malformed): `DeadLetter("rejected")`
  (`DeadLetter("malformed")`);
- it raises anything else (`Retry`, `TimeLimitExceeded`, a `CancelledError` of its own):
  `RetryLater` after the back-off (or the `Retry`'s delay, at most the delay ladder's longest),
  `DeadLetter("max-attempts")` once it had `max_attempts`.

Failures on ordered queues
--------------------------
On an ordered queue a failed message must not be overtaken by the messages behind it, and a
retry through the delay exchanges would let them overtake it. So the worker holds the message
(unacked, its partition key busy) and runs it again after the back-off; `RetryLater` means
exactly that there (no ladder, so no clamp). The queue's `failure_strategy` decides what a
failure does to the line:

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

import asyncio
import contextvars
import logging
import random
import time
from collections.abc import Mapping
from concurrent.futures import Executor
from dataclasses import dataclass, replace
from typing import Any, Literal

from bandgate.consumers.consumer import Consumer, Handler, is_async
from bandgate.consumers.errors import MalformedMessage, Reject, Requeue, Retry, TimeLimitExceeded
from bandgate.consumers.message import Message
from bandgate.core.ledger import Verdict, generation_of
from bandgate.core.ledger_follower import LedgerFollower
from bandgate.topology.model import FailureStrategy, RetryPolicy

log = logging.getLogger(__name__)

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
    `attempt` after `delay` seconds (see "Failures on ordered queues" above).
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
    """Give it back to its queue unhandled, counted by the broker as a delivery (`Requeue`)."""

    reason: str


@dataclass(frozen=True)
class Tombstoned:
    """Not run: the ledger says this copy was cancelled, superseded by a replacement, or (for
    a consumer that dedupes) already handled. Acked like a success."""

    verdict: Verdict

    @property
    def reason(self) -> str:
        return f"{self.verdict}, says the tombstone ledger"


Outcome = Ack | RetryLater | DeadLetter | GiveBack | Tombstoned


def outcome_name(outcome: Outcome) -> str:
    """The outcome's name in metrics, spans and logs."""
    if isinstance(outcome, RetryLater):
        return "retry"
    if isinstance(outcome, DeadLetter):
        return "dead-letter"
    if isinstance(outcome, GiveBack):
        return "requeued"
    if isinstance(outcome, Tombstoned):
        return outcome.verdict
    return "ack"


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
    strategy: FailureStrategy | None = None,
) -> Outcome:
    """The outcome of a handler run that raised `error` (None: it returned); `strategy`: the
    failure strategy of an ordered queue (None: not ordered)."""
    if error is None:
        return Ack()
    if isinstance(error, Requeue):
        return GiveBack(error.reason)
    if isinstance(error, Reject):
        return DeadLetter("rejected", describe(error), type(error).__name__)
    if isinstance(error, MalformedMessage):
        return DeadLetter("malformed", describe(error), type(error).__name__)
    if message.attempt >= policy.max_attempts and strategy != "block":
        return DeadLetter(
            cause="max-attempts",
            reason=f"{describe(error)} (attempt {message.attempt} of {policy.max_attempts})",
            error_type=type(error).__name__,
        )
    if strategy == "skip":
        return DeadLetter(
            cause="skipped",
            reason=f"{describe(error)} (failure_strategy skip: dead-lettered at the first "
            "failure, the messages behind it went on)",
            error_type=type(error).__name__,
        )
    if isinstance(error, Retry) and error.delay is not None:
        delay = error.delay
    else:
        delay = backoff_delay(policy, message.attempt, rng)
    return RetryLater(delay=delay, attempt=message.attempt + 1, reason=describe(error))


def within_ladder(outcome: Outcome, message: Message, longest: float | None) -> Outcome:
    """A retry through the delay exchanges waits at most the ladder's `longest` seconds."""
    if longest is None or not isinstance(outcome, RetryLater) or outcome.delay <= longest:
        return outcome
    log.warning(
        "retry delay %g s of message %s is beyond the delay ladder's %g s; using that",
        outcome.delay,
        message.message_id,
        longest,
    )
    return replace(outcome, delay=longest)


def decide(
    consumer: Consumer,
    message: Message,
    error: BaseException | None,
    rng: random.Random | None = None,
    longest_delay: float | None = None,
) -> Outcome:
    """The outcome of a handler run that raised `error` (None: it returned); a retry through
    the delay ladder waits at most `longest_delay` seconds (None: no limit)."""
    spec = consumer.spec
    strategy = spec.effective_failure_strategy if spec.ordered else None
    outcome = after_handler(error, message, consumer.options.retry, rng, strategy)
    return outcome if spec.ordered else within_ladder(outcome, message, longest_delay)


class Tombstones:
    """What a consumer asks the tombstone ledger (`bandgate.core.ledger`): is this copy still
    wanted? The settlement records that an id ran (`bandgate.consumers.settlement`).

    A copy is asked about once, when it reaches the head of its band and is about to run; one
    already running when its tombstone is written runs to its end. A process that cannot read
    the ledger (`LedgerFollower.following` is false) skips nothing it has not already learnt
    of: it does not pretend to know more.
    """

    def __init__(self, follower: LedgerFollower) -> None:
        self.follower = follower

    def verdict(
        self, message: Message, headers: Mapping[str, Any] | None, *, dedupe: bool
    ) -> Verdict | None:
        """Why this copy must not run (None: run it)."""
        return self.follower.view.verdict(
            message.queue, message.message_id, generation_of(headers), dedupe=dedupe
        )


async def invoke(
    handler: Handler,
    message: Message,
    *,
    time_limit: float | None = None,
    executor: Executor | None = None,
    asynchronous: bool | None = None,
) -> None:
    """Run `handler(message)`; `TimeLimitExceeded` when it runs past `time_limit` seconds.

    An async handler is cancelled at the limit. A sync one runs in `executor`'s threads, which
    Python cannot interrupt: at the limit it counts as failed and its slot is freed, but the
    thread runs on until the function returns (logged, so it can be found). A TimeoutError the
    handler raises itself (say, from an HTTP client) stays a TimeoutError. `asynchronous` is
    `is_async(handler)`, when the caller knows it already (it runs on every message).
    """
    if asynchronous is None:
        asynchronous = is_async(handler)
    if time_limit is None:
        await _call(handler, message, asynchronous, executor)
        return
    scope = asyncio.timeout(time_limit)
    try:
        async with scope:
            await _call(handler, message, asynchronous, executor)
    except TimeoutError:
        if not scope.expired():
            raise
        if not asynchronous:
            log.warning(
                "sync handler %s ran past its time limit of %g s on message %s; its thread "
                "cannot be interrupted and keeps running",
                getattr(handler, "__qualname__", repr(handler)),
                time_limit,
                message.message_id,
            )
        raise TimeLimitExceeded(
            f"handler ran past its time limit of {time_limit:g} s and was cancelled"
        ) from None


async def _call(
    handler: Handler, message: Message, asynchronous: bool, executor: Executor | None
) -> None:
    if asynchronous:
        await handler(message)
    else:
        loop = asyncio.get_running_loop()
        context = contextvars.copy_context()  # keeps the trace span in the thread
        await loop.run_in_executor(executor, context.run, handler, message)


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


def _tombstoned(
    consumer: Consumer,
    message: Message,
    tombstones: Tombstones | None,
    headers: Mapping[str, Any] | None,
) -> Tombstoned | None:
    if tombstones is None:
        return None
    verdict = tombstones.verdict(message, headers, dedupe=consumer.options.dedupe)
    return None if verdict is None else Tombstoned(verdict)


class Attempt:
    """One run of a consumer's handler on a message, and what it came to.

    Before a message's first run only (its in-place retries on an ordered queue are not
    deliveries), the tombstone ledger is asked whether the copy is still wanted (with
    `tombstones`; `headers`: the delivery's) and then the delivery limit is checked: `refused`
    says why it does not run. `longest_delay`: the delay ladder's longest delay, in seconds
    (`decide`).
    """

    __slots__ = ("consumer", "message", "refused", "error", "seconds", "longest_delay")

    def __init__(
        self,
        consumer: Consumer,
        message: Message,
        *,
        first: bool = True,
        longest_delay: float | None = None,
        tombstones: Tombstones | None = None,
        headers: Mapping[str, Any] | None = None,
    ) -> None:
        self.consumer = consumer
        self.message = message
        self.longest_delay = longest_delay
        self.refused: Tombstoned | DeadLetter | None = None  # why it does not run
        if first:
            self.refused = _tombstoned(consumer, message, tombstones, headers) or before_handler(
                message, consumer.options.retry
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
        return decide(self.consumer, self.message, self.error, rng, self.longest_delay)


__all__ = [
    "MAX_REASON_CHARS",
    "Ack",
    "Attempt",
    "DeadLetter",
    "DeadLetterCause",
    "GiveBack",
    "Outcome",
    "RetryLater",
    "Tombstoned",
    "Tombstones",
    "after_handler",
    "backoff_delay",
    "before_handler",
    "decide",
    "describe",
    "invoke",
    "outcome_name",
    "run_handler",
    "within_ladder",
]
