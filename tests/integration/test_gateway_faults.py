"""The broker goes away under a running gateway, and comes back."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import aio_pika
import httpx
import pytest

from bandgate.gateway.app import create_app
from bandgate.gateway.settings import GatewaySettings
from bandgate.ops.local_broker import LocalBroker
from bandgate.topology.loader import parse_topology
from bandgate.topology.model import Topology
from tests.broker import TestBroker
from tests.proxy import CuttableProxy

pytestmark = pytest.mark.integration

PUBLISH_TIMEOUT = 3.0


@pytest.fixture
def own_node(tmp_path: Path) -> Iterator[LocalBroker]:
    """A private node for this test alone: it is stopped and started under the gateway."""
    node = LocalBroker(tmp_path / "node", name="bandgate-fault", plugins=())
    node.start()
    try:
        yield node
    finally:
        node.stop()


async def _wait_for(client: httpx.AsyncClient, path: str, status: int, within: float) -> float:
    started = time.monotonic()
    while time.monotonic() - started < within:
        if (await client.get(path)).status_code == status:
            return time.monotonic() - started
        await asyncio.sleep(0.1)
    raise AssertionError(f"{path} did not answer {status} within {within} s")


@pytest.mark.fault
async def test_broker_stop_gives_503_and_restart_recovers(
    own_node: LocalBroker, topology: Topology
) -> None:
    settings = GatewaySettings(
        amqp_url=own_node.amqp_url, publish_timeout_seconds=PUBLISH_TIMEOUT, auth_enabled=False
    )
    app = create_app(settings, topology)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
            ok = await client.post("/v1/queues/orders/messages", json={"payload": 1})
            assert ok.status_code == 201

            await asyncio.to_thread(own_node.stop_app)
            await _wait_for(client, "/readyz", 503, within=30)
            started = time.monotonic()
            down = await client.post("/v1/queues/orders/messages", json={"payload": 2})
            elapsed = time.monotonic() - started
            assert down.status_code == 503
            assert down.json()["error"]["code"] in {"broker_unavailable", "confirm_timeout"}
            # Bounded by the timeout; the slack is the in-process request itself, which a
            # loaded machine slows.
            assert elapsed <= PUBLISH_TIMEOUT + 2.0
            stats = await client.get("/v1/queues/orders/stats")
            assert stats.status_code == 503

            await asyncio.to_thread(own_node.start_app)
            await _wait_for(client, "/readyz", 200, within=30)
            again = await client.post("/v1/queues/orders/messages", json={"payload": 3})
            assert again.status_code == 201, again.text
            depth = (await client.get("/v1/queues/orders/stats")).json()["bands"][1]["ready"]
            assert depth == 2  # payloads 1 and 3: the refused one was not enqueued


async def test_full_band_answers_429_and_keeps_what_it_confirmed(
    broker: TestBroker, amqp_url: str
) -> None:
    small = parse_topology(
        {
            "delay": {"levels": 4},
            "queues": {
                "orders": {
                    "bands": [
                        {"name": "hot", "priorities": [7, 9], "max_length": 3},
                        {"name": "cold", "priorities": [0, 6]},
                    ]
                }
            },
        }
    )
    settings = GatewaySettings(amqp_url=amqp_url, auth_enabled=False)
    app = create_app(settings, small)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
            statuses = []
            for n in range(5):
                response = await client.post(
                    "/v1/queues/orders/messages", json={"payload": n, "priority": 9}
                )
                statuses.append(response.status_code)
            # Quorum queues apply max-length once they are over it, so one more may pass.
            assert statuses[:3] == [201, 201, 201]
            assert statuses[-1] == 429
            assert set(statuses[3:]) <= {201, 429}
            accepted = statuses.count(201)
            assert response.json()["error"]["code"] == "queue_full"
            assert response.headers["retry-after"] == "1"
            cold = await client.post(
                "/v1/queues/orders/messages", json={"payload": "c", "priority": 1}
            )
            assert cold.status_code == 201  # other bands are unaffected
            stats = (await client.get("/v1/queues/orders/stats")).json()
            assert [band["ready"] for band in stats["bands"]] == [accepted, 1]


@pytest.mark.fault
async def test_cut_connection_gives_503_then_recovers_without_loss(
    broker: TestBroker, amqp_url: str, topology: Topology
) -> None:
    parts = urlsplit(amqp_url)
    proxy = await CuttableProxy(parts.hostname or "127.0.0.1", parts.port or 5672).start()
    proxied = urlunsplit(parts._replace(netloc=f"guest:guest@127.0.0.1:{proxy.port}"))
    settings = GatewaySettings(
        amqp_url=proxied, publish_timeout_seconds=PUBLISH_TIMEOUT, auth_enabled=False
    )
    app = create_app(settings, topology)
    confirmed: list[int] = []
    try:
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:

                async def publish(n: int) -> int:
                    response = await client.post(
                        "/v1/queues/orders/messages", json={"payload": n, "priority": 8}
                    )
                    if response.status_code == 201:
                        confirmed.append(n)
                    return response.status_code

                assert await publish(0) == 201
                proxy.cut()
                await _wait_for(client, "/readyz", 503, within=30)
                during = [await publish(n) for n in range(1, 4)]
                assert during == [503, 503, 503]
                proxy.restore()
                await _wait_for(client, "/readyz", 200, within=30)
                assert await publish(4) == 201
    finally:
        await proxy.close()
    connection = await aio_pika.connect(amqp_url)
    async with connection:
        channel = await connection.channel()
        queue = await channel.declare_queue("orders.hot", passive=True)
        held = []
        while (message := await queue.get(no_ack=True, fail=False)) is not None:
            held.append(int(message.body))
    assert held == confirmed == [0, 4]


@pytest.mark.fault
async def test_memory_alarm_answers_503_at_once(own_node: LocalBroker, topology: Topology) -> None:
    settings = GatewaySettings(
        amqp_url=own_node.amqp_url, publish_timeout_seconds=5.0, auth_enabled=False
    )
    app = create_app(settings, topology)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
            assert (
                await client.post("/v1/queues/orders/messages", json={"payload": 1})
            ).status_code == 201
            await asyncio.to_thread(own_node.ctl, "set_vm_memory_high_watermark", "absolute", "1")
            try:
                # RabbitMQ blocks a connection when it next publishes: that first publish
                # waits for its confirm until the timeout; from then on the gateway knows.
                first = await client.post("/v1/queues/orders/messages", json={"payload": 2})
                assert first.status_code == 503
                await _wait_for(client, "/readyz", 503, within=30)
                started = time.monotonic()
                blocked = await client.post("/v1/queues/orders/messages", json={"payload": 3})
                # At once: well short of the 5 s a confirm would be waited for, however loaded.
                assert time.monotonic() - started < 2.5
                assert blocked.status_code == 503
                assert blocked.json()["error"]["code"] == "broker_blocked"
                assert blocked.headers["retry-after"] == "5"
            finally:
                await asyncio.to_thread(own_node.ctl, "set_vm_memory_high_watermark", "0.4")
            await _wait_for(client, "/readyz", 200, within=30)
            assert (
                await client.post("/v1/queues/orders/messages", json={"payload": 3})
            ).status_code == 201
