"""A gateway and a worker given the three nodes' addresses (`BANDGATE_AMQP_URL` as a list) keep
publishing and consuming while the node they are connected to is SIGKILLed: every 201 is
consumed, every refusal is a documented 503, and both resume on another node by themselves."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable

import httpx
import pytest

from bandgate.consumers.app import ConsumerApp
from bandgate.consumers.message import Message
from bandgate.consumers.settings import WorkerSettings
from bandgate.consumers.worker import Worker
from bandgate.core import cluster_connection
from bandgate.gateway.app import create_app
from bandgate.gateway.settings import GatewaySettings
from bandgate.topology.declare import apply_topology
from bandgate.topology.model import Topology
from tools.local_cluster import LocalCluster

pytestmark = [pytest.mark.integration, pytest.mark.fault]

# 503s a publish may get while its connection moves: not enqueued, or outcome unknown.
MOVING = {"broker_unavailable", "confirm_lost", "confirm_timeout", "not_ready", "topology_missing"}
RESUME_SECONDS = 30.0


async def test_a_gateway_and_a_worker_move_to_another_node_when_theirs_dies(
    cluster: LocalCluster,
    topology: Topology,
    start_worker: Callable[[ConsumerApp], Awaitable[Worker]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    urls = ",".join(node.amqp_url for node in cluster.nodes)
    first = cluster.nodes[0]
    # Both start on the first address (the list's order, not a random one), so that one kill
    # takes away the node both are connected to.
    monkeypatch.setattr(random, "randrange", lambda n: 0)
    connection = await cluster_connection.connect(first.amqp_url)
    async with connection:
        await apply_topology(connection, topology)

    consumed: dict[int, float] = {}
    app = ConsumerApp(WorkerSettings(amqp_url=urls), topology=topology)

    @app.consumer("orders", concurrency=8)
    async def handle(msg: Message) -> None:
        consumed.setdefault(msg.payload["n"], time.monotonic())

    worker = await start_worker(app)
    settings = GatewaySettings(amqp_url=urls, publish_timeout_seconds=5.0, auth_enabled=False)
    gateway = create_app(settings, topology)
    confirmed: dict[int, float] = {}
    refusals: list[str] = []
    counter = iter(range(10**9))
    stop = asyncio.Event()
    async with gateway.router.lifespan_context(gateway):
        link = gateway.state.link
        assert str(link.connection.url).endswith(f":{first.amqp_port}/")
        transport = httpx.ASGITransport(app=gateway)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:

            async def load() -> None:
                while not stop.is_set():
                    n = next(counter)
                    response = await client.post(
                        "/v1/queues/orders/messages", json={"payload": {"n": n}, "priority": 9}
                    )
                    if response.status_code == 201:
                        confirmed[n] = time.monotonic()
                    else:
                        assert response.status_code == 503, response.text
                        refusals.append(response.json()["error"]["code"])
                    await asyncio.sleep(0.005)

            publishers = [asyncio.create_task(load()) for _ in range(8)]
            await wait_until(lambda: len(consumed) > 50, "consuming before the kill")
            await asyncio.to_thread(first.kill)
            killed_at = time.monotonic()
            await wait_until(
                lambda: any(at > killed_at for at in confirmed.values()), "publishing resumed"
            )
            published_again = min(at for at in confirmed.values() if at > killed_at) - killed_at
            await wait_until(
                lambda: any(at > killed_at for at in consumed.values()), "consuming resumed"
            )
            consumed_again = min(at for at in consumed.values() if at > killed_at) - killed_at
            await asyncio.sleep(1.0)
            stop.set()
            await asyncio.gather(*publishers)
        assert not str(link.connection.url).endswith(f":{first.amqp_port}/")

    await wait_until(lambda: set(confirmed) <= set(consumed), "every 201 consumed", 60)
    lost = set(confirmed) - set(consumed)
    print(
        f"\ncluster clients: {first.node} killed under load; answered 201 {len(confirmed)}, "
        f"refused {len(refusals)} ({sorted(set(refusals))}), consumed {len(consumed)}, lost "
        f"{len(lost)}; publishing again after {published_again:.2f} s, consuming after "
        f"{consumed_again:.2f} s"
    )
    assert not lost
    assert set(refusals) <= MOVING
    worker.stop()


async def wait_until(
    condition: Callable[[], bool], what: str, within: float = RESUME_SECONDS
) -> None:
    deadline = time.monotonic() + within
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {within:.0f} s"
        await asyncio.sleep(0.02)
