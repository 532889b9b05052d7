"""The rebuild primitives on MongoDB (``RebuildStore``): a mixin ``MongoEventStore`` inherits.

Round trips: ``rebuild_claim_many`` is one ``update_many`` (the rule's indexed
half in the filter, the lease's life on ``$$NOW`` in the pipeline); only when
fewer records were leased than asked, one ``find`` tells which. The finish is
one unordered ``bulk_write`` (a ``find`` only when fewer took than were
sent). Run documents live in their own collection (``Settings.rebuild_collection``).
"""

from __future__ import annotations

import copy
import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from pymongo import DESCENDING, UpdateOne

from eventbus.clock import Shift, lease_end
from eventbus.rebuild import documents as rebuilds
from eventbus.store.base import BatchClaim, Claim, Finish, Finished, Record
from eventbus.store.documents import bson_time
from eventbus.store.mongo_errors import unavailable


class MongoRebuildMixin:
    """``rebuild_claim_many`` … ``rebuild_runs`` on MongoDB."""

    _collection: Any
    _rebuilds: Any
    _lease: timedelta
    _shift: Shift

    if TYPE_CHECKING:  # provided by the store
        def now(self) -> datetime:
            """The store's clock (``MongoEventStore.now``)."""

    def rebuild_claim_many(self, records: Mapping[str, Mapping[str, Any]], rebuild_id: str,
                           now: datetime) -> BatchClaim:
        """Lease every rebuildable key (``RebuildStore.rebuild_claim_many``): one round trip
        when all are taken, two otherwise."""
        keys, owner = list(records), uuid.uuid4().hex
        if not keys:
            return BatchClaim({}, {})
        with unavailable("rebuild claim", "batch"):
            done = self._collection.update_many(
                rebuilds.rebuild_claim_filter(keys, rebuild_id),
                rebuilds.rebuild_claim_update(owner, self._lease, self._shift))
            if done.modified_count == len(keys):
                # Every key taken: the records as read, with the lease as this process
                # last read the server's clock (only the store's writes decide on it).
                lease = {"owner": owner, "until": lease_end(self.now(), self._lease)}
                return BatchClaim({key: _claim({**copy.deepcopy(dict(records[key])),
                                                rebuilds.LEASE: lease}, owner)
                                   for key in keys}, {})
            found = {str(record["idempotency_key"]): record for record in
                     self._collection.find({"idempotency_key": {"$in": keys}})}
        taken = {key: _claim(record, owner) for key, record in found.items()
                 if (record.get(rebuilds.LEASE) or {}).get("owner") == owner}
        return BatchClaim(taken, {key: record for key, record in found.items()
                                  if key not in taken})

    def rebuild_renew_many(self, owners: Mapping[str, str], now: datetime) -> set[str]:
        """Extend the rebuild leases still live on the server's clock; return those keys."""
        if not owners:
            return set()
        update = rebuilds.rebuild_renew_update(self._lease, self._shift)
        with unavailable("rebuild renew", "batch"):
            result = self._collection.bulk_write(
                [UpdateOne(rebuilds.rebuild_owner_filter(key, owner), update)
                 for key, owner in owners.items()], ordered=False)
            if result.modified_count == len(owners):
                return set(owners)
            found = self._collection.find({"idempotency_key": {"$in": list(owners)}},
                                          {"idempotency_key": 1, rebuilds.LEASE: 1})
            moment = self.now()
            return {str(r["idempotency_key"]) for r in found
                    if rebuilds.rebuild_held(r, owners.get(str(r["idempotency_key"]), ""),
                                             moment)}

    def rebuild_finish_many(self, finishes: Sequence[Finish], now: datetime) -> Finished:
        """Store every rebuilt record's audit entry and new children, fenced; one round trip."""
        if not finishes:
            return Finished()
        writes = [UpdateOne(rebuilds.rebuild_owner_filter(finish.key, finish.owner),
                            rebuilds.rebuild_finish_update(
                                None if finish.unclaim else
                                {**dict(finish.audit or {}), "lease": finish.owner},
                                list(finish.outbox), bson_time(now), self._shift))
                  for finish in finishes]
        with unavailable("rebuild finish", "batch"):
            result = self._collection.bulk_write(writes, ordered=False)
            if result.modified_count == len(writes):
                return Finished()
            # A finish that took left an audit entry naming its lease; a given-back
            # lease that lapsed needs nothing more (the lease is dead either way).
            found = {str(r["idempotency_key"]): r for r in self._collection.find(
                {"idempotency_key": {"$in": [f.key for f in finishes]}},
                {"idempotency_key": 1, "replays": 1})}
        lost = {f.key for f in finishes if not f.unclaim and not any(
            isinstance(entry, Mapping) and entry.get("lease") == f.owner
            for entry in (found.get(f.key) or {}).get("replays") or [])}
        return Finished(frozenset(lost))

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


def _claim(record: Mapping[str, Any], owner: str) -> Claim:
    return Claim(int(record.get("attempts") or 0), owner, record)
