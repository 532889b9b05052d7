"""``Telemetry``: what the processor, the relay and the app call; by default it only correlates.

One instance belongs to one service (the app builds it from its settings and
hands it to its processor and relay, the way the relay gets its clock); no
counter or provider is a process global. The call sites are one line each::

    with telemetry.message(delivery, request_id) as observed:  # one span per message
        ...
        with telemetry.claiming(event_type):           # child span "claim"
            claim = store.claim(...)
        telemetry.claimed(claim)                       # attempt, replay audit
        with telemetry.handler(event_type):            # child span "handler" + latency
            handler(context)
        outbox = telemetry.stamp(outbox)               # the emitting context, per child
        with telemetry.span("finish"): store.succeed(...)
        with telemetry.span("relay"): relay(...)
        return observed.done(result)                   # outcome: attributes and counters

This class is the default, used when tracing and metrics are both off: it
creates no span and counts nothing, but still carries the **trace context**,
so that log lines group by request and by cascade in Cloud Logging:
a message runs under the trace its attributes carry (its parent's), else the
push request's (``traceparent`` / ``X-Cloud-Trace-Context``), else a new
one; and its children are stamped with it. ``OtelTelemetry``
(``eventbus.telemetry.otel``) adds OpenTelemetry spans and metrics.
"""

from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import Callable, Iterator, Mapping, MutableMapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from eventbus.model.delivery import Delivery
from eventbus.settings import Settings, SettingsError
from eventbus.telemetry import context

if TYPE_CHECKING:
    from eventbus.store.base import Claim

Clock = Callable[[], dt.datetime]
Document = TypeVar("Document", bound=MutableMapping[str, Any])
_NOTHING: contextlib.nullcontext[None] = contextlib.nullcontext()


class Finished(Protocol):
    """What ``Observation.done`` reads from the processor's ``Result``."""

    @property
    def outcome(self) -> Any:
        """The ``Outcome`` (an enum whose ``value`` names it)."""
        ...

    @property
    def key(self) -> str:
        """The record's key."""
        ...

    @property
    def event_type(self) -> str:
        """The event type, when it got that far."""
        ...

    @property
    def attempt(self) -> int:
        """The attempt number taken (0: none)."""
        ...


R = TypeVar("R", bound=Finished)


class Observation:
    """One message being processed; ``done`` closes it with the processor's result."""

    def done(self, result: R) -> R:
        """Record how the message ended (attributes, counters); return ``result``."""
        return result


_OBSERVATION = Observation()


def utcnow() -> dt.datetime:
    """Return the current UTC time, timezone-aware."""
    return dt.datetime.now(dt.UTC)


class Telemetry:
    """Trace-context correlation only: no span, no metric (the default)."""

    tracing = False
    """True when spans are made (OpenTelemetry, an exporter configured)."""
    metering = False
    """True when metrics are recorded."""

    def __init__(self, *, now: Clock | None = None) -> None:
        self.now = now or utcnow

    @classmethod
    def from_settings(cls, settings: Settings, *, now: Clock | None = None,
                      instrument: bool = True) -> Telemetry:
        """Return the telemetry ``settings`` ask for; this class when both exporters are off.

        ``instrument`` turns on the pymongo and requests instrumentations
        along with tracing (process-wide, the first time only).
        """
        if settings.telemetry_exporter == "none" and settings.metrics_exporter == "none":
            return cls(now=now)
        try:
            from eventbus.telemetry.otel import OtelTelemetry
        except ImportError as exc:
            raise SettingsError(f"telemetry needs the [telemetry] extra "
                                f"(pip install 'eventbus[telemetry]'): {exc}") from None
        return OtelTelemetry.from_settings(settings, now=now, instrument=instrument)

    # -- one message ----------------------------------------------------------------
    def message(self, delivery: Delivery,
                request_id: str = "") -> contextlib.AbstractContextManager[Observation]:
        """Run the block as the processing of ``delivery``, under its trace context."""
        return _Adopting(message_trace(delivery.attributes), request_id)

    def claiming(self, event_type: str) -> contextlib.AbstractContextManager[Any]:
        """Wrap the claim of a routed event of ``event_type``."""
        return _NOTHING

    def claimed(self, claim: Claim) -> None:
        """Note the claim taken (its attempt, and a replay audit on the record before)."""

    def handler(self, event_type: str) -> contextlib.AbstractContextManager[Any]:
        """Wrap the handler's run."""
        return _NOTHING

    def span(self, name: str) -> contextlib.AbstractContextManager[Any]:
        """Wrap one more step of the message (``finish``, ``relay``)."""
        return _NOTHING

    def stamp(self, outbox: Sequence[Document]) -> list[Document]:
        """Add the context the children were emitted in to each outbox entry; return them.

        Stored with the entry, it is what the relay publishes with the child,
        inline or from the sweeper much later, so the child joins the trace.
        """
        trace = context.current_trace()
        if trace is not None:
            carried = trace.attributes()
            for entry in outbox:
                entry.update(carried)
        return list(outbox)

    # -- the relay ----------------------------------------------------------------------
    @contextlib.contextmanager
    def relaying(self, entry: Mapping[str, Any]) -> Iterator[dict[str, str]]:
        """Run the publishing of one outbox entry under the trace it was emitted in.

        Yields the trace attributes the child must carry, when they differ from
        the stored ones (here never: the stored ones go as they are).
        """
        stored = context.from_attributes(entry)
        with context.scope(stored or context.current_trace(), context.current_request_id()):
            yield {}

    # -- the service ------------------------------------------------------------------
    def watch_outbox(self, store: Any) -> None:
        """Report the age of the oldest pending outbox entry of ``store`` (a gauge)."""

    def metrics_page(self) -> tuple[bytes, str] | None:
        """Return the Prometheus text page and its content type; None without one."""
        return None

    def shutdown(self) -> None:
        """Flush and stop what this telemetry started."""


class _Adopting:
    """The block runs under ``trace`` (``context.adopt``); a plain class: it runs per message."""

    __slots__ = ("request_id", "token", "trace")

    def __init__(self, trace: context.TraceContext, request_id: str) -> None:
        self.trace, self.request_id = trace, request_id
        self.token: context.ScopeToken | None = None

    def __enter__(self) -> Observation:
        self.token = context.adopt(self.trace, self.request_id)
        return _OBSERVATION

    def __exit__(self, *exc: object) -> None:
        context.leave(self.token)


def message_trace(attributes: Mapping[str, str]) -> context.TraceContext:
    """Return the trace a message runs under: its attributes', else the request's, else new."""
    return (context.from_attributes(attributes) or context.current_trace()
            or context.new_trace())
