"""The settlement: carrying a decided outcome out on the broker. Republish, ack, give back.

An `Ack` is acked. A `RetryLater` or `DeadLetter` is published as a copy (into the delay ladder
or the dead-letter queue), confirmed, and only then is the original acked, so a failure anywhere
on this path can duplicate a message but never lose one: when the copy is not confirmed, the
original stays unacked and `Settler.settle` says so (`Settled.UNCONFIRMED`); the runner gives it
back to its band. A `GiveBack` is given back (`Settler.give_back`: nack or reject, with
requeue). A `Tombstoned` copy is acked; a consumer that dedupes records an `Ack`ed id in the
tombstone ledger before the ack (`record_handled`).

The copies start from the delivery as received: same message id, priority, enqueue time,
partition key, body bytes and producer headers. The broker's own headers are dropped: a copy
that kept its `x-death` would be dropped silently by the broker's dead-letter cycle detection
when it passes the same delay levels again, and one that kept `x-delivery-count` would look
like a crash loop. What the copy says (the delay, clamped to the ladder; the cause) was decided
before (`bandgate.consumers.decision`); nothing here decides.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import aio_pika
import aiormq
from aio_pika.exceptions import ChannelInvalidStateError, MessageProcessError

from bandgate.consumers.decision import (
    Ack,
    DeadLetter,
    GiveBack,
    Outcome,
    RetryLater,
    Tombstoned,
    outcome_name,
)
from bandgate.consumers.message import Message
from bandgate.core.ledger import generation_of, handled
from bandgate.core.ledger_follower import LedgerFollower
from bandgate.core.protocol.acks import AckWriter
from bandgate.core.protocol.deliveries import Delivered, Incoming
from bandgate.core.publishing import Publisher, PublishFailure
from bandgate.topology import wire
from bandgate.topology.model import Band
from bandgate.topology.wire import (
    ATTEMPTS,
    DELIVERIES_BEFORE,
    FAILED_AT,
    FAILURE_CAUSE,
    FAILURE_REASON,
    FAILURE_TYPE,
    ORIGINAL_BAND,
    RETRY_REASON,
    carried_headers,
)

log = logging.getLogger(__name__)

# What settling can fail with once the channel a delivery came on is gone. The broker has
# then returned the message to its band already; it will be delivered again.
_CHANNEL_GONE = (
    ChannelInvalidStateError,
    MessageProcessError,
    aiormq.exceptions.AMQPError,
    ConnectionError,
    RuntimeError,
)


class Settled(enum.Enum):
    """How settling a delivery ended."""

    ACKED = "acked"
    CHANNEL_GONE = "channel gone"  # not acked: the broker has it back and delivers it again
    UNCONFIRMED = "unconfirmed"  # its copy was not confirmed: not acked, give it back


class Settler:
    def __init__(
        self,
        publisher: Publisher,
        clock: Callable[[], datetime] = wire.now,
        acks: AckWriter | None = None,
    ) -> None:
        self.publisher = publisher
        self.clock = clock
        self.acks = acks or AckWriter()

    async def settle(
        self,
        delivery: Delivered,
        message: Message,
        band: Band,
        outcome: Outcome,
        *,
        ledger: LedgerFollower | None = None,
    ) -> Settled:
        """Carry out `outcome`: publish its copy (confirmed), then ack; with `ledger`, an `Ack`
        is recorded there as handled first (a consumer that dedupes)."""
        assert not isinstance(outcome, GiveBack), "a GiveBack is given back, not settled"
        if ledger is not None and isinstance(outcome, Ack):
            await record_handled(ledger, message, delivery.headers)
        if not isinstance(outcome, Ack | Tombstoned):
            try:
                await self._publish_copy(delivery, message, band, outcome)
            except PublishFailure as exc:
                log.error(
                    "could not publish the %s copy of message %s (%s); returning it to %s.%s",
                    outcome_name(outcome),
                    message.message_id,
                    exc,
                    message.queue,
                    band.name,
                )
                return Settled.UNCONFIRMED
        acked = await self.ack(delivery, message.message_id)
        return Settled.ACKED if acked else Settled.CHANNEL_GONE

    async def _publish_copy(
        self, delivery: Delivered, message: Message, band: Band, outcome: RetryLater | DeadLetter
    ) -> None:
        """The retry (through the delay exchanges) or the dead letter, confirmed."""
        if isinstance(outcome, DeadLetter):
            copy = dead_letter_message(
                delivery.body,
                delivery.headers,
                delivery.content_type,
                message,
                outcome,
                self.clock(),
            )
            await self.publisher.dead_letter(copy, message.queue)
            return
        envelope = retry_envelope(
            delivery.body, delivery.headers, message, band, outcome, self.clock()
        )
        await self.publisher.publish(envelope)

    async def ack(self, delivery: Delivered, message_id: str) -> bool:
        """Ack with the acks of the same loop turn (`bandgate.core.protocol.acks`): an ack has
        no reply and the connection writes frames in order, so nothing is gained by waiting."""
        try:
            if delivery.delivery_tag is None:
                raise MessageProcessError("a delivery without a delivery tag", delivery)
            unsettled = delivery.unsettled if isinstance(delivery, Incoming) else None
            self.acks.ack(delivery.channel, delivery.delivery_tag, unsettled)
        except _CHANNEL_GONE as exc:
            log.warning(
                "could not ack message %s (%r): its channel is gone, the broker will deliver "
                "it again",
                message_id,
                exc,
            )
            return False
        return True

    async def hand_back(self, delivery: Delivered, message: Message, band: Band) -> bool:
        """Give a message back as a copy at the back of its band, carrying the deliveries the
        broker counted so far (`wire.DELIVERIES_BEFORE`), confirmed, then ack it: how an HTTP
        receiver gives back uncounted on a broker that counts every return (before 4.3), where
        a nack would count a graceful shutdown towards the delivery limit (5 rolling restarts
        dead-lettered a healthy leased message). False when the copy was not confirmed:
        nothing was acked, give it back the usual way."""
        extra = carried_headers(delivery.headers)
        extra[DELIVERIES_BEFORE] = message.delivery_count
        copy = _Copy(
            queue=message.queue,
            payload=message.payload,
            priority=max(message.priority, band.low),  # its band, should aging have promoted it
            message_id=message.message_id,
            enqueued_at=message.enqueued_at,
            partition_key=message.partition_key,
            tenant=message.tenant,
            attempt=message.attempt,
            extra_headers=extra,
            raw_body=delivery.body,
        )
        try:
            await self.publisher.publish(copy)
        except PublishFailure as exc:
            log.warning("could not hand %s back (%s); returning it", message.message_id, exc)
            return False
        await self.ack(delivery, message.message_id)
        return True

    async def give_back(self, delivery: Delivered, *, counted: bool = False) -> None:
        """Give an unsettled delivery back to its band: nack with requeue, or reject with requeue
        when the return should count as a delivery (`counted`). RabbitMQ 4.3 counts only a
        reject in `x-delivery-count`; earlier versions count every return."""
        try:
            if counted:
                await delivery.reject(requeue=True)
            else:
                await delivery.nack(requeue=True)
        except _CHANNEL_GONE as exc:
            log.debug("delivery %s was returned with its channel: %r", delivery.message_id, exc)


async def record_handled(
    follower: LedgerFollower, message: Message, headers: Mapping[str, Any] | None
) -> None:
    """Record that this copy's id ran, before it is acked: a crash in between runs it at
    most once more, and a copy published again inside the window is skipped. A record
    that fails is logged; the message is acked all the same (its handler did run)."""
    entry = handled(message.queue, message.message_id, generation_of(headers))
    follower.view.apply(entry)  # this process knows at once, before the stream says
    try:
        await follower.publisher.record(entry.encode())
    except PublishFailure as exc:
        log.warning(
            "could not record message %s as handled (%s): a copy published again may run",
            message.message_id,
            exc,
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
        tenant=message.tenant,
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


__all__ = [
    "Settled",
    "Settler",
    "dead_letter_message",
    "record_handled",
    "retry_envelope",
]
