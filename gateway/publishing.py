"""The publishing core: route an envelope to its band (now or via the delay ladder) and wait
for the broker's confirm.

Serves the HTTP gateway, Python producers and the consumers' retry and dead-letter paths.
A publish either returns a `Published` (the broker confirmed it) or raises a `PublishFailure`;
nothing in between is ever reported as enqueued.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import aio_pika
import aiormq
from opentelemetry import trace

from gateway.confirm_pipeline import (  # ChannelSet and the factory are part of this API
    ChannelSet,
    Confirmation,
    ConfirmPipeline,
    confirm_channel_factory,
)
from gateway.telemetry import Telemetry, inject_context
from topology import naming, wire
from topology.model import Topology
from topology.wire import Envelope

log = logging.getLogger(__name__)

__all__ = [
    "BrokerRejected",
    "BrokerUnavailable",
    "ChannelSet",
    "ConfirmTimeout",
    "Published",
    "Publisher",
    "PublishFailure",
    "Unroutable",
    "confirm_channel_factory",
]


class PublishFailure(Exception):
    """The broker did not confirm a message; it may or may not have been enqueued."""

    code = "broker_unavailable"


class BrokerUnavailable(PublishFailure):
    code = "broker_unavailable"


class ConfirmTimeout(PublishFailure):
    code = "confirm_timeout"


class BrokerRejected(PublishFailure):
    """The broker nacked the message: a band at its max-length (reject-publish)."""

    code = "queue_full"


class Unroutable(PublishFailure):
    """The broker returned the message: no binding matched, the topology is not applied."""

    code = "unroutable"


@dataclass(frozen=True)
class Published:
    message_id: str
    queue: str
    band: str
    priority: int
    enqueued_at: datetime
    deliver_at: datetime | None


class Publisher:
    """Publishes with publisher confirms through the channel set's confirm pipelines.

    The gateway is CPU-bound, so a publish does little besides the AMQP publish: body plus
    `wire.encode_properties`, with no aio_pika `Message` or `Exchange` object per message; the
    pipeline writes a loop turn's publishes at once (`gateway.confirm_pipeline`). A batch
    shares one deadline, one pipeline and one metrics update per band.
    """

    def __init__(
        self,
        topology: Topology,
        channels: ChannelSet,
        confirm_timeout: float = 5.0,
        telemetry: Telemetry | None = None,
    ) -> None:
        self.topology = topology
        self.channels = channels
        self.confirm_timeout = confirm_timeout
        self.telemetry = telemetry
        self._ladder = topology.ladder

    async def publish(self, envelope: Envelope) -> Published:
        """Publish to the envelope's band, through the delay ladder when it is not yet due."""
        exchange, key, band = self._route(envelope)
        with self._span(envelope, band):
            properties = wire.encode_properties(envelope)
            inject_context(_headers(properties))
            started = time.perf_counter()
            deadline = self._deadline()
            pipeline = await self._pipeline(deadline)
            confirmation = pipeline.publish(exchange, key, envelope.body(), properties)
            await self._settle(confirmation, exchange, key, deadline)
        if (telemetry := self.telemetry) is not None:
            telemetry.series(telemetry.published, envelope.queue, band).inc()
            telemetry.series(telemetry.publish_duration, envelope.queue, band).observe(
                time.perf_counter() - started
            )
        return _published(envelope, band)

    async def publish_many(self, envelopes: Sequence[Envelope]) -> list[Published | PublishFailure]:
        """Publish all at once on one channel (confirms pipelined); one result or failure per
        envelope, in order. Each message's publish duration is the batch's."""
        if not envelopes:
            return []
        if self.telemetry is not None and self.telemetry.tracing:
            # A span per message, each with its own trace context.
            traced = await asyncio.gather(*map(self.publish, envelopes), return_exceptions=True)
            return [_outcome(result) for result in traced]
        started = time.perf_counter()
        deadline = self._deadline()
        try:
            pipeline = await self._pipeline(deadline)
        except PublishFailure as failure:
            return [failure] * len(envelopes)
        trace_headers: dict[str, Any] = {}
        inject_context(trace_headers)
        routes = [self._route(envelope) for envelope in envelopes]
        confirmations = []
        for envelope, (exchange, key, _) in zip(envelopes, routes, strict=True):
            properties = wire.encode_properties(envelope)
            _headers(properties).update(trace_headers)
            confirmations.append(pipeline.publish(exchange, key, envelope.body(), properties))
        _, late = await asyncio.wait(confirmations, timeout=deadline - self._now())
        for confirmation in late:
            confirmation.cancel()
        seconds = time.perf_counter() - started
        out: list[Published | PublishFailure] = []
        counts: dict[tuple[str, str], int] = {}
        for envelope, (exchange, key, band), confirmation in zip(
            envelopes, routes, confirmations, strict=True
        ):
            try:
                _confirmed(confirmation, exchange, key)
            except Exception as exc:
                out.append(self._failure(exc, exchange, key))
                continue
            out.append(_published(envelope, band))
            counts[envelope.queue, band] = counts.get((envelope.queue, band), 0) + 1
        if (telemetry := self.telemetry) is not None:
            for (queue, band), count in counts.items():
                telemetry.series(telemetry.published, queue, band).inc(count)
                histogram = telemetry.series(telemetry.publish_duration, queue, band)
                for _ in range(count):
                    histogram.observe(seconds)
        return out

    async def dead_letter(self, message: aio_pika.Message, queue: str) -> None:
        """Publish `message` to the dead-letter queue of `queue`, confirmed."""
        exchange = naming.dead_letter_exchange(self.topology.exchange)
        deadline = self._deadline()
        pipeline = await self._pipeline(deadline)
        properties = message.properties
        if not properties.message_id:
            properties.message_id = wire.new_message_id()  # returns are matched by it
        confirmation = pipeline.publish(exchange, queue, message.body, properties)
        await self._settle(confirmation, exchange, queue, deadline)

    def _route(self, envelope: Envelope) -> tuple[str, str, str]:
        """(exchange, routing key, band name): the band now, or the delay ladder."""
        band = self.topology.queue(envelope.queue).band_for(envelope.priority).name
        delay_ms = envelope.delay_ms()
        route = (
            self._ladder.route(delay_ms, envelope.queue, envelope.priority) if delay_ms else None
        )
        if route is None:
            return (
                self.topology.exchange,
                naming.routing_key(envelope.queue, envelope.priority),
                band,
            )
        return route.exchange, route.routing_key, band

    def _span(self, envelope: Envelope, band: str) -> AbstractContextManager[object]:
        if self.telemetry is None or not self.telemetry.tracing:
            return nullcontext()
        attributes: dict[str, str | int] = {
            "messaging.system": "rabbitmq",
            "messaging.destination.name": envelope.queue,
            "messaging.message.id": envelope.message_id,
            "bandgate.band": band,
            "bandgate.priority": envelope.priority,
            "bandgate.attempt": envelope.attempt,
        }
        return self.telemetry.tracer.start_as_current_span(
            f"publish {envelope.queue}", kind=trace.SpanKind.PRODUCER, attributes=attributes
        )

    def _deadline(self) -> float:
        return self._now() + self.confirm_timeout

    @staticmethod
    def _now() -> float:
        return asyncio.get_running_loop().time()

    async def _pipeline(self, deadline: float) -> ConfirmPipeline:
        """An open confirm channel's pipeline. The publish deadline covers this too: on a
        half-open or reconnecting connection it waits, and must not stall a publish past
        the timeout."""
        pipeline = self.channels.ready()
        if pipeline is not None:
            return pipeline
        try:
            async with asyncio.timeout_at(deadline):
                return await self.channels.get()
        except Exception as exc:
            raise self._failure(exc, "", "") from None

    async def _settle(
        self, confirmation: Confirmation, exchange: str, routing_key: str, deadline: float
    ) -> None:
        """Wait for the broker's ack by the deadline; a return, nack or timeout raises."""
        try:
            async with asyncio.timeout_at(deadline):
                await confirmation
            _confirmed(confirmation, exchange, routing_key)
        except Exception as exc:
            raise self._failure(exc, exchange, routing_key) from None

    def _failure(self, exc: Exception, exchange: str, routing_key: str) -> PublishFailure:
        """The PublishFailure for what a publish raised; anything else is re-raised."""
        if isinstance(exc, PublishFailure):
            return exc
        if isinstance(exc, TimeoutError):
            return ConfirmTimeout(
                f"the broker did not confirm the message within {self.confirm_timeout:g} s; "
                "it was not accepted (it may still arrive: retry with the same message_id)"
            )
        if isinstance(exc, aiormq.exceptions.PublishError):
            return _unroutable(exchange, routing_key)
        if isinstance(exc, aiormq.exceptions.DeliveryError):
            return BrokerRejected(
                "the broker refused the message (nack): its band is at its max-length; retry later"
            )
        if isinstance(exc, aiormq.exceptions.ChannelNotFoundEntity):
            return Unroutable(
                f"exchange {exchange!r} does not exist: run `bandgate topology apply`"
            )
        if type(exc) is Exception or isinstance(
            exc, aiormq.exceptions.AMQPError | ConnectionError | RuntimeError
        ):
            # A bare Exception is what aiormq sets on pending confirms when a channel closes
            # without a reason.
            log.warning("publish failed: %r", exc)
            return BrokerUnavailable(f"the broker is unavailable: {exc}")
        raise exc


def _confirmed(confirmation: Confirmation, exchange: str, routing_key: str) -> None:
    """Raise unless the broker acked: a cancelled (timed out) publish raises TimeoutError."""
    if confirmation.cancelled():
        raise TimeoutError
    frame = confirmation.result()
    if not isinstance(frame, aiormq.spec.Basic.Ack):
        # Anything but an ack (no confirm at all, a channel without confirms): never report
        # that as enqueued.
        raise _unroutable(exchange, routing_key)


def _unroutable(exchange: str, routing_key: str) -> Unroutable:
    return Unroutable(
        f"no binding for routing key {routing_key!r} on exchange {exchange!r}: "
        "the topology is not applied on this broker (run `bandgate topology apply`)"
    )


def _headers(properties: aiormq.spec.Basic.Properties) -> dict[str, Any]:
    headers = properties.headers
    assert headers is not None  # wire.encode_properties always sets them
    return headers


def _published(envelope: Envelope, band: str) -> Published:
    return Published(
        message_id=envelope.message_id,
        queue=envelope.queue,
        band=band,
        priority=envelope.priority,
        enqueued_at=envelope.enqueued_at,
        deliver_at=envelope.deliver_at,
    )


def _outcome(result: object) -> Published | PublishFailure:
    """A gathered result: a publish's outcome, or the unexpected error re-raised."""
    if isinstance(result, Published | PublishFailure):
        return result
    if isinstance(result, BaseException):
        raise result
    raise TypeError(f"unexpected publish result {result!r}")
