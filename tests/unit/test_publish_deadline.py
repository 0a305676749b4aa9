"""A publish's confirm deadline (`Publisher._settle`): its timer makes a `ConfirmTimeout`, and a
task cancelled from outside stays cancelled."""

from __future__ import annotations

import asyncio
from typing import Any

import aiormq
import pytest

from bandgate.core.protocol.confirms import Confirmation
from bandgate.core.publishing import ConfirmTimeout, Publisher
from bandgate.topology.loader import parse_topology
from bandgate.topology.wire import Envelope

TOPOLOGY = parse_topology({"queues": {"orders": {}}})


class Silent:
    """A pipeline whose broker never answers."""

    is_closed = False

    def __init__(self) -> None:
        self.sent: list[Confirmation] = []
        self.waiting = asyncio.Event()

    def publish(self, exchange: str, routing_key: str, body: bytes, properties: Any) -> Any:
        confirmation: Confirmation = asyncio.get_running_loop().create_future()
        self.sent.append(confirmation)
        self.waiting.set()
        return confirmation


class Channels:
    def __init__(self) -> None:
        self.pipeline = Silent()

    def ready(self) -> Silent:
        return self.pipeline

    async def get(self) -> Silent:
        return self.pipeline

    async def close(self) -> None:
        return None


def envelope() -> Envelope:
    return Envelope(queue="orders", payload={"a": 1}, priority=8)


async def test_no_confirm_by_the_deadline_is_a_confirm_timeout() -> None:
    channels = Channels()
    publisher = Publisher(TOPOLOGY, channels, confirm_timeout=0.01)
    with pytest.raises(ConfirmTimeout):
        await publisher.publish(envelope())
    assert channels.pipeline.sent[0].cancelled()  # a late ack finds it settled


async def test_a_cancelled_publish_stays_cancelled() -> None:
    channels = Channels()
    publisher = Publisher(TOPOLOGY, channels, confirm_timeout=60)
    task = asyncio.create_task(publisher.publish(envelope()))
    await channels.pipeline.waiting.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_an_ack_before_the_deadline_is_published() -> None:
    channels = Channels()
    publisher = Publisher(TOPOLOGY, channels, confirm_timeout=60)
    task = asyncio.create_task(publisher.publish(envelope()))
    await channels.pipeline.waiting.wait()
    channels.pipeline.sent[0].set_result(aiormq.spec.Basic.Ack())
    assert (await task).band == "hot"
