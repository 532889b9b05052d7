"""``Telemetry``: what the app, the worker and the relay ask of telemetry; the default does nothing.

One instance belongs to one service (no provider or counter is a process
global). The processor never calls it: ``middleware()`` gives the hooks that
wrap its stages (none by default, so a push with telemetry off enters no
module of this package). The relay calls ``publishing`` per child when it has
a telemetry; the push service asks ``extract`` for a request's trace context
when tracing is on. ``eventbus.telemetry.otel`` makes spans and metrics.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import types
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from eventbus.clock import Now, utcnow

if TYPE_CHECKING:
    from eventbus.correlation import tracecontext
    from eventbus.processor.middleware import Middleware

Clock = Now
"""The one clock type (``eventbus.clock.Now``), under the name this package used."""


_NOTHING_CARRIED: contextlib.nullcontext[Mapping[str, str]] = contextlib.nullcontext(
    types.MappingProxyType({}))


class Telemetry:
    """No spans, no metrics (the default): each method is a no-op."""

    tracing = False
    """True when spans are made (OpenTelemetry, an exporter configured)."""
    metering = False
    """True when metrics are recorded."""

    def __init__(self, *, now: Clock | None = None) -> None:
        self.now = now or utcnow

    def middleware(self) -> list[Middleware]:
        """The hooks around the processor's stages: none."""
        return []

    def extract(self, headers: tracecontext.Headers) -> tracecontext.TraceContext | None:
        """The trace context of a push request's headers; None: the stdlib parser decides."""
        return None

    def publishing(self, entry: Mapping[str, Any]
                   ) -> contextlib.AbstractContextManager[Mapping[str, str]]:
        """Wrap the publishing of one outbox entry; yields the attributes the child carries."""
        return _NOTHING_CARRIED

    def watch_outbox(self, store: Any) -> None:
        """Report the age of the oldest pending outbox entry of ``store`` (a gauge)."""

    def observe(self, gauges: Callable[[Any, Callable[[], dt.datetime]], None]) -> None:
        """Create a feature's gauges (a partner's breaker, ...) on this telemetry's meter.

        ``gauges(meter, now)`` is called once, with the meter and this telemetry's
        clock, when metrics are on; never without a meter.
        """

    def metrics_page(self) -> tuple[bytes, str] | None:
        """Return the Prometheus text page and its content type; None without one."""
        return None

    def shutdown(self) -> None:
        """Flush and stop what this telemetry started."""
