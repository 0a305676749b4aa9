"""Sharded bands on a real broker: the consistent-hash exchange keeps a key in one shard and
spreads unkeyed messages, delays and aging reach the right shard, stats add the shards up, and
a sharded band's retries go round the delay ladder and back."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import timedelta

import aio_pika
import httpx
import pytest
from aio_pika.abc import AbstractRobustConnection

from bandgate.consumers import ConsumerApp, Message
from bandgate.consumers.settings import WorkerSettings
from bandgate.consumers.worker import Worker
from bandgate.core.publishing import ChannelSet, Published, Publisher, confirm_channel_factory
from bandgate.core.queue_stats import collect_queue_stats
from bandgate.topology import wire
from bandgate.topology.declare import apply_topology
from bandgate.topology.loader import parse_topology
from bandgate.topology.wire import Envelope

pytestmark = pytest.mark.integration

SHARDED = parse_topology(
    {
        "delay": {"base_ms": 50, "levels": 6},
        "queues": {
            "orders": {
                "retry": {"max_attempts": 3, "backoff_initial_seconds": 0.1},
                "bands": [
                    {"name": "hot", "priorities": [7, 9]},
                    {"name": "warm", "priorities": [4, 6], "shards": 4},
                    {"name": "cold", "priorities": [0, 3], "age_after_seconds": 1},
                ],
            }
        },
    }
)
WARM = SHARDED.queue("orders").band_queues(SHARDED.queue("orders").band("warm"))


@pytest.fixture
async def connection(amqp_url: str) -> AsyncIterator[AbstractRobustConnection]:
    connection = await aio_pika.connect_robust(amqp_url)
    async with connection:
        await apply_topology(connection, SHARDED)
        yield connection


@pytest.fixture
async def publisher(connection: AbstractRobustConnection) -> AsyncIterator[Publisher]:
    publisher = Publisher(SHARDED, ChannelSet(confirm_channel_factory(connection)))
    yield publisher
    await publisher.channels.close()


async def depths(connection: AbstractRobustConnection, names: tuple[str, ...]) -> list[int]:
    channel = await connection.channel()
    underlay = await channel.get_underlay_channel()
    counts = [(await underlay.queue_declare(name, passive=True)).message_count for name in names]
    await channel.close()
    return [count or 0 for count in counts]


async def wait_for_depths(
    connection: AbstractRobustConnection, check: Callable[[list[int]], bool]
) -> list[int]:
    deadline = time.monotonic() + 30  # a bound for a loaded machine, not a pace
    while not check(found := await depths(connection, WARM)):
        assert time.monotonic() < deadline, f"shards hold {found}"
        await asyncio.sleep(0.1)
    return found


async def test_a_key_stays_in_one_shard_and_unkeyed_messages_spread(
    connection: AbstractRobustConnection, publisher: Publisher
) -> None:
    for _ in range(5):
        published = await publisher.publish(
            Envelope(queue="orders", payload={}, priority=5, partition_key="customer-1")
        )
        assert published.band == "warm"
    keyed = await wait_for_depths(connection, lambda found: sum(found) == 5)
    assert sorted(keyed) == [0, 0, 0, 5]

    results = await publisher.publish_many(
        [Envelope(queue="orders", payload={}, priority=p % 3 + 4) for p in range(200)]
    )
    assert all(isinstance(result, Published) for result in results)
    spread = await wait_for_depths(connection, lambda found: sum(found) == 205)
    unkeyed = [count - before for count, before in zip(spread, keyed, strict=True)]
    print(f"200 unkeyed messages over 4 shards: {unkeyed}")
    assert min(unkeyed) >= 25  # 50 each on average


async def test_delayed_and_aged_messages_reach_the_shard_of_their_key(
    connection: AbstractRobustConnection, publisher: Publisher
) -> None:
    await publisher.publish(
        Envelope(queue="orders", payload={}, priority=5, partition_key="customer-2")
    )
    [shard] = [i for i, n in enumerate(await wait_for_depths(connection, any)) if n]
    in_a_moment = wire.now() + timedelta(seconds=0.3)  # through the delay ladder's exit
    await publisher.publish(
        Envelope(
            queue="orders",
            payload={},
            priority=5,
            partition_key="customer-2",
            deliver_at=in_a_moment,
        )
    )
    # Cold ages into warm after 1 s: the broker dead-letters it through the main exchange.
    await publisher.publish(
        Envelope(queue="orders", payload={}, priority=1, partition_key="customer-2")
    )
    found = await wait_for_depths(connection, lambda found: sum(found) == 3)
    assert found[shard] == 3


async def test_stats_add_the_shards_up_and_readiness_checks_them(
    amqp_url: str, connection: AbstractRobustConnection, publisher: Publisher
) -> None:
    for n in range(8):
        await publisher.publish(
            Envelope(queue="orders", payload={}, priority=5, partition_key=f"k{n}")
        )
    await wait_for_depths(connection, lambda found: sum(found) == 8)
    stats = await collect_queue_stats(connection, SHARDED, SHARDED.queue("orders"))
    warm = stats["bands"][1]
    assert (warm["band"], warm["queue"], warm["ready"], warm["consumers"]) == (
        "warm",
        "orders.warm",
        8,
        0,
    )
    assert [shard["queue"] for shard in warm["shards"]] == list(WARM)
    assert sum(shard["ready"] or 0 for shard in warm["shards"]) == 8
    assert stats["bands"][0]["shards"] == []
    assert stats["ready"] == 8

    from bandgate.gateway.app import create_app
    from bandgate.gateway.settings import GatewaySettings

    app = create_app(GatewaySettings(amqp_url=amqp_url, auth_enabled=False), SHARDED)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as http:
            deadline = time.monotonic() + 30  # a bound for a loaded machine, not a pace
            while (ready := await http.get("/readyz")).status_code != 200:
                assert time.monotonic() < deadline, ready.text
                await asyncio.sleep(0.1)
            queues = (await http.get("/v1/queues")).json()
    [orders] = [q for q in queues["queues"] if q["name"] == "orders"]
    assert orders["bands"][1]["shards"] == list(WARM)


async def test_a_sharded_band_retries_through_the_delay_ladder_and_back(
    amqp_url: str,
    publisher: Publisher,
    start_worker: Callable[[ConsumerApp], Awaitable[Worker]],
) -> None:
    app = ConsumerApp(WorkerSettings(amqp_url=amqp_url), topology=SHARDED)
    attempts: list[int] = []
    done = asyncio.Event()

    @app.consumer("orders")
    async def handle(msg: Message) -> None:
        attempts.append(msg.attempt)
        if msg.attempt < 3:
            raise RuntimeError("not yet")
        done.set()

    await start_worker(app)
    await publisher.publish(
        Envelope(queue="orders", payload={}, priority=5, partition_key="customer-3")
    )
    await asyncio.wait_for(done.wait(), 15)
    assert attempts == [1, 2, 3]
