"""The copies a worker publishes: a retry into the delay ladder, a dead letter into the DLQ.

Both start from the delivery as received: same message id, priority, enqueue time, partition
key, body bytes and producer headers. The broker's own headers are dropped: a copy that kept its
`x-death` would be dropped silently by the broker's dead-letter cycle detection when it passes
the same delay levels again, and one that kept `x-delivery-count` would look like a crash loop.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import aio_pika

from bandgate.consumers.message import Message
from bandgate.consumers.outcome import DeadLetter, RetryLater
from bandgate.topology import wire
from bandgate.topology.model import Band
from bandgate.topology.wire import (
    ATTEMPTS,
    FAILED_AT,
    FAILURE_CAUSE,
    FAILURE_REASON,
    FAILURE_TYPE,
    ORIGINAL_BAND,
    RETRY_REASON,
    carried_headers,
)


@dataclass(frozen=True)
class _Copy(wire.Envelope):
    """An envelope that republishes the original body bytes instead of re-encoding them."""

    raw_body: bytes = b""

    def body(self) -> bytes:
        return self.raw_body


def retry_envelope(
    body: bytes,
    headers: Mapping[str, Any] | None,
    message: Message,
    band: Band,
    retry: RetryLater,
    now: datetime,
) -> wire.Envelope:
    """The retry of `message` as the publisher's input: attempt+1, due after the delay.

    Its priority is raised to the band's lowest when the broker had promoted it (aging), so a
    retry goes back to the band it had reached rather than to the back of a colder one.
    """
    extra = carried_headers(headers)
    extra[RETRY_REASON] = retry.reason
    return _Copy(
        queue=message.queue,
        payload=message.payload,
        priority=max(message.priority, band.low),
        message_id=message.message_id,
        enqueued_at=message.enqueued_at,
        deliver_at=now + timedelta(seconds=retry.delay) if retry.delay > 0 else None,
        partition_key=message.partition_key,
        attempt=retry.attempt,
        extra_headers=extra,
        raw_body=body,
    )


def dead_letter_message(
    body: bytes,
    headers: Mapping[str, Any] | None,
    content_type: str | None,
    message: Message,
    dead: DeadLetter,
    now: datetime,
) -> aio_pika.Message:
    """The copy for the dead-letter queue, with headers saying why it was given up on."""
    extra = carried_headers(headers)
    extra[FAILURE_REASON] = dead.reason
    extra[FAILURE_CAUSE] = dead.cause
    if dead.error_type is not None:
        extra[FAILURE_TYPE] = dead.error_type
    extra[ATTEMPTS] = message.attempt
    extra[ORIGINAL_BAND] = message.band
    extra[FAILED_AT] = wire.to_millis(now)
    envelope = wire.Envelope(
        queue=message.queue,
        payload=None,
        priority=message.priority,
        message_id=message.message_id,
        enqueued_at=message.enqueued_at,
        partition_key=message.partition_key,
        attempt=message.attempt,
        extra_headers=extra,
    )
    # A dead-letter queue keeps the order its messages failed in, on brokers that order quorum
    # queues by priority too; the priority travels in a header.
    copy = wire.encode(envelope, body=body, broker_priority=False)
    if content_type:
        copy.content_type = content_type  # a malformed message keeps what it claimed to be
    return copy
