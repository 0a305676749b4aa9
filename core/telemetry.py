"""Metrics and traces, shared by the gateway and the workers.

Each app builds its own `Telemetry`: Prometheus metrics in a private registry (served on
`/metrics`), and an OpenTelemetry tracer provider exporting by OTLP when
`OTEL_EXPORTER_OTLP_ENDPOINT` is set (the standard `OTEL_*` variables apply), or to the span
exporter a test passes. Trace context travels in message headers (W3C `traceparent`), so a
worker's handler span continues the trace of the publish that produced the message.

Metrics are recorded with `prometheus_client` directly: a measurement costs well under a
microsecond there, against about 7 microseconds through the OpenTelemetry metrics SDK, and
every message records two or three (measured in bench/, the worker's CPU per message).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.metrics import MetricWrapperBase

LATENCY_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800,
)  # fmt: skip

PROMETHEUS_CONTENT_TYPE = CONTENT_TYPE_LATEST

# `*_created` series double the output and nobody graphs them.
disable_created_metrics()  # type: ignore[no-untyped-call]


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
    _series: dict[tuple[MetricWrapperBase, tuple[str, ...]], Any] = field(
        default_factory=dict, init=False, repr=False
    )

    def __post_init__(self) -> None:
        resource = Resource.create({"service.name": self.service_name})
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
        band = ("queue", "band")
        registry = self.registry
        self.published = Counter(
            "bandgate_published", "messages the broker confirmed", band, registry=registry
        )
        self.publish_duration = Histogram(
            "bandgate_publish_duration_seconds", "publish until the broker's confirm", band,
            registry=registry, buckets=LATENCY_BUCKETS,
        )  # fmt: skip
        self.rejected = Counter(
            "bandgate_rejected",
            "requests refused, by reason (error code)",
            ("queue", "reason"),
            registry=registry,
        )
        self.token_refused = Counter(
            "bandgate_token_refused",
            "requests a per-token limit refused (429), by token name and code",
            ("token", "code"),
            registry=registry,
        )
        self.receives_open = Gauge(
            "bandgate_receives_open", "HTTP receives (long polls) open now, all tokens",
            registry=registry,
        )  # fmt: skip
        self.consumed = Counter(
            "bandgate_consumed", "messages handled, by outcome", (*band, "outcome"),
            registry=registry,
        )  # fmt: skip
        self.handler_duration = Histogram(
            "bandgate_handler_duration_seconds", "handler run time", band,
            registry=registry, buckets=LATENCY_BUCKETS,
        )  # fmt: skip
        self.retried = Counter("bandgate_retried", "retries scheduled", band, registry=registry)
        self.dead_lettered = Counter(
            "bandgate_dead_lettered", "messages sent to the dead-letter queue", (*band, "cause"),
            registry=registry,
        )  # fmt: skip
        self.promoted = Counter(
            "bandgate_promoted", "messages handled after aging promoted them", band,
            registry=registry,
        )  # fmt: skip
        self.leased = Gauge(
            "bandgate_leased", "messages leased to HTTP receivers (bandgate.pull) now",
            ("queue",), registry=registry,
        )  # fmt: skip
        self.ledger_following = Gauge(
            "bandgate_ledger_following",
            "1 while this process reads the tombstone ledger and has caught up with it once",
            registry=registry,
        )
        self.ledger_entries = Gauge(
            "bandgate_ledger_entries", "tombstones and handled ids this process holds in memory",
            registry=registry,
        )  # fmt: skip
        # A consumer's slots, sampled once a second (`consumers.occupancy` says what they tell).
        self.slots = Gauge(
            "bandgate_consumer_slots", "a consumer's slots (its concurrency)", ("queue",),
            registry=registry,
        )  # fmt: skip
        self.busy_slots = Gauge(
            "bandgate_consumer_busy_slots", "slots running a message of this band", band,
            registry=registry,
        )  # fmt: skip
        self.at_hand = Gauge(
            "bandgate_consumer_at_hand", "messages of this band delivered, waiting for a slot",
            band, registry=registry,
        )  # fmt: skip
        self.reserved_slots = Gauge(
            "bandgate_consumer_reserved_slots",
            "slots the headroom keeps free of the coldest band's work, for hotter arrivals",
            ("queue",), registry=registry,
        )  # fmt: skip
        self.hotter_load = Gauge(
            "bandgate_consumer_hotter_load",
            "slots the bands hotter than the coldest held, averaged over the last second",
            ("queue",), registry=registry,
        )  # fmt: skip
        self.wait_time = Histogram(
            "bandgate_wait_seconds", "enqueue (or due time) until the handler starts", band,
            registry=registry, buckets=LATENCY_BUCKETS,
        )  # fmt: skip

    def series(self, metric: MetricWrapperBase, *labels: str) -> Any:
        """`metric.labels(*labels)`, looked up once per label values: `labels()` on every
        message was a few percent of the CPU a message costs the gateway and the worker."""
        key = (metric, labels)
        child = self._series.get(key)
        if child is None:
            child = self._series[key] = metric.labels(*labels)
        return child

    def prometheus_text(self) -> bytes:
        return generate_latest(self.registry)

    def shutdown(self) -> None:
        self.tracer_provider.shutdown()


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
