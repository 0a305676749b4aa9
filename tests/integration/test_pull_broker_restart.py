"""HTTP receivers through a broker restart: the broker takes the leased messages back with the
connection, a settlement meanwhile gets a clear answer (never a 500), and once the broker is
back every message is received again: lost = 0."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from bandgate.gateway.settings import GatewaySettings
from bandgate.ops.local_broker import LocalBroker
from bandgate.pull.app import create_app
from bandgate.pull.settings import PullSettings
from bandgate.topology.model import Topology

pytestmark = [pytest.mark.integration, pytest.mark.fault]


@pytest.fixture
def node(tmp_path: Path) -> Iterator[LocalBroker]:
    broker = LocalBroker(tmp_path / "node", name="bandgate-pull-restart", plugins=())
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


async def _receive(http: httpx.AsyncClient, **asked: Any) -> list[dict[str, Any]]:
    response = await http.post("/v1/queues/orders/receive", json=asked)
    assert response.status_code == 200, response.text
    messages: list[dict[str, Any]] = response.json()["messages"]
    return messages


async def test_leases_held_through_a_broker_restart_come_back(
    node: LocalBroker, topology: Topology
) -> None:
    settings = GatewaySettings(amqp_url=node.amqp_url, auth_enabled=False)
    app = create_app(settings, topology, pull=PullSettings(linger_seconds=0.05))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://gateway", timeout=30
        ) as http:
            sent = set()
            for n in range(5):
                response = await http.post(
                    "/v1/queues/orders/messages", json={"payload": {"n": n}, "priority": 8}
                )
                assert response.status_code == 201, response.text
                sent.add(response.json()["message_id"])
            leased = await _receive(http, max_messages=5, wait_seconds=5, visibility_timeout=600)
            assert {m["message_id"] for m in leased} == sent

            await asyncio.to_thread(node.stop_app)
            during = await http.delete(f"/v1/queues/orders/receipts/{leased[0]['receipt']}")
            assert during.status_code in (410, 503), during.text
            await asyncio.to_thread(node.start_app)
            deadline = time.monotonic() + 30
            while (await http.get("/readyz")).status_code != 200:
                assert time.monotonic() < deadline, "the gateway did not reconnect"
                await asyncio.sleep(0.1)

            # The broker took them back with the old connection: their receipts are gone.
            after = await http.delete(f"/v1/queues/orders/receipts/{leased[1]['receipt']}")
            assert after.status_code == 410, after.text
            received: set[str] = set()
            deadline = time.monotonic() + 30
            while received != sent and time.monotonic() < deadline:
                for message in await _receive(http, max_messages=5, wait_seconds=2):
                    received.add(message["message_id"])
                    ack = await http.delete(f"/v1/queues/orders/receipts/{message['receipt']}")
                    assert ack.status_code == 204, ack.text
            assert received == sent  # lost: none
