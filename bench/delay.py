"""Delay accuracy: lateness (arrival in the band - due time) of messages delayed 1-30 s
through the TTL ladder, idle and while 1,000 msg/s of other traffic flows.

The measuring process publishes the delayed messages (through the publishing core, as the
gateway does) and consumes them from `orders.hot`. Under load, the other traffic comes from
processes of their own, as in production: a paced publisher sending 1 KiB messages to
`orders.cold` at `LOAD_RATE`, and a plain aio-pika consumer draining it, so the measuring
process's own event loop is not what makes a message late.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from datetime import timedelta
from typing import Any

import aio_pika
import orjson

from bandgate.core.publishing import ChannelSet, Publisher, confirm_channel_factory
from bandgate.topology import naming, wire
from bandgate.topology.loader import load_topology
from bandgate.topology.wire import Envelope
from bench.environment import BenchBroker, cpu_seconds
from bench.paced_publisher import PacedConfig, PacedPublisher
from bench.stage import reset_bands
from bench.worker_process import WorkerConfig, WorkerProcess

DELAYED = 300
SPREAD_SECONDS = (1.0, 30.0)
LOAD_RATE = 1000
QUEUE = "orders"


async def _measure(url: str) -> list[float]:
    """Publish `DELAYED` messages due in 1-30 s; each one's lateness in ms as it arrives."""
    topology = load_topology()
    connection = await aio_pika.connect(url)
    publisher = Publisher(topology, ChannelSet(confirm_channel_factory(connection)))
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

    await (await channel.get_queue(naming.band_queue(QUEUE, "hot"))).consume(on_delayed)
    rng = random.Random(7)
    for _ in range(DELAYED):
        seconds = rng.uniform(*SPREAD_SECONDS)
        now = wire.now()
        due = now + timedelta(seconds=seconds)
        await publisher.publish(
            Envelope(queue=QUEUE, payload={"due": due.timestamp()}, priority=8,
                     enqueued_at=now, deliver_at=due)
        )  # fmt: skip
    await asyncio.wait_for(done.wait(), timeout=SPREAD_SECONDS[1] + 30)
    await connection.close()
    return lateness


def _row(name: str, lateness: list[float], **extra: float) -> dict[str, Any]:
    ordered = sorted(lateness)
    q = statistics.quantiles(ordered, n=100)
    return {
        "name": name,
        "p50_ms": q[49],
        "p99_ms": q[98],
        "max_ms": ordered[-1],
        "min_ms": ordered[0],
        **extra,
    }


def _under_load(broker: BenchBroker) -> dict[str, Any]:
    topology = load_topology()
    cold = naming.band_queue(QUEUE, "cold")
    consumer = WorkerConfig(
        kind="plain", amqp_url=broker.amqp_url, concurrency=16, queues=[(cold, 64)]
    )
    load = PacedConfig(
        amqp_url=broker.amqp_url,
        exchange=topology.exchange,
        routing_key=naming.routing_key(QUEUE, 1),
        priority=1,
        rate=LOAD_RATE,
        warmup_seconds=1.0,
        seconds=SPREAD_SECONDS[1] + 60,  # outlasts the measurement; stopped when it is done
        run="load",
    )
    with WorkerProcess(consumer) as drain, PacedPublisher(load) as publisher:
        publisher.measuring()
        broker_cpu0, started = cpu_seconds(broker.pid), time.time()
        lateness = asyncio.run(_measure(broker.amqp_url))
        broker_cpu, seconds = cpu_seconds(broker.pid) - broker_cpu0, time.time() - started
        record = drain.stop()
    consumed = {int(second): n for second, n in record["background"].items()}
    within = [n for second, n in consumed.items() if started <= second < started + seconds - 1]
    return _row(
        "delay 1-30 s, under 1k msg/s load",
        lateness,
        load_msg_s=statistics.mean(within) if within else 0.0,
        broker_cores=broker_cpu / seconds,
    )


def run_delay(broker: BenchBroker) -> list[dict[str, Any]]:
    """Idle first, then under load."""
    asyncio.run(reset_bands(broker))
    idle_cpu0, started = cpu_seconds(broker.pid), time.time()
    idle = asyncio.run(_measure(broker.amqp_url))
    broker_cores = (cpu_seconds(broker.pid) - idle_cpu0) / (time.time() - started)
    rows = [_row("delay 1-30 s, idle", idle, load_msg_s=0.0, broker_cores=broker_cores)]
    rows.append(_under_load(broker))
    return rows
