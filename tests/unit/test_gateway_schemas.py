"""Request validation at the edge, without a broker."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from bandgate.gateway.errors import ApiError
from bandgate.gateway.schemas import parse_publish
from bandgate.topology.model import QueueSpec, Topology

TOPOLOGY = Topology(queues={"orders": QueueSpec(name="orders")})
ORDERS = TOPOLOGY.queue("orders")


def parse(body: Any) -> Any:
    return parse_publish(body, ORDERS, TOPOLOGY)


def error_of(body: Any, prefix: str = "") -> ApiError:
    with pytest.raises(ApiError) as caught:
        parse_publish(body, ORDERS, TOPOLOGY, prefix)
    return caught.value


def test_only_payload_is_required() -> None:
    envelope = parse({"payload": None})
    assert envelope.payload is None
    assert envelope.priority == 4
    assert envelope.deliver_at is None
    assert envelope.partition_key is None
    assert len(envelope.message_id) == 36


@pytest.mark.parametrize(("given", "expected"), [(0, 0), (9, 9), ("7", 7), ("HIGH", 7)])
def test_priorities_and_aliases(given: Any, expected: int) -> None:
    assert parse({"payload": 1, "priority": given}).priority == expected


@pytest.mark.parametrize(
    ("body", "status", "code", "field"),
    [
        ({}, 422, "missing_field", "payload"),
        ({"payload": 1, "priority": 10}, 422, "invalid_priority", "priority"),
        ({"payload": 1, "priority": True}, 422, "invalid_priority", "priority"),
        ({"payload": 1, "priority": 2.0}, 422, "invalid_priority", "priority"),
        ({"payload": 1, "delay_seconds": -0.1}, 422, "invalid_field", "delay_seconds"),
        ({"payload": 1, "delay_seconds": "5"}, 422, "invalid_field", "delay_seconds"),
        ({"payload": 1, "headers": {"x-bandgate-attempt": 9}}, 422, "invalid_field", "headers"),
        ({"payload": 1, "headers": {"a": [1]}}, 422, "invalid_field", "headers.a"),
        ({"payload": 1, "headers": {"big": 2**64}}, 422, "invalid_field", "headers"),
        ({"payload": 1, "message_id": "a\nb"}, 422, "invalid_field", "message_id"),
        ({"payload": 1, "partition_key": "k" * 257}, 422, "invalid_field", "partition_key"),
        ({"payload": 1, "surprise": 1}, 422, "unknown_field", "surprise"),
        ([1], 422, "invalid_body", None),
    ],
)
def test_bad_fields_name_themselves(body: Any, status: int, code: str, field: str | None) -> None:
    error = error_of(body)
    assert (error.status, error.code) == (status, code)
    assert error.field == field


def test_batch_items_are_prefixed_with_their_index() -> None:
    error = error_of({"payload": 1, "priority": 11}, prefix="messages.3")
    assert error.field == "messages.3.priority"


def test_delay_becomes_a_due_time_and_zero_means_now() -> None:
    envelope = parse({"payload": 1, "delay_seconds": 2.5})
    assert envelope.deliver_at is not None
    assert envelope.deliver_at - envelope.enqueued_at == timedelta(seconds=2.5)
    assert parse({"payload": 1, "delay_seconds": 0}).deliver_at is None


def test_deliver_at_needs_an_offset_and_excludes_delay() -> None:
    later = (datetime.now(UTC) + timedelta(minutes=5)).isoformat()
    assert parse({"payload": 1, "deliver_at": later}).deliver_at is not None
    assert error_of({"payload": 1, "deliver_at": "2030-01-01T00:00:00"}).field == "deliver_at"
    both = error_of({"payload": 1, "deliver_at": later, "delay_seconds": 1})
    assert both.code == "conflicting_fields"


def test_delays_beyond_the_ladder_are_refused() -> None:
    too_far = TOPOLOGY.ladder.max_delay_ms / 1000 + 10
    assert error_of({"payload": 1, "delay_seconds": too_far}).field == "delay_seconds"
