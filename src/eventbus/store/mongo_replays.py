"""A rebuild's claims on the event records, on MongoDB (``RebuildStore``), for ``MongoEventStore``.

Round trips: ``rebuild_claim_many`` is one ``update_many`` (the rule's indexed
half in the filter, the lease's life on ``$$NOW`` in the pipeline); only when
fewer records were leased than asked, one ``find`` tells which. The finish is
one unordered ``bulk_write`` (a ``find`` only when fewer took than were
sent). The rebuild's runs and plans are its own store's (``eventbus.rebuild.mongo``).
"""

from __future__ import annotations

import copy
import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from pymongo import UpdateOne

from eventbus.clock import Shift, lease_end
from eventbus.store.base import BatchClaim, Claim, Finish, Finished
from eventbus.store.documents import bson_time
from eventbus.store.documents import replays as rebuilds
from eventbus.store.mongo_errors import unavailable


class MongoReplayMixin:
    """``rebuild_claim_many``, ``rebuild_renew_many``, ``rebuild_finish_many`` on MongoDB."""

    _collection: Any
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


def _claim(record: Mapping[str, Any], owner: str) -> Claim:
    return Claim(int(record.get("attempts") or 0), owner, record)
