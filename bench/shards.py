"""Priority across the shards of a band: the worker's merge over the shards' heads, on and off.

A band of `SHARDS` quorum queues (one band, priorities 0-9) holds a backlog of `BACKLOG`
messages of random priorities 0-9 over `KEYS` random partition keys, published through
bandgate's Publisher (the consistent-hash exchange picks each key's shard) before the worker
starts. The bandgate worker's `ConsumerRunner`, built as `bandgate worker` builds it, drains it
at concurrency `CONCURRENCY` with a `HANDLER_MS` handler: with the merge
(`bandgate.consumers.scheduling`: a free slot starts the best head among the shards' buffers) and
without it (`arrival_order`: the band's deliveries in arrival order, as before the merge),
`ROUNDS` rounds, interleaved.
Two prefetches: the default (the band's 2C split over the shards, 2 each at C = 4: a shard
never holds more than 2 of the slots, whatever it holds) and 2C per shard (each shard's head is
nearly always at hand, so the merge has something to choose from).

Figures, each the median over the rounds with every round's beside it:
- `inversions_per_msg`: pairs i < j in start order where j's priority is higher than i's, over
  the backlog, divided by its size. A random order of uniform priorities 0-9 has about
  0.45 x (N - 1) / 2 (450 for 2,000); the broker's own order within each shard bounds what any
  worker can do (4.3: by priority; 3.10: publish order).
- `not_best_head_pct`: starts for which another shard's head at hand (the first message of its
  shard whose key was not running) had a higher priority.
- `rate`: messages started per second, from the first start to the last.
The worker runs in this process (the merge can only be switched off in code); each run waits
for a quiet machine first.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field
from typing import Any
from unittest import mock

import aio_pika

from bandgate.consumers import ConsumerApp, Message, scheduling
from bandgate.consumers.message import read_priority
from bandgate.consumers.runner import ConsumerRunner, Timings
from bandgate.consumers.scheduling import ShardMerge
from bandgate.consumers.settings import WorkerSettings
from bandgate.consumers.settlement import Settler
from bandgate.consumers.subscription import Delivery
from bandgate.consumers.worker import run_on_event_loop
from bandgate.core.publishing import ChannelSet, Published, Publisher, confirm_channel_factory
from bandgate.topology.declare import apply_topology, broker_version
from bandgate.topology.loader import parse_topology
from bandgate.topology.model import QueueSpec
from bandgate.topology.wire import Envelope
from bench.environment import BenchBroker, wait_for_quiet
from bench.rounds import ROUNDS, with_median

QUEUE = "bench-shards"
SHARDS = 4
BACKLOG = 2_000
KEYS = 200
CONCURRENCY = 4
HANDLER_MS = 2.0
TOPOLOGY = parse_topology(
    {
        "exchange": "bench-shards",
        "delay": {"levels": 2},
        "queues": {QUEUE: {"bands": [{"name": "all", "priorities": [0, 9], "shards": SHARDS}]}},
    }
)
SPEC = TOPOLOGY.queue(QUEUE)
BAND = SPEC.bands[0]
NAMES = {True: "merge", False: "arrival order"}
PREFETCHES: dict[str, dict[str, int] | None] = {
    "default prefetch": None,
    "2C per shard": {BAND.name: 2 * CONCURRENCY * SHARDS},
}


@dataclass
class Picks:
    """What the dispatcher started, and whether a hotter head of another shard was at hand."""

    starts: list[tuple[int, float]] = field(default_factory=list)  # (priority, time)
    not_best: int = 0
    done: asyncio.Event = field(default_factory=asyncio.Event)


def inversions(priorities: list[int]) -> int:
    """Pairs i < j with priorities[j] > priorities[i]."""
    seen = [0] * 10
    count = 0
    for priority in priorities:
        count += sum(seen[:priority])
        seen[priority] += 1
    return count


def arrival_order(spec: QueueSpec) -> ShardMerge[Delivery]:
    """No merge: each band one sequence in arrival order, as a band of one queue."""
    return ShardMerge(shards=(1,) * len(spec.bands), source=lambda _: 0, rank=lambda _: (0, 0.0))


def trace_picks(runner: ConsumerRunner, picks: Picks) -> None:
    """Check every start against the heads the other shards had at hand as it was made."""
    dispatcher = runner.dispatcher
    take_nowait = dispatcher.take_nowait

    def traced(headroom: bool = True) -> tuple[int, Delivery] | None:
        taken = take_nowait(headroom)
        if taken is None:
            return None
        started = taken[1]
        heads: dict[int, Delivery] = {}
        # The start made its key busy, which only its own shard holds: the other shards'
        # heads are the same as before it.
        for delivery in dispatcher.at_hand(0):
            heads.setdefault(delivery.subscription.shard, delivery)
        heads.pop(started.subscription.shard, None)
        priority = read_priority(started.incoming, BAND)
        if any(read_priority(head.incoming, BAND) > priority for head in heads.values()):
            picks.not_best += 1
        return taken

    dispatcher.take_nowait = traced  # type: ignore[method-assign]


async def _publish_backlog(connection: aio_pika.abc.AbstractRobustConnection, seed: int) -> None:
    rng = random.Random(seed)
    publisher = Publisher(TOPOLOGY, ChannelSet(confirm_channel_factory(connection), size=1))
    envelopes = [
        Envelope(
            queue=QUEUE,
            payload={"n": n},
            priority=rng.randint(0, 9),
            partition_key=f"key-{rng.randrange(KEYS)}",
        )
        for n in range(BACKLOG)
    ]
    for start in range(0, BACKLOG, 500):
        results = await publisher.publish_many(envelopes[start : start + 500])
        assert all(isinstance(result, Published) for result in results), results
    await publisher.channels.close()
    await _wait_for_depth(connection, BACKLOG)


async def _wait_for_depth(connection: aio_pika.abc.AbstractRobustConnection, depth: int) -> None:
    channel = await connection.channel()
    underlay = await channel.get_underlay_channel()
    deadline = time.monotonic() + 30
    while True:
        found = 0
        for name in SPEC.band_queues(BAND):
            found += (await underlay.queue_declare(name, passive=True)).message_count or 0
        if found == depth:
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"the shards hold {found} messages, not {depth}")
        await asyncio.sleep(0.1)
    await channel.close()


async def _drain(
    broker: BenchBroker, merge: bool, prefetch: dict[str, int] | None, seed: int
) -> dict[str, Any]:
    settings = WorkerSettings(amqp_url=broker.amqp_url)
    connection = await aio_pika.connect_robust(
        broker.amqp_url, client_properties={"connection_name": settings.connection_name}
    )
    async with connection:
        await apply_topology(connection, TOPOLOGY)
        broker.version = broker_version(connection)
        await _publish_backlog(connection, seed)
        app = ConsumerApp(settings, topology=TOPOLOGY)
        picks = Picks()
        pause = HANDLER_MS / 1000

        @app.consumer(QUEUE, concurrency=CONCURRENCY, prefetch=prefetch)
        async def handle(msg: Message) -> None:
            picks.starts.append((msg.priority, time.perf_counter()))
            if len(picks.starts) == BACKLOG:
                picks.done.set()
            await asyncio.sleep(pause)

        publisher = Publisher(TOPOLOGY, ChannelSet(confirm_channel_factory(connection)))
        merges = scheduling.shard_merge if merge else arrival_order
        with mock.patch.object(scheduling, "shard_merge", merges):  # in code only: see above
            runner = ConsumerRunner(
                app.consumers[0],
                connection,
                Settler(publisher),
                concurrency=CONCURRENCY,
                timings=Timings.of(settings),
            )
        trace_picks(runner, picks)
        await runner.open()
        loop = asyncio.create_task(runner.run())
        try:
            await asyncio.wait_for(picks.done.wait(), 120)
        finally:
            await runner.stop_consuming()
            await asyncio.gather(*runner.in_flight, return_exceptions=True)
            await runner.close()
            loop.cancel()
            await asyncio.gather(loop, return_exceptions=True)
            await publisher.channels.close()
        await _wait_for_depth(connection, 0)
    priorities = [priority for priority, _ in picks.starts]
    first, last = picks.starts[0][1], picks.starts[-1][1]
    return {
        "inversions_per_msg": inversions(priorities) / BACKLOG,
        "not_best_head_pct": 100 * picks.not_best / BACKLOG,
        "rate": (BACKLOG - 1) / (last - first),
    }


def _run(
    broker: BenchBroker, merge: bool, prefetch: dict[str, int] | None, seed: int
) -> dict[str, Any]:
    wait_for_quiet()
    result: dict[str, Any] = run_on_event_loop(_drain(broker, merge, prefetch, seed))
    return result


def run_shards(broker: BenchBroker) -> list[dict[str, Any]]:
    contenders = [(merge, name) for name in PREFETCHES for merge in (True, False)]
    runs: dict[tuple[bool, str], list[dict[str, Any]]] = {c: [] for c in contenders}
    for round_ in range(ROUNDS):
        order = contenders if round_ % 2 == 0 else contenders[::-1]
        for merge, name in order:  # the same backlog for every contender of a round
            runs[merge, name].append(_run(broker, merge, PREFETCHES[name], seed=round_))
    rows = []
    for (merge, name), done in runs.items():
        row: dict[str, Any] = {"name": f"{NAMES[merge]}, {name}, RabbitMQ {broker.version}"}
        for key in ("inversions_per_msg", "not_best_head_pct", "rate"):
            row = with_median(row, done, key)
        rows.append(row)
    return rows
