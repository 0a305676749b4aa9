"""The order table (docs/guides/rabbitmq-versions.md), row by row, on whichever RabbitMQ the
session runs (3.10, 4.0 or 4.3): messages of random priorities 0-9 published through bandgate's
Publisher into one band, then read back in the order the broker hands them out."""

from __future__ import annotations

import asyncio
import random

import pytest
from aio_pika.abc import AbstractRobustConnection

from bandgate.core.publishing import ChannelSet, Published, Publisher, confirm_channel_factory
from bandgate.topology import naming, wire
from bandgate.topology.declare import apply_topology, broker_version, parse_version
from bandgate.topology.loader import parse_topology
from bandgate.topology.model import Topology
from bandgate.topology.wire import Envelope

pytestmark = pytest.mark.integration

MESSAGES = 40
ALL = [{"name": "all", "priorities": [0, 9]}]
TOPOLOGY = parse_topology(
    {
        "delay": {"levels": 2},
        "queues": {
            "quorum": {"bands": ALL},
            "classic": {"bands": [{**ALL[0], "type": "classic"}]},
            "ordered": {"ordered": True, "bands": ALL},
            "serial": {"ordering_required": True},
        },
    }
)


async def publish_and_read(
    amqp: AbstractRobustConnection, topology: Topology, queue: str
) -> tuple[list[int], list[int]]:
    """(priorities in publish order, the same messages' priorities in the order read back)."""
    await apply_topology(amqp, topology)
    publisher = Publisher(topology, ChannelSet(confirm_channel_factory(amqp), size=1))
    rng = random.Random(queue)
    sent = [
        Envelope(queue=queue, payload=n, priority=rng.randint(0, 9), message_id=f"m-{n:02d}")
        for n in range(MESSAGES)
    ]
    results = await publisher.publish_many(sent)  # one batch: a backlog from the start
    assert all(isinstance(result, Published) for result in results)
    await publisher.channels.close()
    band = topology.queue(queue).bands[0]
    channel = await amqp.channel()
    target = await channel.get_queue(naming.band_queue(queue, band.name))
    read: list[int] = []
    # Consumed, not fetched: single-active-consumer queues refuse basic.get.
    async with asyncio.timeout(30), target.iterator(no_ack=True) as messages:
        async for message in messages:
            priority = wire.read_priority(message.priority, message.headers)
            assert priority is not None
            read.append(priority)
            if len(read) == MESSAGES:
                break
    await channel.close()
    return [envelope.priority for envelope in sent], read


def version_of(amqp: AbstractRobustConnection) -> tuple[int, ...]:
    return parse_version(broker_version(amqp))


async def test_a_quorum_band_orders_as_the_version_does(amqp: AbstractRobustConnection) -> None:
    sent, read = await publish_and_read(amqp, TOPOLOGY, "quorum")
    assert sorted(read) == sorted(sent)
    version = version_of(amqp)
    if version < (4, 0):  # FIFO: the priority property is carried, not used
        assert read == sent
    elif version < (4, 3):  # two levels, 5-9 ahead of 0-4 by a ratio, FIFO within each
        high = [p for p in sent if p >= 5]
        low = [p for p in sent if p < 5]
        assert [p for p in read if p >= 5] == high
        assert [p for p in read if p < 5] == low
        position: dict[bool, list[int]] = {True: [], False: []}
        for index, priority in enumerate(read):
            position[priority >= 5].append(index)
        assert sum(position[True]) / len(high) < sum(position[False]) / len(low)
    else:  # strict priority order
        assert read == sorted(sent, reverse=True)


async def test_a_classic_band_orders_by_priority_on_every_version(
    amqp: AbstractRobustConnection,
) -> None:
    sent, read = await publish_and_read(amqp, TOPOLOGY, "classic")
    assert read == sorted(sent, reverse=True)


@pytest.mark.parametrize("queue", ["ordered", "serial"])
async def test_ordered_and_serial_queues_keep_publish_order_on_every_version(
    amqp: AbstractRobustConnection, queue: str
) -> None:
    """Their messages carry the priority in a header, not the AMQP property, so a broker that
    orders quorum queues by priority keeps them in publish order."""
    sent, read = await publish_and_read(amqp, TOPOLOGY, queue)
    assert read == sent
