"""What the rebuild tests share: a bus on the memory store with a fake clock, a rebuild
job over it, its audit entries, and a crash between two store writes.

Used by ``tests/review/test_rebuild_probes.py`` and ``tests/unit/test_rebuild_faults.py``,
so a change to how a rebuild is assembled is made once. The buses and the jobs' processors
built here keep threads (a heartbeat, a handler loop): each is closed when its test ends
(``tests.closing``).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from pathlib import Path
from typing import Any

from eventbus.model.rebuild_policy import Replay
from eventbus.model.router import Router
from eventbus.rebuild.mode import ReplayProcessor
from eventbus.rebuild.runner import ArchiveSource, Rebuild, Selection, StoredSource, new_run
from eventbus.settings import Settings
from eventbus.store.memory import MemoryEventStore
from eventbus.store.operator_queries import EventQuery
from eventbus.testing import FakeClock, LocalBus
from tests.closing import closed_after_test
from tests.run_stores import runs_of

ENTITY = {"partnerId": "p1", "entity_id": "o-1", "entity_type": "Order"}
LEASE = 60.0


class Crash(BaseException):
    """A process dying between two store writes (not an ``Exception``: nothing handles it)."""


def local_bus(router: Router, *, lease: float = LEASE) -> LocalBus:
    """A bus for ``router`` on the memory store, leases of ``lease`` seconds, a fake clock."""
    clock = FakeClock()
    settings = Settings(relay_inline=False, lease_seconds=lease, order_wait_seconds=0.1)
    store = MemoryEventStore(lease=dt.timedelta(seconds=lease), clock=clock)
    return closed_after_test(LocalBus(router, store, settings=settings, clock=clock))


def job(bus: LocalBus, router: Router, *, keys: tuple[str, ...] = (),
        query: EventQuery | None = None, run: dict[str, Any] | None = None,
        archive: Path | None = None, retries: int = 20, batch: int = 100,
        **flags: bool) -> Rebuild:
    """A rebuild of the ``OR_MGMT`` events (or ``query``), new or resuming ``run``."""
    selection = Selection(query or EventQuery(event_type="OR_MGMT"), keys)
    run = run or new_run(by="ops@example", why="probe", started=bus.clock(),
                         selection=selection, flags=flags,
                         archive=str(archive) if archive else None)
    replay = Replay(str(run["rebuild_id"]), "ops@example", "probe", bus.clock(),
                    new_calls=flags.get("new_calls", False),
                    emit_new=flags.get("emit_new", False))
    processor = closed_after_test(ReplayProcessor(bus.store, router, bus.settings, bus.clock,
                                                  replay, after_success=bus.relay,
                                                  sleep=bus.clock.sleep,
                                                  monotonic=bus.clock.monotonic))
    source: Any = ArchiveSource(bus.store, str(archive), processor.locate,
                                selection=selection) if archive else \
        StoredSource(bus.store, Selection.from_json(run["selection"]))
    return Rebuild(runs_of(bus.store), processor, source, run, sleep=bus.clock.sleep,
                   monotonic=bus.clock.monotonic, retries=retries, batch=batch)


def audits(bus: LocalBus, key: str, rebuild_id: str | None = None) -> list[dict[str, Any]]:
    """The record's rebuild audit entries (of ``rebuild_id`` only, when given)."""
    record = bus.record(key) or {}
    return [entry for entry in record.get("replays") or []
            if rebuild_id is None or entry.get("rebuild") == rebuild_id]


def crashing(store: Any, name: str, *, after: bool = True,
             when: Callable[..., bool] = lambda *args: True) -> Callable[[], None]:
    """Make ``store.<name>`` crash the process once (after its write, or before); undo."""
    original = getattr(store, name)
    fired: list[bool] = []

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        if fired or not when(*args):
            return original(*args, **kwargs)
        fired.append(True)
        if not after:
            raise Crash(name)
        original(*args, **kwargs)
        raise Crash(name)

    setattr(store, name, wrapped)
    return lambda: setattr(store, name, original)
