"""Metrics and traces (OpenTelemetry), shared by the gateway and the workers.

Each app builds its own `Telemetry`: a meter provider exporting to a private Prometheus
registry (served on `/metrics`) and a tracer provider exporting by OTLP when
`OTEL_EXPORTER_OTLP_ENDPOINT` is set (the standard `OTEL_*` variables apply), or to the span
exporter a test passes. Trace context travels in message headers (W3C `traceparent`), so a
worker's handler span continues the trace of the publish that produced the message.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import AlwaysOffExemplarFilter, MeterProvider
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

LATENCY_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800,
)  # fmt: skip
PROMETHEUS_CONTENT_TYPE = CONTENT_TYPE_LATEST


def _otlp_exporter() -> SpanExporter | None:
    if not (
        os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    ):
        return None
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()


@dataclass
class Telemetry:
    service_name: str
    span_exporter: SpanExporter | None = None
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        resource = Resource.create({"service.name": self.service_name})
        reader = PrometheusMetricReader(registry=self.registry, scope_info_enabled=False)
        # Exemplars are sampled on every measurement and nothing here reads them.
        self.meter_provider = MeterProvider(
            metric_readers=[reader], resource=resource, exemplar_filter=AlwaysOffExemplarFilter()
        )
        self.tracer_provider = TracerProvider(resource=resource)
        # Spans cost CPU on every message; without anywhere to send them they are not made
        # (the trace context a message already carries is still passed on).
        self.tracing = True
        if self.span_exporter is not None:
            self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.span_exporter))
        elif (otlp := _otlp_exporter()) is not None:
            self.tracer_provider.add_span_processor(BatchSpanProcessor(otlp))
        else:
            self.tracing = False
        self.tracer = self.tracer_provider.get_tracer("bandgate")
        meter = self.meter_provider.get_meter("bandgate")
        count = "{message}"
        self.published = meter.create_counter(
            "bandgate.published", count, "messages the broker confirmed"
        )
        self.publish_duration = meter.create_histogram(
            "bandgate.publish.duration", "s", "publish until the broker's confirm",
            explicit_bucket_boundaries_advisory=LATENCY_BUCKETS,
        )  # fmt: skip
        self.rejected = meter.create_counter(
            "bandgate.rejected", count, "requests refused, by reason (error code)"
        )
        self.consumed = meter.create_counter(
            "bandgate.consumed", count, "messages handled, by outcome"
        )
        self.handler_duration = meter.create_histogram(
            "bandgate.handler.duration", "s", "handler run time",
            explicit_bucket_boundaries_advisory=LATENCY_BUCKETS,
        )  # fmt: skip
        self.retried = meter.create_counter("bandgate.retried", count, "retries scheduled")
        self.dead_lettered = meter.create_counter(
            "bandgate.dead_lettered", count, "messages sent to the dead-letter queue"
        )
        self.promoted = meter.create_counter(
            "bandgate.promoted", count, "messages handled after aging promoted them"
        )
        self.wait_time = meter.create_histogram(
            "bandgate.wait", "s", "enqueue (or due time) until the handler starts",
            explicit_bucket_boundaries_advisory=LATENCY_BUCKETS,
        )  # fmt: skip

    def prometheus_text(self) -> bytes:
        return generate_latest(self.registry)

    def shutdown(self) -> None:
        self.tracer_provider.shutdown()
        self.meter_provider.shutdown()


def inject_context(headers: MutableMapping[str, Any], context: Context | None = None) -> None:
    """Write the current (or given) trace context into message headers."""
    propagate.inject(headers, context=context)


def extract_context(headers: Mapping[str, Any] | None) -> Context:
    """The trace context a message carries, for the consumer span to continue."""
    carrier = {
        key: value.decode() if isinstance(value, bytes) else str(value)
        for key, value in (headers or {}).items()
        if key in ("traceparent", "tracestate")
    }
    return propagate.extract(carrier)


__all__ = ["PROMETHEUS_CONTENT_TYPE", "Telemetry", "extract_context", "inject_context", "trace"]
