from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from aio_pika.abc import AbstractRobustConnection
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.parser import text_string_to_metric_families

from bandgate.core.telemetry import Telemetry
from bandgate.gateway.app import create_app
from bandgate.gateway.settings import GatewaySettings
from bandgate.topology.model import Topology

pytestmark = pytest.mark.integration


@pytest.fixture
def spans() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
async def traced_client(
    gateway_settings: GatewaySettings, topology: Topology, spans: InMemorySpanExporter
) -> AsyncIterator[httpx.AsyncClient]:
    telemetry = Telemetry("bandgate-gateway-test", span_exporter=spans)
    app = create_app(gateway_settings, topology, telemetry=telemetry)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as http:
            yield http
    telemetry.shutdown()


def samples(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                found[tuple(sorted(sample.labels.items()))] = sample.value
    return found


async def test_metrics_count_per_band_and_rejections(traced_client: httpx.AsyncClient) -> None:
    for priority in (9, 8, 5, 0):
        response = await traced_client.post(
            "/v1/queues/orders/messages", json={"payload": 1, "priority": priority}
        )
        assert response.status_code == 201
    bad = await traced_client.post(
        "/v1/queues/orders/messages", json={"payload": 1, "priority": 11}
    )
    assert bad.status_code == 422
    await traced_client.post("/v1/queues/no-such-queue/messages", json={"payload": 1})

    response = await traced_client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    published = samples(response.text, "bandgate_published_total")
    assert published[(("band", "hot"), ("queue", "orders"))] == 2
    assert published[(("band", "warm"), ("queue", "orders"))] == 1
    assert published[(("band", "cold"), ("queue", "orders"))] == 1
    rejected = samples(response.text, "bandgate_rejected_total")
    assert rejected[(("queue", "orders"), ("reason", "invalid_priority"))] == 1
    assert rejected[(("queue", "-"), ("reason", "unknown_queue"))] == 1
    latency = samples(response.text, "bandgate_publish_duration_seconds_count")
    assert latency[(("band", "hot"), ("queue", "orders"))] == 2


async def test_publish_span_context_travels_in_the_message(
    traced_client: httpx.AsyncClient, amqp: AbstractRobustConnection, spans: InMemorySpanExporter
) -> None:
    response = await traced_client.post(
        "/v1/queues/orders/messages", json={"payload": 1, "priority": 8}
    )
    assert response.status_code == 201
    (span,) = [s for s in spans.get_finished_spans() if s.name == "publish orders"]
    assert span.attributes is not None
    assert span.attributes["bandgate.band"] == "hot"
    assert span.attributes["bandgate.priority"] == 8
    channel = await amqp.channel()
    queue = await channel.declare_queue("orders.hot", passive=True)
    message = await queue.get(no_ack=True)
    traceparent = str(message.headers["traceparent"])
    assert span.context is not None
    assert traceparent.split("-")[1] == format(span.context.trace_id, "032x")
    assert traceparent.split("-")[2] == format(span.context.span_id, "016x")
