"""The receivers' part of the OpenAPI document: receive, ack (one or a batch), release, extend.

In the gateway's style (`bandgate.gateway.openapi`): bearer security, and every error each
operation can answer, in the one error shape. The request schemas are the JSON Schema of the
models that validate the bodies (`bandgate.pull.routes`), with what the handlers check on top
added; the answers, which the handlers build as plain dicts, are described by the models here.

- A receipt is opaque to clients: its form is said in descriptions, not as a pattern (one of
  another form is answered 422 invalid_receipt, one of a gone process 410 lease_lost).
- The deployment's limits come from the gateway's document this is added to: the delay
  ladder's longest delay as publish's `delay_seconds` states it, and the error responses'
  headers as publish's answers carry them.
- Links from receive's answer name where its receipts go (schemathesis' stateful phase follows
  them too).
"""

from __future__ import annotations

import copy
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field
from pydantic.json_schema import models_json_schema

from bandgate.consumers import MAX_REASON_CHARS, DeadLetterCause
from bandgate.core import error_codes as codes
from bandgate.core.error_codes import ErrorCode
from bandgate.gateway.openapi import both_given, describe_errors, forbid, without_defaults
from bandgate.gateway.schemas import ErrorBody
from bandgate.pull.routes import (
    MAX_ACK_BATCH,
    AckBatchRequest,
    ExtendRequest,
    ReceiveRequest,
    ReleaseRequest,
)
from bandgate.pull.settings import MAX_MESSAGES, PullSettings
from bandgate.topology.priority import MAX_PRIORITY, MIN_PRIORITY

JSON = "application/json"
SCHEMAS = "#/components/schemas/"
RECEIPT_FORM = (
    "a receipt as a receive answered it: opaque, of the form "
    r"^[0-9a-f]{16}\.[1-9][0-9]{0,17}\.[A-Za-z0-9_-]{22}$"
)
SENT_RECEIPT = RECEIPT_FORM + "; another is answered 422 invalid_receipt"


class ReceivedMessage(BaseModel):
    """A message leased to the caller until `visible_until`: ack or release it by `receipt`."""

    message_id: str
    receipt: str = Field(description=RECEIPT_FORM)
    payload: Any = Field(description="the payload as published: any JSON value")
    priority: int = Field(ge=MIN_PRIORITY, le=MAX_PRIORITY)
    band: str
    attempt: int = Field(ge=1, description="1, plus one for each release that retried it")
    receive_count: int = Field(
        ge=1,
        description="how often it was delivered, this time included (quorum bands count it; "
        "on classic bands it stays 1)",
    )
    enqueued_at: datetime
    visible_until: datetime = Field(description="when the lease lapses: visible again")
    headers: dict[str, Any] = Field(description="the producer's headers")
    partition_key: str | None
    tenant: str | None = Field(description="whose message it is, as published (fair bands)")


class AckSuccess(BaseModel):
    index: int
    receipt: str


class AckFailure(BaseModel):
    index: int
    receipt: str
    error: ErrorBody = Field(
        description="invalid_receipt, lease_expired, lease_lost, holder_unresponsive or "
        "broker_unavailable, as the single ack would answer them"
    )


class AckBatchResponse(BaseModel):
    successful: list[AckSuccess]
    failed: list[AckFailure]


class ReceiveResponse(BaseModel):
    messages: list[ReceivedMessage] = Field(
        max_length=MAX_MESSAGES, description="hottest band first; empty when none came in time"
    )
    ack: AckBatchResponse | None = Field(
        default=None,
        description="with `ack` in the request only: each of its receipts in `successful` or, "
        "with its error, `failed` (`field` ack.<index>), settled before the receive",
    )


class ReleaseResponse(BaseModel):
    receipt: str
    outcome: Literal["retry", "dead-lettered", "requeued", "returned"] = Field(
        description="retry: a copy is due again after `retry_in_seconds` as attempt `attempt`; "
        "dead-lettered: in the dead-letter queue (`cause`, `reason`): released with "
        "dead_letter, or its last attempt failed; requeued: the retry or dead-letter copy was "
        "not confirmed, so the message went back to its band unsettled (`reason`); returned: "
        "the gateway stopped before it settled, so the message went back to its band"
    )
    attempt: int | None = Field(default=None, ge=2, description="retry: the copy's attempt")
    retry_in_seconds: float | None = Field(default=None, ge=0, description="retry: when")
    cause: DeadLetterCause | None = Field(default=None, description="dead-lettered: why")
    reason: str | None = Field(
        default=None, description="dead-lettered: the reason kept; requeued: why"
    )


class ExtendResponse(BaseModel):
    receipt: str
    visible_until: datetime


_REQUESTS = (ReceiveRequest, AckBatchRequest, ReleaseRequest, ExtendRequest)
_RESPONSES = (ReceiveResponse, AckBatchResponse, ReleaseResponse, ExtendResponse)

# Each status with the codes the receivers answer it with, and what its description adds to the
# codes' meanings (`gateway.openapi.describe_errors`); what is not here reads as the gateway's.
Described = tuple[tuple[ErrorCode, ...], str]
_ERRORS: dict[int, Described] = {
    403: ((codes.FORBIDDEN,), " The scope needed: consume:<queue>."),
    404: ((codes.UNKNOWN_QUEUE,), ""),
    410: ((codes.LEASE_EXPIRED, codes.LEASE_LOST), ""),
    413: ((codes.BODY_TOO_LARGE,), " The gateway's body limit, as for publishing."),
    422: (
        (codes.INVALID_FIELD, codes.UNKNOWN_FIELD, codes.MISSING_FIELD, codes.INVALID_BODY),
        " `field` names the field.",
    ),
    429: (
        (codes.RATE_LIMITED, codes.TOO_MANY_AUTH_FAILURES),
        " A request costs one, an ack batch one per receipt. See Retry-After.",
    ),
    503: ((codes.BROKER_UNAVAILABLE, codes.HOLDER_UNRESPONSIVE), " Retry later."),
}


def document(openapi: dict[str, Any], settings: PullSettings) -> None:
    """Add the receive and receipt operations to `openapi` (a copy of the gateway's)."""
    schemas = openapi["components"]["schemas"]
    schemas |= _schemas(_longest_delay(schemas))
    publish = openapi["paths"]["/v1/queues/{queue}/messages"]["post"]
    fields, field_note = _ERRORS[422]
    invalid: Described = ((codes.INVALID_RECEIPT, *fields), field_note)
    openapi["paths"] |= {
        "/v1/queues/{queue}/receive": {
            "post": _operation(
                publish,
                "receive",
                "Lease up to max_messages messages, hottest band first, waiting up to "
                "wait_seconds for the first",
                _ok("ReceiveResponse", links=_links()),
                body="ReceiveRequest",
                errors={
                    413: (
                        (codes.BODY_TOO_LARGE, codes.BATCH_TOO_LARGE),
                        f" The body limit is publishing's; `ack` holds at most {MAX_ACK_BATCH} "
                        "receipts.",
                    ),
                    429: (
                        (
                            codes.RATE_LIMITED,
                            codes.TOO_MANY_AUTH_FAILURES,
                            codes.TOO_MANY_LEASES,
                            codes.TOO_MANY_RECEIVES,
                        ),
                        f" A token may hold {settings.token_lease_limit} leases in this "
                        "gateway process: settle some first; and have "
                        f"{settings.max_waiting_per_token} receives open at once (at most a "
                        "quarter of the process's connections). See Retry-After.",
                    ),
                },
                note=" Without a visibility_timeout a lease lasts "
                f"{settings.default_visibility_seconds:g} s. With `ack` (the previous batch's "
                "receipts, charged one each as in a batch ack), those are acked first, each "
                "with its result in the answer's `ack`; a receive refused after them (429 "
                "too_many_leases or too_many_receives, 503 broker_unavailable) leaves them "
                "acked.",
            )
        },
        "/v1/queues/{queue}/receipts/{receipt}": {
            "delete": _operation(
                publish,
                "ack",
                "Ack a received message: it leaves its queue",
                {"204": {"description": "acked: the broker holds it no more"}},
                errors={410: _ERRORS[410], 422: ((codes.INVALID_RECEIPT,), "")},
                receipt=True,
            )
        },
        "/v1/queues/{queue}/receipts/ack": {
            "post": _operation(
                publish,
                "ack_batch",
                f"Ack up to {MAX_ACK_BATCH} received messages; a result per receipt",
                _ok(
                    "AckBatchResponse", "each receipt in `successful` or, with its error, `failed`"
                ),
                body="AckBatchRequest",
                errors={
                    413: (
                        (codes.BODY_TOO_LARGE, codes.BATCH_TOO_LARGE),
                        f" The body limit is publishing's; a batch holds at most {MAX_ACK_BATCH} "
                        "receipts.",
                    ),
                },
            )
        },
        "/v1/queues/{queue}/receipts/release": {
            "post": _operation(
                publish,
                "release",
                "Give a received message back: retried after a delay (a failed attempt), or "
                "dead-lettered",
                _ok("ReleaseResponse", "what became of the message"),
                body="ReleaseRequest",
                errors={
                    410: _ERRORS[410],
                    422: ((*invalid[0], codes.CONFLICTING_FIELDS), invalid[1]),
                },
            )
        },
        "/v1/queues/{queue}/receipts/extend": {
            "post": _operation(
                publish,
                "extend",
                "Set a lease's visibility timeout anew, counted from now (0: visible at once)",
                _ok("ExtendResponse", "the lease's new end"),
                body="ExtendRequest",
                errors={410: _ERRORS[410], 422: invalid},
            )
        },
    }


def _schemas(longest: float | None) -> dict[str, dict[str, Any]]:
    _, generated = models_json_schema(
        [(model, "validation") for model in _REQUESTS]
        + [(model, "serialization") for model in _RESPONSES],
        ref_template=SCHEMAS + "{model}",
    )
    schemas: dict[str, dict[str, Any]] = generated["$defs"]
    batch = {
        "items": {
            "type": "string",
            "description": RECEIPT_FORM + "; another is listed in `failed`, invalid_receipt",
        },
        "maxItems": MAX_ACK_BATCH,
    }
    schemas["AckBatchRequest"]["properties"]["receipts"] |= batch
    _value(schemas["ReceiveRequest"]["properties"]["ack"]).update(batch)
    for name in ("ReleaseRequest", "ExtendRequest"):
        schemas[name]["properties"]["receipt"]["description"] = SENT_RECEIPT
    release = schemas["ReleaseRequest"]["properties"]
    horizon = "the delay ladder's longest delay"
    if longest is not None:
        _value(release["delay_seconds"])["maximum"] = longest
        horizon += f", {longest:g} s"
    release["delay_seconds"]["description"] = (
        f"retry after this many seconds (at most {horizon}); without it, the queue's back-off"
    )
    release["reason"]["description"] = (
        f"why, kept with the retry or the dead letter; at most {MAX_REASON_CHARS} characters"
    )
    release["dead_letter"]["description"] = "straight to the dead-letter queue, no retry"
    # delay_seconds says when to retry, dead_letter says never: not both.
    forbid(schemas["ReleaseRequest"], both_given("delay_seconds", "dead_letter", {"const": True}))
    without_defaults(schemas)
    return schemas


def _longest_delay(schemas: dict[str, Any]) -> float | None:
    """The delay ladder's longest delay, as the gateway's document states it for publishing
    (absent from a document built without a topology)."""
    maximum = _value(schemas["PublishRequest"]["properties"]["delay_seconds"]).get("maximum")
    return None if maximum is None else float(maximum)


def _value(prop: dict[str, Any]) -> dict[str, Any]:
    """The schema of an optional field's value: its branch of `anyOf` that is not null."""
    branch: dict[str, Any] = next(b for b in prop["anyOf"] if b.get("type") != "null")
    return branch


def _operation(
    publish: dict[str, Any],
    name: str,
    summary: str,
    ok: dict[str, Any],
    *,
    body: str | None = None,
    errors: dict[int, Described] | None = None,
    receipt: bool = False,
    note: str = "",
) -> dict[str, Any]:
    """A /v1/ operation on one queue that needs consume:<queue>. Its queue parameter and
    its errors' headers (WWW-Authenticate, Retry-After, X-Request-Id) are publish's."""
    parameters = [copy.deepcopy(p) for p in publish["parameters"] if p["name"] == "queue"]
    if receipt:
        parameters.append(
            {
                "name": "receipt",
                "in": "path",
                "required": True,
                "description": SENT_RECEIPT,
                "schema": {"type": "string", "minLength": 1},
            }
        )
    operation: dict[str, Any] = {
        "operationId": name,
        "summary": summary,
        "description": "Needs scope consume:{queue} (or the same action on *, or admin)." + note,
        "security": [{"bearer": []}],
        "parameters": parameters,
    }
    statuses = {401, 403, 404, 408, 429, 431, 500, 503}
    if body is not None:
        operation["requestBody"] = {"required": True, **_content(_ref(body))}
        statuses |= {400, 413, 415, 422}
    errors = errors or {}
    statuses |= set(errors)
    described = _ERRORS | errors
    responses = dict(ok)
    for status in sorted(statuses):
        entry = copy.deepcopy(
            publish["responses"].get(str(status)) or _content(_ref("ErrorResponse"))
        )
        if status in described:
            entry |= describe_errors(*described[status])
        responses[str(status)] = entry
    operation["responses"] = responses
    return operation


def _links() -> dict[str, Any]:
    """Where the first received message's receipt goes."""
    receipt = "$response.body#/messages/0/receipt"
    queue = {"path.queue": "$request.path.queue"}
    return {
        "ack": {
            "operationId": "ack",
            "parameters": queue | {"path.receipt": receipt},
            "description": "ack the first message received",
        },
        "ack_batch": {
            "operationId": "ack_batch",
            "parameters": queue,
            "requestBody": {"receipts": [receipt]},
            "description": "ack the first message received, in a batch",
        },
        "release": {
            "operationId": "release",
            "parameters": queue,
            "requestBody": {"receipt": receipt},
            "description": "release the first message received",
        },
        "extend": {
            "operationId": "extend",
            "parameters": queue,
            "requestBody": {"receipt": receipt},
            "description": "extend the lease of the first message received",
        },
    }


def _ref(name: str) -> dict[str, str]:
    return {"$ref": SCHEMAS + name}


def _content(schema: dict[str, Any]) -> dict[str, Any]:
    return {"content": {JSON: {"schema": schema}}}


def _ok(
    schema: str, description: str = "OK", links: dict[str, Any] | None = None
) -> dict[str, Any]:
    return {
        "200": {
            "description": description,
            **_content(_ref(schema)),
            **({"links": links} if links else {}),
        }
    }


__all__ = [
    "AckBatchResponse",
    "ExtendResponse",
    "ReceiveResponse",
    "ReceivedMessage",
    "ReleaseResponse",
    "document",
]
