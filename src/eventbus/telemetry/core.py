"""``Telemetry``: what the processor, the relay and the app call; the default does nothing.

One instance belongs to one service (no provider or counter is a process
global). The processor's calls, one per step::

    with telemetry.message(delivery, request_id) as observed:   # span "message <type>"
        with telemetry.claiming(event_type): ...                # span "claim"
        telemetry.claimed(claim)                                # replay audit
        with telemetry.handler(event_type): ...                 # span "handler", duration
        carried = telemetry.emitting()                          # context children carry
        with telemetry.span("finish"): ...                      # "finish" (and "relay")
        return observed.done(result)                            # outcome, counters

This class, the default when tracing and metrics are off, makes each call a
no-op (a shared null context, ``None``); log correlation does not depend on
it (``eventbus.correlation``). ``eventbus.telemetry.otel`` makes spans and metrics.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import types
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from eventbus.correlation import tracecontext
    from eventbus.model.delivery import Delivery
    from eventbus.store.base import Claim

Clock = Callable[[], dt.datetime]


R = TypeVar("R")
"""The processor's ``Result`` (its ``outcome``, ``key`` and ``attempt`` are read)."""


class Observation:
    """One message being processed; ``done`` closes it with the processor's result."""

    def done(self, result: R) -> R:
        """Record how the message ended (attributes, counters); return ``result``."""
        return result


_NOTHING: contextlib.nullcontext[None] = contextlib.nullcontext()
_OBSERVING = contextlib.nullcontext(Observation())
_NOTHING_CARRIED: contextlib.nullcontext[Mapping[str, str]] = contextlib.nullcontext(
    types.MappingProxyType({}))


class Telemetry:
    """No spans, no metrics (the default): each method is a no-op."""

    tracing = False
    """True when spans are made (OpenTelemetry, an exporter configured)."""
    metering = False
    """True when metrics are recorded."""

    def __init__(self, *, now: Clock | None = None) -> None:
        self.now = now or (lambda: dt.datetime.now(dt.UTC))

    def message(self, delivery: Delivery,
                request_id: str = "") -> contextlib.AbstractContextManager[Observation]:
        """Run the block as the processing of ``delivery`` (``request_id``: its logs')."""
        return _OBSERVING

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

    def emitting(self) -> dict[str, str] | None:
        """The trace attributes children emitted now carry; None: the current trace's."""
        return None

    def extract(self, headers: tracecontext.Headers) -> tracecontext.TraceContext | None:
        """The trace context of a push request's headers; None: the stdlib parser decides."""
        return None

    def publishing(self, entry: Mapping[str, Any]
                   ) -> contextlib.AbstractContextManager[Mapping[str, str]]:
        """Wrap the publishing of one outbox entry; yields the attributes the child carries."""
        return _NOTHING_CARRIED

    def watch_outbox(self, store: Any) -> None:
        """Report the age of the oldest pending outbox entry of ``store`` (a gauge)."""

    def metrics_page(self) -> tuple[bytes, str] | None:
        """Return the Prometheus text page and its content type; None without one."""
        return None

    def shutdown(self) -> None:
        """Flush and stop what this telemetry started."""
