"""What a hot reserve costs a cold drain: `python -m bench reserve`.

`hot_reserve=N` keeps N of a consumer's slots free of the coldest band at all times, so the
first hot message after a quiet spell starts at once (`bandgate.consumers.scheduling`,
"Headroom"). Its price is paid where handlers, not the broker, set the pace: a cold backlog of
`MESSAGES` messages whose handlers take `HANDLER_MS` drains on `CONCURRENCY - N` slots. Each
reserve drains the same backlog, `ROUNDS` times interleaved; a ratio is to the drain without
a reserve in the same round (`CONCURRENCY - N` over `CONCURRENCY` is what the slots alone
predict).
"""

from __future__ import annotations

import asyncio
from typing import Any

from bandgate.topology import naming, wire
from bandgate.topology.loader import load_topology
from bench.consume import drain_window
from bench.environment import BenchBroker, wait_for_quiet
from bench.raw_amqp import fill
from bench.rounds import ROUNDS, median_run, paired_ratios
from bench.stage import reset_bands
from bench.worker_process import WorkerConfig, WorkerProcess

MESSAGES = 3_000
WARMUP = 200
CONCURRENCY = 8
HANDLER_MS = 5.0
RESERVES = (0, 1, 2)
QUEUE = "orders"


def _drain(broker: BenchBroker, reserve: int) -> dict[str, Any]:
    message = wire.encode(wire.Envelope(queue=QUEUE, payload={"n": 0}, priority=1))
    fill(broker.amqp_url, load_topology().exchange, naming.routing_key(QUEUE, 1), message, MESSAGES)
    wait_for_quiet()
    config = WorkerConfig(
        kind="bandgate",
        amqp_url=broker.amqp_url,
        concurrency=CONCURRENCY,
        handler_ms=HANDLER_MS,
        expect=MESSAGES,
        warmup=WARMUP,
        broker_pid=broker.pid,
        hot_reserve=reserve,
    )
    with WorkerProcess(config) as worker:
        record = worker.wait(timeout=300)
    seconds, *_ = drain_window(record)
    return {
        "name": f"hot_reserve={reserve}",
        "rate": (MESSAGES - WARMUP) / seconds,
        "expected": (CONCURRENCY - reserve) / CONCURRENCY,
    }


def run_reserve(broker: BenchBroker) -> list[dict[str, Any]]:
    asyncio.run(reset_bands(broker))
    runs: dict[str, list[dict[str, Any]]] = {}
    for _ in range(ROUNDS):
        for reserve in RESERVES:
            row = _drain(broker, reserve)
            runs.setdefault(row["name"], []).append(row)
    ratios = paired_ratios(runs, "hot_reserve=0")
    return [
        {**median_run(runs[name], "rate"), "ratio": ratios[name][0], "ratio_runs": ratios[name][1]}
        for name in runs
    ]
