"""Hostile and random requests against a real gateway over HTTP: never a 5xx, and nothing
enqueued except what was answered 201 (or listed as successful in a batch)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import aio_pika
import httpx
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bandgate.gateway.settings import GatewaySettings
from bandgate.ops.local_broker import free_port
from bandgate.topology.model import Topology
from tests.integration.conftest import queue_depths
from tests.integration.live_gateway import LiveGateway

pytestmark = pytest.mark.integration

json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=50),
)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
field_values = st.one_of(
    json_values,
    st.integers(min_value=-3, max_value=12),
    st.sampled_from(["critical", "high", "normal", "low", "background", "urgent", "9", "", "²"]),
    st.sampled_from(["2030-01-01T00:00:00Z", "2000-01-01T00:00:00+01:00", "soon", "2030-13-01"]),
    st.floats(min_value=-5, max_value=3),
    st.dictionaries(st.text(max_size=20), json_values, max_size=4),
    st.text(max_size=300),
)
message_bodies = st.dictionaries(
    st.sampled_from(
        ["payload", "priority", "delay_seconds", "deliver_at", "headers", "message_id",
         "partition_key", "extra"]
    ),
    field_values,
    max_size=6,
)  # fmt: skip
raw_bodies = st.one_of(
    message_bodies.map(orjson.dumps),
    st.lists(message_bodies, max_size=4).map(lambda items: orjson.dumps({"messages": items})),
    st.binary(max_size=200),
    st.just(b'{"payload": ' + b"[" * 3000 + b"]" * 3000 + b"}"),
    st.just(b'{"payload": "\xed\xa0\x80"}'),
    st.just(b'{"payload": 1, "headers": {"a": "line\\r\\nX-Injected: 1"}}'),
)
paths = st.sampled_from(
    [
        "/v1/queues/orders/messages",
        "/v1/queues/orders/messages",
        "/v1/queues/orders/messages",
        "/v1/queues/orders/messages/batch",
        "/v1/queues/orders/messages/batch",
        "/v1/queues/emails/messages",
        "/v1/queues/emails/messages",
        "/v1/queues/orders.hot/messages",
        "/v1/queues/..%2F..%2Fetc/messages",
        "/v1/queues/%C3%A9t%C3%A9/messages",
        "/v1/queues/a%2Fb/messages",
    ]
)
content_types = st.sampled_from(
    ["application/json"] * 6 + ["application/json; charset=utf-8", "text/plain", ""]
)


@pytest.fixture
def live(gateway_settings: GatewaySettings, topology: Topology) -> Iterator[LiveGateway]:
    settings = gateway_settings.model_copy(update={"port": free_port()})
    with LiveGateway(settings, topology) as gateway:
        yield gateway


def test_random_requests_never_5xx_and_only_accepted_messages_are_enqueued(
    live: LiveGateway, amqp_url: str, topology: Topology
) -> None:
    accepted = 0
    requests = 0
    statuses: dict[int, int] = {}

    with httpx.Client(base_url=live.url, timeout=10) as client:

        @settings(
            max_examples=400,
            deadline=None,
            suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
            database=None,
        )
        @given(path=paths, body=raw_bodies, content_type=content_types)
        def one_request(path: str, body: bytes, content_type: str) -> None:
            nonlocal accepted, requests
            headers = {"content-type": content_type} if content_type else {}
            response = client.post(path, content=body, headers=headers)
            requests += 1
            statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
            assert response.status_code < 500, (response.status_code, response.text, body[:200])
            data: Any = response.json()
            if response.status_code == 201:
                accepted += 1
            elif response.status_code == 200:
                accepted += len(data["successful"])
            else:
                assert set(data["error"]) == {"code", "message", "field"}

        one_request()

    async def total() -> int:
        connection = await aio_pika.connect(amqp_url)
        async with connection:
            return sum((await queue_depths(connection, topology)).values())

    enqueued = asyncio.run(total())
    print(f"fuzz: {requests} requests, statuses {dict(sorted(statuses.items()))}, "
          f"{accepted} accepted, {enqueued} enqueued")  # fmt: skip
    assert requests >= 400
    assert enqueued == accepted
