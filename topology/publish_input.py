"""What a published message may carry, decided once: the HTTP gateway (after its JSON schema has
checked the types) and the Python producer both turn their input into an `Envelope` here.

A refusal is a `MessageInputError` naming the field and the rule broken (`InputRule`); the
floors above turn the rule into their error code (`core.error_codes.for_rule`), so the gateway
answers it as it answers the same HTTP body and the producer raises it as `InvalidMessage`.

The payload: the gateway's is JSON by construction (it parsed it) and its size is the HTTP
body's (`BodyLimitMiddleware`); a Python payload is checked by `payload_body` for the same two
rules, so the producer never sends what the gateway would have refused: a value JSON cannot
carry as it was given (NaN, +-inf, a datetime, a tuple: what a consumer gets back must equal
what was published) or a payload over the gateway's body limit.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from datetime import datetime, timedelta
from enum import Enum
from typing import Any

import orjson

from bandgate.topology.model import QueueSpec, Topology
from bandgate.topology.priority import PriorityError, parse_priority
from bandgate.topology.wire import HEADER_PREFIX, Envelope, HeaderValue, new_message_id, now

HEADER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
MAX_HEADERS = 32
MAX_HEADER_VALUE = 4096
MAX_ID_LENGTH = 128
MAX_ID_BYTES = 255  # message_id travels as an AMQP short string
MAX_PARTITION_KEY = 256
MAX_TENANT = 128  # printable characters, like a message id: an AMQP header of few bytes
INT64 = 2**63
# The gateway's default body limit (`BANDGATE_MAX_BODY_BYTES`); the producer's too.
MAX_BODY_BYTES = 256 * 1024
MAX_PAYLOAD_DEPTH = 254  # orjson writes no deeper nesting


class InputRule(Enum):
    """Which kind of rule an input breaks."""

    INVALID = "invalid"  # a value out of its range or form
    PRIORITY = "priority"  # not a priority 0-9 or a named alias
    CONFLICT = "conflict"  # two inputs that exclude each other, both given
    NOT_JSON = "not_json"  # a value JSON cannot carry (NaN, +-inf, a datetime): no body has it
    TOO_LARGE = "too_large"  # a payload over the body limit


class MessageInputError(ValueError):
    """The input of a publish breaks a rule; nothing was sent. `field` names the input, `rule`
    the kind of rule it breaks."""

    def __init__(self, message: str, field: str, rule: InputRule = InputRule.INVALID) -> None:
        super().__init__(message)
        self.field = field
        self.rule = rule


def envelope_for(
    topology: Topology,
    spec: QueueSpec,
    payload: Any,
    *,
    priority: object = None,
    delay_seconds: object = None,
    deliver_at: object = None,
    headers: object = None,
    message_id: object = None,
    partition_key: object = None,
    tenant: object = None,
) -> Envelope:
    """One message for the queue `spec`, or `MessageInputError` for the first rule its input
    breaks (in the order of the HTTP body's fields). A delay of 0 means now; the payload is
    checked when it is written (`Publisher`)."""
    delay = _delay(delay_seconds)
    due = _deliver_at(deliver_at)
    checked_headers = _headers(headers)
    checked_id = _message_id(message_id)
    key = _text(partition_key, "partition_key", MAX_PARTITION_KEY)
    checked_tenant = _text(tenant, "tenant", MAX_TENANT)
    try:
        level = parse_priority(priority)
    except PriorityError as exc:
        raise MessageInputError(str(exc), "priority", InputRule.PRIORITY) from None
    enqueued_at = now()
    return Envelope(
        queue=spec.name,
        payload=payload,
        priority=level,
        message_id=checked_id or new_message_id(),
        enqueued_at=enqueued_at,
        deliver_at=_due_time(topology, enqueued_at, delay, due),
        headers=checked_headers,
        partition_key=key,
        tenant=checked_tenant,
    )


def _delay(value: object) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise MessageInputError("the delay must be a number of seconds", "delay_seconds")
    if value < 0:
        raise MessageInputError("the delay must be at least 0 seconds", "delay_seconds")
    return float(value)


def _deliver_at(value: object) -> datetime | None:
    if value is None:
        return None
    if not isinstance(value, datetime) or value.utcoffset() is None:
        # A time without an offset means a different moment on every machine.
        raise MessageInputError("deliver_at must be a datetime with a time zone", "deliver_at")
    return value


def _due_time(
    topology: Topology, enqueued_at: datetime, delay: float | None, deliver_at: datetime | None
) -> datetime | None:
    """When the message is due: None for now. At most the delay ladder's reach ahead; a
    `deliver_at` in the past is due now (and keeps its time)."""
    if delay is None and deliver_at is None:
        return None  # the common case; the ladder's maximum costs a little to compute
    if delay is not None and deliver_at is not None:
        raise MessageInputError(
            "give a delay or deliver_at, not both", "deliver_at", InputRule.CONFLICT
        )
    max_seconds = topology.ladder.max_delay_ms / 1000
    if delay is not None:
        if delay > max_seconds:
            raise MessageInputError(
                f"the delay exceeds the maximum of {max_seconds:.0f} s", "delay_seconds"
            )
        return enqueued_at + timedelta(seconds=delay) if delay else None
    assert deliver_at is not None
    if (deliver_at - enqueued_at).total_seconds() > max_seconds:
        raise MessageInputError(f"deliver_at is more than {max_seconds:.0f} s ahead", "deliver_at")
    return deliver_at


def _headers(headers: object) -> dict[str, HeaderValue]:
    """The producer's own headers: scalar values, names that cannot pass for the broker's or
    bandgate's (`x-`), and few and short enough to stay far below an AMQP frame."""
    if headers is None:
        return {}
    if not isinstance(headers, Mapping):
        raise MessageInputError("headers must be a mapping of names to values", "headers")
    if len(headers) > MAX_HEADERS:
        raise MessageInputError(f"at most {MAX_HEADERS} headers", "headers")
    checked: dict[str, HeaderValue] = {}
    for name, value in headers.items():
        if not isinstance(name, str) or not HEADER_NAME.fullmatch(name):
            raise MessageInputError(
                f"header name {str(name)[:40]!r} is invalid: 1-128 letters, digits, '_', '.', '-'",
                "headers",
            )
        if name.lower().startswith("x-"):
            raise MessageInputError(
                f"header name {name!r}: names starting with 'x-' are reserved "
                f"for the broker and bandgate ({HEADER_PREFIX}*)",
                "headers",
            )
        if not isinstance(value, str | int | float):  # bool is an int
            raise MessageInputError(
                f"header {name!r} must be a string, number or boolean", f"headers.{name}"
            )
        _header_is_json(name, value)
        if isinstance(value, str) and len(value) > MAX_HEADER_VALUE:
            raise MessageInputError(
                f"header {name!r} is longer than {MAX_HEADER_VALUE} characters", "headers"
            )
        if isinstance(value, int) and not -INT64 <= value < INT64:
            raise MessageInputError(
                f"header {name!r} is outside the 64-bit integer range", "headers"
            )
        checked[name] = value
    return checked


def _header_is_json(name: str, value: str | int | float) -> None:
    """A header an HTTP body could hold: RabbitMQ closes the whole connection (541) on a NaN
    or infinite double, and a string with a lone surrogate cannot be written as UTF-8."""
    if isinstance(value, float) and not math.isfinite(value):
        raise MessageInputError(
            f"header {name!r} is {value}: JSON has no such number", f"headers.{name}", _NOT_JSON
        )
    if isinstance(value, str) and not value.isascii():
        try:
            value.encode()
        except UnicodeEncodeError:
            raise MessageInputError(
                f"header {name!r} is not valid UTF-8 text", f"headers.{name}", _NOT_JSON
            ) from None


_NOT_JSON = InputRule.NOT_JSON


def payload_body(payload: Any, max_bytes: int = MAX_BODY_BYTES) -> bytes:
    """The payload as the JSON a consumer will read, or `MessageInputError`: not JSON data
    (`NOT_JSON`; nested deeper than `MAX_PAYLOAD_DEPTH` is `INVALID`, as the gateway answers
    such a body), or more than `max_bytes` bytes of it (`TOO_LARGE`).

    JSON data is what reads back equal: orjson writes NaN as null, a datetime or a UUID as a
    string and a tuple as a list, all of which a consumer would get as something else."""
    try:
        body = orjson.dumps(payload, option=orjson.OPT_PASSTHROUGH_DATETIME)
    except TypeError as exc:
        if _deeper_than(payload, MAX_PAYLOAD_DEPTH):
            raise MessageInputError(
                f"the payload nests deeper than {MAX_PAYLOAD_DEPTH} levels", "payload"
            ) from None
        raise MessageInputError(
            f"the payload is not JSON data: {exc}", "payload", _NOT_JSON
        ) from None
    if len(body) > max_bytes:
        raise MessageInputError(
            f"the payload is {len(body)} bytes of JSON, over the limit of {max_bytes} bytes",
            "payload",
            InputRule.TOO_LARGE,
        )
    if orjson.loads(body) != payload:
        raise MessageInputError(
            "the payload is not JSON data: it would not read back as it was given (NaN, "
            "infinity, a tuple, a date or another type JSON has not)",
            "payload",
            _NOT_JSON,
        )
    return body


def _deeper_than(value: Any, limit: int) -> bool:
    """Whether containers nest more than `limit` levels (without recursion: it may be deep)."""
    pending: list[tuple[Any, int]] = [(value, 0)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, dict | list | tuple):
            if depth >= limit:
                return True
            children = item.values() if isinstance(item, dict) else item
            pending.extend((child, depth + 1) for child in children)
    return False


def _message_id(value: object) -> str | None:
    message_id = _text(value, "message_id", MAX_ID_LENGTH)
    if message_id is not None and len(message_id.encode()) > MAX_ID_BYTES:
        raise MessageInputError(
            f"message_id must be at most {MAX_ID_BYTES} bytes in UTF-8", "message_id"
        )
    return message_id


def _text(value: object, field: str, max_length: int) -> str | None:
    """A printable string of 1 to `max_length` characters, or None."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise MessageInputError(f"{field} must be a string", field)
    if not 1 <= len(value) <= max_length:
        raise MessageInputError(f"{field} must be 1-{max_length} characters long", field)
    if not value.isprintable():
        raise MessageInputError(f"{field} must contain printable characters only", field)
    return value
