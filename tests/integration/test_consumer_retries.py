"""Retries, dead letters, Reject, Retry(delay), time limits and malformed messages, checked
against what the broker holds."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aio_pika
import pytest
from aio_pika.abc import AbstractIncomingMessage, AbstractRobustConnection

from bandgate.consumers import ConsumerApp, Message, Reject, Retry
from bandgate.consumers.settings import WorkerSettings
from bandgate.consumers.worker import Worker
from bandgate.core.publishing import ChannelSet, Published, Publisher, confirm_channel_factory
from bandgate.topology import naming, wire
from bandgate.topology.declare import apply_topology
from bandgate.topology.loader import parse_topology
from bandgate.topology.wire import (
    ATTEMPTS,
    FAILED_AT,
    FAILURE_CAUSE,
    FAILURE_REASON,
    FAILURE_TYPE,
    ORIGINAL_BAND,
    Envelope,
)

pytestmark = pytest.mark.integration

StartWorker = Callable[[ConsumerApp], Awaitable[Worker]]

# What a loaded machine (the suite's two workers and their nodes on two cores) may add to a
# retry's delay. Lower bounds stay exact, as nothing may run early; the ladder's own lateness
# (tens of milliseconds) is measured by `python -m bench delay`, not here.
LATE_SECONDS = 3.0

# Small back-off so a run of attempts takes well under a second: 0.2 s, then 0.4 s.
TOPOLOGY = parse_topology(
    {
        "delay": {"base_ms": 50, "levels": 8},
        "queues": {
            "orders": {
                "retry": {
                    "max_attempts": 3,
                    "backoff_initial_seconds": 0.2,
                    "backoff_multiplier": 2.0,
                    "jitter": 0.0,
                }
            }
        },
    }
)


@dataclass
class Rig:
    """The test's view of the broker: publish, watch the DLQ, check what queues hold."""

    connection: AbstractRobustConnection
    publisher: Publisher
    app: ConsumerApp
    dead: asyncio.Queue[AbstractIncomingMessage]

    async def publish(self, payload: Any, priority: int = 5, **fields: Any) -> Published:
        return await self.publisher.publish(
            Envelope(queue="orders", payload=payload, priority=priority, **fields)
        )

    async def dead_letter(self) -> AbstractIncomingMessage:
        """The next message that arrives in orders.dlq (30 s at most)."""
        return await asyncio.wait_for(self.dead.get(), 30)

    async def depth(self, queue: str) -> int:
        channel = await self.connection.channel()
        try:
            declared = await channel.declare_queue(queue, passive=True)
            return declared.declaration_result.message_count or 0
        finally:
            await channel.close()

    async def assert_all_settled(self) -> None:
        """Nothing waits in a band or delay level, and no other dead letter arrived."""
        for band in TOPOLOGY.queue("orders").bands:
            assert await self.depth(naming.band_queue("orders", band.name)) == 0
        for level in range(TOPOLOGY.ladder.levels):
            assert await self.depth(naming.delay_level(TOPOLOGY.exchange, level)) == 0
        assert self.dead.empty()


@pytest.fixture
async def rig(amqp_url: str) -> AsyncIterator[Rig]:
    connection = await aio_pika.connect_robust(amqp_url)
    async with connection:
        await apply_topology(connection, TOPOLOGY)
        publisher = Publisher(TOPOLOGY, ChannelSet(confirm_channel_factory(connection)))
        app = ConsumerApp(WorkerSettings(amqp_url=amqp_url), topology=TOPOLOGY)
        dead: asyncio.Queue[AbstractIncomingMessage] = asyncio.Queue()
        channel = await connection.channel()
        dlq = await channel.get_queue(naming.dead_letter_queue("orders"))
        await dlq.consume(dead.put, no_ack=True)
        yield Rig(connection, publisher, app, dead)
        await publisher.channels.close()


async def test_a_failing_handler_retries_with_growing_delays_then_dead_letters(
    rig: Rig, start_worker: StartWorker
) -> None:
    runs: list[tuple[float, Message]] = []

    @rig.app.consumer("orders")
    async def always_fails(msg: Message) -> None:
        runs.append((time.monotonic(), msg))
        raise ValueError(f"cannot ship order {msg.payload['order']}")

    await start_worker(rig.app)
    published = await rig.publish(
        {"order": 42}, priority=8, headers={"tenant": "acme"}, partition_key="customer-7"
    )
    dead = await rig.dead_letter()

    assert [msg.attempt for _, msg in runs] == [1, 2, 3]
    gaps = [later - earlier for (earlier, _), (later, _) in zip(runs, runs[1:], strict=False)]
    print("gaps between attempts", [round(gap, 3) for gap in gaps])
    assert 0.2 <= gaps[0] < 0.2 + LATE_SECONDS
    assert 0.4 <= gaps[1] < 0.4 + LATE_SECONDS
    for _, msg in runs:  # every attempt is the same message, headers and all
        assert msg.message_id == published.message_id
        assert msg.payload == {"order": 42}
        assert msg.band == "hot"
        assert msg.headers == {"tenant": "acme"}
        assert msg.partition_key == "customer-7"
        assert msg.enqueued_at == runs[0][1].enqueued_at

    await rig.assert_all_settled()
    assert dead.message_id == published.message_id
    assert dead.body == b'{"order":42}'
    assert wire.read_priority(dead.priority, dead.headers) == 8  # a header: the DLQ stays FIFO
    headers = dead.headers
    assert headers[FAILURE_REASON] == "ValueError: cannot ship order 42 (attempt 3 of 3)"
    assert headers[FAILURE_CAUSE] == "max-attempts"
    assert headers[FAILURE_TYPE] == "ValueError"
    assert headers[ATTEMPTS] == 3
    assert headers[ORIGINAL_BAND] == "hot"
    failed_at = headers[FAILED_AT]
    assert isinstance(failed_at, int)
    assert abs(wire.from_millis(failed_at) - wire.now()).total_seconds() < 30
    assert headers["tenant"] == "acme"
    assert headers[wire.PARTITION_KEY] == "customer-7"
    assert "x-death" not in headers
    assert len(runs) == 3  # and nothing ran again after the dead letter


async def test_reject_dead_letters_at_once(rig: Rig, start_worker: StartWorker) -> None:
    runs: list[Message] = []

    @rig.app.consumer("orders")
    async def rejects(msg: Message) -> None:
        runs.append(msg)
        raise Reject("customer 7 does not exist")

    await start_worker(rig.app)
    await rig.publish({"order": 1}, priority=2)
    dead = await rig.dead_letter()
    await rig.assert_all_settled()
    assert len(runs) == 1
    assert dead.headers[FAILURE_CAUSE] == "rejected"
    assert dead.headers[FAILURE_REASON] == "Reject: customer 7 does not exist"
    assert dead.headers[ATTEMPTS] == 1
    assert dead.headers[ORIGINAL_BAND] == "cold"


async def test_retry_with_a_delay_runs_again_after_about_that_delay(
    rig: Rig, start_worker: StartWorker
) -> None:
    runs: list[tuple[float, Message]] = []
    second = asyncio.Event()

    @rig.app.consumer("orders")
    async def later(msg: Message) -> None:
        runs.append((time.monotonic(), msg))
        if msg.attempt == 1:
            raise Retry(delay=1)
        second.set()

    await start_worker(rig.app)
    await rig.publish({"order": 5})
    await asyncio.wait_for(second.wait(), 30)
    gap = runs[1][0] - runs[0][0]
    print(f"Retry(delay=1) ran again after {gap:.3f} s")
    assert 1.0 <= gap < 1.0 + LATE_SECONDS
    assert [msg.attempt for _, msg in runs] == [1, 2]
    await rig.assert_all_settled()


async def test_a_handler_over_its_time_limit_is_cancelled_and_fails(
    rig: Rig, start_worker: StartWorker
) -> None:
    cancelled = asyncio.Event()

    @rig.app.consumer("orders", time_limit=0.2, max_attempts=1)
    async def slow(msg: Message) -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    await start_worker(rig.app)
    await rig.publish({"order": 9})
    dead = await rig.dead_letter()
    assert cancelled.is_set()
    assert dead.headers[FAILURE_TYPE] == "TimeLimitExceeded"
    assert "time limit of 0.2 s" in str(dead.headers[FAILURE_REASON])


async def test_a_malformed_message_goes_to_the_dead_letter_queue_untouched(
    rig: Rig, start_worker: StartWorker
) -> None:
    runs: list[Message] = []

    @rig.app.consumer("orders")
    async def handle(msg: Message) -> None:
        runs.append(msg)

    await start_worker(rig.app)
    channel = await rig.connection.channel()
    exchange = await channel.get_exchange(TOPOLOGY.exchange)
    await exchange.publish(
        aio_pika.Message(b"<order/>", content_type="application/xml", message_id="xml-1"),
        naming.routing_key("orders", 5),
    )
    dead = await rig.dead_letter()
    assert runs == []
    assert dead.body == b"<order/>"
    assert dead.content_type == "application/xml"
    assert dead.message_id == "xml-1"
    assert dead.headers[FAILURE_CAUSE] == "malformed"
    assert dead.headers[ORIGINAL_BAND] == "warm"
