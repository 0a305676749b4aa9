"""The publishing core: route an envelope to its band (now or via the delay ladder) and wait
for the broker's confirm.

Serves the HTTP gateway, Python producers and the consumers' retry and dead-letter paths.
A publish either returns a `Published` (the broker confirmed it) or raises a `PublishFailure`;
nothing in between is ever reported as enqueued.
"""

from __future__ import annotations

import asyncio
import logging
import struct
import time
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any, NamedTuple, Protocol

import aio_pika
import aiormq
from opentelemetry import trace

from bandgate.core.fairness import Fairness
from bandgate.core.protocol.confirms import (  # ChannelSet and the factory are part of this API
    ChannelSet,
    Confirmation,
    FrameTooLarge,
    confirm_channel_factory,
)
from bandgate.core.publish_outcomes import (  # the outcomes are re-exported: this API's
    BrokerRejected,
    BrokerUnavailable,
    ConfirmLost,
    ConfirmTimeout,
    InvalidMessage,
    MessageTooLarge,
    NotEnqueued,
    OutcomeUnknown,
    Published,
    PublishFailure,
    TopologyMissing,
    UnknownQueue,
    Unroutable,
    check_acked,
    failure_of,
)
from bandgate.core.telemetry import Telemetry, inject_context
from bandgate.topology import naming, wire
from bandgate.topology.model import Topology, UnknownQueueError
from bandgate.topology.wire import Envelope

log = logging.getLogger(__name__)

__all__ = [
    "BrokerRejected",
    "BrokerUnavailable",
    "ChannelSet",
    "ConfirmLost",
    "ConfirmTimeout",
    "InvalidMessage",
    "MessageTooLarge",
    "NotEnqueued",
    "OutcomeUnknown",
    "PublishChannels",
    "PublishPipeline",
    "Published",
    "Publisher",
    "PublishFailure",
    "TopologyMissing",
    "UnknownQueue",
    "Unroutable",
    "confirm_channel_factory",
]


_Properties = aiormq.spec.Basic.Properties


class PublishPipeline(Protocol):
    """What a publish is handed to: a `ConfirmPipeline` on a broker's confirm channel, or the
    in-memory broker of `bandgate.testing`. Its future resolves with the broker's answer
    (`aiormq.spec.Basic.Ack` when confirmed; `check_acked` reads it)."""

    @property
    def is_closed(self) -> bool: ...

    def publish(
        self, exchange: str, routing_key: str, body: bytes, properties: _Properties
    ) -> Confirmation: ...


class PublishChannels(Protocol):
    """Where a `Publisher` gets its pipelines: a `ChannelSet` of confirm channels, or the
    in-memory broker of `bandgate.testing` (the one seam at which publishing meets a broker)."""

    def ready(self) -> PublishPipeline | None: ...

    async def get(self) -> PublishPipeline: ...

    async def close(self) -> None: ...


class Publisher:
    """Publishes with publisher confirms through the channel set's confirm pipelines.

    The gateway is CPU-bound, so a publish does little besides the AMQP publish: body plus
    `wire.encode_properties`, with no aio_pika `Message` or `Exchange` object per message; the
    pipeline writes a loop turn's publishes at once (`core.protocol.confirms`). A batch
    shares one deadline, one pipeline and one metrics update per band.
    """

    def __init__(
        self,
        topology: Topology,
        channels: PublishChannels,
        confirm_timeout: float = 5.0,
        telemetry: Telemetry | None = None,
    ) -> None:
        self.topology = topology
        self.channels = channels
        self.confirm_timeout = confirm_timeout
        self.telemetry = telemetry
        self._ladder = topology.ladder
        # Queues whose order is publish order: their messages go without the AMQP priority.
        self._fifo = {name for name, spec in topology.queues.items() if spec.ordered}
        self.fairness = Fairness(
            [
                (spec.name, band.name)
                for spec in topology.queues.values()
                for band in spec.bands
                if band.fair
            ]
        )

    async def publish(self, envelope: Envelope) -> Published:
        """Publish to the envelope's band, through the delay ladder when it is not yet due.

        Raises `InvalidMessage` before anything is sent when AMQP cannot carry the message."""
        outgoing = self._prepare(envelope)
        with self._span(envelope, outgoing.band):
            inject_context(_headers(outgoing.properties))
            started = time.perf_counter()
            deadline = self._deadline()
            pipeline = await self._pipeline(deadline)
            confirmation = _submit(pipeline, outgoing)
            await self._settle(confirmation, outgoing.exchange, outgoing.routing_key, deadline)
        if (telemetry := self.telemetry) is not None:
            telemetry.series(telemetry.published, envelope.queue, outgoing.band).inc()
            telemetry.series(telemetry.publish_duration, envelope.queue, outgoing.band).observe(
                time.perf_counter() - started
            )
        return _published(envelope, outgoing.band)

    async def publish_many(self, envelopes: Sequence[Envelope]) -> list[Published | PublishFailure]:
        """Publish all at once on one channel (confirms pipelined); one result or failure per
        envelope, in order. Every message is encoded and checked before any is sent, so an
        invalid one fails alone. Each message's publish duration is the batch's."""
        started = time.perf_counter()
        out = self._prepare_all(envelopes)
        sending = [(index, item) for index, item in enumerate(out) if isinstance(item, _Outgoing)]
        if not sending:
            return _results(out)
        if self.telemetry is not None and self.telemetry.tracing:
            # A span per message, each with its own trace context.
            traced = await asyncio.gather(
                *(self.publish(item.envelope) for _, item in sending), return_exceptions=True
            )
            for (index, _), result in zip(sending, traced, strict=True):
                out[index] = _outcome(result)
            return _results(out)
        deadline = self._deadline()
        try:
            pipeline = await self._pipeline(deadline)
        except PublishFailure as failure:
            for index, _ in sending:
                out[index] = failure
            return _results(out)
        trace_headers: dict[str, Any] = {}
        inject_context(trace_headers)
        waiting: list[tuple[int, _Outgoing, Confirmation]] = []
        for index, outgoing in sending:
            _headers(outgoing.properties).update(trace_headers)
            try:
                waiting.append((index, outgoing, _submit(pipeline, outgoing)))
            except InvalidMessage as invalid:
                out[index] = invalid
        if waiting:
            confirmations = [confirmation for _, _, confirmation in waiting]
            _, late = await asyncio.wait(confirmations, timeout=deadline - self._now())
            for confirmation in late:
                confirmation.cancel()
        seconds = time.perf_counter() - started
        counts: dict[tuple[str, str], int] = {}
        for index, outgoing, confirmation in waiting:
            try:
                check_acked(confirmation, outgoing.exchange, outgoing.routing_key)
            except Exception as exc:
                out[index] = failure_of(
                    exc, outgoing.exchange, outgoing.routing_key, self.confirm_timeout
                )
                continue
            envelope = outgoing.envelope
            out[index] = _published(envelope, outgoing.band)
            counts[envelope.queue, outgoing.band] = (
                counts.get((envelope.queue, outgoing.band), 0) + 1
            )
        if (telemetry := self.telemetry) is not None:
            for (queue, band), count in counts.items():
                telemetry.series(telemetry.published, queue, band).inc(count)
                histogram = telemetry.series(telemetry.publish_duration, queue, band)
                for _ in range(count):
                    histogram.observe(seconds)
        return _results(out)

    async def dead_letter(self, message: aio_pika.Message, queue: str) -> None:
        """Publish `message` to the dead-letter queue of `queue`, confirmed."""
        exchange = naming.dead_letter_exchange(self.topology.exchange)
        deadline = self._deadline()
        pipeline = await self._pipeline(deadline)
        properties = message.properties
        if not properties.message_id:
            properties.message_id = wire.new_message_id()  # returns are matched by it
        confirmation = _send(pipeline, exchange, queue, message.body, properties)
        await self._settle(confirmation, exchange, queue, deadline)

    async def record(self, entry: bytes) -> None:
        """Append an encoded entry to the tombstone ledger (`core.ledger`), confirmed."""
        stream = naming.ledger_stream(self.topology.exchange)
        deadline = self._deadline()
        pipeline = await self._pipeline(deadline)
        properties = aiormq.spec.Basic.Properties(
            content_type=wire.CONTENT_TYPE,
            delivery_mode=wire.PERSISTENT,
            message_id=wire.new_message_id(),  # returns are matched by it
            timestamp=wire.now(),
        )
        confirmation = _send(pipeline, "", stream, entry, properties)
        await self._settle(confirmation, "", stream, deadline)

    def _prepare_all(
        self, envelopes: Sequence[Envelope]
    ) -> list[Published | PublishFailure | _Outgoing]:
        """Route and encode every message of a batch. One that cannot be, or that repeats an
        earlier message_id (the broker's returns are matched to publishes by it), fails alone."""
        out: list[Published | PublishFailure | _Outgoing] = []
        seen: set[str] = set()
        for envelope in envelopes:
            try:
                if envelope.message_id in seen:
                    raise InvalidMessage(
                        f"message_id {envelope.message_id!r} is used earlier in this batch",
                        "message_id",
                        "duplicate_message_id",
                    )
                out.append(self._prepare(envelope))
                seen.add(envelope.message_id)
            except InvalidMessage as invalid:
                out.append(invalid)
        return out

    def _prepare(self, envelope: Envelope) -> _Outgoing:
        """Route and encode a message, or raise `InvalidMessage`; nothing is sent here."""
        try:
            exchange, key, band = self._route(envelope)
        except UnknownQueueError as exc:
            raise UnknownQueue(str(exc), "queue") from None
        try:
            body = envelope.body()
        except TypeError as exc:  # orjson: nested deeper than 254 levels, or not JSON data
            raise InvalidMessage(f"payload cannot be written as JSON: {exc}", "payload") from None
        properties = wire.encode_properties(
            envelope, broker_priority=envelope.queue not in self._fifo
        )
        return _Outgoing(envelope, exchange, key, band, body, properties)

    def _route(self, envelope: Envelope) -> tuple[str, str, str]:
        """(exchange, routing key, band name): the band now, or through the delay ladder,
        which ends in the band; in both, its noisy lane when the tenant is noisy
        (`core.fairness`): a retry or a delayed message of a noisy tenant too."""
        queue, priority = envelope.queue, envelope.priority
        band = self.topology.queue(queue).band_for(priority).name
        noisy = self.fairness.noisy(queue, band, envelope.tenant)
        delay_ms = envelope.delay_ms()
        route = self._ladder.route(delay_ms, queue, priority, noisy=noisy) if delay_ms else None
        if route is not None:
            return route.exchange, route.routing_key, band
        if noisy:
            return self.topology.exchange, naming.noisy_routing_key(queue, priority), band
        return self.topology.exchange, naming.routing_key(queue, priority), band

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

    async def _pipeline(self, deadline: float) -> PublishPipeline:
        """An open confirm channel's pipeline. The publish deadline covers this too: on a
        half-open or reconnecting connection it waits, and must not stall a publish past
        the timeout. Nothing was sent yet, so any failure here is `BrokerUnavailable`."""
        pipeline = self.channels.ready()
        if pipeline is not None:
            return pipeline
        try:
            async with asyncio.timeout_at(deadline):
                return await self.channels.get()
        except PublishFailure:
            raise
        except TimeoutError:
            raise BrokerUnavailable(
                f"no publishing channel to the broker within {self.confirm_timeout:g} s"
            ) from None
        except (aiormq.exceptions.AMQPError, ConnectionError, RuntimeError) as exc:
            raise BrokerUnavailable(f"the broker is unavailable: {exc!r}") from None

    async def _settle(
        self, confirmation: Confirmation, exchange: str, routing_key: str, deadline: float
    ) -> None:
        """Wait for the broker's ack by the deadline; a return, nack or timeout raises.

        The deadline is a timer that cancels the confirmation, as `asyncio.timeout_at` would
        have the task do, at a fraction of its cost per message (its context manager was 4.5 %
        of the gateway's CPU per single-message publish, profiled under wrk); a cancelled
        confirmation in a task nobody cancelled is the timeout."""
        timer = asyncio.get_running_loop().call_at(deadline, confirmation.cancel)
        try:
            await confirmation
            check_acked(confirmation, exchange, routing_key)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise
            timeout = TimeoutError()
            raise failure_of(timeout, exchange, routing_key, self.confirm_timeout) from None
        except Exception as exc:
            raise failure_of(exc, exchange, routing_key, self.confirm_timeout) from None
        finally:
            timer.cancel()


class _Outgoing(NamedTuple):
    """A message routed and encoded, ready to send (a tuple: made once per message, it costs
    a third of a frozen dataclass)."""

    envelope: Envelope
    exchange: str
    routing_key: str
    band: str
    body: bytes
    properties: aiormq.spec.Basic.Properties


def _submit(pipeline: PublishPipeline, outgoing: _Outgoing) -> Confirmation:
    return _send(
        pipeline, outgoing.exchange, outgoing.routing_key, outgoing.body, outgoing.properties
    )


def _send(
    pipeline: PublishPipeline,
    exchange: str,
    routing_key: str,
    body: bytes,
    properties: aiormq.spec.Basic.Properties,
) -> Confirmation:
    """Queue one publish on the pipeline, or raise `InvalidMessage` with nothing queued."""
    try:
        return pipeline.publish(exchange, routing_key, body, properties)
    except FrameTooLarge as exc:
        raise MessageTooLarge(str(exc), "headers") from None
    except (struct.error, OverflowError, TypeError, ValueError) as exc:
        # pamqp's own writer, for header values bandgate does not write itself.
        raise InvalidMessage(f"the headers cannot be written as AMQP: {exc}", "headers") from None


def _results(out: list[Published | PublishFailure | _Outgoing]) -> list[Published | PublishFailure]:
    """Every slot settled; an `_Outgoing` left over would be a bug, never a success."""
    results: list[Published | PublishFailure] = []
    for item in out:
        if isinstance(item, _Outgoing):
            raise AssertionError(f"message {item.envelope.message_id} was never settled")
        results.append(item)
    return results


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
