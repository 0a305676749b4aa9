"""One consumer at work: a subscription per band queue, the dispatcher, handler tasks.

Bands are consumed hottest first; every RabbitMQ queue of a band (its queue, or each of its
shards) is a `Subscription` on its own channel with its own prefetch, and all of a band's
deliveries go into that band's buffer, so the waterfall sees a sharded band as one band. The run
loop starts a task for each message the dispatcher hands out; each task runs the pipeline (read,
delivery limit, handler under its time limit, decide) and settles the outcome before freeing its
slot.

Ordered queues (`QueueSpec.ordered`): a message whose partition key is running waits (as on any
queue), failures are retried in place (`consumers.ordering`), messages are given back only by
closing their queue's channel (`consumers.subscription`), and workers share the shards out
(`consumers.balance`). Per-key order within a worker: a key's messages all come from one queue,
in queue order; the dispatcher starts a key's oldest buffered message only when none of the key
runs, and a message's slot and key stay taken until it is settled, retries included. A strictly
serial queue (`ordering_required`) treats all its messages as one key.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

from aio_pika.abc import AbstractChannel, AbstractConnection
from aio_pika.exceptions import ChannelInvalidStateError
from opentelemetry import trace

from bandgate.consumers.app import Consumer
from bandgate.consumers.balance import WorkersQueue, surplus
from bandgate.consumers.boost import ColdBoost
from bandgate.consumers.dispatch import Dispatcher, DispatcherClosed, make_policy, shard_prefetch
from bandgate.consumers.errors import MalformedMessage, Reject, Retry
from bandgate.consumers.incoming import Delivered
from bandgate.consumers.invoke import invoke
from bandgate.consumers.message import Message, read_message
from bandgate.consumers.ordering import ordered_outcome
from bandgate.consumers.outcome import (
    Ack,
    DeadLetter,
    Outcome,
    RetryLater,
    after_handler,
    before_handler,
    describe,
)
from bandgate.consumers.settle import Settler
from bandgate.consumers.subscription import OnDelivery, Subscription
from bandgate.consumers.telemetry import ConsumerTelemetry, outcome_name
from bandgate.topology import naming, wire
from bandgate.topology.model import Band

log = logging.getLogger(__name__)

# The key every message of a strictly serial queue has: one runs at a time.
SERIAL_KEY = ""


@dataclass(eq=False)
class Delivery:
    subscription: Subscription
    incoming: Delivered
    key: str | None

    @property
    def band(self) -> int:
        return self.subscription.band


def partition_key(incoming: Delivered) -> str | None:
    value = (incoming.headers or {}).get(wire.PARTITION_KEY)
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)


def channel_gone(incoming: Delivered) -> bool:
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
        share_interval: float = 1.0,
        boost_after: float = 0.5,
        telemetry: ConsumerTelemetry | None = None,
    ) -> None:
        self.consumer = consumer
        self.spec = consumer.spec
        self.connection = connection
        self.settler = settler
        self.concurrency = concurrency or consumer.options.concurrency
        self.prefetch = consumer.options.prefetch(self.spec, self.concurrency)
        self.prime_timeout = prime_timeout
        self.share_interval = share_interval
        self.telemetry = telemetry or ConsumerTelemetry()
        self.subscriptions = [
            [
                Subscription(
                    index,
                    name,
                    shard_prefetch(self.prefetch[index], band.shards),
                    single_active=self.spec.ordered,
                )
                for name in self.spec.band_queues(band)
            ]
            for index, band in enumerate(self.spec.bands)
        ]
        policy = make_policy(consumer.options.policy, self.spec.weights())
        serial = self.spec.ordering_required
        self.dispatcher: Dispatcher[Delivery] = Dispatcher(
            len(self.spec.bands),
            policy,
            self.concurrency,
            key=(lambda _: SERIAL_KEY) if serial else (lambda delivery: delivery.key),
            refill_wait=refill_wait,
            on_dry=self._on_dry,
        )
        self._asynchronous = consumer.is_async
        self._executor = (
            None
            if self._asynchronous
            else ThreadPoolExecutor(
                self.concurrency, thread_name_prefix=f"bandgate-{self.spec.name}"
            )
        )
        self._boost_after = boost_after
        self.boost: ColdBoost | None = None
        self._boost_task: asyncio.Task[None] | None = None
        self._probe_channel: AbstractChannel | None = None
        self._background: set[asyncio.Task[None]] = set()  # probes, handovers, sharing
        self._workers: WorkersQueue | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._arrived = [0] * len(self.spec.bands)
        # A probe that found a band's backlog goes on answers for the next refill wait too.
        self._refill_wait = refill_wait
        self._backlog_seen_at = [float("-inf")] * len(self.spec.bands)
        self._probing = [False] * len(self.spec.bands)
        self._arrival = asyncio.Event()
        self._stopping = False
        self._stopped = asyncio.Event()  # ends in-place retry waits

    @property
    def in_flight(self) -> frozenset[asyncio.Task[None]]:
        return frozenset(self._tasks)

    async def start(self) -> None:
        """Consume every band, hottest first; a band's first prefetch arrives before the next.

        Waiting for it keeps the start order of a backlog strict: otherwise colder deliveries
        could reach the free slots before the hotter ones (see `consumers.dispatch`). Only
        queues this worker is the active consumer of deliver anything to wait for.
        """
        self._probe_channel = await self.connection.channel()
        for index, subscriptions in enumerate(self.subscriptions):
            expected = 0
            for subscription in subscriptions:
                ready = await subscription.open(self.connection, self._on_delivery(subscription))
                if subscription.active:
                    expected += min(ready, subscription.prefetch)
            if expected:
                await self._prime(index, expected)
        if self.spec.shares_shards:
            await self._join_workers()
        if self._may_boost():
            coldest = self.subscriptions[-1][0]
            self.boost = ColdBoost(
                coldest,
                self._on_delivery(coldest),
                full=self.prefetch[0],
                idle_after=self._boost_after,
                quiet_after=self._refill_wait,
            )
            self._boost_task = asyncio.create_task(self.boost.run())
        log.info(
            "consuming %s with %s (concurrency %d, policy %s, prefetch %s%s)",
            self.spec.name,
            self.consumer.name,
            self.concurrency,
            self.consumer.options.policy,
            {
                band.name: self.prefetch[index]
                if band.shards == 1
                else f"{band.shards} shards x {self.subscriptions[index][0].prefetch}"
                for index, band in enumerate(self.spec.bands)
            },
            ", strictly serial"
            if self.spec.ordering_required
            else (", ordered per key" if self.spec.ordered else ""),
        )

    def _may_boost(self) -> bool:
        """Whether the coldest band gets the full prefetch while hotter bands are idle
        (`consumers.boost`): strict policy, its default small prefetch, one competing queue."""
        coldest = self.spec.bands[-1]
        return (
            self._boost_after > 0
            and self.consumer.options.policy == "strict"
            and len(self.spec.bands) > 1
            and coldest.shards == 1
            and not self.spec.ordered
            and coldest.name not in self.consumer.options.prefetch_overrides
            and self.prefetch[-1] < self.prefetch[0]
        )

    async def _join_workers(self) -> None:
        workers = WorkersQueue(naming.workers_queue(self.topology_exchange, self.spec.name))
        try:
            await workers.join(self.connection)
        except Exception as exc:
            log.warning(
                "cannot join %s (%r): this worker keeps every shard it gets; run `bandgate "
                "topology apply` to share the shards of %s out",
                workers.name,
                exc,
                self.spec.name,
            )
            await workers.leave()
            return
        self._workers = workers
        self._spawn(self._share_shards())

    def _spawn(self, work: Awaitable[None]) -> None:
        task = asyncio.ensure_future(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

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

    @property
    def topology_exchange(self) -> str:
        return self.settler.publisher.topology.exchange

    def _on_dry(self, index: int) -> None:
        if self._probe_channel is None or self._stopping or self._probing[index]:
            return
        # The broker had more for it a moment ago: its refill is most likely on the way, so
        # ask only once the refill wait since then is over (one question per wait at most).
        since = asyncio.get_running_loop().time() - self._backlog_seen_at[index]
        self._probing[index] = True
        self._spawn(self._probe(index, after=max(0.0, self._refill_wait - since)))

    async def _probe(self, index: int, after: float) -> None:
        """A backlogged band ran dry: if the broker has nothing ready for it, stop waiting
        (and let the cold boost know the hotter work is done).

        Only queues this worker is the active consumer of can refill it.
        """
        try:
            if after:
                await asyncio.sleep(after)
            if not self._stopping:
                await self._ask_broker(index)
        finally:
            self._probing[index] = False

    async def _ask_broker(self, index: int) -> None:
        assert self._probe_channel is not None
        ready = 0
        for subscription in self.subscriptions[index]:
            if not subscription.active:
                continue
            try:
                channel = await self._probe_channel.get_underlay_channel()
                declared = await channel.queue_declare(subscription.queue, passive=True)
            except Exception as exc:  # the wait just runs its course
                log.debug("probing %s: %r", subscription.queue, exc)
                return
            ready += declared.message_count or 0
        if ready:
            self._backlog_seen_at[index] = asyncio.get_running_loop().time()
        else:
            self.dispatcher.settle(index)
            if self.boost is not None and index < len(self.subscriptions) - 1:
                self.boost.hotter_drained()

    def _on_delivery(self, subscription: Subscription) -> OnDelivery:
        index = subscription.band

        async def on_delivery(incoming: Delivered) -> None:
            if self._stopping or subscription.releasing:
                # Competing consumers: sent before the broker saw our cancel, give it straight
                # back. A single active consumer keeps it: closing the channel returns it.
                if not subscription.single_active:
                    await self.settler.give_back(incoming)
                return
            subscription.active = True
            if self.boost is not None and index < len(self.subscriptions) - 1:
                self.boost.hotter_arrived()
            self._arrived[index] += 1
            self._arrival.set()
            self.dispatcher.put(index, Delivery(subscription, incoming, partition_key(incoming)))

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
            delivery.subscription.started()
            task = asyncio.create_task(self._process(delivery))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _process(self, delivery: Delivery) -> None:
        band = self.spec.bands[delivery.band]
        try:
            await self._pipeline(delivery, band)
        except asyncio.CancelledError:
            # Shut down past the grace period: not handled, so it goes back to its band.
            await self._give_back(delivery)
            raise
        except Exception:
            log.exception(
                "bug while processing message %s; returning it", delivery.incoming.message_id
            )
            await self._give_back(delivery)
        finally:
            delivery.subscription.finished()
            self.dispatcher.done(delivery.band, delivery)

    async def _give_back(self, delivery: Delivery) -> None:
        """Return a message to its queue without changing its place in the queue's order."""
        subscription = delivery.subscription
        if not subscription.single_active:
            await self.settler.give_back(delivery.incoming)
        elif not self._stopping:
            self._hand_back(subscription)
        # Stopping: the channel closes when the worker does, which returns it.

    def _hand_back(self, subscription: Subscription) -> None:
        """Give a single-active queue back to the broker, in order, then subscribe again.

        Its buffered messages stop being candidates at once (synchronously, before the slot of
        whatever called this is freed, so no later message of a key can start); they and
        anything still arriving stay unacked until the channel closes.
        """
        if subscription.releasing:
            return
        subscription.releasing = True
        subscription.active = False
        self.dispatcher.discard(subscription.band, lambda d: d.subscription is subscription)
        self._spawn(self._rejoin(subscription))

    async def _rejoin(self, subscription: Subscription) -> None:
        await subscription.idle()
        await subscription.close()
        if self._stopping:
            return
        try:
            await subscription.open(self.connection, self._on_delivery(subscription))
        except Exception as exc:
            log.error("could not consume %s again: %r", subscription.queue, exc)
            return
        log.info(
            "handed %s back%s",
            subscription.queue,
            " and took it again (no other worker waits for it)" if subscription.active else "",
        )

    async def _share_shards(self) -> None:
        """Hold no more than this worker's share of each ordered band's shards (`balance`)."""
        assert self._workers is not None
        assert self._probe_channel is not None
        while not self._stopping:
            await asyncio.sleep(self.share_interval)
            workers = await self._workers.count(self._probe_channel)
            if not workers or self._stopping:
                continue
            for subscriptions in self.subscriptions:
                held = [s for s in subscriptions if s.active and not s.releasing]
                extra = surplus(len(held), len(subscriptions), workers)
                if not extra:
                    continue
                # The ones quickest to hand back: fewest running.
                for subscription in sorted(held, key=lambda s: s.running)[:extra]:
                    log.info(
                        "holding %d of %d shards with %d workers: handing %s back",
                        len(held),
                        len(subscriptions),
                        workers,
                        subscription.queue,
                    )
                    self._hand_back(subscription)

    async def _pipeline(self, delivery: Delivery, band: Band) -> None:
        """Read, check the delivery limit, run the handler, decide, settle; on an ordered
        queue, retries run here, in place, after their back-off."""
        incoming = delivery.incoming
        policy = self.consumer.options.retry
        try:
            message = read_message(incoming, self.spec, band)
        except MalformedMessage as exc:
            message = read_message(incoming, self.spec, band, decode=False)
            log.error("dead-lettering malformed message %s: %s", message.message_id, exc)
            outcome: Outcome = after_handler(exc, message, policy)
            await self._settle(delivery, message, band, outcome)
            self.telemetry.finished(message, outcome, None)
            return
        first = True
        while True:
            outcome = await self._attempt(delivery, message, band, first=first)
            if not (self.spec.ordered and isinstance(outcome, RetryLater)):
                return
            if not await self._wait(outcome.delay):
                return  # stopping: the message goes back with its channel, unsettled
            message = replace(message, attempt=outcome.attempt)
            first = False

    async def _attempt(
        self, delivery: Delivery, message: Message, band: Band, *, first: bool
    ) -> Outcome:
        """One run of the handler, in its own span, settled unless retried in place."""
        incoming = delivery.incoming
        policy = self.consumer.options.retry
        with self.telemetry.span(message, incoming.headers) as span:
            seconds: float | None = None
            limit = before_handler(message, policy) if first else None
            if limit is not None:
                log.error("dead-lettering message %s: %s", message.message_id, limit.reason)
                outcome: Outcome = limit
            else:
                if first:
                    self.telemetry.started(message, incoming.headers)
                started = time.perf_counter()
                error = await self._run_handler(message)
                seconds = time.perf_counter() - started
                if self.spec.ordered:
                    strategy = self.spec.effective_failure_strategy
                    outcome = ordered_outcome(error, message, policy, strategy)
                else:
                    outcome = after_handler(error, message, policy)
                if error is not None:
                    self._log_failure(message, error, outcome)
                    span.record_exception(error)
            span.set_attribute("bandgate.outcome", outcome_name(outcome))
            if not isinstance(outcome, Ack):
                span.set_status(trace.StatusCode.ERROR, getattr(outcome, "reason", ""))
            if not (self.spec.ordered and isinstance(outcome, RetryLater)):
                await self._settle(delivery, message, band, outcome)
        self.telemetry.finished(message, outcome, seconds)
        return outcome

    async def _settle(
        self, delivery: Delivery, message: Message, band: Band, outcome: Outcome
    ) -> None:
        async def give_back(_: Delivered) -> None:
            await self._give_back(delivery)

        await self.settler.settle(delivery.incoming, message, band, outcome, give_back=give_back)

    async def _wait(self, seconds: float) -> bool:
        """Sleep before running a message again; False when the worker stops meanwhile."""
        try:
            await asyncio.wait_for(self._stopped.wait(), seconds)
        except TimeoutError:
            return True
        return False

    async def _run_handler(self, message: Message) -> BaseException | None:
        """The handler's exception, or None when it returned."""
        try:
            await invoke(
                self.consumer.handler,
                message,
                time_limit=self.consumer.options.time_limit,
                executor=self._executor,
                asynchronous=self._asynchronous,
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
        in_place = self.spec.ordered and isinstance(outcome, RetryLater)
        log.log(
            logging.ERROR if isinstance(outcome, DeadLetter) else logging.WARNING,
            "%s failed on message %s (attempt %d, band %s): %s -> %s%s",
            self.consumer.name,
            message.message_id,
            message.attempt,
            message.band,
            describe(error),
            outcome,
            " in place (ordered queue)" if in_place else "",
            exc_info=not isinstance(error, Retry | Reject),
        )

    async def stop_consuming(self) -> None:
        """Stop taking messages and give back every one not started yet.

        Competing consumers are cancelled and their buffered messages nacked at once, so other
        workers can take them. Single-active queues keep theirs until their channels close
        (`close()`), after the running handlers: that returns them in order.
        """
        self._stopping = True
        self._stopped.set()
        if self.boost is not None and self._boost_task is not None:
            self.boost.stop()
            await asyncio.gather(self._boost_task, return_exceptions=True)
        if self._workers is not None:
            await self._workers.leave()
        subscriptions = [s for band in self.subscriptions for s in band]
        for subscription in subscriptions:
            if not subscription.single_active:
                await subscription.cancel()
        returned = self.dispatcher.close()
        for _, delivery in returned:
            if not delivery.subscription.single_active:
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
        if self._boost_task is not None:
            self._boost_task.cancel()
            await asyncio.gather(self._boost_task, return_exceptions=True)
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        for subscription in (s for band in self.subscriptions for s in band):
            await subscription.close()
        if self._probe_channel is not None and not self._probe_channel.is_closed:
            try:
                await self._probe_channel.close()
            except Exception as exc:
                log.debug("closing the probe channel: %r", exc)
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
