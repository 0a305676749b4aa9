"""One message's way from its start to its settlement: read, run, decide, settle, in a span.

The run loop hands each delivery the dispatcher starts to `Pipeline.process`, in a task of its
own. The delivery is read into a `Message` (a malformed one is dead-lettered without running
the handler), its handler runs through `consumers.decide.Attempt` in the span that continues the
message's trace (`consumers.telemetry`), and the outcome is settled (`consumers.settle`). On an
ordered queue a `RetryLater` runs again here, in place, after its back-off (`consumers.ordering`).
A message whose copy was not confirmed, or whose handler the shutdown cancelled, goes back to
its queue (`consumers.handback`). Its slot and partition key stay taken until it is settled,
retries in place included. A copy the tombstone ledger says is cancelled, superseded or (when
the consumer dedupes) already handled is acked without running (`consumers.tombstones`).
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import Executor
from dataclasses import replace

from opentelemetry import trace

from bandgate.consumers.consumer import Consumer
from bandgate.consumers.decide import Attempt, decide
from bandgate.consumers.delivery import Delivery
from bandgate.consumers.dispatch import Dispatcher
from bandgate.consumers.errors import MalformedMessage, Reject, Retry
from bandgate.consumers.handback import HandBack
from bandgate.consumers.lifetime import Lifetime
from bandgate.consumers.message import Message, read_message
from bandgate.consumers.outcome import (
    Ack,
    DeadLetter,
    GiveBack,
    Outcome,
    RetryLater,
    Tombstoned,
    describe,
)
from bandgate.consumers.settle import Settled, Settler
from bandgate.consumers.telemetry import ConsumerTelemetry, outcome_name
from bandgate.consumers.tombstones import Tombstones
from bandgate.topology.model import Band

log = logging.getLogger(__name__)


class Pipeline:
    def __init__(
        self,
        consumer: Consumer,
        settler: Settler,
        handback: HandBack,
        dispatcher: Dispatcher[Delivery],
        lifetime: Lifetime,
        telemetry: ConsumerTelemetry,
        executor: Executor | None = None,
        tombstones: Tombstones | None = None,
    ) -> None:
        self.consumer = consumer
        self.spec = consumer.spec
        self.settler = settler
        self.handback = handback
        self.dispatcher = dispatcher
        self.lifetime = lifetime
        self.telemetry = telemetry
        self.executor = executor  # sync handlers' threads
        self.tombstones = tombstones
        self.dedupe = consumer.options.dedupe

    async def process(self, delivery: Delivery) -> Outcome | None:
        """Handle and settle a started delivery, then free its slot; the last outcome settled
        (None: it went back to its queue unsettled)."""
        try:
            return await self._handle(delivery, self.spec.bands[delivery.band])
        except asyncio.CancelledError:
            # Shut down past the grace period: not handled, so it goes back to its band.
            await self.handback.give_back(delivery)
            raise
        except Exception:
            log.exception(
                "bug while processing message %s; returning it", delivery.incoming.message_id
            )
            await self.handback.give_back(delivery)
            return None
        finally:
            delivery.subscription.finished()
            self.dispatcher.done(delivery.band, delivery)

    def _in_place(self, outcome: Outcome) -> bool:
        """Whether the outcome is a retry this worker runs itself (ordered queues)."""
        return self.spec.ordered and isinstance(outcome, RetryLater)

    async def _handle(self, delivery: Delivery, band: Band) -> Outcome | None:
        incoming = delivery.incoming
        try:
            message = read_message(incoming, self.spec, band)
        except MalformedMessage as exc:
            message = read_message(incoming, self.spec, band, decode=False)
            log.error("dead-lettering malformed message %s: %s", message.message_id, exc)
            outcome = decide(self.consumer, message, exc)
            outcome = await self._settle(delivery, message, band, outcome)
            self.telemetry.finished(message, outcome, None)
            return outcome
        if self.tombstones is not None:
            verdict = self.tombstones.verdict(message, incoming.headers, dedupe=self.dedupe)
            if verdict is not None:
                return await self._skip(delivery, message, band, Tombstoned(verdict))
        first = True
        while True:
            outcome = await self._attempt(delivery, message, band, first=first)
            if not self._in_place(outcome):
                return outcome
            assert isinstance(outcome, RetryLater)
            if not await self.lifetime.pause(outcome.delay):
                return None  # stopping: the message goes back with its channel, unsettled
            message = replace(message, attempt=outcome.attempt)
            first = False

    async def _attempt(
        self, delivery: Delivery, message: Message, band: Band, *, first: bool
    ) -> Outcome:
        """One run of the handler, in its own span, settled unless retried in place."""
        headers = delivery.incoming.headers
        attempt = Attempt(self.consumer, message, first=first)
        with self.telemetry.span(message, headers) as span:
            if attempt.refused is not None:
                log.error(
                    "dead-lettering message %s: %s", message.message_id, attempt.refused.reason
                )
            elif first:
                self.telemetry.started(message, headers)
            outcome = await attempt.run(self.executor)
            if attempt.error is not None:
                self._log_failure(message, attempt.error, outcome)
                span.record_exception(attempt.error)
            span.set_attribute("bandgate.outcome", outcome_name(outcome))
            if not isinstance(outcome, Ack):
                span.set_status(trace.StatusCode.ERROR, outcome.reason)
            if not self._in_place(outcome):
                outcome = await self._settle(delivery, message, band, outcome)
        self.telemetry.finished(message, outcome, attempt.seconds)
        return outcome

    async def _skip(
        self, delivery: Delivery, message: Message, band: Band, outcome: Tombstoned
    ) -> Outcome:
        """Ack a copy the ledger says must not run, in a span of its own with an event."""
        with self.telemetry.span(message, delivery.incoming.headers) as span:
            span.add_event("bandgate.tombstoned", {"bandgate.verdict": outcome.verdict})
            span.set_attribute("bandgate.outcome", outcome.verdict)
            settled = await self._settle(delivery, message, band, outcome)
        log.info("not running message %s of %s: %s", message.message_id, message.queue, outcome)
        self.telemetry.finished(message, settled, None)
        return settled

    async def _settle(
        self, delivery: Delivery, message: Message, band: Band, outcome: Outcome
    ) -> Outcome:
        """Carry out `outcome`; what was carried out (a copy not confirmed: given back)."""
        if isinstance(outcome, GiveBack):
            await self.handback.give_back(delivery, counted=True)
            return outcome
        if self.dedupe and self.tombstones is not None and isinstance(outcome, Ack):
            await self.tombstones.ran(message, delivery.incoming.headers)
        settled = await self.settler.settle(delivery.incoming, message, band, outcome)
        if settled is Settled.UNCONFIRMED:
            await self.handback.give_back(delivery)
            return GiveBack(f"its {outcome_name(outcome)} copy was not confirmed")
        return outcome

    def _log_failure(self, message: Message, error: BaseException, outcome: Outcome) -> None:
        log.log(
            logging.ERROR if isinstance(outcome, DeadLetter) else logging.WARNING,
            "%s failed on message %s (attempt %d, band %s): %s -> %s%s",
            self.consumer.name,
            message.message_id,
            message.attempt,
            message.band,
            describe(error),
            outcome,
            " in place (ordered queue)" if self._in_place(outcome) else "",
            # The error itself: this runs after its `except` block, where sys.exc_info() is
            # empty and `exc_info=True` printed "NoneType: None" under every failure.
            exc_info=None if isinstance(error, Retry | Reject) else error,
        )


__all__ = ["Pipeline"]
