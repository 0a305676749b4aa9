"""Cancel, replace and escalate a pending message by its id, over the tombstone ledger.

A message inside a band cannot be changed or taken out without draining the band, so these
routes never touch the copies already enqueued: they publish a new generation and write a
tombstone (`core.ledger`), and consumers skip the copies the tombstone kills. The order is the
ledger's rule: a replacement is confirmed before its tombstone is written, so a failure in
between leaves a duplicate (and an answer that says so), never a lost message; the writes
themselves are `core.tombstoning`'s, which the Python producer shares.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from bandgate.core import error_codes, tombstoning
from bandgate.core.publishing import PublishFailure
from bandgate.gateway.auth import authorize
from bandgate.gateway.budgets import Window
from bandgate.gateway.errors import ApiError
from bandgate.gateway.routes import (
    ensure_connected,
    failure_error,
    json_body,
    json_response,
    link_of,
    published_body,
    queue_spec,
    topology_of,
)
from bandgate.gateway.schemas import parse_publish
from bandgate.topology.model import QueueSpec

CANCEL_NOTE = (
    "applies to every copy of this id published before the cancel that a consumer has not "
    "started; the ledger cannot tell an id never published or already handled from a "
    "pending one"
)
MESSAGE_REQUIRED = (
    "escalate publishes the message again at the hotter priority: bandgate cannot take a "
    "message out of the middle of its band without draining the band, so send its payload "
    "(and headers) again"
)


def _message_id(request: Request, spec: QueueSpec) -> str:
    """The path's message id, checked by the rule the publish body's `message_id` follows
    (asked through `parse_publish` itself, so the two can never disagree)."""
    message_id: str = request.path_params["message_id"]
    parse_publish({"payload": None, "message_id": message_id}, spec, topology_of(request))
    return message_id


def _charge_tombstone(request: Request) -> None:
    """One tombstone of the token's budget (`GatewaySettings.max_tombstones_per_token`), taken
    before anything is published: the ledger stream is trimmed by bytes, so tombstones
    written without a bound would push other tenants' out before their retention ends."""
    budget: Window = request.app.state.tombstone_budget
    budget.take(request.state.principal.name)


def _target(request: Request) -> tuple[QueueSpec, str]:
    """Authorized, a known queue and a valid id, in the order the publish route checks."""
    authorize(request, "publish", request.path_params["queue"])
    spec = queue_spec(request)
    return spec, _message_id(request, spec)


async def cancel(request: Request) -> Response:
    spec, message_id = _target(request)
    link = link_of(request)
    ensure_connected(link)
    _charge_tombstone(request)
    try:
        entry = await tombstoning.cancel(link.publisher, spec.name, message_id)
    except PublishFailure as failure:
        raise failure_error(failure) from None
    body = {
        "message_id": message_id,
        "queue": spec.name,
        "cancelled_before": entry.generation,
        "note": CANCEL_NOTE,
    }
    return json_response(body, 202)


async def replace(request: Request) -> Response:
    spec, message_id = _target(request)
    data = await json_body(request)
    return await _publish_generation(request, spec, message_id, data)


async def escalate(request: Request) -> Response:
    """A replace at a hotter priority: the client sends the message again."""
    spec, message_id = _target(request)
    data = await json_body(request)
    if isinstance(data, dict):
        if "payload" not in data:
            raise ApiError.of(error_codes.MESSAGE_REQUIRED, MESSAGE_REQUIRED, "payload")
        data = _hotter(data, spec)
    return await _publish_generation(request, spec, message_id, data)


def _hotter(data: dict[str, Any], spec: QueueSpec) -> dict[str, Any]:
    """The publish body for an escalate body: `band` becomes its band's highest priority."""
    body = dict(data)
    band_name = body.pop("band", None)
    priority = body.get("priority")
    if priority is None and band_name is None:
        raise ApiError.of(error_codes.MISSING_FIELD, "give priority or band", "priority")
    if priority is not None and band_name is not None:
        raise ApiError.of(error_codes.CONFLICTING_FIELDS, "give priority or band, not both", "band")
    if band_name is not None:
        names = ", ".join(band.name for band in spec.bands)
        if not isinstance(band_name, str):
            raise ApiError.of(error_codes.INVALID_FIELD, f"band must be one of {names}", "band")
        try:
            body["priority"] = spec.band(band_name).high
        except KeyError:
            raise ApiError.of(
                error_codes.INVALID_FIELD, f"queue {spec.name!r} has no band {band_name[:64]!r}; "
                f"its bands: {names}", "band",
            ) from None  # fmt: skip
    return body


async def _publish_generation(
    request: Request, spec: QueueSpec, message_id: str, data: Any
) -> Response:
    """Publish the body as a new generation of `message_id`, confirmed, then write the
    tombstone that kills the older copies (replace and escalate alike)."""
    if isinstance(data, dict) and data.get("message_id") not in (None, message_id):
        raise ApiError.of(
            error_codes.INVALID_FIELD,
            "message_id in the body differs from the path's",
            "message_id",
        )
    body = data if not isinstance(data, dict) else {**data, "message_id": message_id}
    envelope = parse_publish(body, spec, topology_of(request))
    link = link_of(request)
    ensure_connected(link)
    _charge_tombstone(request)
    try:
        result, generation = await tombstoning.publish_generation(link.publisher, envelope)
    except PublishFailure as failure:
        raise failure_error(failure) from None
    except tombstoning.TombstoneNotWritten as half:
        raise ApiError.of(
            error_codes.TOMBSTONE_NOT_WRITTEN, f"{half}. Repeating the {request.method} is safe"
        ) from None
    return json_response(published_body(result) | {"generation": generation}, 201)


def message_routes() -> list[BaseRoute]:
    # `:path`: an id may contain "/" (the server decodes %2F before routing).
    one = "/v1/queues/{queue}/messages/{message_id:path}"
    return [
        Route(one, cancel, methods=["DELETE"]),
        Route(one, replace, methods=["PUT"]),
        Route(f"{one}/escalate", escalate, methods=["POST"]),
    ]


__all__ = ["CANCEL_NOTE", "MESSAGE_REQUIRED", "cancel", "escalate", "message_routes", "replace"]
