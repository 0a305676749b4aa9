"""HTTP publish through the gateway, handling in a worker: one trace per message across the
two processes' telemetry, and per-band metrics on both /metrics endpoints."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.parser import text_string_to_metric_families

from bandgate.consumers import ConsumerApp, Message
from bandgate.consumers.settings import WorkerSettings
from bandgate.consumers.worker import Worker
from bandgate.core.telemetry import Telemetry
from bandgate.gateway.app import create_app
from bandgate.gateway.settings import GatewaySettings
from bandgate.ops.local_broker import free_port
from bandgate.topology.model import Topology

pytestmark = pytest.mark.integration


def series(text: str, name: str) -> dict[str, float]:
    """Samples of one metric by band."""
    return {
        sample.labels["band"]: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and sample.labels.get("queue") == "orders"
    }


async def test_one_trace_from_http_to_handler_and_metrics_per_band(
    gateway_settings: GatewaySettings, amqp_url: str, topology: Topology
) -> None:
    gateway_spans, worker_spans = InMemorySpanExporter(), InMemorySpanExporter()
    gateway_telemetry = Telemetry("bandgate-gateway", span_exporter=gateway_spans)
    worker_telemetry = Telemetry("bandgate-worker", span_exporter=worker_spans)
    metrics_port = free_port()
    app = ConsumerApp(
        WorkerSettings(amqp_url=amqp_url, metrics_port=metrics_port, declare_topology=False),
        topology=topology,
    )
    handled: dict[str, Message] = {}
    all_handled = asyncio.Event()

    @app.consumer("orders", concurrency=4)
    async def handle(msg: Message) -> None:
        handled[msg.message_id] = msg
        if len(handled) == 3:
            all_handled.set()

    gateway = create_app(gateway_settings, topology, telemetry=gateway_telemetry)
    async with gateway.router.lifespan_context(gateway):
        worker = Worker(app, telemetry=worker_telemetry)
        running = asyncio.create_task(worker.run())
        await asyncio.wait_for(worker.ready.wait(), 30)
        transport = httpx.ASGITransport(app=gateway)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
            ids = {}
            for priority in (9, 5, 1):
                response = await client.post(
                    "/v1/queues/orders/messages", json={"payload": {}, "priority": priority}
                )
                assert response.status_code == 201
                ids[response.json()["message_id"]] = response.json()["band"]
            await asyncio.wait_for(all_handled.wait(), 15)
            gateway_metrics = (await client.get("/metrics")).text
        async with httpx.AsyncClient() as scraper:
            worker_metrics = (await scraper.get(f"http://127.0.0.1:{metrics_port}/metrics")).text
        worker.stop()
        await asyncio.wait_for(running, 30)

    assert {message_id: handled[message_id].band for message_id in ids} == ids
    publish_spans = {
        span.attributes["messaging.message.id"]: span
        for span in gateway_spans.get_finished_spans()
        if span.attributes is not None and span.name == "publish orders"
    }
    process_spans = {
        span.attributes["messaging.message.id"]: span
        for span in worker_spans.get_finished_spans()
        if span.attributes is not None and span.name == "process orders"
    }
    for message_id in ids:
        published, processed = publish_spans[message_id], process_spans[message_id]
        assert published.context is not None
        assert processed.context is not None
        assert processed.parent is not None
        assert processed.context.trace_id == published.context.trace_id
        assert processed.parent.span_id == published.context.span_id

    bands = {"hot": 1.0, "warm": 1.0, "cold": 1.0}
    assert series(gateway_metrics, "bandgate_published_total") == bands
    consumed = {
        sample.labels["band"]: sample.value
        for family in text_string_to_metric_families(worker_metrics)
        for sample in family.samples
        if sample.name == "bandgate_consumed_total" and sample.labels.get("outcome") == "ack"
    }
    assert consumed == bands
    assert series(worker_metrics, "bandgate_wait_seconds_count") == bands
    gateway_telemetry.shutdown()
    worker_telemetry.shutdown()
