"""bandgate.consumers.acks writes basic.ack frames itself (byte for byte what pamqp writes)
and a loop turn's acks as one payload per connection, never on a closing channel."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest
from aio_pika.exceptions import ChannelInvalidStateError
from aiormq.abc import ChannelFrame
from hypothesis import given
from hypothesis import strategies as st
from pamqp import commands
from pamqp import frame as amqp_frame

from bandgate.consumers.acks import AckWriter, ack_frame


@given(
    channel=st.integers(min_value=0, max_value=2**16 - 1),
    delivery_tag=st.integers(min_value=0, max_value=2**63 - 1),  # pamqp's long-long range
)
def test_an_ack_frame_is_what_pamqp_writes(channel: int, delivery_tag: int) -> None:
    expected = amqp_frame.marshal(commands.Basic.Ack(delivery_tag=delivery_tag), channel)
    assert ack_frame(channel, delivery_tag) == expected


def test_an_ack_frame_reads_back_as_that_ack() -> None:
    consumed, channel, method = amqp_frame.unmarshal(ack_frame(3, 12345))
    assert (consumed, channel) == (21, 3)
    assert isinstance(method, commands.Basic.Ack)
    assert method.delivery_tag == 12345
    assert not method.multiple


class FakeChannel:
    """What AckWriter uses of an aiormq channel: its number, state and the writer's queue."""

    def __init__(self, number: int, queue: asyncio.Queue[ChannelFrame]) -> None:
        self.number = number
        self.write_queue = queue
        self.is_closed = False
        self._Channel__close_event = asyncio.Event()  # aiormq's, set once closing


def acked(frames: list[ChannelFrame]) -> list[tuple[int, int]]:
    """(channel, delivery tag) of every ack in the written payloads, in order."""
    found = []
    for frame in frames:
        payload = frame.payload
        while payload:
            consumed, channel, method = amqp_frame.unmarshal(payload)
            assert isinstance(method, commands.Basic.Ack)
            found.append((channel, method.delivery_tag))
            payload = payload[consumed:]
    return found


async def test_the_acks_of_a_turn_go_out_as_one_payload_per_connection() -> None:
    queue: asyncio.Queue[ChannelFrame] = asyncio.Queue()
    first, second = FakeChannel(1, queue), FakeChannel(2, queue)
    acks = AckWriter()
    for tag in (1, 2, 3):
        acks.ack(cast(Any, first), tag)
        acks.ack(cast(Any, second), tag)
    assert queue.empty()  # written at the end of the turn
    await asyncio.sleep(0)
    assert queue.qsize() == 1
    assert acked([queue.get_nowait()]) == [(1, 1), (2, 1), (1, 2), (2, 2), (1, 3), (2, 3)]


async def test_acks_wait_for_room_in_a_full_write_queue() -> None:
    queue: asyncio.Queue[ChannelFrame] = asyncio.Queue(maxsize=1)
    queue.put_nowait(ChannelFrame(payload=b"", should_close=False))  # the writer lags
    channel = FakeChannel(1, queue)
    acks = AckWriter()
    acks.ack(cast(Any, channel), 7)
    await asyncio.sleep(0)
    assert queue.get_nowait().payload == b""  # the writer catches up...
    async with asyncio.timeout(5):
        frame = await queue.get()  # ...and the acks follow
    assert acked([frame]) == [(1, 7)]


async def test_a_closing_channel_refuses_acks_and_drops_those_recorded() -> None:
    queue: asyncio.Queue[ChannelFrame] = asyncio.Queue()
    open_channel, closing = FakeChannel(1, queue), FakeChannel(2, queue)
    acks = AckWriter()
    acks.ack(cast(Any, open_channel), 1)
    acks.ack(cast(Any, closing), 1)
    closing._Channel__close_event.set()  # closed before the turn ended
    with pytest.raises(ChannelInvalidStateError):
        acks.ack(cast(Any, closing), 2)
    await asyncio.sleep(0)
    assert acked([queue.get_nowait()]) == [(1, 1)]
    assert queue.empty()
