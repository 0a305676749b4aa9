"""The OpenAPI document, built from the same pydantic models that validate requests.

Every operation the app serves, the bearer security of /v1/, and every error each operation can
answer, in the one error shape. The schemas (`gateway._openapi_schemas`) add to the models'
JSON Schema what the handlers check on top, so that a request the document calls valid is one
the gateway accepts; what JSON Schema cannot say (UTF-8 byte lengths, nesting depth, how far
ahead `deliver_at` may be, the AMQP frame size) is said in descriptions. The document depends
on the deployment's limits (`ApiLimits`) and is built once per set of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any

from bandgate.core import error_codes as codes
from bandgate.core.dead_letters import MAX_LIST, MAX_REASON
from bandgate.core.error_codes import ErrorCode, Kind
from bandgate.gateway._openapi_schemas import (
    PRINTABLE,
    both_given,
    component_schemas,
    forbid,
    ref,
    without_defaults,
)
from bandgate.gateway.settings import GatewaySettings
from bandgate.topology import naming
from bandgate.topology.publish_input import MAX_ID_BYTES, MAX_ID_LENGTH

if TYPE_CHECKING:
    from bandgate.topology.model import Topology

JSON = "application/json"


@dataclass(frozen=True)
class ApiLimits:
    """What the document states that depends on the deployment's settings and topology."""

    max_batch_messages: int = GatewaySettings.model_fields["max_batch_messages"].default
    max_body_bytes: int = GatewaySettings.model_fields["max_body_bytes"].default
    max_delay_seconds: float | None = None  # the topology's delay ladder; unknown without one

    @classmethod
    def of(cls, settings: GatewaySettings, topology: Topology) -> ApiLimits:
        return cls(
            max_batch_messages=settings.max_batch_messages,
            max_body_bytes=settings.max_body_bytes,
            max_delay_seconds=topology.ladder.max_delay_ms / 1000,
        )


DEFAULT_LIMITS = ApiLimits()

# Each status with the error codes the gateway's operations answer it with (every error body is
# an `ErrorResponse`); each response's description and `x-error-codes` come from the registry.
ERRORS: dict[int, tuple[ErrorCode, ...]] = {
    400: (codes.MALFORMED_JSON, codes.MALFORMED_PATH),
    401: (codes.UNAUTHORIZED, codes.INVALID_TOKEN),
    403: (codes.FORBIDDEN, codes.CROSS_SITE_REQUEST, codes.HOST_NOT_ALLOWED),
    404: (codes.UNKNOWN_QUEUE,),
    408: (codes.REQUEST_TIMEOUT,),
    409: (codes.DLQ_BUSY,),
    413: (codes.BODY_TOO_LARGE, codes.BATCH_TOO_LARGE, codes.MESSAGE_TOO_LARGE),
    415: (codes.UNSUPPORTED_MEDIA_TYPE,),
    422: (
        codes.INVALID_FIELD,
        codes.MISSING_FIELD,
        codes.UNKNOWN_FIELD,
        codes.INVALID_PRIORITY,
        codes.INVALID_BODY,
        codes.CONFLICTING_FIELDS,
    ),
    429: (codes.RATE_LIMITED, codes.TOO_MANY_AUTH_FAILURES, codes.QUEUE_FULL),
    431: (codes.HEADERS_TOO_LARGE,),
    500: (codes.INTERNAL_ERROR,),
    503: (
        codes.BROKER_UNAVAILABLE,
        codes.BROKER_BLOCKED,
        codes.UNROUTABLE,
        codes.NOT_READY,
        codes.SERVER_BUSY,
        codes.CONFIRM_TIMEOUT,
        codes.CONFIRM_LOST,
        codes.TOPOLOGY_MISSING,
    ),
}
# What a status's description adds to its codes' meanings.
_ERROR_NOTES: dict[int, str] = {
    413: " The body limit: {max_body_bytes} bytes.",
    422: " `field` names the field.",
    429: " See Retry-After.",
}


def describe_errors(errors: tuple[ErrorCode, ...], note: str = "") -> dict[str, Any]:
    """An error response's description and `x-error-codes`, from the registry: a line per code
    with its meaning, and whether the message may be enqueued where the status does not say,
    then `note`."""
    lines = [
        f"- `{error.code}`"
        + ("" if error.kind is Kind.CLIENT_ERROR else f" ({error.kind})")
        + f": {error.meaning}"
        for error in errors
    ]
    if note:
        lines += ["", note.strip()]
    return {"description": "\n".join(lines), "x-error-codes": [error.code for error in errors]}


_RETRY_AFTER = {"Retry-After": {"description": "seconds to wait", "schema": {"type": "integer"}}}
_ERROR_HEADERS: dict[int, dict[str, Any]] = {
    401: {"WWW-Authenticate": {"schema": {"type": "string"}}},
    429: _RETRY_AFTER,
    500: {"X-Request-Id": {"schema": {"type": "string"}}},
    503: _RETRY_AFTER,
}
# Any operation can fail these ways; /v1/ operations by authentication and rate too, and those
# with a body by its form.
_ANY = (408, 431, 500)
_V1 = (401, 429)
_BODY = (400, 413, 415, 422)
_QUEUE = {
    "name": "queue",
    "in": "path",
    "required": True,
    "description": "a logical queue of the topology, e.g. orders",
    "schema": {"type": "string", "pattern": naming.NAME_PATTERN.pattern},
}
_MESSAGE_ID = {
    "name": "message_id",
    "in": "path",
    "required": True,
    "description": f"the id the message was published with: printable, at most {MAX_ID_LENGTH} "
    f"characters and {MAX_ID_BYTES} bytes in UTF-8, without '/' (a path cannot carry it)",
    "schema": {
        "type": "string",
        "minLength": 1,
        "maxLength": MAX_ID_LENGTH,
        "pattern": PRINTABLE.replace("]", "/]", 1),  # printable, and no '/'
    },
}
_GENERATION = (
    "Publishes the body as a new generation of the id (the path's id is used; a `message_id` "
    "in the body must equal it), confirmed, then writes a tombstone to the ledger that makes "
    "consumers skip every older copy they have not started. The copies already enqueued stay "
    "in their bands until a consumer reaches and skips them."
)
_DLQ_QUERY = [
    {
        "name": "limit",
        "in": "query",
        "description": "show at most this many dead letters",
        "schema": {"type": "integer", "minimum": 1, "maximum": MAX_LIST},
    },
    {
        "name": "reason",
        "in": "query",
        "description": "only dead letters whose reason contains this text",
        "schema": {"type": "string", "maxLength": MAX_REASON},
    },
]


def openapi_document(limits: ApiLimits = DEFAULT_LIMITS) -> dict[str, Any]:
    """The document for a deployment's limits, built on the first call for them and shared
    afterwards (so never to be changed by a caller)."""
    return _document(limits)


@cache
def _document(limits: ApiLimits) -> dict[str, Any]:
    # dlq_routes imports routes, which imports this module: its model is read when the
    # document is first built. (As a request body, it belongs in gateway/schemas.py.)
    from bandgate.gateway.dlq_routes import ReplayRequest

    def secured(
        name: str,
        summary: str,
        scope: str | None,
        ok: dict[str, Any],
        errors: tuple[int, ...] = (403, 404, 503),
        query: tuple[dict[str, Any], ...] = (),
        body: str | None = None,
        body_required: bool = True,
        about: str = "",
        more: dict[int, tuple[ErrorCode, ...]] | None = None,
        only: dict[int, tuple[ErrorCode, ...]] | None = None,
    ) -> dict[str, Any]:
        """A /v1/ operation on one queue (`scope` names the scope it needs), or on all of
        them (`scope` None: any valid token). `query` holds its parameters besides the queue;
        `more` holds the codes this operation answers besides every operation's, `only` the
        codes of a status it answers with its own instead."""
        needs = "any valid token" if scope is None else f"scope {scope}"
        if scope is not None and scope != "admin":
            needs += " (or the same action on *, or admin)"
        operation: dict[str, Any] = {
            "operationId": name,
            "summary": summary,
            "description": f"{about} Needs {needs}.".lstrip(),
            "security": [{"bearer": []}],
        }
        if scope is not None:
            operation["parameters"] = [_QUEUE, *query]
        if body is not None:
            operation["requestBody"] = {"required": body_required, **_content(ref(body))}
        statuses = (*errors, *_V1, *_ANY, *(_BODY if body is not None else ()))
        operation["responses"] = ok | _errors(statuses, limits, more or {}, only or {})
        return operation

    def public(
        name: str, summary: str, ok: dict[str, Any], errors: tuple[int, ...] = ()
    ) -> dict[str, Any]:
        return {
            "operationId": name,
            "summary": summary,
            "security": [],
            "responses": ok | _errors((*errors, *_ANY), limits, {}, {}),
        }

    dlq = (403, 404, 409, 422, 503)
    paths = {
        "/v1/queues/{queue}/messages": {
            "post": secured(
                "publish",
                "Publish one message; 201 once the broker confirmed it",
                "publish:{queue}",
                _ok("PublishedMessage", "confirmed by the broker", 201),
                body="PublishRequest",
            )
        },
        "/v1/queues/{queue}/messages/batch": {
            "post": secured(
                "publish_batch",
                "Publish up to the batch limit; a result per message",
                "publish:{queue}",
                _ok("BatchResponse", "each message in `successful` or, with its error, `failed`"),
                body="BatchRequest",
            )
        },
        "/v1/queues/{queue}/messages/{message_id}": {
            "delete": secured(
                "cancel_message",
                "Cancel a pending message by id; 202 once the tombstone is in the ledger",
                "publish:{queue}",
                _ok("Cancelled", "the cancel is in the ledger", 202),
                errors=(403, 404, 422, 503),
                query=(_MESSAGE_ID,),
                more={429: (codes.TOO_MANY_TOMBSTONES,)},
                only={422: (codes.INVALID_FIELD,)},  # the path's message id
                about="Writes a tombstone that makes consumers skip every copy of the id "
                "published before it that they have not started; a later replace runs. The "
                "ledger cannot tell an id never published, or already handled, from a pending "
                "one: the answer is the same.",
            ),
            "put": secured(
                "replace_message",
                "Replace a pending message by id; 201 once the new generation is confirmed "
                "and the older copies tombstoned",
                "publish:{queue}",
                _ok("Replaced", "published and the older copies tombstoned", 201),
                query=(_MESSAGE_ID,),
                body="PublishRequest",
                about=_GENERATION,
                more={429: (codes.TOO_MANY_TOMBSTONES,), 503: (codes.TOMBSTONE_NOT_WRITTEN,)},
            ),
        },
        "/v1/queues/{queue}/messages/{message_id}/escalate": {
            "post": secured(
                "escalate_message",
                "Send a pending message again at a hotter priority or band; the older copies "
                "are tombstoned",
                "publish:{queue}",
                _ok("Replaced", "published and the older copies tombstoned", 201),
                query=(_MESSAGE_ID,),
                body="EscalateRequest",
                about="A replace at a hotter priority: bandgate cannot take a message out of "
                "the middle of its band without draining it, so the body carries the message "
                f"again, with `priority` or `band` (exactly one). {_GENERATION}",
                more={
                    422: (codes.MESSAGE_REQUIRED,),
                    429: (codes.TOO_MANY_TOMBSTONES,),
                    503: (codes.TOMBSTONE_NOT_WRITTEN,),
                },
            )
        },
        "/v1/queues": {
            "get": secured(
                "list_queues",
                "The queues this token may publish to or read, with their bands",
                None,
                _ok("Queues"),
                errors=(),
            )
        },
        "/v1/queues/{queue}/stats": {
            "get": secured(
                "queue_stats",
                "Per band ready, unacked and consumers; delayed and dead-lettered counts",
                "read:{queue}",
                _ok("QueueStats"),
            )
        },
        "/v1/queues/{queue}/dlq": {
            "get": secured(
                "list_dead_letters",
                "The queue's dead letters, oldest first, without removing them",
                "admin",
                _ok("DeadLetters"),
                errors=dlq,
                query=tuple(_DLQ_QUERY),
                only={422: (codes.UNKNOWN_FIELD, codes.INVALID_FIELD)},  # the query's
                more={429: (codes.TOO_MANY_DLQ_OPERATIONS,)},
            ),
            "delete": secured(
                "purge_dead_letters",
                "Delete every dead letter of the queue",
                "admin",
                _ok("Purged"),
                errors=dlq,
                only={422: (codes.UNKNOWN_FIELD,)},  # a query it does not take
                more={429: (codes.TOO_MANY_DLQ_OPERATIONS,)},
            ),
        },
        "/v1/queues/{queue}/dlq/replay": {
            "post": secured(
                "replay_dead_letters",
                "Republish dead letters to their original bands; without a body, all of them",
                "admin",
                _ok("Replayed"),
                errors=dlq,
                body="ReplayRequest",
                body_required=False,
                more={429: (codes.TOO_MANY_DLQ_OPERATIONS,)},
            )
        },
        "/healthz": {"get": public("healthz", "The process is alive", _ok("Health"))},
        "/readyz": {
            "get": public(
                "readyz", "Connected to the broker, topology present", _ok("Ready"), (503,)
            )
        },
        "/metrics": {
            "get": public(
                "metrics",
                "Prometheus metrics",
                {
                    "200": {
                        "description": "Prometheus text format",
                        **_content({"type": "string"}, "text/plain"),
                    }
                },
            )
        },
        "/openapi.json": {
            "get": public(
                "openapi",
                "This document",
                {"200": {"description": "OK", **_content({"type": "object"})}},
            )
        },
    }
    schemas = component_schemas(
        ReplayRequest,
        max_batch_messages=limits.max_batch_messages,
        max_delay_seconds=limits.max_delay_seconds,
    )
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "bandgate",
            "version": "1",
            "description": _ABOUT,
            "license": {"name": "Apache-2.0", "identifier": "Apache-2.0"},
        },
        "servers": [{"url": "/", "description": "the gateway that serves this document"}],
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {
                "bearer": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "an API token; its scopes decide what it may do: "
                    "publish:<queue>, read:<queue>, consume:<queue> (* for any queue), "
                    "admin (everything)",
                }
            },
        },
    }


_ABOUT = (
    "Priority bands over RabbitMQ: publish messages with a priority (0-9), receive them "
    'hottest band first. Every error is JSON in one shape, `{"error": {"code", '
    '"message", "field"}}`; besides each operation\'s, any path the gateway does not '
    f"serve answers 404 `{codes.NOT_FOUND.code}` and a method a path does not take 405 "
    f"`{codes.METHOD_NOT_ALLOWED.code}`."
)


def _content(schema: dict[str, Any], media_type: str = JSON) -> dict[str, Any]:
    return {"content": {media_type: {"schema": schema}}}


def _ok(schema: str, description: str = "OK", status: int = 200) -> dict[str, Any]:
    return {str(status): {"description": description, **_content(ref(schema))}}


def _errors(
    statuses: tuple[int, ...],
    limits: ApiLimits,
    more: dict[int, tuple[ErrorCode, ...]],
    only: dict[int, tuple[ErrorCode, ...]],
) -> dict[str, Any]:
    responses = {}
    for status in sorted(set(statuses)):
        note = _ERROR_NOTES.get(status, "").format(max_body_bytes=limits.max_body_bytes)
        responses[str(status)] = {
            **describe_errors(only.get(status, ERRORS[status]) + more.get(status, ()), note),
            **({"headers": _ERROR_HEADERS[status]} if status in _ERROR_HEADERS else {}),
            **_content(ref("ErrorResponse")),
        }
    return responses


__all__ = [
    "DEFAULT_LIMITS",
    "ERRORS",
    "ApiLimits",
    "both_given",
    "describe_errors",
    "forbid",
    "openapi_document",
    "without_defaults",
]
