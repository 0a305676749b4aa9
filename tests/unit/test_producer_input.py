"""The producer refuses what the gateway refuses, with the same code and field (it applies the
same rules, `topology.publish_input`), and a refused call never touches the broker."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any, cast

import orjson
import pytest
from aio_pika.abc import AbstractRobustConnection

from bandgate.core import error_codes
from bandgate.core.producer import (
    BatchMessage,
    NotJson,
    PayloadTooLarge,
    Producer,
    ProducerSettings,
)
from bandgate.core.publish_outcomes import InvalidMessage, NotEnqueued, UnknownQueue
from bandgate.gateway.errors import ApiError
from bandgate.gateway.json_input import MalformedJson, parse_json
from bandgate.gateway.middleware import too_large
from bandgate.gateway.schemas import parse_publish
from bandgate.gateway.settings import GatewaySettings
from bandgate.topology.loader import parse_topology
from bandgate.topology.publish_input import (
    MAX_BODY_BYTES,
    MAX_PAYLOAD_DEPTH,
    InputRule,
    MessageInputError,
    payload_body,
)

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


# (id, Python payload or headers, the HTTP body a client would send for it)
NOT_JSON: list[tuple[str, dict[str, Any], bytes]] = [
    ("NaN header", {"headers": {"a": float("nan")}}, b'{"payload":1,"headers":{"a":NaN}}'),
    ("inf header", {"headers": {"a": float("inf")}}, b'{"payload":1,"headers":{"a":1e999}}'),
    ("-inf header", {"headers": {"a": -float("inf")}}, b'{"payload":1,"headers":{"a":-1e999}}'),
    ("surrogate header", {"headers": {"a": "\ud800"}}, b'{"payload":1,"headers":{"a":"\\ud800"}}'),
    ("NaN payload", {"payload": float("nan")}, b'{"payload":NaN}'),
    ("inf in a payload", {"payload": {"a": [float("inf")]}}, b'{"payload":{"a":[1e999]}}'),
    ("datetime payload", {"payload": datetime(2030, 1, 1, tzinfo=UTC)},
     b'{"payload":datetime(2030, 1, 1)}'),
    ("tuple payload", {"payload": (1, 2)}, b'{"payload":(1, 2)}'),
    ("integer key", {"payload": {1: 2}}, b'{"payload":{1:2}}'),
    ("integer past 2^64", {"payload": 2**64}, b'{"payload":18446744073709551616}'),
]  # fmt: skip


@pytest.mark.parametrize(
    ("kwargs", "body"), [pytest.param(*case[1:], id=case[0]) for case in NOT_JSON]
)
async def test_the_producer_refuses_what_no_json_body_holds(
    producer: Producer, kwargs: dict[str, Any], body: bytes
) -> None:
    """The gateway answers such a body `malformed_json`; the producer raises `NotJson` with
    that code, before anything is sent (a NaN header would close the AMQP connection)."""
    with pytest.raises(MalformedJson):
        parse_json(body)
    payload = kwargs.pop("payload", 1)
    with pytest.raises(NotJson) as python:
        await producer.publish("orders", payload, **kwargs)
    assert python.value.code == "malformed_json" == error_codes.MALFORMED_JSON.code
    assert python.value.field in {"payload", "headers.a"}
    message = cast(BatchMessage, {"payload": payload, **kwargs})
    result = await producer.publish_batch("orders", [message])
    assert [failure.code for _, failure in result.failed] == ["malformed_json"]


async def test_a_payload_over_the_body_limit_is_refused_as_the_gateway_does(
    producer: Producer,
) -> None:
    assert producer.max_body_bytes == GatewaySettings.model_fields["max_body_bytes"].default
    with pytest.raises(PayloadTooLarge) as caught:
        await producer.publish("orders", "x" * MAX_BODY_BYTES)
    assert (caught.value.code, caught.value.field) == (too_large(1).code, "payload")
    assert caught.value.error.status == 413
    assert payload_body("x" * (MAX_BODY_BYTES - 2)) == orjson.dumps("x" * (MAX_BODY_BYTES - 2))


async def test_the_body_limit_is_the_gateways_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BANDGATE_MAX_BODY_BYTES", "100")
    assert ProducerSettings().max_body_bytes == 100 == GatewaySettings().max_body_bytes
    small = Producer(cast(AbstractRobustConnection, NoBroker()), TOPOLOGY, max_body_bytes=100)
    with pytest.raises(PayloadTooLarge):
        await small.publish("orders", "x" * 99)
    await small.close()


def test_payload_rules() -> None:
    assert payload_body({"a": [1, 2.5, None, True, "é"], "big": 2**64 - 1}) == (
        b'{"a":[1,2.5,null,true,"\xc3\xa9"],"big":18446744073709551615}'
    )
    deep: Any = 1
    for _ in range(MAX_PAYLOAD_DEPTH):
        deep = [deep]
    assert payload_body(deep)
    with pytest.raises(MessageInputError) as caught:
        payload_body([deep])
    assert caught.value.rule is InputRule.INVALID  # the gateway answers 422, as for this body
    for value in (float("nan"), [float("-inf")], datetime(2030, 1, 1), (1,), {1: 1}, -(2**63) - 1):
        with pytest.raises(MessageInputError) as caught:
            payload_body(value)
        assert caught.value.rule is InputRule.NOT_JSON, value
    with pytest.raises(MessageInputError) as caught:
        payload_body("xx", max_bytes=3)
    assert caught.value.rule is InputRule.TOO_LARGE
    assert error_codes.for_rule(InputRule.NOT_JSON) is error_codes.MALFORMED_JSON
    assert error_codes.for_rule(InputRule.TOO_LARGE) is error_codes.BODY_TOO_LARGE
