"""Histograms the service aggregates itself, added to what the SDK's metric readers collect.

One SDK measurement costs about sixty Python calls (attribute validation,
hashing, locks, the aggregation), and each processed event records three
histogram values. A ``LocalHistogram`` keeps, per label set, the bucket
counts, sum, count, min and max under one lock (a ``bisect`` and a few
additions); when a reader collects, ``LocalMetrics.merge`` adds them to the
collected ``MetricsData`` as ordinary cumulative OpenTelemetry histograms, so
every exporter (OTLP, Prometheus, in-memory) sees them like the SDK's own.

The readers here (``InMemoryReader``, ``PeriodicReader``, ``prometheus_reader``)
are the SDK's with that merge in ``_receive_metrics``, the hook the SDK gives
readers for the collected data. The SDK calls it when its own instruments
collected something: the service's outcome counter has data as soon as one
delivery is counted, which is before any histogram value.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Sequence
from typing import Any

from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Histogram,
    HistogramDataPoint,
    InMemoryMetricReader,
    Metric,
    MetricReader,
    MetricsData,
    PeriodicExportingMetricReader,
    ResourceMetrics,
    ScopeMetrics,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

Labels = tuple[tuple[str, str], ...]
SCOPE = InstrumentationScope("eventbus")


class LocalHistogram:
    """One histogram, aggregated per label set; ``record`` is cheap and thread-safe."""

    def __init__(self, name: str, unit: str, description: str,
                 bounds: Sequence[float]) -> None:
        self.name, self.unit, self.description = name, unit, description
        self.bounds = tuple(float(bound) for bound in bounds)
        self._points: dict[Labels, list[Any]] = {}
        self._lock = threading.Lock()

    def record(self, value: float, labels: Labels) -> None:
        """Add ``value`` to the point of ``labels``."""
        bucket = bisect.bisect_left(self.bounds, value)
        with self._lock:
            point = self._points.get(labels)
            if point is None:
                self._points[labels] = [[0] * (len(self.bounds) + 1), 0.0, 0, value, value]
                point = self._points[labels]
            point[0][bucket] += 1
            point[1] += value
            point[2] += 1
            if value < point[3]:
                point[3] = value
            if value > point[4]:
                point[4] = value

    def metric(self, start: int, now: int) -> Metric | None:
        """The cumulative histogram so far, as the SDK reports one; None before any value."""
        with self._lock:
            points = [(labels, list(counts), total, count, low, high)
                      for labels, (counts, total, count, low, high) in self._points.items()]
        if not points:
            return None
        return Metric(self.name, self.description, self.unit, Histogram(
            [HistogramDataPoint(dict(labels), start, now, count, total, counts, self.bounds,
                                low, high) for labels, counts, total, count, low, high in points],
            AggregationTemporality.CUMULATIVE))


class LocalMetrics:
    """The service's local histograms, merged into every collection of its readers."""

    def __init__(self, resource: Resource | None = None) -> None:
        self.resource = resource or Resource.create({})
        self.histograms: list[LocalHistogram] = []
        self.start = time.time_ns()

    def histogram(self, name: str, unit: str, description: str,
                  bounds: Sequence[float]) -> LocalHistogram:
        """Create a histogram that the next collections report."""
        made = LocalHistogram(name, unit, description, bounds)
        self.histograms.append(made)
        return made

    def merge(self, data: MetricsData | None) -> MetricsData | None:
        """Return ``data`` with the local histograms added to the ``eventbus`` scope."""
        now = time.time_ns()
        local = [found for found in (histogram.metric(self.start, now)
                                     for histogram in self.histograms) if found is not None]
        if not local:
            return data
        resources = list(data.resource_metrics) if data is not None else []
        if not resources:
            return MetricsData([ResourceMetrics(self.resource, [ScopeMetrics(SCOPE, local, "")],
                                                "")])
        first = resources[0]
        scopes = list(first.scope_metrics)
        for index, scope in enumerate(scopes):
            if scope.scope.name == SCOPE.name:
                scopes[index] = ScopeMetrics(scope.scope, [*scope.metrics, *local],
                                             scope.schema_url)
                break
        else:
            scopes.append(ScopeMetrics(SCOPE, local, ""))
        resources[0] = ResourceMetrics(first.resource, scopes, first.schema_url)
        return MetricsData(resources)


class _Merging(MetricReader):
    """A reader whose collected data gets the local histograms of ``local``."""

    local: LocalMetrics | None = None

    def _receive_metrics(self, metrics_data: MetricsData, timeout_millis: float = 10_000,
                         **kwargs: Any) -> None:
        merged = self.local.merge(metrics_data) if self.local is not None else metrics_data
        super()._receive_metrics(merged, timeout_millis,  # type: ignore[arg-type,safe-super]
                                 **kwargs)


class InMemoryReader(_Merging, InMemoryMetricReader):
    """The SDK's in-memory reader, with the local histograms (for tests)."""

    def __init__(self, local: LocalMetrics, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.local = local


class PeriodicReader(_Merging, PeriodicExportingMetricReader):
    """The SDK's periodic exporting reader (OTLP, no-op), with the local histograms."""

    def __init__(self, local: LocalMetrics, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.local = local


def prometheus_reader(local: LocalMetrics, registry: Any) -> MetricReader:
    """The Prometheus exporter's reader on ``registry``, with the local histograms."""
    from opentelemetry.exporter.prometheus import PrometheusMetricReader

    class PrometheusReader(_Merging, PrometheusMetricReader):
        """Prometheus, with the local histograms."""

    reader = PrometheusReader(registry=registry)
    reader.local = local
    return reader
