"""One trace per message's life: publish -> process -> retry publish -> process; and metrics."""

from __future__ import annotations

import asyncio

import aio_pika
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from bandgate.consumers import ConsumerApp, Message
from bandgate.consumers.settings import WorkerSettings
from bandgate.consumers.worker import Worker
from bandgate.core.publishing import ChannelSet, Publisher, confirm_channel_factory
from bandgate.core.telemetry import Telemetry
from bandgate.topology.declare import apply_topology
from bandgate.topology.loader import parse_topology
from bandgate.topology.wire import Envelope

pytestmark = pytest.mark.integration

TOPOLOGY = parse_topology(
    {
        "delay": {"base_ms": 50, "levels": 4},
        "queues": {"orders": {"retry": {"backoff_initial_seconds": 0.1, "jitter": 0}}},
    }
)


async def test_the_handler_span_continues_the_trace_and_metrics_count_outcomes(
    amqp_url: str,
) -> None:
    spans = InMemorySpanExporter()
    telemetry = Telemetry("bandgate-worker", span_exporter=spans)
    app = ConsumerApp(WorkerSettings(amqp_url=amqp_url), topology=TOPOLOGY)
    handled = asyncio.Event()

    @app.consumer("orders")
    async def flaky(msg: Message) -> None:
        if msg.attempt == 1:
            raise ConnectionError("payment service unreachable")
        handled.set()

    connection = await aio_pika.connect(amqp_url)
    async with connection:
        await apply_topology(connection, TOPOLOGY)
        worker = Worker(app, telemetry=telemetry)
        running = asyncio.create_task(worker.run())
        await asyncio.wait_for(worker.ready.wait(), 30)
        channels = ChannelSet(confirm_channel_factory(connection))
        publisher = Publisher(TOPOLOGY, channels, 5, telemetry)
        await publisher.publish(Envelope(queue="orders", payload={"order": 1}, priority=8))
        await asyncio.wait_for(handled.wait(), 10)
        worker.stop()
        await asyncio.wait_for(running, 30)
        await publisher.channels.close()

    # Ordered by start: publish, process (fails), publish (the retry), process (succeeds).
    chain = sorted(spans.get_finished_spans(), key=lambda span: span.start_time or 0)
    assert [span.name for span in chain] == [
        "publish orders",
        "process orders",
        "publish orders",
        "process orders",
    ]
    for parent, child in zip(chain, chain[1:], strict=False):
        assert child.parent is not None
        assert parent.context is not None
        assert child.parent.span_id == parent.context.span_id  # each continues the one before
    failed, succeeded = chain[1], chain[3]
    assert failed.status.status_code is StatusCode.ERROR
    assert failed.attributes is not None
    assert failed.attributes["bandgate.outcome"] == "retry"
    assert [event.name for event in failed.events] == ["exception"]
    assert succeeded.attributes is not None
    assert succeeded.attributes["bandgate.attempt"] == 2
    assert succeeded.attributes["bandgate.outcome"] == "ack"

    text = telemetry.prometheus_text().decode()
    assert 'bandgate_consumed_total{band="hot",outcome="retry",queue="orders"} 1.0' in text
    assert 'bandgate_consumed_total{band="hot",outcome="ack",queue="orders"} 1.0' in text
    assert 'bandgate_retried_total{band="hot",queue="orders"} 1.0' in text
    assert 'bandgate_handler_duration_seconds_count{band="hot",queue="orders"} 2.0' in text
