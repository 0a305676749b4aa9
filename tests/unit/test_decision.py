"""One decision path: the worker and `testing.deliver` come to the same outcome for every result.

The worker's side is a real `ConsumerRunner`: the delivery enters through its intake, its run
loop starts the pipeline, and the outcome is read where the runner hands it on (the settler, and
its hooks for every attempt, a retry in place included). Only the broker is missing: the
settler records instead of publishing and acking. The outcomes must be equal, and each of the
kind the result calls for.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass
from typing import Any, cast

import orjson
import pytest
from aio_pika.abc import AbstractConnection

from bandgate.consumers import ConsumerApp, Message, Reject, Retry
from bandgate.consumers.decision import Ack, DeadLetter, Outcome, RetryLater
from bandgate.consumers.message import read_message
from bandgate.consumers.runner import ConsumerRunner
from bandgate.consumers.settings import WorkerSettings
from bandgate.consumers.settlement import Settled, Settler
from bandgate.consumers.subscription import Delivery
from bandgate.consumers.testing import deliver
from bandgate.core.ledger_follower import LedgerFollower
from bandgate.core.protocol.deliveries import Incoming
from bandgate.core.publishing import ChannelSet, Publisher
from bandgate.topology import wire
from bandgate.topology.loader import parse_topology
from bandgate.topology.model import Band

RETRY = {"max_attempts": 3, "max_deliveries": 4, "backoff_initial_seconds": 1.0, "jitter": 0}
TOPOLOGY = parse_topology(
    {
        "exchange": "bandgate",
        "delay": {"base_ms": 50, "levels": 12},
        "queues": {
            "orders": {"retry": RETRY},
            "reports": {"retry": RETRY},  # a sync handler
            **{
                f"ordered-{strategy.replace('_', '-')}": {
                    "ordered": True,
                    "failure_strategy": strategy,
                    "retry": RETRY,
                }
                for strategy in ("skip", "block", "block_and_dlq")
            },
        },
    }
)


async def handle(msg: Message) -> None:
    if msg.payload == "fail":
        raise ValueError("boom")
    if msg.payload == "retry":
        raise Retry(delay=1.5)
    if msg.payload == "reject":
        raise Reject("bad order")
    if msg.payload == "cancelled":
        raise asyncio.CancelledError  # its own, not the worker stopping
    if msg.payload == "slow":
        await asyncio.Event().wait()  # only the time limit ends it


def handle_in_a_thread(msg: Message) -> None:
    assert threading.current_thread() is not threading.main_thread()
    if msg.payload == "fail":
        raise ValueError("boom")
    if msg.payload == "reject":
        raise Reject("bad order")


def make_app() -> ConsumerApp:
    app = ConsumerApp(WorkerSettings(), topology=TOPOLOGY)
    for queue in TOPOLOGY.queues:
        if queue != "reports":
            app.consumer(queue, time_limit=0.2)(handle)
    app.consumer("reports", time_limit=0.2)(handle_in_a_thread)
    return app


class Channel:
    is_closed = False


@dataclass
class FakeDelivery:
    """A delivery as aiormq would hand it over, of a message published as bandgate does."""

    body: bytes
    headers: dict[str, Any]
    message_id: str = "m-1"
    delivery_tag: int | None = 1
    priority: int | None = 8  # the hottest band's: the runner's first subscription
    content_type: str | None = wire.CONTENT_TYPE
    timestamp: None = None
    redelivered: bool | None = False
    channel: Channel = Channel()

    async def nack(self, *, requeue: bool = True) -> None:
        raise AssertionError("nothing is given back in these cases")


def delivered(payload: str, *, attempt: int, delivery_count: int) -> FakeDelivery:
    headers = {wire.ATTEMPT: attempt, wire.DELIVERY_COUNT: delivery_count}
    return FakeDelivery(orjson.dumps(payload), headers)


def read(queue: str, incoming: FakeDelivery) -> Message:
    """The message the worker reads from the delivery, from the queue's hottest band."""
    spec = TOPOLOGY.queue(queue)
    return read_message(cast(Incoming, incoming), spec, spec.bands[0])


class RecordingSettler(Settler):
    def __init__(self) -> None:
        super().__init__(Publisher(TOPOLOGY, cast(ChannelSet, None)))
        self.settled: list[Outcome] = []

    async def settle(
        self,
        delivery: Any,
        message: Message,
        band: Band,
        outcome: Outcome,
        *,
        ledger: LedgerFollower | None = None,
    ) -> Settled:
        self.settled.append(outcome)
        return Settled.ACKED


class RecordingHooks:
    def __init__(self) -> None:
        self.finished_with = asyncio.Queue[Outcome]()

    def settled(self, delivery: Delivery, message: Message, outcome: Outcome) -> None:
        self.finished_with.put_nowait(outcome)


async def on_the_worker(app: ConsumerApp, queue: str, incoming: FakeDelivery) -> Outcome:
    """The outcome the runner's pipeline comes to for one delivery."""
    consumer = app.consumer_for(queue)
    settler, hooks = RecordingSettler(), RecordingHooks()
    runner = ConsumerRunner(consumer, cast(AbstractConnection, None), settler, hooks=hooks)
    subscription = runner.subscriptions[0][0]
    loop = asyncio.create_task(runner.run())
    try:
        await runner.receive(Delivery(subscription, cast(Incoming, incoming), None))
        outcome = await asyncio.wait_for(hooks.finished_with.get(), 5)
    finally:
        await runner.stop_consuming()  # ends a retry in place, unsettled, like a shutdown
        await asyncio.gather(*runner.in_flight)
        await loop
        await runner.close()
    in_place = consumer.spec.ordered and isinstance(outcome, RetryLater)
    assert settler.settled == ([] if in_place else [outcome])
    return outcome


# queue, what the handler does, attempt, x-delivery-count -> the outcome's kind and detail
CASES: list[tuple[str, str, int, int, type[Outcome], str | int | None]] = [
    ("orders", "ok", 1, 0, Ack, None),
    ("orders", "fail", 1, 0, RetryLater, 2),
    ("orders", "fail", 3, 0, DeadLetter, "max-attempts"),
    ("orders", "retry", 1, 0, RetryLater, 2),
    ("orders", "reject", 1, 0, DeadLetter, "rejected"),
    ("orders", "cancelled", 1, 0, RetryLater, 2),
    ("orders", "slow", 1, 0, RetryLater, 2),
    ("orders", "slow", 3, 0, DeadLetter, "max-attempts"),
    ("orders", "ok", 1, 4, DeadLetter, "delivery-limit"),
    ("reports", "ok", 1, 0, Ack, None),
    ("reports", "fail", 2, 0, RetryLater, 3),
    ("reports", "reject", 1, 0, DeadLetter, "rejected"),
    ("ordered-skip", "fail", 1, 0, DeadLetter, "skipped"),
    ("ordered-skip", "reject", 1, 0, DeadLetter, "rejected"),
    ("ordered-block", "fail", 3, 0, RetryLater, 4),
    ("ordered-block", "ok", 1, 4, DeadLetter, "delivery-limit"),
    ("ordered-block-and-dlq", "cancelled", 1, 0, RetryLater, 2),
    ("ordered-block-and-dlq", "fail", 3, 0, DeadLetter, "max-attempts"),
]


@pytest.mark.parametrize(
    ("queue", "does", "attempt", "delivery_count", "kind", "detail"),
    CASES,
    ids=[f"{queue}-{does}-attempt{n}-deliveries{d}" for queue, does, n, d, *_ in CASES],
)
async def test_the_worker_and_deliver_decide_alike(
    queue: str,
    does: str,
    attempt: int,
    delivery_count: int,
    kind: type[Outcome],
    detail: str | int | None,
) -> None:
    app = make_app()
    incoming = delivered(does, attempt=attempt, delivery_count=delivery_count)
    worker = await on_the_worker(app, queue, incoming)
    helper = await deliver(app, read(queue, incoming))

    assert worker == helper
    assert isinstance(worker, kind)
    if isinstance(worker, DeadLetter):
        assert worker.cause == detail
    elif isinstance(worker, RetryLater):
        assert worker.attempt == detail
        assert worker.delay == (1.5 if does == "retry" else 2.0 ** (attempt - 1))


async def test_the_time_limit_and_a_cancellation_of_its_own_are_failures_on_both() -> None:
    app = make_app()
    for does, reason in (("slow", "TimeLimitExceeded: "), ("cancelled", "CancelledError")):
        incoming = delivered(does, attempt=1, delivery_count=0)
        worker = await on_the_worker(app, "orders", incoming)
        helper = await deliver(app, read("orders", incoming))
        assert isinstance(worker, RetryLater)
        assert isinstance(helper, RetryLater)
        assert worker.reason.startswith(reason)
        assert helper.reason == worker.reason
