"""A dead letter as an operator sees it, and the envelope that replays it.

Pure: reads a DLQ message's properties and headers (the consumer library's failure headers, or
the broker's `x-death` when RabbitMQ dead-lettered it itself) and decides what a replay
publishes, so both are tested without a broker. `core.dead_letters` runs them on the broker.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from bandgate.topology import wire
from bandgate.topology.model import QueueSpec
from bandgate.topology.priority import MAX_PRIORITY, MIN_PRIORITY
from bandgate.topology.wire import (
    ATTEMPTS,
    FAILED_AT,
    FAILURE_CAUSE,
    FAILURE_REASON,
    FAILURE_TYPE,
    ORIGINAL_BAND,
    carried_headers,
)

REPLAYS = wire.REPLAYS


@dataclass(frozen=True)
class DeadLetter:
    """One message in a dead-letter queue, as an operator wants to see it.

    `cause` is the consumer library's (rejected, max-attempts, delivery-limit, malformed,
    skipped) or, for a message the broker dead-lettered itself, its x-death reason
    (delivery-limit, expired, maxlen, rejected). `age_seconds` is how long ago it was
    dead-lettered.
    """

    message_id: str
    reason: str | None
    cause: str | None
    error_type: str | None
    attempts: int | None
    original_band: str | None
    priority: int | None
    failed_at: datetime | None
    enqueued_at: datetime | None
    age_seconds: float | None
    replays: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "message_id": self.message_id,
            "reason": self.reason,
            "cause": self.cause,
            "error_type": self.error_type,
            "attempts": self.attempts,
            "original_band": self.original_band,
            "priority": self.priority,
            "failed_at": _iso(self.failed_at),
            "enqueued_at": _iso(self.enqueued_at),
            "age_seconds": self.age_seconds,
            "replays": self.replays,
        }


class DeadLetterMessage(Protocol):
    """The properties a DLQ message's record is read from: aio-pika's incoming message has
    them, and so has pamqp's `Basic.Properties` (the in-memory broker of `bandgate.testing`)."""

    @property
    def headers(self) -> Mapping[str, Any] | None: ...

    @property
    def message_id(self) -> str | None: ...

    @property
    def priority(self) -> int | None: ...

    @property
    def timestamp(self) -> datetime | None: ...


def read_dead_letter_message(
    spec: QueueSpec, message: DeadLetterMessage, now: datetime
) -> DeadLetter:
    """`read_dead_letter` of a DLQ message as a client received it."""
    return read_dead_letter(
        spec,
        message.headers,
        message_id=message.message_id,
        priority=message.priority,
        timestamp=message.timestamp,
        now=now,
    )


def read_dead_letter(
    spec: QueueSpec,
    headers: Mapping[str, Any] | None,
    *,
    message_id: str | None,
    priority: int | None,
    timestamp: datetime | None,
    now: datetime,
) -> DeadLetter:
    """The `DeadLetter` view of a DLQ message's properties and headers."""
    values: Mapping[str, Any] = headers or {}
    death = _last_death(values)
    reason = wire.header_text(values.get(FAILURE_REASON))
    cause = wire.header_text(values.get(FAILURE_CAUSE))
    band = wire.header_text(values.get(ORIGINAL_BAND))
    failed_at = _millis(values.get(FAILED_AT))
    if death is not None and cause is None:
        # Dead-lettered by the broker itself (a delivery limit, a TTL on a band without aging
        # above it, a length limit), not by a worker.
        death_reason, death_queue, death_time = death
        cause = death_reason.replace("_", "-")
        reason = f"dead-lettered by RabbitMQ from {death_queue or 'a queue'} ({death_reason})"
        if band is None and death_queue and death_queue.startswith(f"{spec.name}."):
            band = death_queue.removeprefix(f"{spec.name}.")
        failed_at = failed_at or death_time
    enqueued_at = _millis(values.get(wire.ENQUEUED_AT)) or _aware(timestamp)
    return DeadLetter(
        message_id=message_id or "",
        reason=reason,
        cause=cause,
        error_type=wire.header_text(values.get(FAILURE_TYPE)),
        attempts=wire.header_int(values.get(ATTEMPTS)) or wire.header_int(values.get(wire.ATTEMPT)),
        original_band=band,
        priority=wire.read_priority(priority, values),
        failed_at=failed_at,
        enqueued_at=enqueued_at,
        age_seconds=round((now - failed_at).total_seconds(), 3) if failed_at else None,
        replays=wire.header_int(values.get(REPLAYS)) or 0,
    )


def matches(record: DeadLetter, reason: str | None) -> bool:
    """True when `reason` is None or, case-insensitively, part of the cause, reason or type."""
    if not reason:
        return True
    wanted = reason.casefold()
    fields = (record.cause, record.reason, record.error_type)
    return any(wanted in value.casefold() for value in fields if value)


@dataclass(frozen=True)
class _Replayed(wire.Envelope):
    """An envelope that republishes the dead letter's body bytes as they are."""

    raw_body: bytes = b""

    def body(self) -> bytes:
        return self.raw_body


def replay_priority(spec: QueueSpec, record: DeadLetter) -> int:
    """The priority to republish with, so that the message lands in its original band.

    A message the broker promoted by aging was handled in a hotter band than its priority's;
    its priority is raised into that band, as a retry does. Without a known band, its own
    priority decides (the band's lowest when it has none).
    """
    band = None
    if record.original_band is not None:
        band = next((b for b in spec.bands if b.name == record.original_band), None)
    if record.priority is None:
        return band.low if band is not None else spec.bands[-1].low
    priority = min(MAX_PRIORITY, max(MIN_PRIORITY, record.priority))
    if band is None:
        return priority
    return min(band.high, max(band.low, priority))


def replay_envelope(
    spec: QueueSpec,
    record: DeadLetter,
    body: bytes,
    headers: Mapping[str, Any] | None,
    content_type: str | None,
) -> wire.Envelope | str:
    """The envelope a replay publishes, or why this message cannot be replayed.

    Same message id, body bytes, producer headers, partition key and enqueue time; attempt 1;
    the failure headers and the broker's death headers dropped (a copy that kept `x-death`
    could be dropped by the broker's dead-letter cycle detection); the replay counted.
    """
    if not _is_json(content_type):
        return (
            f"content type {content_type!r} is not {wire.CONTENT_TYPE}: replaying would "
            "relabel it; consume it from the dead-letter queue instead"
        )
    values: Mapping[str, Any] = headers or {}
    extra = carried_headers(values)
    extra[REPLAYS] = record.replays + 1
    return _Replayed(
        queue=spec.name,
        payload=None,
        priority=replay_priority(spec, record),
        message_id=record.message_id or wire.new_message_id(),
        enqueued_at=record.enqueued_at or wire.now(),
        partition_key=wire.header_text(values.get(wire.PARTITION_KEY)),
        attempt=1,
        extra_headers=extra,
        raw_body=body,
    )


def _is_json(content_type: str | None) -> bool:
    if not content_type:
        return True
    media_type = content_type.split(";", 1)[0].strip().lower()
    return media_type == wire.CONTENT_TYPE or media_type.endswith("+json")


def _last_death(headers: Mapping[str, Any]) -> tuple[str, str | None, datetime | None] | None:
    """(reason, queue, time) of the most recent broker dead-lettering, if any."""
    deaths = headers.get("x-death")
    if isinstance(deaths, list | tuple) and deaths and isinstance(deaths[0], Mapping):
        latest = deaths[0]  # the broker keeps the most recent first
        reason = wire.header_text(latest.get("reason"))
        if reason:
            when = latest.get("time")
            moment = _aware(when) if isinstance(when, datetime) else None
            return reason, wire.header_text(latest.get("queue")), moment
    reason = wire.header_text(headers.get("x-first-death-reason"))
    if reason:
        return reason, wire.header_text(headers.get("x-first-death-queue")), None
    return None


def _millis(value: object) -> datetime | None:
    number = wire.header_int(value)
    return wire.from_millis(number) if number is not None else None


def _aware(moment: datetime | None) -> datetime | None:
    if moment is None:
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _iso(moment: datetime | None) -> str | None:
    return moment.isoformat() if moment else None


__all__ = [
    "REPLAYS",
    "DeadLetter",
    "DeadLetterMessage",
    "matches",
    "read_dead_letter",
    "read_dead_letter_message",
    "replay_envelope",
    "replay_priority",
]
