"""What a publish ends in: `Published` (the broker confirmed it) or a `PublishFailure`, and
which failure each answer of the broker (or its absence) is.

Every failure is either `NotEnqueued` (certainly in no queue: retrying cannot duplicate it) or
`OutcomeUnknown` (sent, its confirm did not come: retry with the same message_id). `code` is
the error code the HTTP API answers with, so the gateway, Python producers and the README's
"When a publish fails" table name a failure alike.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime

import aiormq

from bandgate.core.confirm_pipeline import Confirmation, NotSent

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Published:
    message_id: str
    queue: str
    band: str
    priority: int
    enqueued_at: datetime
    deliver_at: datetime | None


class PublishFailure(Exception):
    """The broker did not confirm a message. `NotEnqueued` and `OutcomeUnknown` say whether
    it may still be in a queue."""

    code = "broker_unavailable"


class NotEnqueued(PublishFailure):
    """The message is certainly not in any queue: it was never sent, or the broker refused it.
    Retrying cannot duplicate it."""


class OutcomeUnknown(PublishFailure):
    """The message was sent and its confirm did not come: it may be enqueued. Retry with the
    same message_id (consumers may then see it twice)."""


class BrokerUnavailable(NotEnqueued):
    code = "broker_unavailable"


class BrokerBlocked(BrokerUnavailable):
    """The broker blocks publishing (a memory or disk alarm): refused at once rather than
    waiting out the confirm timeout."""

    code = "broker_blocked"

    def __init__(self) -> None:
        super().__init__("the broker blocks publishing (a memory or disk alarm); retry later")


class BrokerRejected(NotEnqueued):
    """The broker nacked the message: a band at its max-length (reject-publish)."""

    code = "queue_full"


class Unroutable(NotEnqueued):
    """The broker returned the message: no binding matched, the topology is not applied."""

    code = "unroutable"


class InvalidMessage(NotEnqueued):
    """The message cannot be published as it is; nothing was sent. `field` names the part,
    `code` the rule (`invalid_field` unless a more precise code applies)."""

    code = "invalid_field"

    def __init__(self, message: str, field: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.field = field
        if code is not None:
            self.code = code


class UnknownQueue(InvalidMessage):
    """The topology has no queue of that name."""

    code = "unknown_queue"


class MessageTooLarge(InvalidMessage):
    """Its headers and properties exceed the connection's frame size."""

    code = "message_too_large"


class ConfirmTimeout(OutcomeUnknown):
    code = "confirm_timeout"


class TopologyMissing(OutcomeUnknown):
    """The broker closed the channel because an exchange is missing."""

    code = "topology_missing"


class ConfirmLost(OutcomeUnknown):
    """The channel or connection closed after the message was sent, before its confirm."""

    code = "confirm_lost"


def failure_of(
    exc: Exception, exchange: str, routing_key: str, confirm_timeout: float
) -> PublishFailure:
    """The PublishFailure for what a sent publish raised; anything else is re-raised."""
    if isinstance(exc, PublishFailure):
        return exc
    if isinstance(exc, TimeoutError):
        return ConfirmTimeout(
            f"the broker did not confirm the message within {confirm_timeout:g} s; "
            "it may still arrive: retry with the same message_id"
        )
    if isinstance(exc, NotSent):
        return BrokerUnavailable(f"the broker is unavailable; the message was not sent: {exc}")
    if isinstance(exc, aiormq.exceptions.PublishError):
        return unroutable(exchange, routing_key)
    if isinstance(exc, aiormq.exceptions.DeliveryError):
        return BrokerRejected(
            "the broker refused the message (nack): its band is at its max-length; retry later"
        )
    if isinstance(exc, aiormq.exceptions.ChannelNotFoundEntity):
        # The broker closed the channel: this message was not routed, but others in flight
        # on the same channel fail with the same error whatever became of them.
        return TopologyMissing(
            f"exchange {exchange!r} does not exist (run `bandgate topology apply`); "
            "messages in flight on the channel may or may not have been enqueued"
        )
    if type(exc) is Exception or isinstance(
        exc, aiormq.exceptions.AMQPError | ConnectionError | RuntimeError
    ):
        # A bare Exception is what aiormq sets on pending confirms when a channel closes
        # without a reason.
        log.warning("publish failed after it was sent: %r", exc)
        return ConfirmLost(
            f"the connection to the broker failed before it confirmed the message ({exc!r}); "
            "it may have been enqueued: retry with the same message_id"
        )
    raise exc


def check_acked(confirmation: Confirmation, exchange: str, routing_key: str) -> None:
    """Raise unless the broker acked: a cancelled (timed out) publish raises TimeoutError."""
    if confirmation.cancelled():
        raise TimeoutError
    frame = confirmation.result()
    if not isinstance(frame, aiormq.spec.Basic.Ack):
        # Anything but an ack (no confirm at all, a channel without confirms): never report
        # that as enqueued.
        raise unroutable(exchange, routing_key)


def unroutable(exchange: str, routing_key: str) -> Unroutable:
    return Unroutable(
        f"no binding for routing key {routing_key!r} on exchange {exchange!r}: "
        "the topology is not applied on this broker (run `bandgate topology apply`)"
    )
