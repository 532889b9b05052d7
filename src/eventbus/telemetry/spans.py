"""A lean ``Tracer`` for the OpenTelemetry API that feeds the SDK's span processors.

The SDK's own span costs about 30 µs of CPU to start and end (locks, bounded
collections, attribute validation, callbacks), and a message makes six
(message, claim, handler, finish, and the pymongo instrumentation's two):
measured on the push bench, tracing on cost a quarter of the throughput. A
``LeanSpan`` is its ids, times, a dict of attributes and a status; the SDK
object the processors want (a ``ReadableSpan``) is built once, when it ends.

Everything else stays OpenTelemetry's: the API (``start_span``,
``start_as_current_span``, ``use_span``, context propagation), the SDK
``TracerProvider`` that owns the resource, the sampler, the id generator,
the span processors (``BatchSpanProcessor``), the exporters and shutdown.
``LeanTracerProvider(provider)`` hands out tracers for that provider; the
service's spans and the pymongo/requests instrumentations' use it.

Differences from the SDK's span, on purpose: no span limits beyond a cap on
the number of attributes (128); attribute values that are not primitives
(or sequences of them) are dropped rather than logged; ``on_start`` is not
called (the SDK's batch and simple processors do nothing there).
"""

from __future__ import annotations

import contextlib
import time
import traceback
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.trace import Event, ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.sampling import Decision
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags
from opentelemetry.util import types

MAX_ATTRIBUTES = 128
_PRIMITIVE = (str, bool, int, float)
_SAMPLED, _NOT_SAMPLED = TraceFlags(TraceFlags.SAMPLED), TraceFlags(TraceFlags.DEFAULT)
_UNSET = Status(StatusCode.UNSET)


class LeanTracerProvider(trace.TracerProvider):
    """Tracers whose spans go to ``provider``'s processors, sampled by its sampler."""

    def __init__(self, provider: TracerProvider) -> None:
        self.provider = provider
        self.resource = provider.resource
        self.sampler = provider.sampler
        self.ids = provider.id_generator
        self.keeps = getattr(self.sampler, "keeps", None)
        """``CascadeSampler.keeps``: the service's sampler, without its result objects."""
        # The processors that provider.add_span_processor() registered.
        self.processor = provider._active_span_processor

    def get_tracer(self, instrumenting_module_name: str,
                   instrumenting_library_version: str | None = None,
                   schema_url: str | None = None,
                   attributes: types.Attributes = None) -> LeanTracer:
        """Return a tracer whose spans carry this instrumentation scope."""
        return LeanTracer(self, InstrumentationScope(instrumenting_module_name,
                                                     instrumenting_library_version, schema_url,
                                                     attributes))


class LeanTracer(trace.Tracer):
    """Starts ``LeanSpan`` objects (or non-recording spans, when not sampled)."""

    def __init__(self, provider: LeanTracerProvider, scope: InstrumentationScope) -> None:
        self.provider, self.scope = provider, scope

    def start_span(self, name: str, context: Context | None = None,
                   kind: SpanKind = SpanKind.INTERNAL, attributes: types.Attributes = None,
                   links: Sequence[Link] | None = None, start_time: int | None = None,
                   record_exception: bool = True,
                   set_status_on_exception: bool = True) -> trace.Span:
        """Start a span under ``context`` (default: the current one); it is not made current."""
        provider = self.provider
        parent = trace.get_current_span(context).get_span_context()
        trace_id = parent.trace_id if parent.is_valid else provider.ids.generate_trace_id()
        span_id = provider.ids.generate_span_id()
        keeps = provider.keeps
        if keeps is not None:  # the service's own sampler, decided without objects
            state = parent.trace_state if parent.is_valid else None
            if not keeps(parent, trace_id):
                return trace.NonRecordingSpan(SpanContext(trace_id, span_id, False,
                                                          _NOT_SAMPLED, state))
            extra: Mapping[str, Any] = {}
        else:
            decided = provider.sampler.should_sample(context, trace_id, name, kind, attributes,
                                                     links)
            state, extra = decided.trace_state, decided.attributes or {}
            if decided.decision is not Decision.RECORD_AND_SAMPLE:
                flags = _SAMPLED if decided.decision.is_sampled() else _NOT_SAMPLED
                return trace.NonRecordingSpan(SpanContext(trace_id, span_id, False, flags,
                                                          state))
        span_context = SpanContext(trace_id, span_id, False, _SAMPLED, state)
        return LeanSpan(self, name, span_context, parent if parent.is_valid else None, kind,
                        {**(attributes or {}), **extra} if extra else attributes, links,
                        start_time or time.time_ns())

    # The API declares its own context-manager type; contextlib's behaves the same.
    @contextlib.contextmanager
    def start_as_current_span(self, name: str,  # type: ignore[override]
                              context: Context | None = None,
                              kind: SpanKind = SpanKind.INTERNAL,
                              attributes: types.Attributes = None,
                              links: Sequence[Link] | None = None,
                              start_time: int | None = None, record_exception: bool = True,
                              set_status_on_exception: bool = True,
                              end_on_exit: bool = True) -> Iterator[trace.Span]:
        """Start a span and make it current for the block."""
        span = self.start_span(name, context, kind, attributes, links, start_time)
        with trace.use_span(span, end_on_exit=end_on_exit, record_exception=record_exception,
                            set_status_on_exception=set_status_on_exception) as current:
            yield current


class LeanSpan(trace.Span):
    """A recording span: ids, times, attributes, events, status; a ``ReadableSpan`` at its end."""

    __slots__ = ("_attributes", "_context", "_end", "_events", "_kind", "_links", "_name",
                 "_parent", "_start", "_status", "_tracer")

    def __init__(self, tracer: LeanTracer, name: str, context: SpanContext,
                 parent: SpanContext | None, kind: SpanKind, attributes: types.Attributes,
                 links: Sequence[Link] | None, start: int) -> None:
        self._tracer, self._name, self._context, self._parent = tracer, name, context, parent
        self._kind, self._start, self._end = kind, start, 0
        self._attributes: dict[str, Any] = {}
        self._events: list[Event] = []
        self._links = tuple(links or ())
        self._status = _UNSET
        if attributes:
            self.set_attributes(attributes)

    def get_span_context(self) -> SpanContext:
        """Return this span's ids and flags."""
        return self._context

    def is_recording(self) -> bool:
        """True until the span ends."""
        return not self._end

    def set_attributes(self, attributes: Mapping[str, types.AnyValue]) -> None:
        """Set each attribute (see ``set_attribute``)."""
        stored = self._attributes
        for key, value in attributes.items():
            if isinstance(value, _PRIMITIVE) and not self._end and (
                    key in stored or len(stored) < MAX_ATTRIBUTES):
                stored[key] = value
            else:
                self.set_attribute(key, value)

    def set_attribute(self, key: str, value: types.AnyValue) -> None:
        """Set one attribute; a value that is not a primitive or a sequence of them is dropped."""
        if self._end or (key not in self._attributes
                         and len(self._attributes) >= MAX_ATTRIBUTES):
            return
        if isinstance(value, _PRIMITIVE):
            self._attributes[key] = value
        elif isinstance(value, Sequence) and all(isinstance(item, _PRIMITIVE)
                                                 for item in value):
            self._attributes[key] = tuple(value)

    def add_event(self, name: str, attributes: types.Attributes = None,
                  timestamp: int | None = None) -> None:
        """Record an event (``record_exception`` adds one)."""
        if not self._end:
            self._events.append(Event(name, attributes, timestamp or time.time_ns()))

    def add_link(self, context: SpanContext, attributes: types.Attributes = None) -> None:
        """Link another span."""
        if not self._end and context.is_valid:
            self._links = (*self._links, Link(context, attributes))

    def update_name(self, name: str) -> None:
        """Rename the span."""
        if not self._end:
            self._name = name

    def set_status(self, status: Status | StatusCode, description: str | None = None) -> None:
        """Set the status; OK is final, as the SDK has it."""
        if self._end or self._status.status_code is StatusCode.OK:
            return
        self._status = status if isinstance(status, Status) else Status(status, description)

    def record_exception(self, exception: BaseException, attributes: types.Attributes = None,
                         timestamp: int | None = None, escaped: bool = False) -> None:
        """Record ``exception`` as an ``exception`` event, as the SDK does."""
        kind = type(exception)
        module = kind.__module__
        event: dict[str, Any] = {
            "exception.type": (f"{module}.{kind.__qualname__}"
                               if module and module != "builtins" else kind.__qualname__),
            "exception.message": str(exception),
            "exception.stacktrace": "".join(traceback.format_exception(exception)),
            "exception.escaped": str(escaped),
        }
        self.add_event("exception", {**event, **(attributes or {})}, timestamp)

    def end(self, end_time: int | None = None) -> None:
        """End the span once and hand it to the provider's span processors."""
        if self._end:
            return
        self._end = end_time or time.time_ns()
        provider = self._tracer.provider
        provider.processor.on_end(ReadableSpan(
            self._name, self._context, self._parent, provider.resource, self._attributes,
            self._events, self._links, self._kind, status=self._status,
            start_time=self._start, end_time=self._end,
            instrumentation_scope=self._tracer.scope))
