"""The producer refuses what the gateway refuses, with the same code and field (it applies the
same rules, `topology.publish_input`), and a refused call never touches the broker."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any, cast

import pytest
from aio_pika.abc import AbstractRobustConnection

from bandgate.core.producer import BatchMessage, Producer
from bandgate.core.publish_outcomes import InvalidMessage, NotEnqueued, UnknownQueue
from bandgate.gateway.errors import ApiError
from bandgate.gateway.schemas import parse_publish
from bandgate.topology.loader import parse_topology

TOPOLOGY = parse_topology({"delay": {"base_ms": 50, "levels": 12}, "queues": {"orders": {}}})
FAR = "2100-01-01T00:00:00Z"


class NoBroker:
    """A connection that fails the test when the producer touches it."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the producer used the broker ({name}) for a refused message")


@pytest.fixture
async def producer() -> AsyncIterator[Producer]:
    async with Producer(cast(AbstractRobustConnection, NoBroker()), TOPOLOGY) as producer:
        yield producer  # closing it leaves the connection alone: the producer does not own it


# (id, HTTP body fields, Python keyword arguments, code, field in the HTTP body)
CASES: list[tuple[str, dict[str, Any], dict[str, Any], str, str]] = [
    ("priority 10", {"priority": 10}, {"priority": 10}, "invalid_priority", "priority"),
    ("priority -1", {"priority": -1}, {"priority": -1}, "invalid_priority", "priority"),
    ("unknown alias", {"priority": "urgent"}, {"priority": "urgent"}, "invalid_priority",
     "priority"),
    ("bool priority", {"priority": True}, {"priority": True}, "invalid_priority", "priority"),
    ("float priority", {"priority": 7.5}, {"priority": 7.5}, "invalid_priority", "priority"),
    ("negative delay", {"delay_seconds": -1}, {"delay": -1}, "invalid_field", "delay_seconds"),
    ("delay as text", {"delay_seconds": "5"}, {"delay": "5"}, "invalid_field", "delay_seconds"),
    ("delay past the ladder", {"delay_seconds": 1e6}, {"delay": 1e6}, "invalid_field",
     "delay_seconds"),
    ("delay and deliver_at", {"delay_seconds": 1, "deliver_at": FAR},
     {"delay": 1, "deliver_at": datetime(2100, 1, 1, tzinfo=UTC)}, "conflicting_fields",
     "deliver_at"),
    ("deliver_at past the ladder", {"deliver_at": FAR},
     {"deliver_at": datetime(2100, 1, 1, tzinfo=UTC)}, "invalid_field", "deliver_at"),
    ("deliver_at without offset", {"deliver_at": "2030-01-01T00:00:00"},
     {"deliver_at": datetime(2030, 1, 1)}, "invalid_field", "deliver_at"),
    ("reserved header", {"headers": {"x-death": "a"}}, {"headers": {"x-death": "a"}},
     "invalid_field", "headers"),
    ("bad header name", {"headers": {"a b": "c"}}, {"headers": {"a b": "c"}}, "invalid_field",
     "headers"),
    ("nested header value", {"headers": {"a": [1]}}, {"headers": {"a": [1]}}, "invalid_field",
     "headers.a"),
    ("header beyond int64", {"headers": {"big": 2**64}}, {"headers": {"big": 2**64}},
     "invalid_field", "headers"),
    ("long header value", {"headers": {"a": "v" * 4097}}, {"headers": {"a": "v" * 4097}},
     "invalid_field", "headers"),
    ("33 headers", {"headers": {f"h{i}": i for i in range(33)}},
     {"headers": {f"h{i}": i for i in range(33)}}, "invalid_field", "headers"),
    ("empty message id", {"message_id": ""}, {"message_id": ""}, "invalid_field", "message_id"),
    ("message id with newline", {"message_id": "a\nb"}, {"message_id": "a\nb"}, "invalid_field",
     "message_id"),
    ("message id over 255 bytes", {"message_id": "é" * 128}, {"message_id": "é" * 128},
     "invalid_field", "message_id"),
    ("message id over 128 characters", {"message_id": "m" * 129}, {"message_id": "m" * 129},
     "invalid_field", "message_id"),
    ("long partition key", {"partition_key": "k" * 257}, {"partition_key": "k" * 257},
     "invalid_field", "partition_key"),
    ("partition key with tab", {"partition_key": "a\tb"}, {"partition_key": "a\tb"},
     "invalid_field", "partition_key"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("body", "kwargs", "code", "field"),
    [pytest.param(*case[1:], id=case[0]) for case in CASES],
)
async def test_the_producer_refuses_what_the_gateway_refuses(
    producer: Producer, body: dict[str, Any], kwargs: dict[str, Any], code: str, field: str
) -> None:
    with pytest.raises(ApiError) as http:
        parse_publish({"payload": 1, **body}, TOPOLOGY.queue("orders"), TOPOLOGY)
    assert (http.value.status, http.value.code, http.value.field) == (422, code, field)
    with pytest.raises(InvalidMessage) as python:
        await producer.publish("orders", 1, **kwargs)
    python_field = "delay" if field == "delay_seconds" else field
    assert (python.value.code, python.value.field) == (code, python_field)
    assert isinstance(python.value, NotEnqueued)


async def test_an_unknown_queue_is_refused_before_anything_else(producer: Producer) -> None:
    with pytest.raises(UnknownQueue) as caught:
        await producer.publish("nope", 1, priority=99)
    assert (caught.value.code, caught.value.field) == ("unknown_queue", "queue")
    with pytest.raises(UnknownQueue):
        await producer.publish_batch("nope", [{"payload": 1}])


async def test_a_batch_of_refused_messages_reports_each_and_sends_nothing(
    producer: Producer,
) -> None:
    messages = cast(
        list[BatchMessage],
        [
            {"payload": 1, "priority": 10},
            {"priority": 1},
            {"payload": 1, "prio": 1},
            "not a message",
            {"payload": 1, "delay": -1},
        ],
    )
    result = await producer.publish_batch("orders", messages)
    assert result.successful == []
    assert [(index, failure.code) for index, failure in result.failed] == [
        (0, "invalid_priority"),
        (1, "missing_field"),
        (2, "unknown_field"),
        (3, "invalid_body"),
        (4, "invalid_field"),
    ]
    fields = [getattr(failure, "field", None) for _, failure in result.failed]
    assert fields == ["priority", "payload", "prio", None, "delay"]


async def test_a_closed_producer_refuses_at_once(producer: Producer) -> None:
    await producer.close()
    with pytest.raises(NotEnqueued, match="closed"):
        await producer.publish("orders", 1)
