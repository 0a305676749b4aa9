"""Request and response bodies of the HTTP API, validated at the edge.

Every way a request can be wrong maps to one `ApiError` with a field name, so clients can fix
their input; nothing here talks to the broker.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationError,
    field_validator,
)

from bandgate.gateway.errors import ApiError
from bandgate.topology.model import QueueSpec, Topology
from bandgate.topology.priority import PriorityError, parse_priority
from bandgate.topology.wire import HEADER_PREFIX, Envelope, new_message_id, now

HEADER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
MAX_HEADERS = 32
MAX_HEADER_VALUE = 4096
MAX_ID_LENGTH = 128
MAX_ID_BYTES = 255  # message_id travels as an AMQP short string
MAX_PARTITION_KEY = 256
INT64 = 2**63

HeaderScalar = StrictStr | StrictBool | StrictInt | StrictFloat
# RFC 3339 as the API promises it: a full date and time with an offset. pydantic alone would
# also take numbers (as epoch seconds or milliseconds) and dates without a time.
RFC3339 = re.compile(r"\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d{1,9})?([Zz]|[+-]\d{2}:\d{2})")


def _rfc3339_text(value: Any) -> Any:
    if value is not None and (not isinstance(value, str) or not RFC3339.fullmatch(value)):
        raise ValueError("must be an RFC 3339 time with an offset, e.g. 2030-01-01T12:00:00Z")
    return value


class PublishRequest(BaseModel):
    """One message to publish; only `payload` is required."""

    model_config = ConfigDict(extra="forbid")

    payload: Any = Field(description="any JSON value; delivered to consumers as is")
    priority: StrictInt | StrictStr | None = Field(
        default=None,
        description="0-9 (9 most urgent) or critical=9, high=7, normal=4, low=2, "
        "background=0; default 4",
    )
    delay_seconds: Annotated[float, Field(ge=0, strict=True)] | None = Field(
        default=None, description="deliver after this many seconds"
    )
    deliver_at: Annotated[datetime, BeforeValidator(_rfc3339_text)] | None = Field(
        default=None, description="RFC 3339 time with offset; deliver then"
    )
    headers: dict[str, HeaderScalar] | None = Field(
        default=None, description="string keys, scalar values; travel as AMQP headers"
    )
    message_id: Annotated[str, Field(min_length=1, max_length=MAX_ID_LENGTH)] | None = None
    partition_key: Annotated[str, Field(min_length=1, max_length=MAX_PARTITION_KEY)] | None = None

    @field_validator("headers")
    @classmethod
    def _headers_valid(cls, headers: dict[str, Any] | None) -> dict[str, Any] | None:
        if headers is None:
            return None
        if len(headers) > MAX_HEADERS:
            raise ValueError(f"at most {MAX_HEADERS} headers")
        for name, value in headers.items():
            if not HEADER_NAME.fullmatch(name):
                raise ValueError(
                    f"header name {name[:40]!r} is invalid: 1-128 letters, digits, '_', '.', '-'"
                )
            if name.lower().startswith("x-"):
                raise ValueError(
                    f"header name {name!r}: names starting with 'x-' are reserved "
                    f"for the broker and bandgate ({HEADER_PREFIX}*)"
                )
            if isinstance(value, str) and len(value) > MAX_HEADER_VALUE:
                raise ValueError(f"header {name!r} is longer than {MAX_HEADER_VALUE} characters")
            if isinstance(value, int) and not -INT64 <= value < INT64:
                raise ValueError(f"header {name!r} is outside the 64-bit integer range")
        return headers

    @field_validator("message_id", "partition_key")
    @classmethod
    def _printable(cls, value: str | None) -> str | None:
        if value is not None and not value.isprintable():
            raise ValueError("must contain printable characters only")
        return value

    @field_validator("message_id")
    @classmethod
    def _short_string(cls, value: str | None) -> str | None:
        if value is not None and len(value.encode()) > MAX_ID_BYTES:
            raise ValueError(f"must be at most {MAX_ID_BYTES} bytes in UTF-8")
        return value


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
        return ApiError(422, "missing_field", f"{field} is required", field)
    if first["type"] == "extra_forbidden":
        return ApiError(422, "unknown_field", f"{field} is not a known field", field)
    message = str(first["msg"]).removeprefix("Value error, ")
    code = "invalid_priority" if loc[:1] == ("priority",) else "invalid_field"
    return ApiError(422, code, f"{field}: {message}", field)


def parse_publish(data: Any, spec: QueueSpec, topology: Topology, prefix: str = "") -> Envelope:
    """Validate one publish body into an Envelope, or raise the ApiError that explains why."""
    if not isinstance(data, dict):
        raise ApiError(422, "invalid_body", "a message must be a JSON object", prefix or None)
    try:
        request = PublishRequest.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc, prefix) from None
    field_name = f"{prefix}.priority" if prefix else "priority"
    try:
        priority = parse_priority(request.priority)
    except PriorityError as exc:
        raise ApiError(422, "invalid_priority", str(exc), field_name) from None
    enqueued_at = now()
    deliver_at = _deliver_at(request, enqueued_at, topology, prefix)
    return Envelope(
        queue=spec.name,
        payload=request.payload,
        priority=priority,
        message_id=request.message_id or new_message_id(),
        enqueued_at=enqueued_at,
        deliver_at=deliver_at,
        headers=request.headers or {},
        partition_key=request.partition_key,
    )


def _deliver_at(
    request: PublishRequest, enqueued_at: datetime, topology: Topology, prefix: str
) -> datetime | None:
    if request.delay_seconds is None and request.deliver_at is None:
        return None  # the common case; the ladder's maximum costs a little to compute

    def field(name: str) -> str:
        return f"{prefix}.{name}" if prefix else name

    if request.delay_seconds is not None and request.deliver_at is not None:
        raise ApiError(
            422,
            "conflicting_fields",
            "give delay_seconds or deliver_at, not both",
            field("deliver_at"),
        )
    max_seconds = topology.ladder.max_delay_ms / 1000
    if request.delay_seconds is not None:
        if request.delay_seconds > max_seconds:
            raise ApiError(
                422,
                "invalid_field",
                f"delay_seconds exceeds the maximum of {max_seconds:.0f}",
                field("delay_seconds"),
            )
        if request.delay_seconds == 0:
            return None
        return enqueued_at + timedelta(seconds=request.delay_seconds)
    if request.deliver_at is not None:
        if (request.deliver_at - enqueued_at).total_seconds() > max_seconds:
            raise ApiError(
                422,
                "invalid_field",
                f"deliver_at is more than {max_seconds:.0f} s ahead",
                field("deliver_at"),
            )
        return request.deliver_at
    return None
