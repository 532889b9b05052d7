"""``OtelTelemetry``: OpenTelemetry spans and metrics for one service, on its own providers.

Spans (when a tracer provider is given), through the SDK's tracer:

* ``message <type>`` (CONSUMER), one per delivery, child of the context its
  attributes carry (the parent message's: a cascade is one trace), else of
  the push request's; attributes: ``names.ATTRIBUTES``;
* its children ``claim``, ``handler``, ``finish`` and ``relay``; under
  ``relay`` (or, from the sweeper, under the context stored with the
  entry) one ``publish`` (PRODUCER) per child, whose context the child
  carries in its ``traceparent`` attribute. ``claim`` and ``finish`` stand
  for the store's round trip: the pymongo instrumentation (only when
  ``EVENTBUS_TRACE_LIBRARIES`` asks for it) is suppressed inside them.

Metrics (when a meter provider is given), SDK instruments on this instance's meter:

* ``messaging.client.consumed.messages`` (counter): deliveries by event type
  and outcome (``replayed`` for a processed record with a replay audit);
* ``messaging.process.duration`` (s): the handler's run, with ``error.type``;
* ``eventbus.event.end_to_end`` (s): ``publishTime`` to the final outcome;
* ``eventbus.event.attempts``; ``eventbus.outbox.oldest_pending_age`` (s, a gauge);
* per partner, from the store: ``eventbus.partner.breaker_state``, ``.open_for``
  (s) and ``.parked`` (``eventbus.partners.gauges``).

``eventbus.event_type`` comes only from routed events (the claim's), so a
flood of made-up types cannot grow the series; other deliveries count as
``(unrouted)``. Text from messages is made valid UTF-8 and cut short before
it becomes an attribute, so a hostile value never breaks an export.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.metrics import Observation as Measurement
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import Link, Span, SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from eventbus.correlation import tracecontext
from eventbus.processor.middleware import Middleware
from eventbus.settings import Settings
from eventbus.telemetry import names, providers
from eventbus.telemetry.core import Clock, Telemetry
from eventbus.telemetry.stages import StageTelemetry, failed, text, trace_of

if TYPE_CHECKING:
    from eventbus.model.delivery import Delivery

logger = logging.getLogger("eventbus.telemetry")

_CONSUMED = {names.SYSTEM: names.PUBSUB}
_REQUEST_HEADERS = ("traceparent", "tracestate", "x-cloud-trace-context")


class Instruments:
    """The service's SDK instruments (bucket bounds come from ``providers.views``).

    Deliveries are counted in a dict that an observable counter reports when
    the SDK collects: one measurement less per delivery, a tenth of a push's CPU.
    """

    def __init__(self, meter: Any) -> None:
        self.counts: collections.Counter[tuple[str, str]] = collections.Counter()
        self.lock = threading.Lock()  # a push service counts from many threads
        meter.create_observable_counter(names.CONSUMED, [self._consumed], "{message}",
                                        "Deliveries by event type and outcome")
        self.duration = meter.create_histogram(names.PROCESS_DURATION, "s", "Handler run")
        self.end_to_end = meter.create_histogram(names.END_TO_END, "s", "To the final outcome")
        self.attempts = meter.create_histogram(names.ATTEMPTS, "{attempt}", "Attempts taken")

    def _consumed(self, options: Any) -> list[Measurement]:
        return [Measurement(total, {**_CONSUMED, names.EVENT_TYPE: event_type,
                                    names.OUTCOME: outcome})
                for (event_type, outcome), total in self.snapshot()]

    def count(self, event_type: str, outcome: str) -> None:
        """Count one delivery."""
        with self.lock:
            self.counts[event_type, outcome] += 1

    def snapshot(self) -> list[tuple[tuple[str, str], int]]:
        """The counts so far."""
        with self.lock:
            return list(self.counts.items())


class OtelTelemetry(Telemetry):
    """Spans and metrics through OpenTelemetry providers owned by this instance."""

    def __init__(self, *, tracer_provider: TracerProvider | None = None,
                 meter_provider: MeterProvider | None = None, now: Clock | None = None,
                 registry: Any = None, instrumentors: Sequence[Any] = ()) -> None:
        super().__init__(now=now)
        self.tracer_provider, self.meter_provider = tracer_provider, meter_provider
        self.tracer = tracer_provider.get_tracer("eventbus") if tracer_provider else None
        self.meter = meter_provider.get_meter("eventbus") if meter_provider else None
        self.instruments = Instruments(self.meter) if self.meter is not None else None
        self.tracing, self.metering = self.tracer is not None, self.meter is not None
        self.registry, self.instrumentors = registry, list(instrumentors)
        self.messages = TraceContextTextMapPropagator()  # W3C, in message attributes
        self.requests = providers.request_propagator() if self.tracing else None
        self.suppress_store = False
        """True when pymongo is instrumented: ``claim`` and ``finish`` then suppress its spans."""

    @classmethod
    def from_settings(cls, settings: Settings, *, now: Clock | None = None,
                      instrument: bool = True) -> OtelTelemetry:
        """Build the providers, exporters and instrumentations ``settings`` name."""
        meter_provider, registry = providers.meter_provider(settings)
        built = cls(tracer_provider=providers.tracer_provider(settings),
                    meter_provider=meter_provider, now=now, registry=registry)
        if instrument and built.tracer_provider is not None:
            built.instrumentors = providers.instrument_libraries(built.tracer_provider,
                                                                 settings.trace_libraries)
            built.suppress_store = "pymongo" in settings.trace_libraries
        return built

    def message_span(self, delivery: Delivery) -> Span:
        """Start the span of ``delivery``: under its attributes' context, else the request's."""
        assert self.tracer is not None
        request = tracecontext.current_trace()
        request_span = (None if request is None or request.local  # made up for log lines
                        else span_context(request))
        carried = self._remote(delivery.attributes)
        parent = carried or request_span
        links = ([Link(request_span)] if request_span is not None and carried is not None
                 else None)
        return self.tracer.start_span(
            "message", context=_parent(parent), kind=SpanKind.CONSUMER, links=links,
            attributes={names.SYSTEM: names.PUBSUB, names.OPERATION: "process",
                        names.MESSAGE_ID: text(delivery.message_id)})

    def _remote(self, carrier: Mapping[str, str]) -> trace.SpanContext | None:
        # A message without a traceparent of its own continues the trace of
        # Google's instrumented client (its ``googclient_traceparent``).
        if tracecontext.TRACEPARENT not in carrier and tracecontext.GOOGLE_TRACEPARENT in carrier:
            carrier = {tracecontext.TRACEPARENT: carrier[tracecontext.GOOGLE_TRACEPARENT]}
        found = trace.get_current_span(self.messages.extract(carrier)).get_span_context()
        return found if found.is_valid else None

    def middleware(self) -> list[Middleware]:
        """The spans and metrics around the processor's stages."""
        return [StageTelemetry(self)]

    def inject(self, span: Span) -> dict[str, str]:
        """The attributes that carry ``span``'s context: W3C, and Google's client's name for it."""
        carrier: dict[str, str] = {}
        self.messages.inject(carrier, context=trace.set_span_in_context(span))
        if tracecontext.TRACEPARENT in carrier:
            carrier[tracecontext.GOOGLE_TRACEPARENT] = carrier[tracecontext.TRACEPARENT]
        return carrier

    def extract(self, headers: tracecontext.Headers) -> tracecontext.TraceContext | None:
        """The push request's context, by the W3C and Cloud Trace propagators."""
        carrier = {name: value for name in _REQUEST_HEADERS if (value := headers.get(name))}
        if self.requests is None or not carrier:
            return None
        found = trace.get_current_span(self.requests.extract(carrier)).get_span_context()
        return trace_of(found) if found.is_valid else None

    # -- the relay ----------------------------------------------------------------------
    @contextlib.contextmanager
    def publishing(self, entry: Mapping[str, Any]) -> Iterator[Mapping[str, str]]:
        """Span ``publish`` for one child: under the current span, else the stored context."""
        if self.tracer is None:
            yield {}
            return
        current = trace.get_current_span().get_span_context()
        found = None if current.is_valid else tracecontext.from_attributes(entry)
        stored = None if found is None else span_context(found)
        with self.tracer.start_as_current_span(
                "publish", context=_parent(stored) if stored else None, kind=SpanKind.PRODUCER,
                attributes={names.SYSTEM: names.PUBSUB, names.OPERATION: "send",
                            names.EVENT_TYPE: text(entry.get("event_type", ""), 128),
                            names.IDEMPOTENCY_KEY: text(entry.get("idempotency_key", ""))},
                record_exception=False, set_status_on_exception=False) as span:
            try:
                with tracecontext.adopted(trace_of(span.get_span_context())):
                    yield self.inject(span)
            except BaseException as exc:
                failed(span, exc)
                raise

    # -- the service ------------------------------------------------------------------
    def watch_outbox(self, store: Any) -> None:
        """Observe the age of the oldest pending outbox entry of ``store`` (one per service)."""
        if self.meter is not None and hasattr(store, "oldest_pending_outbox"):
            self.meter.create_observable_gauge(
                names.OUTBOX_AGE, callbacks=[lambda options: self._outbox_age(store)], unit="s",
                description="Age of the oldest PENDING outbox entry (0 when none)")

    def _outbox_age(self, store: Any) -> Iterable[Measurement]:
        try:
            oldest = store.oldest_pending_outbox()
        except Exception as exc:  # a store that cannot answer now reports nothing
            logger.debug("outbox age not read: %s", exc)
            return []
        return [Measurement(0.0 if oldest is None else
                            max((self.now() - oldest).total_seconds(), 0.0))]

    def observe(self, gauges: Callable[[Any, Callable[[], datetime]], None]) -> None:
        """Create a feature's gauges on this meter (``eventbus.partners.gauges.watching``)."""
        if self.meter is not None:
            gauges(self.meter, self.now)

    def metrics_page(self) -> tuple[bytes, str] | None:
        """Return the Prometheus text page of this instance's metrics, when so configured."""
        if self.registry is None:
            return None
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return generate_latest(self.registry), CONTENT_TYPE_LATEST

    def shutdown(self) -> None:
        """Flush the exporters, stop the providers, remove the instrumentations."""
        for instrumentor in self.instrumentors:
            instrumentor.uninstrument()
        self.instrumentors.clear()
        if self.tracer_provider is not None:
            self.tracer_provider.shutdown()
        if self.meter_provider is not None:
            self.meter_provider.shutdown()


def span_context(found: tracecontext.TraceContext) -> trace.SpanContext:
    """Return a parsed remote context as OpenTelemetry's ``SpanContext``."""
    flags = trace.TraceFlags(trace.TraceFlags.SAMPLED if found.sampled else 0)
    state = trace.TraceState.from_header([found.tracestate]) if found.tracestate else None
    return trace.SpanContext(int(found.trace_id, 16), int(found.span_id, 16), True, flags, state)


def _parent(span_context: trace.SpanContext | None) -> otel_context.Context:
    """An OpenTelemetry context whose span is ``span_context``; empty for a root."""
    if span_context is None:
        return otel_context.Context()
    return trace.set_span_in_context(trace.NonRecordingSpan(span_context),
                                     otel_context.Context())
