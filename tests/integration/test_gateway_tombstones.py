"""Cancel, replace and escalate over HTTP against a real broker: what each answer says is what
the bands and the ledger stream hold afterwards, every bad input is refused with its documented
status before anything is written, and a failure between the publish and the tombstone is
answered as such."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson
import pytest
from aio_pika.abc import AbstractIncomingMessage, AbstractRobustConnection
from starlette.applications import Starlette

from bandgate.core.ledger import generation_of
from bandgate.core.ledger_follower import LedgerFollower
from bandgate.gateway.app import create_app
from bandgate.gateway.auth import TokenSpec, hash_token
from bandgate.gateway.message_routes import CANCEL_NOTE
from bandgate.gateway.settings import GatewaySettings
from bandgate.topology import naming, wire
from bandgate.topology.loader import parse_topology
from bandgate.topology.model import Topology
from tests.integration.conftest import queue_depths
from tests.integration.ledger_reader import entries_through, entries_until

pytestmark = pytest.mark.integration

PUBLISHER = "orders-publisher-secret"  # publish:orders
READER = "reader-secret"  # read:*


@pytest.fixture
def topology() -> Topology:
    """orders with the default bands (hot 7-9, warm 4-6, cold 0-3), and a band that is full
    after one message (classic: a quorum queue enforces its max-length only loosely)."""
    return parse_topology(
        {
            "exchange": "bandgate",
            "delay": {"base_ms": 50, "levels": 12},
            "queues": {
                "orders": {},
                "tiny": {
                    "bands": [
                        {"name": "all", "priorities": [0, 9], "max_length": 1, "type": "classic"}
                    ]
                },
            },
        }
    )


@pytest.fixture
async def app(gateway_settings: GatewaySettings, topology: Topology) -> AsyncIterator[Starlette]:
    """A gateway whose lifespan is running, its state (the broker link) at hand."""
    gateway = create_app(gateway_settings, topology)
    async with gateway.router.lifespan_context(gateway):
        yield gateway


@pytest.fixture
async def client(app: Starlette) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as http:
        yield http


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
            ),
        }
    )
    gateway = create_app(settings, topology)
    async with gateway.router.lifespan_context(gateway):
        transport = httpx.ASGITransport(app=gateway)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as http:
            yield http


async def take_all(
    connection: AbstractRobustConnection, queue: str
) -> list[AbstractIncomingMessage]:
    """Every message `queue` holds, taken off it."""
    channel = await connection.channel()
    target = await channel.declare_queue(queue, passive=True)
    taken = []
    while (message := await target.get(no_ack=True, fail=False)) is not None:
        taken.append(message)
    await channel.close()
    return taken


async def publish(client: httpx.AsyncClient, message_id: str, priority: int) -> None:
    response = await client.post(
        "/v1/queues/orders/messages",
        json={"payload": {"v": 1}, "priority": priority, "message_id": message_id},
    )
    assert response.status_code == 201, response.text


async def test_cancel_answers_202_and_writes_a_cancel_entry(
    client: httpx.AsyncClient,
    amqp: AbstractRobustConnection,
    topology: Topology,
    app: Starlette,
) -> None:
    await publish(client, "order-1", 5)
    response = await client.delete("/v1/queues/orders/messages/order-1")
    assert response.status_code == 202, response.text
    body = response.json()
    cancelled_before = body["cancelled_before"]
    assert body == {
        "message_id": "order-1",
        "queue": "orders",
        "cancelled_before": cancelled_before,
        "note": CANCEL_NOTE,
    }
    assert await entries_through(amqp, topology, "cancel", "order-1") == [
        ("cancel", "orders", "order-1", cancelled_before)
    ]
    # The copy stays in its band (a consumer skips it); the ledger's reader agrees it is dead.
    assert (await queue_depths(amqp, topology))["orders.warm"] == 1
    follower = LedgerFollower(amqp, topology, app.state.link.publisher)
    assert await follower.start(wait=10), follower.problem
    try:
        assert follower.view.verdict("orders", "order-1", 0) == "cancelled"
        assert follower.view.verdict("orders", "order-2", 0) is None
    finally:
        await follower.close()


@pytest.mark.parametrize("path_id", ["tenant/order-7", "tenant%2Forder-7"])
async def test_an_id_with_a_slash_can_be_named_in_the_path(
    client: httpx.AsyncClient, amqp: AbstractRobustConnection, topology: Topology, path_id: str
) -> None:
    await publish(client, "tenant/order-7", 0)
    escalated = await client.post(
        f"/v1/queues/orders/messages/{path_id}/escalate", json={"payload": {"v": 1}, "band": "hot"}
    )
    assert escalated.status_code == 201, escalated.text
    assert escalated.json()["message_id"] == "tenant/order-7"
    cancelled = await client.delete(f"/v1/queues/orders/messages/{path_id}")
    assert cancelled.status_code == 202, cancelled.text
    assert cancelled.json()["message_id"] == "tenant/order-7"
    entries = await entries_through(amqp, topology, "cancel", "tenant/order-7")
    assert [(op, message_id) for op, _, message_id, _ in entries] == [
        ("replace", "tenant/order-7"),
        ("cancel", "tenant/order-7"),
    ]


async def test_replace_publishes_a_new_generation_then_its_tombstone(
    client: httpx.AsyncClient, amqp: AbstractRobustConnection, topology: Topology
) -> None:
    await publish(client, "order-7", 1)
    response = await client.put(
        "/v1/queues/orders/messages/order-7",
        json={"payload": {"v": 2}, "priority": 8, "headers": {"tenant": "acme"}},
    )
    assert response.status_code == 201, response.text
    body = response.json()
    generation = body["generation"]
    assert isinstance(generation, int)
    assert generation > 0
    assert {k: body[k] for k in ("message_id", "queue", "priority", "band", "deliver_at")} == {
        "message_id": "order-7",
        "queue": "orders",
        "priority": 8,
        "band": "hot",
        "deliver_at": None,
    }
    (copy,) = await take_all(amqp, "orders.hot")
    assert copy.message_id == "order-7"
    assert orjson.loads(copy.body) == {"v": 2}
    assert copy.headers[wire.GENERATION] == generation
    assert generation_of(copy.headers) == generation
    assert copy.headers["tenant"] == "acme"
    (old,) = await take_all(amqp, "orders.cold")  # the first copy is still where it was
    assert generation_of(old.headers) == 0
    assert await entries_through(amqp, topology, "replace", "order-7") == [
        ("replace", "orders", "order-7", generation)
    ]


async def test_a_body_id_equal_to_the_paths_is_accepted(
    client: httpx.AsyncClient, amqp: AbstractRobustConnection
) -> None:
    response = await client.put(
        "/v1/queues/orders/messages/order-8", json={"payload": 1, "message_id": "order-8"}
    )
    assert response.status_code == 201, response.text
    (copy,) = await take_all(amqp, "orders.warm")
    assert copy.message_id == "order-8"


async def test_escalate_of_a_cold_message_lands_a_copy_in_the_hot_band(
    client: httpx.AsyncClient, amqp: AbstractRobustConnection, topology: Topology
) -> None:
    await publish(client, "order-9", 0)
    response = await client.post(
        "/v1/queues/orders/messages/order-9/escalate", json={"payload": {"v": 1}, "band": "hot"}
    )
    assert response.status_code == 201, response.text
    body = response.json()
    # A band means its highest priority, as the topology's model says.
    assert (body["band"], body["priority"]) == ("hot", topology.queue("orders").band("hot").high)
    (copy,) = await take_all(amqp, "orders.hot")
    assert (copy.message_id, copy.priority) == ("order-9", 9)
    assert copy.headers[wire.GENERATION] == body["generation"]
    assert len(await take_all(amqp, "orders.cold")) == 1
    # By priority too; its entry comes after the first escalate's.
    again = await client.post(
        "/v1/queues/orders/messages/order-9/escalate", json={"payload": {"v": 1}, "priority": 7}
    )
    assert again.status_code == 201, again.text
    assert (again.json()["band"], again.json()["priority"]) == ("hot", 7)
    second = again.json()["generation"]
    assert second >= body["generation"]
    entries = await entries_until(amqp, topology, lambda entry: entry.generation == second)
    assert entries == [
        ("replace", "orders", "order-9", body["generation"]),
        ("replace", "orders", "order-9", second),
    ]


BAD_INPUTS: list[tuple[str, str, Any, int, str, str | None]] = [
    ("DELETE", "/v1/queues/nope/messages/m1", None, 404, "unknown_queue", "queue"),
    ("PUT", "/v1/queues/nope/messages/m1", {"payload": 1}, 404, "unknown_queue", "queue"),
    ("POST", "/v1/queues/nope/messages/m1/escalate", {"payload": 1, "band": "hot"}, 404,
     "unknown_queue", "queue"),
    ("DELETE", "/v1/queues/orders/messages/" + "a" * 129, None, 422, "invalid_field",
     "message_id"),
    ("DELETE", "/v1/queues/orders/messages/bell%07", None, 422, "invalid_field", "message_id"),
    ("PUT", "/v1/queues/orders/messages/" + "é" * 128, {"payload": 1}, 422, "invalid_field",
     "message_id"),
    ("POST", "/v1/queues/orders/messages/%00/escalate", {"payload": 1, "band": "hot"}, 422,
     "invalid_field", "message_id"),
    ("PUT", "/v1/queues/orders/messages/m1", {"payload": 1, "message_id": "m2"}, 422,
     "invalid_field", "message_id"),
    ("PUT", "/v1/queues/orders/messages/m1", {"payload": 1, "message_id": 5}, 422,
     "invalid_field", "message_id"),
    ("POST", "/v1/queues/orders/messages/m1/escalate",
     {"payload": 1, "band": "hot", "message_id": "m2"}, 422, "invalid_field", "message_id"),
    ("PUT", "/v1/queues/orders/messages/m1", {"priority": 3}, 422, "missing_field", "payload"),
    ("PUT", "/v1/queues/orders/messages/m1", [1], 422, "invalid_body", None),
    ("PUT", "/v1/queues/orders/messages/m1", {"payload": 1, "priority": 10}, 422,
     "invalid_priority", "priority"),
    ("PUT", "/v1/queues/orders/messages/m1", {"payload": 1, "x": 1}, 422, "unknown_field", "x"),
    ("POST", "/v1/queues/orders/messages/m1/escalate", {"band": "hot"}, 422, "message_required",
     "payload"),
    ("POST", "/v1/queues/orders/messages/m1/escalate", {"payload": 1, "band": "hot",
     "priority": 9}, 422, "conflicting_fields", "band"),
    ("POST", "/v1/queues/orders/messages/m1/escalate", {"payload": 1}, 422, "missing_field",
     "priority"),
    ("POST", "/v1/queues/orders/messages/m1/escalate", {"payload": 1, "band": None,
     "priority": None}, 422, "missing_field", "priority"),
    ("POST", "/v1/queues/orders/messages/m1/escalate", {"payload": 1, "band": "lukewarm"}, 422,
     "invalid_field", "band"),
    ("POST", "/v1/queues/orders/messages/m1/escalate", {"payload": 1, "band": 3}, 422,
     "invalid_field", "band"),
    ("POST", "/v1/queues/orders/messages/m1/escalate", {"payload": 1, "priority": "hot"}, 422,
     "invalid_priority", "priority"),
    ("POST", "/v1/queues/orders/messages/m1/escalate", "text", 422, "invalid_body", None),
]  # fmt: skip


@pytest.mark.parametrize(("method", "path", "body", "status", "code", "field"), BAD_INPUTS)
async def test_bad_input_is_refused_and_nothing_is_written(
    client: httpx.AsyncClient,
    amqp: AbstractRobustConnection,
    topology: Topology,
    method: str,
    path: str,
    body: Any,
    status: int,
    code: str,
    field: str | None,
) -> None:
    response = await client.request(method, path, json=body)
    assert response.status_code == status, response.text  # never a 500
    assert response.json()["error"]["code"] == code
    assert response.json()["error"]["field"] == field
    assert sum((await queue_depths(amqp, topology)).values()) == 0
    sentinel = await client.delete("/v1/queues/orders/messages/sentinel")
    assert sentinel.status_code == 202
    written = await entries_through(amqp, topology, "cancel", "sentinel")
    assert [entry[:3] for entry in written] == [("cancel", "orders", "sentinel")]


async def test_a_body_that_is_not_json_is_refused(client: httpx.AsyncClient) -> None:
    path = "/v1/queues/orders/messages/m1"
    unsupported = await client.put(path, content=b'{"payload": 1}')
    assert (unsupported.status_code, unsupported.json()["error"]["code"]) == (
        415,
        "unsupported_media_type",
    )
    malformed = await client.post(
        f"{path}/escalate", content=b"{", headers={"content-type": "application/json"}
    )
    assert (malformed.status_code, malformed.json()["error"]["code"]) == (400, "malformed_json")


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("DELETE", "/v1/queues/orders/messages/m1", None),
        ("PUT", "/v1/queues/orders/messages/m1", {"payload": 1}),
        ("POST", "/v1/queues/orders/messages/m1/escalate", {"payload": 1, "band": "hot"}),
        ("DELETE", "/v1/queues/tiny/messages/m1", None),
    ],
)
async def test_a_token_that_may_not_publish_to_the_queue_gets_403(
    secured: httpx.AsyncClient, method: str, path: str, body: Any
) -> None:
    token = PUBLISHER if "/tiny/" in path else READER
    response = await secured.request(
        method, path, json=body, headers={"authorization": f"Bearer {token}"}
    )
    assert response.status_code == 403, response.text
    assert response.json()["error"]["code"] == "forbidden"
    allowed = await secured.delete(
        "/v1/queues/orders/messages/m1", headers={"authorization": f"Bearer {PUBLISHER}"}
    )
    assert allowed.status_code == 202, allowed.text


async def test_a_refused_publish_writes_no_tombstone(
    client: httpx.AsyncClient, amqp: AbstractRobustConnection, topology: Topology
) -> None:
    first = await client.post("/v1/queues/tiny/messages", json={"payload": 1, "message_id": "t1"})
    assert first.status_code == 201, first.text
    response = await client.put("/v1/queues/tiny/messages/t1", json={"payload": 2})
    assert response.status_code == 429, response.text  # the band is at its max-length
    assert response.json()["error"]["code"] == "queue_full"
    sentinel = await client.delete("/v1/queues/tiny/messages/sentinel")
    assert sentinel.status_code == 202, sentinel.text
    written = await entries_through(amqp, topology, "cancel", "sentinel")
    assert [entry[:3] for entry in written] == [("cancel", "tiny", "sentinel")]


async def test_a_tombstone_that_cannot_be_written_is_answered_503(
    client: httpx.AsyncClient, amqp: AbstractRobustConnection
) -> None:
    channel = await amqp.channel()
    await channel.queue_delete(naming.ledger_stream("bandgate"))
    await channel.close()
    response = await client.put("/v1/queues/orders/messages/order-3", json={"payload": 3})
    assert response.status_code == 503, response.text
    error = response.json()["error"]
    assert error["code"] == "tombstone_not_written"
    assert "order-3" in error["message"]
    assert "PUT is safe" in error["message"]
    # The new generation was published (a duplicate at worst, never a loss).
    (copy,) = await take_all(amqp, "orders.warm")
    generation = copy.headers[wire.GENERATION]
    assert isinstance(generation, int)
    assert str(generation) in error["message"]
    cancel = await client.delete("/v1/queues/orders/messages/order-3")
    assert cancel.status_code == 503, cancel.text
