from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import aio_pika

from bandgate.topology import wire
from bandgate.topology.wire import Envelope, HeaderValue

ENQUEUED = datetime(2026, 1, 2, 3, 4, 5, 678_000, tzinfo=UTC)


def test_encode_is_a_persistent_json_message_with_its_priority_and_id() -> None:
    envelope = Envelope(
        queue="orders",
        payload={"order": 1, "items": ["a"]},
        priority=8,
        message_id="m-1",
        enqueued_at=ENQUEUED,
    )
    message = wire.encode(envelope)
    assert message.delivery_mode == aio_pika.DeliveryMode.PERSISTENT
    assert message.priority == 8
    assert message.message_id == "m-1"
    assert message.content_type == "application/json"
    # AMQP's timestamp property has whole seconds on the wire: the header keeps milliseconds.
    assert message.timestamp == ENQUEUED
    assert message.headers[wire.ENQUEUED_AT] == wire.to_millis(ENQUEUED)
    assert wire.decode_body(message.body) == {"order": 1, "items": ["a"]}


def test_encode_headers_carry_bandgate_fields_and_the_producer_headers() -> None:
    deliver_at = ENQUEUED + timedelta(seconds=30)
    envelope = Envelope(
        queue="orders",
        payload=None,
        priority=0,
        enqueued_at=ENQUEUED,
        deliver_at=deliver_at,
        headers={"tenant": "acme", "retries": 3, "vip": True, "score": 0.5},
        partition_key="customer-7",
        attempt=2,
    )
    headers = wire.encode(envelope).headers
    assert headers[wire.ENQUEUED_AT] == wire.to_millis(ENQUEUED) == 1767323045678
    assert headers[wire.DELIVER_AT] == wire.to_millis(deliver_at)
    assert headers[wire.QUEUE] == "orders"
    assert headers[wire.ATTEMPT] == 2
    assert headers[wire.PARTITION_KEY] == "customer-7"
    assert wire.user_headers(headers) == {"tenant": "acme", "retries": 3, "vip": True, "score": 0.5}


def test_optional_headers_are_absent_when_unset() -> None:
    headers = wire.encode(Envelope(queue="orders", payload=1, priority=4)).headers
    assert wire.DELIVER_AT not in headers
    assert wire.PARTITION_KEY not in headers
    assert headers[wire.ATTEMPT] == 1


def test_broker_death_headers_are_dropped() -> None:
    """A republish carrying x-death through the same delay levels is dropped silently by the
    broker's dead-letter cycle detection (seen on 3.10.8)."""
    copied: dict[str, HeaderValue] = {name: "x" for name in wire.BROKER_DEATH_HEADERS}
    received: dict[str, object] = {**copied, "x-death": [{"count": 1, "queue": "orders.hot"}]}
    for envelope in (
        Envelope(queue="orders", payload=1, priority=4, headers=copied),
        Envelope(queue="orders", payload=1, priority=4, extra_headers=received),
    ):
        headers = wire.encode(envelope).headers
        assert not set(wire.BROKER_DEATH_HEADERS) & set(headers)


def test_extra_headers_travel_but_are_not_user_headers() -> None:
    envelope = Envelope(
        queue="orders",
        payload=1,
        priority=4,
        headers={"tenant": "acme"},
        extra_headers={"traceparent": "00-abc-def-01", "x-bandgate-reason": "boom"},
    )
    headers = wire.encode(envelope).headers
    assert headers["traceparent"] == "00-abc-def-01"
    assert wire.user_headers(headers) == {"tenant": "acme"}


def test_a_given_body_is_used_as_is() -> None:
    message = wire.encode(Envelope(queue="orders", payload={"a": 1}, priority=4), body=b'{"a":1}')
    assert message.body == b'{"a":1}'


def test_delay_is_measured_to_deliver_at_and_never_negative() -> None:
    at = ENQUEUED
    assert Envelope(queue="q", payload=1, priority=4).delay_ms(at) == 0
    later = Envelope(queue="q", payload=1, priority=4, deliver_at=at + timedelta(seconds=2))
    assert later.delay_ms(at) == 2000
    past = Envelope(queue="q", payload=1, priority=4, deliver_at=at - timedelta(seconds=2))
    assert past.delay_ms(at) == 0


def test_millis_round_trip() -> None:
    assert wire.from_millis(wire.to_millis(ENQUEUED)) == ENQUEUED


def test_new_ids_are_unique() -> None:
    assert len({wire.new_message_id() for _ in range(100)}) == 100


def test_every_message_carries_the_shard_key_its_band_hashes_on() -> None:
    keyed = wire.encode(Envelope(queue="orders", payload=1, priority=4, partition_key="c-7"))
    assert keyed.headers[wire.SHARD_KEY] == "c-7"
    plain = wire.encode(Envelope(queue="orders", payload=1, priority=4, message_id="m-9"))
    assert plain.headers[wire.SHARD_KEY] == "m-9"
    # A copy (retry, dead letter, replay) computes it again from its own fields.
    copied = wire.encode(
        Envelope(
            queue="orders",
            payload=1,
            priority=4,
            partition_key="c-8",
            extra_headers={wire.SHARD_KEY: "stale"},
        )
    )
    assert copied.headers[wire.SHARD_KEY] == "c-8"
    assert wire.SHARD_KEY not in wire.user_headers(copied.headers)


def test_encode_and_encode_properties_agree() -> None:
    """The publisher sends `encode_properties` as is; `encode` must make the same message."""
    envelope = Envelope(
        queue="orders",
        payload={"n": 1},
        priority=7,
        enqueued_at=ENQUEUED,
        deliver_at=ENQUEUED + timedelta(seconds=5),
        headers={"tenant": "acme"},
        partition_key="p",
    )
    properties = wire.encode_properties(envelope)
    assert wire.encode(envelope).properties == properties
    assert properties.delivery_mode == 2  # persistent
    assert properties.content_type == wire.CONTENT_TYPE


def test_new_message_ids_are_random_uuid4_text() -> None:
    ids = {wire.new_message_id() for _ in range(1000)}
    assert len(ids) == 1000
    for text in ids:
        parsed = uuid.UUID(text)
        assert str(parsed) == text
        assert parsed.version == 4
        assert parsed.variant == uuid.RFC_4122


def test_without_broker_priority_the_priority_travels_in_a_header() -> None:
    """Ordered queues and dead letters: the broker must keep publish order, so it sees no
    AMQP priority; readers take the header first."""
    envelope = Envelope(queue="orders", payload=1, priority=8)
    properties = wire.encode_properties(envelope, broker_priority=False)
    assert properties.priority is None
    assert properties.headers is not None
    assert properties.headers[wire.PRIORITY] == 8
    assert wire.read_priority(properties.priority, properties.headers) == 8
    assert wire.read_priority(3, {}) == 3
    assert wire.read_priority(None, {}) is None


def test_a_republish_with_broker_priority_drops_a_carried_priority_header() -> None:
    envelope = Envelope(queue="orders", payload=1, priority=2, extra_headers={wire.PRIORITY: 9})
    properties = wire.encode_properties(envelope)
    assert properties.priority == 2
    assert properties.headers is not None
    assert wire.PRIORITY not in properties.headers
