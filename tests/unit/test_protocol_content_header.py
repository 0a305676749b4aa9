"""bandgate.core.protocol.content_header writes content header frames itself: they must be
byte for byte what pamqp writes, for every property and header value, including the ones it
hands to pamqp; the one difference is a top-level float header, written as a 64-bit double,
which pamqp must read back as the same value."""

from __future__ import annotations

import struct
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

from hypothesis import assume, given
from hypothesis import strategies as st
from pamqp import commands
from pamqp import frame as amqp_frame
from pamqp.header import ContentHeader

from bandgate.core.protocol.content_header import content_header_frame
from bandgate.topology import wire

short_text = st.text(max_size=40)
scalars = st.one_of(
    st.text(max_size=60),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=False),
    st.none(),
)
pamqp_scalars = st.one_of(scalars.filter(lambda v: not isinstance(v, float)), st.floats(width=32))
header_values = st.one_of(
    scalars,
    st.lists(pamqp_scalars, max_size=3),  # arrays go to pamqp (which writes 32-bit floats)
    st.dictionaries(short_text, pamqp_scalars, max_size=3),  # so do nested tables
    st.decimals(places=2, min_value=-1000, max_value=1000, allow_nan=False),
)
timestamps = st.datetimes(
    min_value=datetime(1970, 1, 2),
    max_value=datetime(2200, 1, 1),
    timezones=st.sampled_from([UTC, timezone(timedelta(hours=5))]),
)


def pamqp_frame(channel: int, size: int, properties: commands.Basic.Properties) -> bytes:
    return amqp_frame.marshal(ContentHeader(body_size=size, properties=properties), channel)


def _f32(value: float) -> bool:
    try:
        read: float = struct.unpack(">f", struct.pack(">f", value))[0]
    except OverflowError:
        return False
    return read == value


def read_back(frame: bytes) -> ContentHeader:
    _, channel, header = amqp_frame.unmarshal(frame)
    assert isinstance(header, ContentHeader)
    return header


def assert_as_pamqp(channel: int, size: int, properties: commands.Basic.Properties) -> None:
    """Byte for byte pamqp's frame, or, with top-level floats, a frame pamqp reads back whole."""
    headers = properties.headers or {}
    flat = all(not isinstance(value, list | dict | Decimal) for value in headers.values())
    if not flat:  # pamqp writes the whole frame, top-level floats as 32-bit ones
        assume(all(_f32(value) for value in headers.values() if isinstance(value, float)))
    ours = content_header_frame(channel, size, properties)
    if not flat or not any(isinstance(value, float) for value in headers.values()):
        assert ours == pamqp_frame(channel, size, properties)
        return
    others = commands.Basic.Properties(
        **{name: getattr(properties, name) for name in properties.attributes() if name != "headers"}
    )
    header, reference = read_back(ours), read_back(pamqp_frame(channel, size, others))
    assert header.body_size == size
    assert header.properties.headers == headers
    for name in ("content_type", "delivery_mode", "priority", "message_id", "timestamp"):
        assert getattr(header.properties, name) == getattr(reference.properties, name)


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
    assert_as_pamqp(channel, size, properties)


def test_the_gateways_own_messages_match_pamqp() -> None:
    envelope = wire.Envelope(
        queue="orders",
        payload={"n": 1},
        priority=8,
        headers={"tenant": "acme", "retries": 3, "vip": True, "ratio": 0.5},
        partition_key="customer-7",
    )
    properties = wire.encode_properties(envelope)
    assert_as_pamqp(1, 1024, properties)


def test_float_headers_keep_their_double_precision_and_range() -> None:
    headers: dict[str, Any] = {"price": 19.99, "huge": 1e300, "tiny": -5e-324}
    properties = commands.Basic.Properties(headers=headers)
    assert read_back(content_header_frame(1, 1, properties)).properties.headers == headers


def test_values_it_does_not_write_go_to_pamqp() -> None:
    properties = commands.Basic.Properties(
        headers={"amount": Decimal("1.25"), "tags": ["a", 1], "when": datetime(2026, 1, 1)}
    )
    assert content_header_frame(3, 10, properties) == pamqp_frame(3, 10, properties)
