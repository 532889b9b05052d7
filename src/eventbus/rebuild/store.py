"""A rebuild's own store: its run documents and frozen plans (``RunStore``).

``MongoRunStore`` (``eventbus.rebuild.mongo``: the rebuild collection) and
``MemoryRunStore`` (``eventbus.rebuild.memory``) implement it, beside the event
store whose clock they stamp with (``runs_beside``). A rebuild's claims on the
event records are the event store's (``eventbus.store.base.RebuildStore``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, cast

from eventbus.settings import Settings
from eventbus.store import on_mongodb
from eventbus.store.base import Clocked, Record

if TYPE_CHECKING:
    from eventbus.store.memory import MemoryEventStore


class RunStore(Clocked, Protocol):
    """What a rebuild keeps of itself: run documents (selection, checkpoint, counts), plans."""

    def rebuild_save(self, run: Mapping[str, Any]) -> None:
        """Store (insert or replace) the run document of rebuild ``run["rebuild_id"]``."""
        ...

    def rebuild_get(self, rebuild_id: str) -> Record | None:
        """Return the run document of ``rebuild_id``, or None."""
        ...

    def rebuild_runs(self, limit: int) -> list[Record]:
        """Return the ``limit`` newest run documents (``started`` descending)."""
        ...

    def rebuild_plan_save(self, rebuild_id: str, keys: Sequence[str]) -> None:
        """Store rebuild ``rebuild_id``'s plan (its keys in run order), replacing any before."""
        ...

    def rebuild_plan(self, rebuild_id: str) -> list[str] | None:
        """Return the plan ``rebuild_plan_save`` stored for ``rebuild_id``, or None."""
        ...


def runs_beside(events: Clocked, settings: Settings) -> RunStore:
    """Return the run store beside the event store ``events``: the same database.

    As ``eventbus.partners.store.store_beside``: a ``MongoEventStore`` (``on_mongodb``)
    gets a ``MongoRunStore`` on its database, any other store a ``MemoryRunStore`` in its
    memory database.
    """
    if on_mongodb(events):
        from eventbus.rebuild.mongo import MongoRunStore

        return MongoRunStore.beside(events, settings)
    from eventbus.rebuild.memory import MemoryRunStore

    return MemoryRunStore(cast("MemoryEventStore", events), settings.rebuild_collection)
