"""bandgate.core.protocol.frames reads content header frames itself: for every frame, what it
returns must be what pamqp returns (or pamqp must be the one to read it), value for value."""

from __future__ import annotations

import struct
from datetime import UTC, datetime
from typing import Any

import pamqp.frame
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pamqp import commands
from pamqp.header import ContentHeader

from bandgate.core.protocol import frames

PAMQP = frames._PAMQP_UNMARSHAL

scalars = st.one_of(
    st.text(max_size=60),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(width=32),  # pamqp writes floats as 32-bit ones
    st.none(),
)
header_values = st.one_of(
    scalars,
    st.lists(scalars, max_size=3),  # arrays and nested tables: pamqp reads those
    st.dictionaries(st.text(max_size=10), scalars, max_size=3),
    st.decimals(places=2, min_value=-1000, max_value=1000, allow_nan=False),
    st.datetimes(min_value=datetime(1970, 1, 2), timezones=st.just(UTC)),
)
short_text = st.text(max_size=40).filter(lambda text: len(text.encode()) < 256)
properties = st.builds(
    commands.Basic.Properties,
    content_type=st.none() | short_text,
    content_encoding=st.none() | short_text,
    headers=st.none() | st.dictionaries(short_text, header_values, max_size=6),
    delivery_mode=st.none() | st.sampled_from([1, 2]),
    priority=st.none() | st.integers(0, 255),
    correlation_id=st.none() | short_text,
    reply_to=st.none() | short_text,
    expiration=st.none() | short_text,
    message_id=st.none() | short_text,
    timestamp=st.none()
    | st.datetimes(min_value=datetime(1970, 1, 2), max_value=datetime(2100, 1, 1)).map(
        lambda moment: moment.replace(microsecond=0, tzinfo=UTC)
    ),
    message_type=st.none() | short_text,
    user_id=st.none() | short_text,
    app_id=st.none() | short_text,
)


def same(left: Any, right: Any) -> bool:
    """Equal, with floats equal by their bits (NaN is not equal to itself)."""
    if isinstance(left, float) and isinstance(right, float):
        return struct.pack(">d", left) == struct.pack(">d", right) or left == right
    if isinstance(left, dict) and isinstance(right, dict):
        return left.keys() == right.keys() and all(same(left[k], right[k]) for k in left)
    if isinstance(left, list) and isinstance(right, list):
        return len(left) == len(right) and all(map(same, left, right))
    return type(left) is type(right) and left == right


def assert_as_pamqp(data: bytes) -> None:
    try:
        expected = PAMQP(data)
    except Exception as error:
        with pytest.raises(type(error)):
            frames.unmarshal(data)
        return
    consumed, channel, frame = frames.unmarshal(data)
    assert (consumed, channel) == expected[:2]
    assert type(frame) is type(expected[2])
    if not isinstance(frame, ContentHeader):
        slots = getattr(frame, "__slots__", ())
        assert [getattr(frame, name) for name in slots] == [
            getattr(expected[2], name) for name in slots
        ]
        return
    reference = expected[2]
    assert isinstance(reference, ContentHeader)
    assert (frame.class_id, frame.weight, frame.body_size) == (
        reference.class_id,
        reference.weight,
        reference.body_size,
    )
    for name in commands.Basic.Properties.__slots__:
        assert same(getattr(frame.properties, name), getattr(reference.properties, name)), name


@given(st.integers(0, 65535), st.integers(0, 2**63 - 1), properties)
def test_a_header_frame_reads_as_pamqp_reads_it(
    channel: int, size: int, props: commands.Basic.Properties
) -> None:
    assert_as_pamqp(pamqp.frame.marshal(ContentHeader(body_size=size, properties=props), channel))


def table_entry(key: bytes, kind: bytes, value: bytes) -> bytes:
    return bytes([len(key)]) + key + kind + value


VALUES = {
    b"t": st.integers(0, 255).map(lambda v: struct.pack(">B", v)),
    b"b": st.integers(-128, 127).map(lambda v: struct.pack(">b", v)),
    b"B": st.integers(0, 255).map(lambda v: struct.pack(">B", v)),
    b"s": st.integers(-(2**15), 2**15 - 1).map(lambda v: struct.pack(">h", v)),
    b"u": st.integers(0, 2**16 - 1).map(lambda v: struct.pack(">H", v)),
    b"I": st.integers(-(2**31), 2**31 - 1).map(lambda v: struct.pack(">l", v)),
    b"i": st.integers(0, 2**32 - 1).map(lambda v: struct.pack(">L", v)),
    b"l": st.integers(-(2**63), 2**63 - 1).map(lambda v: struct.pack(">q", v)),
    b"L": st.integers(-(2**63), 2**63 - 1).map(lambda v: struct.pack(">q", v)),
    b"f": st.binary(min_size=4, max_size=4),
    b"d": st.binary(min_size=8, max_size=8),
    b"S": st.binary(max_size=20).map(lambda v: struct.pack(">L", len(v)) + v),  # not all UTF-8
    b"V": st.just(b""),
    b"\x00": st.just(b""),
    b"x": st.binary(max_size=8).map(lambda v: struct.pack(">L", len(v)) + v),
    b"D": st.binary(min_size=5, max_size=5),
}
entries = st.lists(
    st.tuples(st.binary(max_size=8), st.sampled_from(sorted(VALUES))).flatmap(
        lambda pair: VALUES[pair[1]].map(lambda value: table_entry(pair[0], pair[1], value))
    ),
    max_size=6,
)


def header_frame(payload: bytes, channel: int = 1) -> bytes:
    return struct.pack(">BHI", 2, channel, len(payload)) + payload + b"\xce"


@given(entries, st.integers(0, 2**64 - 1))
def test_every_table_value_type_reads_as_pamqp_reads_it(table: list[bytes], stamp: int) -> None:
    """Written by hand: pamqp's writer picks one type per Python type, the broker others."""
    body = b"".join(table)
    flags = (1 << 13) | (1 << 6)  # headers, timestamp
    payload = struct.pack(">HHQH", 60, 0, 10, flags) + struct.pack(">L", len(body)) + body
    assert_as_pamqp(header_frame(payload + struct.pack(">Q", stamp)))


@given(st.binary(max_size=80), st.integers(0, 2**16 - 1), st.integers(-3, 3))
def test_any_bytes_read_as_pamqp_reads_them(payload: bytes, flags: int, size_error: int) -> None:
    """Truncated, overlong and garbled frames: the same value or the same exception."""
    body = struct.pack(">HHQH", 60, 0, 1, flags) + payload
    frame = struct.pack(">BHI", 2, 1, max(0, len(body) + size_error)) + body + b"\xce"
    assert_as_pamqp(frame)
    assert_as_pamqp(frame[:-1] + b"\x00")


def test_other_frames_go_to_pamqp() -> None:
    deliver = commands.Basic.Deliver("tag", 7, False, "bandgate", "orders.8")
    for frame in (deliver, commands.Basic.Ack(3)):
        data = pamqp.frame.marshal(frame, 5)
        assert_as_pamqp(data)
        assert frames.unmarshal(data)[2].__class__ is type(frame)


def test_a_delivery_header_as_the_gateway_writes_it() -> None:
    props = commands.Basic.Properties(
        content_type="application/json",
        headers={"x-bandgate-enqueued-ms": 1_764_000_000_123, "trace": "00-ab", "ok": True},
        delivery_mode=2,
        priority=8,
        message_id="m-1",
        timestamp=datetime(2026, 11, 24, 18, 0, tzinfo=UTC),
    )
    data = pamqp.frame.marshal(ContentHeader(body_size=1024, properties=props), 3)
    consumed, channel, frame = frames._content_header(data)  # read here, not by pamqp
    assert (consumed, channel) == (len(data), 3)
    assert frame.properties == props
    assert frame.body_size == 1024
    assert frame.class_id == commands.Basic.frame_id


@given(
    st.integers(0, 65535),
    short_text,
    st.integers(0, 2**63 - 1),
    st.booleans(),
    st.text("abcXYZ019-_.:", max_size=127),  # what an exchange name may hold
    short_text,
)
def test_a_deliver_frame_reads_as_pamqp_reads_it(
    channel: int, tag: str, delivery_tag: int, redelivered: bool, exchange: str, key: str
) -> None:
    deliver = commands.Basic.Deliver(tag, delivery_tag, redelivered, exchange, key)
    data = pamqp.frame.marshal(deliver, channel)
    assert_as_pamqp(data)
    consumed, read_channel, method = frames._deliver(data, channel, len(data) - 8)  # not pamqp
    assert (consumed, read_channel) == (len(data), channel)
    assert isinstance(method, commands.Basic.Deliver)
    for name in commands.Basic.Deliver.__slots__:
        assert getattr(method, name) == getattr(deliver, name), name


@given(st.binary(max_size=60), st.integers(-3, 3))
def test_any_deliver_bytes_read_as_pamqp_reads_them(payload: bytes, size_error: int) -> None:
    body = struct.pack(">I", commands.Basic.Deliver.index) + payload
    frame = struct.pack(">BHI", 1, 1, max(0, len(body) + size_error)) + body + b"\xce"
    assert_as_pamqp(frame)
