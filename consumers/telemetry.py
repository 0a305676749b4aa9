"""Traces and metrics of handled messages, on the instruments `bandgate.core.telemetry` defines,
and a consumer's slots as gauges (`Occupancy`).

The handler's span continues the trace whose context the message carries (the publish that
produced it, or the attempt that retried it), and a retry or dead letter published while it is
open becomes its child, so one trace shows a message's whole life.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from opentelemetry import trace

from bandgate.consumers.decision import (
    Ack,
    DeadLetter,
    GiveBack,
    Outcome,
    RetryLater,
    Tombstoned,
    outcome_name,
)
from bandgate.consumers.lifetime import Lifetime
from bandgate.consumers.message import Message
from bandgate.consumers.scheduling import Dispatcher, Headroom
from bandgate.consumers.subscription import Subscription
from bandgate.core.telemetry import Telemetry, extract_context
from bandgate.topology import wire

_NO_SPAN = nullcontext(trace.INVALID_SPAN)


class ConsumerTelemetry:
    def __init__(self, telemetry: Telemetry | None = None) -> None:
        self.telemetry = telemetry
        self.tracer = telemetry.tracer if telemetry else trace.get_tracer("bandgate")

    def span(
        self, message: Message, headers: Mapping[str, Any] | None
    ) -> AbstractContextManager[trace.Span]:
        """The handler's span, current while it runs, continuing the message's trace."""
        if self.telemetry is not None and not self.telemetry.tracing:
            # No exporter: no span at all (an SDK span, or even making the message's context
            # current, is a tenth of the worker's CPU per message). Retries and dead letters
            # still continue the trace: their copies carry the message's traceparent header.
            return _NO_SPAN
        attributes: dict[str, str | int | bool] = {
            "messaging.system": "rabbitmq",
            "messaging.destination.name": message.queue,
            "messaging.message.id": message.message_id,
            "bandgate.band": message.band,
            "bandgate.priority": message.priority,
            "bandgate.attempt": message.attempt,
            "bandgate.promoted": message.promoted,
        }
        return self.tracer.start_as_current_span(
            f"process {message.queue}",
            context=extract_context(headers),
            kind=trace.SpanKind.CONSUMER,
            attributes=attributes,
        )

    def started(self, message: Message, headers: Mapping[str, Any] | None) -> None:
        """A handler starts: how long the message waited since it was due."""
        telemetry = self.telemetry
        if telemetry is None:
            return
        due = message.enqueued_at.timestamp()
        deliver_at = (headers or {}).get(wire.DELIVER_AT)
        if isinstance(deliver_at, int) and not isinstance(deliver_at, bool):
            due = max(due, deliver_at / 1000)
        queue, band = message.queue, message.band
        waited = max(0.0, time.time() - due)
        telemetry.series(telemetry.wait_time, queue, band).observe(waited)
        if message.promoted:
            telemetry.series(telemetry.promoted, queue, band).inc()

    def finished(self, message: Message, outcome: Outcome, seconds: float | None) -> None:
        """A message was settled; `seconds` is the handler's run time, None if it did not run."""
        telemetry = self.telemetry
        if telemetry is None:
            return
        queue, band = message.queue, message.band
        if seconds is not None:
            telemetry.series(telemetry.handler_duration, queue, band).observe(seconds)
        telemetry.series(telemetry.consumed, queue, band, outcome_name(outcome)).inc()
        if isinstance(outcome, RetryLater):
            telemetry.series(telemetry.retried, queue, band).inc()
        elif isinstance(outcome, DeadLetter):
            telemetry.series(telemetry.dead_lettered, queue, band, outcome.cause).inc()
        else:
            assert isinstance(outcome, Ack | GiveBack | Tombstoned)


INTERVAL_SECONDS = 1.0


class Occupancy:
    """A consumer's slots as gauges, sampled on the event loop once a second.

    `bandgate_wait_seconds` says how long messages waited, not where. A hot message waits for a
    slot either because cold work holds it, which the headroom's reserve bounds, or because
    hotter work holds every slot it may have, which only more concurrency shortens
    (`bandgate.consumers.scheduling`, Headroom: Erlang C). These gauges tell the two apart:
    each band's `busy_slots` against `slots`, the `reserved_slots` the headroom keeps free for
    hotter arrivals, and `hotter_load`, the slots hotter work held on average over the last
    second. When `hotter_load` nears the slots cold work cannot hold (`slots - max(2, slots //
    4)`: 12 of 16), hot messages queue for their own slots; add concurrency or workers.
    Messages `at_hand` pile up in a band whose slots are all taken.

    Sampled on the loop, not when scraped: the metrics server answers from a thread of its own,
    and the headroom's averages are the loop's to update.
    """

    def __init__(
        self,
        telemetry: Telemetry,
        queue: str,
        bands: Sequence[str],
        subscriptions: Sequence[Sequence[Subscription]],
        dispatcher: Dispatcher[Any],
        headroom: Headroom | None,
    ) -> None:
        """`subscriptions`: each band's queues (its shards), hottest band first."""
        self._dispatcher = dispatcher
        self._subscriptions = subscriptions
        self._headroom = headroom
        series = telemetry.series
        self._slots = series(telemetry.slots, queue)
        self._busy = [series(telemetry.busy_slots, queue, band) for band in bands]
        self._at_hand = [series(telemetry.at_hand, queue, band) for band in bands]
        self._reserved = series(telemetry.reserved_slots, queue)
        self._hotter_load = series(telemetry.hotter_load, queue) if headroom else None

    def sample(self) -> None:
        self._slots.set(self._dispatcher.concurrency)
        for band, queues in enumerate(self._subscriptions):
            self._busy[band].set(sum(subscription.running for subscription in queues))
            self._at_hand[band].set(self._dispatcher.buffered(band))
        headroom = self._headroom
        self._reserved.set(0 if headroom is None else headroom.reserve())
        if headroom is not None and self._hotter_load is not None:
            self._hotter_load.set(headroom.load())

    async def run(self, lifetime: Lifetime) -> None:
        """Sample every `INTERVAL_SECONDS` until the runner stops."""
        while True:
            self.sample()
            if not await lifetime.pause(INTERVAL_SECONDS):
                return


__all__ = ["INTERVAL_SECONDS", "ConsumerTelemetry", "Occupancy"]
