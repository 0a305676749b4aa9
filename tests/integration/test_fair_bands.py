"""Fair bands on a real broker: the noisy lane declared and bound, a flooding tenant's messages
routed into it, and a quiet tenant's message started ahead of the flood (issue 33)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import timedelta

import aio_pika
import httpx
import pytest
from aio_pika.abc import AbstractConnection

from bandgate.consumers import ConsumerApp, Message
from bandgate.consumers.scheduling import LANE_EVERY
from bandgate.consumers.settings import WorkerSettings
from bandgate.consumers.worker import Worker
from bandgate.core.fairness import MIN_COUNT, ONSET_COUNT
from bandgate.core.publishing import ChannelSet, Published, Publisher, confirm_channel_factory
from bandgate.topology import wire
from bandgate.topology.declare import apply_topology
from bandgate.topology.loader import parse_topology
from bandgate.topology.model import Topology
from bandgate.topology.wire import Envelope

pytestmark = pytest.mark.integration

StartWorker = Callable[[ConsumerApp], Awaitable[Worker]]
QUIET = [f"quiet-{n}" for n in range(9)]
FLOOD = 300
CONCURRENCY = 4


@pytest.fixture
def topology() -> Topology:
    """Three bands of `orders`, the cold one fair (the `client` fixture serves it too)."""
    return parse_topology(
        {
            "exchange": "bandgate",
            "delay": {"base_ms": 50, "levels": 8},
            "queues": {
                "orders": {
                    "bands": [
                        {"name": "hot", "priorities": [7, 9]},
                        {"name": "warm", "priorities": [4, 6]},
                        {"name": "cold", "priorities": [0, 3], "fair": True},
                    ]
                }
            },
        }
    )


async def depth(connection: AbstractConnection, queue: str) -> int:
    channel = await connection.channel()
    try:
        declared = await channel.declare_queue(queue, passive=True)
        return declared.declaration_result.message_count or 0
    finally:
        await channel.close()


def cold(tenant: str, n: int) -> Envelope:
    return Envelope(queue="orders", payload={"tenant": tenant, "n": n}, priority=1, tenant=tenant)


async def test_a_quiet_tenants_message_starts_ahead_of_a_noisy_backlog(
    amqp_url: str, topology: Topology, start_worker: StartWorker
) -> None:
    """Nine quiet tenants, then one floods 300 messages, then a quiet tenant sends one more.
    In a FIFO band the last message would wait for the whole flood; in a fair band it waits
    for the messages ahead of it in the band's queue (the quiet ones and the flood's first,
    before it was found noisy) and the lane's 1 in `LANE_EVERY`."""
    connection = await aio_pika.connect(amqp_url)
    async with connection:
        await apply_topology(connection, topology)
        publisher = Publisher(topology, ChannelSet(confirm_channel_factory(connection)))
        early = [cold(tenant, n) for n in range(3) for tenant in QUIET]
        flood = [cold("flood", n) for n in range(FLOOD)]
        late = cold("quiet-0", 99)
        for batch in (early, flood, [late]):
            results = await publisher.publish_many(batch)
            assert all(isinstance(result, Published) for result in results)
        await publisher.channels.close()

        in_lane = await depth(connection, "orders.cold.noisy")
        ahead = await depth(connection, "orders.cold") - 1  # the quiet ones, the flood's first
        assert in_lane + ahead + 1 == len(early) + FLOOD + 1
        assert FLOOD - ONSET_COUNT <= in_lane <= FLOOD  # found noisy by its 16th (the onset)

        app = ConsumerApp(WorkerSettings(amqp_url=amqp_url), topology=topology)
        order: list[tuple[str, int]] = []
        everything = asyncio.Event()

        @app.consumer("orders", concurrency=CONCURRENCY)
        async def handle(msg: Message) -> None:
            assert msg.tenant == msg.payload["tenant"]
            order.append((msg.payload["tenant"], msg.payload["n"]))
            if len(order) == len(early) + FLOOD + 1:
                everything.set()
            await asyncio.sleep(0.001)

        await start_worker(app)
        await asyncio.wait_for(everything.wait(), 60)

    position = order.index(("quiet-0", 99))
    lane_turns = ahead // (LANE_EVERY - 1) + 1
    print(
        f"in the lane {in_lane}, ahead in the band's queue {ahead}; the late one started "
        f"{position + 1}th of {len(order)}"
    )
    # The lane's turns, and any slot that finds the band's queue waiting for its refill from
    # the broker (a free slot never waits while the lane has work): on an idle machine about
    # as many again as its turns (~74th here), under load more (87th seen in CI on 4.3). The
    # bound is the messages ahead of it twice over; in a FIFO band it would start last (328th).
    assert position <= 2 * ahead + 2 * lane_turns + CONCURRENCY
    assert position < len(order) // 2
    assert sorted(order) == sorted(
        (e.payload["tenant"], e.payload["n"]) for e in early + flood + [late]
    )


async def test_the_gateway_carries_the_tenant_and_refuses_a_bad_one(
    client: httpx.AsyncClient, amqp_url: str
) -> None:
    published = await client.post(
        "/v1/queues/orders/messages", json={"payload": 1, "priority": 1, "tenant": "acme"}
    )
    assert published.status_code == 201, published.text
    connection = await aio_pika.connect(amqp_url)
    async with connection:
        channel = await connection.channel()
        queue = await channel.declare_queue("orders.cold", passive=True)
        message = await queue.get(timeout=5)
        assert message is not None
        assert message.headers[wire.TENANT] == "acme"
        await message.ack()
    for bad in ("", "a\nb", "x" * 129, 7):
        refused = await client.post(
            "/v1/queues/orders/messages", json={"payload": 1, "tenant": bad}
        )
        assert refused.status_code == 422, (bad, refused.text)
        assert refused.json()["error"]["field"] == "tenant"


async def test_a_noisy_tenants_delayed_message_waits_in_the_lane_not_in_the_band(
    amqp_url: str, topology: Topology
) -> None:
    """A noisy tenant's delayed message (and so its retries, which go through the same
    ladder) leaves the ladder into its band's noisy lane, once: the band's own queue, where
    the quiet tenants wait, never sees it. A quiet tenant's delayed message ends in the band."""
    connection = await aio_pika.connect(amqp_url)
    async with connection:
        await apply_topology(connection, topology)
        publisher = Publisher(topology, ChannelSet(confirm_channel_factory(connection)))
        early = [cold(tenant, n) for n in range(3) for tenant in QUIET]
        flood = [cold("flood", n) for n in range(MIN_COUNT * 2)]
        for batch in (early, flood):
            assert all(isinstance(r, Published) for r in await publisher.publish_many(batch))
        band, lane = (
            await depth(connection, "orders.cold"),
            await depth(connection, "orders.cold.noisy"),
        )
        soon = wire.now() + timedelta(seconds=0.2)
        later = [
            Envelope("orders", {"tenant": "flood", "late": 1}, 1, tenant="flood", deliver_at=soon),
            Envelope(
                "orders", {"tenant": "quiet-0", "late": 1}, 1, tenant="quiet-0", deliver_at=soon
            ),
        ]
        assert all(isinstance(r, Published) for r in await publisher.publish_many(later))
        await publisher.channels.close()
        deadline = asyncio.get_running_loop().time() + 15
        while (
            await depth(connection, "orders.cold"),
            await depth(connection, "orders.cold.noisy"),
        ) != (
            band + 1,
            lane + 1,
        ):
            assert asyncio.get_running_loop().time() < deadline, (
                "a delayed message went astray",
                band,
                lane,
                await depth(connection, "orders.cold"),
                await depth(connection, "orders.cold.noisy"),
            )
            await asyncio.sleep(0.05)
        channel = await connection.channel()
        queue = await channel.declare_queue("orders.cold.noisy", passive=True)
        tenants = []
        while (message := await queue.get(timeout=5, fail=False)) is not None:
            tenants.append(message.headers[wire.TENANT])
            await message.ack()
        assert set(tenants) == {"flood"}
