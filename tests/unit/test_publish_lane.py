"""The single-message publish's lane (`gateway.publish_lane`) answers exactly as the ordinary
path through Starlette's router does, for good and bad requests alike."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.types import ASGIApp, Receive, Scope, Send

from bandgate.gateway.app import create_app
from bandgate.gateway.auth import TokenSpec, hash_token
from bandgate.gateway.publish_lane import PublishLane
from bandgate.gateway.settings import GatewaySettings
from bandgate.testing.memory_broker import MemoryBroker, MemoryLink
from bandgate.topology.loader import parse_topology

TOPOLOGY = parse_topology({"queues": {"orders": {}, "emails": {}}})
TOKENS = (
    TokenSpec(name="writer", sha256=hash_token("w"), scopes=("publish:orders",)),
    TokenSpec(name="reader", sha256=hash_token("r"), scopes=("read:*",)),
    TokenSpec(name="operator", sha256=hash_token("a"), scopes=("admin",)),
)
SETTINGS = GatewaySettings(
    tokens=TOKENS,
    rate_limit_per_second=0.001,  # the burst, then 429: no refill within a test
    rate_limit_burst=18,
    max_body_bytes=2048,
    auth_failures_per_minute=1000,
)
WRITER = {"Authorization": "Bearer w"}
JSON = {**WRITER, "Content-Type": "application/json"}
PATH = "/v1/queues/orders/messages"

# (method, path, headers, body): the same sequence goes to both paths, so the rate limit's
# bucket and the failed-auth counter stand alike on both sides at every request.
REQUESTS: list[tuple[str, str, dict[str, str], bytes]] = [
    ("POST", PATH, JSON, b'{"payload": {"a": 1}, "priority": 8}'),
    ("POST", PATH, JSON, b'{"payload": 1, "priority": "low", "message_id": "m-1"}'),
    ("POST", PATH, JSON, b'{"payload": 1, "delay_seconds": 3}'),
    ("POST", PATH, JSON, b'{"payload": '),
    ("POST", PATH, JSON, b'{"id": 18446744073709551617}'),
    ("POST", PATH, {**WRITER, "Content-Type": "text/plain"}, b'{"payload": 1}'),
    ("POST", PATH, WRITER, b'{"payload": 1}'),
    ("POST", PATH, JSON, b'{"payload": "' + b"x" * 4096 + b'"}'),
    ("POST", "/v1/queues/nowhere/messages", JSON, b'{"payload": 1}'),
    ("POST", "/v1/queues/nowhere/messages", {"Authorization": "Bearer a"}, b'{"payload": 1}'),
    ("POST", "/v1/queues/emails/messages", JSON, b'{"payload": 1}'),
    ("POST", PATH, JSON, b'{"payload": 1, "priority": 12}'),
    ("POST", PATH, JSON, b'{"payload": 1, "priority": "urgent"}'),
    ("POST", PATH, JSON, b'{"payload": 1, "colour": "red"}'),
    ("POST", PATH, JSON, b"[1, 2]"),
    ("POST", PATH, JSON, b'{"priority": 3}'),
    ("POST", PATH, {"Content-Type": "application/json"}, b'{"payload": 1}'),
    ("POST", PATH, {"Authorization": "Bearer nope"}, b'{"payload": 1}'),
    ("POST", PATH, {"Authorization": "Bearer r", "Content-Type": "application/json"}, b"{}"),
    ("POST", PATH, {**JSON, "Origin": "https://elsewhere.example"}, b'{"payload": 1}'),
    ("POST", PATH, {**JSON, "Sec-Fetch-Site": "cross-site"}, b'{"payload": 1}'),
    ("POST", "/v1/queues/%FF/messages", JSON, b'{"payload": 1}'),
    ("POST", PATH + "?x=%FF", JSON, b'{"payload": 1}'),
    ("GET", PATH, WRITER, b""),
    ("POST", PATH + "/", JSON, b'{"payload": 1}'),
    ("POST", PATH, JSON, b'{"payload": 2}'),  # the writer's 18th request: the burst's last
    ("POST", PATH, JSON, b'{"payload": 3}'),  # over the rate limit: 429
]
VARYING = {"message_id", "enqueued_at", "deliver_at"}  # made per message


def ordinary(app: Starlette) -> ASGIApp:
    """The app without its lane: the lane's own `app`, the ordinary middleware and router."""

    async def serve(scope: Scope, receive: Receive, send: Send) -> None:
        scope["app"] = app
        if app.middleware_stack is None:
            app.middleware_stack = app.build_middleware_stack()
        lane = getattr(app.middleware_stack, "app", None)
        assert isinstance(lane, PublishLane)
        await lane.app(scope, receive, send)

    return serve


@asynccontextmanager
async def client(app: Starlette, asgi: ASGIApp) -> AsyncIterator[httpx.AsyncClient]:
    async with AsyncExitStack() as stack:
        await stack.enter_async_context(app.router.lifespan_context(app))
        transport = httpx.ASGITransport(app=asgi)
        http = httpx.AsyncClient(transport=transport, base_url="http://gateway.test")
        yield await stack.enter_async_context(http)


def answer(response: httpx.Response) -> tuple[int, dict[str, str], Any]:
    headers = {
        name: response.headers[name]
        for name in ("content-type", "retry-after", "www-authenticate", "allow")
        if name in response.headers
    }
    body = response.json() if response.content else None
    if response.status_code == 201:
        body = {key: value for key, value in response.json().items() if key not in VARYING}
    return response.status_code, headers, body


def gateway() -> Starlette:
    return create_app(SETTINGS, link=MemoryLink(MemoryBroker(TOPOLOGY)))


async def test_the_lane_answers_as_the_router_does() -> None:
    fast, slow = gateway(), gateway()
    statuses = []
    async with client(fast, fast) as lane, client(slow, ordinary(slow)) as router:
        for method, path, headers, body in REQUESTS:
            one = await lane.request(method, path, headers=headers, content=body)
            other = await router.request(method, path, headers=headers, content=body)
            assert answer(one) == answer(other), (method, path, headers, body[:40])
            statuses.append(one.status_code)
    assert set(statuses) == {201, 400, 401, 403, 404, 405, 413, 415, 422, 429}
    assert statuses[-2:] == [201, 429]


async def test_the_lane_takes_the_single_publish_and_nothing_else() -> None:
    app = gateway()
    taken: list[str] = []

    async def refuse(scope: Scope, receive: Receive, send: Send) -> None:
        taken.append(f"{scope['method']} {scope['path']}")
        raise AssertionError("not the lane's")

    async with client(app, app) as http:
        app.middleware_stack = app.build_middleware_stack()
        lane = getattr(app.middleware_stack, "app", None)
        assert isinstance(lane, PublishLane)
        ordinary_app, lane.app = lane.app, refuse
        sent = await http.post(PATH, headers=JSON, content=b'{"payload": 1}')
        assert sent.status_code == 201
        with pytest.raises(AssertionError, match="not the lane's"):
            await http.get(PATH, headers=WRITER)
        with pytest.raises(AssertionError, match="not the lane's"):
            await http.post(PATH + "/batch", headers=JSON, content=b'{"messages": []}')
        lane.app = ordinary_app
    assert taken == ["GET /v1/queues/orders/messages", "POST /v1/queues/orders/messages/batch"]
