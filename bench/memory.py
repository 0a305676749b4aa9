"""Memory: worker and gateway RSS while the backlog grows tenfold (10k -> 100k messages).

A bandgate worker (its own process, the library as shipped, `CONCURRENCY` slots, a slow
`HANDLER_MS` handler, so the backlog stays) consumes `orders` while the backlog, spread
evenly over the three bands, is first `SMALL` and then `LARGE` messages (the rest is filled
with `bench.raw_amqp` while the worker runs). The gateway (uvicorn, its own process) takes the
same HTTP traffic in each phase, `TRAFFIC` messages in batch requests, so its RSS is read after
equal work. After `SETTLE` seconds in a phase, RSS (VmRSS) is read `SAMPLES` times, half a
second apart; the phase's figure is the highest reading. The worker's RSS must not depend on
the backlog: prefetch bounds what it holds.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aio_pika
import orjson

from bandgate.topology import naming, wire
from bandgate.topology.declare import apply_topology, broker_version
from bandgate.topology.loader import load_topology
from bench.environment import BenchBroker, rss_kib
from bench.http_client import RawHttp
from bench.raw_amqp import fill
from bench.stage import gateway_process
from bench.worker_process import WorkerConfig, WorkerProcess

SMALL = 10_000
LARGE = 100_000
CONCURRENCY = 16
HANDLER_MS = 100.0
TRAFFIC = 2_000
BATCH = 100
SETTLE = 4.0
SAMPLES = 5
QUEUE = "orders"
PRIORITIES = (8, 5, 1)  # one per band
PAYLOAD = {"data": "x" * 1000}


async def _bands(broker: BenchBroker, *, prepare: bool = False, purge: bool = False) -> int:
    """Messages ready in the bands; `prepare` applies the topology, `purge` empties the bands."""
    topology = load_topology()
    connection = await aio_pika.connect(broker.amqp_url)
    async with connection:
        if prepare:
            await apply_topology(connection, topology)
            broker.version = broker_version(connection)
        channel = await connection.channel()
        ready = 0
        for band in topology.queue(QUEUE).bands:
            queue = await channel.declare_queue(naming.band_queue(QUEUE, band.name), passive=True)
            ready += queue.declaration_result.message_count or 0
            if purge:
                await queue.purge()
    return ready


def _grow(broker: BenchBroker, count: int) -> None:
    """`count` more messages, an equal share in each band."""
    exchange = load_topology().exchange
    for index, priority in enumerate(PRIORITIES):
        share = count // len(PRIORITIES) + (index < count % len(PRIORITIES))
        message = wire.encode(wire.Envelope(queue=QUEUE, payload=PAYLOAD, priority=priority))
        fill(broker.amqp_url, exchange, naming.routing_key(QUEUE, priority), message, share)


async def _post_traffic(port: int) -> None:
    """TRAFFIC messages through the gateway, BATCH per request, over four connections."""
    http = RawHttp("127.0.0.1", port, 4)
    for _ in range(100):
        try:
            await http.open()
            break
        except OSError:
            await asyncio.sleep(0.1)
    else:
        raise RuntimeError(f"the gateway did not listen on port {port}")
    batch = orjson.dumps(
        {"messages": [{"payload": PAYLOAD, "priority": PRIORITIES[n % 3]} for n in range(BATCH)]}
    )

    async def post() -> None:
        status = await http.post(f"/v1/queues/{QUEUE}/messages/batch", batch)
        if status != 200:
            raise RuntimeError(f"the gateway answered {status}")

    for start in range(0, TRAFFIC // BATCH, 4):
        await asyncio.gather(*(post() for _ in range(min(4, TRAFFIC // BATCH - start))))
    await http.close()


def _phase(broker: BenchBroker, port: int, pids: dict[str, int]) -> dict[str, int]:
    """Settle, send the gateway its traffic, then the highest RSS per process and the backlog."""
    time.sleep(SETTLE)
    asyncio.run(_post_traffic(port))
    peaks = dict.fromkeys(pids, 0)
    for _ in range(SAMPLES):
        for name, pid in pids.items():
            peaks[name] = max(peaks[name], rss_kib(pid))
        time.sleep(0.5)
    return {**peaks, "backlog": asyncio.run(_bands(broker))}


def run_memory(broker: BenchBroker) -> list[dict[str, Any]]:
    asyncio.run(_bands(broker, prepare=True, purge=True))
    _grow(broker, SMALL)
    config = WorkerConfig(
        kind="bandgate", amqp_url=broker.amqp_url, concurrency=CONCURRENCY, handler_ms=HANDLER_MS
    )
    with WorkerProcess(config) as worker, gateway_process(broker) as (port, gateway_pid):
        pids = {"worker": worker.pid, "gateway": gateway_pid}
        small = _phase(broker, port, pids)
        _grow(broker, LARGE - small["backlog"])
        large = _phase(broker, port, pids)
        record = worker.stop()
    asyncio.run(_bands(broker, purge=True))
    what = {
        "worker": f"bandgate worker, {CONCURRENCY} slots, {HANDLER_MS:g} ms handler",
        "gateway": "gateway, uvicorn, 1 process",
    }
    done = {"worker": record["handled"], "gateway": 2 * TRAFFIC}
    return [
        {
            "name": what[name],
            "backlog_1": small["backlog"],
            "rss_1_mib": small[name] / 1024,
            "backlog_2": large["backlog"],
            "rss_2_mib": large[name] / 1024,
            "ratio": large[name] / small[name],
            "messages": done[name],  # handled by the worker, published through the gateway
        }
        for name in pids
    ]
