"""What an ack costs the broker: a quorum queue drained with one ack per message, or with one
`multiple` ack per 4, 8 or 32 messages (`core.protocol.acks` joins a loop turn's acks that way).

On a quorum queue every ack is a Raft command (a log entry, a WAL write, a state machine step),
and a `multiple` ack is one command for all the messages it settles. Each row drains a backlog
of `MESSAGES` 1 KiB messages with aiormq (prefetch 32, no handler), acking as it says, and
reads the broker's CPU time before and after: `broker_us_per_msg`, and its ratio to one ack per
message in the same round (`bench.rounds`). `ROUNDS` interleaved rounds.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aio_pika
import aiormq
from aiormq.abc import DeliveredMessage

from bench.environment import BenchBroker, cpu_seconds, wait_for_quiet
from bench.raw_amqp import fill
from bench.rounds import ROUNDS, median_run, paired_ratios

MESSAGES = 20_000
PREFETCH = 32
QUEUE = "bench.acks"
GROUPS = (1, 4, 8, 32)  # messages per ack


def _name(group: int) -> str:
    return "one ack per message" if group == 1 else f"one multiple ack per {group}"


async def _drain(url: str, group: int) -> None:
    """Consume `MESSAGES`, acking every `group`-th delivery with `multiple` (and the last)."""
    connection = await aiormq.connect(url)
    try:
        channel = await connection.channel()
        await channel.basic_qos(prefetch_count=PREFETCH)
        done = asyncio.Event()
        count = 0

        async def on_message(message: DeliveredMessage) -> None:
            nonlocal count
            count += 1
            if count % group == 0 or count == MESSAGES:
                await channel.basic_ack(message.delivery_tag or 0, multiple=group > 1)
            if count == MESSAGES:
                done.set()

        await channel.basic_consume(QUEUE, on_message)
        await done.wait()
    finally:
        await connection.close()


def _run(broker: BenchBroker, group: int) -> dict[str, Any]:
    fill(broker.amqp_url, "", QUEUE, aio_pika.Message(b"x" * 1024, delivery_mode=2), MESSAGES)
    wait_for_quiet()
    broker_cpu, started = cpu_seconds(broker.pid), time.perf_counter()
    asyncio.run(_drain(broker.amqp_url, group))
    seconds = time.perf_counter() - started
    return {
        "name": _name(group),
        "rate": MESSAGES / seconds,
        "broker_us_per_msg": (cpu_seconds(broker.pid) - broker_cpu) / MESSAGES * 1e6,
    }


async def _declare(url: str) -> None:
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel()
        await channel.queue_delete(QUEUE)
        await channel.declare_queue(QUEUE, durable=True, arguments={"x-queue-type": "quorum"})


def run_acks(broker: BenchBroker) -> list[dict[str, Any]]:
    asyncio.run(_declare(broker.amqp_url))
    runs: dict[str, list[dict[str, Any]]] = {}
    for _ in range(ROUNDS):
        for group in GROUPS:
            runs.setdefault(_name(group), []).append(_run(broker, group))
    ratios = paired_ratios(runs, _name(1), "broker_us_per_msg")
    return [
        {
            **median_run(runs[name], "broker_us_per_msg", "{:.1f}"),
            "ratio": ratios[name][0],
            "ratio_runs": ratios[name][1],
        }
        for name in runs
    ]
