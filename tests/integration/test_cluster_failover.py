"""A three-node local cluster: the node leading the hot band's quorum queue is killed under
publish load; publishing resumes and nothing confirmed is lost."""

from __future__ import annotations

import asyncio
import time

import aio_pika
import httpx
import orjson
import pytest

from bandgate.gateway.app import create_app
from bandgate.gateway.settings import GatewaySettings
from bandgate.topology import naming
from bandgate.topology.model import Topology
from tools.local_cluster import LocalCluster

pytestmark = [pytest.mark.integration, pytest.mark.fault]


async def test_leader_loss_under_load_loses_nothing(
    cluster: LocalCluster, topology: Topology
) -> None:
    hot = naming.band_queue("orders", "hot")
    # Apply the topology through the first node, then find who leads the hot band.
    settings = GatewaySettings(amqp_url=cluster.nodes[0].amqp_url, auth_enabled=False)
    app = create_app(settings, topology)
    async with app.router.lifespan_context(app):
        pass
    leader = cluster.by_name(cluster.leader_of(hot))
    survivor = next(node for node in cluster.nodes if node is not leader)
    # The gateway talks to a surviving node, as a load balancer in front of the cluster
    # would route it once the leader's node is gone.
    settings = GatewaySettings(
        amqp_url=survivor.amqp_url, publish_timeout_seconds=5.0, auth_enabled=False
    )
    app = create_app(settings, topology)
    confirmed: set[int] = set()
    refused = 0
    counter = iter(range(10**9))
    stop = asyncio.Event()
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:

            async def load() -> None:
                nonlocal refused
                while not stop.is_set():
                    n = next(counter)
                    response = await client.post(
                        "/v1/queues/orders/messages", json={"payload": {"n": n}, "priority": 9}
                    )
                    if response.status_code == 201:
                        confirmed.add(n)
                    else:
                        assert response.status_code == 503, response.text
                        refused += 1

            workers = [asyncio.create_task(load()) for _ in range(8)]
            await asyncio.sleep(2.0)
            before = len(confirmed)
            await asyncio.to_thread(leader.kill)
            killed_at = time.monotonic()
            mark = len(confirmed)
            while len(confirmed) == mark:
                assert time.monotonic() - killed_at < 30, "publishing did not resume"
                await asyncio.sleep(0.02)
            resumed_after = time.monotonic() - killed_at
            await asyncio.sleep(2.0)
            stop.set()
            await asyncio.gather(*workers)
    new_leader = cluster.leader_of(hot, asking=survivor)

    found: list[int] = []
    connection = await aio_pika.connect(survivor.amqp_url)
    async with connection:
        channel = await connection.channel()
        queue = await channel.get_queue(hot)
        while (message := await queue.get(fail=False)) is not None:
            found.append(orjson.loads(message.body)["n"])
            await message.ack()
    lost = confirmed - set(found)
    print(
        f"\ncluster failover: leader {leader.node} killed, new leader {new_leader}; sent "
        f"{next(counter)}, answered 201 {len(confirmed)} ({before} before the kill), refused "
        f"{refused}, consumed {len(found)}, lost {len(lost)}, duplicates "
        f"{len(found) - len(set(found))}, publishing resumed {resumed_after:.2f} s after the kill"
    )
    assert new_leader != leader.node
    assert not lost
