"""Priority fidelity: how long hot messages wait while a worker drains a big cold backlog.

Each contender drains a cold backlog of `BACKLOG` messages (~1 KiB) with `CONCURRENCY` handler
slots while hot messages arrive at a steady rate from a publisher process of its own; the
worker runs in a process of its own too. Wait = handler start - publish time, for the hot
messages (`bench.hot_wait` times a run).

Contenders:
- bandgate bands: the bandgate worker (the library as shipped: strict waterfall, default
  prefetch) on `orders`; backlog in `orders.cold`, hot messages routed to `orders.hot`.
- bandgate classic bands: the same worker on the same three bands made classic queues
  (`bench.classic_bands`): what the waterfall costs, without what replication costs.
- classic x-max-priority: one classic queue with `x-max-priority` 9, backlog at priority 1,
  hot at 8; a plain aio-pika consumer, at two prefetches: = concurrency (the broker, not a
  buffer in the worker, picks the most urgent message for every free slot, but a slot idles
  for an ack's round trip) and 2 x concurrency (what the bandgate worker gives its hot band:
  no idle slots, but a hot message can wait behind a buffer of cold ones). Neither is best
  under both loads, so each row's p99 is given over both: `vs_c16` and `vs_c32`.
- one quorum queue: the same plain consumer (FIFO on 3.x; by priority on 4.x, two levels on
  4.0 and strict on 4.3).
- naive bands: the three band queues consumed side by side by the plain consumer, prefetch =
  concurrency on each, free slots taken in arrival order.
- peers (`bench.peers`), each as its users run it, its hot messages published through its own
  client: Celery x-max-priority, Celery -Q hot,warm,cold, Dramatiq max_priority (classic
  queues on the same broker, not replicated: bandgate's bands are quorum queues), and
  PostgreSQL SKIP LOCKED (on the machine's PostgreSQL, in a database of the bench's own). A
  peer whose packages (the `bench` extra) or server are missing is left out with a note.

Loads: light (5 ms handler, hot at 50/s) and saturating (20 ms handler, hot at 70% of the
worker's capacity: 0.7 x 16 / 20 ms = 560/s). Per run: the backlog is topped up to `BACKLOG`,
the worker starts and settles, then `WARMUP` s of hot traffic, `SECONDS` s measured, and a
grace before the worker stops. A hot message still unhandled then counts with its wait so far
(a lower bound), and the `unhandled` column says how many did. The compared contenders run
`ROUNDS` times, interleaved, and each row is the run with the median p99 (`p99_ms_runs`: every
run's, `cold_msg_s_runs` their drain rates); the FIFO queue and the naive bands, contrasts, run
once. CPU is in cores over the measured window: the worker, the broker (for PostgreSQL, the
database server), the load generator, and everything else on the machine (`other_cores`:
anything above ~0.1 means another process disturbed the run; each run waits for a quiet
machine first, for up to 20 s, but cannot keep others off it).

Besides the tables, a Pareto plot (`bench.pareto`): hot p99 against cold drain rate, per load.

`python -m bench priority --only bandgate,celery` runs the contenders whose names contain one
of those words (case-insensitive). For a quick try, `BANDGATE_BENCH_PRIORITY_BACKLOG`,
`_SECONDS` and `_ROUNDS` shrink the runs (a full run takes about 20 minutes on two cores);
only a full run of every contender replaces docs/priority-pareto.png.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aio_pika
from pamqp.common import Arguments

from bandgate.topology import naming, wire
from bandgate.topology.declare import apply_topology
from bandgate.topology.loader import load_topology
from bench import pareto, rounds
from bench.classic_bands import QUEUE as CLASSIC_QUEUE
from bench.classic_bands import classic_topology, topology_env
from bench.environment import BenchBroker, wait_for_quiet
from bench.hot_wait import timed_run
from bench.paced_publisher import PacedConfig, PacedPublisher
from bench.peers.base import Peer, PeerPublisher, PeerWorker, Scenario
from bench.peers.celery_peer import CeleryPriority, CeleryQueues
from bench.peers.dramatiq_peer import DramatiqPeer
from bench.peers.pg_peer import PostgresPeer
from bench.raw_amqp import fill
from bench.rounds import median_run
from bench.stage import delete, depths, reset_bands
from bench.worker_process import WorkerConfig, WorkerProcess

BACKLOG = int(os.environ.get("BANDGATE_BENCH_PRIORITY_BACKLOG", 50_000))
SECONDS = float(os.environ.get("BANDGATE_BENCH_PRIORITY_SECONDS", 10.0))
ROUNDS = int(os.environ.get("BANDGATE_BENCH_PRIORITY_ROUNDS", rounds.ROUNDS))
CONCURRENCY = 16
WARMUP = 2.0
COLD, HOT = 1, 8
QUEUE = "orders"
CLASSIC = "bench.priority.classic"
FIFO = "bench.priority.fifo"
CLASSIC_NAME = "classic x-max-priority"
CONTRASTS = ("one quorum queue", "naive bands")  # shown for contrast; seconds, not milliseconds
PAYLOAD = {"data": "x" * 1000}
PEERS: tuple[type[Peer], ...] = (CeleryPriority, CeleryQueues, DramatiqPeer, PostgresPeer)


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
    start: Callable[[WorkerConfig], WorkerProcess] = WorkerProcess  # how its worker starts


def contenders(
    url: str, exchange: str, bands: list[str], classic: tuple[Path, list[str]] | None = None
) -> list[Contender]:
    """bandgate's contenders and the plain consumers; with `classic` (the variant topology's
    file and its band queues), bandgate on classic bands too."""
    plain = WorkerConfig(kind="plain", amqp_url=url, concurrency=CONCURRENCY)
    bandgate = replace(plain, kind="bandgate", queue=QUEUE)
    band_cold = (exchange, naming.routing_key(QUEUE, COLD))
    band_hot = (exchange, naming.routing_key(QUEUE, HOT))
    found = [
        Contender("bandgate bands", bandgate, bands[-1], band_cold, band_hot, tuple(bands[:-1]))
    ]
    if classic is not None:
        path, classic_bands = classic

        def start(config: WorkerConfig) -> WorkerProcess:
            with topology_env(path):
                return WorkerProcess(config)

        found.append(
            Contender(
                "bandgate classic bands",
                replace(bandgate, queue=CLASSIC_QUEUE),
                classic_bands[-1],
                (exchange, naming.routing_key(CLASSIC_QUEUE, COLD)),
                (exchange, naming.routing_key(CLASSIC_QUEUE, HOT)),
                tuple(classic_bands[:-1]),
                start,
            )
        )
    found += [
        Contender(
            f"{CLASSIC_NAME}, prefetch {prefetch}",
            replace(plain, queues=[(CLASSIC, prefetch)]),
            CLASSIC,
            ("", CLASSIC),
            ("", CLASSIC),
        )
        for prefetch in (CONCURRENCY, 2 * CONCURRENCY)
    ]
    fifo = replace(plain, queues=[(FIFO, CONCURRENCY)])
    found.append(Contender("one quorum queue", fifo, FIFO, ("", FIFO), ("", FIFO)))
    naive = replace(plain, queues=[(band, CONCURRENCY) for band in bands])
    found.append(Contender("naive bands", naive, bands[-1], band_cold, band_hot, tuple(bands[:-1])))
    return found


async def _declare(broker: BenchBroker, classic: Path) -> tuple[list[str], list[str]]:
    """Apply the topologies, declare the single-queue contenders; the band queues of `orders`
    and of the classic variant, hottest first."""
    bands = await reset_bands(broker)
    variant = load_topology(classic)
    connection = await aio_pika.connect(broker.amqp_url)
    async with connection:
        await apply_topology(connection, variant)
        channel = await connection.channel()
        queues: dict[str, Arguments] = {
            CLASSIC: {"x-max-priority": 9},
            FIFO: {"x-queue-type": "quorum"},
        }
        for name, arguments in queues.items():
            await channel.queue_delete(name)
            await channel.declare_queue(name, durable=True, arguments=arguments)
    classic_bands = [
        naming.band_queue(CLASSIC_QUEUE, b.name) for b in variant.queue(CLASSIC_QUEUE).bands
    ]
    await depths(broker.amqp_url, (), tuple(classic_bands))  # emptied
    return bands, classic_bands


async def _clean_up(url: str, bands: list[str], classic_bands: list[str]) -> None:
    await delete(url, (CLASSIC, FIFO, *classic_bands))
    await depths(url, (), tuple(bands))


def top_up(broker: BenchBroker, contender: Contender) -> None:
    """Empty the contender's other queues, bring its backlog to BACKLOG."""
    (depth,) = asyncio.run(depths(broker.amqp_url, (contender.backlog,), contender.empty))
    message = wire.encode(wire.Envelope(queue=QUEUE, payload=PAYLOAD, priority=COLD))
    fill(broker.amqp_url, *contender.cold, message, BACKLOG - depth)


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
    row = timed_run(
        f"{load.name}: {contender.name}",
        lambda: start(worker_config),
        lambda: PacedPublisher(paced),
        broker.pid,
        gateway_pid,
    )
    return _with_ratio_columns(row)


def measure_peer(peer: Peer, load: Load, run: str) -> dict[str, Any]:
    """One run of a peer: its own worker process(es) and hot publisher."""
    config = replace(
        peer.config(),
        handler_ms=load.handler_ms,
        run=run,
        rate=load.hot_rate,
        warmup_seconds=WARMUP,
        seconds=SECONDS,
    )
    row = timed_run(
        f"{load.name}: {peer.name}",
        lambda: PeerWorker(config),
        lambda: PeerPublisher(config),
        peer.server_pid(),
    )
    return _with_ratio_columns(row)


def _with_ratio_columns(row: dict[str, Any]) -> dict[str, Any]:
    """The row with `vs_c16` and `vs_c32` after `max_ms`, filled in once the classic queue
    has run (NaN if it did not)."""
    at = list(row).index("max_ms") + 1
    items = list(row.items())
    ratios = {f"vs_c{prefetch}": float("nan") for prefetch in (CONCURRENCY, 2 * CONCURRENCY)}
    return {**dict(items[:at]), **ratios, **dict(items[at:])}


@dataclass(frozen=True)
class Runner:
    """A contender as the rounds see it: how to top its backlog up, how to run it once."""

    name: str
    top_up: Callable[[], None]
    measure: Callable[[Load, str], dict[str, Any]]
    once: bool = False  # a contrast: the first round only
    peer: bool = False  # a failed run is reported and left out (bandgate's fail the bench)


def _runner(broker: BenchBroker, contender: Contender) -> Runner:
    return Runner(
        contender.name,
        lambda: top_up(broker, contender),
        lambda load, run: measure(broker, contender, load, run, contender.start),
        contender.name in CONTRASTS,
    )


def _chooser(only: str | None) -> Callable[[str], bool]:
    words = [word.strip().lower() for word in (only or "").split(",") if word.strip()]
    return lambda name: not words or any(word in name.lower() for word in words)


def _peers(broker: BenchBroker, wanted: Callable[[str], bool], made: list[Peer]) -> list[Runner]:
    """The wanted peers that can run, set up (each appended to `made`, to be torn down)."""
    scenario = Scenario(backlog=BACKLOG, concurrency=CONCURRENCY, payload=PAYLOAD)
    runners = []
    for kind in PEERS:
        if not wanted(kind.name):
            continue
        if missing := kind.missing():
            print(f"priority: {kind.name} left out: {', '.join(missing)} not installed", end="")
            print(" (pip install -e '.[bench]')", flush=True)
            continue
        peer = kind(broker, scenario)
        made.append(peer)
        try:
            peer.setup()
        except Exception as exc:  # its server unreachable, say: the others still run
            print(f"priority: {kind.name} left out: its setup failed: {exc!r}", flush=True)
            continue
        runners.append(Runner(peer.name, peer.top_up, _measure_of(peer), peer=True))
    return runners


def _measure_of(peer: Peer) -> Callable[[Load, str], dict[str, Any]]:
    return lambda load, run: measure_peer(peer, load, run)


def run_priority(broker: BenchBroker, only: str | None = None) -> list[dict[str, Any]]:
    """Each load: the compared contenders `ROUNDS` times, interleaved, the contrasts once.

    Every contender's row is its run with the median p99 (`p99_ms_runs` lists them all): the
    broker on this machine stalls now and then for a few hundred milliseconds (quorum and
    classic queues alike, seen as a burst of late messages in one run and none in the next),
    and one stall in a 10 s window decides a p99 of 500 messages. `only`: a comma-separated
    list of words, the contenders whose names contain one of them.
    """
    wanted = _chooser(only)
    stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H%M%SZ")
    rows: list[dict[str, Any]] = []
    panels: list[tuple[str, pareto.Runs, dict[str, dict[str, Any]]]] = []
    made: list[Peer] = []
    with classic_topology() as classic_path:
        bands, classic_bands = asyncio.run(_declare(broker, classic_path))
        try:
            exchange = load_topology().exchange
            classic = (classic_path, classic_bands)
            runners = [
                _runner(broker, contender)
                for contender in contenders(broker.amqp_url, exchange, bands, classic)
                if wanted(contender.name)
            ]
            runners += _peers(broker, wanted, made)
            for load in LOADS:
                runs = _rounds(runners, load)
                results = {name: median_run(done, "p99_ms") for name, done in runs.items()}
                for name, row in results.items():
                    row["cold_msg_s_runs"] = "/".join(f"{r['cold_msg_s']:.0f}" for r in runs[name])
                for prefetch in (CONCURRENCY, 2 * CONCURRENCY):
                    if base := results.get(f"{CLASSIC_NAME}, prefetch {prefetch}"):
                        for row in results.values():
                            row[f"vs_c{prefetch}"] = row["p99_ms"] / base["p99_ms"]
                rows += results.values()
                panels.append((load.name, runs, results))
        finally:
            for peer in made:
                try:
                    peer.tear_down()
                except Exception as exc:
                    print(f"priority: tearing {peer.name} down failed: {exc!r}", flush=True)
            asyncio.run(_clean_up(broker.amqp_url, bands, classic_bands))
    title = (
        f"python -m bench priority: hot wait under a {BACKLOG:,} cold backlog, "
        f"{CONCURRENCY} slots, RabbitMQ {broker.version}, {stamp}"
    )
    full = only is None and (BACKLOG, SECONDS, ROUNDS) == (50_000, 10.0, rounds.ROUNDS)
    if plotted := pareto.write(panels, title, stamp, stable=full):
        print(f"written {plotted}" + (f" and {pareto.STABLE}" if full else ""), flush=True)
    return rows


def _rounds(runners: list[Runner], load: Load) -> dict[str, list[dict[str, Any]]]:
    """Every runner's runs under `load`, `ROUNDS` rounds interleaved. A peer's run that fails
    is reported and left out; bandgate's fail the benchmark."""
    runs: dict[str, list[dict[str, Any]]] = {}
    for round_ in range(ROUNDS):
        for runner in runners:
            if round_ and runner.once:
                continue
            runner.top_up()
            wait_for_quiet()  # also lets the broker finish writing the backlog away
            run = f"{load.name}-{runner.name}-{time.time():.0f}"
            try:
                row = runner.measure(load, run)
            except Exception as exc:
                if not runner.peer:
                    raise
                print(f"priority: a run of {runner.name} failed: {exc!r}", flush=True)
                continue
            runs.setdefault(runner.name, []).append(row)
    return runs
