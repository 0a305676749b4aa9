"""How the Publisher reports what the broker did not confirm, for single publishes and for
batches (which take their own path: one channel and one deadline per batch). Nothing the
broker did not ack may come back as `Published`."""

from __future__ import annotations

import aio_pika
import pytest
from aio_pika.abc import AbstractRobustConnection

from bandgate.core.publishing import (
    BrokerRejected,
    BrokerUnavailable,
    ChannelSet,
    ConfirmTimeout,
    NotEnqueued,
    OutcomeUnknown,
    Published,
    Publisher,
    TopologyMissing,
    Unroutable,
    confirm_channel_factory,
)
from bandgate.topology import naming, wire
from bandgate.topology.declare import apply_topology
from bandgate.topology.loader import parse_topology
from bandgate.topology.model import Topology
from bandgate.topology.wire import Envelope
from tests.integration.conftest import queue_depths

pytestmark = pytest.mark.integration


def publisher(
    amqp: AbstractRobustConnection, topology: Topology, confirm_timeout: float = 5.0
) -> Publisher:
    channels = ChannelSet(confirm_channel_factory(amqp), size=2)
    return Publisher(topology, channels, confirm_timeout)


def envelopes(n: int, priority: int = 8) -> list[Envelope]:
    return [Envelope(queue="orders", payload=i, priority=priority) for i in range(n)]


async def test_a_batch_is_published_in_order_with_the_wire_format(
    amqp: AbstractRobustConnection, topology: Topology
) -> None:
    await apply_topology(amqp, topology)
    sent = envelopes(3) + [Envelope(queue="orders", payload="c", priority=1, headers={"k": "v"})]
    results = await publisher(amqp, topology).publish_many(sent)
    assert [r.message_id for r in results if isinstance(r, Published)] == [
        e.message_id for e in sent
    ]
    assert [r.band for r in results if isinstance(r, Published)] == ["hot"] * 3 + ["cold"]
    channel = await amqp.channel()
    cold = await channel.get_queue(naming.band_queue("orders", "cold"))
    message = await cold.get(no_ack=True)
    assert message.message_id == sent[3].message_id
    assert message.priority == 1
    assert message.delivery_mode == aio_pika.DeliveryMode.PERSISTENT
    assert message.content_type == wire.CONTENT_TYPE
    assert message.headers["k"] == "v"
    assert message.headers[wire.QUEUE] == "orders"
    assert wire.decode_body(message.body) == "c"


async def test_unroutable_is_reported_for_single_and_batch(
    amqp: AbstractRobustConnection, topology: Topology
) -> None:
    await apply_topology(amqp, topology)
    channel = await amqp.channel()
    await channel.exchange_delete(topology.exchange)  # the bands stay, their bindings go
    await channel.declare_exchange(topology.exchange, aio_pika.ExchangeType.TOPIC, durable=True)
    pub = publisher(amqp, topology)
    with pytest.raises(Unroutable, match="no binding"):
        await pub.publish(envelopes(1)[0])
    results = await pub.publish_many(envelopes(3))
    assert all(isinstance(r, Unroutable) for r in results)


async def test_a_missing_exchange_is_reported_and_the_publisher_recovers(
    amqp: AbstractRobustConnection, topology: Topology
) -> None:
    """The broker closes the channel, failing every message in flight on it alike, so the
    outcome of each is unknown (`TopologyMissing` is an `OutcomeUnknown`)."""
    pub = publisher(amqp, topology)
    with pytest.raises(TopologyMissing, match="does not exist"):
        await pub.publish(envelopes(1)[0])
    results = await pub.publish_many(envelopes(3))
    assert all(isinstance(r, TopologyMissing) for r in results)
    await apply_topology(amqp, topology)
    # The broker closed those channels; later publishes get working ones.
    for _ in range(3):
        assert isinstance(await pub.publish(envelopes(1)[0]), Published)
    assert all(isinstance(r, Published) for r in await pub.publish_many(envelopes(3)))


async def test_a_nack_in_a_batch_fails_only_that_message(
    amqp: AbstractRobustConnection,
) -> None:
    small = parse_topology(
        {
            "delay": {"levels": 4},
            "queues": {
                "orders": {
                    "bands": [
                        # classic: its reject-publish applies exactly, even to a pipelined batch
                        {"name": "hot", "priorities": [7, 9], "max_length": 3, "type": "classic"},
                        {"name": "cold", "priorities": [0, 6]},
                    ]
                }
            },
        }
    )
    await apply_topology(amqp, small)
    pub = publisher(amqp, small)
    results = await pub.publish_many(envelopes(6) + envelopes(2, priority=1))
    hot, cold = results[:6], results[6:]
    assert all(isinstance(r, Published) for r in hot[:3])
    assert all(isinstance(r, BrokerRejected) for r in hot[3:])
    assert all(isinstance(r, Published) for r in cold)


async def test_no_confirm_within_the_timeout_is_a_confirm_timeout(
    amqp: AbstractRobustConnection, topology: Topology
) -> None:
    """A message sent whose confirm does not come in time may still arrive: outcome unknown."""
    await apply_topology(amqp, topology)
    pub = publisher(amqp, topology)
    for _ in range(2):  # open both channels first: a publish without one is never sent
        await pub.publish(envelopes(1)[0])
    pub.confirm_timeout = 1e-9
    with pytest.raises(ConfirmTimeout):
        await pub.publish(envelopes(1)[0])
    results = await pub.publish_many(envelopes(3))
    assert all(isinstance(r, ConfirmTimeout) for r in results)
    assert all(isinstance(r, OutcomeUnknown) for r in results)


async def test_no_channel_within_the_timeout_is_not_enqueued(
    amqp: AbstractRobustConnection, topology: Topology
) -> None:
    """A publish that timed out before a channel opened was never sent: `NotEnqueued`."""
    await apply_topology(amqp, topology)
    pub = publisher(amqp, topology, confirm_timeout=1e-9)
    with pytest.raises(BrokerUnavailable, match="no publishing channel"):
        await pub.publish(envelopes(1)[0])
    results = await pub.publish_many(envelopes(3))
    assert all(isinstance(r, BrokerUnavailable | NotEnqueued) for r in results)
    assert sum((await queue_depths(amqp, topology)).values()) == 0
