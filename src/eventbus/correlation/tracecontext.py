"""Trace context: W3C ``traceparent``, Google's ``X-Cloud-Trace-Context``, and the current scope.

Pure (the standard library only), so the log formatter, the publisher and
the relay can use it with telemetry off and without OpenTelemetry installed.

* ``TraceContext`` is one W3C trace context (trace id, span id, sampled,
  ``tracestate``), parsed strictly from text someone else wrote: anything
  that is not a valid context is ``None``, never an exception.
* A **scope** (``Scope``, held in a context variable) is what the current
  request or message runs under: its trace context and its request id. The
  push endpoint opens one per request; the processor moves it to the
  message's trace (a cascade's trace, carried in the message attributes);
  every log line written inside it carries that trace, so Cloud Logging
  groups them (``eventbus.correlation.logs``).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import random
import re
import sys
from collections.abc import Iterator, Mapping, MutableMapping, Sequence
from typing import Any, Protocol, TypeVar

TRACEPARENT = "traceparent"
GOOGLE_TRACEPARENT = "googclient_traceparent"
"""Where google-cloud-pubsub's OpenTelemetry tracing puts the publisher's context."""
TRACESTATE = "tracestate"
CLOUD_TRACE_HEADER = "x-cloud-trace-context"
TRACE_ATTRIBUTES = (TRACEPARENT, TRACESTATE)
"""The message attributes that carry a trace context from parent to child."""

_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?",
                          re.ASCII | re.DOTALL)
_CLOUD_TRACE = re.compile(r"([0-9a-fA-F]{32})(?:/([0-9]{1,20}))?(?:;o=([0-9]+))?", re.ASCII)
_TRACESTATE_MAX = 512
_ZERO_TRACE, _ZERO_SPAN = "0" * 32, "0" * 16
_MAX_SPAN = 2**64 - 1


@dataclasses.dataclass(frozen=True, slots=True)
class TraceContext:
    """One W3C trace context: ids in lowercase hex, the sampled flag and ``tracestate``."""

    trace_id: str
    """32 lowercase hex digits, never all zero."""
    span_id: str
    """16 lowercase hex digits, never all zero: the parent of what runs under it."""
    sampled: bool = False
    tracestate: str = ""
    local: bool = dataclasses.field(default=False, compare=False)
    """Made here (nothing came with the request): fine for log lines, never a span's parent."""

    @property
    def traceparent(self) -> str:
        """The W3C ``traceparent`` value (version 00)."""
        return f"00-{self.trace_id}-{self.span_id}-{'01' if self.sampled else '00'}"

    def attributes(self) -> dict[str, str]:
        """The message attributes (or HTTP headers) that carry this context."""
        carried = {TRACEPARENT: self.traceparent}
        if self.tracestate:
            carried[TRACESTATE] = self.tracestate
        return carried

    def cloud_trace(self, project: str) -> str:
        """The value of Cloud Logging's ``logging.googleapis.com/trace`` field."""
        return f"projects/{project}/traces/{self.trace_id}"


def new_trace(sampled: bool = False) -> TraceContext:
    """Return a fresh random trace context (a root: nothing came with the request)."""
    bits = random.getrandbits(192)
    return TraceContext(f"{bits >> 64:032x}", f"{(bits & _MAX_SPAN) or 1:016x}", sampled,
                        local=True)


def parse_traceparent(value: object, tracestate: object = "") -> TraceContext | None:
    """Return the context of a W3C ``traceparent`` value, or None when it is not one."""
    if not isinstance(value, str) or len(value) > 512 or not value.isascii():
        return None
    found = _TRACEPARENT.fullmatch(value.strip())
    if found is None:
        return None
    version, trace_id, span_id, flags, rest = found.groups()
    if version == "ff" or (version == "00" and rest) or (rest and not rest[1:].isprintable()):
        return None
    if trace_id == _ZERO_TRACE or span_id == _ZERO_SPAN:
        return None
    return TraceContext(trace_id, span_id, bool(int(flags, 16) & 1), _tracestate(tracestate))


def parse_cloud_trace(value: object) -> TraceContext | None:
    """Return the context of an ``X-Cloud-Trace-Context`` value (``TRACE/SPAN;o=1``), or None.

    The span id there is decimal; a missing one gets a random span id.
    """
    if not isinstance(value, str) or len(value) > 128 or not value.isascii():
        return None
    found = _CLOUD_TRACE.fullmatch(value.strip())
    if found is None:
        return None
    trace_id, span, option = found.groups()
    number = int(span) if span else 0
    if trace_id.lower() == _ZERO_TRACE or number > _MAX_SPAN:
        return None
    span_id = f"{number:016x}" if number else f"{random.getrandbits(64) or 1:016x}"
    return TraceContext(trace_id.lower(), span_id, option == "1")


class Headers(Protocol):
    """Anything with ``get(name)``: a dict, Flask's (case-insensitive) headers."""

    def get(self, key: str, /) -> Any:
        """Return the value of header ``key``, or None."""
        ...


def from_headers(headers: Headers) -> TraceContext | None:
    """Return the trace context of an HTTP request: ``traceparent``, else Google's header.

    ``headers`` is looked up by name (case-insensitive for Flask's headers;
    for a plain dict, the lowercase and the usual spellings are tried).
    """
    def get(name: str, spelled: str) -> str | None:
        return headers.get(name) or headers.get(spelled)

    return (parse_traceparent(get(TRACEPARENT, "Traceparent"),
                              get(TRACESTATE, "Tracestate") or "")
            or parse_cloud_trace(get(CLOUD_TRACE_HEADER, "X-Cloud-Trace-Context")))


def from_attributes(attributes: Mapping[str, str]) -> TraceContext | None:
    """Return the trace context a message carries in its attributes, or None.

    Without a ``traceparent`` of its own, a message published by Google's
    instrumented client continues that client's trace (``googclient_traceparent``).
    """
    if TRACEPARENT not in attributes and GOOGLE_TRACEPARENT in attributes:
        return parse_traceparent(attributes.get(GOOGLE_TRACEPARENT))
    return parse_traceparent(attributes.get(TRACEPARENT), attributes.get(TRACESTATE, ""))


def message_trace(attributes: Mapping[str, str]) -> TraceContext:
    """Return the trace a message runs under: its attributes', else the request's, else new."""
    return from_attributes(attributes) or current_trace() or new_trace()


Document = TypeVar("Document", bound=MutableMapping[str, Any])


def stamp(outbox: Sequence[Document], carried: Mapping[str, str] | None = None) -> list[Document]:
    """Add ``carried`` (default: the current trace's attributes) to each outbox entry.

    Stored with the entry, it is what the relay publishes with the child,
    inline or from the sweeper much later, so the child joins the trace.
    """
    if not outbox:  # nothing to stamp (most pushes): no trace to read
        return []
    if carried is None:
        trace = current_trace()
        carried = trace.attributes() if trace is not None else {}
    for entry in outbox:
        entry.update(carried)
    return list(outbox)


def carried(attributes: Mapping[str, str]) -> dict[str, str]:
    """Return ``attributes`` with the caller's trace context added, unless they carry one."""
    given = dict(attributes)
    if TRACEPARENT not in given:
        trace = current_trace()
        if trace is not None:
            given.update(trace.attributes())
            if _otel_current() is not None:  # tracing on: Google's instrumented clients too
                given[GOOGLE_TRACEPARENT] = given[TRACEPARENT]
    return given


def _tracestate(value: object) -> str:
    # Kept only when it is short printable ASCII: it is passed on as it came.
    if not isinstance(value, str) or len(value) > _TRACESTATE_MAX or not value.isascii():
        return ""
    return value.strip() if value.isprintable() else ""


# --- the current scope -------------------------------------------------------------


@dataclasses.dataclass(slots=True)
class Scope:
    """What the current request or message runs under; log lines read it."""

    trace: TraceContext | None = None
    request_id: str = ""


_SCOPE: contextvars.ContextVar[Scope | None] = contextvars.ContextVar("eventbus_scope",
                                                                      default=None)


class scope:  # noqa: N801 - used as a function: ``with scope(trace, request_id):``
    """Run the block in a new scope (one request), restoring the outer one after.

    A class rather than a ``@contextmanager`` generator: every push opens one.
    """

    __slots__ = ("_token", "opened")

    def __init__(self, trace: TraceContext | None = None, request_id: str = "") -> None:
        self.opened = Scope(trace, request_id)

    def __enter__(self) -> Scope:
        self._token = _SCOPE.set(self.opened)
        return self.opened

    def __exit__(self, *exc: object) -> None:
        _SCOPE.reset(self._token)


ScopeToken = contextvars.Token[Scope | None]


def adopt(trace: TraceContext | None, request_id: str = "") -> ScopeToken | None:
    """Move the current scope to ``trace`` for good, or open one if none is open.

    The push endpoint's scope keeps the message's trace after processing, so
    the request line written last carries it too. ``request_id`` is the
    scope's when it has none yet. Returns what ``leave`` needs: None when an
    open scope was moved (it stays), the token of the scope opened here otherwise.
    """
    current = _SCOPE.get()
    if current is not None:
        current.trace = trace
        current.request_id = current.request_id or request_id
        return None
    return _SCOPE.set(Scope(trace, request_id))


def leave(token: ScopeToken | None) -> None:
    """Close the scope ``adopt`` opened (nothing when it moved an open one)."""
    if token is not None:
        _SCOPE.reset(token)


@contextlib.contextmanager
def adopted(trace: TraceContext | None, request_id: str = "") -> Iterator[Scope | None]:
    """``adopt`` for the block: a scope opened here is closed after it."""
    token = adopt(trace, request_id)
    try:
        yield _SCOPE.get()
    finally:
        leave(token)


def current_scope() -> Scope | None:
    """Return the scope the caller runs in, or None outside any."""
    return _SCOPE.get()


def current_trace() -> TraceContext | None:
    """Return the trace context of the caller: its scope's, else OpenTelemetry's current span.

    OpenTelemetry is asked only when something already imported it, so a
    process without it never loads it here.
    """
    current = _SCOPE.get()
    if current is not None and current.trace is not None:
        return current.trace
    return _otel_current()


def current_request_id() -> str:
    """Return the request id of the caller's scope, or an empty string."""
    current = _SCOPE.get()
    return current.request_id if current is not None else ""


def _otel_current() -> TraceContext | None:
    api = sys.modules.get("opentelemetry.trace")
    if api is None:
        return None
    span_context = api.get_current_span().get_span_context()
    if not span_context.is_valid:
        return None
    state = span_context.trace_state.to_header() if span_context.trace_state else ""
    return TraceContext(f"{span_context.trace_id:032x}", f"{span_context.span_id:016x}",
                        span_context.trace_flags.sampled, state)
