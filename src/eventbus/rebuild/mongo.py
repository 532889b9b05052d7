"""A rebuild's runs and plans on MongoDB: ``MongoRunStore``, beside a ``MongoEventStore``.

Run documents and plan pages share one collection (``Settings.rebuild_collection``,
in the events' database); run documents are stamped on the event store's clock.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from pymongo import DESCENDING
from pymongo.collection import Collection

from eventbus.clock import bson_time
from eventbus.rebuild import documents as rebuilds
from eventbus.settings import Settings
from eventbus.store.base import Clocked, Record
from eventbus.store.mongo_errors import unavailable

if TYPE_CHECKING:
    from eventbus.store.mongo import MongoEventStore


class MongoRunStore:
    """``RunStore`` on MongoDB: the run collection, on ``events``' clock."""

    def __init__(self, collection: Collection, events: Clocked) -> None:
        self._rebuilds, self._events = collection, events

    @classmethod
    def beside(cls, events: MongoEventStore, settings: Settings) -> MongoRunStore:
        """Return the run store on ``events``' database (``Settings.rebuild_collection``)."""
        return cls(events.database[settings.rebuild_collection], events)

    def now(self) -> datetime:
        """The event store's clock (the server's)."""
        return self._events.now()

    def rebuild_save(self, run: Mapping[str, Any]) -> None:
        """Store (replace or insert) the run document of ``run["rebuild_id"]``."""
        document = rebuilds.run_document(run, bson_time(self.now()))
        with unavailable("save rebuild", "rebuilds"):
            self._rebuilds.replace_one({"_id": document["_id"]}, document, upsert=True)

    def rebuild_get(self, rebuild_id: str) -> Record | None:
        """Return the run document of ``rebuild_id``, or None."""
        with unavailable("read rebuild", "rebuilds"):
            found: Record | None = self._rebuilds.find_one({"_id": rebuild_id})
        return found

    def rebuild_runs(self, limit: int) -> list[Record]:
        """Return the ``limit`` newest run documents."""
        with unavailable("list rebuilds", "rebuilds"):
            return list(self._rebuilds.find(rebuilds.RUNS).sort("started", DESCENDING)
                        .limit(max(limit, 1)))

    def rebuild_plan_save(self, rebuild_id: str, keys: Sequence[str]) -> None:
        """Replace the plan's pages: one delete, one insert (``RebuildStore.rebuild_plan_save``)."""
        pages = rebuilds.plan_pages(rebuild_id, list(keys))
        with unavailable("save rebuild plan", "rebuilds"):
            self._rebuilds.delete_many({rebuilds.PLAN_OF: rebuild_id})
            self._rebuilds.insert_many(pages, ordered=True)

    def rebuild_plan(self, rebuild_id: str) -> list[str] | None:
        """The stored plan of ``rebuild_id``, its pages in order (``RebuildStore.rebuild_plan``)."""
        with unavailable("read rebuild plan", "rebuilds"):
            pages = list(self._rebuilds.find({rebuilds.PLAN_OF: rebuild_id}).sort("page", 1))
        return [str(key) for page in pages for key in page.get("keys") or []] if pages else None
