"""Priority fidelity: how long hot messages wait while a worker drains a big cold backlog.

Each contender drains a cold backlog of `BACKLOG` messages with `CONCURRENCY` handler slots
while hot messages arrive at a steady rate from a publisher process of its own
(`bench.paced_publisher`); the worker runs in a process of its own too
(`bench.worker_process`). Wait = handler start - publish time, for the hot messages.

Contenders:
- bandgate bands: the bandgate worker (the library as shipped: strict waterfall, default
  prefetch) on `orders`; backlog in `orders.cold`, hot messages routed to `orders.hot`.
- classic x-max-priority: one classic queue with `x-max-priority` 9, backlog at priority 1,
  hot at 8; a plain aio-pika consumer, at two prefetches: = concurrency (the broker, not a
  buffer in the worker, picks the most urgent message for every free slot, but a slot idles
  for an ack's round trip) and 2 x concurrency (what the bandgate worker gives its hot band:
  no idle slots, but a hot message can wait behind a buffer of cold ones). Neither is best
  under both loads, so each row's p99 is given over both: `vs_c16` and `vs_c32`.
- one quorum queue: the same plain consumer (FIFO on 3.x; by priority on 4.x, two levels on
  4.0 and strict on 4.3).
- naive bands: the three band queues consumed side by side by the plain consumer, prefetch =
  concurrency on each, free slots taken in arrival order (what `celery -Q hot,warm,cold` does).

Loads: light (5 ms handler, hot at 50/s) and saturating (20 ms handler, hot at 70% of the
worker's capacity: 0.7 x 16 / 20 ms = 560/s). Per run: the backlog is topped up to `BACKLOG`,
the worker starts and settles, then `WARMUP` s of hot traffic, `SECONDS` s measured, and
`GRACE` s more before the worker stops. A hot message still unhandled then counts with its
wait so far (a lower bound), and the `unhandled` column says how many did. bandgate and the
classic queue run `ROUNDS` times, interleaved, and each row is the run with the median p99
(`p99_ms_runs`: every run's); the FIFO queue and the naive bands, contrasts, run once. CPU is in
cores over the measured window: the worker, the broker, the load generator, and everything else on
the machine (`other_cores`: anything above ~0.1 means another process disturbed the run; each
run waits for a quiet machine first, for up to 20 s, but cannot keep others off it).
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import aio_pika
from pamqp.common import Arguments

from bandgate.topology import naming, wire
from bandgate.topology.loader import load_topology
from bench.environment import BenchBroker, cpu_seconds, machine_busy_seconds, wait_for_quiet
from bench.paced_publisher import PacedConfig, PacedPublisher
from bench.raw_amqp import fill
from bench.rounds import ROUNDS, median_run
from bench.stage import reset_bands
from bench.worker_process import WorkerConfig, WorkerProcess

BACKLOG = 50_000
CONCURRENCY = 16
SETTLE = 1.0
WARMUP = 2.0
SECONDS = 10.0
GRACE = 2.0
COLD, HOT = 1, 8
QUEUE = "orders"
CLASSIC = "bench.priority.classic"
FIFO = "bench.priority.fifo"
CLASSIC_NAME = "classic x-max-priority"
CONTRASTS = ("one quorum queue", "naive bands")  # shown for contrast; seconds, not milliseconds
PAYLOAD = {"data": "x" * 1000}


@dataclass(frozen=True)
class Load:
    name: str
    handler_ms: float
    hot_rate: float


LOADS = (
    Load("light", 5.0, 50.0),
    Load("saturating", 20.0, 0.7 * CONCURRENCY / 0.020),
)


@dataclass(frozen=True)
class Contender:
    name: str
    worker: WorkerConfig
    backlog: str  # the queue holding the cold backlog
    cold: tuple[str, str]  # exchange and routing key reaching it
    hot: tuple[str, str]  # exchange and routing key of the hot messages
    empty: tuple[str, ...] = ()  # queues emptied before each run


def contenders(url: str, exchange: str, bands: list[str]) -> list[Contender]:
    plain = WorkerConfig(kind="plain", amqp_url=url, concurrency=CONCURRENCY)
    band_hot = (exchange, naming.routing_key(QUEUE, HOT))
    band_cold = (exchange, naming.routing_key(QUEUE, COLD))
    return [
        Contender(
            "bandgate bands",
            replace(plain, kind="bandgate", queue=QUEUE),
            bands[-1],
            band_cold,
            band_hot,
            tuple(bands[:-1]),
        ),
        *(
            Contender(
                f"{CLASSIC_NAME}, prefetch {prefetch}",
                replace(plain, queues=[(CLASSIC, prefetch)]),
                CLASSIC,
                ("", CLASSIC),
                ("", CLASSIC),
            )
            for prefetch in (CONCURRENCY, 2 * CONCURRENCY)
        ),
        Contender(
            "one quorum queue",
            replace(plain, queues=[(FIFO, CONCURRENCY)]),
            FIFO,
            ("", FIFO),
            ("", FIFO),
        ),
        Contender(
            "naive bands",
            replace(plain, queues=[(band, CONCURRENCY) for band in bands]),
            bands[-1],
            band_cold,
            band_hot,
            tuple(bands[:-1]),
        ),
    ]


async def _declare(broker: BenchBroker) -> list[str]:
    """Apply the topology, declare the single-queue contenders; the band queues, hottest first."""
    bands = await reset_bands(broker)
    connection = await aio_pika.connect(broker.amqp_url)
    async with connection:
        channel = await connection.channel()
        queues: dict[str, Arguments] = {
            CLASSIC: {"x-max-priority": 9},
            FIFO: {"x-queue-type": "quorum"},
        }
        for name, arguments in queues.items():
            await channel.queue_delete(name)
            await channel.declare_queue(name, durable=True, arguments=arguments)
    return bands


async def _depths(url: str, names: tuple[str, ...], purge: tuple[str, ...]) -> list[int]:
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel()
        for name in purge:
            await (await channel.get_queue(name)).purge()
        depths = []
        for name in names:
            queue = await channel.declare_queue(name, passive=True)
            depths.append(queue.declaration_result.message_count or 0)
    return depths


async def _clean_up(url: str, bands: list[str]) -> None:
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel()
        for name in (CLASSIC, FIFO):
            await channel.queue_delete(name)
        for name in bands:
            await (await channel.get_queue(name)).purge()


def top_up(broker: BenchBroker, contender: Contender) -> None:
    """Empty the contender's other queues, bring its backlog to BACKLOG."""
    (depth,) = asyncio.run(_depths(broker.amqp_url, (contender.backlog,), contender.empty))
    message = wire.encode(wire.Envelope(queue=QUEUE, payload=PAYLOAD, priority=COLD))
    fill(broker.amqp_url, *contender.cold, message, BACKLOG - depth)


def _percentile(ordered: list[float], q: int) -> float:
    return statistics.quantiles(ordered, n=100)[q - 1]


def measure(
    broker: BenchBroker,
    contender: Contender,
    load: Load,
    run: str,
    start: Callable[[WorkerConfig], WorkerProcess] = WorkerProcess,
    gateway_pid: int | None = None,
    seconds: float = SECONDS,
) -> dict[str, Any]:
    """One run, `seconds` measured: the consumer `start` makes from the contender's worker
    config (by default that worker) under `load`; the gateway's CPU is shown where one takes
    part."""
    worker_config = replace(contender.worker, handler_ms=load.handler_ms, run=run)
    hot_exchange, hot_key = contender.hot
    paced = PacedConfig(
        amqp_url=broker.amqp_url,
        exchange=hot_exchange,
        routing_key=hot_key,
        priority=HOT,
        rate=load.hot_rate,
        warmup_seconds=WARMUP,
        seconds=seconds,
        run=run,
    )
    with start(worker_config) as worker:
        time.sleep(SETTLE)
        with PacedPublisher(paced) as publisher:
            pids = (broker.pid, worker.pid, publisher.pid, gateway_pid)
            publisher.measuring()
            cpu0, t0 = [cpu_seconds(pid) for pid in pids], time.time()
            busy0 = machine_busy_seconds()
            publisher.sent()
            cpu1, t1 = [cpu_seconds(pid) for pid in pids], time.time()
            busy1 = machine_busy_seconds()
            sent = publisher.result()
        time.sleep(max(0.0, t1 + GRACE - time.time()))
        end = time.time()
        record = worker.stop()
    handled: dict[str, float] = record["waits"]
    waits = sorted(
        handled[str(seq)] if str(seq) in handled else end - published
        for seq, published in sent.items()
    )
    waits_ms = [wait * 1000 for wait in waits]
    background = record["background"]
    whole = range(int(t0) + 1, int(t1))  # the seconds wholly inside the measured window
    cold = sum(background.get(str(second), 0) for second in whole) / max(1, len(whole))
    window = t1 - t0
    broker_cpu, worker_cpu, publisher_cpu, gateway_cpu = (
        (after - before) / window for before, after in zip(cpu0, cpu1, strict=True)
    )
    gateway = {} if gateway_pid is None else {"gateway_cores": gateway_cpu}
    others = (busy1 - busy0) / window - broker_cpu - worker_cpu - publisher_cpu
    others -= sum(gateway.values())
    return {
        "name": f"{load.name}: {contender.name}",
        "hot_msgs": len(sent),
        "unhandled": sum(1 for seq in sent if str(seq) not in handled),
        "duplicates": record["duplicates"],
        "p50_ms": _percentile(waits_ms, 50),
        "p99_ms": _percentile(waits_ms, 99),
        "max_ms": waits_ms[-1],
        f"vs_c{CONCURRENCY}": float("nan"),  # filled in once the classic queue has run
        f"vs_c{2 * CONCURRENCY}": float("nan"),
        "cold_msg_s": cold,
        "worker_cores": worker_cpu,
        **gateway,
        "broker_cores": broker_cpu,
        "load_cores": publisher_cpu,
        "other_cores": others,
    }


def run_priority(broker: BenchBroker) -> list[dict[str, Any]]:
    """Each load: the compared contenders `ROUNDS` times, interleaved, the contrasts once.

    Every contender's row is its run with the median p99 (`p99_ms_runs` lists them all): the
    broker on this machine stalls now and then for a few hundred milliseconds (quorum and
    classic queues alike, seen as a burst of late messages in one run and none in the next),
    and one stall in a 10 s window decides a p99 of 500 messages.
    """
    bands = asyncio.run(_declare(broker))
    exchange = load_topology().exchange
    rows: list[dict[str, Any]] = []
    try:
        for load in LOADS:
            runs: dict[str, list[dict[str, Any]]] = {}
            for round_ in range(ROUNDS):
                for contender in contenders(broker.amqp_url, exchange, bands):
                    if round_ and contender.name in CONTRASTS:
                        continue
                    top_up(broker, contender)
                    wait_for_quiet()  # also lets the broker finish writing the backlog away
                    run = f"{load.name}-{contender.name}-{time.time():.0f}"
                    runs.setdefault(contender.name, []).append(
                        measure(broker, contender, load, run)
                    )
            results = {name: median_run(done, "p99_ms") for name, done in runs.items()}
            for prefetch in (CONCURRENCY, 2 * CONCURRENCY):
                classic = results[f"{CLASSIC_NAME}, prefetch {prefetch}"]["p99_ms"]
                for row in results.values():
                    row[f"vs_c{prefetch}"] = row["p99_ms"] / classic
            rows += results.values()
    finally:
        asyncio.run(_clean_up(broker.amqp_url, bands))
    return rows
