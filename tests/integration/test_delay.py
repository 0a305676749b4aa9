"""The delay ladder end to end: published through the Publisher, held by the broker, landing
in the message's band when due, and never early."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

import aio_pika
import pytest
from aio_pika.abc import AbstractChannel, AbstractIncomingMessage

from bandgate.core.publishing import ChannelSet, Published, Publisher, confirm_channel_factory
from bandgate.topology import naming, wire
from bandgate.topology.declare import apply_topology
from bandgate.topology.model import Topology
from bandgate.topology.wire import Envelope

pytestmark = pytest.mark.integration

# What a loaded machine (the suite's two workers and their nodes on two cores) may add to a
# delay, as this test sees it. Lower bounds stay exact, as nothing may land early; the ladder's
# own lateness (tens of milliseconds) is measured by `python -m bench delay`, not here.
LATE_SECONDS = 3.0


@dataclass
class Rig:
    publisher: Publisher
    channel: AbstractChannel
    topology: Topology


@pytest.fixture
async def rig(amqp_url: str, topology: Topology) -> AsyncIterator[Rig]:
    connection = await aio_pika.connect(amqp_url)
    async with connection:
        await apply_topology(connection, topology)
        channels = ChannelSet(confirm_channel_factory(connection), size=1)
        channel = await connection.channel()
        yield Rig(Publisher(topology, channels), channel, topology)
        await channels.close()


async def ready(channel: AbstractChannel, queue: str) -> int:
    declared = await channel.declare_queue(queue, passive=True)
    count = declared.declaration_result.message_count
    assert count is not None
    return count


async def wait_until(
    condition: Callable[[], Awaitable[bool]], deadline: float, interval: float = 0.02
) -> bool:
    """Poll `condition` until it holds or the monotonic `deadline` passes."""
    while True:
        if await condition():
            return True
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(interval)


def in_(seconds: float) -> datetime:
    return wire.now() + timedelta(seconds=seconds)


async def test_a_delayed_message_is_held_then_lands_in_its_band(rig: Rig) -> None:
    deliver_at = in_(2.0)
    expected = {  # (queue, priority) -> band queue
        ("orders", 8): "orders.hot",
        ("orders", 5): "orders.warm",
        ("orders", 1): "orders.cold",
        ("emails", 2): "emails.cold",  # a classic band
    }
    envelopes = {
        band_queue: Envelope(
            queue=queue, payload={"p": priority}, priority=priority, deliver_at=deliver_at
        )
        for (queue, priority), band_queue in expected.items()
    }
    band_queues = [
        naming.band_queue(spec.name, band.name)
        for spec in rig.topology.queues.values()
        for band in spec.bands
    ]
    started = time.monotonic()
    results = await rig.publisher.publish_many(list(envelopes.values()))
    assert all(isinstance(result, Published) for result in results), results

    first_seen: dict[str, datetime] = {}
    while len(first_seen) < len(envelopes) and time.monotonic() < started + 30:
        for name in band_queues:
            if name not in first_seen and await ready(rig.channel, name) > 0:
                first_seen[name] = wire.now()
        if time.monotonic() - started <= 1.0:
            assert not first_seen, "a message left the delay ladder within a second"
        await asyncio.sleep(0.02)

    assert set(first_seen) == set(envelopes), "not every message reached its band in 30 s"
    # The ladder rounds a delay to its nearest 50 ms unit: at most half a unit early.
    tolerance = timedelta(milliseconds=rig.topology.delay.base_ms / 2)
    assert min(first_seen.values()) >= deliver_at - tolerance
    assert max(first_seen.values()) < deliver_at + timedelta(seconds=LATE_SECONDS)
    assert {name: await ready(rig.channel, name) for name in band_queues} == {
        name: int(name in envelopes) for name in band_queues
    }
    levels = [
        naming.delay_level(rig.topology.exchange, k) for k in range(rig.topology.delay.levels)
    ]
    assert [await ready(rig.channel, level) for level in levels] == [0] * len(levels)
    for band_queue, envelope in envelopes.items():
        queue = await rig.channel.declare_queue(band_queue, passive=True)
        message = await queue.get(no_ack=True, fail=False)
        assert message is not None
        assert message.message_id == envelope.message_id
        assert message.priority == envelope.priority
        assert wire.decode_body(message.body) == envelope.payload


async def test_delays_arrive_in_order_and_not_early(rig: Rig) -> None:
    delays = (2.5, 1.0, 0.3)  # published longest first, so order comes from the ladder alone
    envelopes = [
        Envelope(queue="orders", payload={"delay": d}, priority=8, deliver_at=in_(d))
        for d in delays
    ]
    arrivals: list[tuple[str, datetime]] = []

    async def on_message(message: AbstractIncomingMessage) -> None:
        arrivals.append((str(message.message_id), wire.now()))
        await message.ack()

    hot = await rig.channel.declare_queue("orders.hot", passive=True)
    await hot.consume(on_message)
    await rig.publisher.publish_many(envelopes)

    async def all_arrived() -> bool:
        return len(arrivals) == len(envelopes)

    assert await wait_until(all_arrived, deadline=time.monotonic() + max(delays) + 30)
    by_id = {envelope.message_id: envelope for envelope in envelopes}
    arrived = [by_id[message_id] for message_id, _ in arrivals]
    assert [e.payload["delay"] for e in arrived] == sorted(delays)
    # The ladder rounds a delay to its nearest 50 ms unit: at most half a unit early.
    tolerance = timedelta(milliseconds=rig.topology.delay.base_ms / 2)
    for message_id, at in arrivals:
        envelope = by_id[message_id]
        assert envelope.deliver_at is not None
        lateness = at - envelope.deliver_at
        assert lateness >= -tolerance, f"{envelope.payload} arrived {-lateness} early"
        late = timedelta(seconds=LATE_SECONDS)
        assert lateness < late, f"{envelope.payload} arrived {lateness} late"
