from __future__ import annotations

import random

import pytest

from bandgate.consumers import ConsumerApp, Message, Reject, Retry
from bandgate.consumers.decision import (
    MAX_REASON_CHARS,
    Ack,
    DeadLetter,
    RetryLater,
    after_handler,
    backoff_delay,
    before_handler,
    describe,
    within_ladder,
)
from bandgate.consumers.errors import MalformedMessage, TimeLimitExceeded
from bandgate.consumers.settings import WorkerSettings
from bandgate.consumers.testing import deliver, make_message
from bandgate.topology.loader import parse_topology
from bandgate.topology.model import RetryPolicy

POLICY = RetryPolicy(
    max_attempts=4,
    backoff_initial_seconds=1.0,
    backoff_multiplier=2.0,
    backoff_max_seconds=5.0,
    jitter=0.0,
    max_deliveries=3,
)


def test_backoff_grows_exponentially_up_to_the_cap() -> None:
    delays = [backoff_delay(POLICY, attempt) for attempt in range(1, 6)]
    assert delays == [1.0, 2.0, 4.0, 5.0, 5.0]


def test_jitter_stays_within_its_fraction() -> None:
    policy = POLICY.model_copy(update={"jitter": 0.1})
    rng = random.Random(7)
    delays = [backoff_delay(policy, 3, rng) for _ in range(500)]
    assert all(3.6 <= delay <= 4.4 for delay in delays)
    assert len({round(delay, 6) for delay in delays}) > 100  # it does spread


def test_success_acks() -> None:
    assert after_handler(None, make_message(), POLICY) == Ack()


def test_an_exception_retries_with_backoff_and_the_next_attempt() -> None:
    outcome = after_handler(ValueError("boom"), make_message(attempt=2), POLICY)
    assert outcome == RetryLater(delay=2.0, attempt=3, reason="ValueError: boom")


def test_after_max_attempts_it_is_dead_lettered() -> None:
    outcome = after_handler(ValueError("boom"), make_message(attempt=4), POLICY)
    assert outcome == DeadLetter(
        cause="max-attempts", reason="ValueError: boom (attempt 4 of 4)", error_type="ValueError"
    )


def test_retry_uses_its_own_delay_and_counts_as_an_attempt() -> None:
    assert after_handler(Retry(delay=1), make_message(attempt=1), POLICY) == RetryLater(
        delay=1, attempt=2, reason="Retry: retry requested"
    )
    assert isinstance(after_handler(Retry(delay=1), make_message(attempt=4), POLICY), DeadLetter)
    without_delay = after_handler(Retry(), make_message(attempt=3), POLICY)
    assert isinstance(without_delay, RetryLater)
    assert without_delay.delay == 4.0


def test_reject_and_malformed_go_straight_to_the_dead_letter_queue() -> None:
    assert after_handler(Reject("no such customer"), make_message(), POLICY) == DeadLetter(
        cause="rejected", reason="Reject: no such customer", error_type="Reject"
    )
    malformed = after_handler(MalformedMessage("not JSON"), make_message(), POLICY)
    assert isinstance(malformed, DeadLetter)
    assert malformed.cause == "malformed"


def test_a_time_limit_is_a_failure_like_any_other() -> None:
    outcome = after_handler(TimeLimitExceeded("past 2 s"), make_message(), POLICY)
    assert outcome == RetryLater(delay=1.0, attempt=2, reason="TimeLimitExceeded: past 2 s")


def test_delivery_limit_dead_letters_before_the_handler() -> None:
    assert before_handler(make_message(delivery_count=2), POLICY) is None
    limit = before_handler(make_message(delivery_count=3), POLICY)
    assert limit is not None
    assert limit.cause == "delivery-limit"
    assert "x-delivery-count 3 >= max_deliveries 3" in limit.reason


def test_describe_cuts_long_reasons() -> None:
    assert describe(KeyError("sku")) == "KeyError: 'sku'"
    assert describe(RuntimeError()) == "RuntimeError"
    long = describe(ValueError("x" * 5000))
    assert len(long) == MAX_REASON_CHARS
    assert long.endswith("...")


def test_retry_refuses_a_negative_delay() -> None:
    with pytest.raises(ValueError, match="negative"):
        Retry(delay=-1)


async def test_a_retry_beyond_the_delay_ladder_waits_as_long_as_the_ladder_can() -> None:
    """The clamp is part of the decision: the worker and `deliver` both see it, and an ordered
    queue's retry in place (no ladder) is not clamped."""
    longest = 51.15  # 10 levels of 50 ms
    far = RetryLater(3600, 2, "x")
    assert within_ladder(far, make_message(), longest) == RetryLater(longest, 2, "x")
    assert within_ladder(far, make_message(), None) == far
    near = RetryLater(3, 2, "x")
    assert within_ladder(near, make_message(), longest) == near

    topology = parse_topology(
        {
            "delay": {"base_ms": 50, "levels": 10},
            "queues": {"orders": {}, "lines": {"ordered": True, "failure_strategy": "block"}},
        }
    )
    app = ConsumerApp(WorkerSettings(), topology=topology)

    async def handle(msg: Message) -> None:
        raise Retry(delay=3600)

    app.consumer("orders")(handle)
    app.consumer("lines")(handle)
    retried = await deliver(app, make_message(queue="orders", topology=topology))
    assert isinstance(retried, RetryLater)
    assert retried.delay == pytest.approx(longest)
    assert retried.attempt == 2
    in_place = await deliver(app, make_message(queue="lines", topology=topology))
    assert isinstance(in_place, RetryLater)
    assert in_place.delay == 3600
