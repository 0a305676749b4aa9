"""Escalating a message that sits behind a cold backlog: a replace at a hotter priority.

`BACKLOG` cold messages (priority 1, 1 KiB, ids known: UUIDs in hex) are filled; a bandgate
worker (its own process, `CONCURRENCY` slots, a handler sleeping `HANDLER_MS`, noting when each
id started) drains them for `DRAIN_BEFORE` seconds; then the last message of the backlog is
escalated as the HTTP PUT does it: its new copy published at priority 9 with a newer generation,
confirmed, then the `replace` tombstone recorded. The worker stops once every message was
settled, the old copy included, which the ledger has it skip as superseded.

Each run reports the wait from the new copy's confirm to its handler's start (both processes'
wall clocks; the handler can start before the publisher has read its confirm), the cold
messages not yet started at that moment, the worker's superseded count (1 expected), how often
the escalated id ran (once expected, at priority 9) and the other ids that did not run exactly
once (0 expected).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

from bandgate.core import ledger
from bandgate.topology import naming, wire
from bench.environment import BenchBroker, wait_for_quiet
from bench.ledger_stage import band_backlog, fill_ids, ledger_publisher, reset_ledger
from bench.stage import reset_bands
from bench.worker_process import WorkerConfig, WorkerProcess

BACKLOG = 50_000
CONCURRENCY = 16
HANDLER_MS = 1.0
DRAIN_BEFORE = 3.0
RUNS = 3
COLD, HOT = 1, 9
PAYLOAD = {"data": "x" * 1000}
QUEUE = "orders"


def run_escalate(broker: BenchBroker) -> list[dict[str, Any]]:
    return [_run(broker, n) for n in range(1, RUNS + 1)]


def _run(broker: BenchBroker, number: int) -> dict[str, Any]:
    asyncio.run(reset_bands(broker))
    asyncio.run(reset_ledger(broker))
    ids = [uuid.uuid4().hex for _ in range(BACKLOG)]
    message = wire.encode(wire.Envelope(queue=QUEUE, payload=PAYLOAD, priority=COLD))
    fill_ids(
        broker.amqp_url,
        naming.routing_key(QUEUE, COLD),
        message,
        [id_.encode() for id_ in ids],
    )
    escalated = ids[-1]
    wait_for_quiet()
    config = WorkerConfig(
        kind="bandgate",
        amqp_url=broker.amqp_url,
        concurrency=CONCURRENCY,
        handler_ms=HANDLER_MS,
        queue=QUEUE,
        record_ids=True,
        expect_settled=BACKLOG + 1,  # every cold copy, the escalated one's included, and the hot
    )
    with WorkerProcess(config) as worker:
        time.sleep(DRAIN_BEFORE)
        escalate = asyncio.run(_escalate(broker, escalated))
        record = worker.wait(timeout=600)
    left = asyncio.run(band_backlog(broker, QUEUE))
    return _report(number, ids, escalated, escalate, record, left)


async def _escalate(broker: BenchBroker, message_id: str) -> dict[str, float]:
    """What `PUT /v1/queues/{queue}/messages/{id}` does with a new priority."""
    async with ledger_publisher(broker) as (_, publisher):
        generation = ledger.now_ms()
        started_at = time.time()
        started = time.perf_counter()
        await publisher.publish(
            wire.Envelope(
                queue=QUEUE,
                payload={"id": message_id, "generation": generation},
                priority=HOT,
                message_id=message_id,
                extra_headers={wire.GENERATION: generation},
            )
        )
        confirmed_at = time.time()
        confirmed = time.perf_counter()
        await publisher.record(ledger.replace(QUEUE, message_id, generation).encode())
        recorded = time.perf_counter()
    return {
        "started_at": started_at,
        "confirmed_at": confirmed_at,
        "publish_ms": (confirmed - started) * 1000,
        "record_ms": (recorded - confirmed) * 1000,
    }


def _report(
    number: int,
    ids: list[str],
    escalated: str,
    escalate: dict[str, float],
    record: dict[str, Any],
    left: int,
) -> dict[str, Any]:
    started: dict[str, list[list[float]]] = record["ids"]
    runs = started.get(escalated, [])
    hot_start = min((at for at, priority in runs if priority == HOT), default=float("nan"))
    cold_started = sum(
        1 for id_ in ids if id_ != escalated and started.get(id_) and started[id_][0][0] < hot_start
    )
    outcomes: dict[str, int] = record["outcomes"]
    return {
        "name": f"run {number}",
        "wait_ms": (hot_start - escalate["confirmed_at"]) * 1000,
        "from_publish_ms": (hot_start - escalate["started_at"]) * 1000,
        "publish_ms": escalate["publish_ms"],
        "record_ms": escalate["record_ms"],
        "cold_done": cold_started,
        "cold_left": BACKLOG - cold_started,  # the escalated id's old copy included
        "superseded": outcomes.get("superseded", 0),
        "escalated_runs": "/".join(f"p{int(priority)}" for _, priority in runs) or "none",
        "others_not_once": sum(
            1 for id_ in ids if id_ != escalated and len(started.get(id_, [])) != 1
        ),
        "left_in_bands": left,
    }
