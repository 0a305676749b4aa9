"""Dead-letter operations over HTTP, for tokens with the `admin` scope:
`GET /v1/queues/{queue}/dlq`, `POST /v1/queues/{queue}/dlq/replay`, `DELETE .../dlq`."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from aio_pika.abc import AbstractRobustConnection
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from gateway.auth import authorize
from gateway.broker import BrokerLink
from gateway.dead_letters import count_dead_letters, list_dead_letters, purge, replay
from gateway.dlq_access import DeadLetterBrokerError, DeadLetterQueueMissing
from gateway.errors import ApiError
from gateway.routes import json_body, json_response, queue_spec, topology_of
from gateway.schemas import validation_error

MAX_LIST = 10_000


class ReplayRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    limit: int | None = Field(default=None, ge=1, strict=True)
    reason: str | None = Field(default=None, max_length=200)
    rate: float | None = Field(default=None, gt=0, strict=True)


@asynccontextmanager
async def _broker(request: Request) -> AsyncIterator[AbstractRobustConnection]:
    """The gateway's connection, with dead-letter failures mapped to API errors."""
    link: BrokerLink = request.app.state.link
    if link.connection is None or not link.connected:
        raise ApiError(503, "broker_unavailable", link.problem or "not connected to the broker")
    try:
        yield link.connection
    except DeadLetterQueueMissing as exc:
        raise ApiError(503, "topology_missing", str(exc)) from None
    except DeadLetterBrokerError as exc:
        raise ApiError(503, "broker_unavailable", str(exc)) from None


def _limit(request: Request) -> int:
    raw = request.query_params.get("limit", "100")
    if not raw.isdigit() or not 1 <= int(raw) <= MAX_LIST:
        raise ApiError(422, "invalid_field", f"limit must be 1-{MAX_LIST}", "limit")
    return int(raw)


async def dlq_list(request: Request) -> Response:
    authorize(request, "admin")
    spec = queue_spec(request)
    limit = _limit(request)
    reason = request.query_params.get("reason") or None
    async with _broker(request) as connection:
        topology = topology_of(request)
        count = await count_dead_letters(connection, topology, spec.name)
        records = await list_dead_letters(
            connection, topology, spec.name, limit=limit, reason=reason
        )
    return json_response(
        {"queue": spec.name, "count": count, "messages": [r.to_json() for r in records]}
    )


async def dlq_replay(request: Request) -> Response:
    authorize(request, "admin")
    spec = queue_spec(request)
    body: Any = await json_body(request) if await request.body() else {}
    try:
        options = ReplayRequest.model_validate(body)
    except ValidationError as exc:
        raise validation_error(exc) from None
    link: BrokerLink = request.app.state.link
    async with _broker(request) as connection:
        result = await replay(
            connection,
            topology_of(request),
            spec.name,
            publisher=link.publisher,
            limit=options.limit,
            reason=options.reason,
            rate=options.rate,
        )
    return json_response(result.to_json())


async def dlq_purge(request: Request) -> Response:
    authorize(request, "admin")
    spec = queue_spec(request)
    async with _broker(request) as connection:
        purged = await purge(connection, topology_of(request), spec.name)
    return json_response({"queue": spec.name, "purged": purged})


def dlq_routes() -> list[BaseRoute]:
    return [
        Route("/v1/queues/{queue}/dlq", dlq_list, methods=["GET"]),
        Route("/v1/queues/{queue}/dlq", dlq_purge, methods=["DELETE"]),
        Route("/v1/queues/{queue}/dlq/replay", dlq_replay, methods=["POST"]),
    ]
