"""The wire format: how a bandgate message looks as an AMQP message, both ways.

The gateway, Python producers and the consumers' retry path all build messages here, and the
consumers read them back here, so a header name is spelled once.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import aio_pika
import orjson
from aiormq import spec

HeaderValue = str | int | float | bool

CONTENT_TYPE = "application/json"
PERSISTENT = 2  # AMQP delivery mode: the broker keeps the message on disk
HEADER_PREFIX = "x-bandgate-"
ENQUEUED_AT = "x-bandgate-enqueued-at"  # milliseconds since the epoch, UTC
DELIVER_AT = "x-bandgate-deliver-at"  # milliseconds since the epoch, UTC
PARTITION_KEY = "x-bandgate-partition-key"
# Whose message it is, among the many tenants sharing a queue: a fair band keeps a tenant that
# floods out of the others' way (`core.fairness`). Copies (retries, dead letters) keep it.
TENANT = "x-bandgate-tenant"
# What a sharded band hashes to pick the shard: the partition key, or the message id when there
# is none. Every message carries it, so a band can be sharded without changing any publisher.
SHARD_KEY = "x-bandgate-shard-key"
ATTEMPT = "x-bandgate-attempt"  # 1 for the first delivery; retries count up
# The priority of a message published without the AMQP `priority` property: the messages of
# ordered and strictly serial queues, which brokers that order quorum queues by priority
# (RabbitMQ 4.x) would otherwise reorder as soon as a backlog forms.
PRIORITY = "x-bandgate-priority"
QUEUE = "x-bandgate-queue"
# Which generation of its message id a message is: absent (0) for a first publish, the replace's
# time in milliseconds since the epoch for a replacement (`core.ledger`). Copies keep it.
GENERATION = "x-bandgate-generation"
TRACE_HEADERS = ("traceparent", "tracestate")

# Dead-letter headers: why, how often, from which band and when a message was given up on.
FAILURE_REASON = "x-bandgate-failure-reason"  # "ValueError: ..." (cut to 1000 characters)
# rejected | max-attempts | delivery-limit | malformed | skipped (an ordered queue's `skip`)
FAILURE_CAUSE = "x-bandgate-failure-cause"
FAILURE_TYPE = "x-bandgate-failure-type"  # the exception's class name, when there was one
ATTEMPTS = "x-bandgate-attempts"  # attempts made, counting the last one
ORIGINAL_BAND = "x-bandgate-original-band"  # the band it was consumed from the last time
FAILED_AT = "x-bandgate-failed-at"  # milliseconds since the epoch, UTC
# On a retry: why the previous attempt failed (shown in the management UI while it waits).
RETRY_REASON = "x-bandgate-retry-reason"
REPLAYS = "x-bandgate-replays"  # how often a message was replayed from its dead-letter queue

# Quorum queues count deliveries in this header; a copy that kept it would look like a message
# that crashed workers.
DELIVERY_COUNT = "x-delivery-count"
# The deliveries the broker had counted when an HTTP receiver gave the message back as a copy
# (`Settler.hand_back`): RabbitMQ before 4.3 counts every return, a graceful one too, so a
# shutdown (or a client that left) gives back a copy, whose own count starts from 0, carrying
# the earlier count here. A message's delivery count is the sum of the two.
DELIVERIES_BEFORE = "x-bandgate-deliveries"

# Headers the broker adds when it dead-letters. A republish must drop them: a message that
# goes through the same delay levels again with its old x-death is dropped silently by the
# broker's dead-letter cycle detection (seen on 3.10.8).
BROKER_DEATH_HEADERS = (
    "x-death",
    "x-first-death-queue",
    "x-first-death-reason",
    "x-first-death-exchange",
    "x-last-death-queue",
    "x-last-death-reason",
    "x-last-death-exchange",
)


DEAD_LETTER_HEADERS = (
    FAILURE_REASON,
    FAILURE_CAUSE,
    FAILURE_TYPE,
    ATTEMPTS,
    ORIGINAL_BAND,
    FAILED_AT,
    RETRY_REASON,
)

# Headers `encode` writes from the envelope, and those that describe one delivery only.
_REWRITTEN = frozenset(
    (
        ENQUEUED_AT,
        DELIVER_AT,
        PARTITION_KEY,
        ATTEMPT,
        QUEUE,
        DELIVERY_COUNT,
        DELIVERIES_BEFORE,
        *BROKER_DEATH_HEADERS,
        *DEAD_LETTER_HEADERS,
    )
)


def now() -> datetime:
    return datetime.now(UTC)


def new_message_id() -> str:
    """A random (version 4) UUID as text, like `str(uuid.uuid4())` at under half the cost:
    the gateway makes one per message, and `UUID.__str__` dominated that."""
    raw = bytearray(os.urandom(16))
    raw[6] = raw[6] & 0x0F | 0x40  # version 4
    raw[8] = raw[8] & 0x3F | 0x80  # RFC 4122 variant
    h = raw.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def to_millis(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


def from_millis(millis: int) -> datetime:
    return datetime.fromtimestamp(millis / 1000, UTC)


def moment_text(moment: datetime) -> str:
    """A moment as the HTTP API writes it: RFC 3339 in UTC to the millisecond, the precision
    a message carries its enqueue time in (e.g. 2030-01-01T12:00:00.123Z)."""
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass(frozen=True)
class Envelope:
    """One message as bandgate handles it, before routing."""

    queue: str
    payload: Any
    priority: int
    message_id: str = field(default_factory=new_message_id)
    enqueued_at: datetime = field(default_factory=now)
    deliver_at: datetime | None = None
    headers: Mapping[str, HeaderValue] = field(default_factory=dict)
    partition_key: str | None = None
    tenant: str | None = None
    attempt: int = 1
    extra_headers: Mapping[str, Any] = field(default_factory=dict)

    def body(self) -> bytes:
        return orjson.dumps(self.payload)

    @property
    def shard_key(self) -> str:
        """Messages with one shard key land in one shard of a sharded band."""
        return self.message_id if self.partition_key is None else self.partition_key

    def delay_ms(self, at: datetime | None = None) -> float:
        """How long from `at` (default now) until the message is due; 0 when it is due."""
        if self.deliver_at is None:
            return 0.0
        return max(0.0, (self.deliver_at - (at or now())).total_seconds() * 1000)


def encode_properties(envelope: Envelope, *, broker_priority: bool = True) -> spec.Basic.Properties:
    """The AMQP properties of a persistent message carrying the envelope (whose body is
    `envelope.body()`). Without `broker_priority`, the priority travels in a header only, so
    the broker keeps the messages in publish order whatever their priorities.

    The publisher sends these with the body straight to the channel: going through an
    `aio_pika.Message` builds the same properties again for every message.
    """
    headers: dict[str, Any] = dict(envelope.headers)
    headers.update(envelope.extra_headers)
    headers[ENQUEUED_AT] = to_millis(envelope.enqueued_at)
    headers[QUEUE] = envelope.queue
    headers[ATTEMPT] = envelope.attempt
    if envelope.deliver_at is not None:
        headers[DELIVER_AT] = to_millis(envelope.deliver_at)
    if envelope.partition_key is not None:
        headers[PARTITION_KEY] = envelope.partition_key
    if envelope.tenant is not None:
        headers[TENANT] = envelope.tenant
    headers[SHARD_KEY] = envelope.shard_key
    for name in (*BROKER_DEATH_HEADERS, DELIVERY_COUNT):
        headers.pop(name, None)
    if broker_priority:
        headers.pop(PRIORITY, None)
    else:
        headers[PRIORITY] = envelope.priority
    return spec.Basic.Properties(
        content_type=CONTENT_TYPE,
        delivery_mode=PERSISTENT,
        priority=envelope.priority if broker_priority else None,
        message_id=envelope.message_id,
        timestamp=envelope.enqueued_at,
        headers=headers,
    )


def encode(
    envelope: Envelope, body: bytes | None = None, *, broker_priority: bool = True
) -> aio_pika.Message:
    """A persistent AMQP message carrying the envelope; `body` saves re-serialising.

    Built from `encode_properties`, so the format is written down once.
    """
    properties = encode_properties(envelope, broker_priority=broker_priority)
    return aio_pika.Message(
        body=envelope.body() if body is None else body,
        content_type=properties.content_type,
        delivery_mode=properties.delivery_mode,
        priority=properties.priority,
        message_id=properties.message_id,
        timestamp=properties.timestamp,
        headers=properties.headers,
    )


def user_headers(headers: Mapping[str, Any]) -> dict[str, Any]:
    """The producer's own headers of a received message (bandgate's and the broker's removed)."""
    return {
        name: value
        for name, value in headers.items()
        if not name.startswith(HEADER_PREFIX)
        and name not in BROKER_DEATH_HEADERS
        and name != DELIVERY_COUNT
        and name not in TRACE_HEADERS
    }


def carried_headers(headers: Mapping[str, Any] | None) -> dict[str, Any]:
    """The headers a copy keeps: the producer's, trace context, anything not per-delivery."""
    return {name: value for name, value in (headers or {}).items() if name not in _REWRITTEN}


def read_priority(amqp_priority: int | None, headers: Mapping[str, Any]) -> int | None:
    """A received message's priority: its `PRIORITY` header, else the AMQP property."""
    carried = header_int(headers.get(PRIORITY))
    return amqp_priority if carried is None else carried


def header_int(value: object) -> int | None:
    """An integer header as any client may have written it (int, numeric string or bytes)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str | bytes):
        try:
            return int(value)
        except ValueError:
            return None
    return None


def header_text(value: object) -> str | None:
    """A text header; AMQP clients may send it as bytes."""
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return str(value)


def decode_body(body: bytes) -> Any:
    return orjson.loads(body)
