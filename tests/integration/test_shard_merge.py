"""A sharded band's backlog on a real broker: one worker at concurrency 1 starts the best head
among the shards each time (`consumers.scheduling`), on whichever RabbitMQ the session runs.

The backlog is in the shards before the worker starts, and the band's prefetch covers all of
it, so the whole backlog is at hand before the first start (`ConsumerRunner.open` waits for it)
and the start order is exactly the merge of the shards' broker orders. (With a smaller prefetch
a shard's next message may still be on its way when a slot frees, and the slot starts the best
head at hand without it.) What each shard's broker order is depends on the version:

- 3.10: publish order (quorum queues are FIFO), so only the heads are merged by priority;
- 4.0: priorities 5-9 ahead of 0-4, each in publish order;
- 4.3: strict priority order, publish order within a priority; the merge of such shards is the
  whole backlog by priority, then age: the run starts in non-increasing priority order.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from datetime import timedelta

import pytest
from aio_pika.abc import AbstractRobustConnection

from bandgate.consumers import ConsumerApp, Message
from bandgate.consumers.scheduling import BandBuffer
from bandgate.consumers.settings import WorkerSettings
from bandgate.consumers.worker import Worker
from bandgate.topology import wire
from bandgate.topology.declare import apply_topology, broker_version, parse_version
from bandgate.topology.loader import parse_topology
from bandgate.topology.wire import Envelope

pytestmark = pytest.mark.integration

SHARDS = 4
PER_SHARD = 15
TOPOLOGY = parse_topology(
    {
        "delay": {"levels": 2},
        "queues": {"merged": {"bands": [{"name": "all", "priorities": [0, 9], "shards": SHARDS}]}},
    }
)
SPEC = TOPOLOGY.queue("merged")
QUEUES = SPEC.band_queues(SPEC.bands[0])


async def publish_backlog(amqp: AbstractRobustConnection) -> dict[str, tuple[int, Envelope]]:
    """Random priorities 0-9 straight into the shards (so the test knows each one's content),
    enqueued 1 ms apart in publish order: message id -> (shard, envelope)."""
    rng = random.Random(20260)
    start = wire.now()
    backlog: dict[str, tuple[int, Envelope]] = {}
    channel = await amqp.channel()  # publisher confirms: all of it is in the shards after
    for n in range(SHARDS * PER_SHARD):
        shard = rng.randrange(SHARDS)
        envelope = Envelope(
            queue=SPEC.name,
            payload=n,
            priority=rng.randint(0, 9),
            message_id=f"m-{n:02d}",
            enqueued_at=start + timedelta(milliseconds=n),
        )
        await channel.default_exchange.publish(wire.encode(envelope), routing_key=QUEUES[shard])
        backlog[envelope.message_id] = (shard, envelope)
    await channel.close()
    return backlog


def merged(shards: list[list[Envelope]]) -> list[str]:
    """What the merge starts, one at a time, from shards holding these sequences."""
    buffer: BandBuffer[tuple[int, Envelope]] = BandBuffer(
        SHARDS,
        source=lambda item: item[0],
        rank=lambda item: (-item[1].priority, item[1].enqueued_at.timestamp() * 1000),
    )
    for shard, sequence in enumerate(shards):
        for envelope in sequence:
            buffer.append((shard, envelope))
    order = []
    while (head := buffer.head(set())) is not None:
        order.append(buffer.pop(head)[1].message_id)
    return order


async def test_a_worker_starts_a_sharded_backlog_best_head_first(
    amqp_url: str,
    amqp: AbstractRobustConnection,
    start_worker: Callable[[ConsumerApp], Awaitable[Worker]],
) -> None:
    await apply_topology(amqp, TOPOLOGY)
    backlog = await publish_backlog(amqp)
    settings = WorkerSettings(amqp_url=amqp_url, startup_prime_seconds=30)
    app = ConsumerApp(settings, topology=TOPOLOGY)
    started: list[str] = []
    all_started = asyncio.Event()

    @app.consumer(SPEC.name, concurrency=1, prefetch={"all": SHARDS * len(backlog)})
    async def handle(msg: Message) -> None:
        started.append(msg.message_id)
        if len(started) == len(backlog):
            all_started.set()

    await start_worker(app)
    await asyncio.wait_for(all_started.wait(), 30)
    assert sorted(started) == sorted(backlog)

    # Each shard's messages in the order the worker started them: its broker order.
    shards: list[list[Envelope]] = [[] for _ in range(SHARDS)]
    for message_id in started:
        shard, envelope = backlog[message_id]
        shards[shard].append(envelope)
    assert started == merged(shards)  # every start was the best head among the shards

    published = [[e for s, e in backlog.values() if s == shard] for shard in range(SHARDS)]
    version = parse_version(broker_version(amqp))
    for sequence, sent in zip(shards, published, strict=True):
        if version < (4, 0):
            assert sequence == sent
        elif version < (4, 3):
            for high in (True, False):
                assert [e for e in sequence if (e.priority >= 5) == high] == [
                    e for e in sent if (e.priority >= 5) == high
                ]
        else:
            assert sequence == sorted(sent, key=lambda e: -e.priority)
    priorities = [backlog[message_id][1].priority for message_id in started]
    print(f"RabbitMQ {version}: started priorities {priorities}")
    if version >= (4, 3):
        assert priorities == sorted(priorities, reverse=True)
        ordered = sorted(
            backlog.values(), key=lambda item: (-item[1].priority, item[1].enqueued_at)
        )
        assert started == [envelope.message_id for _, envelope in ordered]
