"""`Message`: what a handler receives, and how a delivery is read into one.

The wire format is spelled in `topology.wire`; this module only reads it back. The band is the
queue the message was consumed from, not the band of its priority: a message the broker
promoted by aging (cold -> warm) is handled as `warm`, with `promoted` set.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson

from bandgate.consumers.errors import MalformedMessage
from bandgate.core.protocol.deliveries import Delivered
from bandgate.topology import wire
from bandgate.topology.model import Band, QueueSpec
from bandgate.topology.priority import MAX_PRIORITY, MIN_PRIORITY


@dataclass(frozen=True, kw_only=True)
class Message:
    """One message as a handler sees it.

    `attempt` counts handler runs that ended in a retry (1 on the first run); `delivery_count`
    counts how often the broker got it back without an answer (a worker died or shut down).
    `headers` are the producer's own headers; bandgate's and the broker's are left out.
    """

    payload: Any
    queue: str
    band: str
    priority: int
    message_id: str
    attempt: int = 1
    headers: Mapping[str, Any] = field(default_factory=dict)
    partition_key: str | None = None
    tenant: str | None = None
    enqueued_at: datetime = field(default_factory=wire.now)
    redelivered: bool = False
    delivery_count: int = 0
    promoted: bool = False


def read_message(
    delivery: Delivered, spec: QueueSpec, band: Band, *, decode: bool = True
) -> Message:
    """The `Message` of a delivery from `band`'s queue; `MalformedMessage` when unreadable.

    With `decode=False` the payload is left as None: enough to dead-letter a malformed message.
    """
    headers: Mapping[str, Any] = delivery.headers or {}
    priority = read_priority(delivery, band)
    return Message(
        payload=_payload(delivery.body, delivery.content_type) if decode else None,
        queue=spec.name,
        band=band.name,
        priority=priority,
        message_id=delivery.message_id or _missing_id(delivery),
        attempt=max(1, wire.header_int(headers.get(wire.ATTEMPT)) or 1),
        headers=wire.user_headers(headers),
        partition_key=wire.header_text(headers.get(wire.PARTITION_KEY)),
        tenant=wire.header_text(headers.get(wire.TENANT)),
        enqueued_at=read_enqueued_at(delivery),
        redelivered=bool(delivery.redelivered),
        delivery_count=_delivery_count(headers),
        # Bands are contiguous ranges, hottest first: a priority below the band's range
        # belongs to a colder band, which the broker promoted it from.
        promoted=priority < band.low,
    )


def _delivery_count(headers: Mapping[str, Any]) -> int:
    """The broker's count of this copy's returns, plus what it had counted of the copies a
    shutdown gave back before (`wire.DELIVERIES_BEFORE`)."""
    counted = max(0, wire.header_int(headers.get(wire.DELIVERY_COUNT)) or 0)
    return counted + max(0, wire.header_int(headers.get(wire.DELIVERIES_BEFORE)) or 0)


def _payload(body: bytes, content_type: str | None) -> Any:
    # The wire format is JSON. A producer that sends anything else sent a message no retry can
    # fix; it is dead-lettered with its body and content type intact.
    if not _is_json(content_type):
        raise MalformedMessage(f"content type {content_type!r} is not {wire.CONTENT_TYPE}")
    try:
        return wire.decode_body(body)
    except orjson.JSONDecodeError as exc:
        raise MalformedMessage(f"the body is not valid JSON: {exc}") from None


def _is_json(content_type: str | None) -> bool:
    if not content_type:
        return True
    media_type = content_type.split(";", 1)[0].strip().lower()
    return media_type == wire.CONTENT_TYPE or media_type.endswith("+json")


def read_priority(delivery: Delivered, band: Band) -> int:
    """The priority of a delivery from `band`'s queue, or the band's lowest when a foreign
    producer left it out."""
    value = wire.read_priority(delivery.priority, delivery.headers or {})
    if value is None:
        return band.low
    return min(MAX_PRIORITY, max(MIN_PRIORITY, int(value)))


def _missing_id(delivery: Delivered) -> str:
    # Not a bandgate message: give it a stable id for logs and dead letters.
    return f"delivery-{delivery.delivery_tag}-{wire.new_message_id()}"


def read_enqueued_at(delivery: Delivered) -> datetime:
    """When the message was first published: bandgate's header, else the AMQP timestamp, else
    now (a foreign message without either)."""
    millis = _header_millis(delivery.headers or {})
    if millis is not None:
        return wire.from_millis(millis)
    timestamp = delivery.timestamp
    if timestamp is not None:
        return timestamp if timestamp.tzinfo else timestamp.replace(tzinfo=UTC)
    return wire.now()


def read_enqueued_millis(delivery: Delivered) -> float:
    """`read_enqueued_at` in milliseconds since the epoch, without a datetime for bandgate's
    own messages: the dispatcher ranks every delivery of a sharded band by it."""
    millis = _header_millis(delivery.headers or {})
    if millis is not None:
        return float(millis)
    return read_enqueued_at(delivery).timestamp() * 1000


def _header_millis(headers: Mapping[str, Any]) -> int | None:
    millis = headers.get(wire.ENQUEUED_AT)
    if isinstance(millis, int | float) and not isinstance(millis, bool):
        return int(millis)
    return None
