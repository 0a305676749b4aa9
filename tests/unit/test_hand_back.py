"""A stopping process gives messages back as copies that keep their delivery count (issue 33,
finding 5): what a copy carries, and how a received message counts it."""

from __future__ import annotations

from bandgate.consumers.decision import RetryLater, before_handler
from bandgate.consumers.message import read_message
from bandgate.consumers.settlement import retry_envelope
from bandgate.topology import wire
from tests.unit.test_consumer_message import ENQUEUED, ORDERS, WARM, bandgate_headers, delivery


def test_the_count_a_copy_carries_adds_to_the_brokers() -> None:
    """A copy handed back after 3 counted returns, returned once more by a crash: 4."""
    headers = bandgate_headers(**{wire.DELIVERIES_BEFORE: 3, wire.DELIVERY_COUNT: 1})
    message = read_message(delivery(headers=headers), ORDERS, WARM)
    assert message.delivery_count == 4
    assert before_handler(message, ORDERS.retry) is None  # max_deliveries 5
    crashed = bandgate_headers(**{wire.DELIVERIES_BEFORE: 4, wire.DELIVERY_COUNT: 1})
    verdict = before_handler(read_message(delivery(headers=crashed), ORDERS, WARM), ORDERS.retry)
    assert verdict is not None
    assert verdict.cause == "delivery-limit"


def test_a_first_delivery_counts_nothing_and_a_retry_starts_afresh() -> None:
    message = read_message(delivery(headers=bandgate_headers()), ORDERS, WARM)
    assert message.delivery_count == 0
    headers = bandgate_headers(**{wire.DELIVERIES_BEFORE: 2})
    handed = read_message(delivery(headers=headers), ORDERS, WARM)
    retry = retry_envelope(b"{}", headers, handed, WARM, RetryLater(1.0, 2, "failed"), ENQUEUED)
    assert wire.DELIVERIES_BEFORE not in retry.extra_headers  # a retry is a new attempt
