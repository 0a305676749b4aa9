"""One consumer at work: a channel and AMQP consumer per band, the dispatcher, handler tasks.

Bands are consumed hottest first, each on its own channel so each has its own prefetch (qos is
per channel and consumer). Deliveries go into the dispatcher's buffers; the run loop starts a
task for each message the dispatcher hands out; each task runs the pipeline (read, delivery
limit, handler under its time limit, decide) and settles the outcome before freeing its slot.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from aio_pika.abc import (
    AbstractChannel,
    AbstractConnection,
    AbstractIncomingMessage,
    AbstractQueue,
    ConsumerTag,
)
from aio_pika.exceptions import ChannelInvalidStateError
from opentelemetry import trace

from consumers.app import Consumer
from consumers.dispatch import Dispatcher, DispatcherClosed, make_policy
from consumers.errors import MalformedMessage, Reject, Retry
from consumers.invoke import invoke
from consumers.message import Message, read_message
from consumers.outcome import (
    Ack,
    DeadLetter,
    Outcome,
    after_handler,
    before_handler,
    describe,
)
from consumers.settle import Settler
from consumers.telemetry import ConsumerTelemetry, outcome_name
from topology import naming, wire
from topology.model import Band

log = logging.getLogger(__name__)


@dataclass(eq=False)
class Delivery:
    band: int
    incoming: AbstractIncomingMessage
    key: str | None


def partition_key(incoming: AbstractIncomingMessage) -> str | None:
    value = (incoming.headers or {}).get(wire.PARTITION_KEY)
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)


def channel_gone(incoming: AbstractIncomingMessage) -> bool:
    """True when the delivery's channel closed (the broker took the message back then)."""
    try:
        return incoming.channel.is_closed
    except ChannelInvalidStateError:
        return True


class ConsumerRunner:
    def __init__(
        self,
        consumer: Consumer,
        connection: AbstractConnection,
        settler: Settler,
        *,
        concurrency: int | None = None,
        prime_timeout: float = 2.0,
        refill_wait: float = 0.1,
        telemetry: ConsumerTelemetry | None = None,
    ) -> None:
        self.consumer = consumer
        self.spec = consumer.spec
        self.connection = connection
        self.settler = settler
        self.concurrency = concurrency or consumer.options.concurrency
        self.prefetch = consumer.options.prefetch(self.spec, self.concurrency)
        self.prime_timeout = prime_timeout
        self.telemetry = telemetry or ConsumerTelemetry()
        policy = make_policy(consumer.options.policy, self.spec.weights())
        self.dispatcher: Dispatcher[Delivery] = Dispatcher(
            len(self.spec.bands),
            policy,
            self.concurrency,
            key=lambda delivery: delivery.key,
            refill_wait=refill_wait,
            on_dry=self._on_dry,
        )
        self._executor = (
            None
            if consumer.is_async
            else ThreadPoolExecutor(
                self.concurrency, thread_name_prefix=f"bandgate-{self.spec.name}"
            )
        )
        self._channels: list[AbstractChannel] = []
        self._probe_channel: AbstractChannel | None = None
        self._probes: set[asyncio.Task[None]] = set()
        self._subscriptions: list[tuple[AbstractQueue, ConsumerTag]] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._arrived = [0] * len(self.spec.bands)
        self._arrival = asyncio.Event()
        self._stopping = False

    @property
    def in_flight(self) -> frozenset[asyncio.Task[None]]:
        return frozenset(self._tasks)

    async def start(self) -> None:
        """Consume every band, hottest first; a band's first prefetch arrives before the next.

        Waiting for it keeps the start order of a backlog strict: otherwise colder deliveries
        could reach the free slots before the hotter ones (see `consumers.dispatch`).
        """
        self._probe_channel = await self.connection.channel()
        for index, band in enumerate(self.spec.bands):
            channel = await self.connection.channel()
            self._channels.append(channel)
            await channel.set_qos(prefetch_count=self.prefetch[index])
            queue = await channel.declare_queue(
                naming.band_queue(self.spec.name, band.name), passive=True
            )
            ready = queue.declaration_result.message_count or 0
            tag = await queue.consume(self._on_delivery(index))
            self._subscriptions.append((queue, tag))
            if ready:
                await self._prime(index, min(ready, self.prefetch[index]))
        log.info(
            "consuming %s with %s (concurrency %d, policy %s, prefetch %s)",
            self.spec.name,
            self.consumer.name,
            self.concurrency,
            self.consumer.options.policy,
            dict(zip((band.name for band in self.spec.bands), self.prefetch, strict=True)),
        )

    async def _prime(self, index: int, expected: int) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.prime_timeout
        while self._arrived[index] < expected:
            remaining = deadline - loop.time()
            if remaining <= 0:
                log.debug("band %d: %d of %d arrived", index, self._arrived[index], expected)
                return
            self._arrival.clear()
            try:
                await asyncio.wait_for(self._arrival.wait(), remaining)
            except TimeoutError:
                return

    def _on_dry(self, index: int) -> None:
        if self._probe_channel is not None and not self._stopping:
            probe = asyncio.create_task(self._probe(index))
            self._probes.add(probe)
            probe.add_done_callback(self._probes.discard)

    async def _probe(self, index: int) -> None:
        """A backlogged band ran dry: if the broker has nothing ready for it, stop waiting."""
        assert self._probe_channel is not None
        name = naming.band_queue(self.spec.name, self.spec.bands[index].name)
        try:
            channel = await self._probe_channel.get_underlay_channel()
            declared = await channel.queue_declare(name, passive=True)
        except Exception as exc:  # the wait just runs its course
            log.debug("probing %s: %r", name, exc)
            return
        if not declared.message_count:
            self.dispatcher.settle(index)

    def _on_delivery(self, index: int) -> Callable[[AbstractIncomingMessage], Awaitable[None]]:
        async def on_delivery(incoming: AbstractIncomingMessage) -> None:
            if self._stopping:
                # Sent before the broker saw our cancel: give it straight back.
                await self.settler.give_back(incoming)
                return
            self._arrived[index] += 1
            self._arrival.set()
            self.dispatcher.put(index, Delivery(index, incoming, partition_key(incoming)))

        return on_delivery

    async def run(self) -> None:
        """Start a handler task for each message the dispatcher hands out, until closed."""
        while True:
            try:
                index, delivery = await self.dispatcher.take()
            except DispatcherClosed:
                return
            if channel_gone(delivery.incoming):
                # The connection dropped since it arrived; it is back in its band already.
                self.dispatcher.done(index, delivery)
                continue
            task = asyncio.create_task(self._process(delivery))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _process(self, delivery: Delivery) -> None:
        band = self.spec.bands[delivery.band]
        incoming = delivery.incoming
        try:
            await self._pipeline(incoming, band)
        except asyncio.CancelledError:
            # Shut down past the grace period: not handled, so it goes back to its band.
            await self.settler.give_back(incoming)
            raise
        except Exception:
            log.exception("bug while processing message %s; returning it", incoming.message_id)
            await self.settler.give_back(incoming)
        finally:
            self.dispatcher.done(delivery.band, delivery)

    async def _pipeline(self, incoming: AbstractIncomingMessage, band: Band) -> None:
        """Read, check the delivery limit, run the handler, decide, settle."""
        policy = self.consumer.options.retry
        try:
            message = read_message(incoming, self.spec, band)
        except MalformedMessage as exc:
            message = read_message(incoming, self.spec, band, decode=False)
            log.error("dead-lettering malformed message %s: %s", message.message_id, exc)
            outcome: Outcome = after_handler(exc, message, policy)
            await self.settler.settle(incoming, message, band, outcome)
            self.telemetry.finished(message, outcome, None)
            return
        with self.telemetry.span(message, incoming.headers) as span:
            seconds: float | None = None
            limit = before_handler(message, policy)
            if limit is not None:
                log.error("dead-lettering message %s: %s", message.message_id, limit.reason)
                outcome = limit
            else:
                self.telemetry.started(message, incoming.headers)
                started = time.perf_counter()
                error = await self._run_handler(message)
                seconds = time.perf_counter() - started
                outcome = after_handler(error, message, policy)
                if error is not None:
                    self._log_failure(message, error, outcome)
                    span.record_exception(error)
            span.set_attribute("bandgate.outcome", outcome_name(outcome))
            if not isinstance(outcome, Ack):
                span.set_status(trace.StatusCode.ERROR, getattr(outcome, "reason", ""))
            await self.settler.settle(incoming, message, band, outcome)
        self.telemetry.finished(message, outcome, seconds)

    async def _run_handler(self, message: Message) -> BaseException | None:
        """The handler's exception, or None when it returned."""
        try:
            await invoke(
                self.consumer.handler,
                message,
                time_limit=self.consumer.options.time_limit,
                executor=self._executor,
            )
        except asyncio.CancelledError as exc:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise  # the worker is stopping
            return exc  # the handler's own business: a failure like any other
        except Exception as exc:
            return exc
        return None

    def _log_failure(self, message: Message, error: BaseException, outcome: Outcome) -> None:
        log.log(
            logging.ERROR if isinstance(outcome, DeadLetter) else logging.WARNING,
            "%s failed on message %s (attempt %d, band %s): %s -> %s",
            self.consumer.name,
            message.message_id,
            message.attempt,
            message.band,
            describe(error),
            outcome,
            exc_info=not isinstance(error, Retry | Reject),
        )

    async def stop_consuming(self) -> None:
        """Cancel the band consumers and give back every message not started yet."""
        self._stopping = True
        for queue, tag in self._subscriptions:
            try:
                await queue.cancel(tag)
            except Exception as exc:  # a closed channel has no consumer left to cancel
                log.debug("cancelling consumer %s: %r", tag, exc)
        returned = self.dispatcher.close()
        for _, delivery in returned:
            await self.settler.give_back(delivery.incoming)
        if returned:
            log.info("returned %d unstarted messages of %s", len(returned), self.spec.name)

    async def abort(self) -> None:
        """Cancel the handlers still running; their messages go back to their bands."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def close(self) -> None:
        for probe in list(self._probes):
            probe.cancel()
        await asyncio.gather(*self._probes, return_exceptions=True)
        channels = [*self._channels, *([self._probe_channel] if self._probe_channel else [])]
        for channel in channels:
            if not channel.is_closed:
                try:
                    await channel.close()
                except Exception as exc:
                    log.debug("closing a band channel: %r", exc)
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
