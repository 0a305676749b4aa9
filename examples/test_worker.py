"""The example worker (examples/worker.py), tested without a broker: `pytest examples`.

The in-memory harness (`bandgate.testing`) runs the app's real handlers, the worker's own
scheduling, retry and dead-letter decisions and the real producer over an in-memory RabbitMQ
built from bandgate.toml, on a clock the test moves (`advance`). Its pytest plugin gives the
`bandgate_harness` fixture of the app the `bandgate_app` fixture returns.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from bandgate.consumers import Ack, ConsumerApp, DeadLetter, RetryLater, Tombstoned
from bandgate.testing import Harness
from examples import worker


@pytest.fixture
def bandgate_app() -> ConsumerApp:
    return worker.app


def handled(harness: Harness) -> list[Any]:
    """The order ids the handler ran to the end, in order."""
    return [s.message.payload["order_id"] for s in harness.settled if isinstance(s.outcome, Ack)]


async def test_hot_orders_run_before_cold_ones(bandgate_harness: Harness) -> None:
    for order in range(20):
        await bandgate_harness.publish("orders", {"order_id": order}, priority="low")
    await bandgate_harness.publish("orders", {"order_id": "rush"}, priority="critical")
    await bandgate_harness.drain()
    assert handled(bandgate_harness)[0] == "rush"  # published last, handled first
    assert sorted(handled(bandgate_harness)[1:]) == list(range(20))
    assert [s.message.band for s in bandgate_harness.settled[:2]] == ["hot", "cold"]


async def test_a_recount_is_looked_at_again_after_30_s(bandgate_harness: Harness) -> None:
    sent = await bandgate_harness.publish("orders", {"order_id": 1, "stock": "recounting"})
    await bandgate_harness.drain()
    assert bandgate_harness.outcomes(sent.message_id) == [
        RetryLater(delay=30, attempt=2, reason="Retry: retry requested")
    ]
    await bandgate_harness.advance(29)
    assert len(bandgate_harness.outcomes(sent.message_id)) == 1  # not yet
    await bandgate_harness.advance(2)
    attempts = [s.message.attempt for s in bandgate_harness.settled]
    assert attempts == [1, 2]


async def test_out_of_stock_backs_off_then_is_dead_lettered(bandgate_harness: Harness) -> None:
    sent = await bandgate_harness.publish("orders", {"order_id": 2, "quantity": 1000})
    await bandgate_harness.advance(60)
    outcomes = bandgate_harness.outcomes(sent.message_id)
    delays = [o.delay for o in outcomes if isinstance(o, RetryLater)]
    assert len(delays) == 4
    assert delays == sorted(delays)  # about 1, 2, 4, 8 s
    assert isinstance(outcomes[-1], DeadLetter)
    assert outcomes[-1].cause == "max-attempts"
    [dead] = bandgate_harness.dead_letters("orders")
    assert dead.payload == {"order_id": 2, "quantity": 1000}
    assert dead.reason == "OutOfStock: only 100 in stock, order 2 wants 1000 (attempt 5 of 5)"
    assert dead.record.attempts == 5


async def test_an_order_without_id_goes_to_the_dlq_at_once(bandgate_harness: Harness) -> None:
    await bandgate_harness.publish("orders", {"sku": "A-1"})
    await bandgate_harness.drain()
    [dead] = bandgate_harness.dead_letters("orders")
    assert (dead.cause, dead.reason) == ("rejected", "Reject: an order needs an order_id")


async def test_a_cancelled_order_never_runs(bandgate_harness: Harness) -> None:
    await bandgate_harness.publish("orders", {"order_id": 3}, delay=60, message_id="order-3")
    await bandgate_harness.cancel("orders", "order-3")
    await bandgate_harness.advance(61)
    assert bandgate_harness.outcomes("order-3") == [Tombstoned("cancelled")]
    assert handled(bandgate_harness) == []


async def test_one_customer_s_orders_run_one_at_a_time_in_order(
    bandgate_harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    log: list[tuple[str, int]] = []

    async def reserve_stock(order: dict[str, Any]) -> None:  # the database, slowed down
        log.append(("start", order["order_id"]))
        await asyncio.sleep(0.005)
        log.append(("end", order["order_id"]))

    monkeypatch.setattr(worker, "reserve_stock", reserve_stock)
    for order in range(1, 7):
        customer = "alice" if order <= 3 else "bob"
        await bandgate_harness.publish("orders", {"order_id": order}, partition_key=customer)
    await bandgate_harness.drain()
    for orders in ([1, 2, 3], [4, 5, 6]):
        steps = [step for step in log if step[1] in orders]
        assert steps == [(edge, order) for order in orders for edge in ("start", "end")]
    assert log[:2] == [("start", 1), ("start", 4)]  # two customers' orders do run at once
