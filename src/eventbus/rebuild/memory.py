"""A rebuild's runs and plans in memory: ``MemoryRunStore``, beside a memory event store.

The same documents as ``eventbus.rebuild.mongo``, in the memory event store's
collections (``MemoryEventStore.memory_collection``), on its clock.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from eventbus.rebuild import documents as rebuilds
from eventbus.store.base import Record

if TYPE_CHECKING:
    from datetime import datetime

    from eventbus.store.memory import MemoryEventStore


class MemoryRunStore:
    """``RunStore`` in memory: runs and plans in ``events``' collection ``name``."""

    def __init__(self, events: MemoryEventStore, name: str = "rebuilds") -> None:
        runs, plans = events.memory_collection(name), events.memory_collection(f"{name}#plans")
        self._events, self._lock = events, runs.lock
        self._rebuilds, self._plans = runs.documents, plans.documents

    def now(self) -> datetime:
        """The event store's clock."""
        return self._events.now()

    def rebuild_save(self, run: Mapping[str, Any]) -> None:
        """Store the run document of ``run["rebuild_id"]``."""
        with self._lock:
            document = rebuilds.run_document(copy.deepcopy(dict(run)), self.now())
            self._rebuilds[document["_id"]] = document

    def rebuild_get(self, rebuild_id: str) -> Record | None:
        """Return a copy of the run document of ``rebuild_id``, or None."""
        with self._lock:
            return copy.deepcopy(self._rebuilds.get(rebuild_id))

    def rebuild_runs(self, limit: int) -> list[Record]:
        """Return the ``limit`` newest run documents."""
        with self._lock:
            runs = sorted(self._rebuilds.values(), key=lambda run: str(run.get("started", "")),
                          reverse=True)
            return copy.deepcopy(runs[:max(limit, 0)])

    def rebuild_plan_save(self, rebuild_id: str, keys: Sequence[str]) -> None:
        """Store the plan's pages (``RebuildStore.rebuild_plan_save``)."""
        with self._lock:
            self._plans[rebuild_id] = {"pages": rebuilds.plan_pages(rebuild_id, list(keys))}

    def rebuild_plan(self, rebuild_id: str) -> list[str] | None:
        """The stored plan of ``rebuild_id`` (``RebuildStore.rebuild_plan``), or None."""
        with self._lock:
            found = self._plans.get(rebuild_id)
            return None if found is None else [key for page in found["pages"]
                                                for key in page["keys"]]
