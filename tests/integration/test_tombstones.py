"""The tombstone ledger on the consumer side: cancelled and superseded copies are acked without
running, in worker processes and HTTP receivers, through a worker's kill -9, and a consumer that
dedupes runs an id once. The copies and tombstones are written as the gateway writes them
(`Publisher.publish` with the generation header, then `Publisher.record`)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import aio_pika
import httpx
import pytest
from aio_pika.abc import AbstractRobustConnection
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.parser import text_string_to_metric_families

from bandgate.consumers import ConsumerApp, Message
from bandgate.consumers.settings import WorkerSettings
from bandgate.consumers.worker import Worker
from bandgate.core import ledger
from bandgate.core.publishing import ChannelSet, Publisher, confirm_channel_factory
from bandgate.core.telemetry import Telemetry
from bandgate.gateway.settings import GatewaySettings
from bandgate.pull.app import create_app
from bandgate.pull.settings import PullSettings
from bandgate.topology import naming, wire
from bandgate.topology.declare import apply_topology
from bandgate.topology.loader import parse_topology
from bandgate.topology.wire import Envelope
from tests.integration.conftest import queue_depths
from tests.integration.test_consumer_process import RECORD_ENV, Event, Workers

pytestmark = pytest.mark.integration

TOPOLOGY = parse_topology({"delay": {"base_ms": 50, "levels": 8}, "queues": {"orders": {}}})

GATE_ENV = "BANDGATE_TEST_GATE"

# Run by the worker processes of the tests below (`bandgate worker` imports this module).
app = ConsumerApp(topology=TOPOLOGY)


@app.consumer("orders", concurrency=4)
def record(msg: Message) -> None:
    gate = os.environ.get(GATE_ENV)
    if gate:  # hold the message until the test opens the gate (a file another process writes)
        note("start", msg)
        while not os.path.exists(gate):
            time.sleep(0.01)
    time.sleep(float(os.environ.get("HANDLER_SECONDS", "0")))
    note("end", msg)


def note(event: str, msg: Message) -> None:
    with open(os.environ[RECORD_ENV], "a", encoding="utf-8") as out:
        out.write(json.dumps({"event": event, "id": msg.message_id, "pid": os.getpid()}) + "\n")


@dataclass
class Rig:
    connection: AbstractRobustConnection
    publisher: Publisher

    async def publish(
        self, message_id: str, priority: int = 1, delay: timedelta | None = None
    ) -> None:
        await self.publisher.publish(
            Envelope(
                queue="orders",
                payload={"id": message_id},
                priority=priority,
                message_id=message_id,
                deliver_at=None if delay is None else wire.now() + delay,
            )
        )

    async def replace(self, message_id: str, priority: int, delay: float | None = None) -> int:
        """What `PUT .../messages/{id}` does: the new generation, confirmed, then its tombstone."""
        generation = ledger.new_generation()
        await self.publisher.publish(
            Envelope(
                queue="orders",
                payload={"id": message_id, "generation": generation},
                priority=priority,
                message_id=message_id,
                deliver_at=None if delay is None else wire.now() + timedelta(seconds=delay),
                extra_headers={wire.GENERATION: generation},
            )
        )
        await self.publisher.record(ledger.replace("orders", message_id, generation).encode())
        return generation

    async def cancel(self, message_id: str) -> None:
        await self.publisher.record(ledger.cancel("orders", message_id).encode())


@pytest.fixture
async def rig(amqp_url: str) -> AsyncIterator[Rig]:
    connection = await aio_pika.connect_robust(amqp_url)
    async with connection:
        await apply_topology(connection, TOPOLOGY)
        publisher = Publisher(TOPOLOGY, ChannelSet(confirm_channel_factory(connection)))
        yield Rig(connection, publisher)
        await publisher.channels.close()


@dataclass
class InProcess:
    """A worker in this event loop, with what its handler saw."""

    worker: Worker
    telemetry: Telemetry
    spans: InMemorySpanExporter
    handled: list[Message] = field(default_factory=list)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)

    def consumed(self, outcome: str) -> float:
        return consumed(self.telemetry.prometheus_text().decode(), outcome)


def consumed(metrics_text: str, outcome: str) -> float:
    return sum(
        sample.value
        for family in text_string_to_metric_families(metrics_text)
        for sample in family.samples
        if sample.name == "bandgate_consumed_total" and sample.labels.get("outcome") == outcome
    )


@pytest.fixture
async def in_process(amqp_url: str, rig: Rig) -> AsyncIterator[InProcess]:
    spans = InMemorySpanExporter()
    telemetry = Telemetry("bandgate-worker", span_exporter=spans)
    consumers = ConsumerApp(WorkerSettings(amqp_url=amqp_url), topology=TOPOLOGY)
    seen = InProcess(Worker(consumers, telemetry=telemetry), telemetry, spans)

    @consumers.consumer("orders", concurrency=4)
    async def handle(msg: Message) -> None:
        seen.handled.append(msg)
        seen.arrived.set()

    running = asyncio.create_task(seen.worker.run())
    await asyncio.wait_for(seen.worker.ready.wait(), 30)
    yield seen
    seen.worker.stop()
    await asyncio.wait_for(running, 30)


async def until(what: str, condition: object, seconds: float = 30) -> None:
    """Poll `condition()` (a metric or another process's record: nothing to await)."""
    deadline = time.monotonic() + seconds
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


async def test_a_cancelled_message_is_acked_without_running_and_counted(
    rig: Rig, in_process: InProcess
) -> None:
    # Delayed, so that the running worker gets them after the cancel.
    await rig.publish("m-cancelled", delay=timedelta(seconds=1))
    await rig.cancel("m-cancelled")
    await rig.publish("m-kept", delay=timedelta(seconds=1))
    await until(
        "both settled", lambda: in_process.consumed("ack") + in_process.consumed("cancelled") >= 2
    )
    assert [m.message_id for m in in_process.handled] == ["m-kept"]
    assert in_process.consumed("cancelled") == 1
    skipped = [s for s in in_process.spans.get_finished_spans() if s.events]
    assert [e.name for s in skipped for e in s.events] == ["bandgate.tombstoned"]
    assert skipped[0].attributes is not None
    assert skipped[0].attributes["bandgate.outcome"] == "cancelled"


async def test_a_replaced_delayed_message_runs_once_at_its_new_time(
    rig: Rig, in_process: InProcess
) -> None:
    await rig.publish("m1", delay=timedelta(seconds=3))
    started = time.monotonic()
    generation = await rig.replace("m1", priority=8, delay=1.0)
    await asyncio.wait_for(in_process.arrived.wait(), 10)
    ran_after = time.monotonic() - started
    await until("the old generation skipped", lambda: in_process.consumed("superseded") == 1)
    assert [m.payload for m in in_process.handled] == [{"id": "m1", "generation": generation}]
    assert 0.9 <= ran_after < 2.5, ran_after  # the new time (1 s), not the old one (3 s)
    assert in_process.handled[0].band == "hot"


async def test_a_consumer_that_dedupes_runs_an_id_once(amqp_url: str, rig: Rig) -> None:
    telemetry = Telemetry("bandgate-worker")
    consumers = ConsumerApp(WorkerSettings(amqp_url=amqp_url), topology=TOPOLOGY)
    handled: list[str] = []

    @consumers.consumer("orders", dedupe=True)
    async def handle(msg: Message) -> None:
        handled.append(msg.message_id)

    worker = Worker(consumers, telemetry=telemetry)
    running = asyncio.create_task(worker.run())
    await asyncio.wait_for(worker.ready.wait(), 30)
    try:
        await rig.publish("m1")
        await until("the first copy", lambda: handled == ["m1"])
        await rig.publish("m1")  # published again: after a confirm_timeout, say
        await rig.publish("m2")
        text = telemetry.prometheus_text
        await until("the duplicate skipped", lambda: consumed(text().decode(), "duplicate") == 1)
        await until("m2", lambda: "m2" in handled)
        assert handled == ["m1", "m2"]
    finally:
        worker.stop()
        await asyncio.wait_for(running, 30)


async def test_a_cancel_also_stops_a_first_publish_of_its_id_made_after_it(
    rig: Rig, in_process: InProcess
) -> None:
    """The ledger cannot tell an id not published yet from one pending: a later first publish
    is generation 0, older than the cancel. A replace (a newer generation) runs."""
    await rig.cancel("m1")
    await rig.publish("m1")
    await until("skipped", lambda: in_process.consumed("cancelled") == 1)
    await rig.replace("m1", priority=1)
    await asyncio.wait_for(in_process.arrived.wait(), 10)
    assert [m.message_id for m in in_process.handled] == ["m1"]


async def test_without_dedupe_an_id_published_twice_runs_twice(
    rig: Rig, in_process: InProcess
) -> None:
    await rig.publish("m1")
    await until("the first copy", lambda: len(in_process.handled) == 1)
    await rig.publish("m1")
    await until("the second copy", lambda: len(in_process.handled) == 2)


async def test_a_worker_that_cannot_read_the_ledger_says_so_and_still_works(
    amqp_url: str, rig: Rig
) -> None:
    channel = await rig.connection.channel()
    await channel.queue_delete(naming.ledger_stream(TOPOLOGY.exchange))
    telemetry = Telemetry("bandgate-worker")
    consumers = ConsumerApp(
        WorkerSettings(amqp_url=amqp_url, declare_topology=False), topology=TOPOLOGY
    )
    handled = asyncio.Event()

    @consumers.consumer("orders")
    async def handle(msg: Message) -> None:
        handled.set()

    worker = Worker(consumers, telemetry=telemetry)
    running = asyncio.create_task(worker.run())
    try:
        await asyncio.wait_for(worker.ready.wait(), 30)
        assert worker.ledger is not None
        assert not worker.ledger.following
        assert "no queue 'zz.bandgate.ledger'" in (worker.ledger.problem or "")
        metrics = telemetry.prometheus_text().decode()
        assert "bandgate_ledger_following 0.0" in metrics
        await rig.publish("m1")
        await asyncio.wait_for(handled.wait(), 10)
    finally:
        worker.stop()
        await asyncio.wait_for(running, 30)


async def test_http_receivers_never_lease_a_cancelled_copy(amqp_url: str, rig: Rig) -> None:
    for name in ("m1", "m2", "m3"):
        await rig.publish(name, priority=8)
    await rig.cancel("m2")
    settings = GatewaySettings(amqp_url=amqp_url, auth_enabled=False)
    gateway = create_app(settings, TOPOLOGY, pull=PullSettings(linger_seconds=0.05))
    async with gateway.router.lifespan_context(gateway):
        transport = httpx.ASGITransport(app=gateway)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as http:
            response = await http.post(
                "/v1/queues/orders/receive", json={"max_messages": 10, "wait_seconds": 2}
            )
            assert response.status_code == 200, response.text
            ready = (await http.get("/readyz")).json()
            leased = [m["message_id"] for m in response.json()["messages"]]
            for message in response.json()["messages"]:
                ack = await http.delete(f"/v1/queues/orders/receipts/{message['receipt']}")
                assert ack.status_code == 204
            metrics = (await http.get("/metrics")).text
    assert leased == ["m1", "m3"]
    assert ready["ledger"] == "following"
    assert consumed(metrics, "cancelled") == 1
    assert "bandgate_ledger_following 1.0" in metrics


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class MeteredWorkers(Workers):
    """Worker processes of this module's app, each serving its metrics on a port of its own."""

    target: str = f"{__name__}:app"
    ports: list[int] = field(default_factory=list)

    def start_metered(self, **env: str) -> int:
        port = free_port()
        self.env = {"BANDGATE_METRICS_PORT": str(port), **env}
        self.start()
        self.ports.append(port)
        return port

    def counted(self, outcome: str, ports: list[int] | None = None) -> float:
        total = 0.0
        for port in ports or self.ports:
            try:
                text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
            except httpx.HTTPError:
                continue  # not serving yet, or killed
            total += consumed(text, outcome)
        return total

    def ended(self) -> list[Event]:
        return [event for event in self.events() if event["event"] == "end"]

    def ids(self) -> Counter[str]:
        return Counter(str(event["id"]) for event in self.ended())


def pids(events: list[Event]) -> set[object]:
    return {event["pid"] for event in events}


@pytest.fixture
def workers(amqp_url: str, tmp_path: Path) -> Iterator[MeteredWorkers]:
    running = MeteredWorkers(amqp_url, tmp_path / "record.jsonl")
    yield running
    for process in running.processes:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)


async def test_two_workers_skip_exactly_the_100_cancelled_of_1000(
    rig: Rig, workers: MeteredWorkers
) -> None:
    ids = [f"m{n:04d}" for n in range(1000)]
    delayed = set(ids[::10])  # 100 of them wait 1 s in the delay ladder
    for start in range(0, 1000, 100):
        envelopes = [
            Envelope(
                queue="orders",
                payload={"id": name},
                priority=1,
                message_id=name,
                deliver_at=wire.now() + timedelta(seconds=1) if name in delayed else None,
            )
            for name in ids[start : start + 100]
        ]
        results = await rig.publisher.publish_many(envelopes)
        assert all(not isinstance(r, Exception) for r in results)
    cancelled = set(ids[::20]) | set(ids[5::20][:50])  # 50 delayed, 50 ready
    assert len(cancelled) == 100
    assert len(cancelled & delayed) == 50
    for name in sorted(cancelled):
        await rig.cancel(name)
    gate = workers.record_path.with_name("gate")
    for _ in range(2):  # each holds what it takes until both hold some: both share the work
        workers.start_metered(**{GATE_ENV: str(gate)})
    await until("both workers hold messages", lambda: len(pids(workers.events())) == 2, 60)
    gate.touch()
    await until("900 handled", lambda: len(workers.ended()) >= 900, 60)
    await until("100 cancelled", lambda: workers.counted("cancelled") >= 100, 30)
    handled = workers.ids()
    assert set(handled) == set(ids) - cancelled
    assert max(handled.values()) == 1
    assert workers.counted("cancelled") == 100
    assert len(pids(workers.ended())) == 2  # both did work
    depths = await queue_depths(rig.connection, TOPOLOGY)
    assert sum(depths.values()) == 0, depths  # lost: none; nothing dead-lettered


async def test_tombstones_written_while_a_worker_was_killed_still_apply(
    rig: Rig, workers: MeteredWorkers
) -> None:
    ids = [f"m{n:03d}" for n in range(200)]
    envelopes = [Envelope(queue="orders", payload={}, priority=1, message_id=n) for n in ids]
    await rig.publisher.publish_many(envelopes)
    first = workers.start_metered(HANDLER_SECONDS="0.05")
    await until("some handled", lambda: len(workers.events()) >= 20)
    workers.processes[0].send_signal(signal.SIGKILL)
    workers.processes[0].wait(timeout=10)
    handled_before = set(workers.ids())
    pending = [name for name in ids if name not in handled_before]
    cancelled = set(pending[-50:])
    for name in sorted(cancelled):
        await rig.cancel(name)  # while no worker runs
    second = workers.start_metered(HANDLER_SECONDS="0")
    expected = set(ids) - cancelled
    await until("the rest handled", lambda: expected <= set(workers.ids()), 60)
    await until("50 cancelled", lambda: workers.counted("cancelled", [second]) >= 50, 30)
    assert not cancelled & set(workers.ids())
    assert workers.counted("cancelled", [second]) == 50
    assert first != second
    depths = await queue_depths(rig.connection, TOPOLOGY)
    assert sum(depths.values()) == 0, depths
