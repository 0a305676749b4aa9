"""The example worker (examples/worker.py), tested the way its users would test theirs."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from bandgate.consumers.testing import Ack, DeadLetter, RetryLater, deliver, make_message

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def example(monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """examples.worker, imported afresh with the shipped topology file."""
    monkeypatch.setenv("BANDGATE_TOPOLOGY", str(ROOT / "bandgate.toml"))
    sys.modules.pop("examples.worker", None)
    yield importlib.import_module("examples.worker")
    sys.modules.pop("examples.worker", None)


async def test_a_handler_is_a_plain_function(example: ModuleType) -> None:
    await example.process_order(make_message({"order_id": 1}, queue="orders", priority=8))
    example.send_email(make_message({"to": "a@example.com"}, queue="emails"))


async def test_the_outcomes_the_worker_would_settle(example: ModuleType) -> None:
    app = example.app
    assert await deliver(app, make_message({"order_id": 1}, queue="orders")) == Ack()

    rejected = await deliver(app, make_message({"sku": "A-1"}, queue="orders"))
    assert isinstance(rejected, DeadLetter)
    assert rejected.reason == "Reject: an order needs an order_id"

    recount = await deliver(app, make_message({"order_id": 2, "stock": "recounting"}))
    assert recount == RetryLater(delay=30, attempt=2, reason="Retry: retry requested")

    big = {"order_id": 3, "quantity": 500}
    backoff = await deliver(app, make_message(big, attempt=2), seed=1)
    assert isinstance(backoff, RetryLater)
    assert 1.8 <= backoff.delay <= 2.2  # bandgate.toml: 1 s doubling, ±10% jitter
    last = await deliver(app, make_message(big, attempt=5))
    assert isinstance(last, DeadLetter)
    assert last.cause == "max-attempts"
    assert last.error_type == "OutOfStock"

    assert await deliver(app, make_message({"to": "a@example.com"}, queue="emails")) == Ack()


def test_the_consumers_options(example: ModuleType) -> None:
    orders = example.app.consumer_for("orders")
    assert orders.is_async
    assert orders.options.time_limit == 30
    emails = example.app.consumer_for("emails")
    assert not emails.is_async
    assert emails.options.policy == "weighted"
    assert emails.options.retry.max_attempts == 8  # from bandgate.toml
