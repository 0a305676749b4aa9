"""Acks written together once per loop turn (`core.protocol.acks`) reach a real broker: every ack
of a turn, over several channels, is taken; acks joined into one `multiple` ack settle all but
the deliveries still held; a channel the broker closed refuses acks, and its messages are
delivered again."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import aio_pika
import pytest
from aio_pika.abc import AbstractChannel, AbstractIncomingMessage, AbstractRobustConnection
from aio_pika.exceptions import ChannelInvalidStateError

from bandgate.core.protocol.acks import AckWriter, Unsettled

pytestmark = pytest.mark.integration

MESSAGES = 40


async def fill(amqp: AbstractRobustConnection, name: str, count: int) -> None:
    channel = await amqp.channel()
    await channel.declare_queue(name, durable=True, arguments={"x-queue-type": "quorum"})
    for index in range(count):
        await channel.default_exchange.publish(aio_pika.Message(str(index).encode()), name)
    await channel.close()


async def take(channel: AbstractChannel, name: str, count: int) -> list[AbstractIncomingMessage]:
    queue = await channel.get_queue(name)
    messages = []
    for _ in range(count):
        message = await queue.get(fail=True)
        assert message is not None
        messages.append(message)
    return messages


async def test_every_ack_of_a_turn_on_several_channels_is_taken(
    amqp: AbstractRobustConnection,
) -> None:
    """Consumers with a prefetch of 5 get all 40 messages only if the broker takes the acks:
    it sends the next messages as it processes them."""
    names = ["acks.first", "acks.second"]
    acks = AckWriter()
    received: dict[str, list[bytes]] = {name: [] for name in names}
    done = asyncio.Event()

    def on_message(name: str) -> Callable[[AbstractIncomingMessage], Awaitable[None]]:
        async def handle(message: AbstractIncomingMessage) -> None:
            assert message.delivery_tag is not None
            acks.ack(message.channel, message.delivery_tag)
            received[name].append(message.body)
            if all(len(bodies) == MESSAGES for bodies in received.values()):
                done.set()

        return handle

    for name in names:
        await fill(amqp, name, MESSAGES)
        channel = await amqp.channel()
        await channel.set_qos(prefetch_count=5)
        await (await channel.get_queue(name)).consume(on_message(name))
    async with asyncio.timeout(20):
        await done.wait()
    expected = [str(index).encode() for index in range(MESSAGES)]
    assert received == {name: expected for name in names}


async def test_a_channel_the_broker_closed_refuses_acks_and_its_message_returns(
    amqp: AbstractRobustConnection,
) -> None:
    await fill(amqp, "acks.refused", 1)
    channel = await amqp.channel()
    (message,) = await take(channel, "acks.refused", 1)
    underlay = await channel.get_underlay_channel()
    with pytest.raises(aio_pika.exceptions.ChannelNotFoundEntity):
        await channel.declare_queue("acks.no-such-queue", passive=True)  # closes the channel
    assert message.delivery_tag is not None
    with pytest.raises(ChannelInvalidStateError):
        AckWriter().ack(underlay, message.delivery_tag)
    again: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()

    async def redelivered(delivery: AbstractIncomingMessage) -> None:
        await delivery.ack()
        again.set_result(delivery.body)

    other = await amqp.channel()
    await (await other.get_queue("acks.refused")).consume(redelivered)
    async with asyncio.timeout(10):
        assert await again == message.body


async def test_a_multiple_ack_settles_all_but_the_deliveries_still_held(
    amqp: AbstractRobustConnection,
) -> None:
    await fill(amqp, "acks.multiple", 10)
    channel = await amqp.channel()
    messages = await take(channel, "acks.multiple", 10)
    underlay = await channel.get_underlay_channel()
    unsettled = Unsettled(underlay)
    unsettled.tags.update(message.delivery_tag or 0 for message in messages)
    held = messages[3]
    acks = AckWriter()
    for message in messages[:3]:  # below the held one: one `multiple` ack
        assert message.delivery_tag is not None
        acks.ack(underlay, message.delivery_tag, unsettled)
    await asyncio.sleep(0)
    for message in messages[4:]:  # above it: one ack each
        assert message.delivery_tag is not None
        acks.ack(underlay, message.delivery_tag, unsettled)
    await asyncio.sleep(0)
    assert unsettled.tags == {held.delivery_tag}
    await channel.declare_queue("acks.multiple", passive=True)  # a round trip: all acks taken
    await channel.close()  # the broker takes back what is still unacked: the held one only
    check = await amqp.channel()
    queue = await check.get_queue("acks.multiple")
    back = None
    async with asyncio.timeout(10):  # a quorum queue returns it through a Raft command
        while back is None:
            back = await queue.get(fail=False)
            if back is None:
                await asyncio.sleep(0.05)
    assert back.body == held.body == b"3"
    await back.ack()
    assert await queue.get(fail=False) is None  # every other one was acked
