"""The tombstone ledger's costs (`core.ledger`): memory, catch-up, per message, and an escalate.

Four parts, a table each:

- memory: a `LedgerView` holding `TOMBSTONES` cancel entries (UUID message ids, one queue), and
  those plus `HANDLED` handled ids, filled in a fresh process (`bench.ledger_view`): its RSS
  growth and the bytes tracemalloc counts it keeps, per entry.
- catch-up: `TOMBSTONES` entries are written to the private node's ledger stream (confirmed,
  `bench.ledger_stage.WRITE_CHUNK` in flight), then a `LedgerFollower` on a fresh connection
  is timed from `start()` until it caught up (it read back the mark it wrote), `ROUNDS` times;
  then again with `HANDLED` handled entries more. The stream's size on disk is read from the
  node's data directory.
- cost: a bandgate worker (its own process, `bench.worker_process`, no-op handler,
  `CONCURRENCY` slots) drains a backlog of `MESSAGES` 1 KiB messages in the hot band, with the
  ledger (a) not followed, (b) followed and empty, (c) followed and holding `TOMBSTONES`
  tombstones of other ids (each message is looked up, none is skipped), (d) followed with
  `dedupe=True`, so each message records a handled entry before its ack. The ledger is emptied
  before each drain. Interleaved rounds (`bench.rounds`): the median-rate run of each with the
  median worker CPU µs per message over the runs, its rate ratio and its CPU ratio against (a),
  each the median of the rounds' ratios. Rate and CPU are measured as in `bench.consume`.
- escalate: see `bench.ledger_escalate`.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from typing import Any

from bandgate.core import ledger
from bandgate.core.ledger_follower import LedgerFollower
from bandgate.topology import naming, wire
from bandgate.topology.loader import load_topology
from bench.consume import drain_window
from bench.environment import BenchBroker, wait_for_quiet
from bench.ledger_escalate import run_escalate
from bench.ledger_stage import ledger_publisher, reset_ledger, stream_disk_bytes, write_entries
from bench.ledger_view import ViewConfig, measure
from bench.raw_amqp import fill
from bench.rounds import ROUNDS, median_run, paired_ratios, with_median
from bench.stage import reset_bands
from bench.worker_process import WorkerConfig, WorkerProcess

TOMBSTONES = 100_000
HANDLED = 100_000
MESSAGES = 20_000
WARMUP = 1_000
CONCURRENCY = 16
PAYLOAD = {"data": "x" * 1000}  # about 1 KiB on the wire
QUEUE = "orders"
MIB = 1 << 20


def run_ledger(broker: BenchBroker) -> list[dict[str, Any]]:
    asyncio.run(reset_bands(broker))
    return [
        *_memory(),
        *_catch_up(broker),
        *_cost(broker),
        *({"part": "escalate", **row} for row in run_escalate(broker)),
    ]


def _memory() -> list[dict[str, Any]]:
    rows = []
    for tombstones, handled in ((TOMBSTONES, 0), (TOMBSTONES, HANDLED)):
        wait_for_quiet()
        plain = measure(ViewConfig(tombstones, handled, traced=False))
        traced = measure(ViewConfig(tombstones, handled, traced=True))
        entries = plain["entries"]
        name = f"LedgerView, {tombstones:,} tombstones" + (
            f" + {handled:,} handled ids" if handled else ""
        )
        rows.append(
            {
                "part": "memory",
                "name": name,
                "entries": entries,
                "rss_mib": plain["rss_bytes"] / MIB,
                "rss_bytes_per_entry": plain["rss_bytes"] / entries,
                "traced_mib": traced["traced_bytes"] / MIB,
                "traced_bytes_per_entry": traced["traced_bytes"] / entries,
            }
        )
    return rows


def _catch_up(broker: BenchBroker) -> list[dict[str, Any]]:
    asyncio.run(reset_ledger(broker))
    rows = []
    written = 0
    for name, entries in (
        (f"catch-up, {TOMBSTONES:,} tombstones", _tombstones(TOMBSTONES)),
        (f"catch-up, + {HANDLED:,} handled ids", _handled(HANDLED)),
    ):
        count, seconds = asyncio.run(write_entries(broker, entries))
        written += count
        runs = []
        for _ in range(ROUNDS):
            wait_for_quiet()
            caught_up = asyncio.run(_time_catch_up(broker, written))
            runs.append({"seconds": caught_up, "entries_per_s": written / caught_up})
        disk = stream_disk_bytes(broker)
        rows.append(
            {
                "part": "catch-up",
                "name": name,
                "entries": written,
                **median_run(runs, "entries_per_s"),
                "write_per_s": count / seconds,
                "disk_mib": float("nan") if disk is None else disk / MIB,
            }
        )
    return rows


def _tombstones(count: int) -> list[ledger.Entry]:
    return [ledger.cancel(QUEUE, wire.new_message_id()) for _ in range(count)]


def _handled(count: int) -> list[ledger.Entry]:
    return [ledger.handled(QUEUE, wire.new_message_id(), 0) for _ in range(count)]


async def _time_catch_up(broker: BenchBroker, expected: int) -> float:
    """Seconds from `LedgerFollower.start()` on a fresh connection until it caught up."""
    async with ledger_publisher(broker) as (connection, publisher):
        follower = LedgerFollower(connection, load_topology(), publisher)
        started = time.perf_counter()
        following = await follower.start(300.0)
        seconds = time.perf_counter() - started
        await follower.close()
    if not following or len(follower.view) != expected:
        raise RuntimeError(
            f"the follower did not catch up ({follower.problem}): "
            f"{len(follower.view)} of {expected} entries"
        )
    return seconds


CONTENDERS: list[tuple[str, dict[str, Any], int]] = [
    ("(a) ledger not followed", {"follow_ledger": False}, 0),
    ("(b) ledger followed, empty", {}, 0),
    (f"(c) followed, {TOMBSTONES:,} tombstones of other ids", {}, TOMBSTONES),
    ("(d) followed, dedupe=True", {"dedupe": True}, 0),
]


def _cost(broker: BenchBroker) -> list[dict[str, Any]]:
    base = WorkerConfig(
        kind="bandgate",
        amqp_url=broker.amqp_url,
        concurrency=CONCURRENCY,
        queue=QUEUE,
        expect=MESSAGES,
        warmup=WARMUP,
        broker_pid=broker.pid,
    )
    message = wire.encode(wire.Envelope(queue=QUEUE, payload=PAYLOAD, priority=8))
    exchange = load_topology().exchange
    runs: dict[str, list[dict[str, Any]]] = {}
    for _ in range(ROUNDS):
        for name, options, tombstones in CONTENDERS:
            asyncio.run(reset_ledger(broker))
            if tombstones:
                asyncio.run(write_entries(broker, _tombstones(tombstones)))
            fill(broker.amqp_url, exchange, naming.routing_key(QUEUE, 8), message, MESSAGES)
            time.sleep(0.5)  # let the queue settle after the burst
            config = replace(base, **options)
            runs.setdefault(name, []).append(_drain(name, config, tombstones))
    baseline = CONTENDERS[0][0]
    rates = paired_ratios(runs, baseline)
    cpus = paired_ratios(runs, baseline, "consumer_us_per_msg")
    return [
        {
            "part": "cost",
            **with_median(median_run(runs[name], "rate"), runs[name], "consumer_us_per_msg"),
            "ratio": rates[name][0],
            "ratio_runs": rates[name][1],
            "cpu_ratio": cpus[name][0],
            "cpu_ratio_runs": cpus[name][1],
        }
        for name, _, _ in CONTENDERS
    ]


def _drain(name: str, config: WorkerConfig, tombstones: int) -> dict[str, Any]:
    wait_for_quiet()
    with WorkerProcess(config, start_timeout=120.0) as worker:
        record = worker.wait(timeout=300)
    if config.follow_ledger and not record.get("ledger_following"):
        raise RuntimeError(f"{name}: the worker did not follow the ledger")
    if record.get("ledger_entries", 0) < tombstones:
        raise RuntimeError(f"{name}: the worker knew {record.get('ledger_entries')} entries")
    handled = MESSAGES - WARMUP
    seconds, consumer_cpu, broker_cpu, others = drain_window(record)
    return {
        "name": name,
        "rate": handled / seconds,
        "consumer_us_per_msg": consumer_cpu / handled * 1e6,
        "broker_us_per_msg": broker_cpu / handled * 1e6,
        "other_cores": others,
        "ledger_entries": record.get("ledger_entries", 0),  # at the end of the drain
    }
