"""The hostile-input findings, replayed against the real gateway and broker: each gets its
documented 4xx (never a 500), nothing refused is enqueued, and the gateway's broker connection
stays up for everyone else.

The dead-letter findings are in `test_dlq_hardening.py`, the HTTP head limits in
`test_http_limits.py`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from aio_pika.abc import AbstractRobustConnection
from starlette.applications import Starlette

from bandgate.core.broker import BrokerLink
from bandgate.gateway.app import create_app
from bandgate.gateway.auth import TokenSpec, hash_token
from bandgate.gateway.settings import GatewaySettings
from bandgate.topology import naming
from bandgate.topology.model import Topology
from tests.integration.conftest import queue_depths

pytestmark = pytest.mark.integration

ONE = "/v1/queues/orders/messages"
BATCH = "/v1/queues/orders/messages/batch"
PUBLISHER = "publisher-secret"
LIMITED = "limited-secret"

# Finding 1: 32 headers of 4 KB, about 132 KB: under the body limit, over the broker's frame.
OVERSIZE_HEADERS = {"payload": 1, "headers": {f"h{i}": "v" * 4096 for i in range(32)}}


@pytest.fixture
async def gateway(
    gateway_settings: GatewaySettings, topology: Topology
) -> AsyncIterator[tuple[Starlette, httpx.AsyncClient]]:
    """A gateway with the production body limit (256 KiB), auth on and a limited token."""
    settings = gateway_settings.model_copy(
        update={
            "max_body_bytes": 256 * 1024,
            "max_batch_messages": 100,
            "auth_enabled": True,
            "auth_failures_per_minute": 20,
            "tokens": (
                TokenSpec(name="pub", sha256=hash_token(PUBLISHER), scopes=("publish:*", "read:*")),
                TokenSpec(
                    name="limited",
                    sha256=hash_token(LIMITED),
                    scopes=("publish:*",),
                    rate_per_second=50,
                ),
            ),
        }
    )
    app = create_app(settings, topology)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(
            transport=transport,
            base_url="http://gateway",
            headers={"authorization": f"Bearer {PUBLISHER}"},
        ) as http:
            yield app, http


def link_of(app: Starlette) -> BrokerLink:
    link: BrokerLink = app.state.link
    return link


def error_of(response: httpx.Response) -> dict[str, Any]:
    assert response.headers["content-type"] == "application/json", response.text
    error: dict[str, Any] = response.json()["error"]
    return error


async def test_oversize_headers_are_refused_and_the_connection_stays_up(
    gateway: tuple[Starlette, httpx.AsyncClient],
    amqp: AbstractRobustConnection,
    topology: Topology,
) -> None:
    app, http = gateway
    connection = link_of(app).connection
    assert connection is not None
    transport = connection.transport
    response = await http.post(ONE, json=OVERSIZE_HEADERS)
    assert response.status_code == 413
    assert error_of(response)["code"] == "message_too_large"
    assert error_of(response)["field"] == "headers"
    batch = await http.post(BATCH, json={"messages": [{"payload": "ok"}, OVERSIZE_HEADERS]})
    assert batch.status_code == 200
    assert [item["index"] for item in batch.json()["successful"]] == [0]
    assert batch.json()["failed"][0]["error"]["code"] == "message_too_large"
    assert batch.json()["failed"][0]["error"]["field"] == "messages.1.headers"
    # The same connection, still up: the broker never saw the oversize frame.
    assert link_of(app).connected
    assert connection.transport is transport
    assert (await http.post(ONE, json={"payload": 2})).status_code == 201
    depths = await queue_depths(amqp, topology)
    assert sum(depths.values()) == 2, depths


async def test_other_publishers_are_unaffected_by_a_repeated_oversize_request(
    gateway: tuple[Starlette, httpx.AsyncClient],
    amqp: AbstractRobustConnection,
    topology: Topology,
) -> None:
    """The finding's load, shortened: 8 clients publish to `emails` while one sends the
    oversize request every 0.1 s; every one of their publishes gets 201."""
    app, http = gateway
    statuses: list[int] = []
    attacks: list[int] = []
    stop = asyncio.Event()
    enough = asyncio.Event()

    async def publisher() -> None:
        while not stop.is_set():
            response = await http.post(
                "/v1/queues/emails/messages", json={"payload": "hi", "priority": 8}
            )
            statuses.append(response.status_code)

    async def attacker() -> None:
        while not stop.is_set():
            attacks.append((await http.post(ONE, json=OVERSIZE_HEADERS)).status_code)
            if len(attacks) >= 5 and statuses:
                enough.set()
            await asyncio.sleep(0.1)

    tasks = [asyncio.create_task(publisher()) for _ in range(8)]
    tasks.append(asyncio.create_task(attacker()))
    await asyncio.sleep(2.0)
    # Two seconds make up to 20 attacks; a loaded machine answers slower, so the load goes on
    # until five were answered (or a task failed: gather below raises its error).
    counted = asyncio.create_task(enough.wait())
    await asyncio.wait([counted, *tasks], timeout=60, return_when=asyncio.FIRST_COMPLETED)
    counted.cancel()
    stop.set()
    await asyncio.gather(*tasks)
    assert len(attacks) >= 5
    assert set(attacks) == {413}
    assert statuses
    assert set(statuses) == {201}
    depths = await queue_depths(amqp, topology)
    assert depths[naming.band_queue("emails", "hot")] == len(statuses)
    assert sum(depths.values()) == len(statuses)


def nested(levels: int) -> Any:
    value: Any = None
    for _ in range(levels):
        value = [value]
    return value


# fmt: off
REFUSED: list[tuple[str, dict[str, Any], int, str, str | None]] = [
    # id, body, status, code, field
    ("message_id over 255 bytes", {"payload": 1, "message_id": "\U0001f600" * 64}, 422,
     "invalid_field", "message_id"),
    ("payload 255 levels deep", {"payload": nested(255)}, 422, "invalid_field", "payload"),
    ("deliver_at zero", {"payload": 1, "deliver_at": 0}, 422, "invalid_field", "deliver_at"),
    ("deliver_at as epoch ms", {"payload": 1, "deliver_at": 253402300800}, 422, "invalid_field",
     "deliver_at"),
    ("deliver_at a date only", {"payload": 1, "deliver_at": "2030-01-01"}, 422, "invalid_field",
     "deliver_at"),
]
# fmt: on


@pytest.mark.parametrize(
    ("body", "status", "code", "field"), [pytest.param(*case[1:], id=case[0]) for case in REFUSED]
)
async def test_input_validation_accepted_before_is_refused_now(
    gateway: tuple[Starlette, httpx.AsyncClient],
    amqp: AbstractRobustConnection,
    topology: Topology,
    body: dict[str, Any],
    status: int,
    code: str,
    field: str | None,
) -> None:
    response = await http_of(gateway).post(ONE, json=body)
    assert response.status_code == status, response.text
    assert (error_of(response)["code"], error_of(response)["field"]) == (code, field)
    assert sum((await queue_depths(amqp, topology)).values()) == 0


def http_of(gateway: tuple[Starlette, httpx.AsyncClient]) -> httpx.AsyncClient:
    return gateway[1]


@pytest.mark.parametrize(
    "raw",
    [
        b'{"payload": {"id": 18446744073709551617}}',
        b'{"payload": [-9223372036854775809]}',
        b'{"payload": 1' + b"0" * 5000 + b"}",
    ],
    ids=["2**64 + 1", "-2**63 - 1", "5001 digits"],
)
async def test_integers_beyond_64_bits_are_malformed_not_floats(
    gateway: tuple[Starlette, httpx.AsyncClient],
    amqp: AbstractRobustConnection,
    topology: Topology,
    raw: bytes,
) -> None:
    response = await http_of(gateway).post(
        ONE, content=raw, headers={"content-type": "application/json"}
    )
    assert response.status_code == 400, response.text
    assert error_of(response)["code"] == "malformed_json"
    assert sum((await queue_depths(amqp, topology)).values()) == 0


async def test_edge_values_that_fit_arrive_exactly(
    gateway: tuple[Starlette, httpx.AsyncClient], amqp: AbstractRobustConnection
) -> None:
    """The largest unsigned 64-bit integer, 254 levels of nesting, a float header beyond
    32-bit range and a 255-byte message id are carried, not refused or rounded."""
    message_id = "\U0001f600" * 63 + "abc"
    body = {
        "payload": {"big": 18446744073709551615, "deep": nested(253)},
        "headers": {"huge": 1e39, "price": 19.99},
        "message_id": message_id,
        "priority": 8,
    }
    response = await http_of(gateway).post(ONE, json=body)
    assert response.status_code == 201, response.text
    channel = await amqp.channel()
    queue = await channel.get_queue(naming.band_queue("orders", "hot"))
    message = await queue.get(no_ack=True)
    assert message.message_id == message_id
    assert message.headers["huge"] == 1e39
    assert message.headers["price"] == 19.99
    assert message.body.startswith(b'{"big":18446744073709551615,')


async def test_a_batch_with_an_unencodable_item_publishes_the_others_and_reports_it(
    gateway: tuple[Starlette, httpx.AsyncClient],
    amqp: AbstractRobustConnection,
    topology: Topology,
) -> None:
    messages = [{"payload": 1}, {"payload": 2}, {"payload": nested(300)}]
    response = await http_of(gateway).post(BATCH, json={"messages": messages})
    assert response.status_code == 200, response.text
    assert [item["index"] for item in response.json()["successful"]] == [0, 1]
    (failed,) = response.json()["failed"]
    assert (failed["index"], failed["error"]["code"], failed["error"]["field"]) == (
        2,
        "invalid_field",
        "messages.2.payload",
    )
    depths = await queue_depths(amqp, topology)
    assert depths[naming.band_queue("orders", "warm")] == 2
    assert sum(depths.values()) == 2


async def test_a_batch_costs_one_token_per_message(
    gateway: tuple[Starlette, httpx.AsyncClient],
    amqp: AbstractRobustConnection,
    topology: Topology,
) -> None:
    """The finding replayed: 60 batches of 100 as fast as they go, with a 50 messages/s
    token (burst 100). Before, all 6,000 passed in 0.69 s; now what passes is the burst plus
    50 a second, and every refused batch published nothing."""
    headers = {"authorization": f"Bearer {LIMITED}"}
    batch = {"messages": [{"payload": i} for i in range(100)]}
    started = time.monotonic()
    answers = [await http_of(gateway).post(BATCH, json=batch, headers=headers) for _ in range(60)]
    elapsed = time.monotonic() - started
    accepted = sum(len(r.json()["successful"]) for r in answers if r.status_code == 200)
    refused = [r for r in answers if r.status_code != 200]
    assert answers[0].status_code == 200
    assert answers[1].status_code == 429
    assert {error_of(r)["code"] for r in refused} == {"rate_limited"}
    assert all(int(r.headers["retry-after"]) >= 1 for r in refused)
    # One batch may run the bucket into debt; none beyond that.
    assert accepted <= 100 + 50 * elapsed + 100, (accepted, elapsed)
    assert sum((await queue_depths(amqp, topology)).values()) == accepted


async def test_failed_authentication_is_limited_per_address(
    gateway: tuple[Starlette, httpx.AsyncClient],
    amqp: AbstractRobustConnection,
    topology: Topology,
) -> None:
    """20 failures a minute are allowed; then that address gets 429 before its token is
    looked at, valid or not."""
    http = http_of(gateway)
    statuses = [
        (await http.post(ONE, json={"payload": 1}, headers={"authorization": "Bearer x"}))
        for _ in range(25)
    ]
    assert [r.status_code for r in statuses] == [401] * 20 + [429] * 5
    assert error_of(statuses[-1])["code"] == "too_many_auth_failures"
    assert int(statuses[-1].headers["retry-after"]) >= 1
    assert (await http.post(ONE, json={"payload": 1})).status_code == 429
    assert sum((await queue_depths(amqp, topology)).values()) == 0


async def test_an_unexpected_error_is_json_with_a_request_id(
    gateway: tuple[Starlette, httpx.AsyncClient],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def broken(*args: object) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr("bandgate.gateway.routes.queue_stats", broken)
    http = http_of(gateway)
    with caplog.at_level(logging.ERROR, logger="bandgate.gateway.middleware"):
        response = await http.get("/v1/queues/orders/stats", headers={"x-request-id": "req-42"})
        other = await http.get("/v1/queues/orders/stats")
    assert response.status_code == 500
    error = error_of(response)
    assert error["code"] == "internal_error"
    assert error["request_id"] == "req-42"
    assert response.headers["x-request-id"] == "req-42"
    assert error_of(other)["request_id"]  # made up when the client sent none
    assert "req-42" in caplog.text
    assert "RuntimeError: a bug" in caplog.text
