"""Telemetry: spans and metrics through OpenTelemetry's SDK, off by default.

``from_settings`` (here) is the telemetry a service's settings ask for.

* ``core``: ``Telemetry``, the default: no middleware, every call a no-op;
* ``otel``: ``OtelTelemetry``, providers, the relay's spans, metrics on the SDK's public API;
* ``stages``: ``StageTelemetry``, the middleware around the processor's stages
  (message, claim, handler, finish and relay spans; per-message metrics);
* ``providers``: providers, exporters, views and propagators from ``Settings``;
* ``names``: the metric and attribute names it exports.

A feature's gauges are handed in (``Telemetry.observe``: ``eventbus.partners.gauges``).
Moved: ``partner_gauges`` (now ``eventbus.partners.gauges``), a stub that warns.

May import: ``eventbus.settings``, ``eventbus.correlation``, ``eventbus.processor``
(the middleware protocol and the items it wraps) and ``eventbus.model``.
OpenTelemetry is imported by ``otel``, ``stages`` and ``providers`` only, loaded
when an exporter is set: off, it needs no OpenTelemetry.
"""

from __future__ import annotations

from eventbus.settings import Settings, SettingsError
from eventbus.telemetry.core import Clock, Telemetry

__all__ = ["Telemetry", "from_settings"]


def from_settings(settings: Settings, *, now: Clock | None = None,
                  instrument: bool = True) -> Telemetry:
    """Return the telemetry ``settings`` ask for: the no-op ``Telemetry`` when both are off.

    ``instrument`` turns on the instrumentations of ``EVENTBUS_TRACE_LIBRARIES``
    along with tracing (process-wide, the first time only).
    """
    if settings.telemetry_exporter == "none" and settings.metrics_exporter == "none":
        return Telemetry(now=now)
    try:
        from eventbus.telemetry.otel import OtelTelemetry
    except ImportError as exc:
        raise SettingsError(f"telemetry needs the [telemetry] extra "
                            f"(pip install 'eventbus[telemetry]'): {exc}") from None
    return OtelTelemetry.from_settings(settings, now=now, instrument=instrument)
