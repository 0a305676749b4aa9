"""The runner: one consumer at work, from a delivery's arrival to its settlement.

Bands are consumed hottest first; every RabbitMQ queue of a band (its queue, or each of its
shards) is a `Subscription` on its own channel with its own prefetch. One delivery enters each
module once, in this order, and this module is the thread between them, read top to bottom:

1. `bandgate.consumers.subscription`: aiormq pushes it to its queue's `Subscription`, which
   reads it as an `Incoming` (`bandgate.core.protocol.deliveries`; its frames were decoded by
   `bandgate.core.protocol.frames` where the worker opted in) and hands it to the runner as a
   `Delivery` (`ConsumerRunner.receive`, the intake);
2. `bandgate.consumers.scheduling`: it waits in its band's buffer until the `Dispatcher` hands
   it a free slot (the band policy picks its band, its partition key is free and, in a sharded
   band, it is the best head among the shards' buffers); the run loop (`run`) starts it in a
   task of its own. Its slot (and its subscription's count of running messages) stays taken
   until it is settled: `process` frees them (`Dispatcher.done`) as its last step;
3. `bandgate.consumers.message`: `process` reads it into the handler's `Message` (of a
   sharded band's delivery, scheduling read the priority and enqueue time before, to rank it);
4. `bandgate.consumers.decision`: an `Attempt` checks the delivery limit and the tombstone
   ledger, runs the handler under its time limit and decides the outcome (a malformed message
   is decided without running the handler);
5. `bandgate.consumers.settlement`: the `Settler` publishes the retry or dead letter,
   confirmed, then acks; or the runner gives the message back (`give_back`);
6. `bandgate.core.protocol.acks`: the ack goes out with the others of its event-loop turn.

`bandgate.consumers.telemetry` watches beside the path (the span around each attempt, the
metrics once settled), and so do the `RunnerHooks` of whoever drives the runner. An ordered
queue's retry in place (below) runs steps 4 and 5 again, as a new attempt.

Beside the path: `give_back` returns a message (shutdown, an unconfirmed copy, a bug) and
`hand_over` gives a single-active queue back to the broker; `lost` consumes a queue again whose
consumer was lost (the broker cancelled it); `bandgate.consumers.sharing` shares ordered shards
with other workers; the `RefillProbe` (scheduling) asks the broker when a band runs dry;
`Occupancy` (telemetry) shows the slots as gauges; `bandgate.consumers.lifetime` says when the
runner is stopping.

Ordered queues (`QueueSpec.ordered`): a message whose partition key is running waits (as on any
queue), failures are retried in place (`bandgate.consumers.decision`), messages are given back
only by closing their queue's channel (`hand_over`), and workers share the shards out
(`bandgate.consumers.sharing`). Per-key order within a worker: a key's messages all come from one
queue, in queue order; the dispatcher starts a key's oldest buffered message only when none of
the key runs, and a message's slot and key stay taken until it is settled, retries included. A
strictly serial queue (`ordering_required`) treats all its messages as one key.

The public interface
--------------------
A `bandgate worker` process builds one runner per consumer, `open()`s it, `run()`s its loop and
shuts it down with `stop_consuming()`, `abort()` and `close()`. A caller that decides itself
when a message starts (HTTP receivers, `bandgate.pull`) drives it without the run loop: it
`take()`s a message (or `take_nowait()`), `start()`s its pipeline, and hears what became of
it through `RunnerHooks.settled`; it may `pause()` and `resume()` consuming, count its waiting
takers for the headroom (`takers_waiting`), give back a message it took but will not start
(`untake`), and ask whether the runner is `stopping`. Nothing else of a runner is meant for
other packages (`RUNNER_INTERFACE`; tests/unit/test_consumer_interface.py checks that
`bandgate.pull` keeps to it).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Protocol

from aio_pika.abc import AbstractChannel, AbstractConnection
from opentelemetry import trace

from bandgate.consumers.consumer import Consumer
from bandgate.consumers.decision import (
    Ack,
    Attempt,
    DeadLetter,
    GiveBack,
    Outcome,
    RetryLater,
    Tombstoned,
    Tombstones,
    decide,
    describe,
    outcome_name,
)
from bandgate.consumers.errors import MalformedMessage, Reject, Retry
from bandgate.consumers.lifetime import Lifetime
from bandgate.consumers.message import Message, read_message
from bandgate.consumers.scheduling import (
    IDLE_AFTER,
    DispatcherClosed,
    RefillProbe,
    plan,
    shard_prefetch,
)
from bandgate.consumers.settings import WorkerSettings
from bandgate.consumers.settlement import Settled, Settler
from bandgate.consumers.sharing import ShardSharing, WorkersQueue
from bandgate.consumers.subscription import Delivery, Subscription
from bandgate.consumers.telemetry import ConsumerTelemetry, Occupancy
from bandgate.core.telemetry import Telemetry
from bandgate.topology import naming
from bandgate.topology.model import Band

log = logging.getLogger(__name__)

RESUBSCRIBE_MAX_SECONDS = 30.0  # the longest wait between tries to consume a lost queue again

# What other packages may use of a runner (see "The public interface" above).
RUNNER_INTERFACE = frozenset(
    {
        "open",
        "run",
        "take",
        "take_nowait",
        "start",
        "untake",
        "pause",
        "resume",
        "takers_waiting",
        "stopping",
        "stop_consuming",
        "abort",
        "close",
    }
)


@dataclass(frozen=True)
class Timings:
    """A runner's waits, in seconds (`WorkerSettings` documents each)."""

    prime: float = 2.0  # at start-up and resume, for each band's first prefetch
    refill_wait: float = 0.1  # a band that ran dry keeps its claim on free slots
    share_interval: float = 1.0  # ordered shards: how often the share is checked
    headroom_after: float = IDLE_AFTER  # the coldest band's headroom (0: none)
    resubscribe: float = 1.0  # first wait before consuming a lost queue again

    @classmethod
    def of(cls, settings: WorkerSettings) -> Timings:
        return cls(
            prime=settings.startup_prime_seconds,
            refill_wait=settings.refill_wait_seconds,
            share_interval=settings.share_shards_seconds,
            headroom_after=settings.cold_boost_seconds,
            resubscribe=settings.reconnect_interval_seconds,
        )


class RunnerHooks(Protocol):
    """What a runner tells whoever drives it."""

    def settled(self, delivery: Delivery, message: Message, outcome: Outcome) -> None:
        """A handler run on `delivery` was carried out on the broker with `outcome` (its copy
        confirmed and its ack written, or it was given back). Once per attempt: an ordered
        queue's retry in place is reported before its back-off, while the runner goes on
        holding the message. Not called for a message given back unsettled (a shutdown)."""
        ...


class ConsumerRunner:
    """One consumer at work: its subscriptions, its scheduling and the pipeline every delivery
    runs through (the module docstring draws the path, and lists the public interface)."""

    def __init__(
        self,
        consumer: Consumer,
        connection: AbstractConnection,
        settler: Settler,
        *,
        concurrency: int | None = None,
        timings: Timings = Timings(),  # noqa: B008 - frozen
        telemetry: Telemetry | None = None,
        tombstones: Tombstones | None = None,
        hooks: RunnerHooks | None = None,
        hand_back: bool = False,
    ) -> None:
        """`hand_back`: give messages back uncounted as copies that keep their delivery count
        (`Settler.hand_back`), for brokers that count every return (before 4.3)."""
        spec = consumer.spec
        self.consumer = consumer
        self.spec = spec
        self.connection = connection
        self.settler = settler
        self.timings = timings
        self.tombstones = tombstones
        self.hooks = hooks
        self.hand_back = hand_back
        self.concurrency = concurrency or consumer.options.concurrency
        self.prefetch, self.dispatcher = plan(
            spec,
            consumer.options.policy,
            consumer.options.prefetch_overrides,
            consumer.options.prefetch(spec, self.concurrency),
            self.concurrency,
            refill_wait=timings.refill_wait,
            idle_after=timings.headroom_after,
            hot_reserve=consumer.options.hot_reserve,
        )
        self.lifetime = Lifetime()
        self.subscriptions = [
            [
                Subscription(
                    index,
                    name,
                    shard_prefetch(self.prefetch[index], band.shards),
                    single_active=spec.ordered,
                    shard=shard,
                )
                for shard, name in enumerate(spec.band_queues(band))
            ]
            for index, band in enumerate(spec.bands)
        ]
        self.telemetry = ConsumerTelemetry(telemetry)  # spans and metrics
        self._arrived = [0] * len(spec.bands)  # deliveries taken in, per band
        self._arrival = asyncio.Event()
        # A retry through the delay exchanges waits at most this long (`decision.decide`).
        self._longest_delay = settler.publisher.topology.ladder.max_delay_ms / 1000
        self._executor = (
            None
            if consumer.is_async
            else ThreadPoolExecutor(self.concurrency, thread_name_prefix=f"bandgate-{spec.name}")
        )
        self._channel: AbstractChannel | None = None  # for probes and counting workers
        self._sharing: ShardSharing | None = None  # ordered shards shared with other workers
        self._tasks: set[asyncio.Task[Outcome | None]] = set()

    @property
    def in_flight(self) -> frozenset[asyncio.Task[Outcome | None]]:
        return frozenset(self._tasks)

    @property
    def stopping(self) -> bool:
        return self.lifetime.stopping

    def _every_subscription(self) -> Iterator[Subscription]:
        return (subscription for band in self.subscriptions for subscription in band)

    # -- start-up ----------------------------------------------------------------------------

    async def open(self) -> None:
        """Consume every band, hottest first, each band's first prefetch in hand before the
        next, then start what runs beside the handlers.

        Waiting for each band's prefetch keeps the start order of a backlog strict: otherwise
        colder deliveries could reach the free slots before the hotter ones. Only queues this
        worker is the active consumer of deliver anything to wait for."""
        self._channel = await self.connection.channel()
        for index, subscriptions in enumerate(self.subscriptions):
            expected = 0
            for subscription in subscriptions:
                ready = await subscription.open(self.connection, self)
                if subscription.active:
                    expected += min(ready, subscription.prefetch)
            await self._primed(index, expected)
        RefillProbe(
            self.subscriptions,
            self.dispatcher,
            self.lifetime,
            self.timings.refill_wait,
            self.dispatcher.headroom,
        ).start(self._channel)
        if self.telemetry.telemetry is not None:
            occupancy = Occupancy(
                self.telemetry.telemetry,
                self.spec.name,
                [band.name for band in self.spec.bands],
                self.subscriptions,
                self.dispatcher,
                self.dispatcher.headroom,
            )
            self.lifetime.spawn(occupancy.run(self.lifetime))
        await self._share_shards(self._channel)
        self._log_started()

    async def _primed(self, band: int, expected: int) -> None:
        """Wait up to the prime timeout until `expected` deliveries of `band` came in all."""
        if not expected:
            return
        try:
            async with asyncio.timeout(self.timings.prime):
                while self._arrived[band] < expected:
                    self._arrival.clear()
                    await self._arrival.wait()
        except TimeoutError:
            log.debug("band %d: %d of %d arrived", band, self._arrived[band], expected)

    async def _share_shards(self, channel: AbstractChannel) -> None:
        if not self.spec.shares_shards:
            return
        exchange = self.settler.publisher.topology.exchange
        self._sharing = ShardSharing(
            self.spec.name,
            WorkersQueue(naming.workers_queue(exchange, self.spec.name)),
            self.subscriptions,
            self.hand_over,
            self.lifetime,
            self.timings.share_interval,
        )
        await self._sharing.start(self.connection, channel)

    def _log_started(self) -> None:
        spec = self.spec
        log.info(
            "consuming %s with %s (concurrency %d, policy %s, prefetch %s%s)",
            spec.name,
            self.consumer.name,
            self.concurrency,
            self.consumer.options.policy,
            {
                band.name: self.prefetch[index]
                if band.shards == 1
                else f"{band.shards} shards x {self.subscriptions[index][0].prefetch}"
                for index, band in enumerate(spec.bands)
            },
            ", strictly serial"
            if spec.ordering_required
            else (", ordered per key" if spec.ordered else ""),
        )

    # -- 1. intake ---------------------------------------------------------------------------

    async def receive(self, delivery: Delivery) -> None:
        """A subscription's delivery: into its band's buffer (`Receiver.receive`).

        All of a band's queues feed the band's one buffer in the dispatcher, so the waterfall
        sees a sharded band as one band. A delivery that arrives while the runner stops, or
        while its queue is paused or handed over, is given back instead."""
        subscription = delivery.subscription
        if self.lifetime.stopping or subscription.giving_back:
            # Sent before the broker saw our cancel, or while the queue goes back.
            await self.give_back(delivery)
            return
        subscription.active = True
        band = subscription.band
        headroom = self.dispatcher.headroom
        if headroom is not None and band < len(self.subscriptions) - 1:
            headroom.hotter_arrived()
        self._arrived[band] += 1
        self._arrival.set()
        self.dispatcher.put(band, delivery)

    # -- 2. dispatch -------------------------------------------------------------------------

    async def run(self) -> None:
        """Start a handler task for each message the dispatcher hands out, until closed."""
        while True:
            try:
                band, delivery = await self.dispatcher.take()
            except DispatcherClosed:
                return
            self.start(band, delivery)

    def start(self, band: int, delivery: Delivery) -> asyncio.Task[Outcome | None] | None:
        """Run a delivery the dispatcher handed out through the pipeline, in a task of its
        own (None: it is back in its band already, its connection dropped since it came)."""
        if delivery.channel_gone:
            self.dispatcher.done(band, delivery)
            return None
        delivery.subscription.started()
        task = asyncio.create_task(self.process(delivery))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # -- 3-6. the pipeline: read, decide, settle ---------------------------------------------

    async def process(self, delivery: Delivery) -> Outcome | None:
        """Handle and settle a started delivery, then free its slot; the last outcome settled
        (None: it went back to its queue unsettled).

        Its slot and partition key stay taken until it is settled, retries in place
        included. A message whose copy was not confirmed, or whose handler the shutdown
        cancelled, goes back to its queue."""
        try:
            return await self._handle(delivery, self.spec.bands[delivery.band])
        except asyncio.CancelledError:
            # Shut down past the grace period: not handled, so it goes back to its band.
            await self.give_back(delivery)
            raise
        except Exception:
            log.exception(
                "bug while processing message %s; returning it", delivery.incoming.message_id
            )
            await self.give_back(delivery)
            return None
        finally:
            delivery.subscription.finished()
            self.dispatcher.done(delivery.band, delivery)

    async def _handle(self, delivery: Delivery, band: Band) -> Outcome | None:
        try:
            message = read_message(delivery.incoming, self.spec, band)
        except MalformedMessage as exc:
            return await self._malformed(delivery, band, exc)
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

    async def _malformed(self, delivery: Delivery, band: Band, exc: MalformedMessage) -> Outcome:
        """Dead-letter a delivery that cannot be read, without running the handler."""
        message = read_message(delivery.incoming, self.spec, band, decode=False)
        log.error("dead-lettering malformed message %s: %s", message.message_id, exc)
        outcome = decide(self.consumer, message, exc)
        outcome = await self._settle(delivery, message, band, outcome)
        self._finished(delivery, message, outcome, None)
        return outcome

    def _in_place(self, outcome: Outcome) -> bool:
        """Whether the outcome is a retry this worker runs itself (ordered queues)."""
        return self.spec.ordered and isinstance(outcome, RetryLater)

    async def _attempt(
        self, delivery: Delivery, message: Message, band: Band, *, first: bool
    ) -> Outcome:
        """One run of the handler, in its own span, settled unless retried in place."""
        headers = delivery.incoming.headers
        attempt = Attempt(
            self.consumer,
            message,
            first=first,
            longest_delay=self._longest_delay,
            tombstones=self.tombstones,
            headers=headers,
        )
        if isinstance(attempt.refused, Tombstoned):
            return await self._skip(delivery, message, band, attempt.refused)
        with self.telemetry.span(message, headers) as span:
            if attempt.refused is not None:
                log.error(
                    "dead-lettering message %s: %s", message.message_id, attempt.refused.reason
                )
            elif first:
                self.telemetry.started(message, headers)
            outcome = await attempt.run(self._executor)
            if attempt.error is not None:
                self._log_failure(message, attempt.error, outcome)
                span.record_exception(attempt.error)
            span.set_attribute("bandgate.outcome", outcome_name(outcome))
            if not isinstance(outcome, Ack):
                span.set_status(trace.StatusCode.ERROR, outcome.reason)
            if not self._in_place(outcome):
                outcome = await self._settle(delivery, message, band, outcome)
        self._finished(delivery, message, outcome, attempt.seconds)
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
        self._finished(delivery, message, settled, None)
        return settled

    async def _settle(
        self, delivery: Delivery, message: Message, band: Band, outcome: Outcome
    ) -> Outcome:
        """Carry out `outcome`; what was carried out (a copy not confirmed: given back)."""
        if isinstance(outcome, GiveBack):
            await self.give_back(delivery, counted=True)
            return outcome
        tombstones = self.tombstones if self.consumer.options.dedupe else None
        ledger = None if tombstones is None else tombstones.follower  # records an Ack first
        settled = await self.settler.settle(
            delivery.incoming, message, band, outcome, ledger=ledger
        )
        if settled is Settled.UNCONFIRMED:
            await self.give_back(delivery)
            return GiveBack(f"its {outcome_name(outcome)} copy was not confirmed")
        return outcome

    def _finished(
        self, delivery: Delivery, message: Message, outcome: Outcome, seconds: float | None
    ) -> None:
        self.telemetry.finished(message, outcome, seconds)
        if self.hooks is not None:
            self.hooks.settled(delivery, message, outcome)

    def _log_failure(self, message: Message, error: BaseException, outcome: Outcome) -> None:
        # A `Reject` is the handler's (or an HTTP client's) decision: a warning, not an error
        # to alert on. A message dead-lettered because it kept failing is an error.
        chosen = isinstance(error, Reject)
        log.log(
            logging.ERROR if isinstance(outcome, DeadLetter) and not chosen else logging.WARNING,
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

    # -- giving back -------------------------------------------------------------------------

    async def give_back(self, delivery: Delivery, *, counted: bool = False) -> None:
        """Give a message back to its queue, unhandled, in its place; `counted`: as a delivery.

        How depends on the queue's consumers (`bandgate.consumers.subscription`): competing
        consumers nack (or reject, `counted`) with requeue, at once, and any worker may take
        it; a single active consumer (ordered queues) hands the whole queue over. While the
        runner stops, a single-active queue does nothing: its channels close when it does,
        which returns its messages in order."""
        subscription = delivery.subscription
        if not subscription.single_active:
            if not counted and await self._hand_back(delivery):
                return
            await self.settler.give_back(delivery.incoming, counted=counted)
        elif not self.lifetime.stopping:
            self.hand_over(subscription)

    async def _hand_back(self, delivery: Delivery) -> bool:
        """With `hand_back`, give a message back as a copy that keeps its delivery count
        (`Settler.hand_back`): a shutdown, a client that left, a paused receiver. False when
        it was not: a malformed message, or one whose channel is gone (the broker has it back
        already, and a copy would be a duplicate)."""
        if not self.hand_back or delivery.channel_gone:
            return False
        band = self.spec.bands[delivery.band]
        try:
            message = read_message(delivery.incoming, self.spec, band)
        except MalformedMessage:
            return False
        return await self.settler.hand_back(delivery.incoming, message, band)

    def hand_over(self, subscription: Subscription) -> None:
        """Give a single-active queue back to the broker, in order, then subscribe again.

        Its buffered messages stop being candidates at once (synchronously, before the slot of
        whatever called this is freed, so no later message of a key can start); they and
        anything still arriving stay unacked until the channel closes, once none of its
        messages runs: the broker returns every unacked one to the head of the queue, in
        order. Then the runner subscribes again, at the back of the line of consumers.
        """
        if subscription.giving_back:
            return
        self._stop_taking_from(subscription)
        self.lifetime.spawn(self._rejoin(subscription))

    def _stop_taking_from(self, subscription: Subscription) -> None:
        subscription.giving_back = True
        subscription.active = False
        self.dispatcher.discard(subscription.band, lambda d: d.subscription is subscription)

    async def _rejoin(self, subscription: Subscription) -> None:
        await subscription.idle()
        await subscription.close()
        if self.lifetime.stopping:
            return
        try:
            await subscription.reopen(self.connection)
        except Exception as exc:
            log.error("could not consume %s again: %r", subscription.queue, exc)
            return
        log.info(
            "handed %s over%s",
            subscription.queue,
            " and took it again (no other worker waits for it)" if subscription.active else "",
        )

    # -- a lost consumer ---------------------------------------------------------------------

    def lost(self, subscription: Subscription, reason: str) -> None:
        """`subscription` has no consumer any more (`reason`): consume its queue again
        (`Receiver.lost`).

        The broker cancels a consumer when the queue is deleted and, from RabbitMQ 4.3 on,
        when it held a message past its consumer timeout; earlier versions close the channel,
        which the robust channel reopens, and consuming on it again may fail. Treated like a
        lost channel: the subscription's buffered messages stop being candidates at once, its
        channel closes (the broker takes back whatever of it is unacked), and a new channel
        consumes the queue. A handler still running on a message of the old channel finishes
        and its ack is dropped (its tag means nothing on the new one); the broker delivers the
        message again. While the queue is gone, it is tried again after the resubscribe wait,
        doubling up to `RESUBSCRIBE_MAX_SECONDS`, until it is back or the runner stops.

        Called from the channel's frame reader, so the work happens in a task of its own."""
        if self.lifetime.stopping or subscription.giving_back:
            return  # its channel closes anyway: the shutdown, or a handover that consumes again
        log.warning(
            "%s: %s; consuming it again on a new channel (the messages it held are delivered "
            "again)",
            subscription.queue,
            reason,
        )
        self._stop_taking_from(subscription)  # what still arrives on the old channel goes back
        self.lifetime.spawn(self._consume_again(subscription))

    async def _consume_again(self, subscription: Subscription) -> None:
        await subscription.close()
        first = self.timings.resubscribe
        wait = first
        while not self.lifetime.stopping:
            try:
                await subscription.reopen(self.connection)
            except Exception as exc:
                log.warning(
                    "cannot consume %s again (%r); trying again in %g s",
                    subscription.queue,
                    exc,
                    wait,
                )
                if not await self.lifetime.pause(wait):
                    return
                wait = min(2 * wait, max(first, RESUBSCRIBE_MAX_SECONDS))
                continue
            log.info("consuming %s again", subscription.queue)
            return

    # -- driven by its caller (HTTP receivers) -----------------------------------------------

    async def take(self) -> tuple[int, Delivery]:
        """Wait for a free slot and the message the scheduling picks for it: (band, delivery).
        Claims a slot only when it returns; `start` it, or `untake` it."""
        return await self.dispatcher.take()

    def take_nowait(self) -> tuple[int, Delivery] | None:
        """`take` without waiting, for a batch that returns at once (None: nothing to start
        now). It may take the coldest band's message inside the headroom: the headroom keeps
        slots for hotter work that a waiting taker would start, and a batch keeps none waiting."""
        return self.dispatcher.take_nowait(headroom=False)

    async def untake(self, band: int, delivery: Delivery) -> None:
        """A message `take` handed out that will not start: free its slot, give it back."""
        self.dispatcher.done(band, delivery)
        await self.give_back(delivery)

    def takers_waiting(self, count: int) -> None:
        """The headroom's slots are the messages running and these `count` takers waiting for
        one, not the concurrency (`bandgate.consumers.scheduling`, Headroom and Noisy lane)."""
        self.dispatcher.takers_waiting(count)

    async def pause(self, *, give_back_held: bool) -> None:
        """Stop deliveries (competing consumers only); with `give_back_held`, give back what
        is held unstarted too. What arrives meanwhile is given back."""
        for subscription in self._every_subscription():
            await subscription.pause()
        if give_back_held:
            for band in range(len(self.subscriptions)):
                for delivery in self.dispatcher.discard(band, lambda _: True):
                    await self.give_back(delivery)

    async def resume(self) -> None:
        """Consume again after `pause`, hottest band first, each primed (as `open` does)."""
        for index, subscriptions in enumerate(self.subscriptions):
            expected = self._arrived[index]
            held = self.dispatcher.at_hand(index)  # kept through the pause
            for subscription in subscriptions:
                ready = await subscription.resume()
                kept = sum(1 for delivery in held if delivery.subscription is subscription)
                room = subscription.prefetch - subscription.running - kept
                expected += min(ready, max(0, room))
            await self._primed(index, expected)

    # -- shutdown ----------------------------------------------------------------------------
    # In the steps the worker takes (`bandgate.consumers.worker`): `stop_consuming`, then after
    # the grace period `abort`, then `close`.

    async def stop_consuming(self) -> None:
        """Stop taking messages and give back every one not started yet.

        Competing consumers are cancelled and their buffered messages nacked at once, so other
        workers can take them. Single-active queues keep theirs until their channels close
        (`close`), after the running handlers: that returns them in order."""
        self.lifetime.stop()
        if self._sharing is not None:
            await self._sharing.leave()
        for subscription in self._every_subscription():
            if not subscription.single_active:
                await subscription.cancel()
        returned = self.dispatcher.close()
        for _, delivery in returned:
            await self.give_back(delivery)
        if returned:
            log.info("returned %d unstarted messages of %s", len(returned), self.spec.name)

    async def abort(self) -> None:
        """Cancel the handlers still running; their messages go back to their bands."""
        cancelled = list(self._tasks)
        for task in cancelled:
            task.cancel()
        await asyncio.gather(*cancelled, return_exceptions=True)

    async def close(self) -> None:
        """Close every channel (the broker takes back what is unsettled) and the threads."""
        await self.lifetime.cancel_background()
        for subscription in self._every_subscription():
            await subscription.close()
        channel = self._channel
        if channel is not None and not channel.is_closed:
            try:
                await channel.close()
            except Exception as exc:
                log.debug("closing the probe channel: %r", exc)
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)


__all__ = [
    "RESUBSCRIBE_MAX_SECONDS",
    "RUNNER_INTERFACE",
    "ConsumerRunner",
    "RunnerHooks",
    "Timings",
]
