from __future__ import annotations

import time

import aio_pika
import pytest

from bandgate.topology.declare import TopologyConflictError, apply_topology
from bandgate.topology.management import ManagementClient, vhost_of
from bandgate.topology.model import Topology
from tests.broker import TestBroker

pytestmark = pytest.mark.integration


async def test_apply_is_idempotent(amqp_url: str, topology: Topology) -> None:
    connection = await aio_pika.connect(amqp_url)
    async with connection:
        started = time.monotonic()
        report = await apply_topology(connection, topology)
        print("apply took", time.monotonic() - started)
        again = await apply_topology(connection, topology)
        assert report == again
        assert report.broker_version.startswith(("3.", "4."))
        channel = await connection.channel()
        hot = await channel.declare_queue("orders.hot", passive=True)
        assert hot.declaration_result.message_count == 0


async def test_conflict_names_the_first_difference_without_management(
    amqp_url: str, topology: Topology
) -> None:
    connection = await aio_pika.connect(amqp_url)
    async with connection:
        channel = await connection.channel()
        await channel.declare_queue("orders.hot", durable=True)  # a classic queue
        with pytest.raises(TopologyConflictError) as caught:
            await apply_topology(connection, topology)
    message = str(caught.value)
    assert "queue 'orders.hot' exists with other settings" in message
    assert "x-dead-letter-exchange is not set on the broker" in message
    assert "delete it, then run `bandgate topology apply`" in message
    assert "PRECONDITION_FAILED" not in message


async def test_conflict_lists_every_difference_with_management(
    broker: TestBroker, amqp_url: str, topology: Topology
) -> None:
    connection = await aio_pika.connect(amqp_url)
    async with connection:
        channel = await connection.channel()
        await channel.declare_queue("orders.hot", durable=True)
        management = ManagementClient(broker.management_url, vhost_of(amqp_url))
        with pytest.raises(TopologyConflictError) as caught:
            await apply_topology(connection, topology, management)
    message = str(caught.value)
    assert "x-queue-type is 'classic' on the broker, the topology wants 'quorum'" in message
    assert "x-dead-letter-strategy is not set on the broker" in message
