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
* ``eventbus.event.attempts``; ``eventbus.outbox.oldest_pending_age`` (s, a gauge).

``eventbus.event_type`` comes only from routed events (the claim's), so a
flood of made-up types cannot grow the series; other deliveries count as
``(unrouted)``. Text from messages is made valid UTF-8 and cut short before
it becomes an attribute, so a hostile value never breaks an export.
"""

from __future__ import annotations

import collections
import contextlib
import contextvars
import logging
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.instrumentation.utils import suppress_instrumentation
from opentelemetry.metrics import Observation as Measurement
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from eventbus.correlation import tracecontext
from eventbus.settings import Settings
from eventbus.telemetry import names, providers
from eventbus.telemetry.core import Clock, Observation, R, Telemetry

if TYPE_CHECKING:
    from eventbus.model.delivery import Delivery
    from eventbus.store.base import Claim

logger = logging.getLogger("eventbus.telemetry")

UNROUTED = "(unrouted)"
_FAILED = frozenset({"retry", "rejected", "unavailable", "lease_lost"})
_FINAL = frozenset({"processed", "replayed", "rejected"})
_NOTHING: contextlib.nullcontext[None] = contextlib.nullcontext()
_MESSAGE: contextvars.ContextVar[_Message | None] = contextvars.ContextVar(
    "eventbus_message", default=None)
_CONSUMED = {names.SYSTEM: names.PUBSUB}
_REQUEST_HEADERS = ("traceparent", "tracestate", "x-cloud-trace-context")


def text(value: object, limit: int = 256) -> str:
    """Return ``value`` as valid UTF-8 text of at most ``limit`` characters (for attributes)."""
    raw = value if isinstance(value, str) else str(value)
    return raw[:limit].encode("utf-8", "replace").decode("utf-8")


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


class _Message(Observation):
    """One delivery being processed: its span, and what the metrics need at the end."""

    __slots__ = ("delivery", "event_type", "handler_span", "recording", "replayed", "span",
                 "telemetry")

    def __init__(self, telemetry: OtelTelemetry, delivery: Delivery, span: Span | None) -> None:
        self.telemetry, self.delivery, self.span = telemetry, delivery, span
        self.event_type, self.replayed = "", False
        self.handler_span: Span | None = None
        self.recording = span is not None and span.is_recording()

    def done(self, result: R) -> R:
        """Record the outcome on the span and the counters; return ``result``."""
        finished: Any = result  # the processor's Result
        outcome = finished.outcome.value
        if outcome == "processed" and self.replayed:
            outcome = "replayed"
        labels = {names.EVENT_TYPE: self.event_type or UNROUTED, names.OUTCOME: outcome}
        if self.span is not None:
            self._annotate(self.span, finished, labels)
        if self.telemetry.instruments is not None:
            self._count(self.telemetry.instruments, finished, labels)
        return result

    def _annotate(self, span: Span, result: Any, labels: dict[str, str]) -> None:
        if self.event_type:
            span.update_name(f"message {self.event_type}")
        span.set_attributes({**labels, names.IDEMPOTENCY_KEY: text(result.key),
                             names.ATTEMPT: result.attempt})
        if labels[names.OUTCOME] in _FAILED:
            span.set_status(Status(StatusCode.ERROR, labels[names.OUTCOME]))

    def _count(self, instruments: Instruments, result: Any, labels: dict[str, str]) -> None:
        instruments.count(labels[names.EVENT_TYPE], labels[names.OUTCOME])
        if labels[names.OUTCOME] not in _FINAL:
            return
        by_type = {names.EVENT_TYPE: labels[names.EVENT_TYPE]}
        if result.attempt > 0:
            instruments.attempts.record(result.attempt, by_type)
        published = self.delivery.published_at()
        if published is not None:
            seconds = (self.telemetry.now() - published).total_seconds()
            instruments.end_to_end.record(max(seconds, 0.0), labels)


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

    # -- one message ----------------------------------------------------------------
    def message(self, delivery: Delivery,
                request_id: str = "") -> contextlib.AbstractContextManager[Observation]:
        """Run the block as the processing of ``delivery``: its span and its observation."""
        return _Processing(self, delivery, request_id)

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
        found = trace.get_current_span(self.messages.extract(carrier)).get_span_context()
        return found if found.is_valid else None

    def claiming(self, event_type: str) -> contextlib.AbstractContextManager[Any]:
        """Span ``claim``; ``event_type`` (routed, so trusted) labels the message's metrics."""
        message = _MESSAGE.get()
        if message is not None:
            message.event_type = text(event_type, 128)
        return self._step("claim", store=True)

    def _step(self, name: str, store: bool = False,
              errors: bool = False) -> contextlib.AbstractContextManager[Any]:
        # A message the sampler dropped makes no child spans: they would be dropped too.
        message = _MESSAGE.get()
        if self.tracer is None or (message is not None and not message.recording):
            return _NOTHING
        return _Step(self.tracer, name, errors=errors, store=store and self.suppress_store)

    def claimed(self, claim: Claim) -> None:
        """Note a replay audit on the record the claim took."""
        if (message := _MESSAGE.get()) is not None and (claim.previous or {}).get("replays"):
            message.replayed = True

    def handler(self, event_type: str) -> contextlib.AbstractContextManager[Any]:
        """Span ``handler`` and the processing-duration histogram."""
        return _Handling(self, text(event_type, 128))

    def span(self, name: str) -> contextlib.AbstractContextManager[Any]:
        """A child span of the message (``finish``, ``relay``), current for its block."""
        return self._step(name, store=name == "finish")

    def emitting(self) -> dict[str, str] | None:
        """The handler span's context (where the children were emitted), as attributes."""
        message = _MESSAGE.get()
        span = None if message is None else message.handler_span or message.span
        return None if span is None else self._inject(span)

    def _inject(self, span: Span) -> dict[str, str]:
        carrier: dict[str, str] = {}
        self.messages.inject(carrier, context=trace.set_span_in_context(span))
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
                    yield self._inject(span)
            except BaseException as exc:
                _failed(span, exc)
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
    """One message: its span (current for the block), its scope's trace, its observation."""

    __slots__ = ("delivery", "message", "request_id", "scope", "span", "telemetry", "token")

    def __init__(self, telemetry: OtelTelemetry, delivery: Delivery, request_id: str) -> None:
        self.telemetry, self.delivery, self.request_id = telemetry, delivery, request_id
        self.span: Span | None = None
        self.token: object = None
        self.scope: tracecontext.ScopeToken | None = None
        self.message: contextvars.Token[_Message | None] | None = None

    def __enter__(self) -> Observation:
        if self.telemetry.tracer is not None:
            self.span = self.telemetry.message_span(self.delivery)
            self.token = otel_context.attach(trace.set_span_in_context(self.span))
            self.scope = tracecontext.adopt(trace_of(self.span.get_span_context()),
                                            self.request_id)
        observed = _Message(self.telemetry, self.delivery, self.span)
        self.message = _MESSAGE.set(observed)
        return observed

    def __exit__(self, kind: object, exc: BaseException | None, tb: object) -> None:
        if self.message is not None:
            _MESSAGE.reset(self.message)
        tracecontext.leave(self.scope)
        if self.span is not None:
            if exc is not None:
                _failed(self.span, exc)
            otel_context.detach(self.token)  # type: ignore[arg-type]
            self.span.end()


class _Step:
    """One child span of the message, current for its block (instrumented calls nest)."""

    __slots__ = ("errors", "name", "stack", "store", "tracer")

    def __init__(self, tracer: trace.Tracer, name: str, errors: bool = False,
                 store: bool = False) -> None:
        self.tracer, self.name, self.errors, self.store = tracer, name, errors, store
        self.stack = contextlib.ExitStack()

    def __enter__(self) -> Span:
        span = self.stack.enter_context(self.tracer.start_as_current_span(
            self.name, record_exception=False, set_status_on_exception=False))
        if self.store:
            # The step is the store's one round trip: it stands for it (pymongo's
            # span, when pymongo is instrumented, would repeat it).
            span.set_attribute("db.system.name", "mongodb")
            self.stack.enter_context(suppress_instrumentation())
        return span

    def __exit__(self, kind: Any, exc: BaseException | None, tb: Any) -> None:
        if exc is not None and self.errors:
            _failed(trace.get_current_span(), exc)
        self.stack.__exit__(kind, exc, tb)


class _Handling:
    """The handler's run: span ``handler`` (errors recorded) and the duration histogram."""

    __slots__ = ("event_type", "started", "step", "telemetry")

    def __init__(self, telemetry: OtelTelemetry, event_type: str) -> None:
        self.telemetry, self.event_type, self.started = telemetry, event_type, 0.0
        step = telemetry._step("handler", errors=True)
        self.step = step if isinstance(step, _Step) else None

    def __enter__(self) -> None:
        if self.step is not None:
            span = self.step.__enter__()
            message = _MESSAGE.get()
            if message is not None:
                message.handler_span = span
        self.started = time.perf_counter()

    def __exit__(self, kind: Any, exc: BaseException | None, tb: Any) -> None:
        seconds = time.perf_counter() - self.started
        if self.step is not None:
            self.step.__exit__(kind, exc, tb)
        instruments = self.telemetry.instruments
        if instruments is not None:
            labels = {**_CONSUMED, names.EVENT_TYPE: self.event_type}
            if exc is not None:
                labels[names.ERROR_TYPE] = type(exc).__qualname__
            instruments.duration.record(seconds, labels)


def trace_of(found: trace.SpanContext) -> tracecontext.TraceContext:
    """Return a span context as a ``TraceContext`` (for log lines and attributes)."""
    state = found.trace_state.to_header() if found.trace_state else ""
    return tracecontext.TraceContext(f"{found.trace_id:032x}", f"{found.span_id:016x}",
                                     found.trace_flags.sampled, state)


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


def _failed(span: Span, exc: BaseException) -> None:
    # The class only: messages may hold hostile text or internal hosts.
    span.set_attribute("exception.type", type(exc).__qualname__)
    span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
