from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime

import httpx
import orjson
import pytest
from aio_pika.abc import AbstractIncomingMessage, AbstractRobustConnection

from bandgate.topology import wire
from bandgate.topology.model import Topology
from tests.integration.conftest import queue_depths

pytestmark = pytest.mark.integration

# What a loaded machine (the suite's two workers and their nodes on two cores) may add to a
# delay, as these tests see it. Lower bounds stay exact, as nothing may land early; the
# ladder's own lateness (tens of milliseconds) is measured by `python -m bench delay`.
LATE_SECONDS = 3.0


async def get_one(connection: AbstractRobustConnection, queue: str) -> AbstractIncomingMessage:
    channel = await connection.channel()
    target = await channel.declare_queue(queue, passive=True)
    message = await target.get(no_ack=True, fail=False)
    await channel.close()
    assert message is not None, f"{queue} is empty"
    return message


@pytest.mark.parametrize(
    ("priority", "queue"),
    [(8, "orders.hot"), (5, "orders.warm"), (1, "orders.cold"), ("critical", "orders.hot")],
)
async def test_priority_lands_in_its_band(
    client: httpx.AsyncClient,
    amqp: AbstractRobustConnection,
    priority: int | str,
    queue: str,
) -> None:
    response = await client.post(
        "/v1/queues/orders/messages",
        json={"payload": {"order": 42}, "priority": priority, "headers": {"tenant": "acme"}},
    )
    assert response.status_code == 201, response.text
    body = response.json()
    assert body["band"] == queue.split(".")[1]
    assert body["queue"] == "orders"
    assert body["deliver_at"] is None
    message = await get_one(amqp, queue)
    expected_priority = 9 if priority == "critical" else priority
    assert message.priority == expected_priority == body["priority"]
    assert message.message_id == body["message_id"]
    assert message.content_type == "application/json"
    assert message.delivery_mode == 2
    assert orjson.loads(message.body) == {"order": 42}
    assert message.headers["tenant"] == "acme"
    enqueued = datetime.fromisoformat(body["enqueued_at"])
    assert message.headers[wire.ENQUEUED_AT] == wire.to_millis(enqueued)
    assert message.timestamp is not None


async def test_defaults_and_given_message_id(
    client: httpx.AsyncClient, amqp: AbstractRobustConnection
) -> None:
    response = await client.post(
        "/v1/queues/orders/messages",
        json={"payload": "plain", "message_id": "order-42", "partition_key": "customer-7"},
    )
    assert response.status_code == 201, response.text
    assert response.json()["priority"] == 4
    assert response.json()["message_id"] == "order-42"
    message = await get_one(amqp, "orders.warm")
    assert message.message_id == "order-42"
    assert message.headers[wire.PARTITION_KEY] == "customer-7"


async def test_batch_reports_each_message(
    client: httpx.AsyncClient, amqp: AbstractRobustConnection, topology: Topology
) -> None:
    response = await client.post(
        "/v1/queues/orders/messages/batch",
        json={
            "messages": [
                {"payload": 1, "priority": 9},
                {"payload": 2, "priority": 10},
                {"payload": 3, "priority": "low"},
                {"priority": 1},
                {"payload": 5, "delay_seconds": -1},
            ]
        },
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert [(item["index"], item["band"]) for item in body["successful"]] == [
        (0, "hot"),
        (2, "cold"),
    ]
    failures = {item["index"]: item["error"] for item in body["failed"]}
    assert failures[1]["code"] == "invalid_priority"
    assert failures[1]["field"] == "messages.1.priority"
    assert failures[3]["code"] == "missing_field"
    assert failures[4]["field"] == "messages.4.delay_seconds"
    depths = await queue_depths(amqp, topology)
    assert depths["orders.hot"] == 1
    assert depths["orders.cold"] == 1
    assert sum(depths.values()) == 2


async def test_a_batch_naming_one_message_id_twice_fails_the_later_ones(
    client: httpx.AsyncClient, amqp: AbstractRobustConnection, topology: Topology
) -> None:
    response = await client.post(
        "/v1/queues/orders/messages/batch",
        json={
            "messages": [
                {"payload": 1, "priority": 9, "message_id": "order-1"},
                {"payload": 2, "priority": 9, "message_id": "order-1"},
                {"payload": 3, "priority": 9, "message_id": "order-2"},
                {"payload": 4, "priority": 9},
            ]
        },
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert [item["index"] for item in body["successful"]] == [0, 2, 3]
    (failure,) = body["failed"]
    assert failure["index"] == 1
    assert failure["error"]["code"] == "duplicate_message_id"
    assert failure["error"]["field"] == "messages.1.message_id"
    assert (await queue_depths(amqp, topology))["orders.hot"] == 3


async def test_delayed_message_waits_then_lands_in_its_band(
    client: httpx.AsyncClient, amqp: AbstractRobustConnection, topology: Topology
) -> None:
    started = time.monotonic()
    response = await client.post(
        "/v1/queues/orders/messages", json={"payload": {"later": True}, "delay_seconds": 2}
    )
    assert response.status_code == 201, response.text
    assert response.json()["deliver_at"] is not None
    # Looked at right away, long before it is due even on a loaded machine; that it stays
    # held until then is `arrived`'s lower bound.
    depths = await queue_depths(amqp, topology)
    assert depths["orders.warm"] == 0
    assert sum(depths.values()) == 1  # waiting in a delay level
    deadline = started + 30  # a bound for a hang, not a pace
    while time.monotonic() < deadline:
        if (await queue_depths(amqp, topology))["orders.warm"] == 1:
            break
        await asyncio.sleep(0.05)
    arrived = time.monotonic() - started
    message = await get_one(amqp, "orders.warm")
    assert 1.9 <= arrived < 2.0 + LATE_SECONDS
    assert orjson.loads(message.body) == {"later": True}
    assert "x-death" in message.headers  # came through the ladder


async def test_deliver_at_in_the_future(
    client: httpx.AsyncClient, amqp: AbstractRobustConnection
) -> None:
    due = datetime.now(UTC).timestamp() + 1.0
    deliver_at = datetime.fromtimestamp(due, UTC).isoformat()
    response = await client.post(
        "/v1/queues/orders/messages",
        json={"payload": 1, "priority": 8, "deliver_at": deliver_at},
    )
    assert response.status_code == 201, response.text
    deadline = due + 30  # a bound for a hang, not a pace
    while datetime.now(UTC).timestamp() < deadline:
        channel = await amqp.channel()
        queue = await channel.declare_queue("orders.hot", passive=True)
        await channel.close()
        if queue.declaration_result.message_count:
            break
        await asyncio.sleep(0.05)
    assert datetime.now(UTC).timestamp() >= due - 0.1
    message = await get_one(amqp, "orders.hot")
    assert message.priority == 8


async def test_queue_listing_and_stats(client: httpx.AsyncClient) -> None:
    for priority in (9, 8, 1):
        response = await client.post(
            "/v1/queues/orders/messages", json={"payload": {}, "priority": priority}
        )
        assert response.status_code == 201
    queues = (await client.get("/v1/queues")).json()["queues"]
    orders = next(q for q in queues if q["name"] == "orders")
    assert [b["name"] for b in orders["bands"]] == ["hot", "warm", "cold"]
    assert orders["bands"][0]["priorities"] == [7, 9]
    stats = (await client.get("/v1/queues/orders/stats")).json()
    by_band = {band["band"]: band for band in stats["bands"]}
    assert by_band["hot"]["ready"] == 2
    assert by_band["warm"]["ready"] == 0
    assert by_band["cold"]["ready"] == 1
    assert by_band["hot"]["consumers"] == 0
    assert stats["ready"] == 3
    assert stats["dead_lettered"] == 0
    assert stats["delayed"] == 0


async def test_health_readiness_and_openapi(client: httpx.AsyncClient) -> None:
    assert (await client.get("/healthz")).json() == {"status": "ok"}
    ready = await client.get("/readyz")
    assert ready.status_code == 200
    assert ready.json()["broker_version"].startswith(("3.", "4."))
    spec = (await client.get("/openapi.json")).json()
    assert "/v1/queues/{queue}/messages" in spec["paths"]
    assert "PublishRequest" in spec["components"]["schemas"]
