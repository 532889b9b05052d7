"""The batch primitives (``claim_many``, ``finish_many``, ``renew_many``) in memory.

A mixin ``MemoryEventStore`` inherits: each runs the single-key rule for every
key under the store's one lock, so a batch is as atomic here as one key.
"""

from __future__ import annotations

import copy
import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from eventbus.clock import lease_end
from eventbus.model.errors import AlreadyExists, Conflict, ContentRejected
from eventbus.store import documents
from eventbus.store.base import (
    BatchClaim,
    Claim,
    EntityHolds,
    EntityRelease,
    EntityTake,
    Finish,
    Finished,
    Record,
    claim_of_one,
)


class MemoryBatchMixin:
    """Batches on ``MemoryEventStore``'s dict, through its single-key primitives."""

    _lock: Any
    _events: dict[str, Record]

    if TYPE_CHECKING:  # provided by MemoryEventStore
        def claim(self, key: str, fields: Mapping[str, Any], now: datetime) -> Claim:
            """``MemoryEventStore.claim``."""

        def _claim(self, key: str, fields: Mapping[str, Any], now: datetime,
                   owner: str) -> Claim:
            """``MemoryEventStore._claim``."""

        def succeed(self, key: str, owner: str, now: datetime,
                    outbox: Sequence[Mapping[str, Any]] = ()) -> bool:
            """``MemoryEventStore.succeed``."""

        def fail(self, key: str, owner: str, now: datetime, error: Mapping[str, Any], *,
                 retryable: bool, redrive_at: datetime | None = None) -> bool:
            """``MemoryEventStore.fail``."""

        def renew(self, key: str, owner: str, now: datetime) -> bool:
            """``MemoryEventStore.renew``."""

        def _held(self, key: str, owner: str) -> Record | None:
            """``MemoryEventStore._held``."""

        def _finish(self, key: str, owner: str, fields: Mapping[str, Any],
                    parked: bool = False) -> bool:
            """``MemoryEventStore._finish``."""

        def now(self) -> datetime:
            """``MemoryEventStore.now``: the store's clock."""

        _lease: timedelta

    def claim_many(self, items: Mapping[str, Mapping[str, Any]], now: datetime,
                   takes: Mapping[str, EntityTake] | None = None) -> BatchClaim:
        """Claim every key at once, one owner for the batch (``EventStore.claim_many``).

        ``takes``: each entity with a taken key is then held if a hold may hold
        it (``documents.holdable``: new, or free and not ahead), as on MongoDB.
        """
        batch = self._claim_events(items, now)
        if takes is None:
            return batch
        owner, held = uuid.uuid4().hex, {}
        with self._lock:
            now = self.now()
            for key, take in takes.items():
                record = self._events.get(key)
                if any(k in batch.taken for k in take.keys) and \
                        documents.holdable(record, min(take.positions), take.kind):
                    fields = documents.held_record(key, take.entity, owner, now, self._lease,
                                                   take.keys, take.positions)
                    self._events.setdefault(key, {}).update(fields)
                    held[key] = copy.deepcopy(fields)
        return BatchClaim(batch.taken, batch.records, batch.refused, EntityHolds(owner, held))

    def _claim_events(self, items: Mapping[str, Mapping[str, Any]],
                      now: datetime) -> BatchClaim:
        if len(items) == 1:
            return claim_of_one(self.claim, *next(iter(items.items())), now)
        owner, taken, records, refused = uuid.uuid4().hex, {}, {}, set()
        with self._lock:
            for key, fields in items.items():
                try:
                    taken[key] = self._claim(key, fields, now, owner)
                except (AlreadyExists, Conflict):
                    records[key] = copy.deepcopy(self._events[key])
                except ContentRejected:
                    refused.add(key)
        return BatchClaim(taken, records, frozenset(refused))

    def finish_many(self, finishes: Sequence[Finish], now: datetime,
                    releases: Sequence[EntityRelease] = ()) -> Finished:
        """Store every outcome, free the entities; say which leases were lost, children refused,
        and which releases did not take (their hold had lapsed)."""
        lost, refused, unreleased = set(), set(), set()
        with self._lock:
            for release in releases:
                if not self._release(release, now):
                    unreleased.add(release.entity_key)
            for finish in finishes:
                try:
                    stored = self._finish_one(finish, now)
                except ContentRejected as exc:
                    refused.add(finish.key)
                    stored = self.fail(finish.key, finish.owner, now,
                                       documents.error_document(exc, "content"), retryable=False)
                if not stored:
                    lost.add(finish.key)
        return Finished(frozenset(lost), frozenset(refused - lost), frozenset(unreleased))

    def _finish_one(self, finish: Finish, now: datetime) -> bool:
        if finish.unclaim:
            return self._unclaim(finish.key, finish.owner, now, finish.redrive_at)
        if finish.error is None and finish.extra:
            update = documents.succeed_update(now, finish.outbox, finish.extra)
            return self._finish(finish.key, finish.owner, update["$set"])
        if finish.error is None:
            return self.succeed(finish.key, finish.owner, now, finish.outbox)
        fields = {**dict(finish.extra or {}),
                  **documents.fail_fields(now, finish.error, retryable=finish.retryable,
                                          redrive_at=finish.redrive_at,
                                          not_before=finish.not_before)}
        return self._finish(finish.key, finish.owner, fields, parked=finish.parked)

    def _unclaim(self, key: str, owner: str, now: datetime,
                 redrive_at: datetime | None) -> bool:
        record = self._held(key, owner)
        if record is None:
            return False
        record.update(documents.unclaim_update(now, redrive_at)["$set"],
                      attempts=int(record.get("attempts") or 1) - 1)
        record.pop("lease_until", None)
        record.pop("lease_owner", None)
        return True

    def renew_entities(self, holders: Mapping[str, str], now: datetime) -> set[str]:
        """Extend the entity holds that still hold on this store's clock; return those keys."""
        held = set()
        with self._lock:
            moment = self.now()
            for key, owner in holders.items():
                record = self._events.get(key)
                if documents.held_by(record, owner, moment):
                    assert record is not None
                    record["holder"]["until"] = lease_end(moment, self._lease)
                    held.add(key)
        return held

    def take_entities(self, takes: Mapping[str, EntityTake], now: datetime) -> EntityHolds:
        """Hold each free entity for one new owner (``EventStore.take_entities``)."""
        owner, found = uuid.uuid4().hex, {}
        with self._lock:
            moment = self.now()
            for key, take in takes.items():
                record = self._events.setdefault(key, {"idempotency_key": key})
                if documents.entity_free(record, moment):
                    record.update(documents.taken_fields(record, take.entity, owner, moment,
                                                         self._lease, take.keys,
                                                         take.positions))
                found[key] = copy.deepcopy(record)
        return EntityHolds(owner, found)

    def _release(self, release: EntityRelease, now: datetime) -> bool:
        # Fenced: only while this owner's hold holds on the store's clock.
        record = self._events.get(release.entity_key)
        if record is None or not documents.held_by(record, release.owner, self.now()):
            return False
        documents.released(record, now, release.position, release.applied_key, release.orphan,
                           release.kind)
        return True

    def renew_many(self, owners: Mapping[str, str], now: datetime) -> set[str]:
        """Extend every lease still held; return those keys."""
        with self._lock:
            return {key for key, owner in owners.items() if self.renew(key, owner, now)}
