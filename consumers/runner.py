"""One consumer at work: the parts of the pipeline, wired together, and the run loop.

Bands are consumed hottest first; every RabbitMQ queue of a band (its queue, or each of its
shards) is a `Subscription` on its own channel with its own prefetch. One delivery passes through
each module once, from the broker to its ack:

1. `consumers.subscription`: aiormq pushes it to its `Subscription`, which hands it to its
   receiver, the runner's `Intake`;
2. `consumers.intake`: takes it in as a `Delivery` (`consumers.delivery`), into its band's
   buffer; while stopping, it gives it back instead;
3. `consumers.dispatch`: the `Dispatcher` hands it to a free slot when the band policy picks
   its band, its partition key is free and, in a sharded band, it is the best head among the
   shards' buffers (`consumers.merge`);
4. `consumers.runner` (the run loop below): starts a task for it;
5. `consumers.pipeline`: `Pipeline.process` reads the message and opens its span;
6. `consumers.decide`: `Attempt` runs the handler under its time limit and decides the outcome;
7. `consumers.settle`: `Settler` publishes the retry or dead letter, confirmed, then acks;
8. `consumers.acks`: the ack goes out with the others of its event-loop turn;
and the pipeline frees the slot (`Dispatcher.done`).

Beside that path: `consumers.handback` gives messages back (shutdown, an unconfirmed copy, a
bug) and hands single-active queues back; `consumers.probe` asks the broker when a band runs dry;
`consumers.headroom` keeps the coldest band off the slots hotter work needs;
`consumers.balance` shares ordered shards with other workers; `consumers.resubscribe` consumes
a queue again whose consumer was lost (the broker cancelled it); `consumers.occupancy` shows
the slots as gauges; `consumers.startup` and `consumers.shutdown` open and close it all;
`consumers.lifetime` says when the runner is stopping.

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
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from aio_pika.abc import AbstractChannel, AbstractConnection

from bandgate.consumers import shutdown
from bandgate.consumers.balance import ShardSharing, WorkersQueue
from bandgate.consumers.consumer import Consumer
from bandgate.consumers.delivery import Delivery, dispatch_key, shard_merge
from bandgate.consumers.dispatch import Dispatcher, DispatcherClosed, make_policy, shard_prefetch
from bandgate.consumers.handback import HandBack
from bandgate.consumers.headroom import IDLE_AFTER, Headroom
from bandgate.consumers.intake import Intake
from bandgate.consumers.lifetime import Lifetime
from bandgate.consumers.occupancy import Occupancy
from bandgate.consumers.options import keeps_headroom
from bandgate.consumers.outcome import Outcome
from bandgate.consumers.pipeline import Pipeline
from bandgate.consumers.probe import RefillProbe
from bandgate.consumers.resubscribe import Resubscriber
from bandgate.consumers.settle import Settler
from bandgate.consumers.startup import log_started, subscribe
from bandgate.consumers.subscription import Subscription
from bandgate.consumers.telemetry import ConsumerTelemetry
from bandgate.consumers.tombstones import Tombstones
from bandgate.topology import naming

log = logging.getLogger(__name__)


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
        headroom_after: float = IDLE_AFTER,
        telemetry: ConsumerTelemetry | None = None,
        resubscribe_interval: float = 1.0,
        merge_shards: bool = True,
        tombstones: Tombstones | None = None,
        slots: Callable[[int], int] | None = None,
    ) -> None:
        """`merge_shards=False` takes a sharded band's messages in arrival order, as before
        `consumers.merge`: for measuring the merge (bench/shards.py), not a setting.
        `slots(running)`: the headroom's slots, where they are not the concurrency (HTTP
        receivers: the seats their clients ask for)."""
        spec = consumer.spec
        self.consumer = consumer
        self.spec = spec
        self.connection = connection
        self.concurrency = concurrency or consumer.options.concurrency
        self.prefetch = consumer.options.prefetch(spec, self.concurrency)
        self.headroom = (
            Headroom(
                self.concurrency, idle_after=headroom_after, quiet_after=refill_wait, slots=slots
            )
            if keeps_headroom(spec, consumer.options, self.prefetch, headroom_after)
            else None
        )
        if self.headroom is not None:
            # The dispatcher, not the prefetch, keeps the coldest band off hotter work's slots.
            self.prefetch = (*self.prefetch[:-1], self.prefetch[0])
        self.prime_timeout = prime_timeout
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
        self.dispatcher: Dispatcher[Delivery] = Dispatcher(
            len(spec.bands),
            make_policy(consumer.options.policy, spec.weights()),
            self.concurrency,
            key=dispatch_key(spec),
            refill_wait=refill_wait,
            merge=shard_merge(spec) if merge_shards else None,
            headroom=self.headroom,
        )
        self.handback = HandBack(connection, settler, self.dispatcher, self.lifetime)
        self.intake = Intake(
            len(spec.bands),
            self.dispatcher,
            self.handback,
            self.lifetime,
            Resubscriber(connection, self.dispatcher, self.lifetime, resubscribe_interval),
            self.headroom,
        )
        self.probe = RefillProbe(
            self.subscriptions,
            self.dispatcher,
            self.lifetime,
            refill_wait,
            self.headroom,
        )
        workers = naming.workers_queue(settler.publisher.topology.exchange, spec.name)
        self.sharing = (
            ShardSharing(
                spec.name,
                WorkersQueue(workers),
                self.subscriptions,
                self.handback,
                self.lifetime,
                share_interval,
            )
            if spec.shares_shards
            else None
        )
        self._executor = (
            None
            if consumer.is_async
            else ThreadPoolExecutor(self.concurrency, thread_name_prefix=f"bandgate-{spec.name}")
        )
        observed = telemetry or ConsumerTelemetry()
        self.pipeline = Pipeline(
            consumer,
            settler,
            self.handback,
            self.dispatcher,
            self.lifetime,
            observed,
            self._executor,
            tombstones,
        )
        self.occupancy = (
            None
            if observed.telemetry is None
            else Occupancy(
                observed.telemetry,
                spec.name,
                [band.name for band in spec.bands],
                self.subscriptions,
                self.dispatcher,
                self.headroom,
            )
        )
        self._channel: AbstractChannel | None = None  # for probes and counting workers
        self._tasks: set[asyncio.Task[Outcome | None]] = set()

    @property
    def in_flight(self) -> frozenset[asyncio.Task[Outcome | None]]:
        return frozenset(self._tasks)

    async def open(self) -> None:
        """Consume every band, hottest first and primed (`consumers.startup`), then start what
        runs beside the handlers."""
        self._channel = await self.connection.channel()
        await subscribe(self.subscriptions, self.connection, self.intake, self.prime_timeout)
        self.probe.start(self._channel)
        if self.occupancy is not None:
            self.lifetime.spawn(self.occupancy.run(self.lifetime))
        if self.sharing is not None:
            await self.sharing.start(self.connection, self._channel)
        log_started(self.consumer, self.concurrency, self.prefetch, self.subscriptions)

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
        own (None: it is back in its band already, its connection dropped since it came).

        The run loop calls this for every delivery; an HTTP receiver (`bandgate.pull`)
        takes from the dispatcher itself and calls this for each message it leases."""
        if delivery.channel_gone:
            self.dispatcher.done(band, delivery)
            return None
        delivery.subscription.started()
        task = asyncio.create_task(self.pipeline.process(delivery))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def stop_consuming(self) -> None:
        """Stop taking messages and give back every one not started yet (`consumers.shutdown`)."""
        self.lifetime.stop()
        if self.sharing is not None:
            await self.sharing.leave()
        returned = await shutdown.stop_taking(self.subscriptions, self.dispatcher, self.handback)
        if returned:
            log.info("returned %d unstarted messages of %s", returned, self.spec.name)

    async def abort(self) -> None:
        """Cancel the handlers still running; their messages go back to their bands."""
        await shutdown.cancel(self._tasks)

    async def close(self) -> None:
        await self.lifetime.cancel_background()
        await shutdown.close(self.subscriptions, self._channel)
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
