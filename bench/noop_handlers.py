"""A bench-only handler module: ``BENCH_NOOP`` does nothing, so only the framework is timed.

Load it with ``EVENTBUS_HANDLER_MODULES=bench.noop_handlers``: the app includes
its ``routes`` next to its own handlers.
"""

from __future__ import annotations

from eventbus import Context, Router

EVENT_TYPE = "BENCH_NOOP"

routes = Router()


@routes.handler(EVENT_TYPE)
def noop(context: Context) -> None:
    """Return at once: the event is stored SUCCESS and acked."""
