"""The rebuild primitives in memory (``RebuildStore``): a mixin ``MemoryEventStore`` inherits.

The same rules as ``eventbus.rebuild.mongo`` through their Python mirrors
(``eventbus.rebuild.documents``), under the store's one lock.
"""

from __future__ import annotations

import copy
import threading
import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from eventbus.rebuild import documents as rebuilds
from eventbus.store.base import BatchClaim, Claim, Finish, Finished, Record


class MemoryRebuildMixin:
    """``rebuild_claim_many`` … ``rebuild_runs`` on ``MemoryEventStore``'s dicts."""

    _events: dict[str, Record]
    _lock: threading.RLock
    _lease: timedelta
    _rebuilds: dict[str, Record]
    _rebuild_plans: dict[str, list[Record]]

    if TYPE_CHECKING:  # provided by the store
        def now(self) -> datetime:
            """The store's clock (``MemoryEventStore.now``)."""

    def rebuild_claim_many(self, records: Mapping[str, Mapping[str, Any]], rebuild_id: str,
                           now: datetime) -> BatchClaim:
        """Lease every rebuildable key for ``rebuild_id`` (``RebuildStore.rebuild_claim_many``)."""
        owner, taken, others = uuid.uuid4().hex, {}, {}
        with self._lock:
            moment = self.now()
            for key in records:
                record = self._events.get(key)
                if rebuilds.rebuildable(record, rebuild_id, moment):
                    assert record is not None
                    record[rebuilds.LEASE] = rebuilds.rebuild_lease(owner, moment, self._lease)
                    taken[key] = Claim(int(record.get("attempts") or 0), owner,
                                       copy.deepcopy(record))
                elif record is not None:
                    others[key] = copy.deepcopy(record)
        return BatchClaim(taken, others)

    def rebuild_renew_many(self, owners: Mapping[str, str], now: datetime) -> set[str]:
        """Extend the rebuild leases still held on this store's clock; return those keys."""
        held = set()
        with self._lock:
            moment = self.now()
            for key, owner in owners.items():
                record = self._events.get(key)
                if rebuilds.rebuild_held(record, owner, moment):
                    assert record is not None
                    record[rebuilds.LEASE] = rebuilds.rebuild_lease(owner, moment, self._lease)
                    held.add(key)
        return held

    def rebuild_finish_many(self, finishes: Sequence[Finish], now: datetime) -> Finished:
        """Append each audit entry and new children under a live lease; the rest are lost."""
        lost = set()
        with self._lock:
            moment = self.now()
            for finish in finishes:
                record = self._events.get(finish.key)
                if not rebuilds.rebuild_held(record, finish.owner, moment):
                    if not finish.unclaim:
                        lost.add(finish.key)
                    continue
                assert record is not None
                entry = None if finish.unclaim else \
                    {**copy.deepcopy(dict(finish.audit or {})), "lease": finish.owner}
                rebuilds.rebuild_finished(record, entry, copy.deepcopy(list(finish.outbox)), now)
        return Finished(frozenset(lost))

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
            self._rebuild_plans[rebuild_id] = rebuilds.plan_pages(rebuild_id, list(keys))

    def rebuild_plan(self, rebuild_id: str) -> list[str] | None:
        """The stored plan of ``rebuild_id`` (``RebuildStore.rebuild_plan``), or None."""
        with self._lock:
            pages = self._rebuild_plans.get(rebuild_id)
            return None if pages is None else [key for page in pages for key in page["keys"]]
