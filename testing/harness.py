"""The harness: a worker and a producer over the in-memory broker, on a clock the test moves.

```python
from bandgate.testing import Harness

async def test_hot_before_cold() -> None:
    async with Harness(app) as harness:
        await harness.publish("orders", {"order_id": 1}, priority="low")
        await harness.publish("orders", {"order_id": 2}, priority="critical")
        await harness.drain()           # the worker starts, and runs until nothing is left
        assert [s.message.payload["order_id"] for s in harness.settled] == [2, 1]
        await harness.advance(30)       # what the clock makes due runs: delays, retries
        assert harness.dead_letters("orders") == []
```

What runs is the product's own code: the app's `ConsumerRunner`s (built as the worker builds
them, driven through the runner's public interface, `RUNNER_INTERFACE`, and heard through
`RunnerHooks.settled`), its `Settler`, the `Publisher` and the `Producer` (with its input
rules, its cancel and replace), and the `LedgerFollower` with `Tombstones`; so the waterfall,
the headroom, per-key order, the retry and dead-letter decisions, tombstones and the delay
ladder are decided as a worker decides them. Only the broker is in memory
(`bandgate.testing.memory_broker`, which says what of RabbitMQ it models and where it stands
in for aio-pika). A message published before the first `drain` or `advance` waits in its
band, as for a worker that starts after its publishers; the worker starts there.

The clock runs the broker's timers (the delay ladder, retry back-off, aging): `advance`
moves it and runs what became due, in order; `join` advances through every delay until
nothing waits. The runner's own waits (a band's refill wait, the headroom's idle time, an
ordered queue's retry in place, a handler's time limit) keep the real time: a test with an
ordered queue's back-off waits it out for real (docs/guides/testing.md says what else it
cannot show).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any, Unpack, cast

from aio_pika.abc import AbstractConnection, AbstractRobustConnection

from bandgate.consumers import (
    ConsumerApp,
    ConsumerRunner,
    Delivery,
    Message,
    Outcome,
    Settler,
    Timings,
    Tombstones,
)
from bandgate.core.dead_letter_records import DeadLetter, read_dead_letter_message
from bandgate.core.ledger import Entry
from bandgate.core.ledger_follower import LedgerFollower
from bandgate.core.producer import Producer, PublishOptions
from bandgate.core.publish_outcomes import Published
from bandgate.core.publishing import Publisher
from bandgate.testing.memory_broker import (
    Clock,
    MemoryAcks,
    MemoryBroker,
    MemoryChannels,
    MemoryConnection,
    MemoryLink,
)
from bandgate.topology import naming, wire
from bandgate.topology.declare import counts_every_return
from bandgate.topology.model import Topology

log = logging.getLogger(__name__)

DRAIN_SECONDS = 10.0  # how long `drain` waits, in real time, for the worker to fall idle
LEDGER_SECONDS = 5.0  # for the ledger follower to catch up at start


@dataclass(frozen=True)
class Settlement:
    """A handler run (or a copy the ledger skipped) as the runner settled it: the message as
    its handler saw it, and the outcome carried out (`Ack`, `RetryLater`, `DeadLetter`,
    `GiveBack`, `Tombstoned`)."""

    message: Message
    outcome: Outcome


@dataclass(frozen=True)
class DeadLettered:
    """A message in a dead-letter queue: its payload, and the record the DLQ tools show."""

    payload: Any
    record: DeadLetter

    @property
    def message_id(self) -> str:
        """`record.message_id`."""
        return self.record.message_id

    @property
    def reason(self) -> str | None:
        """`record.reason`: why it was given up on."""
        return self.record.reason

    @property
    def cause(self) -> str | None:
        """`record.cause`: rejected, max-attempts, delivery-limit, malformed, skipped, or the
        broker's own (expired, ...)."""
        return self.record.cause


class Harness:
    """The app's consumers and a producer over an in-memory broker (see the module docstring).

    Use it with `async with`, or `start()` and `close()`. `concurrency` overrides every
    consumer's, as `bandgate worker --concurrency` does."""

    def __init__(
        self,
        app: ConsumerApp,
        *,
        topology: Topology | None = None,
        concurrency: int | None = None,
    ) -> None:
        self.clock = Clock()
        self.topology = topology or app.topology
        self.broker = MemoryBroker(self.topology, self.clock)
        self.app, self.concurrency = app, concurrency or app.settings.concurrency
        self.settled: list[Settlement] = []  # in the order the runners settled them
        self._connection = MemoryConnection(self.broker)
        self._publisher = Publisher(self.topology, MemoryChannels(self.broker))
        self.producer = Producer(
            cast(AbstractRobustConnection, self._connection),
            self.topology,
            channels=MemoryChannels(self.broker),
        )
        self._ledger: LedgerFollower | None = None
        self._link: MemoryLink | None = None
        self._runners: list[ConsumerRunner] = []
        self._loops: set[asyncio.Task[None]] = set()

    # -- lifetime -------------------------------------------------------------------------

    async def start(self) -> None:
        """Follow the tombstone ledger, as a worker does; the worker itself starts at the
        first `drain`, `advance` or `join`."""
        connection = cast(AbstractConnection, self._connection)
        self._ledger = LedgerFollower(connection, self.topology, self._publisher)
        if not await self._ledger.start(LEDGER_SECONDS):
            raise RuntimeError(f"the in-memory ledger was not followed: {self._ledger.problem}")

    async def start_worker(self) -> None:
        """Open a runner per consumer of the app, hottest band first, and run them (done by
        `drain`, `advance` and `join` when not yet)."""
        if self._runners:
            return
        assert self._ledger is not None, "start() the harness first (or use `async with`)"
        settler = Settler(self._publisher, acks=MemoryAcks())
        tombstones = Tombstones(self._ledger)
        connection = cast(AbstractConnection, self._connection)
        timings = Timings.of(self.app.settings)
        hooks = _Recorder(self.settled)
        hand_back = counts_every_return(self.broker.version)  # as the worker decides it
        self._runners = [
            ConsumerRunner(consumer, connection, settler, concurrency=self.concurrency,
                           timings=timings, tombstones=tombstones, hooks=hooks,
                           hand_back=hand_back)
            for consumer in self.app.consumers
        ]  # fmt: skip
        await asyncio.gather(*(runner.open() for runner in self._runners))
        self._loops = {asyncio.create_task(runner.run()) for runner in self._runners}

    async def close(self) -> None:
        """Stop the worker as a SIGTERM does (nothing is waited for), then the ledger."""
        for runner in self._runners:
            await runner.stop_consuming()
        for runner in self._runners:
            await runner.abort()
            await runner.close()
        for loop in self._loops:
            loop.cancel()
        await asyncio.gather(*self._loops, return_exceptions=True)
        if self._ledger is not None:
            await self._ledger.close()
        await self.producer.close()
        await self.broker.close()

    async def __aenter__(self) -> Harness:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # -- publishing: the Producer's API ---------------------------------------------------

    async def publish(
        self, queue: str, payload: Any, *, message_id: str | None = None,
        **options: Unpack[PublishOptions],
    ) -> Published:  # fmt: skip
        """`Producer.publish`: priority (0-9 or an alias), delay, deliver_at, headers,
        partition_key, tenant; the same input rules and the same failures."""
        return await self.producer.publish(queue, payload, message_id=message_id, **options)

    async def cancel(self, queue: str, message_id: str) -> Entry:
        """`Producer.cancel` (the gateway's `DELETE .../messages/{id}`), once followed."""
        entry = await self.producer.cancel(queue, message_id)
        await self._followed()
        return entry

    async def replace(
        self, queue: str, message_id: str, payload: Any, **options: Unpack[PublishOptions]
    ) -> tuple[Published, int]:
        """`Producer.replace` (the gateway's `PUT`): a new generation, the old copies
        cancelled once the ledger is followed; with a hotter `priority`, an escalate."""
        result = await self.producer.replace(queue, message_id, payload, **options)
        await self._followed()
        return result

    async def escalate(
        self, queue: str, message_id: str, payload: Any, *, priority: int | str
    ) -> tuple[Published, int]:
        """The gateway's `POST .../escalate`: a replace at the hotter `priority`."""
        return await self.replace(queue, message_id, payload, priority=priority)

    async def _followed(self) -> None:
        """Until the ledger's new entries reached the follower."""
        await self.broker.delivered()

    def gateway_link(self) -> MemoryLink:
        """A broker link into this harness for the gateway app: `create_app(settings,
        link=harness.gateway_link())`, then a Starlette `TestClient` (or an httpx client)
        publishes, cancels and replaces over HTTP, with the gateway's own answers."""
        if self._link is None:
            self._link = MemoryLink(self.broker)
        return self._link

    # -- time -----------------------------------------------------------------------------

    async def drain(self, within: float = DRAIN_SECONDS) -> None:
        """Run until the worker is idle: every message that is due handled and settled, and
        nothing held. `TimeoutError` after `within` real seconds (a handler that hangs)."""
        await self.start_worker()
        quiet = turns = 0
        try:
            async with asyncio.timeout(within):
                while quiet < 3:  # idle for a few loop turns: nothing was about to start
                    turns += 1
                    await asyncio.sleep(0 if turns < 50 else 0.002)
                    quiet = quiet + 1 if self.broker.idle() else 0
        except TimeoutError:
            raise TimeoutError(f"the worker was still busy after {within:g} s") from None

    async def advance(self, seconds: float) -> None:
        """Move the clock `seconds` ahead, running what becomes due in the order it does."""
        target = self.clock.now + seconds
        await self.drain()
        while (due := self.broker.next_expiry()) is not None and due <= target:
            self.clock.now = max(self.clock.now, due)
            self.broker.expire()
            await self.drain()
        self.clock.now = target
        await self.drain()

    async def join(self, max_seconds: float = 7 * 24 * 3600.0) -> None:
        """Like Dramatiq's `broker.join`: advance through every delay, retry and promotion
        until nothing waits for the clock (at most `max_seconds` ahead)."""
        limit = self.clock.now + max_seconds
        await self.drain()
        while (due := self.broker.next_expiry()) is not None and due <= limit:
            await self.advance(due - self.clock.now)

    # -- what the broker holds ------------------------------------------------------------

    def dead_letters(self, queue: str) -> list[DeadLettered]:
        """The dead-letter queue of `queue`, oldest first, as the DLQ tools show it."""
        spec = self.topology.queue(queue)
        found = []
        for stored in self.broker.queues[naming.dead_letter_queue(queue)].messages():
            record = read_dead_letter_message(spec, stored.properties, wire.now())
            found.append(DeadLettered(_payload(stored.body), record))
        return found

    def waiting(self, queue: str) -> dict[str, int]:
        """Messages ready in each band of `queue` (and its shards), not yet delivered."""
        spec = self.topology.queue(queue)
        return {
            band.name: sum(len(self.broker.queues[name].ready) for name in spec.band_queues(band))
            for band in spec.bands
        }

    def delayed(self) -> int:
        """Messages in the delay ladder: delayed publishes and retries not yet due."""
        exchange, ladder = self.topology.exchange, self.topology.ladder
        levels = (naming.delay_level(exchange, level) for level in range(ladder.levels))
        return sum(len(self.broker.queues[name].ready) for name in levels)

    def outcomes(self, message_id: str) -> list[Outcome]:
        """Every outcome a message id was settled with so far, in order."""
        return [s.outcome for s in self.settled if s.message.message_id == message_id]


class _Recorder:
    """The runners' `RunnerHooks`: every settlement, in order."""

    def __init__(self, settled: list[Settlement]) -> None:
        self._settled = settled

    def settled(self, delivery: Delivery, message: Message, outcome: Outcome) -> None:
        self._settled.append(Settlement(message, outcome))


def _payload(body: bytes) -> Any:
    try:
        return wire.decode_body(body)
    except ValueError:
        return body
