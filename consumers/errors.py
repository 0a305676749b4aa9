"""The consumer library's exceptions.

`Retry` and `Reject` are control flow: a handler raises them on purpose to say what should
happen to its message (seen from the worker, they are outcomes, not errors). Everything the
library raises derives from `ConsumerError`, so one `except ConsumerError` catches it all.
"""

from __future__ import annotations


class ConsumerError(Exception):
    """Base of every exception the consumer library defines."""


class ConfigurationError(ConsumerError, ValueError):
    """A consumer declared with an unknown queue or an invalid option.

    Raised when the decorator runs, so a typo fails at import, not at 3 a.m.
    """


class Retry(ConsumerError):
    """Raise in a handler to run the message again after `delay` seconds.

    Without a delay, the queue's back-off applies. A retry counts as an attempt: once the
    message has had `max_attempts`, it goes to the dead-letter queue instead.
    """

    def __init__(self, delay: float | None = None, reason: str = "retry requested") -> None:
        if delay is not None and delay < 0:
            raise ValueError(f"a retry delay cannot be negative (got {delay})")
        super().__init__(reason)
        self.delay = delay
        self.reason = reason


class Reject(ConsumerError):
    """Raise in a handler to dead-letter the message at once, without further attempts."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Requeue(ConsumerError):
    """Raise in a handler to give the message back to its queue at once, unhandled.

    Not an attempt: the message keeps its attempt count. The broker counts it as a delivery
    (`x-delivery-count`, on quorum bands), so after `max_deliveries` returns it is
    dead-lettered with cause `delivery-limit`. HTTP receivers use it when a lease lapses.
    """

    def __init__(self, reason: str = "requeued") -> None:
        super().__init__(reason)
        self.reason = reason


class TimeLimitExceeded(ConsumerError):
    """A handler ran past its time limit and was cancelled; it counts as a failed attempt."""


class MalformedMessage(ConsumerError):
    """A delivery that cannot be read as a bandgate message (e.g. a body that is not JSON).

    Retrying cannot fix it, so it is dead-lettered without running the handler.
    """


__all__ = [
    "ConfigurationError",
    "ConsumerError",
    "MalformedMessage",
    "Reject",
    "Requeue",
    "Retry",
    "TimeLimitExceeded",
]
