"""``OtelTelemetry``: OpenTelemetry spans and metrics for one service, on its own providers.

Spans (when a tracer provider is given):

* ``message <type>`` (CONSUMER), one per delivery, child of the trace
  context its attributes carry (the parent message's, so a cascade is one
  trace), else of the push request's; attributes ``eventbus.event_type``,
  ``eventbus.idempotency_key``, ``eventbus.attempt``, ``eventbus.outcome``
  and the Pub/Sub message id;
* its children ``claim``, ``handler``, ``finish`` and ``relay``; under
  ``relay`` (or, from the sweeper, under the context stored with the
  entry) one ``publish`` (PRODUCER) per child, whose context the child
  carries in its ``traceparent`` attribute.

Metrics (when a meter provider is given), all on this instance's meter:

* ``eventbus.events`` (counter): deliveries by ``event_type`` and
  ``outcome`` (processed, duplicate, rejected, retry, in_progress,
  unavailable, conflict, lease_lost; ``replayed`` instead of processed when
  the record carried a replay audit);
* ``eventbus.handler.duration`` (histogram, s): the handler's run;
* ``eventbus.event.end_to_end`` (histogram, s): ``publishTime`` to the
  final outcome (processed, replayed, rejected);
* ``eventbus.event.attempts`` (histogram): attempts an event took to its
  final outcome;
* ``eventbus.outbox.oldest_pending_age`` (gauge, s): the age of the oldest
  PENDING outbox entry, read through the store's ``oldest_pending_outbox()``.

``event_type`` labels come only from routed events (the claim's), so a flood
of made-up types cannot grow the series; other deliveries count as
``(unrouted)``. Text from messages is made valid UTF-8 and cut short before
it becomes an attribute, so a hostile value never breaks an export.
"""

from __future__ import annotations

import contextlib
import contextvars
import datetime as dt
import logging
import re
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import _SUPPRESS_INSTRUMENTATION_KEY  # OTel's switch for "covered"
from opentelemetry.metrics import CallbackOptions, Meter
from opentelemetry.metrics import Observation as Measurement
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import (
    Link,
    NonRecordingSpan,
    Span,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    Tracer,
    TraceState,
)

from eventbus.model.delivery import Delivery
from eventbus.settings import Settings
from eventbus.telemetry import context, names
from eventbus.telemetry.core import (
    Clock,
    Document,
    Finished,
    Observation,
    R,
    Telemetry,
    message_trace,
)
from eventbus.telemetry.metrics import LocalMetrics
from eventbus.telemetry.spans import LeanTracerProvider

if TYPE_CHECKING:
    from eventbus.store.base import Claim

logger = logging.getLogger("eventbus.telemetry")

UNROUTED = "(unrouted)"
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                   10.0, 30.0, 60.0, 300.0)
END_TO_END_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
                      900.0, 3600.0, 6 * 3600.0, 86400.0, 7 * 86400.0)
ATTEMPT_BUCKETS = (1, 2, 3, 4, 5, 10, 20, 50, 100)
_FAILED = frozenset({"retry", "rejected", "unavailable", "lease_lost"})
_FINAL = frozenset({"processed", "replayed", "rejected"})
_MAX_TEXT = 256
_NOTHING: contextlib.nullcontext[None] = contextlib.nullcontext()
_FRACTION = re.compile(r"(\.\d{6})\d+")
_MESSAGE: contextvars.ContextVar[_Message | None] = contextvars.ContextVar(
    "eventbus_message", default=None)


def text(value: object, limit: int = _MAX_TEXT) -> str:
    """Return ``value`` as valid UTF-8 text of at most ``limit`` characters (for attributes)."""
    raw = value if isinstance(value, str) else str(value)
    return raw[:limit].encode("utf-8", "replace").decode("utf-8")


class Instruments:
    """The service's metric instruments, on one meter.

    One SDK measurement costs about sixty Python calls, and these are taken
    for every delivery: the outcome counter is counted here, in a dict, and
    read by the SDK when it collects (an observable counter); the histograms
    are aggregated here too (``eventbus.telemetry.metrics``) and added to
    each collection by the service's readers.
    """

    def __init__(self, meter: Meter, local: LocalMetrics) -> None:
        self._counts: dict[tuple[str, str], int] = {}
        self._lock = threading.Lock()
        meter.create_observable_counter(
            names.EVENTS, callbacks=[self._observe_events], unit="{delivery}",
            description="Deliveries by event type and outcome")
        self.handler = local.histogram(names.HANDLER_DURATION, "s", "Handler run time",
                                       LATENCY_BUCKETS)
        self.end_to_end = local.histogram(
            names.END_TO_END, "s",
            "publishTime to the final outcome (processed, replayed, rejected)",
            END_TO_END_BUCKETS)
        self.attempts = local.histogram(names.ATTEMPTS, "{attempt}",
                                        "Attempts an event took to its final outcome",
                                        ATTEMPT_BUCKETS)

    def count(self, event_type: str, outcome: str) -> None:
        """Count one delivery of ``event_type`` that ended in ``outcome``."""
        key = (event_type, outcome)
        with self._lock:
            self._counts[key] = self._counts.get(key, 0) + 1

    def _observe_events(self, options: CallbackOptions) -> Iterable[Measurement]:
        with self._lock:
            counted = list(self._counts.items())
        return [Measurement(total, {"event_type": event_type, "outcome": outcome})
                for (event_type, outcome), total in counted]


class _Message(Observation):
    """One delivery being processed: its span, and what the metrics need at the end."""

    __slots__ = ("delivery", "event_type", "handler_span", "replayed", "span", "telemetry")

    def __init__(self, telemetry: OtelTelemetry, delivery: Delivery, span: Span | None) -> None:
        self.telemetry, self.delivery, self.span = telemetry, delivery, span
        self.event_type = ""
        self.replayed = False
        self.handler_span: Span | None = None

    def done(self, result: R) -> R:
        """Record the outcome on the span and the counters; return ``result``."""
        outcome = result.outcome.value
        if outcome == "processed" and self.replayed:
            outcome = "replayed"
        if self.span is not None:
            self._annotate(self.span, result, outcome)
        if self.telemetry.instruments is not None:
            self._count(self.telemetry.instruments, result, outcome)
        return result

    def _annotate(self, span: Span, result: Finished, outcome: str) -> None:
        if self.event_type:
            span.update_name(f"message {self.event_type}")
        span.set_attributes({names.EVENT_TYPE: self.event_type or UNROUTED,
                             names.IDEMPOTENCY_KEY: text(result.key),
                             names.ATTEMPT: result.attempt, names.OUTCOME: outcome})
        if outcome in _FAILED:
            span.set_status(Status(StatusCode.ERROR, outcome))

    def _count(self, instruments: Instruments, result: Finished, outcome: str) -> None:
        event_type = self.event_type or UNROUTED
        instruments.count(event_type, outcome)
        if outcome not in _FINAL:
            return
        if result.attempt > 0:
            instruments.attempts.record(result.attempt, (("event_type", event_type),))
        published = publish_time(self.delivery.publish_time)
        if published is not None:
            seconds = (self.telemetry.now() - published).total_seconds()
            instruments.end_to_end.record(max(seconds, 0.0), (("event_type", event_type),
                                                              ("outcome", outcome)))


class OtelTelemetry(Telemetry):
    """Spans and metrics through OpenTelemetry providers owned by this instance."""

    def __init__(self, *, tracer_provider: TracerProvider | None = None,
                 meter_provider: MeterProvider | None = None, now: Clock | None = None,
                 registry: Any = None, instrumentors: Sequence[Any] = (),
                 local: LocalMetrics | None = None) -> None:
        super().__init__(now=now)
        self.tracer_provider, self.meter_provider = tracer_provider, meter_provider
        self.spans = LeanTracerProvider(tracer_provider) if tracer_provider else None
        """The tracers of the service and its instrumentations: lean spans (``spans``)."""
        self.tracer = self.spans.get_tracer("eventbus") if self.spans is not None else None
        self.meter = meter_provider.get_meter("eventbus") if meter_provider else None
        self.local = local or LocalMetrics()
        """The histograms aggregated here; the meter provider's readers must merge them."""
        self.instruments = (Instruments(self.meter, self.local) if self.meter is not None
                            else None)
        self.tracing, self.metering = self.tracer is not None, self.meter is not None
        self.registry = registry
        self.instrumentors = list(instrumentors)
        self._stores: list[Any] = []

    @classmethod
    def from_settings(cls, settings: Settings, *, now: Clock | None = None,
                      instrument: bool = True) -> OtelTelemetry:
        """Build the providers, exporters and instrumentations ``settings`` name."""
        from eventbus.telemetry import providers

        tracer_provider = providers.tracer_provider(settings)
        local = LocalMetrics(providers.resource(settings))
        meter_provider, registry = providers.meter_provider(settings, local)
        built = cls(tracer_provider=tracer_provider, meter_provider=meter_provider, now=now,
                    registry=registry, local=local)
        if instrument and built.spans is not None:
            built.instrumentors = providers.instrument_libraries(built.spans,
                                                                 settings.trace_libraries)
        return built

    # -- one message ----------------------------------------------------------------
    def message(self, delivery: Delivery,
                request_id: str = "") -> contextlib.AbstractContextManager[Observation]:
        """Run the block as the processing of ``delivery``: its span and its observation."""
        return _Processing(self, delivery, request_id)

    def message_span(self, delivery: Delivery) -> Span:
        """Start the span of ``delivery``: under its attributes' context, else the request's."""
        assert self.tracer is not None
        request = context.current_trace()
        if request is not None and request.local:
            request = None  # made up for the log lines: the span starts a trace
        parent = context.from_attributes(delivery.attributes) or request
        links = ([Link(span_context(request))]
                 if request is not None and parent is not request else None)
        return self.tracer.start_span(
            "message", context=parent_context(parent), kind=SpanKind.CONSUMER, links=links,
            attributes={"messaging.system": "gcp_pubsub", "messaging.operation.type": "process",
                        "messaging.message.id": text(delivery.message_id)})

    def claiming(self, event_type: str) -> contextlib.AbstractContextManager[Any]:
        """Span ``claim``; ``event_type`` (routed, so trusted) labels the message's metrics."""
        message = _MESSAGE.get()
        if message is not None:
            message.event_type = text(event_type, 128)
        return _NOTHING if self.tracer is None else _Step(self.tracer, "claim", store=True)

    def claimed(self, claim: Claim) -> None:
        """Note a replay audit on the record the claim took."""
        message = _MESSAGE.get()
        if message is not None and claim.previous and claim.previous.get("replays"):
            message.replayed = True

    def handler(self, event_type: str) -> contextlib.AbstractContextManager[Any]:
        """Span ``handler`` and the handler-latency histogram."""
        return _Handling(self, text(event_type, 128))

    def span(self, name: str) -> contextlib.AbstractContextManager[Any]:
        """A child span of the message (``finish``, ``relay``), current for its block."""
        if self.tracer is None:
            return _NOTHING
        return _Step(self.tracer, name, store=name == "finish")

    def stamp(self, outbox: Sequence[Document]) -> list[Document]:
        """Stamp each entry with the handler span's context (where the children were emitted)."""
        message = _MESSAGE.get()
        if message is None or message.handler_span is None:
            return super().stamp(outbox)
        carried = trace_of(message.handler_span).attributes()
        for entry in outbox:
            entry.update(carried)
        return list(outbox)

    # -- the relay ----------------------------------------------------------------------
    @contextlib.contextmanager
    def relaying(self, entry: Mapping[str, Any]) -> Iterator[dict[str, str]]:
        """Span ``publish`` for one child: under the current span, else the stored context."""
        if self.tracer is None:
            with super().relaying(entry) as carried:
                yield carried
            return
        current = trace.get_current_span().get_span_context()
        parent = None if current.is_valid else parent_context(context.from_attributes(entry))
        span = self.tracer.start_span(
            "publish", context=parent, kind=SpanKind.PRODUCER,
            attributes={"messaging.system": "gcp_pubsub", "messaging.operation.type": "send",
                        names.EVENT_TYPE: text(entry.get("event_type", ""), 128),
                        names.IDEMPOTENCY_KEY: text(entry.get("idempotency_key", ""))})
        own = trace_of(span)
        token = otel_context.attach(trace.set_span_in_context(span))
        try:
            with context.scope(own, context.current_request_id()):
                yield own.attributes()
        except BaseException as exc:
            _failed(span, exc)
            raise
        finally:
            otel_context.detach(token)
            span.end()

    # -- the service ------------------------------------------------------------------
    def watch_outbox(self, store: Any) -> None:
        """Observe the age of the oldest pending outbox entry of ``store``."""
        if self.meter is None or not hasattr(store, "oldest_pending_outbox"):
            return
        if not self._stores:
            self.meter.create_observable_gauge(
                names.OUTBOX_AGE, callbacks=[self._outbox_age], unit="s",
                description="Age of the oldest PENDING outbox entry (0 when none)")
        self._stores.append(store)

    def _outbox_age(self, options: CallbackOptions) -> Iterable[Measurement]:
        ages = []
        for store in self._stores:
            try:
                oldest = store.oldest_pending_outbox()
            except Exception as exc:  # a store that cannot answer now reports nothing
                logger.debug("outbox age not read: %s", exc)
                continue
            ages.append(0.0 if oldest is None else
                        max((self.now() - oldest).total_seconds(), 0.0))
        return [Measurement(max(ages))] if ages else []

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


class _Processing:
    """One message: its span (current for the block), its scope's trace, its observation.

    Plain classes with ``__slots__`` here rather than generator context
    managers: these run for every message, and every microsecond shows.
    """

    __slots__ = ("delivery", "message", "request_id", "scope", "span", "telemetry", "token")

    def __init__(self, telemetry: OtelTelemetry, delivery: Delivery, request_id: str) -> None:
        self.telemetry, self.delivery, self.request_id = telemetry, delivery, request_id
        self.span: Span | None = None
        self.token: object = None
        self.scope: context.ScopeToken | None = None
        self.message: contextvars.Token[_Message | None] | None = None

    def __enter__(self) -> Observation:
        if self.telemetry.tracer is not None:
            self.span = self.telemetry.message_span(self.delivery)
            self.token = otel_context.attach(trace.set_span_in_context(self.span))
            trace_context = trace_of(self.span)
        else:
            trace_context = message_trace(self.delivery.attributes)
        self.scope = context.adopt(trace_context, self.request_id)
        observed = _Message(self.telemetry, self.delivery, self.span)
        self.message = _MESSAGE.set(observed)
        return observed

    def __exit__(self, kind: object, exc: BaseException | None, tb: object) -> None:
        if self.message is not None:
            _MESSAGE.reset(self.message)
        context.leave(self.scope)
        if self.span is not None:
            if exc is not None:
                _failed(self.span, exc)
            otel_context.detach(self.token)  # type: ignore[arg-type]
            self.span.end()


class _Step:
    """One child span of the message, current for its block (pymongo and requests spans nest)."""

    __slots__ = ("errors", "name", "span", "store", "token", "tracer")

    def __init__(self, tracer: Tracer, name: str, errors: bool = False,
                 store: bool = False) -> None:
        self.tracer, self.name, self.errors, self.store = tracer, name, errors, store
        self.span: Span | None = None
        self.token: object = None

    def __enter__(self) -> Span:
        self.span = span = self.tracer.start_span(self.name)
        if self.store:
            # The step is the store's one MongoDB round trip: it stands for it, and the
            # instrumentations are suppressed inside (pymongo's span would repeat it).
            span.set_attribute("db.system.name", "mongodb")
            current = otel_context.set_value(_SUPPRESS_INSTRUMENTATION_KEY, True)
            self.token = otel_context.attach(trace.set_span_in_context(span, current))
        else:
            self.token = otel_context.attach(trace.set_span_in_context(span))
        return span

    def __exit__(self, kind: object, exc: BaseException | None, tb: object) -> None:
        assert self.span is not None
        if exc is not None and self.errors:
            _failed(self.span, exc)
        otel_context.detach(self.token)  # type: ignore[arg-type]
        self.span.end()


class _Handling:
    """The handler's run: span ``handler`` (errors recorded) and the latency histogram."""

    __slots__ = ("event_type", "started", "step", "telemetry")

    def __init__(self, telemetry: OtelTelemetry, event_type: str) -> None:
        self.telemetry, self.event_type, self.started = telemetry, event_type, 0.0
        tracer = telemetry.tracer
        self.step = None if tracer is None else _Step(tracer, "handler", errors=True)

    def __enter__(self) -> None:
        if self.step is not None:
            span = self.step.__enter__()
            message = _MESSAGE.get()
            if message is not None:
                message.handler_span = span
        self.started = time.perf_counter()

    def __exit__(self, kind: object, exc: BaseException | None, tb: object) -> None:
        seconds = time.perf_counter() - self.started
        if self.step is not None:
            self.step.__exit__(kind, exc, tb)
        instruments = self.telemetry.instruments
        if instruments is not None:
            instruments.handler.record(seconds, (("event_type", self.event_type),))


def trace_of(span: Span) -> context.TraceContext:
    """Return ``span``'s context as a ``TraceContext`` (for log lines and attributes)."""
    found = span.get_span_context()
    state = found.trace_state.to_header() if found.trace_state else ""
    return context.TraceContext(f"{found.trace_id:032x}", f"{found.span_id:016x}",
                                found.trace_flags.sampled, state)


def span_context(trace_context: context.TraceContext) -> SpanContext:
    """Return the remote OpenTelemetry ``SpanContext`` of ``trace_context``."""
    state = (TraceState.from_header([trace_context.tracestate])
             if trace_context.tracestate else None)
    return SpanContext(int(trace_context.trace_id, 16), int(trace_context.span_id, 16),
                       is_remote=True, trace_state=state,
                       trace_flags=TraceFlags(TraceFlags.SAMPLED if trace_context.sampled
                                              else TraceFlags.DEFAULT))


def parent_context(trace_context: context.TraceContext | None) -> otel_context.Context:
    """Return an OpenTelemetry context whose span is ``trace_context``; empty for a root."""
    if trace_context is None:
        return otel_context.Context()
    return trace.set_span_in_context(NonRecordingSpan(span_context(trace_context)),
                                     otel_context.Context())


def publish_time(value: str) -> dt.datetime | None:
    """Parse Pub/Sub's ``publishTime`` (RFC 3339, up to nanoseconds); None when it is not one."""
    if not value or len(value) > 40:
        return None
    try:
        moment = dt.datetime.fromisoformat(_FRACTION.sub(r"\1", value.replace("Z", "+00:00")))
    except ValueError:
        return None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=dt.UTC)


def _failed(span: Span, exc: BaseException) -> None:
    # The class only: messages may hold hostile text or internal hosts.
    span.set_attribute("exception.type", type(exc).__qualname__)
    span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
