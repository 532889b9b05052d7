"""OpenTelemetry providers and exporters chosen by ``Settings`` (the ``[telemetry]`` extra).

* ``EVENTBUS_TELEMETRY_EXPORTER``: ``cloudtrace`` (Cloud Trace, the
  project's ``GOOGLE_CLOUD_PROJECT``), ``otlp`` (OTLP over HTTP, configured by
  the standard ``OTEL_EXPORTER_OTLP_*`` variables), ``noop`` (spans made,
  sampled and dropped: what the overhead bench measures) or ``none``;
  batched, sampled on the trace id by ``EVENTBUS_TRACE_SAMPLE_RATIO``.
* ``EVENTBUS_METRICS_EXPORTER``: ``prometheus`` (a registry of the
  instance's own, served at ``/metrics``), ``otlp``, ``noop`` or ``none``.

Each call builds new providers: nothing is set as OpenTelemetry's global
provider. The pymongo and requests instrumentations are process-wide by
nature (a pymongo command listener, a patched ``Session.send``): the first
service that turns tracing on in a process installs them, with its provider.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.metrics import AlwaysOffExemplarFilter, MeterProvider
from opentelemetry.sdk.metrics.export import (
    MetricExporter,
    MetricExportResult,
    MetricReader,
    MetricsData,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased, Sampler, TraceIdRatioBased
from opentelemetry.trace import SpanContext

from eventbus.settings import Settings, SettingsError
from eventbus.telemetry.metrics import LocalMetrics, PeriodicReader, prometheus_reader

logger = logging.getLogger("eventbus.telemetry")


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


def otlp_span_exporter(settings: Settings) -> SpanExporter:
    """OTLP over HTTP, configured by ``OTEL_EXPORTER_OTLP_*``."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()


SPAN_EXPORTERS: dict[str, Callable[[Settings], SpanExporter]] = {
    "cloudtrace": cloud_trace_exporter,
    "otlp": otlp_span_exporter,
    "noop": lambda settings: NoopSpanExporter(),
}


def resource(settings: Settings) -> Resource:
    """The resource every span and metric of the service carries."""
    return Resource.create({"service.name": settings.service})


class CascadeSampler(ParentBased):
    """Keep ``ratio`` of traces, decided on the trace id.

    A local parent decides for its children; a remote parent (a push
    request's header, a parent message's ``traceparent``) that was not
    sampled does not stop us: the same trace id gives the same decision in
    every message of a cascade, so a cascade is kept or dropped whole.
    ``keeps`` is the same rule as a plain function, for the lean tracer.
    """

    def __init__(self, ratio: float) -> None:
        by_trace_id = ALWAYS_ON if ratio >= 1 else TraceIdRatioBased(ratio)
        super().__init__(root=by_trace_id, remote_parent_not_sampled=by_trace_id)
        self.bound = TraceIdRatioBased.get_bound_for_rate(min(ratio, 1.0))

    def keeps(self, parent: SpanContext, trace_id: int) -> bool:
        """True when a span under ``parent`` (invalid: a root) of ``trace_id`` is sampled."""
        if parent.is_valid and (parent.trace_flags.sampled or not parent.is_remote):
            return parent.trace_flags.sampled
        return (trace_id & TraceIdRatioBased.TRACE_ID_LIMIT) < self.bound


def sampler(ratio: float) -> Sampler:
    """The service's sampler (``CascadeSampler``)."""
    return CascadeSampler(ratio)


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


def meter_provider(settings: Settings,
                   local: LocalMetrics) -> tuple[MeterProvider | None, Any]:
    """Return a new meter provider and, for ``prometheus``, the registry to serve.

    Its reader adds ``local``'s histograms to every collection.
    """
    name = settings.metrics_exporter
    if name == "none":
        return None, None
    registry = None
    reader: MetricReader
    if name == "prometheus":
        from prometheus_client import CollectorRegistry

        registry = CollectorRegistry(auto_describe=True)
        reader = prometheus_reader(local, registry)
    elif name in ("otlp", "noop"):
        reader = PeriodicReader(local, _metric_exporter(name),
                                export_interval_millis=settings.metrics_interval_seconds * 1000)
    else:
        raise SettingsError(f"unknown metrics exporter {name!r}")
    # No exemplars: offering one per measurement costs more than the measurement itself.
    return MeterProvider(metric_readers=[reader], resource=resource(settings),
                         exemplar_filter=AlwaysOffExemplarFilter()), registry


def _metric_exporter(name: str) -> MetricExporter:
    if name == "noop":
        return NoopMetricExporter()
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

    return OTLPMetricExporter()


def instrument_libraries(provider: trace.TracerProvider,
                         libraries: Sequence[str] = ("pymongo", "requests")) -> list[Any]:
    """Install the instrumentations of ``libraries`` with ``provider``, once per process.

    Returns the instrumentors this call installed (for ``shutdown``); an
    instrumentation that is already on, or not installed, is skipped.
    """
    unknown = set(libraries) - {"pymongo", "requests", "none"}
    if unknown:
        raise SettingsError(f"EVENTBUS_TRACE_LIBRARIES: cannot instrument {sorted(unknown)}")
    installed = []
    for name, load in (("pymongo", _pymongo), ("requests", _requests)):
        if name not in libraries:
            continue
        try:
            instrumentor = load()
        except ImportError:
            logger.info("the %s instrumentation is not installed", name)
            continue
        if not instrumentor.is_instrumented_by_opentelemetry:
            instrumentor.instrument(tracer_provider=provider)
            installed.append(instrumentor)
    return installed


def _pymongo() -> Any:
    from opentelemetry.instrumentation.pymongo import PymongoInstrumentor

    return PymongoInstrumentor()


def _requests() -> Any:
    from opentelemetry.instrumentation.requests import RequestsInstrumentor

    return RequestsInstrumentor()
