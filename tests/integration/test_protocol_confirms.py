"""The confirm pipeline numbers publishes itself (delivery tags are implicit on the wire), so
these check that every future gets its own message's answer from a real broker: acks, returns
and nacks mixed in one write, withdrawn messages, a plain aiormq publish on the same channel,
and a channel the broker closes."""

from __future__ import annotations

import asyncio

import aiormq
import pytest
from aio_pika.abc import AbstractRobustConnection

from bandgate.core.protocol.confirms import (
    ChannelSet,
    ConfirmPipeline,
    NotSent,
    confirm_channel_factory,
)
from bandgate.topology import naming, wire
from bandgate.topology.declare import apply_topology
from bandgate.topology.model import Topology

pytestmark = pytest.mark.integration


async def pipeline_on(amqp: AbstractRobustConnection) -> ConfirmPipeline:
    return await ChannelSet(confirm_channel_factory(amqp), size=1).get()


def properties(message_id: str | None = None) -> aiormq.spec.Basic.Properties:
    return aiormq.spec.Basic.Properties(
        message_id=message_id or wire.new_message_id(), delivery_mode=2, headers={}
    )


async def drain(amqp: AbstractRobustConnection, queue: str) -> list[bytes]:
    channel = await amqp.channel()
    box = await channel.get_queue(queue)
    bodies = []
    while (message := await box.get(no_ack=True, fail=False)) is not None:
        bodies.append(message.body)
    await channel.close()
    return bodies


async def test_acks_and_returns_mixed_in_one_write_reach_their_own_publishes(
    amqp: AbstractRobustConnection, topology: Topology
) -> None:
    await apply_topology(amqp, topology)
    pipeline = await pipeline_on(amqp)
    routable = naming.routing_key("orders", 8)
    keys = [routable if i % 3 else "nowhere.8" for i in range(300)]
    bodies = [str(i).encode() for i in range(300)]
    # Published in one loop turn: one flush, one socket write.
    confirmations = [
        pipeline.publish(topology.exchange, key, body, properties())
        for key, body in zip(keys, bodies, strict=True)
    ]
    outcomes = await asyncio.gather(*confirmations, return_exceptions=True)
    for key, outcome in zip(keys, outcomes, strict=True):
        if key == routable:
            assert isinstance(outcome, aiormq.spec.Basic.Ack)
        else:
            assert isinstance(outcome, aiormq.exceptions.PublishError)
    hot = await drain(amqp, naming.band_queue("orders", "hot"))
    assert hot == [b for k, b in zip(keys, bodies, strict=True) if k == routable]
    assert pipeline.channel.message_id_delivery_tag == {}  # nothing left behind
    assert pipeline.channel.confirmations == {}


async def test_a_publish_cancelled_before_its_flush_is_never_sent(
    amqp: AbstractRobustConnection, topology: Topology
) -> None:
    await apply_topology(amqp, topology)
    pipeline = await pipeline_on(amqp)
    key = naming.routing_key("orders", 8)
    kept = pipeline.publish(topology.exchange, key, b"kept", properties())
    withdrawn = pipeline.publish(topology.exchange, key, b"withdrawn", properties())
    withdrawn.cancel()
    assert isinstance(await kept, aiormq.spec.Basic.Ack)
    assert await drain(amqp, naming.band_queue("orders", "hot")) == [b"kept"]


async def test_plain_aiormq_publishes_on_the_same_channel_keep_their_tags(
    amqp: AbstractRobustConnection, topology: Topology
) -> None:
    await apply_topology(amqp, topology)
    pipeline = await pipeline_on(amqp)
    key = naming.routing_key("orders", 8)

    async def plain(i: int) -> object:
        return await pipeline.channel.basic_publish(
            f"plain{i}".encode(),
            exchange=topology.exchange,
            routing_key=key if i % 2 else "nowhere.1",
            properties=properties(),
            mandatory=True,
        )

    piped = [
        pipeline.publish(topology.exchange, "nowhere.2" if i % 2 else key, b"p", properties())
        for i in range(50)
    ]
    plains = [asyncio.ensure_future(plain(i)) for i in range(50)]
    piped += [pipeline.publish(topology.exchange, key, b"p", properties()) for _ in range(50)]
    results = await asyncio.gather(*piped, *plains, return_exceptions=True)
    expected_acks = 25 + 50 + 25
    assert sum(isinstance(r, aiormq.spec.Basic.Ack) for r in results) == expected_acks
    assert [isinstance(r, aiormq.spec.Basic.Ack) for r in results[:50]] == [
        i % 2 == 0 for i in range(50)
    ]
    assert len(await drain(amqp, naming.band_queue("orders", "hot"))) == expected_acks


async def test_a_channel_the_broker_closes_fails_its_publishes_and_is_replaced(
    amqp: AbstractRobustConnection, topology: Topology
) -> None:
    await apply_topology(amqp, topology)
    channels = ChannelSet(confirm_channel_factory(amqp), size=1)
    pipeline = await channels.get()
    doomed = [
        pipeline.publish("no-such-exchange", "orders.8", b"x", properties()) for _ in range(5)
    ]
    outcomes = await asyncio.gather(*doomed, return_exceptions=True)
    assert all(isinstance(o, aiormq.exceptions.ChannelNotFoundEntity) for o in outcomes)
    assert pipeline.channel.confirmations == {}
    key = naming.routing_key("orders", 8)
    with pytest.raises(NotSent, match="NOT_FOUND"):  # the close reason, and nothing written
        await pipeline.publish(topology.exchange, key, b"late", properties())
    assert channels.ready() is None
    fresh = await channels.get()
    assert fresh is not pipeline
    assert isinstance(
        await fresh.publish(topology.exchange, key, b"ok", properties()), aiormq.spec.Basic.Ack
    )


async def test_a_message_id_is_required_to_match_returns(
    amqp: AbstractRobustConnection, topology: Topology
) -> None:
    pipeline = await pipeline_on(amqp)
    with pytest.raises(ValueError, match="message_id"):
        pipeline.publish(topology.exchange, "orders.8", b"x", aiormq.spec.Basic.Properties())


async def test_the_set_opens_every_slot_then_serves_them_in_turn_without_waiting(
    amqp: AbstractRobustConnection,
) -> None:
    # The publisher's way in: `ready()`, and `get()` only when the slot is not open yet.
    channels = ChannelSet(confirm_channel_factory(amqp), size=4)
    opened = []
    for _ in range(4):
        assert channels.ready() is None
        opened.append(await channels.get())
    assert len({id(pipeline) for pipeline in opened}) == 4
    served = [channels.ready() for _ in range(8)]
    assert served == opened + opened
    await channels.close()


async def test_one_loop_turns_publishes_share_a_channel_and_the_next_turn_takes_the_next(
    amqp: AbstractRobustConnection, topology: Topology
) -> None:
    # One channel per turn: the turn's publishes leave in one socket write.
    await apply_topology(amqp, topology)
    channels = ChannelSet(confirm_channel_factory(amqp), size=2)
    for _ in range(2):
        assert channels.ready() is None
        await channels.get()
    key = naming.routing_key("orders", 8)
    first = channels.ready()
    assert first is not None
    confirmation = first.publish(topology.exchange, key, b"a", properties())
    assert first.filling
    same_turn = [channels.ready() for _ in range(3)]
    assert same_turn == [first, first, first]
    assert isinstance(await confirmation, aiormq.spec.Basic.Ack)  # the turn has ended
    assert not first.filling
    second = channels.ready()
    assert second is not None
    assert second is not first
    assert channels.ready() is first  # nothing published on the second: its turn ended too
    await channels.close()
