"""Delay accuracy: lateness (arrival in the band - due time) of messages delayed 1-30 s
through the TTL ladder, idle and while 1,000 msg/s of other traffic flows."""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from datetime import timedelta
from typing import Any

import aio_pika
import orjson

from bench.environment import BenchBroker
from gateway.publishing import ChannelSet, Publisher, confirm_channel_factory
from topology import naming, wire
from topology.declare import apply_topology
from topology.loader import load_topology
from topology.wire import Envelope

DELAYED = 300
SPREAD_SECONDS = (1.0, 30.0)
LOAD_RATE = 1000


async def _measure(url: str, under_load: bool, version: list[str]) -> dict[str, Any]:
    topology = load_topology()
    connection = await aio_pika.connect(url)
    report = await apply_topology(connection, topology)
    version.append(report.broker_version)
    publisher = Publisher(topology, ChannelSet(confirm_channel_factory(connection)))
    hot = naming.band_queue("orders", "hot")
    cold = naming.band_queue("orders", "cold")
    lateness: list[float] = []
    done = asyncio.Event()
    channel = await connection.channel()
    await channel.set_qos(prefetch_count=500)

    async def on_delayed(message: aio_pika.abc.AbstractIncomingMessage) -> None:
        arrived = time.time()
        due = orjson.loads(message.body)["due"]
        lateness.append((arrived - due) * 1000)
        await message.ack()
        if len(lateness) >= DELAYED:
            done.set()

    async def on_load(message: aio_pika.abc.AbstractIncomingMessage) -> None:
        await message.ack()

    await (await channel.get_queue(hot)).consume(on_delayed)
    await (await channel.get_queue(cold)).consume(on_load)

    stop = asyncio.Event()

    load_sent = 0
    load_started = time.perf_counter()

    async def background_load() -> None:
        """Paced at LOAD_RATE with at most 256 publishes in flight; reports what it reached."""
        nonlocal load_sent, load_started
        interval = 1 / LOAD_RATE
        window = asyncio.Semaphore(256)
        load_started = time.perf_counter()

        async def one(n: int) -> None:
            try:
                await publisher.publish(Envelope(queue="orders", payload={"n": n}, priority=1))
            finally:
                window.release()

        tasks: set[asyncio.Task[None]] = set()
        while not stop.is_set():
            delay = load_started + load_sent * interval - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            await window.acquire()
            task = asyncio.create_task(one(load_sent))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            load_sent += 1
        await asyncio.gather(*tasks, return_exceptions=True)

    loader = asyncio.create_task(background_load()) if under_load else None
    rng = random.Random(7)
    for _ in range(DELAYED):
        seconds = rng.uniform(*SPREAD_SECONDS)
        now = wire.now()
        due = now + timedelta(seconds=seconds)
        await publisher.publish(
            Envelope(queue="orders", payload={"due": due.timestamp()}, priority=8,
                     enqueued_at=now, deliver_at=due)
        )  # fmt: skip
    await asyncio.wait_for(done.wait(), timeout=SPREAD_SECONDS[1] + 30)
    stop.set()
    if loader:
        await loader
    await connection.close()
    ordered = sorted(lateness)
    q = statistics.quantiles(ordered, n=100)
    return {
        "name": f"delay 1-30 s, {'under 1k msg/s load' if under_load else 'idle'}",
        "p50_ms": q[49],
        "p99_ms": q[98],
        "max_ms": ordered[-1],
        "min_ms": ordered[0],
        "load_msg_s": load_sent / (time.perf_counter() - load_started) if under_load else 0.0,
    }


def run_delay(broker: BenchBroker) -> list[dict[str, Any]]:
    """Idle first, then under load; each in its own event loop and connection."""
    version: list[str] = []
    rows = [asyncio.run(_measure(broker.amqp_url, load, version)) for load in (False, True)]
    broker.version = version[-1]
    return rows
