from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any, cast

import pytest
from aio_pika.message import IncomingMessage
from aiormq.abc import DeliveredMessage
from pamqp.commands import Basic
from pamqp.header import ContentHeader

from bandgate.consumers.decision import DeadLetter, RetryLater
from bandgate.consumers.errors import MalformedMessage
from bandgate.consumers.message import read_message
from bandgate.consumers.settlement import dead_letter_message, retry_envelope
from bandgate.topology import wire
from bandgate.topology.model import QueueSpec
from bandgate.topology.wire import (
    ATTEMPTS,
    DELIVERY_COUNT,
    FAILED_AT,
    FAILURE_CAUSE,
    FAILURE_REASON,
    FAILURE_TYPE,
    ORIGINAL_BAND,
    RETRY_REASON,
    carried_headers,
)

ORDERS = QueueSpec(name="orders")
HOT, WARM, COLD = ORDERS.bands
ENQUEUED = datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=UTC)


def delivery(
    body: bytes = b'{"order": 1}',
    *,
    headers: dict[str, Any] | None = None,
    priority: int | None = 5,
    content_type: str | None = "application/json",
    redelivered: bool = False,
) -> IncomingMessage:
    properties = Basic.Properties(
        content_type=content_type,
        headers=headers,
        priority=priority,
        message_id="m-1",
        timestamp=ENQUEUED.replace(microsecond=0),
    )
    delivered = DeliveredMessage(
        delivery=Basic.Deliver(
            consumer_tag="ctag", delivery_tag=7, redelivered=redelivered, routing_key="orders.5"
        ),
        header=ContentHeader(properties=properties),
        body=body,
        channel=cast(Any, None),
    )
    return IncomingMessage(delivered)


def bandgate_headers(**extra: Any) -> dict[str, Any]:
    return {
        wire.ENQUEUED_AT: wire.to_millis(ENQUEUED),
        wire.ATTEMPT: 2,
        wire.QUEUE: "orders",
        wire.PARTITION_KEY: "customer-9",
        "tenant": "acme",
        "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        **extra,
    }


def test_a_bandgate_delivery_reads_into_a_message() -> None:
    incoming = delivery(
        headers=bandgate_headers(**{DELIVERY_COUNT: 1, "x-death": [{"queue": "orders.cold"}]}),
        redelivered=True,
    )
    message = read_message(incoming, ORDERS, WARM)
    assert message.payload == {"order": 1}
    assert message.queue == "orders"
    assert message.band == "warm"
    assert message.priority == 5
    assert message.message_id == "m-1"
    assert message.attempt == 2
    assert message.headers == {"tenant": "acme"}
    assert message.partition_key == "customer-9"
    assert message.enqueued_at == ENQUEUED
    assert message.redelivered
    assert message.delivery_count == 1
    assert not message.promoted


def test_a_message_consumed_from_a_hotter_band_than_its_priority_was_promoted() -> None:
    message = read_message(delivery(priority=2), ORDERS, WARM)
    assert message.band == "warm"
    assert message.priority == 2
    assert message.promoted


def test_a_foreign_message_gets_defaults() -> None:
    message = read_message(delivery(b"[1, 2]", priority=None, content_type=None), ORDERS, COLD)
    assert message.payload == [1, 2]
    assert message.priority == COLD.low
    assert message.attempt == 1
    assert message.enqueued_at == ENQUEUED.replace(microsecond=0)  # from the AMQP timestamp
    assert message.headers == {}


def test_json_with_parameters_is_json() -> None:
    incoming = delivery(b'"hi"', content_type="application/json; charset=utf-8")
    assert read_message(incoming, ORDERS, WARM).payload == "hi"


@pytest.mark.parametrize(
    ("body", "content_type", "problem"),
    [(b"{not json", "application/json", "not valid JSON"), (b"hi", "text/plain", "text/plain")],
)
def test_unreadable_bodies_are_malformed(body: bytes, content_type: str, problem: str) -> None:
    incoming = delivery(body, content_type=content_type)
    with pytest.raises(MalformedMessage, match=problem):
        read_message(incoming, ORDERS, WARM)
    assert read_message(incoming, ORDERS, WARM, decode=False).payload is None


def test_copies_drop_broker_and_per_delivery_headers() -> None:
    headers = bandgate_headers(
        **{
            DELIVERY_COUNT: 4,
            "x-death": [],
            "x-first-death-queue": "orders.cold",
            FAILURE_CAUSE: "x",
        }
    )
    assert carried_headers(headers) == {
        "tenant": "acme",
        "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    }


def test_a_retry_keeps_identity_and_body_and_counts_the_attempt() -> None:
    incoming = delivery(headers=bandgate_headers(**{DELIVERY_COUNT: 1, "x-death": []}))
    message = read_message(incoming, ORDERS, WARM)
    now = datetime(2026, 1, 2, 4, 0, tzinfo=UTC)
    envelope = retry_envelope(
        incoming.body, incoming.headers, message, WARM, RetryLater(2.5, 3, "ValueError: x"), now
    )
    assert envelope.deliver_at == now + timedelta(seconds=2.5)
    assert envelope.body() == incoming.body  # the original bytes, not a re-encoding
    encoded = wire.encode(envelope)
    headers = encoded.headers
    assert encoded.message_id == "m-1"
    assert encoded.priority == 5
    assert headers[wire.ATTEMPT] == 3
    assert headers[wire.ENQUEUED_AT] == wire.to_millis(ENQUEUED)
    assert headers[wire.PARTITION_KEY] == "customer-9"
    assert headers["tenant"] == "acme"
    assert headers[RETRY_REASON] == "ValueError: x"
    assert "x-death" not in headers
    assert DELIVERY_COUNT not in headers


def test_a_promoted_message_is_retried_in_the_band_it_reached() -> None:
    incoming = delivery(priority=1)
    message = read_message(incoming, ORDERS, WARM)
    envelope = retry_envelope(
        incoming.body, incoming.headers, message, WARM, RetryLater(0, 2, "x"), wire.now()
    )
    assert envelope.priority == WARM.low
    assert envelope.deliver_at is None  # due now: straight to the band


def test_a_dead_letter_says_why_when_and_from_where() -> None:
    incoming = delivery(b"{broken", headers=bandgate_headers(**{DELIVERY_COUNT: 2}))
    message = read_message(incoming, ORDERS, HOT, decode=False)
    now = datetime(2026, 1, 2, 5, 0, tzinfo=UTC)
    dead = DeadLetter("malformed", "MalformedMessage: not JSON", "MalformedMessage")
    copy = dead_letter_message(
        incoming.body, incoming.headers, incoming.content_type, message, dead, now
    )
    assert copy.body == b"{broken"
    assert copy.message_id == "m-1"
    assert copy.headers[FAILURE_REASON] == "MalformedMessage: not JSON"
    assert copy.headers[FAILURE_CAUSE] == "malformed"
    assert copy.headers[FAILURE_TYPE] == "MalformedMessage"
    assert copy.headers[ATTEMPTS] == 2
    assert copy.headers[ORIGINAL_BAND] == "hot"
    assert copy.headers[FAILED_AT] == wire.to_millis(now)
    assert copy.headers["tenant"] == "acme"
    assert DELIVERY_COUNT not in copy.headers
