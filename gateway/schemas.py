"""Request and response bodies of the HTTP API, validated at the edge.

Every way a request can be wrong maps to one `ApiError` with a field name, so clients can fix
their input; nothing here talks to the broker.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    JsonValue,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationError,
)

from bandgate.core import error_codes
from bandgate.gateway.errors import ApiError
from bandgate.topology.model import QueueSpec, Topology
from bandgate.topology.publish_input import (
    MAX_ID_LENGTH,
    MAX_PARTITION_KEY,
    MAX_TENANT,
    MessageInputError,
    envelope_for,
)
from bandgate.topology.wire import Envelope

HeaderScalar = StrictStr | StrictBool | StrictInt | StrictFloat
# RFC 3339 as the API promises it: a full date and time with an offset. pydantic alone would
# also take numbers (as epoch seconds or milliseconds) and dates without a time.
RFC3339 = re.compile(r"\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d{1,9})?([Zz]|[+-]\d{2}:\d{2})")


def _rfc3339_text(value: Any) -> Any:
    if value is not None and (not isinstance(value, str) or not RFC3339.fullmatch(value)):
        raise ValueError("must be an RFC 3339 time with an offset, e.g. 2030-01-01T12:00:00Z")
    return value


def _limits(**schema: JsonValue) -> Any:
    """JSON Schema keywords for the document only: `publish_input` checks these limits, for
    the gateway and the Python producer alike."""
    return Field(json_schema_extra=schema)


class PublishRequest(BaseModel):
    """One message to publish; only `payload` is required."""

    # The model checks the JSON types; `topology.publish_input` the rules every publish
    # follows (this docstring is the OpenAPI document's description).

    model_config = ConfigDict(extra="forbid")

    payload: Any = Field(description="any JSON value; delivered to consumers as is")
    priority: StrictInt | StrictStr | None = Field(
        default=None,
        description="0-9 (9 most urgent) or critical=9, high=7, normal=4, low=2, "
        "background=0; default 4",
    )
    delay_seconds: Annotated[float, Field(strict=True), _limits(minimum=0)] | None = Field(
        default=None, description="deliver after this many seconds"
    )
    deliver_at: Annotated[datetime, BeforeValidator(_rfc3339_text)] | None = Field(
        default=None, description="RFC 3339 time with offset; deliver then"
    )
    headers: dict[str, HeaderScalar] | None = Field(
        default=None, description="string keys, scalar values; travel as AMQP headers"
    )
    message_id: Annotated[str, _limits(minLength=1, maxLength=MAX_ID_LENGTH)] | None = None
    partition_key: Annotated[str, _limits(minLength=1, maxLength=MAX_PARTITION_KEY)] | None = None
    tenant: Annotated[str, _limits(minLength=1, maxLength=MAX_TENANT)] | None = Field(
        default=None,
        description="whose message it is: a fair band keeps a tenant that floods out of the "
        "other tenants' way",
    )


class BatchRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    messages: list[Any] = Field(description="messages as in the single publish body")


class PublishedMessage(BaseModel):
    message_id: str
    queue: str
    priority: int
    band: str
    enqueued_at: datetime
    deliver_at: datetime | None


class ErrorBody(BaseModel):
    code: str
    message: str
    field: str | None


class ErrorResponse(BaseModel):
    error: ErrorBody


class BatchSuccess(PublishedMessage):
    index: int


class BatchFailure(BaseModel):
    index: int
    error: ErrorBody


class BatchResponse(BaseModel):
    successful: list[BatchSuccess]
    failed: list[BatchFailure]


def validation_error(exc: ValidationError, prefix: str = "") -> ApiError:
    """The first problem of a pydantic error, as a 422 naming the field."""
    first = exc.errors()[0]
    loc = first["loc"]
    # Name the field (and the header, for headers), not pydantic's union member tags.
    parts = loc[:2] if loc[:1] == ("headers",) else loc[:1]
    field = ".".join(str(part) for part in parts) or None
    if prefix:
        field = f"{prefix}.{field}" if field else prefix
    if first["type"] == "missing":
        return ApiError.of(error_codes.MISSING_FIELD, f"{field} is required", field)
    if first["type"] == "extra_forbidden":
        return ApiError.of(error_codes.UNKNOWN_FIELD, f"{field} is not a known field", field)
    message = str(first["msg"]).removeprefix("Value error, ")
    error = error_codes.INVALID_PRIORITY if loc[:1] == ("priority",) else error_codes.INVALID_FIELD
    return ApiError.of(error, f"{field}: {message}", field)


def parse_publish(data: Any, spec: QueueSpec, topology: Topology, prefix: str = "") -> Envelope:
    """Validate one publish body into an Envelope, or raise the ApiError that explains why."""
    if not isinstance(data, dict):
        raise ApiError.of(
            error_codes.INVALID_BODY, "a message must be a JSON object", prefix or None
        )
    try:
        request = PublishRequest.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc, prefix) from None
    try:
        return envelope_for(
            topology,
            spec,
            request.payload,
            priority=request.priority,
            delay_seconds=request.delay_seconds,
            deliver_at=request.deliver_at,
            headers=request.headers,
            message_id=request.message_id,
            partition_key=request.partition_key,
            tenant=request.tenant,
        )
    except MessageInputError as exc:
        field = f"{prefix}.{exc.field}" if prefix else exc.field
        raise ApiError.of(error_codes.for_rule(exc.rule), str(exc), field) from None
