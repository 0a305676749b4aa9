"""An in-memory RabbitMQ, as much of it as bandgate's topology uses, on a clock the test moves.

It is built from the very objects `bandgate topology apply` declares (`topology.objects.plan`):
the main topic exchange with a binding per priority, the delay ladder's TTL + dead-letter
levels, the dead-letter exchange and the `<queue>.dlq` queues, consistent-hash shards, the
bands' aging TTLs and the ledger stream. So routing, delays and aging are the broker's
behaviour played from the same declarations, not a second copy of bandgate's rules.

What it models of RabbitMQ:
- exchanges `topic`, `direct`, `x-consistent-hash` (on the shard-key header) and the default
  exchange; exchange-to-exchange bindings; a mandatory publish no binding takes is returned;
- queues in FIFO order (quorum on 3.x), or by priority with `x-max-priority` (classic); a
  message given back (nack or reject with requeue) returns to its place, counted in
  `x-delivery-count` on quorum queues (as 3.10-4.2 count every return); a closed channel
  returns its unacked messages; `x-single-active-consumer`;
- `x-message-ttl` with `x-dead-letter-exchange` / `-routing-key`, on the test's clock (a
  message expires from a queue only while it waits there, as RabbitMQ expires them), with
  the `x-death` header; streams (`x-stream-offset`);
- per-channel prefetch (`basic.qos`), consumer tags, `basic.cancel`, passive declares.

It does not model: other queue arguments (`x-max-length` with `reject-publish`, `x-max-age`),
frame and size limits, per-message TTL, 4.x's priority order inside a quorum queue, connection
loss, clustering, nor any timing: a hop of the ladder takes no time at all.

The seam: the worker library and the publisher reach RabbitMQ through aio-pika and aiormq.
`MemoryConnection` and `MemoryChannel` stand in for them at the public methods bandgate calls
(`connection.channel`, `channel.set_qos`, `get_underlay_channel`, `queue_declare`,
`basic_consume`, `basic_cancel`, `basic_ack`, `basic_nack`, `basic_reject`, `close`;
tests/unit/test_testing_harness.py checks each name against aio-pika's and aiormq's own
classes), and `MemoryChannels` is a `PublishChannels` for the `Publisher`. Acks go through
`MemoryAcks`, an `AckWriter` that hands them to the channel instead of writing frames.
"""

from __future__ import annotations

import asyncio
import bisect
import copy
import itertools
import logging
import zlib
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import aiormq
from aiormq.abc import DeliveredMessage
from pamqp.commands import Basic, Queue

from bandgate.core.broker import BrokerLink
from bandgate.core.protocol.acks import AckWriter, Unsettled
from bandgate.core.protocol.confirms import Confirmation
from bandgate.core.publishing import PublishPipeline
from bandgate.topology import objects, wire
from bandgate.topology.model import Topology
from bandgate.topology.objects import BindingDecl, ExchangeType, QueueArguments

log = logging.getLogger(__name__)

READS_NOT_MODELLED = (
    "the in-memory broker of bandgate.testing has no AMQP connection for the gateway to read"
    " queues through (stats, dead-letter routes, the console): test those on a real broker"
)

Properties = aiormq.spec.Basic.Properties
ConsumerCallback = Callable[[DeliveredMessage], Awaitable[Any]]


class Clock:
    """The test's clock, in seconds since the harness started; only `advance` moves it. It
    runs the broker's timers (queue TTLs: the delay ladder, aging); message timestamps and
    the ledger's generations keep the real time."""

    def __init__(self) -> None:
        self.now = 0.0


@dataclass
class Stored:
    """One message in one queue."""

    body: bytes
    properties: Properties
    exchange: str
    routing_key: str
    seq: int  # its place: FIFO order, kept when it is given back
    entered: float = 0.0  # on the test's clock, when it entered this queue
    redelivered: bool = False


@dataclass(eq=False)
class MemoryQueue:
    name: str
    arguments: QueueArguments
    ready: list[tuple[tuple[int, int], Stored]] = field(default_factory=list)
    consumers: list[_Consumer] = field(default_factory=list)
    log: list[Stored] = field(default_factory=list)  # a stream's messages, by offset
    unacked: int = 0

    @property
    def stream(self) -> bool:
        return self.arguments.get("x-queue-type") == "stream"

    @property
    def quorum(self) -> bool:
        return self.arguments.get("x-queue-type") == "quorum"

    @property
    def ttl(self) -> float | None:
        ttl = self.arguments.get("x-message-ttl")
        return None if ttl is None else ttl / 1000

    def place(self, stored: Stored) -> tuple[int, int]:
        """Where it stands: by priority first with `x-max-priority`, else by arrival."""
        top = self.arguments.get("x-max-priority")
        if top is None:
            return (0, stored.seq)
        return (-min(stored.properties.priority or 0, top), stored.seq)

    def put(self, stored: Stored) -> None:
        bisect.insort(self.ready, (self.place(stored), stored), key=lambda item: item[0])

    def messages(self) -> list[Stored]:
        """What waits in it, head first (a stream: everything it holds)."""
        return list(self.log) if self.stream else [stored for _, stored in self.ready]

    def active_consumers(self) -> list[_Consumer]:
        if self.arguments.get("x-single-active-consumer"):
            return self.consumers[:1]
        return list(self.consumers)


@dataclass(eq=False)
class _Consumer:
    channel: MemoryChannel
    queue: MemoryQueue
    tag: str
    callback: ConsumerCallback
    offset: int = 0  # a stream consumer's next offset


@dataclass
class _Unacked:
    queue: MemoryQueue
    stored: Stored


class MemoryBroker:
    """The broker: exchanges, queues and bindings from a topology, and the test's clock."""

    # Where RabbitMQ's versions differ, it plays this one's part: FIFO inside a quorum queue,
    # every return counted in `x-delivery-count`; the worker's version checks read it.
    version = "3.10.8"

    def __init__(self, topology: Topology, clock: Clock | None = None) -> None:
        self.topology = topology
        self.clock = clock or Clock()
        plan = objects.plan(topology)
        self.exchanges: dict[str, tuple[ExchangeType, dict[str, str]]] = {
            exchange.name: (exchange.type, exchange.arguments) for exchange in plan.exchanges
        }
        self.queues = {
            queue.name: MemoryQueue(queue.name, queue.arguments) for queue in plan.queues
        }
        self.bindings: dict[str, list[BindingDecl]] = {}
        for binding in plan.bindings:
            self.bindings.setdefault(binding.source, []).append(binding)
        self._seq = itertools.count()
        self._tags = itertools.count(1)
        self._pumping: asyncio.Task[None] | None = None
        self._again = False
        self._loop: asyncio.AbstractEventLoop | None = None

    # -- publishing and routing ----------------------------------------------------------

    def publish(self, exchange: str, routing_key: str, body: bytes, properties: Properties) -> bool:
        """Route a message into its queues; False when no binding took it (returned)."""
        targets = self.route(exchange, routing_key, properties.headers or {})
        for queue in targets:
            self._enqueue(queue, body, _copied(properties), exchange, routing_key)
        self.wake()
        return bool(targets)

    def route(self, exchange: str, routing_key: str, headers: Any) -> list[MemoryQueue]:
        if exchange == "":
            queue = self.queues.get(routing_key)
            return [] if queue is None else [queue]
        found: dict[str, MemoryQueue] = {}
        self._route_into(exchange, routing_key, headers, found, depth=0)
        return list(found.values())

    def _route_into(
        self, exchange: str, key: str, headers: Any, found: dict[str, MemoryQueue], depth: int
    ) -> None:
        if depth > 16 or exchange not in self.exchanges:
            return
        kind, arguments = self.exchanges[exchange]
        bindings = self.bindings.get(exchange, [])
        if kind == "x-consistent-hash":
            value = str(headers.get(arguments.get("hash-header", ""), key))
            bindings = [bindings[zlib.crc32(value.encode()) % len(bindings)]] if bindings else []
        else:
            bindings = [b for b in bindings if _matches(kind, b.routing_key, key)]
        for binding in bindings:
            if binding.destination_type == "exchange":
                self._route_into(binding.destination, key, headers, found, depth + 1)
            elif binding.destination in self.queues:
                found[binding.destination] = self.queues[binding.destination]

    def _enqueue(
        self,
        queue: MemoryQueue,
        body: bytes,
        properties: Properties,
        exchange: str,
        key: str,
        at: float | None = None,
    ) -> None:
        """Into `queue`, as of `at` on the test's clock (None: now)."""
        entered = self.clock.now if at is None else at
        stored = Stored(body, properties, exchange, key, next(self._seq), entered)
        if queue.stream:
            headers = dict(properties.headers or {})
            headers["x-stream-offset"] = len(queue.log)
            stored.properties.headers = headers
            queue.log.append(stored)
        else:
            queue.put(stored)

    # -- the clock: expiry ----------------------------------------------------------------

    def next_expiry(self) -> float | None:
        """When the next waiting message expires, on the test's clock (None: none waits)."""
        due = [
            _due(stored, ttl)
            for queue in self.queues.values()
            if (ttl := queue.ttl) is not None
            for _, stored in queue.ready
        ]
        return min(due, default=None)

    def expire(self) -> int:
        """Dead-letter every waiting message whose queue TTL has run out by now, each at the
        moment it expired (a hop of the ladder that ends before now goes on from there); how
        many expired."""
        count = 0
        while (due := self.next_expiry()) is not None and due <= self.clock.now:
            for queue in list(self.queues.values()):
                ttl = queue.ttl
                expired = [item for item in queue.ready if ttl and _due(item[1], ttl) == due]
                for item in expired:
                    queue.ready.remove(item)
                    self.dead_letter(queue, item[1], "expired", at=due)
                    count += 1
        if count:
            self.wake()
        return count

    def dead_letter(
        self, queue: MemoryQueue, stored: Stored, reason: str, at: float | None = None
    ) -> None:
        """Republish into the queue's dead-letter exchange, with `x-death` (dropped when the
        queue has none, as RabbitMQ drops it)."""
        exchange = queue.arguments.get("x-dead-letter-exchange")
        if exchange is None:
            return
        key = queue.arguments.get("x-dead-letter-routing-key", stored.routing_key)
        properties = _copied(stored.properties)
        headers: dict[str, Any] = dict(properties.headers or {})
        death = {
            "count": 1,
            "reason": reason,
            "queue": queue.name,
            "time": wire.now().replace(microsecond=0),
            "exchange": stored.exchange,
            "routing-keys": [stored.routing_key],
        }
        headers["x-death"] = [death, *(headers.get("x-death") or [])]
        headers.setdefault("x-first-death-reason", reason)
        headers.setdefault("x-first-death-queue", queue.name)
        headers.setdefault("x-first-death-exchange", stored.exchange)
        properties.headers = headers
        for target in self.route(exchange, key, headers):
            self._enqueue(target, stored.body, _copied(properties), exchange, key, at)

    # -- consuming ------------------------------------------------------------------------

    def consume(
        self, channel: MemoryChannel, queue: str, callback: ConsumerCallback, tag: str, offset: Any
    ) -> None:
        found = self._queue(queue)
        start = 0
        if found.stream and isinstance(offset, int):
            start = offset
        elif found.stream and offset != "first":
            start = len(found.log)  # "next", "last" and times: from the end
        found.consumers.append(_Consumer(channel, found, tag, callback, start))
        self.wake()

    def cancel(self, tag: str) -> None:
        for queue in self.queues.values():
            queue.consumers = [c for c in queue.consumers if c.tag != tag]

    def settle(self, channel: MemoryChannel, tag: int, *, requeue: bool | None) -> None:
        """An ack (`requeue` None), or a nack or reject with or without requeue."""
        unacked = channel.unacked.pop(tag, None)
        if unacked is None:
            return  # a stream's, or already settled
        unacked.queue.unacked -= 1
        if requeue is None:
            pass
        elif requeue:
            self._return(unacked)
        else:
            self.dead_letter(unacked.queue, unacked.stored, "rejected")
        self.wake()

    def _return(self, unacked: _Unacked) -> None:
        stored = unacked.stored
        stored.redelivered = True
        if unacked.queue.quorum:
            headers = dict(stored.properties.headers or {})
            headers[wire.DELIVERY_COUNT] = (
                wire.header_int(headers.get(wire.DELIVERY_COUNT)) or 0
            ) + 1
            stored.properties.headers = headers
        unacked.queue.put(stored)

    def channel_closed(self, channel: MemoryChannel) -> None:
        """The broker takes back what the channel held unacked, in its place."""
        for queue in self.queues.values():
            queue.consumers = [c for c in queue.consumers if c.channel is not channel]
        for tag in sorted(channel.unacked):
            self.settle(channel, tag, requeue=True)

    def _queue(self, name: str) -> MemoryQueue:
        try:
            return self.queues[name]
        except KeyError:
            raise aiormq.exceptions.ChannelNotFoundEntity(
                f"NOT_FOUND - no queue '{name}'"
            ) from None

    # -- delivering -----------------------------------------------------------------------

    def wake(self) -> None:
        """Deliver what can be delivered, in a task of its own (as the broker pushes), on the
        event loop the broker first ran on: a Starlette `TestClient` publishes from a thread
        and loop of its own, while the worker's runners live on the test's."""
        loop = asyncio.get_running_loop()
        home = self._loop = self._loop or loop
        if home is not loop:
            home.call_soon_threadsafe(self.wake)
            return
        if self._pumping is not None:
            self._again = True
            return
        self._pumping = loop.create_task(self._pump())

    async def close(self) -> None:
        """Stop delivering (what a pump was handing out is dropped with it)."""
        pumping, self._pumping = self._pumping, None
        if pumping is not None:
            pumping.cancel()
            await asyncio.gather(pumping, return_exceptions=True)

    async def delivered(self) -> None:
        """Until everything deliverable now was delivered."""
        while (pumping := self._pumping) is not None:
            await asyncio.wait({pumping})

    async def _pump(self) -> None:
        try:
            while True:
                self._again = False
                delivered = 0
                for consumer, stored, tag in list(self._deliveries()):
                    delivered += 1
                    await consumer.callback(self._delivered(consumer, stored, tag))
                if not delivered and not self._again:
                    return
        finally:
            self._pumping = None

    def _deliveries(self) -> Iterator[tuple[_Consumer, Stored, int]]:
        """Each delivery due now, marked unacked as it is chosen: hottest queues first, in
        the order the topology declares them."""
        for queue in self.queues.values():
            for consumer in queue.active_consumers():
                if consumer.channel.is_closed:
                    continue
                if queue.stream:
                    while consumer.offset < len(queue.log):
                        consumer.offset += 1
                        yield consumer, queue.log[consumer.offset - 1], consumer.channel.tag()
                    continue
                while queue.ready and consumer.channel.room():
                    _, stored = queue.ready.pop(0)
                    tag = consumer.channel.tag()
                    consumer.channel.unacked[tag] = _Unacked(queue, stored)
                    queue.unacked += 1
                    yield consumer, stored, tag

    def _delivered(self, consumer: _Consumer, stored: Stored, tag: int) -> DeliveredMessage:
        # consumer tag, delivery tag, redelivered, exchange, routing key
        deliver = Basic.Deliver(
            consumer.tag, tag, stored.redelivered, stored.exchange, stored.routing_key
        )
        header: Any = _Header(_copied(stored.properties))  # what readers take of pamqp's
        channel: Any = consumer.channel
        return DeliveredMessage(deliver, header, stored.body, channel)

    def idle(self) -> bool:
        """Nothing to deliver and nothing delivered unsettled: every consumed queue is empty
        and unacked-free, and every stream consumer has read to the end."""
        if self._pumping is not None:
            return False
        for queue in self.queues.values():
            if not queue.consumers:
                continue
            if queue.stream:
                if any(c.offset < len(queue.log) for c in queue.consumers):
                    return False
            elif queue.ready or queue.unacked:
                return False
        return True

    def next_tag(self) -> int:
        return next(self._tags)


def _due(stored: Stored, ttl: float) -> float:
    """When it expires: to the microsecond, so that hops of 50 ms x 2^k add up exactly."""
    return round(stored.entered + ttl, 6)


@dataclass(frozen=True)
class _Header:
    """A delivery's content header: its properties are all a reader takes of it."""

    properties: Properties


def _matches(kind: ExchangeType, pattern: str, key: str) -> bool:
    if kind == "topic":
        return _topic(pattern.split("."), key.split("."))
    return pattern == key


def _topic(pattern: list[str], words: list[str]) -> bool:
    """AMQP topic matching: `*` is one word, `#` zero or more."""
    if not pattern:
        return not words
    head, rest = pattern[0], pattern[1:]
    if head == "#":
        return any(_topic(rest, words[skip:]) for skip in range(len(words) + 1))
    if not words:
        return False
    return (head in ("*", words[0])) and _topic(rest, words[1:])


def _copied(properties: Properties) -> Properties:
    fresh = copy.copy(properties)
    fresh.headers = dict(properties.headers or {})
    return fresh


# -- the stand-ins for aio-pika's connection and channels -------------------------------------


class MemoryChannel:
    """One channel: stands in for aio-pika's channel and for aiormq's underneath it."""

    is_closed = False

    def __init__(self, broker: MemoryBroker, number: int) -> None:
        self.broker = broker
        self.number = number
        self.prefetch = 0  # no limit
        self.unacked: dict[int, _Unacked] = {}
        self.close_callbacks: set[Callable[..., Any]] = set()
        self.on_consumer_cancel_callbacks: set[Callable[..., Any]] = set()
        self._tags = itertools.count(1)

    def tag(self) -> int:
        return next(self._tags)

    def room(self) -> bool:
        return not self.prefetch or len(self.unacked) < self.prefetch

    async def set_qos(self, prefetch_count: int = 0, **_: Any) -> None:
        self.prefetch = prefetch_count
        self.broker.wake()

    async def get_underlay_channel(self) -> MemoryChannel:
        return self

    async def queue_declare(self, queue: str, passive: bool = False, **_: Any) -> Queue.DeclareOk:
        found = self.broker._queue(queue)
        count = len(found.log) if found.stream else len(found.ready)
        return Queue.DeclareOk(queue, count, len(found.consumers))

    async def basic_consume(
        self,
        queue: str,
        consumer_callback: ConsumerCallback,
        *,
        arguments: dict[str, Any] | None = None,
        consumer_tag: str | None = None,
        **_: Any,
    ) -> Basic.ConsumeOk:
        tag = consumer_tag or f"memory.{self.broker.next_tag()}"
        offset = (arguments or {}).get("x-stream-offset", "next")
        self.broker.consume(self, queue, consumer_callback, tag, offset)
        return Basic.ConsumeOk(tag)

    async def basic_cancel(self, consumer_tag: str, **_: Any) -> Basic.CancelOk:
        self.broker.cancel(consumer_tag)
        return Basic.CancelOk(consumer_tag)

    async def basic_ack(self, delivery_tag: int, multiple: bool = False) -> None:
        tags = [t for t in self.unacked if t <= delivery_tag] if multiple else [delivery_tag]
        for tag in tags:
            self.broker.settle(self, tag, requeue=None)

    async def basic_nack(
        self, delivery_tag: int, multiple: bool = False, requeue: bool = True
    ) -> None:
        self.broker.settle(self, delivery_tag, requeue=requeue)

    async def basic_reject(self, delivery_tag: int, *, requeue: bool = True) -> None:
        self.broker.settle(self, delivery_tag, requeue=requeue)

    async def close(self, *_: Any) -> None:
        if self.is_closed:
            return
        self.is_closed = True
        self.broker.channel_closed(self)
        for callback in list(self.close_callbacks):
            callback(self, None)


class MemoryConnection:
    """Stands in for aio-pika's connection: it opens `MemoryChannel`s."""

    transport = None  # `core.broker.is_blocked`: never blocked
    is_closed = False

    def __init__(self, broker: MemoryBroker) -> None:
        self.broker = broker
        self._numbers = itertools.count(1)

    async def channel(self, *_: Any, **__: Any) -> MemoryChannel:
        return MemoryChannel(self.broker, next(self._numbers))

    async def close(self) -> None:
        self.is_closed = True


class MemoryAcks(AckWriter):
    """Acks handed to the in-memory channel at once (the real writer writes ack frames)."""

    def ack(self, channel: Any, delivery_tag: int, unsettled: Unsettled | None = None) -> None:
        if unsettled is not None:
            unsettled.tags.discard(delivery_tag)
        memory: MemoryChannel = channel
        if memory.is_closed:
            raise aiormq.exceptions.ChannelInvalidStateError(f"{memory!r} is closed")
        memory.broker.settle(memory, delivery_tag, requeue=None)


class _Pipeline:
    """A `PublishPipeline` into the broker: confirmed at once, or returned when unroutable."""

    is_closed = False

    def __init__(self, broker: MemoryBroker) -> None:
        self.broker = broker

    def publish(
        self, exchange: str, routing_key: str, body: bytes, properties: Properties
    ) -> Confirmation:
        confirmation: Confirmation = asyncio.get_running_loop().create_future()
        if self.broker.publish(exchange, routing_key, body, properties):
            confirmation.set_result(Basic.Ack())
        else:
            # Returned: no binding took this mandatory publish (`check_acked` reads anything
            # but an ack as unroutable).
            confirmation.set_result(None)
        return confirmation


class MemoryChannels:
    """A `PublishChannels` of the broker, for a `Publisher` or a `Producer`."""

    def __init__(self, broker: MemoryBroker) -> None:
        self._pipeline: PublishPipeline = _Pipeline(broker)

    def ready(self) -> PublishPipeline | None:
        return self._pipeline

    async def get(self) -> PublishPipeline:
        return self._pipeline

    async def close(self) -> None:
        return None


class MemoryLink(BrokerLink):
    """The gateway's broker link over the in-memory broker: `create_app(link=...)` serves
    the HTTP API into it (publish, batch, cancel, replace, escalate, `/healthz`, `/readyz`).
    Always connected for publishing, and with no AMQP connection: what the gateway reads
    through one (`/stats`, the DLQ routes, the console's sampler) answers 503 with `problem`
    (READS_NOT_MODELLED), as for a broker it cannot reach."""

    def __init__(self, broker: MemoryBroker) -> None:
        super().__init__(
            "amqp://in-memory/",
            broker.topology,
            declare_topology=False,
            where="the in-memory broker of bandgate.testing",
            channels=MemoryChannels(broker),
        )
        self._broker = broker
        self.problem = READS_NOT_MODELLED

    @property
    def connected(self) -> bool:
        return True

    @property
    def blocked(self) -> bool:
        return False

    @property
    def version(self) -> str:
        return f"in-memory, as RabbitMQ {self._broker.version}"

    async def start(self, wait: float = 0.0) -> None:
        return None

    async def check_ready(self) -> str | None:
        return None

    async def close(self) -> None:
        return None
