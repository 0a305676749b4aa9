"""Dead-letter operations over HTTP, for tokens with the `admin` scope:
`GET /v1/queues/{queue}/dlq`, `POST /v1/queues/{queue}/dlq/replay`, `DELETE .../dlq`.

Every input is bounded (`core.dead_letters` gives the ranges) and refused with 422 before
anything touches the broker. List and replay run as a task that is cancelled when the client
disconnects (a replay can run for hours at a low rate); cancelled, it gives back what it holds,
in order. `finish_dead_letter_work` lets the lifespan wait for that before the connection goes.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Coroutine
from contextlib import asynccontextmanager
from typing import Any, TypeVar

from aio_pika.abc import AbstractRobustConnection
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.datastructures import State
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route
from starlette.types import Receive

from bandgate.core import error_codes
from bandgate.core.broker import BrokerLink
from bandgate.core.dead_letters import (
    MAX_LIST,
    MAX_RATE,
    MAX_REASON,
    MAX_REPLAY,
    MIN_RATE,
    purge,
    read_dead_letters,
    replay,
)
from bandgate.core.dlq_access import DeadLetterBrokerError, DeadLetterBusy, DeadLetterQueueMissing
from bandgate.gateway.auth import authorize
from bandgate.gateway.budgets import Seats
from bandgate.gateway.errors import ApiError, error_response
from bandgate.gateway.routes import json_body, json_response, queue_spec, topology_of
from bandgate.gateway.schemas import validation_error

DEFAULT_LIST = 100
LOCK_WAIT_SECONDS = 5.0  # an HTTP client waits this long for another operation, then 409
_DIGITS = re.compile(r"[0-9]{1,5}")  # int() of 5,000 digits raises: look before converting
_WORK = "dead_letter_work"

T = TypeVar("T")


class ReplayRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    limit: int | None = Field(default=None, ge=1, le=MAX_REPLAY, strict=True)
    reason: str | None = Field(default=None, max_length=MAX_REASON)
    rate: float | None = Field(default=None, ge=MIN_RATE, le=MAX_RATE, strict=True)


@asynccontextmanager
async def dead_letter_broker(request: Request) -> AsyncIterator[AbstractRobustConnection]:
    """The gateway's connection, with dead-letter failures mapped to API errors, in one of
    the token's seats (`GatewaySettings.max_dlq_operations_per_token`): an operation holds a
    channel, the queue's lock and, for a slow replay, a connection for hours, so one token
    may run only so many at once."""
    seats: Seats = request.app.state.dlq_seats
    with seats.taken(request.state.principal.name):
        async with _connection(request) as connection:
            yield connection


@asynccontextmanager
async def _connection(request: Request) -> AsyncIterator[AbstractRobustConnection]:
    link: BrokerLink = request.app.state.link
    if link.connection is None or not link.connected:
        raise ApiError.of(
            error_codes.BROKER_UNAVAILABLE, link.problem or "not connected to the broker"
        )
    try:
        yield link.connection
    except DeadLetterBusy as exc:
        raise ApiError.of(error_codes.DLQ_BUSY, str(exc)) from None
    except DeadLetterQueueMissing as exc:
        raise ApiError.of(error_codes.TOPOLOGY_MISSING, str(exc)) from None
    except DeadLetterBrokerError as exc:
        raise ApiError.of(error_codes.BROKER_UNAVAILABLE, str(exc)) from None


def _query(request: Request, allowed: tuple[str, ...]) -> dict[str, str]:
    """The query parameters, each known and given once."""
    params = request.query_params
    for name in params:
        if name not in allowed:
            raise ApiError.of(
                error_codes.UNKNOWN_FIELD, f"{name[:64]} is not a known field", name[:64]
            )
        if len(params.getlist(name)) > 1:
            raise ApiError.of(error_codes.INVALID_FIELD, f"{name}: give it once", name)
    return dict(params)


def _list_options(request: Request) -> tuple[int, str | None]:
    query = _query(request, ("limit", "reason"))
    raw = query.get("limit", str(DEFAULT_LIST))
    if not _DIGITS.fullmatch(raw) or not 1 <= int(raw) <= MAX_LIST:
        raise ApiError.of(
            error_codes.INVALID_FIELD, f"limit must be an integer 1-{MAX_LIST}", "limit"
        )
    reason = query.get("reason")
    if reason is not None and len(reason) > MAX_REASON:
        raise ApiError.of(
            error_codes.INVALID_FIELD, f"reason must be at most {MAX_REASON} characters", "reason"
        )
    return int(raw), reason or None


async def dlq_list(request: Request) -> Response:
    authorize(request, "admin")
    spec = queue_spec(request)
    limit, reason = _list_options(request)
    async with dead_letter_broker(request) as connection:
        listing = await _while_connected(
            request,
            read_dead_letters(
                connection,
                topology_of(request),
                spec.name,
                limit=limit,
                reason=reason,
                lock_wait=LOCK_WAIT_SECONDS,
            ),
        )
    if listing is None:
        return _gone()
    return json_response(
        {
            "queue": spec.name,
            "count": listing.total,
            "messages": [record.to_json() for record in listing.records],
        }
    )


async def dlq_replay(request: Request) -> Response:
    authorize(request, "admin")
    spec = queue_spec(request)
    _query(request, ())
    body: Any = await json_body(request) if await request.body() else {}
    try:
        options = ReplayRequest.model_validate(body)
    except ValidationError as exc:
        raise validation_error(exc) from None
    link: BrokerLink = request.app.state.link
    async with dead_letter_broker(request) as connection:
        result = await _while_connected(
            request,
            replay(
                connection,
                topology_of(request),
                spec.name,
                publisher=link.publisher,
                limit=options.limit,
                reason=options.reason,
                rate=options.rate,
                lock_wait=LOCK_WAIT_SECONDS,
            ),
        )
    if result is None:
        return _gone()
    return json_response(result.to_json())


async def dlq_purge(request: Request) -> Response:
    authorize(request, "admin")
    spec = queue_spec(request)
    _query(request, ())
    async with dead_letter_broker(request) as connection:
        purged = await purge(
            connection, topology_of(request), spec.name, lock_wait=LOCK_WAIT_SECONDS
        )
    return json_response({"queue": spec.name, "purged": purged})


async def _while_connected(request: Request, work: Coroutine[Any, Any, T]) -> T | None:
    """Run `work` as a task until it ends or the client disconnects (then it is cancelled:
    None). Either way, and when this request itself is cancelled (shutdown), the task has
    finished cleaning up when this returns."""
    task = asyncio.ensure_future(work)
    running: set[asyncio.Task[Any]] = _work_of(request.app.state)
    running.add(task)
    task.add_done_callback(running.discard)
    watcher = asyncio.ensure_future(_disconnected(request.receive))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            await asyncio.wait({task})
    if task.cancelled():
        return None
    return task.result()


async def _disconnected(receive: Receive) -> None:
    """Returns when the ASGI server says the client is gone (the body was read before)."""
    while (await receive())["type"] != "http.disconnect":
        pass


def _gone() -> Response:
    # Nobody reads it; the access log shows nginx's "client closed request".
    return error_response(
        ApiError.of(
            error_codes.CLIENT_DISCONNECTED, "the client disconnected; the operation stopped"
        )
    )


def _work_of(state: State) -> set[asyncio.Task[Any]]:
    running: set[asyncio.Task[Any]] | None = getattr(state, _WORK, None)
    if running is None:
        running = set()
        setattr(state, _WORK, running)
    return running


async def finish_dead_letter_work(state: State, grace: float = 10.0) -> None:
    """Cancel the dead-letter operations still running and wait up to `grace` s while they
    give back the messages they hold; for the lifespan's shutdown, before the broker
    connection closes (or the broker returns them, in an order of its own)."""
    running = list(_work_of(state))
    for task in running:
        task.cancel()
    if running:
        await asyncio.wait(running, timeout=grace)


async def dlq(request: Request) -> Response:
    """GET lists, DELETE purges: one route, so a 405 on the path names both methods."""
    if request.method == "DELETE":
        return await dlq_purge(request)
    return await dlq_list(request)


def dlq_routes() -> list[BaseRoute]:
    return [
        Route("/v1/queues/{queue}/dlq", dlq, methods=["GET", "DELETE"]),
        Route("/v1/queues/{queue}/dlq/replay", dlq_replay, methods=["POST"]),
    ]


__all__ = ["MAX_LIST", "ReplayRequest", "dlq_routes", "finish_dead_letter_work"]
