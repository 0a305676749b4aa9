"""What RabbitMQ 4.3 does natively, against what bandgate builds, on whichever broker runs.

- Shard routing: the consistent-hash exchange (a plugin shipped with every version; what
  sharded bands use) against 4.3's built-in `x-modulus-hash`: confirmed publish rate to four
  quorum queues by a random key, and the balance between them.
- Retry back-off: bandgate's retry (a copy republished through the TTL delay ladder, then the
  original acked, as the worker does) against 4.3's delayed retry on quorum queues
  (`x-delayed-retry-*`, a `basic.nack` with requeue held back by the queue): how late the second
  delivery comes after the requested delay.
- Returns: does a message given back 25 times (`basic.get`, then `basic.nack` with requeue, as a
  DLQ listing does) survive the default delivery limit of 20, and what header counts it.
- Consumer timeout: what a consumer that holds a message past its `x-consumer-timeout` gets.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import time
import uuid
from datetime import timedelta
from typing import Any

import aio_pika
import aiormq
from aio_pika.abc import AbstractChannel, AbstractIncomingMessage

from bandgate.core.publishing import ChannelSet, Publisher, confirm_channel_factory
from bandgate.topology import naming, wire
from bandgate.topology.loader import load_topology
from bandgate.topology.wire import Envelope
from bench.environment import BenchBroker
from bench.stage import QUEUE, reset_bands

SHARDS = 4
HASHED = 20_000
ROUNDS = 3
RETRIED = 200
RETRY_DELAYS_MS = (1000, 5000)
RETURNS = 25


async def _hash_rate(channel: AbstractChannel, kind: str, keys: list[str]) -> tuple[float, float]:
    """Confirmed publishes per second through an exchange of `kind`, and max/mean queue depth."""
    exchange = await channel.declare_exchange(f"bench.{kind}", kind, durable=True)
    queues = []
    for shard in range(SHARDS):
        queue = await channel.declare_queue(
            f"bench.{kind}.{shard}", durable=True, arguments={"x-queue-type": "quorum"}
        )
        await queue.purge()
        await queue.bind(exchange, routing_key="1" if kind == "x-consistent-hash" else "")
        queues.append(queue)
    started = time.perf_counter()
    await asyncio.gather(
        *(exchange.publish(aio_pika.Message(b"x" * 100, delivery_mode=2), key) for key in keys)
    )
    rate = len(keys) / (time.perf_counter() - started)
    depths = []
    for queue in queues:
        declared = await channel.declare_queue(queue.name, passive=True)
        depths.append(declared.declaration_result.message_count or 0)
        await queue.delete(if_unused=False, if_empty=False)
    await exchange.delete()
    return rate, max(depths) / statistics.mean(depths)


async def _knows(url: str, kind: str) -> bool:
    """Whether the broker has the exchange type `kind`: an unknown type closes the channel
    (4.x) or the whole connection (3.10), so it is asked on a connection of its own."""
    connection = await aio_pika.connect(url)
    try:
        channel = await connection.channel()
        await channel.declare_exchange(f"bench.probe.{kind}", kind, auto_delete=True)
    except aiormq.exceptions.AMQPError:
        return False
    finally:
        with contextlib.suppress(aiormq.exceptions.AMQPError, ConnectionError):
            await connection.close()
    return True


async def _shard_routing(url: str) -> list[dict[str, Any]]:
    kinds = ["x-consistent-hash", "x-modulus-hash"]
    rates: dict[str, list[float]] = {kind: [] for kind in kinds if await _knows(url, kind)}
    balance: dict[str, float] = {}
    keys = [uuid.uuid4().hex for _ in range(HASHED)]
    async with await aio_pika.connect(url) as connection:
        for _ in range(ROUNDS):  # interleaved, so a slow spell of the machine hits both
            for kind in rates:
                channel = await connection.channel(publisher_confirms=True)
                rate, skew = await _hash_rate(channel, kind, keys)
                rates[kind].append(rate)
                balance[kind] = max(balance.get(kind, 0.0), skew)
    base = statistics.median(rates["x-consistent-hash"])
    rows: list[dict[str, Any]] = []
    for kind in kinds:
        if kind not in rates:
            rows.append({"name": f"shards by {kind}", "note": "exchange type unknown here"})
            continue
        rows.append(
            {
                "name": f"shards by {kind}",
                "rate": statistics.median(rates[kind]),
                "ratio": statistics.median(rates[kind]) / base,
                "max_over_mean": balance[kind],
                "rate_runs": "/".join(f"{rate:.0f}" for rate in rates[kind]),
            }
        )
    return rows


async def _ladder_retry(url: str, delay_ms: int) -> list[float]:
    """Lateness (ms) of a second delivery that bandgate's retry path schedules `delay_ms` on."""
    topology = load_topology()
    connection = await aio_pika.connect(url)
    publisher = Publisher(topology, ChannelSet(confirm_channel_factory(connection)))
    channel = await connection.channel()
    await channel.set_qos(prefetch_count=RETRIED * 2)
    first: dict[str, float] = {}
    lateness: list[float] = []
    done = asyncio.Event()

    async def on_message(message: AbstractIncomingMessage) -> None:
        now = time.monotonic()
        message_id = str(message.message_id)
        if message_id not in first:
            first[message_id] = now
            due = wire.now() + timedelta(milliseconds=delay_ms)
            copy = Envelope(
                queue=QUEUE, payload=None, priority=8, message_id=message_id,
                enqueued_at=wire.now(), deliver_at=due,
            )  # fmt: skip
            await publisher.publish(copy)  # the retry's copy, confirmed before the ack
            await message.ack()
            return
        lateness.append((now - first[message_id]) * 1000 - delay_ms)
        await message.ack()
        if len(lateness) == RETRIED:
            done.set()

    await (await channel.get_queue(naming.band_queue(QUEUE, "hot"))).consume(on_message)
    for _ in range(RETRIED):
        await publisher.publish(Envelope(queue=QUEUE, payload=None, priority=8))
    await asyncio.wait_for(done.wait(), timeout=delay_ms / 1000 + 60)
    await connection.close()
    return lateness


async def _native_retry(url: str, delay_ms: int) -> list[float] | None:
    """The same with 4.3's delayed retry: nack with requeue, the queue holds it `delay_ms`.

    None when the broker does not hold it back (4.0 accepts the arguments and ignores them).
    """
    connection = await aio_pika.connect(url)
    channel = await connection.channel(publisher_confirms=True)
    name = f"bench.native-retry.{delay_ms}"
    arguments: dict[str, Any] = {
        "x-queue-type": "quorum",
        "x-delayed-retry-type": "all",
        "x-delayed-retry-min": delay_ms,
        "x-delayed-retry-max": delay_ms,
    }
    try:
        queue = await channel.declare_queue(name, durable=True, arguments=arguments)
    except aiormq.exceptions.AMQPError:
        await connection.close()
        return None
    await queue.purge()
    consuming = await connection.channel()
    await consuming.set_qos(prefetch_count=RETRIED * 2)
    first: dict[str, float] = {}
    lateness: list[float] = []
    done = asyncio.Event()

    async def on_message(message: AbstractIncomingMessage) -> None:
        now = time.monotonic()
        message_id = str(message.message_id)
        if message_id not in first:
            first[message_id] = now
            await message.nack(requeue=True)
            return
        lateness.append((now - first[message_id]) * 1000 - delay_ms)
        await message.ack()
        if len(lateness) == RETRIED:
            done.set()

    await (await consuming.get_queue(name)).consume(on_message)
    for index in range(RETRIED):
        await channel.default_exchange.publish(
            aio_pika.Message(b"x", message_id=str(index), delivery_mode=2), name
        )
    try:
        await asyncio.wait_for(done.wait(), timeout=delay_ms / 1000 + 60)
    finally:
        await queue.delete(if_unused=False, if_empty=False)
        await connection.close()
    if statistics.median(lateness) < -delay_ms / 2:
        return None  # redelivered at once: the arguments were ignored
    return lateness


def _lateness_row(name: str, lateness: list[float] | None) -> dict[str, Any]:
    if lateness is None:
        return {"name": name, "note": "not held back on this version"}
    ordered = sorted(lateness)
    q = statistics.quantiles(ordered, n=100)
    return {"name": name, "p50_ms": q[49], "p99_ms": q[98], "max_ms": ordered[-1]}


async def _returns(url: str) -> dict[str, Any]:
    """Give one message back `RETURNS` times; is it still there, and what counted?"""
    async with await aio_pika.connect(url) as connection:
        channel = await connection.channel(publisher_confirms=True)
        queue = await channel.declare_queue(
            "bench.returns", durable=True, arguments={"x-queue-type": "quorum"}
        )
        await queue.purge()
        await channel.default_exchange.publish(aio_pika.Message(b"x", delivery_mode=2), queue.name)
        headers: dict[str, Any] = {}
        survived = 0
        for _ in range(RETURNS):
            message = await queue.get(fail=False)
            if message is None:
                break
            survived += 1
            headers = {k: v for k, v in message.headers.items() if "count" in k}
            await message.nack(requeue=True)
        await queue.delete(if_unused=False, if_empty=False)
    return {
        "name": f"{RETURNS} get+nack(requeue) of one message",
        "note": f"read {survived} times; last headers {headers or 'none'}",
    }


async def _consumer_timeout(url: str) -> dict[str, Any]:
    """Hold a message past a 1 s `x-consumer-timeout`; what happened within 5 s?"""
    async with await aio_pika.connect(url) as connection:
        channel = await connection.channel(publisher_confirms=True)
        queue = await channel.declare_queue(
            "bench.timeout", durable=True, arguments={"x-queue-type": "quorum"}
        )
        await queue.purge()
        await channel.default_exchange.publish(aio_pika.Message(b"x", delivery_mode=2), queue.name)
        holding = await connection.channel()
        await holding.set_qos(prefetch_count=1)
        cancelled = asyncio.Event()
        holding_channel = await holding.get_underlay_channel()
        holding_channel.on_consumer_cancel_callbacks.add(lambda tag: cancelled.set())
        deliveries = 0

        async def hold(message: AbstractIncomingMessage) -> None:
            nonlocal deliveries
            deliveries += 1

        await (await holding.get_queue(queue.name)).consume(
            hold, arguments={"x-consumer-timeout": 1000}
        )
        started = time.monotonic()
        with_timeout = asyncio.wait_for(cancelled.wait(), timeout=5)
        try:
            await with_timeout
            what = f"consumer cancelled by the broker after {time.monotonic() - started:.1f} s"
        except TimeoutError:
            what = "nothing within 5 s (the argument is ignored)"
        if holding.is_closed:
            what += "; channel closed"
        ready = (await channel.declare_queue(queue.name, passive=True)).declaration_result
        what += f"; ready again: {ready.message_count}"
        await queue.delete(if_unused=False, if_empty=False)
    return {"name": "consumer past x-consumer-timeout 1 s", "note": what}


async def _native(broker: BenchBroker) -> list[dict[str, Any]]:
    rows = await _shard_routing(broker.amqp_url)
    for delay_ms in RETRY_DELAYS_MS:
        ladder = await _ladder_retry(broker.amqp_url, delay_ms)
        rows.append(_lateness_row(f"retry {delay_ms} ms: bandgate delay ladder", ladder))
        native = await _native_retry(broker.amqp_url, delay_ms)
        rows.append(_lateness_row(f"retry {delay_ms} ms: x-delayed-retry", native))
    rows.append(await _returns(broker.amqp_url))
    rows.append(await _consumer_timeout(broker.amqp_url))
    return rows


def run_native(broker: BenchBroker) -> list[dict[str, Any]]:
    asyncio.run(reset_bands(broker))
    return asyncio.run(_native(broker))
