"""gateway.amqp_header writes content header frames itself: they must be byte for byte what
pamqp writes, for every property and header value, including the ones it hands to pamqp."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from pamqp import commands
from pamqp import frame as amqp_frame
from pamqp.header import ContentHeader

from gateway.amqp_header import content_header_frame
from topology import wire

short_text = st.text(max_size=40)
scalars = st.one_of(
    st.text(max_size=60),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=False, width=32),  # AMQP 'f' is a 32-bit float
    st.none(),
)
header_values = st.one_of(
    scalars,
    st.lists(scalars, max_size=3),  # arrays go to pamqp
    st.dictionaries(short_text, scalars, max_size=3),  # so do nested tables
    st.decimals(places=2, min_value=-1000, max_value=1000, allow_nan=False),
)
timestamps = st.datetimes(
    min_value=datetime(1970, 1, 2),
    max_value=datetime(2200, 1, 1),
    timezones=st.sampled_from([UTC, timezone(timedelta(hours=5))]),
)


def pamqp_frame(channel: int, size: int, properties: commands.Basic.Properties) -> bytes:
    return amqp_frame.marshal(ContentHeader(body_size=size, properties=properties), channel)


@given(
    channel=st.integers(min_value=1, max_value=2047),
    size=st.integers(min_value=0, max_value=2**40),
    content_type=st.one_of(st.none(), short_text),
    delivery_mode=st.one_of(st.none(), st.sampled_from([1, 2])),
    priority=st.one_of(st.none(), st.integers(min_value=0, max_value=9)),
    message_id=st.one_of(st.none(), short_text),
    correlation_id=st.one_of(st.none(), short_text),
    expiration=st.one_of(st.none(), st.integers(min_value=0, max_value=10**9).map(str)),
    timestamp=st.one_of(st.none(), timestamps),
    headers=st.one_of(st.none(), st.dictionaries(short_text, header_values, max_size=8)),
)
def test_frames_match_pamqp(
    channel: int,
    size: int,
    content_type: str | None,
    delivery_mode: int | None,
    priority: int | None,
    message_id: str | None,
    correlation_id: str | None,
    expiration: str | None,
    timestamp: datetime | None,
    headers: dict[str, Any] | None,
) -> None:
    properties = commands.Basic.Properties(
        content_type=content_type,
        delivery_mode=delivery_mode,
        priority=priority,
        message_id=message_id,
        correlation_id=correlation_id,
        expiration=expiration,
        timestamp=timestamp,
        headers=headers,
    )
    assert content_header_frame(channel, size, properties) == pamqp_frame(channel, size, properties)


def test_the_gateways_own_messages_match_pamqp() -> None:
    envelope = wire.Envelope(
        queue="orders",
        payload={"n": 1},
        priority=8,
        headers={"tenant": "acme", "retries": 3, "vip": True, "ratio": 0.5},
        partition_key="customer-7",
    )
    properties = wire.encode_properties(envelope)
    assert content_header_frame(1, 1024, properties) == pamqp_frame(1, 1024, properties)


def test_values_it_does_not_write_go_to_pamqp() -> None:
    properties = commands.Basic.Properties(
        headers={"amount": Decimal("1.25"), "tags": ["a", 1], "when": datetime(2026, 1, 1)}
    )
    assert content_header_frame(3, 10, properties) == pamqp_frame(3, 10, properties)
