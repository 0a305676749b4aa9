"""The OpenAPI document's schemas: the request and response models' JSON Schema, with what the
handlers check on top of the models added, and the bodies that have no model yet.

They are shaped for client generators as well as validators (openapi-python-client and
openapi-typescript, checked by tests/integration/test_generated_clients.py): a rule across
fields sits in a top-level `not`, which validators apply and generators pass over (a top-level
`anyOf` made both type a body as a union of branches, each with one field left untyped); no
schema refers to itself (a recursive JSON value made openapi-python-client drop the escalate
operation and `tsc --strict` fail); and no property has a `default` (openapi-typescript types a
field with one as always present, so a body that leaves it out would not compile).
"""

from __future__ import annotations

import copy
import json
from typing import Any

from pydantic import BaseModel, TypeAdapter
from pydantic.json_schema import models_json_schema

from bandgate.core.dead_letter_records import DeadLetter
from bandgate.core.queue_stats import QueueDescription, QueueStats
from bandgate.gateway.schemas import (
    BatchRequest,
    BatchResponse,
    ErrorResponse,
    PublishedMessage,
    PublishRequest,
)
from bandgate.topology.priority import ALIASES, MAX_PRIORITY, MIN_PRIORITY
from bandgate.topology.publish_input import (
    HEADER_NAME,
    INT64,
    MAX_HEADER_VALUE,
    MAX_HEADERS,
    MAX_ID_BYTES,
    MAX_ID_LENGTH,
    MAX_PAYLOAD_DEPTH,
)

SCHEMAS = "#/components/schemas/"
# gateway/json_input.py refuses integers outside this range with 400: nothing could carry them.
JSON_INT_MIN = -(2**63)
JSON_INT_MAX = 2**64 - 1
# Control characters (Unicode Cc) and the line and paragraph separators. The gateway refuses
# every character Python does not call printable, a set no portable pattern spells out.
PRINTABLE = "^[^\\x00-\\x1f\\x7f-\\x9f\\u2028\\u2029]*$"


def ref(name: str) -> dict[str, str]:
    return {"$ref": SCHEMAS + name}


def json_object(*required: str, **properties: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "required": list(required), "properties": properties}


# A field given: present and not null.
GIVEN: dict[str, Any] = {"not": {"type": "null"}}


def both_given(first: str, second: str, second_is: dict[str, Any] = GIVEN) -> dict[str, Any]:
    """The bodies that give both fields (the second as `second_is` says)."""
    return {"required": [first, second], "properties": {first: GIVEN, second: second_is}}


def forbid(schema: dict[str, Any], *cases: dict[str, Any]) -> None:
    """Refuse the bodies of any of `cases`, in the top-level `not` generators pass over."""
    schema["not"] = cases[0] if len(cases) == 1 else {"anyOf": list(cases)}


def without_defaults(schemas: dict[str, dict[str, Any]]) -> None:
    """Take `default` off every property, saying a default other than null in its description
    instead: what a field left out means is the server's to apply, not a generator's."""
    for schema in schemas.values():
        for prop in schema.get("properties", {}).values():
            if "default" not in prop:
                continue
            default = prop.pop("default")
            if default is not None:
                said = prop.get("description", "").rstrip(".")
                prop["description"] = f"{said}; default {json.dumps(default)}".removeprefix("; ")


def component_schemas(
    replay_request: type[BaseModel], *, max_batch_messages: int, max_delay_seconds: float | None
) -> dict[str, dict[str, Any]]:
    requests = (PublishRequest, BatchRequest, replay_request)
    responses = (PublishedMessage, BatchResponse, ErrorResponse)
    _, generated = models_json_schema(
        [(model, "validation") for model in requests]
        + [(model, "serialization") for model in responses],
        ref_template=SCHEMAS + "{model}",
    )
    schemas: dict[str, dict[str, Any]] = generated["$defs"]
    _refine_publish(schemas["PublishRequest"], max_delay_seconds)
    schemas["BatchRequest"]["properties"]["messages"] |= {
        "items": ref("PublishRequest"),
        "minItems": 1,
        "maxItems": max_batch_messages,
    }
    for model in requests:
        _bound_integers(schemas[model.__name__])
    schemas["EscalateRequest"] = _escalate_request(schemas["PublishRequest"])
    schemas["Headers"] = _name_headers(schemas["PublishRequest"], schemas["EscalateRequest"])
    schemas |= copy.deepcopy(_UNMODELLED) | _answers() | {"PriorityName": PRIORITY_NAME}
    without_defaults(schemas)
    return schemas


def _answers() -> dict[str, dict[str, Any]]:
    """The schemas of answers the handlers build from typed dicts and dataclasses."""
    _, generated = TypeAdapter.json_schemas(
        [
            (name, "serialization", TypeAdapter(kind))
            for name, kind in (
                ("QueueStats", QueueStats),
                ("QueueDescription", QueueDescription),
                ("DeadLetter", DeadLetter),
            )
        ],
        ref_template=SCHEMAS + "{model}",
    )
    schemas: dict[str, dict[str, Any]] = generated["$defs"]
    return schemas


_STRING = {"type": "string"}
_COUNT = {"type": "integer", "minimum": 0}
# Bodies without a pydantic model: their required keys, and the types that matter to clients.
_UNMODELLED: dict[str, dict[str, Any]] = {
    "Queues": json_object("queues", queues={"type": "array", "items": ref("QueueDescription")}),
    "DeadLetters": json_object(
        "queue",
        "count",
        "messages",
        queue=_STRING,
        count=_COUNT,
        messages={"type": "array", "items": ref("DeadLetter")},
    ),
    "Replayed": json_object(
        *("queue", "examined", "replayed", "skipped", "kept", "error"),
        queue=_STRING,
        examined=_COUNT,
        replayed=_COUNT,
        skipped=_COUNT,
        kept={"type": "array", "items": _STRING},
        error={"type": ["string", "null"]},
    ),
    "Purged": json_object("queue", "purged", queue=_STRING, purged=_COUNT),
    "Cancelled": json_object(
        *("message_id", "queue", "cancelled_before", "note"),
        message_id=_STRING,
        queue=_STRING,
        cancelled_before={
            "type": "integer",
            "description": "the cancel's generation (milliseconds since the epoch): copies "
            "of the id older than it are skipped",
        },
        note=_STRING,
    ),
    # A replace's or an escalate's answer: the publish's, and the generation it published.
    "Replaced": {
        "allOf": [
            ref("PublishedMessage"),
            json_object(
                "generation",
                generation={
                    "type": "integer",
                    "description": "the new copy's generation (milliseconds since the epoch); "
                    "older copies of the id are skipped",
                },
            ),
        ]
    },
    "Health": json_object("status", status={"const": "ok"}),
    "Ready": json_object(
        "status",
        "broker_version",
        status={"const": "ready"},
        broker_version={"type": ["string", "null"]},
        ledger={
            "type": ["string", "null"],
            "description": "with HTTP receivers: `following` while they read the tombstone "
            "ledger, else why they cannot",
        },
    ),
}


# Any JSON value the gateway carries exactly: said, not spelled out, since a schema of a JSON
# value refers to itself. (A number written with a fraction or an exponent, such as 1.0 or
# 1e20, is a float to the gateway and is carried whatever its size.)
PAYLOAD = {
    "title": "Payload",
    "description": f"any JSON value, delivered to consumers as is: integers within "
    f"[{JSON_INT_MIN}, {JSON_INT_MAX}] (else 400 malformed_json), nested at most "
    f"{MAX_PAYLOAD_DEPTH} levels deep (else 422 invalid_field)",
}


# Parts of the publish body with names of their own, so that a generated client has types of
# those names (not PublishRequestPriorityType1 and PublishRequestHeadersType0).
PRIORITY_NAME = {
    "title": "PriorityName",
    "type": "string",
    "enum": list(ALIASES),
    "description": ", ".join(f"{name}={level}" for name, level in ALIASES.items()),
}


def _name_headers(*bodies: dict[str, Any]) -> dict[str, Any]:
    """The bodies' `headers` schema (the same in each), as the component `Headers`."""
    headers = _value(bodies[0]["properties"]["headers"])
    for body in bodies:
        body["properties"]["headers"]["anyOf"] = [ref("Headers"), {"type": "null"}]
    return headers | {"title": "Headers"}


def _refine_publish(schema: dict[str, Any], max_delay_seconds: float | None) -> None:
    props = schema["properties"]
    props["payload"] = dict(PAYLOAD)
    props["priority"]["anyOf"] = [
        {"type": "integer", "minimum": MIN_PRIORITY, "maximum": MAX_PRIORITY},
        ref("PriorityName"),
        {"type": "null"},
    ]
    if max_delay_seconds is not None:
        _value(props["delay_seconds"])["maximum"] = max_delay_seconds
    horizon = (
        "the delay ladder's maximum" if max_delay_seconds is None else f"{max_delay_seconds:g} s"
    )
    props["deliver_at"]["description"] = (
        "RFC 3339 date and time with an offset (e.g. 2030-01-01T12:00:00Z), at most nine "
        f"fractional digits; deliver then. At most {horizon} ahead; a time past is due now."
    )
    headers = _value(props["headers"])
    headers["maxProperties"] = MAX_HEADERS
    # Names starting with x- belong to the broker and to bandgate.
    headers["propertyNames"] = {"pattern": "^(?![xX]-)" + HEADER_NAME.pattern.removeprefix("^")}
    for branch in headers["additionalProperties"]["anyOf"]:
        if branch["type"] == "string":
            branch["maxLength"] = MAX_HEADER_VALUE
        elif branch["type"] == "integer":
            branch["minimum"], branch["maximum"] = -INT64, INT64 - 1
        elif branch["type"] == "number":
            branch["not"] = {"type": "integer"}  # else 2^63 would be a valid number
    _value(props["message_id"])["pattern"] = PRINTABLE
    props["message_id"]["description"] = (
        f"printable characters, at most {MAX_ID_LENGTH} of them and {MAX_ID_BYTES} bytes in "
        "UTF-8, unique within a batch; a new id when omitted"
    )
    _value(props["partition_key"])["pattern"] = PRINTABLE
    _value(props["tenant"])["pattern"] = PRINTABLE
    forbid(schema, DELAY_AND_DELIVER_AT)


# delay_seconds and deliver_at exclude each other.
DELAY_AND_DELIVER_AT = both_given("delay_seconds", "deliver_at")


def _escalate_request(publish: dict[str, Any]) -> dict[str, Any]:
    """The escalate body: the publish body (finished, limits included) with `band` as the
    other way to give the priority, and exactly one of the two."""
    schema = copy.deepcopy(publish)
    schema["title"] = "EscalateRequest"
    schema["description"] = (
        "The message sent again (its payload is required: bandgate cannot read it out of its "
        "band), with `priority` or `band`, exactly one."
    )
    schema["properties"]["band"] = {
        "anyOf": [{"type": "string"}, {"type": "null"}],
        "description": "a band of the queue (GET /v1/queues lists them): its highest priority",
    }
    neither = {"properties": {"priority": {"type": "null"}, "band": {"type": "null"}}}
    forbid(schema, DELAY_AND_DELIVER_AT, both_given("priority", "band"), neither)
    return schema


def _value(prop: dict[str, Any]) -> dict[str, Any]:
    """The schema of an optional field's value: its branch of `anyOf` that is not null."""
    branch: dict[str, Any] = next(b for b in prop["anyOf"] if b.get("type") != "null")
    return branch


def _bound_integers(schema: Any) -> None:
    """Give every integer of a request body the range the gateway parses exactly (not under
    `not`, where a range would let the integers outside it through)."""
    if isinstance(schema, dict):
        if schema.get("type") == "integer":
            schema.setdefault("minimum", JSON_INT_MIN)
            schema.setdefault("maximum", JSON_INT_MAX)
        for key, value in schema.items():
            if key != "not":
                _bound_integers(value)
    elif isinstance(schema, list):
        for value in schema:
            _bound_integers(value)
