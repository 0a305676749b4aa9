"""Dead-letter operations over HTTP: list, replay and purge, for admin tokens only."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from aio_pika.abc import AbstractRobustConnection

from bandgate.core.publishing import ChannelSet, Publisher, confirm_channel_factory
from bandgate.gateway.app import create_app
from bandgate.gateway.auth import TokenSpec, hash_token
from bandgate.gateway.settings import GatewaySettings
from bandgate.topology.model import Topology
from tests.integration.conftest import queue_depths
from tests.integration.test_dead_letters import SAMPLES, dead_letter

pytestmark = pytest.mark.integration

ADMIN = "admin-secret"
PUBLISHER = "publisher-secret"


@pytest.fixture
async def admin_client(
    gateway_settings: GatewaySettings, topology: Topology
) -> AsyncIterator[httpx.AsyncClient]:
    settings = gateway_settings.model_copy(
        update={
            "auth_enabled": True,
            "tokens": (
                TokenSpec(name="ops", sha256=hash_token(ADMIN), scopes=("admin",)),
                TokenSpec(name="app", sha256=hash_token(PUBLISHER), scopes=("publish:*",)),
            ),
        }
    )
    app = create_app(settings, topology)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(
            transport=transport,
            base_url="http://gateway",
            headers={"authorization": f"Bearer {ADMIN}"},
        ) as http:
            yield http


@pytest.fixture
async def five_dead_letters(
    admin_client: httpx.AsyncClient, amqp: AbstractRobustConnection, topology: Topology
) -> None:
    """Dead letters as the worker writes them (the gateway has applied the topology)."""
    publisher = Publisher(topology, ChannelSet(confirm_channel_factory(amqp)))
    for sample in SAMPLES:
        await dead_letter(publisher, sample)


@pytest.mark.usefixtures("five_dead_letters")
async def test_list_replay_purge_over_http(
    admin_client: httpx.AsyncClient, amqp: AbstractRobustConnection, topology: Topology
) -> None:
    listed = await admin_client.get("/v1/queues/orders/dlq", params={"limit": 3})
    assert listed.status_code == 200, listed.text
    body = listed.json()
    assert body["count"] == 5
    assert [m["message_id"] for m in body["messages"]] == ["d-0", "d-1", "d-2"]
    assert body["messages"][0]["reason"] == "ValueError: boom"
    assert body["messages"][0]["original_band"] == "hot"
    assert (await queue_depths(amqp, topology))["orders.dlq"] == 5  # listing moved nothing

    replayed = await admin_client.post(
        "/v1/queues/orders/dlq/replay", json={"reason": "ValueError", "limit": 10}
    )
    assert replayed.status_code == 200, replayed.text
    assert replayed.json()["replayed"] == 3
    depths = await queue_depths(amqp, topology)
    assert depths["orders.dlq"] == 2
    assert depths["orders.hot"] == 2
    assert depths["orders.cold"] == 1

    purged = await admin_client.delete("/v1/queues/orders/dlq")
    assert purged.json() == {"queue": "orders", "purged": 2}
    assert (await queue_depths(amqp, topology))["orders.dlq"] == 0


async def test_dead_letter_endpoints_need_the_admin_scope(admin_client: httpx.AsyncClient) -> None:
    app_token = {"authorization": f"Bearer {PUBLISHER}"}
    for method, path in [
        ("GET", "/v1/queues/orders/dlq"),
        ("POST", "/v1/queues/orders/dlq/replay"),
        ("DELETE", "/v1/queues/orders/dlq"),
    ]:
        forbidden = await admin_client.request(method, path, headers=app_token)
        assert forbidden.status_code == 403, (method, path)
        anonymous = await admin_client.request(method, path, headers={"authorization": ""})
        assert anonymous.status_code == 401, (method, path)
        assert (await admin_client.request(method, path)).status_code == 200, (method, path)


@pytest.mark.parametrize(
    ("method", "path", "body", "code"),
    [
        ("GET", "/v1/queues/orders/dlq?limit=0", None, "invalid_field"),
        ("GET", "/v1/queues/orders/dlq?limit=x", None, "invalid_field"),
        ("POST", "/v1/queues/orders/dlq/replay", {"rate": -1}, "invalid_field"),
        ("POST", "/v1/queues/orders/dlq/replay", {"limit": "3"}, "invalid_field"),
        ("POST", "/v1/queues/orders/dlq/replay", {"what": 1}, "unknown_field"),
        ("GET", "/v1/queues/nope/dlq", None, "unknown_queue"),
    ],
)
async def test_bad_dead_letter_requests(
    admin_client: httpx.AsyncClient, method: str, path: str, body: object, code: str
) -> None:
    response = await admin_client.request(method, path, json=body)
    assert response.status_code in (404, 422)
    assert response.json()["error"]["code"] == code
