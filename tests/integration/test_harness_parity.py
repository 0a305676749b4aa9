"""The in-memory harness (`bandgate.testing`) cannot drift from the product: the same scenarios
run through the harness and through a worker and a producer on a real broker, and what the
product guarantees comes out the same: the order of handling (bands, a key's messages,
delays in the order they come due), the attempts, the dead letters with their reasons, a
cancel, a replace and an escalate.

Not compared: what the product leaves to timing or to the broker's version (the order inside a
band of messages of different priorities, which RabbitMQ 4.x orders and 3.x does not; how
messages of different keys interleave; how late a delay lands).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

import aio_pika
import pytest

from bandgate.consumers import ConsumerApp, Message, Reject, Retry
from bandgate.consumers.settings import WorkerSettings
from bandgate.consumers.worker import Worker
from bandgate.core.dead_letter_records import read_dead_letter_message
from bandgate.core.producer import Producer
from bandgate.testing import Harness
from bandgate.topology import naming, wire
from tests.integration.test_consumer_retries import TOPOLOGY  # back-off 0.2 s, then 0.4 s

pytestmark = pytest.mark.integration

Event = tuple[str, str, int]  # ("start" | "end", id, attempt)
DeadRow = tuple[str, str | None, str | None, int | None]  # id, cause, reason, attempts


def make_app(settings: WorkerSettings | None, seen: list[Event], concurrency: int) -> ConsumerApp:
    """The app both sides run: what a message's payload asks its handler to do."""
    app = ConsumerApp(settings, topology=TOPOLOGY)

    @app.consumer("orders", concurrency=concurrency)
    async def handle(msg: Message) -> None:
        name = msg.payload["id"]
        seen.append(("start", name, msg.attempt))
        await asyncio.sleep(msg.payload.get("work", 0))
        seen.append(("end", name, msg.attempt))
        act = msg.payload.get("act")
        if act == "reject":
            raise Reject("no good")
        if act == "fail":
            raise ValueError("boom")
        if act == "retry" and msg.attempt < 3:
            raise Retry(delay=0.3)

    return app


class Side(Protocol):
    """Where a scenario runs: the harness, or a worker on a real broker."""

    seen: list[Event]

    async def publish(self, name: str, **options: Any) -> None: ...

    async def cancel(self, message_id: str) -> None: ...

    async def replace(self, name: str, message_id: str, **options: Any) -> None: ...

    async def start(self) -> None:
        """Start the worker: what was published before is its backlog."""

    async def settle(self, ends: int, dead: int) -> None:
        """Until `ends` handler runs ended and `dead` messages were dead-lettered, and a
        moment more (nothing else may come)."""

    async def dead_letters(self) -> list[DeadRow]: ...


@dataclass
class Sending:
    """A scenario's publishes and cancels, with either sender."""

    sender: Harness | Producer  # the same publish and cancel
    seen: list[Event]

    async def publish(self, name: str, **options: Any) -> None:
        payload = {"id": name, **options.pop("payload", {})}
        await self.sender.publish("orders", payload, **options)

    async def cancel(self, message_id: str) -> None:
        await self.sender.cancel("orders", message_id)

    async def replace(self, name: str, message_id: str, **options: Any) -> None:
        await self.sender.replace("orders", message_id, {"id": name}, **options)


@dataclass
class InMemory(Sending):
    harness: Harness = field(kw_only=True)

    async def start(self) -> None:
        await self.harness.start_worker()

    async def settle(self, ends: int, dead: int) -> None:
        await self.harness.join()

    async def dead_letters(self) -> list[DeadRow]:
        return [
            (d.payload["id"], d.cause, d.reason, d.record.attempts)
            for d in self.harness.dead_letters("orders")
        ]


@dataclass
class OnBroker(Sending):
    amqp_url: str = field(kw_only=True)
    app: ConsumerApp = field(kw_only=True)
    tasks: list[tuple[Worker, asyncio.Task[None]]] = field(default_factory=list)

    async def start(self) -> None:
        worker = Worker(self.app)
        task = asyncio.create_task(worker.run())
        await asyncio.wait_for(worker.ready.wait(), 30)
        self.tasks.append((worker, task))

    async def settle(self, ends: int, dead: int) -> None:
        deadline = time.monotonic() + 30
        while sum(event == "end" for event, _, _ in self.seen) < ends or (
            len(await self._dead()) < dead
        ):
            assert time.monotonic() < deadline, f"not settled: {self.seen}"
            await asyncio.sleep(0.05)
        await asyncio.sleep(1.0)  # anything that should not come would come now

    async def dead_letters(self) -> list[DeadRow]:
        spec = TOPOLOGY.queue("orders")
        rows = []
        for message in await self._dead():
            record = read_dead_letter_message(spec, message, wire.now())
            payload = wire.decode_body(message.body)
            rows.append((payload["id"], record.cause, record.reason, record.attempts))
        return rows

    async def _dead(self) -> list[aio_pika.abc.AbstractIncomingMessage]:
        """What the DLQ holds, looked at and put back (nack)."""
        connection = await aio_pika.connect(self.amqp_url)
        async with connection:
            channel = await connection.channel()
            queue = await channel.get_queue(naming.dead_letter_queue("orders"))
            found = []
            while (message := await queue.get(fail=False)) is not None:
                found.append(message)
            return found  # the channel closes: the broker takes them back


@asynccontextmanager
async def in_memory(concurrency: int) -> AsyncIterator[Side]:
    seen: list[Event] = []
    async with Harness(make_app(None, seen, concurrency)) as harness:
        yield InMemory(harness, seen, harness=harness)


@asynccontextmanager
async def on_broker(amqp_url: str, concurrency: int) -> AsyncIterator[Side]:
    seen: list[Event] = []
    app = make_app(WorkerSettings(amqp_url=amqp_url), seen, concurrency)
    connecting = Producer.connect(amqp_url, topology=TOPOLOGY, declare_topology=True)
    async with connecting as producer:
        side = OnBroker(producer, seen, amqp_url=amqp_url, app=app)
        try:
            yield side
        finally:
            for worker, task in side.tasks:
                worker.stop()
                await asyncio.wait_for(task, 30)


Story = dict[str, Any]
Scenario = Callable[[Side], Awaitable[Story]]


async def waterfall(side: Side) -> Story:
    """A backlog in three bands, one slot: hot, then warm, then cold (FIFO inside a band of
    one priority, on every broker version)."""
    for name, priority in [("c1", 1), ("w1", 5), ("c2", 1), ("h1", 8), ("w2", 5), ("h2", 8)]:
        await side.publish(name, priority=priority)
    await side.start()
    await side.settle(ends=6, dead=0)
    return {"order": [name for event, name, _ in side.seen if event == "start"]}


async def retries(side: Side) -> Story:
    """A retry's attempts, then a message dead-lettered after max_attempts and one rejected."""
    await side.start()
    await side.publish("r", payload={"act": "retry"})
    await side.publish("f", payload={"act": "fail"})
    await side.publish("j", payload={"act": "reject"})
    await side.settle(ends=3 + 3 + 1, dead=2)
    return {
        "attempts": sorted((name, attempt) for event, name, attempt in side.seen if event == "end"),
        "dead": sorted(await side.dead_letters()),
    }


async def cancel(side: Side) -> Story:
    """A delayed message cancelled before it is due never runs; the one beside it does (2 s
    leaves the worker time to read the tombstone on a loaded machine)."""
    await side.start()
    await side.publish("gone", delay=2.0, message_id="gone")
    await side.cancel("gone")
    await side.publish("kept", delay=2.0, message_id="kept")
    await side.settle(ends=1, dead=0)
    return {"ran": [name for event, name, _ in side.seen if event == "start"]}


async def replace(side: Side) -> Story:
    """A replace runs the new generation at its new time, and an escalate moves a message
    to the hot band at once; the copies they replaced never run."""
    await side.start()
    await side.publish("m-v1", delay=2.0, message_id="m", priority=1)
    await side.publish("n-v1", delay=2.0, message_id="n", priority=1)
    await side.replace("m-v2", "m", delay=0.5, priority=1)
    await side.replace("n-v2", "n", priority=9)  # an escalate
    await side.settle(ends=2, dead=0)
    await side.settle(ends=2, dead=0)  # a second more: the old generations came due meanwhile
    return {"ran": [name for event, name, _ in side.seen if event == "start"]}


async def delays(side: Side) -> Story:
    """Delayed messages run in the order they are due, after the one due now."""
    await side.start()
    await side.publish("late", delay=2.0)
    await side.publish("soon", delay=0.8)
    await side.publish("now")
    await side.settle(ends=3, dead=0)
    return {"ran": [name for event, name, _ in side.seen if event == "start"]}


async def per_key(side: Side) -> Story:
    """Two keys' messages, four slots: each key's run one at a time, in publish order."""
    for index in range(6):
        key = "alice" if index % 2 else "bob"
        await side.publish(f"{key}-{index}", partition_key=key, payload={"work": 0.05})
    await side.start()
    await side.settle(ends=6, dead=0)
    return {
        key: [(event, name) for event, name, _ in side.seen if name.startswith(key)]
        for key in ("alice", "bob")
    }


def run_of(names: list[str]) -> list[tuple[str, str]]:
    return [(event, name) for name in names for event in ("start", "end")]


# Each scenario, the worker's concurrency, and the story the product promises.
SCENARIOS: dict[str, tuple[Scenario, int, Story]] = {
    "waterfall": (waterfall, 1, {"order": ["h1", "h2", "w1", "w2", "c1", "c2"]}),
    "retries": (
        retries,
        4,
        {
            "attempts": [("f", 1), ("f", 2), ("f", 3), ("j", 1), ("r", 1), ("r", 2), ("r", 3)],
            "dead": [
                ("f", "max-attempts", "ValueError: boom (attempt 3 of 3)", 3),
                ("j", "rejected", "Reject: no good", 1),
            ],
        },
    ),
    "cancel": (cancel, 4, {"ran": ["kept"]}),
    "replace": (replace, 4, {"ran": ["n-v2", "m-v2"]}),
    "delays": (delays, 4, {"ran": ["now", "soon", "late"]}),
    "per_key": (
        per_key,
        4,
        {
            "alice": run_of(["alice-1", "alice-3", "alice-5"]),
            "bob": run_of(["bob-0", "bob-2", "bob-4"]),
        },
    ),
}


@pytest.mark.parametrize("name", SCENARIOS)
async def test_the_harness_tells_the_same_story_as_the_broker(name: str, amqp_url: str) -> None:
    scenario, concurrency, promised = SCENARIOS[name]
    async with in_memory(concurrency) as side:
        remembered = await scenario(side)
    async with on_broker(amqp_url, concurrency) as side:
        lived = await scenario(side)
    assert remembered == lived
    assert lived == promised
