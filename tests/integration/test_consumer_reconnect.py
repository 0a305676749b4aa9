"""A worker whose connection the broker closes reconnects and loses nothing."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from urllib.parse import quote

import aio_pika
import pytest

from bandgate.consumers import ConsumerApp, Message
from bandgate.consumers.settings import WorkerSettings
from bandgate.consumers.worker import Worker
from bandgate.core.publishing import ChannelSet, Published, Publisher, confirm_channel_factory
from bandgate.topology import naming
from bandgate.topology.declare import apply_topology
from bandgate.topology.management import vhost_of
from bandgate.topology.model import Topology
from bandgate.topology.wire import Envelope
from tests.broker import TestBroker
from tests.integration.conftest import queue_depths
from tests.integration.test_delay import wait_until

pytestmark = pytest.mark.integration

StartWorker = Callable[[ConsumerApp], Awaitable[Worker]]


def close_worker_connections(broker: TestBroker, vhost: str) -> int:
    """Close every `bandgate-worker` connection of the vhost, as an operator would in the UI."""
    with broker.management() as api:
        deadline = time.monotonic() + 15
        while True:  # the management API lists a new connection after a moment
            listed = api.get(f"/api/vhosts/{quote(vhost, safe='')}/connections")
            listed.raise_for_status()
            names = [
                connection["name"]
                for connection in listed.json()
                if connection.get("client_properties", {}).get("connection_name")
                == naming.WORKER_CONNECTION
            ]
            if names or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        for name in names:
            api.delete(
                f"/api/connections/{quote(name, safe='')}",
                headers={"X-Reason": "test: closed on purpose"},
            ).raise_for_status()
    return len(names)


async def test_a_worker_reconnects_after_its_connection_is_closed_and_loses_nothing(
    broker: TestBroker, amqp_url: str, topology: Topology, start_worker: StartWorker
) -> None:
    connection = await aio_pika.connect(amqp_url)
    async with connection:
        await apply_topology(connection, topology)
        app = ConsumerApp(WorkerSettings(amqp_url=amqp_url), topology=topology)
        handled: set[str] = set()
        some, all_of_them = asyncio.Event(), asyncio.Event()
        count = 40

        @app.consumer("orders", concurrency=4)
        async def handle(msg: Message) -> None:
            await asyncio.sleep(0.02)
            handled.add(msg.message_id)
            if len(handled) >= 8:
                some.set()
            if len(handled) == count:
                all_of_them.set()

        await start_worker(app)
        publisher = Publisher(topology, ChannelSet(confirm_channel_factory(connection)))
        envelopes = [Envelope(queue="orders", payload=n, priority=n % 10) for n in range(count)]
        results = await publisher.publish_many(envelopes)
        assert all(isinstance(result, Published) for result in results)
        await asyncio.wait_for(some.wait(), 30)
        closed = await asyncio.to_thread(close_worker_connections, broker, vhost_of(amqp_url))
        assert closed == 1
        await asyncio.wait_for(all_of_them.wait(), 60)  # at least once: none lost
        assert handled == {envelope.message_id for envelope in envelopes}

        # Every id was handled, but a message handled on the closed connection and not yet
        # acked is delivered again (at least once): the bands are empty once those copies are
        # handled too, and a worker stuck after its reconnect would leave them there.
        async def drained() -> bool:
            return not any((await queue_depths(connection, topology)).values())

        assert await wait_until(drained, time.monotonic() + 30, interval=0.05), (
            f"left in the queues after the reconnect: {await queue_depths(connection, topology)}"
        )
        await publisher.channels.close()
