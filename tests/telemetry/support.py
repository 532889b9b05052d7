"""Helpers for the telemetry tests: an ``OtelTelemetry`` on in-memory exporters, and readers."""

from __future__ import annotations

import dataclasses
import io
import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from eventbus.correlation import logs
from eventbus.telemetry import names
from eventbus.telemetry.otel import OtelTelemetry
from eventbus.telemetry.providers import sampler, views
from eventbus.testing import FakeClock


@dataclasses.dataclass
class Recorded:
    """An ``OtelTelemetry`` whose spans and metrics stay in memory."""

    telemetry: OtelTelemetry
    spans: InMemorySpanExporter
    reader: InMemoryMetricReader

    def finished(self) -> list[ReadableSpan]:
        return list(self.spans.get_finished_spans())

    def named(self, name: str) -> list[ReadableSpan]:
        return [span for span in self.finished() if span.name == name]

    def points(self, metric: str) -> list[Any]:
        data = self.reader.get_metrics_data()
        if data is None:
            return []
        return [point for resource in data.resource_metrics for scope in resource.scope_metrics
                for found in scope.metrics if found.name == metric
                for point in found.data.data_points]

    def events(self) -> dict[tuple[str, str], int]:
        """Deliveries consumed as {(event_type, outcome): count}."""
        return {(str(point.attributes[names.EVENT_TYPE]), str(point.attributes[names.OUTCOME])):
                int(point.value) for point in self.points(names.CONSUMED)}

    def outcomes(self) -> dict[str, int]:
        """Deliveries consumed, summed over event types: {outcome: count}."""
        totals: dict[str, int] = {}
        for (_, outcome), count in self.events().items():
            totals[outcome] = totals.get(outcome, 0) + count
        return totals


def recorded(clock: FakeClock | None = None, *, tracing: bool = True,
             metering: bool = True, ratio: float = 1.0) -> Recorded:
    spans, reader = InMemorySpanExporter(), InMemoryMetricReader()
    tracer_provider = None
    if tracing:
        tracer_provider = TracerProvider(sampler=sampler(ratio))
        tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    meter_provider = MeterProvider(metric_readers=[reader], views=views()) if metering else None
    telemetry = OtelTelemetry(tracer_provider=tracer_provider, meter_provider=meter_provider,
                              now=clock)
    return Recorded(telemetry, spans, reader)


@contextmanager
def captured_lines(project: str = "proj") -> Iterator[list[dict[str, Any]]]:
    """Collect the JSON lines the ``eventbus`` loggers write meanwhile, as dicts."""
    stream = io.StringIO()
    logger = logging.getLogger("eventbus")
    before = (logger.handlers, logger.level, logger.propagate)
    logs.configure("svc", "DEBUG", stream=stream, project=project)
    lines: list[dict[str, Any]] = []
    try:
        yield lines
    finally:
        logger.handlers, logger.level, logger.propagate = before[0], before[1], before[2]
        lines.extend(json.loads(line) for line in stream.getvalue().splitlines() if line)


def trace_ids(spans: list[ReadableSpan]) -> set[int]:
    return {span.context.trace_id for span in spans if span.context is not None}


def parent_of(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None
