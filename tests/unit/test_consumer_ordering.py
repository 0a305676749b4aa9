"""Ordered queues without a broker: failure strategies, the share of shards, held messages."""

from __future__ import annotations

import pytest

from bandgate.consumers import ConsumerApp, Message, Reject, Retry
from bandgate.consumers.decision import Ack, DeadLetter, Outcome, RetryLater, after_handler
from bandgate.consumers.errors import MalformedMessage
from bandgate.consumers.sharing import surplus
from bandgate.consumers.testing import deliver, make_message
from bandgate.topology.loader import parse_topology
from bandgate.topology.model import FailureStrategy, RetryPolicy

POLICY = RetryPolicy(max_attempts=3, backoff_initial_seconds=1.0, jitter=0.0)


def outcome(strategy: FailureStrategy, error: BaseException | None, attempt: int = 1) -> Outcome:
    return after_handler(error, make_message({}, attempt=attempt), POLICY, strategy=strategy)


@pytest.mark.parametrize("strategy", ["skip", "block", "block_and_dlq"])
def test_success_acks_and_reject_or_malformed_dead_letter_with_every_strategy(
    strategy: FailureStrategy,
) -> None:
    assert outcome(strategy, None) == Ack()
    rejected = outcome(strategy, Reject("no"))
    assert isinstance(rejected, DeadLetter)
    assert rejected.cause == "rejected"
    malformed = outcome(strategy, MalformedMessage("not JSON"))
    assert isinstance(malformed, DeadLetter)
    assert malformed.cause == "malformed"


def test_skip_dead_letters_at_the_first_failure() -> None:
    skipped = outcome("skip", ValueError("boom"))
    assert isinstance(skipped, DeadLetter)
    assert (skipped.cause, skipped.error_type) == ("skipped", "ValueError")
    assert skipped.reason.startswith("ValueError: boom (failure_strategy skip")


def test_block_and_dlq_retries_in_place_until_max_attempts() -> None:
    assert outcome("block_and_dlq", ValueError("boom"), attempt=1) == RetryLater(
        delay=1.0, attempt=2, reason="ValueError: boom"
    )
    assert outcome("block_and_dlq", Retry(delay=0.5), attempt=2) == RetryLater(
        delay=0.5, attempt=3, reason="Retry: retry requested"
    )
    last = outcome("block_and_dlq", ValueError("boom"), attempt=3)
    assert isinstance(last, DeadLetter)
    assert last.cause == "max-attempts"


def test_block_never_gives_up_and_keeps_backing_off() -> None:
    late = [outcome("block", ValueError("boom"), attempt=n) for n in (3, 4, 50)]
    assert [o.attempt for o in late if isinstance(o, RetryLater)] == [4, 5, 51]
    assert [o.delay for o in late if isinstance(o, RetryLater)] == [4.0, 8.0, 300.0]
    assert outcome("block", Retry(delay=2), attempt=9) == RetryLater(
        delay=2, attempt=10, reason="Retry: retry requested"
    )


@pytest.mark.parametrize(
    ("held", "shards", "workers", "expected"),
    [
        (6, 6, 1, 0),
        (6, 6, 3, 4),  # the first worker up holds all six: it keeps two
        (3, 6, 3, 1),
        (2, 6, 3, 0),
        (3, 6, 2, 0),
        (4, 6, 4, 2),  # ceil(6 / 4) = 2
        (1, 1, 3, 0),  # one queue: whoever holds it keeps it
        (2, 6, 0, 0),  # no count: keep everything
    ],
)
def test_surplus_is_what_is_held_beyond_the_share(
    held: int, shards: int, workers: int, expected: int
) -> None:
    assert surplus(held, shards, workers) == expected


TOPOLOGY = parse_topology(
    {
        "queues": {
            "orders": {
                "ordered": True,
                "failure_strategy": "skip",
                "bands": [
                    {"name": "hot", "priorities": [5, 9], "shards": 3},
                    {"name": "cold", "priorities": [0, 4], "shards": 3},
                ],
            }
        }
    }
)


def test_held_messages_per_band_add_the_shards_up() -> None:
    app = ConsumerApp(topology=TOPOLOGY)

    @app.consumer("orders", concurrency=8)
    async def handle(msg: Message) -> None: ...

    options = app.consumer_for("orders").options
    assert options.prefetch(TOPOLOGY.queue("orders")) == (16, 2)
    assert options.held(TOPOLOGY.queue("orders")) == (18, 3)  # 3 x 6, 3 x 1


async def test_deliver_follows_the_queues_failure_strategy() -> None:
    app = ConsumerApp(topology=TOPOLOGY)

    @app.consumer("orders")
    async def handle(msg: Message) -> None:
        raise ValueError("boom")

    message = make_message({}, queue="orders", topology=TOPOLOGY, priority=5)
    result = await deliver(app, message, seed=1)
    assert isinstance(result, DeadLetter)
    assert result.cause == "skipped"
