"""A bench-only handler module: ``BENCH_NOOP`` does nothing, so only the framework is timed.

Load it with ``EVENTBUS_HANDLER_MODULES=bench.noop_handlers``: the app includes
its ``routes`` next to its own handlers.
"""

from __future__ import annotations

from eventbus import Context, Router

EVENT_TYPE = "BENCH_NOOP"
ORDERED_TYPE = "BENCH_ORDERED"
"""The same no-op, declared ``ordered_by="entity_data.n"``: the cost of per-entity order."""

routes = Router()


@routes.handler(EVENT_TYPE)
def noop(context: Context) -> None:
    """Return at once: the event is stored SUCCESS and acked."""


@routes.handler(ORDERED_TYPE, ordered_by="entity_data.n")
def ordered_noop(context: Context) -> None:
    """Return at once, after the framework's per-entity order (hold, compare, release)."""
