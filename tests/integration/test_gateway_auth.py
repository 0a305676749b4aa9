"""Every endpoint against every kind of caller: no token, a wrong one, one lacking the scope,
and the right one."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from bandgate.gateway.app import create_app
from bandgate.gateway.auth import TokenSpec, hash_token
from bandgate.gateway.settings import GatewaySettings
from bandgate.topology.model import Topology

# The HTTP edge (or a CLI over it): the broker matrix leaves it to `make test`.
pytestmark = [pytest.mark.integration, pytest.mark.broker_independent]

PUBLISHER = "publisher-secret"
READER = "reader-secret"
EMAILS_ONLY = "emails-secret"
ADMIN = "admin-secret"
LIMITED = "limited-secret"


@pytest.fixture
async def secured(
    gateway_settings: GatewaySettings, topology: Topology
) -> AsyncIterator[httpx.AsyncClient]:
    settings = gateway_settings.model_copy(
        update={
            "auth_enabled": True,
            "tokens": (
                TokenSpec(name="pub", sha256=hash_token(PUBLISHER), scopes=("publish:orders",)),
                TokenSpec(name="read", sha256=hash_token(READER), scopes=("read:*",)),
                TokenSpec(name="mail", sha256=hash_token(EMAILS_ONLY), scopes=("publish:emails",)),
                TokenSpec(name="admin", sha256=hash_token(ADMIN), scopes=("admin",)),
                TokenSpec(
                    name="slow",
                    sha256=hash_token(LIMITED),
                    scopes=("publish:*",),
                    rate_per_second=0.5,
                ),
            ),
            "rate_limit_burst": 2,
        }
    )
    app = create_app(settings, topology)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as http:
            yield http


ENDPOINTS = [
    ("POST", "/v1/queues/orders/messages", {"payload": 1}, PUBLISHER, READER, 201),
    ("POST", "/v1/queues/orders/messages/batch", {"messages": [{"payload": 1}]}, PUBLISHER,
     EMAILS_ONLY, 200),
    ("GET", "/v1/queues/orders/stats", None, READER, PUBLISHER, 200),
]  # fmt: skip


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


@pytest.mark.parametrize(("method", "path", "body", "right", "lacking", "ok"), ENDPOINTS)
async def test_auth_matrix(
    secured: httpx.AsyncClient,
    method: str,
    path: str,
    body: object,
    right: str,
    lacking: str,
    ok: int,
) -> None:
    async def call(headers: dict[str, str]) -> httpx.Response:
        return await secured.request(method, path, json=body, headers=headers)

    missing = await call({})
    assert missing.status_code == 401
    assert missing.json()["error"]["code"] == "unauthorized"
    assert missing.headers["www-authenticate"] == "Bearer"

    wrong = await call(bearer("not-a-token"))
    assert wrong.status_code == 401
    assert wrong.json()["error"]["code"] == "invalid_token"

    not_bearer = await call({"authorization": f"Basic {right}"})
    assert not_bearer.status_code == 401

    forbidden = await call(bearer(lacking))
    assert forbidden.status_code == 403
    assert forbidden.json()["error"]["code"] == "forbidden"

    allowed = await call(bearer(right))
    assert allowed.status_code == ok, allowed.text
    admin = await call(bearer(ADMIN))
    assert admin.status_code == ok, admin.text


async def test_queue_listing_shows_only_what_the_token_may_see(secured: httpx.AsyncClient) -> None:
    assert (await secured.get("/v1/queues")).status_code == 401
    mail = (await secured.get("/v1/queues", headers=bearer(EMAILS_ONLY))).json()
    assert [queue["name"] for queue in mail["queues"]] == ["emails"]
    everything = (await secured.get("/v1/queues", headers=bearer(READER))).json()
    assert {queue["name"] for queue in everything["queues"]} == {"orders", "emails"}


async def test_a_forbidden_publish_to_an_unknown_queue_does_not_reveal_it(
    secured: httpx.AsyncClient,
) -> None:
    response = await secured.post(
        "/v1/queues/secret-queue/messages", json={"payload": 1}, headers=bearer(PUBLISHER)
    )
    assert response.status_code == 403


async def test_operational_endpoints_need_no_token(secured: httpx.AsyncClient) -> None:
    for path in ("/healthz", "/readyz", "/metrics", "/openapi.json"):
        assert (await secured.get(path)).status_code == 200, path


async def test_rate_limit_answers_429_with_retry_after(secured: httpx.AsyncClient) -> None:
    statuses = []
    for _ in range(3):
        response = await secured.post(
            "/v1/queues/orders/messages", json={"payload": 1}, headers=bearer(LIMITED)
        )
        statuses.append(response.status_code)
    assert statuses == [201, 201, 429]
    assert response.json()["error"]["code"] == "rate_limited"
    assert int(response.headers["retry-after"]) >= 1
    other = await secured.post(
        "/v1/queues/orders/messages", json={"payload": 1}, headers=bearer(PUBLISHER)
    )
    assert other.status_code == 201  # buckets are per token
