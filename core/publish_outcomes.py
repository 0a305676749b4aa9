"""What a publish ends in: `Published` (the broker confirmed it) or a `PublishFailure`, and
which failure each answer of the broker (or its absence) is.

Every failure is either `NotEnqueued` (certainly in no queue: retrying cannot duplicate it) or
`OutcomeUnknown` (sent, its confirm did not come: retry with the same message_id). `code` is
the error code the HTTP API answers with, taken from the registry (`core.error_codes`), so the
gateway, Python producers and the README's "When a publish fails" table name a failure alike;
a class whose code the registry files under the other kind fails at import.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime

import aiormq

from bandgate.core import error_codes
from bandgate.core.error_codes import ErrorCode, Kind
from bandgate.core.protocol.confirms import Confirmation, NotSent

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

    error: ErrorCode = error_codes.BROKER_UNAVAILABLE
    code = error.code
    # What the registry may say of the codes of a subclass: `NotEnqueued` and its refusals
    # (client errors) are in no queue; `OutcomeUnknown` may be.
    _kinds: frozenset[Kind] = frozenset(Kind)

    def __init_subclass__(cls) -> None:
        super().__init_subclass__()
        cls.code = cls.error.code
        if cls.error.kind not in cls._kinds:
            raise TypeError(f"{cls.__name__}: code {cls.code!r} is {cls.error.kind}")


class NotEnqueued(PublishFailure):
    """The message is certainly not in any queue: it was never sent, or the broker refused it.
    Retrying cannot duplicate it."""

    _kinds = frozenset({Kind.NOT_ENQUEUED, Kind.CLIENT_ERROR})


class OutcomeUnknown(PublishFailure):
    """The message was sent and its confirm did not come: it may be enqueued. Retry with the
    same message_id (consumers may then see it twice)."""

    _kinds = frozenset({Kind.OUTCOME_UNKNOWN})
    error = error_codes.CONFIRM_LOST


class BrokerUnavailable(NotEnqueued):
    """No connection to the broker (it was unreachable, or went away before the message was
    written): nothing was sent."""

    error = error_codes.BROKER_UNAVAILABLE


class BrokerBlocked(BrokerUnavailable):
    """The broker blocks publishing (a memory or disk alarm): refused at once rather than
    waiting out the confirm timeout."""

    error = error_codes.BROKER_BLOCKED

    def __init__(self) -> None:
        super().__init__("the broker blocks publishing (a memory or disk alarm); retry later")


class BrokerRejected(NotEnqueued):
    """The broker nacked the message: a band at its max-length (reject-publish)."""

    error = error_codes.QUEUE_FULL


class Unroutable(NotEnqueued):
    """The broker returned the message: no binding matched, the topology is not applied."""

    error = error_codes.UNROUTABLE


class InvalidMessage(NotEnqueued):
    """The message cannot be published as it is; nothing was sent. `field` names the part,
    `code` the rule (`invalid_field` unless a more precise code applies): a client error of
    the registry, given as an `ErrorCode` (or, as before, by its name)."""

    error = error_codes.INVALID_FIELD
    _kinds = frozenset({Kind.CLIENT_ERROR})

    def __init__(
        self, message: str, field: str | None = None, code: ErrorCode | str | None = None
    ) -> None:
        super().__init__(message)
        self.field = field
        if code is not None:
            error = code if isinstance(code, ErrorCode) else error_codes.lookup(code)
            if error.kind not in self._kinds:
                raise ValueError(f"{error.code!r} is not a client error")
            self.error = error
            self.code = error.code


class UnknownQueue(InvalidMessage):
    """The topology has no queue of that name."""

    error = error_codes.UNKNOWN_QUEUE


class MessageTooLarge(InvalidMessage):
    """Its headers and properties exceed the connection's frame size."""

    error = error_codes.MESSAGE_TOO_LARGE


class ConfirmTimeout(OutcomeUnknown):
    """The message was sent and its confirm did not come within the confirm timeout."""

    error = error_codes.CONFIRM_TIMEOUT


class TopologyMissing(OutcomeUnknown):
    """The broker closed the channel because an exchange is missing."""

    error = error_codes.TOPOLOGY_MISSING


class ConfirmLost(OutcomeUnknown):
    """The channel or connection closed after the message was sent, before its confirm."""

    error = error_codes.CONFIRM_LOST


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
