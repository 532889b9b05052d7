"""Hooks around the processor's stages, in the manner of dramatiq's middleware.

The stages make no telemetry calls. What observes them (OpenTelemetry's
spans and metrics, the pull worker's batch timings) is a ``Middleware``
given to the ``Processor``; with none, the processor calls nothing here.

* ``batch(items)``: around the whole batch; on exit every item has its result;
* ``stage(name, items)``: around one store stage (``claim``, ``finish``,
  ``relay``) over the items it writes for;
* ``handler(item)``: around one handler run, in the thread that runs it;
  yields the trace attributes the children it emits carry (None: the
  current trace's).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence

from eventbus.processor.work import Item


class Middleware:
    """The default hooks do nothing; subclasses override what they observe."""

    scopes_logs = False
    """True when the hooks put each message's log lines under its own span (tracing):
    the processor then leaves the log scope to them."""

    @contextlib.contextmanager
    def batch(self, items: Sequence[Item]) -> Iterator[None]:
        """Wrap the processing of ``items``."""
        yield

    @contextlib.contextmanager
    def stage(self, name: str, items: Sequence[Item]) -> Iterator[None]:
        """Wrap the store stage ``name`` over ``items``."""
        yield

    @contextlib.contextmanager
    def handler(self, item: Item) -> Iterator[Mapping[str, str] | None]:
        """Wrap the handler's run for ``item``; yield the attributes its children carry."""
        yield None
