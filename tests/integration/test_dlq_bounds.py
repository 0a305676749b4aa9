"""Every input of the dead-letter operations is bounded: out of range, the HTTP API answers
422 in its error shape and the CLI a usage error, before the broker is touched."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from aio_pika.abc import AbstractRobustConnection
from typer.testing import CliRunner

from bandgate.core.dead_letters import MIN_RATE
from bandgate.ops.ops_cli import app as cli
from bandgate.topology import naming
from bandgate.topology.model import Topology
from tests.integration.conftest import queue_depths
from tests.integration.test_dead_letters import write_topology
from tests.integration.test_dlq_hardening import make_dead_letters

pytestmark = pytest.mark.integration

DLQ = naming.dead_letter_queue("orders")


@pytest.mark.parametrize(
    ("query", "field", "code"),
    [
        ("limit=" + "9" * 5000, "limit", "invalid_field"),
        ("limit=0", "limit", "invalid_field"),
        ("limit=10001", "limit", "invalid_field"),
        ("limit=-1", "limit", "invalid_field"),
        ("limit=1.5", "limit", "invalid_field"),
        ("limit=%C2%B2", "limit", "invalid_field"),  # "²": isdigit() says yes, int() says no
        ("limit=", "limit", "invalid_field"),
        ("limit=1&limit=2", "limit", "invalid_field"),
        ("reason=" + "x" * 201, "reason", "invalid_field"),
        ("what=1", "what", "unknown_field"),
    ],
)
async def test_hostile_listing_queries_get_422(
    client: httpx.AsyncClient,
    amqp: AbstractRobustConnection,
    topology: Topology,
    query: str,
    field: str,
    code: str,
) -> None:
    await make_dead_letters(amqp, topology, 3)
    response = await client.get(f"/v1/queues/orders/dlq?{query}")
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert (error["code"], error["field"]) == (code, field)
    assert (await queue_depths(amqp, topology))[DLQ] == 3


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"rate": 1e-6}, "rate"),
        ({"rate": 0.09}, "rate"),
        ({"rate": 10_001}, "rate"),
        ({"rate": "1"}, "rate"),
        ({"limit": 0}, "limit"),
        ({"limit": 10_001}, "limit"),
        ({"limit": True}, "limit"),
        ({"reason": "x" * 201}, "reason"),
    ],
)
async def test_out_of_range_replays_get_422_and_move_nothing(
    client: httpx.AsyncClient,
    amqp: AbstractRobustConnection,
    topology: Topology,
    body: dict[str, Any],
    field: str,
) -> None:
    await make_dead_letters(amqp, topology, 3)
    response = await client.post("/v1/queues/orders/dlq/replay", json=body)
    assert response.status_code == 422, response.text
    assert response.json()["error"]["code"] == "invalid_field"
    assert response.json()["error"]["field"] == field
    depths = await queue_depths(amqp, topology)
    assert (depths[DLQ], depths["orders.hot"], depths["orders.warm"]) == (3, 0, 0)


async def test_query_parameters_on_replay_and_purge_are_refused(
    client: httpx.AsyncClient, amqp: AbstractRobustConnection, topology: Topology
) -> None:
    await make_dead_letters(amqp, topology, 3)
    purge_all = await client.delete("/v1/queues/orders/dlq?queue=other")
    assert purge_all.status_code == 422
    assert purge_all.json()["error"]["code"] == "unknown_field"
    replayed = await client.post("/v1/queues/orders/dlq/replay?limit=1")
    assert replayed.json()["error"]["field"] == "limit"
    assert (await queue_depths(amqp, topology))[DLQ] == 3


async def test_the_bounds_themselves_are_accepted(
    client: httpx.AsyncClient, amqp: AbstractRobustConnection, topology: Topology
) -> None:
    ids = await make_dead_letters(amqp, topology, 3)
    listed = await client.get(
        "/v1/queues/orders/dlq", params={"limit": 10_000, "reason": "x" * 200}
    )
    assert (listed.status_code, listed.json()["count"], listed.json()["messages"]) == (200, 3, [])
    for rate in (MIN_RATE, 10_000):
        replayed = await client.post(
            "/v1/queues/orders/dlq/replay", json={"rate": rate, "limit": 1}
        )
        assert replayed.json()["replayed"] == 1
    listed = await client.get("/v1/queues/orders/dlq")
    assert [m["message_id"] for m in listed.json()["messages"]] == ids[2:]


def test_the_cli_refuses_out_of_range_options(tmp_path: Path, topology: Topology) -> None:
    common = ["--topology", str(write_topology(topology, tmp_path)), "--amqp-url", "amqp://x/"]
    runner = CliRunner(env={"COLUMNS": "200", "NO_COLOR": "1"})
    for args in (
        ["list", "orders", "--limit", "10001"],
        ["list", "orders", "--reason", "x" * 201],
        ["replay", "orders", "--rate", "0.01"],
        ["replay", "orders", "--limit", "0"],
        ["purge", "orders", "--yes", "--wait", "-1"],
    ):
        result = runner.invoke(cli, ["dlq", *args, *common])
        assert result.exit_code == 2, (args, result.output)  # usage error, before connecting
