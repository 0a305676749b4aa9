"""Real worker processes (`python -m bandgate.consumers ...`, as `bandgate worker` runs
them), stopped with SIGTERM or killed with SIGKILL.

The worker processes import this module for its `app`. Its handler writes one line per event
to the file named by BANDGATE_TEST_RECORD, which the test reads back.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aio_pika
import pytest
from aio_pika.abc import AbstractIncomingMessage, AbstractRobustConnection

from bandgate.consumers import ConsumerApp, Message
from bandgate.core.publishing import ChannelSet, Published, Publisher, confirm_channel_factory
from bandgate.topology import naming
from bandgate.topology.declare import apply_topology
from bandgate.topology.loader import parse_topology
from bandgate.topology.wire import FAILURE_CAUSE, FAILURE_REASON, Envelope

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
RECORD_ENV = "BANDGATE_TEST_RECORD"
Event = dict[str, Any]

TOPOLOGY = parse_topology(
    {
        "delay": {"base_ms": 50, "levels": 4},
        "queues": {
            "orders": {"retry": {"max_attempts": 3, "max_deliveries": 2}},
            # The SIGTERM burst: handed-back messages must not meet a delivery limit of 2 on
            # brokers that count every return (before 4.3): that is the other tests' subject.
            "burst": {},
        },
    }
)

# The app the worker processes run. Its settings (BANDGATE_AMQP_URL, grace period) come from
# their environment; the topology is given, so importing this module reads no file.
app = ConsumerApp(topology=TOPOLOGY)


@app.consumer("orders", concurrency=4)
def handle(msg: Message) -> None:
    """A sync handler (so it runs in the worker's threads) steered by the payload."""
    record("start", msg)
    if msg.payload.get("kill"):
        os.kill(os.getpid(), signal.SIGKILL)
    if msg.payload.get("hang") and not msg.redelivered:
        time.sleep(60)  # until the test kills this worker
    time.sleep(msg.payload.get("sleep", 0))
    record("end", msg)


@app.consumer("burst", concurrency=4)
def handle_burst(msg: Message) -> None:
    handle(msg)


def record(event: str, msg: Message) -> None:
    line = json.dumps(
        {
            "event": event,
            "id": msg.message_id,
            "pid": os.getpid(),
            "at": time.time(),
            "delivery_count": msg.delivery_count,
        }
    )
    with open(os.environ[RECORD_ENV], "a", encoding="utf-8") as out:
        out.write(line + "\n")  # one short append per line: whole lines, even across processes


@dataclass
class Workers:
    """Starts worker processes for the test's vhost and reads what their handlers recorded.

    `target` is the app they run (this module's by default); `env` adds to their environment.
    """

    amqp_url: str
    record_path: Path
    target: str = f"{__name__}:app"
    env: dict[str, str] = field(default_factory=dict)
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def start(self) -> subprocess.Popen[bytes]:
        env = {
            **os.environ,
            "BANDGATE_AMQP_URL": self.amqp_url,
            "BANDGATE_SHUTDOWN_GRACE_SECONDS": "20",
            RECORD_ENV: str(self.record_path),
            **self.env,
        }
        process = subprocess.Popen(
            [sys.executable, "-m", "bandgate.consumers", self.target, "--log-level", "warning"],
            cwd=ROOT,
            env=env,
        )
        self.processes.append(process)
        return process

    def events(self) -> list[Event]:
        if not self.record_path.exists():
            return []
        text = self.record_path.read_text(encoding="utf-8")
        # A line still being appended by a worker is read next time, once it is whole.
        lines = text.split("\n")[:-1]
        return [json.loads(line) for line in lines]

    async def wait_for(
        self, what: str, predicate: Callable[[list[Event]], object], seconds: float = 30
    ) -> None:
        """Poll the record until `predicate(events)` holds (`seconds` at most): it is a file
        that other processes write, nothing to await."""
        deadline = time.monotonic() + seconds
        while not predicate(self.events()):
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            await asyncio.sleep(0.05)


def exited(process: subprocess.Popen[bytes], timeout: float = 30) -> int:
    return process.wait(timeout=timeout)


@pytest.fixture
def workers(amqp_url: str, tmp_path: Path) -> Iterator[Workers]:
    running = Workers(amqp_url, tmp_path / "record.jsonl")
    yield running
    for process in running.processes:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)


@pytest.fixture
async def connection(amqp_url: str) -> AsyncIterator[AbstractRobustConnection]:
    connection = await aio_pika.connect_robust(amqp_url)
    async with connection:
        await apply_topology(connection, TOPOLOGY)
        yield connection


async def publish(
    connection: AbstractRobustConnection, *payloads: Any, queue: str = "orders"
) -> list[str]:
    publisher = Publisher(TOPOLOGY, ChannelSet(confirm_channel_factory(connection)))
    envelopes = [Envelope(queue=queue, payload=payload, priority=5) for payload in payloads]
    results = await publisher.publish_many(envelopes)
    await publisher.channels.close()
    assert all(isinstance(result, Published) for result in results)
    return [envelope.message_id for envelope in envelopes]


async def depth(connection: AbstractRobustConnection, queue: str) -> int:
    channel = await connection.channel()
    declared = await channel.declare_queue(queue, passive=True)
    await channel.close()
    return declared.declaration_result.message_count or 0


def by_event(events: list[Event], event: str) -> list[Event]:
    return [entry for entry in events if entry["event"] == event]


async def test_sigterm_during_a_burst_finishes_in_flight_work_and_loses_nothing(
    connection: AbstractRobustConnection, workers: Workers
) -> None:
    ids = await publish(connection, *({"sleep": 0.1, "n": n} for n in range(60)), queue="burst")
    first = workers.start()
    await workers.wait_for("8 handled", lambda events: len(by_event(events, "end")) >= 8)
    stopped_at = time.time()
    first.send_signal(signal.SIGTERM)
    assert await asyncio.to_thread(exited, first) == 0

    events = workers.events()
    started_by_first = {entry["id"] for entry in by_event(events, "start")}
    ended_by_first = {entry["id"] for entry in by_event(events, "end")}
    assert started_by_first == ended_by_first  # whatever was running when SIGTERM came finished
    assert any(entry["at"] > stopped_at for entry in by_event(events, "end")), (
        "no handler was in flight at SIGTERM"
    )
    assert len(ended_by_first) < len(ids)  # the burst was not over

    second = workers.start()
    await workers.wait_for("all handled", lambda events: len(by_event(events, "end")) >= len(ids))
    second.send_signal(signal.SIGTERM)
    assert await asyncio.to_thread(exited, second) == 0

    events = workers.events()
    starts = [entry["id"] for entry in by_event(events, "start")]
    ends = [entry["id"] for entry in by_event(events, "end")]
    assert sorted(starts) == sorted(ids)  # each started exactly once: nothing twice
    assert sorted(ends) == sorted(ids)  # and finished: nothing lost
    assert await depth(connection, naming.band_queue("burst", "warm")) == 0
    assert await depth(connection, naming.dead_letter_queue("burst")) == 0


async def test_a_worker_killed_mid_handler_leaves_the_message_to_another(
    connection: AbstractRobustConnection, workers: Workers
) -> None:
    [message_id] = await publish(connection, {"hang": True})
    first = workers.start()
    await workers.wait_for("the first start", lambda events: by_event(events, "start"))
    first.kill()
    assert await asyncio.to_thread(exited, first) == -signal.SIGKILL

    second = workers.start()
    await workers.wait_for("the message handled", lambda events: by_event(events, "end"))
    second.send_signal(signal.SIGTERM)
    assert await asyncio.to_thread(exited, second) == 0

    events = workers.events()
    assert [(entry["id"], entry["pid"]) for entry in by_event(events, "start")] == [
        (message_id, first.pid),
        (message_id, second.pid),
    ]
    [end] = by_event(events, "end")
    assert end["pid"] == second.pid
    assert end["delivery_count"] == 1  # the broker counted the crash


async def test_a_message_that_kills_every_worker_ends_in_the_dead_letter_queue(
    connection: AbstractRobustConnection, workers: Workers
) -> None:
    dead: asyncio.Queue[AbstractIncomingMessage] = asyncio.Queue()
    channel = await connection.channel()
    dlq = await channel.get_queue(naming.dead_letter_queue("orders"))
    await dlq.consume(dead.put, no_ack=True)

    [message_id] = await publish(connection, {"kill": True})
    victims = [workers.start(), workers.start()]
    for victim in victims:  # each gets it in turn (max_deliveries = 2) and dies of it
        assert await asyncio.to_thread(exited, victim) == -signal.SIGKILL
    survivor = workers.start()
    letter = await asyncio.wait_for(dead.get(), 30)
    survivor.send_signal(signal.SIGTERM)
    assert await asyncio.to_thread(exited, survivor) == 0

    starts = by_event(workers.events(), "start")
    assert sorted(entry["pid"] for entry in starts) == sorted(victim.pid for victim in victims)
    assert [entry["delivery_count"] for entry in starts] == [0, 1]
    assert letter.message_id == message_id
    assert letter.headers[FAILURE_CAUSE] == "delivery-limit"
    assert "x-delivery-count 2 >= max_deliveries 2" in str(letter.headers[FAILURE_REASON])
    assert await depth(connection, naming.band_queue("orders", "warm")) == 0
