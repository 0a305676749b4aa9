"""The publishing core: route an envelope to its band (now or via the delay ladder) and wait
for the broker's confirm.

Serves the HTTP gateway, Python producers and the consumers' retry and dead-letter paths.
A publish either returns a `Published` (the broker confirmed it) or raises a `PublishFailure`;
nothing in between is ever reported as enqueued.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from datetime import datetime

import aio_pika
import aiormq
from aio_pika.abc import AbstractChannel
from opentelemetry import trace

from gateway.telemetry import Telemetry, inject_context
from topology import naming, wire
from topology.model import Topology
from topology.wire import Envelope

log = logging.getLogger(__name__)

ChannelFactory = Callable[[], Awaitable[AbstractChannel]]


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


class ChannelSet:
    """A few confirm-mode channels shared round-robin.

    One channel carries many publishes at once (confirms are matched by delivery tag), so
    there is no exclusive checkout; a channel the broker closed is replaced on next use.
    """

    def __init__(self, factory: ChannelFactory, size: int = 4) -> None:
        self._factory = factory
        self._channels: list[AbstractChannel | None] = [None] * size
        self._turn = itertools.cycle(range(size))
        self._locks = [asyncio.Lock() for _ in range(size)]

    async def get(self) -> AbstractChannel:
        index = next(self._turn)
        channel = self._channels[index]
        if channel is not None and not channel.is_closed:
            return channel
        async with self._locks[index]:
            channel = self._channels[index]
            if channel is None or channel.is_closed:
                channel = await self._factory()
                self._channels[index] = channel
            return channel

    async def close(self) -> None:
        for channel in self._channels:
            if channel is not None and not channel.is_closed:
                await channel.close()
        self._channels = [None] * len(self._channels)


def confirm_channel_factory(connection: aio_pika.abc.AbstractConnection) -> ChannelFactory:
    async def open_channel() -> AbstractChannel:
        return await connection.channel(publisher_confirms=True, on_return_raises=True)

    return open_channel


class Publisher:
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

    async def publish(self, envelope: Envelope) -> Published:
        """Publish to the envelope's band, through the delay ladder when it is not yet due."""
        spec = self.topology.queue(envelope.queue)
        band = spec.band_for(envelope.priority)
        route = self.topology.ladder.route(envelope.delay_ms(), envelope.queue, envelope.priority)
        if route is None:
            exchange = self.topology.exchange
            key = naming.routing_key(envelope.queue, envelope.priority)
        else:
            exchange, key = route.exchange, route.routing_key
        with self._span(envelope, band.name):
            message = wire.encode(envelope)
            inject_context(message.headers)
            started = time.perf_counter()
            await self._send(exchange, key, message)
        if self.telemetry is not None:
            self.telemetry.published.labels(envelope.queue, band.name).inc()
            self.telemetry.publish_duration.labels(envelope.queue, band.name).observe(
                time.perf_counter() - started
            )
        return Published(
            message_id=envelope.message_id,
            queue=envelope.queue,
            band=band.name,
            priority=envelope.priority,
            enqueued_at=envelope.enqueued_at,
            deliver_at=envelope.deliver_at,
        )

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

    async def publish_many(self, envelopes: Sequence[Envelope]) -> list[Published | PublishFailure]:
        """Publish all at once (confirms pipelined); one result or failure per envelope."""
        results = await asyncio.gather(
            *(self.publish(envelope) for envelope in envelopes), return_exceptions=True
        )
        out: list[Published | PublishFailure] = []
        for result in results:
            if isinstance(result, Published | PublishFailure):
                out.append(result)
            elif isinstance(result, BaseException):
                raise result
        return out

    async def dead_letter(self, message: aio_pika.Message, queue: str) -> None:
        """Publish `message` to the dead-letter queue of `queue`, confirmed."""
        await self._send(naming.dead_letter_exchange(self.topology.exchange), queue, message)

    async def _send(self, exchange: str, routing_key: str, message: aio_pika.Message) -> None:
        try:
            # One deadline covers getting a channel too: a half-open connection must not
            # stall a publish past the timeout.
            async with asyncio.timeout(self.confirm_timeout):
                channel = await self.channels.get()
                target = await channel.get_exchange(exchange, ensure=False)
                await target.publish(message, routing_key, mandatory=True)
        except TimeoutError:
            raise ConfirmTimeout(
                f"the broker did not confirm the message within {self.confirm_timeout:g} s; "
                "it was not accepted (it may still arrive: retry with the same message_id)"
            ) from None
        except aiormq.exceptions.PublishError:
            raise Unroutable(
                f"no binding for routing key {routing_key!r} on exchange {exchange!r}: "
                "the topology is not applied on this broker (run `bandgate topology apply`)"
            ) from None
        except aiormq.exceptions.DeliveryError:
            raise BrokerRejected(
                "the broker refused the message (nack): its band is at its max-length; retry later"
            ) from None
        except aiormq.exceptions.ChannelNotFoundEntity:
            raise Unroutable(
                f"exchange {exchange!r} does not exist: run `bandgate topology apply`"
            ) from None
        except (aiormq.exceptions.AMQPError, ConnectionError, RuntimeError) as exc:
            log.warning("publish failed: %r", exc)
            raise BrokerUnavailable(f"the broker is unavailable: {exc}") from None
