"""A delivery's frames, read directly: its `basic.deliver` and its content header.

aiormq reads every frame with `pamqp.frame.unmarshal`, which decodes each field through a
generic type dispatch and copies the rest of the frame after each one: the content header
alone was 11-13 % of the worker's CPU per message in a drain, and `basic.deliver` 7 % (py-spy,
`bench consume`'s scenario), together nearly the whole bandgate pipeline after them. Their
fields are known and a delivery's headers are a flat table of strings, numbers and booleans,
so `unmarshal` reads those with `struct` at offsets, and gives every other frame (other
methods, bodies, heartbeats), and any header with anything else in it (nested tables, arrays,
decimals, byte arrays, timestamps in the table, a second flag word, a malformed frame), to
pamqp. A property-based test checks it against pamqp, value for value.

`install()` puts it in place of `pamqp.frame.unmarshal`, which aiormq looks up on every frame:
the worker does so when it starts. pamqp's own function is kept and called for the rest.
"""

from __future__ import annotations

import struct
from datetime import UTC, datetime
from typing import Any

import pamqp.frame
from pamqp import commands, header

from bandgate.core.protocol import compat

compat.check_amqp()  # this module reads pamqp's internals

_PAMQP_UNMARSHAL = pamqp.frame.unmarshal

_FRAME = struct.Struct(">BHI")  # type, channel, size
_CONTENT = struct.Struct(">HHQH")  # class, weight, body size, the first flag word
_FRAME_END = 0xCE
_METHOD_FRAME, _HEADER_FRAME = 1, 2
_DELIVER = struct.Struct(">BHII")  # type, channel, size, class and method (basic.deliver)
_DELIVER_INDEX = commands.Basic.Deliver.index
_PAYLOAD_AT = _FRAME.size + _CONTENT.size  # the first property

_Properties = commands.Basic.Properties
# (name, flag bit, AMQP type), in the order the properties are written: pamqp's own table.
_LAYOUT = tuple(
    (name, _Properties.flags[name], getattr(_Properties, f"_{name}"))
    for name in _Properties.__slots__
)

_U8 = struct.Struct(">B")
_I8 = struct.Struct(">b")
_I16 = struct.Struct(">h")
_U16 = struct.Struct(">H")
_I32 = struct.Struct(">l")
_U32 = struct.Struct(">L")
_I64 = struct.Struct(">q")
_U64 = struct.Struct(">Q")
_F32 = struct.Struct(">f")
_F64 = struct.Struct(">d")
# Fixed-size table values: type byte -> (struct, as bool).
_FIXED = {
    ord("t"): (_U8, True),
    ord("b"): (_I8, False),
    ord("B"): (_U8, False),
    ord("s"): (_I16, False),
    ord("u"): (_U16, False),
    ord("I"): (_I32, False),
    ord("i"): (_U32, False),
    ord("l"): (_I64, False),
    ord("L"): (_I64, False),  # pamqp reads `L` signed too
    ord("f"): (_F32, False),
    ord("d"): (_F64, False),
}
_LONG_STR = ord("S")
_VOID = ord("V")


class _NotPlain(Exception):
    """Something this reader leaves to pamqp."""


def unmarshal(data: bytes) -> tuple[int, int, Any]:
    """What `pamqp.frame.unmarshal(data)` returns: bytes consumed, channel, frame."""
    kind = data[0] if data else None
    try:
        if kind == _HEADER_FRAME:
            return _content_header(data)
        if kind == _METHOD_FRAME:
            _, channel, size, method = _DELIVER.unpack_from(data)
            if method == _DELIVER_INDEX:
                return _deliver(data, channel, size)
    except Exception:  # pamqp reads it, or raises what it raises
        pass
    return _PAMQP_UNMARSHAL(data)


def _frame_end(data: bytes, size: int) -> int:
    """Where the frame end octet is; `_NotPlain` if it is not there."""
    end = _FRAME.size + size
    if not size or len(data) <= end or data[end] != _FRAME_END:
        raise _NotPlain
    return end


def _short_str(data: bytes, offset: int, end: int) -> tuple[int, str]:
    start = offset + 1
    offset = start + data[offset]
    if offset > end:
        raise _NotPlain
    return offset, data[start:offset].decode("utf-8")


def _deliver(data: bytes, channel: int, size: int) -> tuple[int, int, commands.Basic.Deliver]:
    """A `basic.deliver` frame (`unmarshal` read its channel, size and method)."""
    end = _frame_end(data, size)
    offset, consumer_tag = _short_str(data, _DELIVER.size, end)
    if offset + 9 > end:
        raise _NotPlain
    delivery_tag = _I64.unpack_from(data, offset)[0]
    redelivered = data[offset + 8] & 1 != 0
    offset, exchange = _short_str(data, offset + 9, end)
    offset, routing_key = _short_str(data, offset, end)
    method = commands.Basic.Deliver(consumer_tag, delivery_tag, redelivered, exchange, routing_key)
    return end + 1, channel, method


def _content_header(data: bytes) -> tuple[int, int, header.ContentHeader]:
    _, channel, size = _FRAME.unpack_from(data)
    end = _frame_end(data, size)
    class_id, weight, body_size, flags = _CONTENT.unpack_from(data, _FRAME.size)
    if flags & 1:
        raise _NotPlain  # a second flag word: no property of Basic needs one
    properties = _Properties()
    offset = _PAYLOAD_AT
    for name, flag, kind in _LAYOUT:
        if not flags & flag:
            continue
        value: Any
        if kind == "shortstr":
            offset, value = _short_str(data, offset, end)
        elif kind == "octet":
            if offset >= end:
                raise _NotPlain
            value = data[offset]
            offset += 1
        elif kind == "timestamp":
            if offset + 8 > end:
                raise _NotPlain
            stamp: float = _U64.unpack_from(data, offset)[0]
            if stamp > 0xFFFFFFFF:  # pamqp: after the year 2106, milliseconds
                stamp /= 1000.0
            value = datetime.fromtimestamp(stamp, tz=UTC)
            offset += 8
        elif kind == "table":
            offset, value = _table(data, offset, end)
        else:
            raise _NotPlain
        setattr(properties, name, value)
    content = header.ContentHeader(weight, body_size, properties)
    content.class_id = class_id
    return end + 1, channel, content


def _table(data: bytes, offset: int, end: int) -> tuple[int, dict[str, Any]]:
    """A field table of scalars at `offset`: the offset after it, and the table."""
    if offset + 4 > end:
        raise _NotPlain
    table_end = offset + 4 + _U32.unpack_from(data, offset)[0]
    if table_end > end:
        raise _NotPlain
    offset += 4
    table: dict[str, Any] = {}
    while offset < table_end:
        key_at = offset + 1
        offset = key_at + data[offset]
        if offset >= table_end:
            raise _NotPlain
        key = data[key_at:offset].decode("utf-8")
        kind = data[offset]
        offset += 1
        value: Any
        if kind == _LONG_STR:
            if offset + 4 > table_end:
                raise _NotPlain
            start = offset + 4
            offset = start + _U32.unpack_from(data, offset)[0]
            if offset > table_end:
                raise _NotPlain
            raw = data[start:offset]
            try:
                value = raw.decode("utf-8")
            except UnicodeDecodeError:
                value = raw  # as pamqp: bytes that are not UTF-8 stay bytes
        elif kind in _FIXED:
            reader, as_bool = _FIXED[kind]
            if offset + reader.size > table_end:
                raise _NotPlain
            value = reader.unpack_from(data, offset)[0]
            if as_bool:
                value = bool(value)
            offset += reader.size
        elif kind == _VOID:
            value = None
        else:
            raise _NotPlain
        table[key] = value
    if offset != table_end:
        raise _NotPlain
    return offset, table


def install() -> None:
    """Read delivery headers with `unmarshal` wherever aiormq reads frames (idempotent)."""
    pamqp.frame.unmarshal = unmarshal  # type: ignore[assignment]


__all__ = ["install", "unmarshal"]
