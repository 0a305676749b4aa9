"""The operator's console: `GET /console`, one page of plain HTML, CSS and JS shipped in the
package (no build step, nothing from a CDN), and the JSON it reads.

The page holds no data and needs no token; everything it shows comes from `/v1/` endpoints,
with the bearer token the operator pastes (kept in the tab's sessionStorage). `GET
/v1/console/overview` needs `read:<queue>` for each queue it lists (403 when none); dead
letters are listed, replayed and purged by the `admin`-only endpoints of `gateway.dlq_routes`,
and `POST /v1/console/queues/{queue}/dlq/replay` replays selected ones through the same
`core.dead_letters.replay`, streaming its progress as JSON lines. Cancel, replace and escalate
by id are the API's own routes (`gateway.message_routes`), with the same token and scope
(`publish:<queue>`); the overview only says which queues the token may act on.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from functools import cache
from importlib import resources
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import BaseRoute, Route

from bandgate.core import error_codes
from bandgate.core.broker import BrokerLink
from bandgate.core.dead_letters import MAX_REASON, MAX_REPLAY, ReplayProgress, ReplayResult, replay
from bandgate.core.dlq_access import DeadLetterError
from bandgate.gateway.auth import Principal, authorize
from bandgate.gateway.console_sampler import sampler_of
from bandgate.gateway.dlq_routes import LOCK_WAIT_SECONDS, dead_letter_broker
from bandgate.gateway.errors import ApiError
from bandgate.gateway.routes import json_body, json_response, queue_spec, topology_of
from bandgate.gateway.schemas import validation_error

ASSETS = {
    "console.js": "text/javascript; charset=utf-8",
    "console.css": "text/css; charset=utf-8",
}
# The page runs only its own files: a script injected into it could not load or send anywhere.
SECURITY_HEADERS = {
    "content-security-policy": "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'",
    "x-content-type-options": "nosniff",
    "cache-control": "no-cache",
}


@cache
def _asset(name: str) -> bytes:
    return resources.files("bandgate.gateway").joinpath("console_assets", name).read_bytes()


async def page(request: Request) -> Response:
    return Response(
        _asset("console.html"), media_type="text/html; charset=utf-8", headers=SECURITY_HEADERS
    )


async def asset(request: Request) -> Response:
    name = request.path_params["name"]
    if name not in ASSETS:
        raise ApiError.of(error_codes.NOT_FOUND, f"no console file {name[:64]!r}")
    return Response(_asset(name), media_type=ASSETS[name], headers=SECURITY_HEADERS)


async def overview(request: Request) -> Response:
    """Every queue the token may read: its bands' latest counts, rates and waits, and the
    waits over the window for the chart."""
    principal: Principal = request.state.principal
    topology = topology_of(request)
    readable = [name for name in topology.queues if principal.may("read", name)]
    if not readable:
        raise ApiError.of(error_codes.FORBIDDEN, f"token {principal.name!r} may read no queue")
    link: BrokerLink = request.app.state.link
    sampler = sampler_of(request.app.state)
    await sampler.refresh(link)
    now = sampler.histories[readable[0]].sampled_at
    return json_response(
        {
            "token": principal.name,
            "admin": "admin" in principal.scopes,
            "management": link.management is not None,
            "interval_seconds": sampler.interval,
            "window_seconds": sampler.histories[readable[0]].window,
            # The delay ladder is shared by every queue: its count is the deployment's.
            "delayed": sampler.delayed,
            "delayed_scope": "deployment",
            "queues": [
                {
                    "queue": name,
                    "may_publish": principal.may("publish", name),
                    "problem": sampler.problems.get(name),
                    **sampler.histories[name].to_json(now or 0.0),
                }
                for name in readable
            ],
        }
    )


class ConsoleReplay(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: str | None = Field(default=None, max_length=MAX_REASON)
    message_ids: list[str] | None = Field(default=None, min_length=1, max_length=MAX_REPLAY)


async def replay_with_progress(request: Request) -> Response:
    """Replay the dead letters of a reason, or the ones selected by id; the body is a line
    of JSON per progress step (`{"progress": ...}`), then `{"result": ...}` or `{"error": ...}`.
    Refusals before the first message (403, 409 busy, 422, 503) are ordinary errors."""
    authorize(request, "admin")
    spec = queue_spec(request)
    body: Any = await json_body(request) if await request.body() else {}
    try:
        options = ConsoleReplay.model_validate(body)
    except ValidationError as exc:
        raise validation_error(exc) from None
    link: BrokerLink = request.app.state.link
    progress = _Progress()
    async with dead_letter_broker(request) as connection:
        task = asyncio.ensure_future(
            replay(
                connection,
                topology_of(request),
                spec.name,
                publisher=link.publisher,
                reason=options.reason,
                message_ids=options.message_ids,
                limit=len(set(options.message_ids)) if options.message_ids else None,
                progress=progress,
                lock_wait=LOCK_WAIT_SECONDS,
            )
        )
        try:
            first = await progress.next(task)
        except BaseException:
            await _stop(task)
            raise
        if task.done():
            task.result()  # a refusal: raised here, inside the error mapping
    return StreamingResponse(_lines(progress, first, task), media_type="application/x-ndjson")


class _Progress:
    """The latest step a replay reported; a reader that falls behind skips to it."""

    def __init__(self) -> None:
        self.latest: ReplayProgress | None = None
        self.changed = asyncio.Event()

    def __call__(self, step: ReplayProgress) -> None:
        self.latest = step
        self.changed.set()

    async def next(self, task: asyncio.Future[Any]) -> ReplayProgress | None:
        """Wait until the replay reports a step or ends; the latest step not yet taken."""
        waiter = asyncio.ensure_future(self.changed.wait())
        try:
            await asyncio.wait({waiter, task}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
        if not self.changed.is_set():
            return None
        self.changed.clear()
        return self.latest


async def _lines(
    progress: _Progress, first: ReplayProgress | None, task: asyncio.Future[ReplayResult]
) -> AsyncIterator[bytes]:
    """The replay's progress, at most one line per step the client can take in, then how it
    ended. A client that goes away stops the replay (it gives back what it holds)."""
    try:
        step = first
        while True:
            if step is not None:
                yield _line({"progress": dataclasses.asdict(step)})
            if task.done():
                break
            step = await progress.next(task)
        try:
            yield _line({"result": task.result().to_json()})
        except DeadLetterError as exc:
            yield _line({"error": {"code": "dlq_failed", "message": str(exc)}})
    finally:
        await _stop(task)


async def _stop(task: asyncio.Future[Any]) -> None:
    if not task.done():
        task.cancel()
        await asyncio.wait({task})


def _line(data: Any) -> bytes:
    return orjson.dumps(data) + b"\n"


# The page's own routes, left out of the API document (`gateway.openapi`): the page and the
# JSON it reads change together, and are not part of the API's promises.
CONSOLE_PATHS = frozenset(
    {
        "/console",
        "/console/{name}",
        "/v1/console/overview",
        "/v1/console/queues/{queue}/dlq/replay",
    }
)


def console_routes() -> list[BaseRoute]:
    return [
        Route("/console", page, methods=["GET"], include_in_schema=False),
        Route("/console/{name}", asset, methods=["GET"], include_in_schema=False),
        Route("/v1/console/overview", overview, methods=["GET"], include_in_schema=False),
        Route(
            "/v1/console/queues/{queue}/dlq/replay",
            replay_with_progress,
            methods=["POST"],
            include_in_schema=False,
        ),
    ]


__all__ = ["CONSOLE_PATHS", "ConsoleReplay", "console_routes"]
