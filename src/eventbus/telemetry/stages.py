"""``StageTelemetry``: OpenTelemetry spans and metrics around the processor's stages.

A ``Middleware`` (``eventbus.processor.middleware``): the stages call nothing
of telemetry; this wraps them. Per delivery of a batch:

* ``message <type>`` (CONSUMER), the delivery's span (``OtelTelemetry.message_span``);
* its children ``claim`` and ``finish`` (each standing for the store's round
  trip of the batch), ``handler`` (current while the handler runs, errors
  recorded, with the ``messaging.process.duration`` histogram) and ``relay``;
* at the end, the outcome on the span and the counters (``Observed.done``).

A batch of one (a push) makes its message's span current for the whole
batch, so instrumented calls and log lines nest under it; in a larger batch
each handler's span is current in the thread that runs it.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any, Protocol

from opentelemetry import trace
from opentelemetry.instrumentation.utils import suppress_instrumentation
from opentelemetry.trace import Span

from eventbus.correlation import tracecontext
from eventbus.model.delivery import Delivery
from eventbus.model.outcome import FACTS
from eventbus.processor.middleware import Middleware
from eventbus.processor.work import Item, Result
from eventbus.telemetry import names

UNROUTED = "(unrouted)"
_NOTE = "eventbus.telemetry"
_STORE_STEPS = frozenset({"claim", "finish"})


class Observing(Protocol):
    """What the stages' telemetry needs of ``OtelTelemetry``."""

    tracer: trace.Tracer | None
    instruments: Any
    suppress_store: bool

    def now(self) -> datetime:
        """The clock end-to-end latency is measured on."""
        ...

    def message_span(self, delivery: Delivery) -> Span:
        """Start the span of ``delivery``."""
        ...

    def inject(self, span: Span) -> dict[str, str]:
        """The attributes that carry ``span``'s context."""
        ...


def text(value: object, limit: int = 256) -> str:
    """Return ``value`` as valid UTF-8 text of at most ``limit`` characters (for attributes)."""
    raw = value if isinstance(value, str) else str(value)
    return raw[:limit].encode("utf-8", "replace").decode("utf-8")


def trace_of(found: trace.SpanContext) -> tracecontext.TraceContext:
    """Return a span context as a ``TraceContext`` (for log lines and attributes)."""
    state = found.trace_state.to_header() if found.trace_state else ""
    return tracecontext.TraceContext(f"{found.trace_id:032x}", f"{found.span_id:016x}",
                                     found.trace_flags.sampled, state)


class Observed:
    """One delivery being processed: its span, and what the metrics need at the end."""

    __slots__ = ("delivery", "event_type", "recording", "replayed", "span", "telemetry")

    def __init__(self, telemetry: Observing, delivery: Delivery, span: Span | None) -> None:
        self.telemetry, self.delivery, self.span = telemetry, delivery, span
        self.event_type, self.replayed = "", False
        self.recording = span is not None and span.is_recording()

    def done(self, result: Result) -> None:
        """Record the outcome on the span and the counters."""
        outcome = result.outcome.value
        if outcome == "processed" and self.replayed:
            outcome = "replayed"
        labels = {names.EVENT_TYPE: self.event_type or UNROUTED, names.OUTCOME: outcome}
        if self.span is not None:
            self._annotate(self.span, result, labels)
        if self.telemetry.instruments is not None:
            self._count(self.telemetry.instruments, result, labels)

    def _annotate(self, span: Span, result: Result, labels: dict[str, str]) -> None:
        if self.event_type:
            span.update_name(f"message {self.event_type}")
        span.set_attributes({**labels, names.IDEMPOTENCY_KEY: text(result.key),
                             names.ATTEMPT: result.attempt})
        if FACTS[result.outcome].failed:
            span.set_status(trace.Status(trace.StatusCode.ERROR, labels[names.OUTCOME]))

    def _count(self, instruments: Any, result: Result, labels: dict[str, str]) -> None:
        instruments.count(labels[names.EVENT_TYPE], labels[names.OUTCOME])
        if not FACTS[result.outcome].settles:
            return
        by_type = {names.EVENT_TYPE: labels[names.EVENT_TYPE]}
        if result.attempt > 0:
            instruments.attempts.record(result.attempt, by_type)
        published = self.delivery.published_at()
        if published is not None:
            seconds = (self.telemetry.now() - published).total_seconds()
            instruments.end_to_end.record(max(seconds, 0.0), labels)


class StageTelemetry(Middleware):
    """Spans and metrics of one ``OtelTelemetry`` around each batch, stage and handler."""

    def __init__(self, telemetry: Observing) -> None:
        self.telemetry = telemetry
        self.scopes_logs = telemetry.tracer is not None

    @contextlib.contextmanager
    def batch(self, items: Sequence[Item]) -> Iterator[None]:
        """Open each delivery's span and observation; on exit, record each outcome."""
        messages = [self._open(item) for item in items]
        with contextlib.ExitStack() as stack:
            if len(items) == 1 and messages[0].span is not None:
                span = messages[0].span
                stack.enter_context(trace.use_span(span, end_on_exit=False,
                                                   record_exception=False,
                                                   set_status_on_exception=False))
                stack.enter_context(tracecontext.adopted(trace_of(span.get_span_context()),
                                                         items[0].request_id))
            try:
                yield
            except BaseException as exc:
                for message in messages:
                    failed(message.span, exc)
                raise
            finally:
                stack.close()
                for item, message in zip(items, messages, strict=True):
                    self._close(item, message)

    def _open(self, item: Item) -> Observed:
        span = (self.telemetry.message_span(item.delivery)
                if self.telemetry.tracer is not None else None)
        message = Observed(self.telemetry, item.delivery, span)
        item.notes[_NOTE] = message
        return message

    def _close(self, item: Item, message: Observed) -> None:
        if item.routed:  # routed, so trusted: it may label a metric series
            message.event_type = text(item.event_type, 128)
        message.replayed = bool(item.claim and item.claim.record.get("replays"))
        if item.result is not None:
            message.done(item.result)
        if message.span is not None:
            message.span.end()

    @contextlib.contextmanager
    def stage(self, name: str, items: Sequence[Item]) -> Iterator[None]:
        """One ``name`` span per recorded message, for the batch's store round trip."""
        spans = [self._child(name, item) for item in items]
        spans_made = [span for span in spans if span is not None]
        with contextlib.ExitStack() as stack:
            if len(spans_made) == 1:
                stack.enter_context(trace.use_span(spans_made[0], end_on_exit=False))
            if name in _STORE_STEPS:
                for span in spans_made:
                    # The step is the store's one round trip: it stands for it
                    # (pymongo's span, when pymongo is instrumented, would repeat it).
                    span.set_attribute("db.system.name", "mongodb")
                if self.telemetry.suppress_store:
                    stack.enter_context(suppress_instrumentation())
            try:
                yield
            finally:
                stack.close()
                for span in spans_made:
                    span.end()

    def _child(self, name: str, item: Item) -> Span | None:
        # A message the sampler dropped makes no child spans: they would be dropped too.
        message = item.notes.get(_NOTE)
        tracer = self.telemetry.tracer
        if tracer is None or message is None or not message.recording:
            return None
        return tracer.start_span(name, context=trace.set_span_in_context(message.span))

    @contextlib.contextmanager
    def handler(self, item: Item) -> Iterator[Mapping[str, str] | None]:
        """Span ``handler`` (current) and the duration histogram; yield the children's context."""
        message = item.notes.get(_NOTE)
        span = self._child("handler", item)
        started = time.perf_counter()
        error: BaseException | None = None
        with contextlib.ExitStack() as stack:
            if span is not None:
                stack.enter_context(trace.use_span(span, end_on_exit=True,
                                                   record_exception=False,
                                                   set_status_on_exception=False))
                stack.enter_context(tracecontext.adopted(trace_of(span.get_span_context()),
                                                         item.request_id))
            carrier = span or (message.span if message is not None else None)
            try:
                yield None if carrier is None else self.telemetry.inject(carrier)
            except BaseException as exc:
                error = exc
                failed(span, exc)
                raise
            finally:
                self._duration(item, time.perf_counter() - started, error)

    def _duration(self, item: Item, seconds: float, error: BaseException | None) -> None:
        instruments = self.telemetry.instruments
        if instruments is None:
            return
        labels: dict[str, Any] = {names.SYSTEM: names.PUBSUB,
                                  names.EVENT_TYPE: text(item.event_type, 128)}
        if error is not None:
            labels[names.ERROR_TYPE] = type(error).__qualname__
        instruments.duration.record(seconds, labels)


def failed(span: Span | None, exc: BaseException) -> None:
    """Mark ``span`` failed with the exception's class only (messages may hold hostile text)."""
    if span is not None:
        span.set_attribute("exception.type", type(exc).__qualname__)
        span.set_status(trace.Status(trace.StatusCode.ERROR, type(exc).__name__))
