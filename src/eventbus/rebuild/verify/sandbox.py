"""The sandbox an event is verified in: an in-memory store that never reaches out.

``SandboxStore`` is a ``MemoryEventStore`` (the processor runs on it exactly
as on the service's store) with three changes:

* ``get`` reads the **recorded** record first (``Lookups``), so a child's
  parent is the stored parent whose outbox lists it, as in production;
* ``guard_take`` never lets a guarded side effect run: it answers the stored
  SUCCESS result when the real store has one (read-only), otherwise a
  stand-in ``{}`` result, and counts which it gave (a handler whose children
  depend on a stand-in cannot be judged: ``runner`` says so);
* ``breaker_get`` answers every partner's breaker **held open**: a handler
  that calls a partner outside the guard (``context.partner(p).call`` with no
  stored result in front of it) is refused before the call (``BreakerOpen``),
  and the event is reported "not verifiable", never called.

Nothing the sandbox does reaches the real store (``Lookups`` has only reads)
or a publisher (the processor is built without one). A handler's own effects
go to ``context.db``: an empty mongomock database for each event when
``mongomock`` is installed (``eventbus[verify]``), otherwise a database that
refuses every use, so such a handler is reported "not verifiable" rather than
writing anywhere real. Empty for each event, so an event's verdict never
depends on which other events were selected with it (and a growing
database does not slow every later event down).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import Any, Protocol

from eventbus.partners import BreakerState, forced
from eventbus.partners.memory import MemoryPartnerStore
from eventbus.store.base import Record
from eventbus.store.memory import MemoryEventStore

STAND_IN: dict[str, Any] = {}
"""The result a guarded side effect gets when the store has none: nothing."""
SANDBOX = "eventbus verify"


class Lookups(Protocol):
    """The recorded records the sandbox may read: events (parents) and side effects."""

    def event(self, key: str) -> Mapping[str, Any] | None:
        """The stored event record of ``key``, or None."""
        ...

    def side_effect(self, key: str) -> Mapping[str, Any] | None:
        """The stored guard record of side effect ``key``, or None."""
        ...


class ReadStore(Protocol):
    """The two reads ``StoreLookups`` asks of a real store (``EventStore`` has both)."""

    def get(self, key: str) -> Record | None:
        """The record of ``key``."""
        ...

    def guard_get(self, key: str) -> Record | None:
        """The guard record of ``key``."""
        ...


class StoreLookups:
    """``Lookups`` over a real store, read-only; remembers what it read (for a sample)."""

    def __init__(self, store: ReadStore) -> None:
        self.store = store
        self.events: dict[str, Mapping[str, Any]] = {}
        """Every event record read, by key (``--record-sample`` writes them as parents)."""
        self.side_effects: dict[str, Mapping[str, Any]] = {}
        """Every guard record read, by key (``--record-sample`` writes them)."""

    def event(self, key: str) -> Mapping[str, Any] | None:
        """The store's record of ``key`` (``get``), remembered."""
        if key not in self.events:
            found = self.store.get(key)
            if found is None:
                return None
            self.events[key] = found
        return self.events[key]

    def side_effect(self, key: str) -> Mapping[str, Any] | None:
        """The store's guard record of ``key`` (``guard_get``), remembered."""
        if key not in self.side_effects:
            found = self.store.guard_get(key)
            if found is None:
                return None
            self.side_effects[key] = found
        return self.side_effects[key]


@dataclasses.dataclass
class MappingLookups:
    """``Lookups`` over records held in memory (a sample file's)."""

    events: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)
    side_effects: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)

    def event(self, key: str) -> Mapping[str, Any] | None:
        """The held record of ``key``, or None."""
        return self.events.get(key)

    def side_effect(self, key: str) -> Mapping[str, Any] | None:
        """The held guard record of ``key``, or None."""
        return self.side_effects.get(key)


class RefusingDatabase:
    """``context.db`` when no sandbox database can be made: every use raises."""

    def __getitem__(self, name: str) -> Any:
        """Refuse: verify never writes a handler's effects anywhere real."""
        raise SandboxRefused("context.db has no sandbox here: install eventbus[verify] "
                             "(mongomock) to verify handlers that use it")

    def __getattr__(self, name: str) -> Any:
        """Refuse, as ``__getitem__``."""
        return self[name]


class SandboxRefused(RuntimeError):
    """Raised when a handler asks the sandbox for something it never gives (a real write)."""


def sandbox_databases() -> Callable[[], Any]:
    """Makes an empty in-memory MongoDB per call (mongomock), or a refusing one without it."""
    try:
        import mongomock
    except ImportError:
        return RefusingDatabase
    client: Any = mongomock.MongoClient(tz_aware=True)

    def fresh() -> Any:
        client.drop_database("verify")
        return client["verify"]

    return fresh


class SandboxStore(MemoryEventStore):
    """A memory store that reads recorded records and never runs a side effect (module doc)."""

    def __init__(self, lookups: Lookups, *, clock: Any, databases: Callable[[], Any],
                 lease: timedelta = timedelta(seconds=60)) -> None:
        super().__init__(lease=lease, created_by=SANDBOX, clock=clock)
        self.lookups, self.databases = lookups, databases
        self._sandbox_db: Any = None
        self.stored_results: list[str] = []
        """Side effects answered from their stored result, in order."""
        self.stand_ins: list[str] = []
        """Side effects answered with a stand-in (nothing stored for them)."""
        self.partner_calls: list[str] = []
        """Partners a handler tried to call outside the guard (refused)."""

    @property
    def database(self) -> Any:
        """The handlers' database of the event being verified (empty when it began)."""
        return self._sandbox_db

    def begin(self) -> None:
        """Forget the last event: every record, guard, breaker, count and its database."""
        self.reset()
        self._sandbox_db = self.databases()
        self.stored_results, self.stand_ins, self.partner_calls = [], [], []

    def get(self, key: str) -> Record | None:
        """The recorded record of ``key`` when there is one, else the sandbox's own."""
        found = self.lookups.event(key)
        return dict(found) if found is not None else super().get(key)

    def produced(self, key: str) -> Record | None:
        """The record the sandbox itself wrote for ``key`` (what the current code did)."""
        return super().get(key)

    def guard_take(self, key: str, owner: str, now: datetime, lease: timedelta) -> Record | None:
        """Never None (which would run the effect): the stored SUCCESS, or a stand-in."""
        stored = self.lookups.side_effect(key)
        if stored is not None and stored.get("status") == "SUCCESS":
            self.stored_results.append(key)
            return dict(stored)
        self.stand_ins.append(key)
        return {"_id": key, "status": "SUCCESS", "result": dict(STAND_IN), "stand_in": True}



class SandboxPartnerStore(MemoryPartnerStore):
    """The sandbox's partners: every breaker held open, so a call outside the guard is
    refused, not made; each one asked for is counted in ``SandboxStore.partner_calls``."""

    def __init__(self, sandbox: SandboxStore) -> None:
        super().__init__(sandbox)
        self.sandbox = sandbox

    def breaker_get(self, name: str) -> Record | None:
        """A breaker held open by the sandbox (never a stored one)."""
        self.sandbox.partner_calls.append(name)
        held = forced(BreakerState(), self.now(), hold_open=True, by=SANDBOX,
                      why="verify never calls a partner")
        return held.to_document()
