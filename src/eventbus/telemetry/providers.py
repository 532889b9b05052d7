"""OpenTelemetry providers, exporters, views and propagators chosen by ``Settings``.

Spans go where ``EVENTBUS_TELEMETRY_EXPORTER`` says (``cloudtrace``, ``otlp``
by the standard ``OTEL_EXPORTER_OTLP_*`` variables, ``noop``: made and
dropped, what the bench measures), sampled by ``EVENTBUS_TRACE_SAMPLE_RATIO``;
metrics where ``EVENTBUS_METRICS_EXPORTER`` says (``prometheus``: a registry
of the instance's own, served at ``/metrics``; ``otlp``; ``noop``). Each
call builds new providers: none is set as OpenTelemetry's global. The
instrumentations are process-wide by nature: the first service that turns
tracing on installs them. Public SDK API only (a test greps for private names).
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable, Sequence
from typing import Any

from opentelemetry import trace
from opentelemetry.propagators.composite import CompositePropagator
from opentelemetry.sdk.metrics import AlwaysOffExemplarFilter, MeterProvider
from opentelemetry.sdk.metrics.export import (
    MetricExporter,
    MetricExportResult,
    MetricReader,
    MetricsData,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased, Sampler, TraceIdRatioBased
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from eventbus.settings import Settings, SettingsError
from eventbus.telemetry import names

logger = logging.getLogger("eventbus.telemetry")

BUCKETS = {
    names.PROCESS_DURATION: (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                             2.5, 5.0, 10.0, 30.0, 60.0, 300.0),
    names.END_TO_END: (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
                       900.0, 3600.0, 6 * 3600.0, 86400.0, 7 * 86400.0),
    names.ATTEMPTS: (1, 2, 3, 4, 5, 10, 20, 50, 100),
}
"""Histogram bucket bounds, applied by one SDK ``View`` each."""


class NoopSpanExporter(SpanExporter):
    """Drops every span: tracing at full cost, with nowhere to send it."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        """Drop ``spans``."""
        return SpanExportResult.SUCCESS


class NoopMetricExporter(MetricExporter):
    """Drops every batch of metrics."""

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000,
               **kwargs: Any) -> MetricExportResult:
        """Drop ``metrics_data``."""
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        """Nothing is held."""
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        """Nothing to stop."""


def cloud_trace_exporter(settings: Settings) -> SpanExporter:
    """Cloud Trace, in the settings' project (credentials from the environment)."""
    from opentelemetry.exporter.cloud_trace import CloudTraceSpanExporter

    exporter: SpanExporter = CloudTraceSpanExporter(project_id=settings.project_id)
    return exporter


SPAN_EXPORTERS: dict[str, Callable[[Settings], SpanExporter]] = {
    "cloudtrace": cloud_trace_exporter,
    "otlp": lambda settings: importlib.import_module(  # configured by OTEL_EXPORTER_OTLP_*
        "opentelemetry.exporter.otlp.proto.http.trace_exporter").OTLPSpanExporter(),
    "noop": lambda settings: NoopSpanExporter(),
}


def resource(settings: Settings) -> Resource:
    """The resource every span and metric of the service carries."""
    return Resource.create({"service.name": settings.service})


def sampler(ratio: float) -> Sampler:
    """Keep ``ratio`` of traces, decided on the trace id, so a cascade is kept or dropped whole.

    A local parent decides for its children; a remote parent (a push
    request's header, a parent message's ``traceparent``) that was not
    sampled does not stop us: the same trace id gives the same decision in
    every message of a cascade.
    """
    by_trace_id = ALWAYS_ON if ratio >= 1 else TraceIdRatioBased(ratio)
    return ParentBased(root=by_trace_id, remote_parent_not_sampled=by_trace_id)


def request_propagator() -> CompositePropagator:
    """W3C, then Cloud Trace's ``X-Cloud-Trace-Context`` (what Cloud Run's front end sends)."""
    from opentelemetry.propagators.cloud_trace_propagator import CloudTraceFormatPropagator

    return CompositePropagator([CloudTraceFormatPropagator(), TraceContextTextMapPropagator()])


def tracer_provider(settings: Settings) -> TracerProvider | None:
    """Return a new tracer provider exporting where ``settings`` say; None for ``none``."""
    name = settings.telemetry_exporter
    if name == "none":
        return None
    if name not in SPAN_EXPORTERS:
        raise SettingsError(f"unknown telemetry exporter {name!r}")
    provider = TracerProvider(resource=resource(settings),
                              sampler=sampler(settings.trace_sample_ratio))
    provider.add_span_processor(BatchSpanProcessor(SPAN_EXPORTERS[name](settings)))
    return provider


def views() -> list[View]:
    """One view per histogram: its bucket bounds."""
    return [View(instrument_name=name,
                 aggregation=ExplicitBucketHistogramAggregation([float(b) for b in bounds]))
            for name, bounds in BUCKETS.items()]


def meter_provider(settings: Settings) -> tuple[MeterProvider | None, Any]:
    """Return a new meter provider and, for ``prometheus``, the registry to serve."""
    if settings.metrics_exporter == "none":
        return None, None
    reader, registry = _reader(settings.metrics_exporter, settings)
    # No exemplars: offering one per measurement costs more than the measurement itself.
    return MeterProvider(metric_readers=[reader], resource=resource(settings), views=views(),
                         exemplar_filter=AlwaysOffExemplarFilter()), registry


def _reader(name: str, settings: Settings) -> tuple[MetricReader, Any]:
    if name == "prometheus":
        from opentelemetry.exporter.prometheus import PrometheusMetricReader
        from prometheus_client import CollectorRegistry

        registry = CollectorRegistry(auto_describe=True)
        return PrometheusMetricReader(registry=registry), registry
    if name not in ("otlp", "noop"):
        raise SettingsError(f"unknown metrics exporter {name!r}")
    exporter: MetricExporter = NoopMetricExporter()
    if name == "otlp":
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

        exporter = OTLPMetricExporter()
    return PeriodicExportingMetricReader(
        exporter, export_interval_millis=settings.metrics_interval_seconds * 1000), None


def instrument_libraries(provider: trace.TracerProvider,
                         libraries: Sequence[str] = ("requests",)) -> list[Any]:
    """Install the instrumentations of ``libraries`` with ``provider``, once per process.

    Returns the instrumentors this call installed (for ``shutdown``); an
    instrumentation that is already on, or not installed, is skipped.
    """
    unknown = set(libraries) - {"pymongo", "requests", "none"}
    if unknown:
        raise SettingsError(f"EVENTBUS_TRACE_LIBRARIES: cannot instrument {sorted(unknown)}")
    installed = []
    for name, (module, kind) in _INSTRUMENTORS.items():
        if name not in libraries:
            continue
        try:
            instrumentor = getattr(importlib.import_module(module), kind)()
        except ImportError:
            logger.info("the %s instrumentation is not installed", name)
            continue
        if not instrumentor.is_instrumented_by_opentelemetry:
            instrumentor.instrument(tracer_provider=provider)
            installed.append(instrumentor)
    return installed


_INSTRUMENTORS = {"pymongo": ("opentelemetry.instrumentation.pymongo", "PymongoInstrumentor"),
                  "requests": ("opentelemetry.instrumentation.requests", "RequestsInstrumentor")}
