"""A rebuild's claims on the event records, in memory (``RebuildStore``), for ``MemoryEventStore``.

The same rules as ``eventbus.store.mongo_replays`` through their Python mirrors
(``eventbus.store.documents.replays``), under the store's one lock.
"""

from __future__ import annotations

import copy
import threading
import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from eventbus.store.base import BatchClaim, Claim, Finish, Finished, Record
from eventbus.store.documents import replays as rebuilds


class MemoryReplayMixin:
    """``rebuild_claim_many``, ``rebuild_renew_many``, ``rebuild_finish_many`` in memory."""

    _events: dict[str, Record]
    _lock: threading.RLock
    _lease: timedelta

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
