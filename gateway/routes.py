"""HTTP endpoints (v1). Handlers validate, hand envelopes to the publisher and translate
the outcome; a 201 is sent only after the broker confirmed the message."""

from __future__ import annotations

import copy
from typing import Any

import orjson
from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from bandgate.core import error_codes
from bandgate.core.broker import BrokerLink
from bandgate.core.publish_outcomes import BrokerBlocked
from bandgate.core.publishing import (
    BrokerRejected,
    InvalidMessage,
    Published,
    PublishFailure,
)
from bandgate.core.queue_stats import QueueStats, StatsError, collect_queue_stats, describe_queue
from bandgate.core.telemetry import PROMETHEUS_CONTENT_TYPE, Telemetry
from bandgate.gateway.auth import Principal, authorize, charge
from bandgate.gateway.errors import ApiError, count_rejected
from bandgate.gateway.json_input import MalformedJson, parse_json
from bandgate.gateway.openapi import ApiLimits, openapi_document
from bandgate.gateway.schemas import BatchRequest, parse_publish, validation_error
from bandgate.gateway.settings import GatewaySettings
from bandgate.topology import wire
from bandgate.topology.model import QueueSpec, Topology, UnknownQueueError
from bandgate.topology.wire import Envelope


def json_response(data: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(data), status_code=status, media_type="application/json")


def link_of(request: Request) -> BrokerLink:
    link: BrokerLink = request.app.state.link
    return link


def topology_of(request: Request) -> Topology:
    topology: Topology = request.app.state.topology
    return topology


def _settings(request: Request) -> GatewaySettings:
    settings: GatewaySettings = request.app.state.settings
    return settings


def queue_spec(request: Request) -> QueueSpec:
    try:
        return topology_of(request).queue(request.path_params["queue"])
    except UnknownQueueError as exc:
        raise ApiError.of(error_codes.UNKNOWN_QUEUE, str(exc), "queue") from None


async def json_body(request: Request) -> Any:
    content_type = request.headers.get("content-type", "")
    media_type = content_type.split(";", 1)[0].strip().lower()
    if media_type != "application/json":
        raise ApiError.of(
            error_codes.UNSUPPORTED_MEDIA_TYPE,
            f"send Content-Type: application/json (got {content_type or 'none'!r})",
        )
    try:
        return parse_json(await request.body())
    except MalformedJson as exc:
        raise ApiError.of(error_codes.MALFORMED_JSON, str(exc)) from None


def published_body(result: Published) -> dict[str, Any]:
    return {
        "message_id": result.message_id,
        "queue": result.queue,
        "priority": result.priority,
        "band": result.band,
        "enqueued_at": wire.moment_text(result.enqueued_at),
        "deliver_at": wire.moment_text(result.deliver_at) if result.deliver_at else None,
    }


def failure_error(failure: PublishFailure, prefix: str = "") -> ApiError:
    """A publish the broker did not confirm. A message AMQP cannot carry is the client's to
    fix (413 or 422, naming the field); a nack means a band at its max-length
    (reject-publish): the client should slow down, so 429; anything else is 503, its code
    saying whether the message may be enqueued (README, "When a publish fails")."""
    if isinstance(failure, InvalidMessage):
        field = f"{prefix}.{failure.field}" if prefix and failure.field else failure.field
        return ApiError.of(failure.error, str(failure), field or prefix or None)
    if isinstance(failure, BrokerRejected):
        return ApiError.of(failure.error, str(failure), headers={"Retry-After": "1"})
    return ApiError.of(failure.error, str(failure))


def ensure_connected(link: BrokerLink) -> None:
    if not link.connected:
        raise ApiError.of(
            error_codes.BROKER_UNAVAILABLE, link.problem or "not connected to the broker"
        )
    if link.blocked:
        raise ApiError.of(BrokerBlocked.error, str(BrokerBlocked()), headers={"Retry-After": "5"})


async def publish(request: Request) -> Response:
    authorize(request, "publish", request.path_params["queue"])
    spec = queue_spec(request)
    data = await json_body(request)
    envelope = parse_publish(data, spec, topology_of(request))
    link = link_of(request)
    ensure_connected(link)
    try:
        result = await link.publisher.publish(envelope)
    except PublishFailure as failure:
        raise failure_error(failure) from None
    return json_response(published_body(result), 201)


async def publish_batch(request: Request) -> Response:
    authorize(request, "publish", request.path_params["queue"])
    spec = queue_spec(request)
    data = await json_body(request)
    if not isinstance(data, dict):
        raise ApiError.of(error_codes.INVALID_BODY, 'the body must be {"messages": [...]}')
    try:
        batch = BatchRequest.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc) from None
    limit = _settings(request).max_batch_messages
    if not batch.messages:
        raise ApiError.of(
            error_codes.INVALID_FIELD, "messages must hold at least one message", "messages"
        )
    if len(batch.messages) > limit:
        raise ApiError.of(
            error_codes.BATCH_TOO_LARGE, f"a batch holds at most {limit} messages", "messages"
        )
    charge(request, len(batch.messages) - 1)  # the request itself paid for one
    topology = topology_of(request)
    failed: list[dict[str, Any]] = []
    envelopes: list[tuple[int, Envelope]] = []
    for index, item in enumerate(batch.messages):
        try:
            envelopes.append((index, parse_publish(item, spec, topology, f"messages.{index}")))
        except ApiError as error:
            failed.append({"index": index, "error": error.body()})
    link = link_of(request)
    if envelopes:
        ensure_connected(link)
    results = await link.publisher.publish_many([envelope for _, envelope in envelopes])
    successful: list[dict[str, Any]] = []
    for (index, _), result in zip(envelopes, results, strict=True):
        if isinstance(result, Published):
            successful.append({"index": index, **published_body(result)})
        else:
            failed.append(
                {"index": index, "error": failure_error(result, f"messages.{index}").body()}
            )
    for item in failed:
        count_rejected(request, item["error"]["code"])
    failed.sort(key=lambda item: item["index"])
    return json_response({"successful": successful, "failed": failed})


async def list_queues(request: Request) -> Response:
    principal: Principal = request.state.principal
    visible = [
        describe_queue(spec)
        for spec in topology_of(request).queues.values()
        if principal.may("read", spec.name) or principal.may("publish", spec.name)
    ]
    return json_response({"queues": visible})


async def queue_stats(link: BrokerLink, topology: Topology, spec: QueueSpec) -> QueueStats:
    """`collect_queue_stats` over the gateway's broker link, failures as API errors (503)."""
    if link.connection is None or not link.connected:
        raise ApiError.of(
            error_codes.BROKER_UNAVAILABLE, link.problem or "not connected to the broker"
        )
    try:
        return await collect_queue_stats(link.connection, topology, spec, link.management)
    except StatsError as exc:
        raise ApiError.of(error_codes.lookup(exc.code), str(exc)) from None


async def stats(request: Request) -> Response:
    authorize(request, "read", request.path_params["queue"])
    spec = queue_spec(request)
    return json_response(await queue_stats(link_of(request), topology_of(request), spec))


async def healthz(request: Request) -> Response:
    return json_response({"status": "ok"})


async def readyz(request: Request) -> Response:
    link = link_of(request)
    problem = await link.check_ready()
    if problem is not None:
        raise ApiError.of(error_codes.NOT_READY, problem)
    body: dict[str, Any] = {"status": "ready", "broker_version": link.version}
    for extension in request.app.state.extensions:
        body.update(extension.readiness())
    return json_response(body)


async def metrics(request: Request) -> Response:
    telemetry: Telemetry = request.app.state.telemetry
    return Response(telemetry.prometheus_text(), media_type=PROMETHEUS_CONTENT_TYPE)


async def openapi(request: Request) -> Response:
    document = openapi_document(ApiLimits.of(_settings(request), topology_of(request)))
    extensions = getattr(request.app.state, "extensions", ())
    if extensions:
        document = copy.deepcopy(document)  # built once per set of limits, and shared
        for extension in extensions:
            extension.document(document)
    return json_response(document)


def routes() -> list[BaseRoute]:
    return [
        Route("/v1/queues/{queue}/messages", publish, methods=["POST"]),
        Route("/v1/queues/{queue}/messages/batch", publish_batch, methods=["POST"]),
        Route("/v1/queues", list_queues, methods=["GET"]),
        Route("/v1/queues/{queue}/stats", stats, methods=["GET"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/openapi.json", openapi, methods=["GET"], include_in_schema=False),
    ]
