"""Settling a delivery on the broker: ack, or publish a copy (confirmed) and then ack.

The copy is always confirmed before the original is acked, so a failure anywhere on this path
can duplicate a message but never lose one: when the copy is not confirmed, the original stays
unacked and `settle` says so (`Settled.UNCONFIRMED`); the caller returns it to its band, the way
its queue returns messages (`consumers.handback`).
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime

import aiormq
from aio_pika.exceptions import ChannelInvalidStateError, MessageProcessError

from bandgate.consumers.acks import AckWriter
from bandgate.consumers.incoming import Delivered, Incoming
from bandgate.consumers.message import Message
from bandgate.consumers.outcome import (
    Ack,
    DeadLetter,
    GiveBack,
    Outcome,
    RetryLater,
    Tombstoned,
)
from bandgate.consumers.republish import dead_letter_message, retry_envelope
from bandgate.consumers.telemetry import outcome_name
from bandgate.core.publishing import Publisher, PublishFailure
from bandgate.topology import wire
from bandgate.topology.model import Band

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
        self, delivery: Delivered, message: Message, band: Band, outcome: Outcome
    ) -> Settled:
        """Carry out `outcome`: publish its copy (confirmed), then ack."""
        assert not isinstance(outcome, GiveBack), "a GiveBack is handed back, not settled"
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
        longest = self.publisher.topology.ladder.max_delay_ms / 1000
        if outcome.delay > longest:
            log.warning(
                "retry delay %g s of message %s is beyond the delay ladder's %g s; using that",
                outcome.delay,
                message.message_id,
                longest,
            )
            outcome = replace(outcome, delay=longest)
        envelope = retry_envelope(
            delivery.body, delivery.headers, message, band, outcome, self.clock()
        )
        await self.publisher.publish(envelope)

    async def ack(self, delivery: Delivered, message_id: str) -> bool:
        """Ack with the acks of the same loop turn (`consumers.acks`): an ack has no reply
        and the connection writes frames in order, so nothing is gained by waiting for it."""
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

    async def give_back(self, delivery: Delivered, *, counted: bool = False) -> None:
        """Return an unsettled delivery to its band: nack with requeue, or reject with requeue
        when the return should count as a delivery (`counted`). RabbitMQ 4.3 counts only a
        reject in `x-delivery-count`; earlier versions count every return."""
        try:
            if counted:
                await delivery.reject(requeue=True)
            else:
                await delivery.nack(requeue=True)
        except _CHANNEL_GONE as exc:
            log.debug("delivery %s was returned with its channel: %r", delivery.message_id, exc)
