"""Shutdown past the grace period: the running handler is cancelled and every message the
worker held, running or buffered, is back in its band."""

from __future__ import annotations

import asyncio

import aio_pika
import pytest
from aio_pika.abc import AbstractConnection

from bandgate.consumers import ConsumerApp, Message
from bandgate.consumers.settings import WorkerSettings
from bandgate.consumers.worker import Worker
from bandgate.core.publishing import ChannelSet, Published, Publisher, confirm_channel_factory
from bandgate.topology import naming
from bandgate.topology.declare import apply_topology
from bandgate.topology.loader import parse_topology
from bandgate.topology.model import Topology
from bandgate.topology.wire import Envelope

pytestmark = pytest.mark.integration


async def test_a_handler_past_the_grace_period_is_cancelled_and_its_message_returned(
    amqp_url: str, topology: Topology
) -> None:
    connection = await aio_pika.connect(amqp_url)
    async with connection:
        await _three_hot_orders(connection, topology)

        settings = WorkerSettings(amqp_url=amqp_url, shutdown_grace_seconds=0.2)
        app = ConsumerApp(settings, topology=topology)
        running, cancelled = asyncio.Event(), asyncio.Event()

        @app.consumer("orders", concurrency=1)
        async def stuck(msg: Message) -> None:
            running.set()
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                cancelled.set()
                raise

        worker = Worker(app)
        task = asyncio.create_task(worker.run())
        await asyncio.wait_for(running.wait(), 30)
        worker.stop()
        await asyncio.wait_for(task, 10)
        assert cancelled.is_set()

        channel = await connection.channel()
        hot = await channel.declare_queue(naming.band_queue("orders", "hot"), passive=True)
        assert (
            hot.declaration_result.message_count == 3
        )  # the running one, the buffered one, the rest
        dlq = await channel.declare_queue(naming.dead_letter_queue("orders"), passive=True)
        assert dlq.declaration_result.message_count == 0


async def test_graceful_restarts_do_not_wear_a_held_message_out(amqp_url: str) -> None:
    """Three SIGTERM-style stops of a worker holding three messages (one running, the rest
    buffered), on a queue whose `max_deliveries` is 2: before RabbitMQ 4.3 every return
    counts, so handing them back with a nack dead-lettered them for `delivery-limit` though
    no handler ever failed. They go back as uncounted copies there (a nack on 4.3), and the
    next worker handles all three."""
    topology = parse_topology(
        {"queues": {"orders": {"retry": {"max_attempts": 3, "max_deliveries": 2}}}}
    )
    connection = await aio_pika.connect(amqp_url)
    async with connection:
        await _three_hot_orders(connection, topology)
        settings = WorkerSettings(amqp_url=amqp_url, shutdown_grace_seconds=0.2)

        for _ in range(3):
            await _stop_while_holding(settings, topology)

        app = ConsumerApp(settings, topology=topology)
        handled: list[int] = []
        done = asyncio.Event()

        @app.consumer("orders", concurrency=1)
        async def record(msg: Message) -> None:
            handled.append(msg.payload)
            if len(handled) == 3:
                done.set()

        worker = Worker(app)
        task = asyncio.create_task(worker.run())
        await asyncio.wait_for(done.wait(), 30)
        worker.stop()
        await asyncio.wait_for(task, 10)
        assert sorted(handled) == [0, 1, 2]
        channel = await connection.channel()
        dlq = await channel.declare_queue(naming.dead_letter_queue("orders"), passive=True)
        assert dlq.declaration_result.message_count == 0


async def _stop_while_holding(settings: WorkerSettings, topology: Topology) -> None:
    """Run a worker whose handler never ends; stop it once a message runs."""
    app = ConsumerApp(settings, topology=topology)
    running = asyncio.Event()

    @app.consumer("orders", concurrency=1)
    async def stuck(msg: Message) -> None:
        running.set()
        await asyncio.Event().wait()

    worker = Worker(app)
    task = asyncio.create_task(worker.run())
    await asyncio.wait_for(running.wait(), 30)
    worker.stop()
    await asyncio.wait_for(task, 10)


async def _three_hot_orders(connection: AbstractConnection, topology: Topology) -> None:
    """Apply the topology and publish three hot messages to `orders`, confirmed."""
    await apply_topology(connection, topology)
    publisher = Publisher(topology, ChannelSet(confirm_channel_factory(connection)))
    envelopes = [Envelope(queue="orders", payload=n, priority=8) for n in range(3)]
    assert all(isinstance(r, Published) for r in await publisher.publish_many(envelopes))
    await publisher.channels.close()
