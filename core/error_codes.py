"""Every error code bandgate answers with, in one table: its HTTP status, what a client may
conclude from it (`Kind`), and what it means.

The gateway's and the HTTP receivers' routes raise these (`ApiError.of`), the Python
producer's failure classes take their `code` from them (`core.publish_outcomes`), the OpenAPI
document's error responses are built from them (`gateway.openapi`, `pull.openapi`), and
`tests/unit/test_error_codes.py` checks that every code raised anywhere is here and that the
docs' error tables say what this table says; docs/reference/errors.md prints this table
(`python -m tools.docs_reference`). A new code is added here first.

The input rules of a publish (`topology.publish_input`) name the rule a message breaks
(`InputRule`), not a code: `for_rule` is the one place a rule becomes a code.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from bandgate.topology.publish_input import InputRule


class Kind(StrEnum):
    """What a client may conclude from an error: whether what it asked for may have happened."""

    CLIENT_ERROR = "client error"  # refused as it is: nothing happened; resent unchanged, it fails
    NOT_ENQUEUED = "not enqueued"  # nothing happened (no message in any queue): retry later
    OUTCOME_UNKNOWN = "outcome unknown"  # it may have happened: retry with the same message_id


@dataclass(frozen=True)
class ErrorCode:
    """One error code. `status` is None where the code has no status of its own (a line of a
    streamed answer, or a status another library chose)."""

    code: str
    status: int | None
    kind: Kind
    meaning: str

    def __str__(self) -> str:
        return self.code


REGISTRY: dict[str, ErrorCode] = {}


def _code(code: str, status: int | None, kind: Kind, meaning: str) -> ErrorCode:
    assert code not in REGISTRY, code
    REGISTRY[code] = error = ErrorCode(code, status, kind, meaning)
    return error


_CLIENT, _NOT_ENQUEUED, _UNKNOWN = Kind.CLIENT_ERROR, Kind.NOT_ENQUEUED, Kind.OUTCOME_UNKNOWN

# 400-431: the request, as it is.
MALFORMED_JSON = _code(
    "malformed_json",
    400,
    _CLIENT,
    "the body is not JSON, not UTF-8, holds an integer outside [-2^63, 2^64), or nests too deeply "
    "(from the Python producer: a payload or header JSON cannot carry, such as NaN or a datetime)",
)
MALFORMED_PATH = _code(
    "malformed_path",
    400,
    _CLIENT,
    "a percent-escape in the path or the query is not UTF-8 (as for a body)",
)
UNAUTHORIZED = _code("unauthorized", 401, _CLIENT, "no bearer token")
INVALID_TOKEN = _code("invalid_token", 401, _CLIENT, "the bearer token is not valid")
FORBIDDEN = _code("forbidden", 403, _CLIENT, "the token lacks the scope the operation needs")
CROSS_SITE_REQUEST = _code(
    "cross_site_request",
    403,
    _CLIENT,
    "a browser sent it from another site (its Origin or Sec-Fetch-Site says so): refused, "
    "so that no web page can drive the gateway",
)
HOST_NOT_ALLOWED = _code(
    "host_not_allowed",
    403,
    _CLIENT,
    "the Host header names a host the gateway does not serve (BANDGATE_ALLOWED_HOSTS; "
    "bandgate dev serves its own address only): refused against DNS rebinding",
)
UNKNOWN_QUEUE = _code("unknown_queue", 404, _CLIENT, "the queue is not in the topology")
NOT_FOUND = _code("not_found", 404, _CLIENT, "no such route or file")
METHOD_NOT_ALLOWED = _code("method_not_allowed", 405, _CLIENT, "the route has no such method")
REQUEST_TIMEOUT = _code(
    "request_timeout", 408, _CLIENT, "the request head took longer than the keep-alive timeout"
)
DLQ_BUSY = _code(
    "dlq_busy",
    409,
    _NOT_ENQUEUED,
    "another dead-letter operation on this queue held it for too long; retry",
)
LEASE_EXPIRED = _code(
    "lease_expired",
    410,
    _CLIENT,
    "no lease holds this receipt any more (its visibility timeout lapsed and the message is "
    "visible again, it was settled already, or the gateway process restarted)",
)
LEASE_LOST = _code(
    "lease_lost",
    410,
    _CLIENT,
    "the gateway process that leased the message is gone, and the broker gave the message "
    "back to its queue",
)
BODY_TOO_LARGE = _code("body_too_large", 413, _CLIENT, "the body is over the gateway's limit")
BATCH_TOO_LARGE = _code("batch_too_large", 413, _CLIENT, "the batch holds too many items")
MESSAGE_TOO_LARGE = _code(
    "message_too_large",
    413,
    _CLIENT,
    "the message's headers and properties exceed the broker's AMQP frame size",
)
UNSUPPORTED_MEDIA_TYPE = _code(
    "unsupported_media_type", 415, _CLIENT, "send Content-Type: application/json"
)
MISSING_FIELD = _code("missing_field", 422, _CLIENT, "a required field is missing")
INVALID_FIELD = _code("invalid_field", 422, _CLIENT, "a field's value breaks a rule")
UNKNOWN_FIELD = _code("unknown_field", 422, _CLIENT, "a field that is not known")
INVALID_PRIORITY = _code(
    "invalid_priority", 422, _CLIENT, "the priority is not 0-9 or a named alias"
)
CONFLICTING_FIELDS = _code(
    "conflicting_fields", 422, _CLIENT, "two fields that exclude each other are both given"
)
INVALID_BODY = _code("invalid_body", 422, _CLIENT, "the body is JSON but not of the right form")
DUPLICATE_MESSAGE_ID = _code(
    "duplicate_message_id",
    422,
    _CLIENT,
    "a batch names one message_id twice: the later ones fail",
)
MESSAGE_REQUIRED = _code(
    "message_required", 422, _CLIENT, "an escalate without the payload (the message is sent again)"
)
INVALID_RECEIPT = _code(
    "invalid_receipt", 422, _CLIENT, "not a receipt this API issued, or not for this queue"
)
HEADERS_TOO_LARGE = _code(
    "headers_too_large", 431, _CLIENT, "too many request headers, or too many bytes of them"
)
CLIENT_DISCONNECTED = _code(
    "client_disconnected",
    499,
    _CLIENT,
    "the client went away and the operation stopped (for the access log: nobody reads it)",
)
# 429: slow down. Nothing happened.
RATE_LIMITED = _code("rate_limited", 429, _NOT_ENQUEUED, "over the token's rate (in messages)")
QUEUE_FULL = _code(
    "queue_full",
    429,
    _NOT_ENQUEUED,
    "the band is at its max-length: the broker nacked the message",
)
TOO_MANY_AUTH_FAILURES = _code(
    "too_many_auth_failures",
    429,
    _NOT_ENQUEUED,
    "too many failed authentications from this address",
)
TOO_MANY_LEASES = _code(
    "too_many_leases", 429, _NOT_ENQUEUED, "the token holds as many leases as it may"
)
TOO_MANY_RECEIVES = _code(
    "too_many_receives",
    429,
    _NOT_ENQUEUED,
    "the token (or all tokens together) has as many receives open in this gateway process as "
    "it may (BANDGATE_PULL_MAX_WAITING_PER_TOKEN)",
)
TOO_MANY_DLQ_OPERATIONS = _code(
    "too_many_dlq_operations",
    429,
    _NOT_ENQUEUED,
    "the token runs as many dead-letter operations (list, replay, purge) in this gateway "
    "process as it may (BANDGATE_MAX_DLQ_OPERATIONS_PER_TOKEN); nothing was done",
)
TOO_MANY_TOMBSTONES = _code(
    "too_many_tombstones",
    429,
    _NOT_ENQUEUED,
    "the token wrote as many tombstones (cancels, replaces, escalates) in the ledger's "
    "retention window as it may (BANDGATE_MAX_TOMBSTONES_PER_TOKEN); nothing was written",
)
# 500 and 503: the gateway or the broker.
INTERNAL_ERROR = _code(
    "internal_error",
    500,
    _UNKNOWN,
    "an unexpected failure; the error's request_id (also in X-Request-Id) finds it in the "
    "gateway's log",
)
BROKER_UNAVAILABLE = _code(
    "broker_unavailable", 503, _NOT_ENQUEUED, "not connected to the broker; nothing was sent"
)
BROKER_BLOCKED = _code(
    "broker_blocked",
    503,
    _NOT_ENQUEUED,
    "the broker blocks publishing (a memory or disk alarm); nothing was sent",
)
UNROUTABLE = _code(
    "unroutable",
    503,
    _NOT_ENQUEUED,
    "the broker returned the message: no binding matched (apply the topology)",
)
SERVER_BUSY = _code(
    "server_busy",
    503,
    _NOT_ENQUEUED,
    "the gateway process holds as many connections and requests as it may "
    "(BANDGATE_MAX_CONNECTIONS); nothing was done: retry",
)
NOT_READY = _code(
    "not_ready", 503, _NOT_ENQUEUED, "the broker is not connected or the topology not present"
)
CONFIRM_TIMEOUT = _code(
    "confirm_timeout",
    503,
    _UNKNOWN,
    "the message was sent and the broker did not confirm it in time",
)
CONFIRM_LOST = _code(
    "confirm_lost",
    503,
    _UNKNOWN,
    "the message was sent and its confirm was lost with the connection",
)
TOPOLOGY_MISSING = _code(
    "topology_missing",
    503,
    _UNKNOWN,
    "an exchange or queue is missing on the broker (apply the topology); messages in flight "
    "on the channel may or may not have been enqueued",
)
TOMBSTONE_NOT_WRITTEN = _code(
    "tombstone_not_written",
    503,
    _UNKNOWN,
    "the new generation was published but the tombstone was not, so older copies may still "
    "run; repeating the request is safe",
)
HOLDER_UNRESPONSIVE = _code(
    "holder_unresponsive",
    503,
    _UNKNOWN,
    "the gateway process holding the lease did not answer in time; try again",
)
# No status of their own.
HTTP_ERROR = _code(
    "http_error", None, _CLIENT, "another error of the HTTP framework, with its own status"
)
DLQ_FAILED = _code(
    "dlq_failed",
    None,
    _NOT_ENQUEUED,
    "a streamed dead-letter replay stopped on a broker error (the last line of its stream)",
)

_RULES: dict[InputRule, ErrorCode] = {
    InputRule.INVALID: INVALID_FIELD,
    InputRule.PRIORITY: INVALID_PRIORITY,
    InputRule.CONFLICT: CONFLICTING_FIELDS,
    InputRule.NOT_JSON: MALFORMED_JSON,  # what the gateway answers a body holding NaN or 1e999
    InputRule.TOO_LARGE: BODY_TOO_LARGE,
}


def lookup(code: str) -> ErrorCode:
    """The registered code; KeyError names a code nobody registered."""
    try:
        return REGISTRY[code]
    except KeyError:
        raise KeyError(f"error code {code!r} is not in bandgate.core.error_codes") from None


def for_rule(rule: InputRule) -> ErrorCode:
    """The code a broken input rule of a publish is answered with."""
    return _RULES[rule]


def with_status(status: int) -> list[ErrorCode]:
    """The codes answered with `status`, in the table's order."""
    return [error for error in REGISTRY.values() if error.status == status]
