"""Consume throughput: raw aio-pika consume+ack of one queue vs the bandgate worker.

A backlog of `MESSAGES` 1 KiB messages is filled first; then a consumer process of its own
(`bench.worker_process`) drains it with a no-op handler, `CONCURRENCY` slots:

- raw aio-pika: one quorum queue (`orders.hot`), prefetch `2 x CONCURRENCY`, the prefetch the
  worker gives its hot band, ack after the handler, on asyncio's loop (aio-pika's default);
  the ratios are against this. The same on uvloop is shown for contrast, since the bandgate
  worker runs on uvloop;
- the bandgate worker (the real library) with the backlog all in the hot band, and split
  evenly over the three bands (the target case: a worker draining three bands).

The compared rows run `ROUNDS` times, interleaved; each is its median-rate run (`rate_runs`:
every run's), and its ratio is the median of the rounds' ratios (`ratio_runs`). The uvloop
contrast runs once.

The rate is measured inside the consumer, from its `WARMUP`-th message to its last; the CPU
seconds of the consumer process and of the broker are read at the same two moments, and so is
the machine's, to show what other processes took (`other_cores`: the benchmark machine is
shared; each drain starts once it is quiet, but others may start meanwhile).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from typing import Any

from bandgate.consumers.scheduling import default_prefetch
from bandgate.topology import naming, wire
from bandgate.topology.loader import load_topology
from bench.environment import BenchBroker, wait_for_quiet
from bench.raw_amqp import fill
from bench.rounds import ROUNDS, median_run, paired_ratios
from bench.stage import reset_bands
from bench.worker_process import WorkerConfig, WorkerProcess

MESSAGES = 20_000
WARMUP = 1_000
CONCURRENCY = 16
PAYLOAD = {"data": "x" * 1000}  # about 1 KiB on the wire
QUEUE = "orders"


def _fill(broker: BenchBroker, priorities: list[int]) -> None:
    """MESSAGES messages, an equal share at each of `priorities`, routed as bandgate does."""
    exchange = load_topology().exchange
    for index, priority in enumerate(priorities):
        share = MESSAGES // len(priorities) + (index < MESSAGES % len(priorities))
        message = wire.encode(wire.Envelope(queue=QUEUE, payload=PAYLOAD, priority=priority))
        fill(broker.amqp_url, exchange, naming.routing_key(QUEUE, priority), message, share)
    time.sleep(0.5)  # let the queues settle after the burst


def drain_window(record: dict[str, Any]) -> tuple[float, float, float, float]:
    """A drain's seconds, consumer and broker CPU seconds, and the other processes' cores,
    from its WARMUP-th message to its last (as a `WorkerProcess` records them)."""
    seconds = record["last_at"] - record["first_at"]
    consumer_cpu = record["last_cpu"] - record["first_cpu"]
    broker_cpu = record["last_broker_cpu"] - record["first_broker_cpu"]
    busy = record["last_machine_busy"] - record["first_machine_busy"]
    return seconds, consumer_cpu, broker_cpu, (busy - consumer_cpu - broker_cpu) / seconds


def _drain(broker: BenchBroker, name: str, config: WorkerConfig) -> dict[str, Any]:
    wait_for_quiet()
    with WorkerProcess(config) as worker:
        record = worker.wait(timeout=300)
    handled = MESSAGES - WARMUP
    seconds, consumer_cpu, broker_cpu, others = drain_window(record)
    return {
        "name": name,
        "rate": handled / seconds,
        "ratio": 1.0,
        "consumer_cpu_s": consumer_cpu,
        "broker_cpu_s": broker_cpu,
        "consumer_us_per_msg": consumer_cpu / handled * 1e6,
        "other_cores": others,
    }


def run_consume(broker: BenchBroker) -> list[dict[str, Any]]:
    bands = asyncio.run(reset_bands(broker))
    prefetch = default_prefetch("strict", CONCURRENCY, len(bands))
    raw = WorkerConfig(
        kind="plain",
        amqp_url=broker.amqp_url,
        concurrency=CONCURRENCY,
        queues=[(bands[0], prefetch[0])],
        expect=MESSAGES,
        warmup=WARMUP,
        broker_pid=broker.pid,
    )
    worker = replace(raw, kind="bandgate", queue=QUEUE, queues=[])
    compared = [
        (f"raw aio-pika, 1 queue, prefetch {prefetch[0]}", raw, [8]),
        # Every band's prefetch is 2C: the coldest band's small default (`default_prefetch`)
        # gives way to the headroom (`consumers.scheduling`).
        (f"bandgate worker, 1 band, prefetch {prefetch[0]} per band", worker, [8]),
        ("bandgate worker, 3 bands", worker, [8, 5, 1]),
    ]
    runs: dict[str, list[dict[str, Any]]] = {}
    for _ in range(ROUNDS):
        for name, config, priorities in compared:
            _fill(broker, priorities)
            runs.setdefault(name, []).append(_drain(broker, name, config))
    ratios = paired_ratios(runs, compared[0][0])
    rows = [
        {**median_run(runs[name], "rate"), "ratio": ratios[name][0], "ratio_runs": ratios[name][1]}
        for name, _, _ in compared
    ]
    _fill(broker, [8])
    on_uvloop = replace(raw, plain_loop="uvloop")
    rows.insert(1, _drain(broker, "raw aio-pika on uvloop (for contrast)", on_uvloop))
    rows[1]["ratio"] = rows[1]["rate"] / rows[0]["rate"]  # the contrast: one run, no pairs
    return rows
