"""Every bad input gets its documented status and code, in the JSON error shape, and leaves
every queue empty."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from aio_pika.abc import AbstractRobustConnection

from bandgate.topology.model import Topology
from tests.integration.conftest import queue_depths

# The HTTP edge (or a CLI over it): the broker matrix leaves it to `make test`.
pytestmark = [pytest.mark.integration, pytest.mark.broker_independent]

JSON = {"content-type": "application/json"}
ONE = "/v1/queues/orders/messages"
BATCH = "/v1/queues/orders/messages/batch"

# fmt: off
CASES: list[tuple[str, str, str, dict[str, str], bytes, int, str]] = [
    # id, method, path, headers, body, status, code
    ("malformed json", "POST", ONE, JSON, b'{"payload": ', 400, "malformed_json"),
    ("invalid utf-8", "POST", ONE, JSON, b'{"payload": "\xff\xfe"}', 400, "malformed_json"),
    ("too deep", "POST", ONE, JSON, b'{"payload": ' + b"[" * 2000 + b"]" * 2000 + b"}", 400,
     "malformed_json"),
    ("huge number", "POST", ONE, JSON, b'{"payload": 1' + b"0" * 400 + b"}", 400,
     "malformed_json"),
    ("wrong content type", "POST", ONE, {"content-type": "text/plain"}, b'{"payload": 1}', 415,
     "unsupported_media_type"),
    ("no content type", "POST", ONE, {}, b'{"payload": 1}', 415, "unsupported_media_type"),
    ("priority 10", "POST", ONE, JSON, b'{"payload": 1, "priority": 10}', 422,
     "invalid_priority"),
    ("priority -1", "POST", ONE, JSON, b'{"payload": 1, "priority": -1}', 422,
     "invalid_priority"),
    ("priority urgent", "POST", ONE, JSON, b'{"payload": 1, "priority": "urgent"}', 422,
     "invalid_priority"),
    ("priority float", "POST", ONE, JSON, b'{"payload": 1, "priority": 7.5}', 422,
     "invalid_priority"),
    ("priority bool", "POST", ONE, JSON, b'{"payload": 1, "priority": true}', 422,
     "invalid_priority"),
    ("missing payload", "POST", ONE, JSON, b'{"priority": 1}', 422, "missing_field"),
    ("body not an object", "POST", ONE, JSON, b"[1, 2]", 422, "invalid_body"),
    ("unknown field", "POST", ONE, JSON, b'{"payload": 1, "prio": 1}', 422, "unknown_field"),
    ("unknown queue", "POST", "/v1/queues/nope/messages", JSON, b'{"payload": 1}', 404,
     "unknown_queue"),
    ("oversized body", "POST", ONE, JSON, b'{"payload": "' + b"x" * 70_000 + b'"}', 413,
     "body_too_large"),
    ("negative delay", "POST", ONE, JSON, b'{"payload": 1, "delay_seconds": -1}', 422,
     "invalid_field"),
    ("delay and deliver_at", "POST", ONE, JSON,
     b'{"payload": 1, "delay_seconds": 1, "deliver_at": "2030-01-01T00:00:00Z"}', 422,
     "conflicting_fields"),
    ("deliver_at without offset", "POST", ONE, JSON,
     b'{"payload": 1, "deliver_at": "2030-01-01T00:00:00"}', 422, "invalid_field"),
    ("deliver_at not a time", "POST", ONE, JSON, b'{"payload": 1, "deliver_at": "soon"}', 422,
     "invalid_field"),
    ("delay beyond the ladder", "POST", ONE, JSON, b'{"payload": 1, "delay_seconds": 1e9}', 422,
     "invalid_field"),
    ("reserved header", "POST", ONE, JSON, b'{"payload": 1, "headers": {"x-death": "a"}}', 422,
     "invalid_field"),
    ("header with newline", "POST", ONE, JSON, b'{"payload": 1, "headers": {"a\\nb": "c"}}',
     422, "invalid_field"),
    ("nested header value", "POST", ONE, JSON, b'{"payload": 1, "headers": {"a": {"b": 1}}}',
     422, "invalid_field"),
    ("huge partition key", "POST", ONE, JSON,
     b'{"payload": 1, "partition_key": "' + b"k" * 10_000 + b'"}', 422, "invalid_field"),
    ("empty message id", "POST", ONE, JSON, b'{"payload": 1, "message_id": ""}', 422,
     "invalid_field"),
    ("empty batch", "POST", BATCH, JSON, b'{"messages": []}', 422, "invalid_field"),
    ("batch over the limit", "POST", BATCH, JSON,
     b'{"messages": [' + b",".join([b'{"payload": 1}'] * 21) + b"]}", 413, "batch_too_large"),
    ("batch not a list", "POST", BATCH, JSON, b'{"messages": 3}', 422, "invalid_field"),
    ("batch missing messages", "POST", BATCH, JSON, b"{}", 422, "missing_field"),
    ("unknown route", "GET", "/v2/nothing", {}, b"", 404, "not_found"),
    ("wrong method", "GET", ONE, {}, b"", 405, "method_not_allowed"),
    ("stats of unknown queue", "GET", "/v1/queues/nope/stats", {}, b"", 404, "unknown_queue"),
]
# fmt: on


@pytest.mark.parametrize(
    ("method", "path", "headers", "body", "status", "code"),
    [pytest.param(*case[1:], id=case[0]) for case in CASES],
)
async def test_bad_input_is_refused_and_nothing_enqueued(
    client: httpx.AsyncClient,
    amqp: AbstractRobustConnection,
    topology: Topology,
    method: str,
    path: str,
    headers: dict[str, str],
    body: bytes,
    status: int,
    code: str,
) -> None:
    response = await client.request(method, path, headers=headers, content=body)
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    error: dict[str, Any] = response.json()["error"]
    assert error["code"] == code
    assert error["message"]
    assert set(error) == {"code", "message", "field"}
    depths = await queue_depths(amqp, topology)
    assert sum(depths.values()) == 0, depths
