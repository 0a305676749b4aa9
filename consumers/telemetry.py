"""Traces and metrics of handled messages, on the instruments `gateway.telemetry` defines.

The handler's span continues the trace whose context the message carries (the publish that
produced it, or the attempt that retried it), and a retry or dead letter published while it is
open becomes its child, so one trace shows a message's whole life.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from opentelemetry import trace

from bandgate.consumers.message import Message
from bandgate.consumers.outcome import Ack, DeadLetter, GiveBack, Outcome, RetryLater, Tombstoned
from bandgate.core.telemetry import Telemetry, extract_context
from bandgate.topology import wire

_NO_SPAN = nullcontext(trace.INVALID_SPAN)


def outcome_name(outcome: Outcome) -> str:
    if isinstance(outcome, RetryLater):
        return "retry"
    if isinstance(outcome, DeadLetter):
        return "dead-letter"
    if isinstance(outcome, GiveBack):
        return "requeued"
    if isinstance(outcome, Tombstoned):
        return outcome.verdict
    return "ack"


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
