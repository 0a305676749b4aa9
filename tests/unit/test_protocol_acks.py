"""bandgate.core.protocol.acks writes basic.ack frames itself (byte for byte what pamqp writes)
and a loop turn's acks as one payload per connection, never on a closing channel; acks below
every delivery still held go out as one `multiple` ack, and no ack ever covers a held one."""

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

from bandgate.core.protocol.acks import AckWriter, Unsettled, ack_frame


@given(
    channel=st.integers(min_value=0, max_value=2**16 - 1),
    delivery_tag=st.integers(min_value=0, max_value=2**63 - 1),  # pamqp's long-long range
    multiple=st.booleans(),
)
def test_an_ack_frame_is_what_pamqp_writes(channel: int, delivery_tag: int, multiple: bool) -> None:
    ack = commands.Basic.Ack(delivery_tag=delivery_tag, multiple=multiple)
    assert ack_frame(channel, delivery_tag, multiple) == amqp_frame.marshal(ack, channel)


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


def acks_in(payload: bytes) -> list[tuple[int, int, bool]]:
    """(channel, delivery tag, multiple) of every ack in a written payload, in order."""
    found = []
    while payload:
        consumed, channel, method = amqp_frame.unmarshal(payload)
        assert isinstance(method, commands.Basic.Ack)
        found.append((channel, method.delivery_tag, method.multiple))
        payload = payload[consumed:]
    return found


def acked(frames: list[ChannelFrame]) -> list[tuple[int, int]]:
    """(channel, delivery tag) of every ack in the written payloads, in order (none multiple)."""
    found = [ack for frame in frames for ack in acks_in(frame.payload)]
    assert not any(multiple for _, _, multiple in found)
    return [(channel, tag) for channel, tag, _ in found]


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
    assert acked([queue.get_nowait()]) == [(1, 1), (1, 2), (1, 3), (2, 1), (2, 2), (2, 3)]


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


def unsettled(*tags: int) -> Unsettled:
    held = Unsettled(cast(Any, FakeChannel(5, asyncio.Queue())))
    held.tags.update(tags)
    return held


def test_acks_below_every_held_delivery_join_into_one_multiple_ack() -> None:
    held = unsettled(1, 2, 3, 4, 5)
    assert acks_in(held.frames([2, 1, 3])) == [(5, 3, True)]
    assert held.tags == {4, 5}


def test_a_held_delivery_keeps_the_acks_above_it_single() -> None:
    held = unsettled(1, 2, 3, 4, 5, 6)
    assert acks_in(held.frames([1, 2, 4, 6])) == [(5, 2, True), (5, 4, False), (5, 6, False)]
    assert held.tags == {3, 5}
    assert acks_in(held.frames([5])) == [(5, 5, False)]  # 3 is still held
    assert acks_in(held.frames([3])) == [(5, 3, False)]  # alone: nothing to join
    assert not held.tags


def test_tags_never_read_through_unsettled_are_acked_one_by_one() -> None:
    queue: asyncio.Queue[ChannelFrame] = asyncio.Queue()
    channel = FakeChannel(1, queue)
    acks = AckWriter()

    async def turn() -> None:
        for tag in (1, 2, 3):
            acks.ack(cast(Any, channel), tag)
        await asyncio.sleep(0)

    asyncio.run(turn())
    assert acked([queue.get_nowait()]) == [(1, 1), (1, 2), (1, 3)]


async def test_no_multiple_ack_while_earlier_acks_wait_for_room() -> None:
    """A `multiple` ack put in the queue ahead of a waiting single one would settle that one's
    tag first, and the broker would close the channel on the single ack."""
    queue: asyncio.Queue[ChannelFrame] = asyncio.Queue(maxsize=1)
    queue.put_nowait(ChannelFrame(payload=b"", should_close=False))  # the writer lags
    channel = FakeChannel(5, queue)
    held = Unsettled(cast(Any, channel))
    held.tags.update({1, 2, 3, 4})
    acks = AckWriter()
    acks.ack(cast(Any, channel), 1, held)
    await asyncio.sleep(0)  # its payload waits for room
    acks.ack(cast(Any, channel), 2, held)
    acks.ack(cast(Any, channel), 3, held)
    await asyncio.sleep(0)
    payloads: list[bytes] = []
    async with asyncio.timeout(5):
        while len(payloads) < 3:
            payloads.append((await queue.get()).payload)
    written = [ack for payload in payloads for ack in acks_in(payload)]
    assert sorted(written) == [(5, 1, False), (5, 2, False), (5, 3, False)]  # in any order
    assert held.tags == {4}


def broker_takes(payload: bytes, unacked: set[int], held: set[int]) -> None:
    """Apply the acks of `payload` to the broker's `unacked` tags, as RabbitMQ would, checking
    that none names a tag the broker does not hold or covers one the worker `held`."""
    for _, tag, multiple in acks_in(payload):
        assert tag in unacked  # else the broker closes the channel: PRECONDITION_FAILED
        covered = {t for t in unacked if t <= tag} if multiple else {tag}
        assert not covered & held
        unacked -= covered


@given(st.data())
def test_acks_settle_exactly_what_was_acked(data: st.DataObject) -> None:
    """Deliveries 1..n, settled by the worker in any order, by ack or nack, over any turns:
    no ack covers a delivery the worker still holds or names a tag the broker no longer
    holds, and at the end exactly the deliveries still held are unacked on the broker."""
    count = data.draw(st.integers(min_value=1, max_value=40))
    unsettled_tags = unsettled(*range(1, count + 1))
    order = data.draw(st.permutations(range(1, count + 1)))
    settled = order[: data.draw(st.integers(min_value=0, max_value=count))]
    unacked, held = set(range(1, count + 1)), set(range(1, count + 1))
    turn: list[int] = []
    for tag in settled:
        held.discard(tag)
        nack: bool = data.draw(st.booleans(), label=f"nack {tag}")
        if nack:  # written at once, then no longer unsettled
            unacked.discard(tag)
            unsettled_tags.tags.discard(tag)
        else:
            turn.append(tag)
        turn_ends: bool = data.draw(st.booleans(), label="turn ends")
        if turn and turn_ends:
            broker_takes(unsettled_tags.frames(turn), unacked, held)
            turn = []
    if turn:
        broker_takes(unsettled_tags.frames(turn), unacked, held)
    assert unacked == held
    assert unsettled_tags.tags == held
