"""Telemetry: trace context on every log line, request lines for outbound calls, traces, metrics.

* ``context``: W3C / Cloud trace context parsing and the current scope
  (pure: the standard library only);
* ``outbound``: the ``REQUEST_OUTBOUND`` line and Cloud Logging's ``httpRequest``;
* ``core``: ``Telemetry``, the default (no spans, no metrics; carries trace context);
* ``otel``: ``OtelTelemetry``, spans and metrics through OpenTelemetry;
* ``providers``: providers and exporters from ``Settings``;
* ``spans``: a lean ``Tracer`` (the API's) feeding the SDK's span processors;
* ``metrics``: histograms aggregated here, merged into what the SDK's readers collect;
* ``http``: a ``requests`` session that writes one outbound line per call;
* ``names``: the metric and span attribute names it exports.

May import: ``eventbus.model``, ``eventbus.settings`` (and ``eventbus.store.base``
for types only). OpenTelemetry is imported only by ``otel``, ``spans``,
``metrics`` and ``providers``, which load only when an exporter is configured; ``requests``
only by ``http``. So the library imports, and runs with telemetry off,
where neither OpenTelemetry nor requests is installed.
"""

from eventbus.telemetry.core import Observation, Telemetry

__all__ = ["Observation", "Telemetry"]
