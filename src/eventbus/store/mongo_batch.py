"""The batch primitives on MongoDB: a mixin ``MongoEventStore`` inherits.

Write shapes (measured in ``bench/pull.py``; on the local store the write
shape, not the round trip, sets the ceiling). A batch of one key (a push)
is the single-key primitive itself, ``claim`` then ``succeed`` or ``fail``:
one round trip each, as before batches existed.

* ``claim_many``: one unordered insert of every key as a new record
  (``documents.new_record``), all under one batch owner; the keys that exist
  already (duplicate key) then get the claim's own update pipeline as an
  upsert (the rules stay in one place, ``documents.claim_pipeline``); then one
  ``find`` of the keys: a record carrying the batch's owner was taken by this
  batch, any other is a duplicate, a conflict or held elsewhere. Two round
  trips for a batch of new events, three when some keys exist. Measured with
  raw pymongo on the local store, batches of 100 new events (2026-11-25,
  medians of 3): insert + find + finish 990 events/s, pipeline upserts + find
  + finish 583: the pipeline costs the engine more per document, and the
  client builds and encodes a much larger command.
* ``finish_many``: one unordered ``bulk_write`` of the owner-checked finishes.
  When fewer matched than were sent (a lease was lost), one ``find`` tells
  which: a record finished by this call carries this call's stamp. Children
  the store refuses leave their parent FAILED for good (a second write).
* ``renew_many``: one ``update_many`` over the keys with the batch's owner,
  and a ``find`` only when fewer were held than asked.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from pymongo import InsertOne, ReturnDocument, UpdateMany, UpdateOne
from pymongo.errors import BulkWriteError

from eventbus.model.errors import ContentRejected
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
from eventbus.store.mongo_errors import unavailable

DUPLICATE_KEY = 11000
CONTENT_ERROR_CODES = documents.CONTENT_ERROR_CODES


class MongoBatchMixin:
    """``claim_many``, ``finish_many`` and ``renew_many`` on MongoDB."""

    _collection: Any
    _created_by: str
    _retention: timedelta
    _lease: timedelta

    if TYPE_CHECKING:  # provided by MongoEventStore
        def claim(self, key: str, fields: Mapping[str, Any], now: datetime) -> Claim:
            """``MongoEventStore.claim``."""

        def succeed(self, key: str, owner: str, now: datetime,
                    outbox: Sequence[Mapping[str, Any]] = ()) -> bool:
            """``MongoEventStore.succeed``."""

        def fail(self, key: str, owner: str, now: datetime, error: Mapping[str, Any], *,
                 retryable: bool, redrive_at: datetime | None = None) -> bool:
            """``MongoEventStore.fail``."""

        def _finish(self, key: str, owner: str, update: Mapping[str, Any], action: str) -> bool:
            """``MongoEventStore._finish``: one owner-checked update."""

    def claim_many(self, items: Mapping[str, Mapping[str, Any]], now: datetime) -> BatchClaim:
        """Claim every key at once (``EventStore.claim_many``): two round trips, one for one key."""
        if len(items) == 1:
            return claim_of_one(self.claim, *next(iter(items.items())), now)
        now, owner = documents.bson_time(now), uuid.uuid4().hex
        keys = list(items)
        rules = {"owner": owner, "lease": self._lease, "created_by": self._created_by,
                 "retention": self._retention}
        inserts = [InsertOne(documents.new_record(key, items[key], now, **rules))  # type: ignore[arg-type]
                   for key in keys]
        with unavailable("claim batch", "batch"):
            refused, existing = _insert(self._collection, inserts)
            upserts = [UpdateOne(documents.key_filter(keys[i]), documents.claim_pipeline(
                items[keys[i]], now, **rules), upsert=True)  # type: ignore[arg-type]
                for i in existing]
            _, again = _bulk(self._collection, upserts)
            refused |= {existing[i] for i in again}
            found = self._collection.find({"idempotency_key": {"$in": keys}})
            records = {str(record["idempotency_key"]): record for record in found}
        claimed = _split(records, owner)
        return BatchClaim(claimed.taken, claimed.records,
                          frozenset(keys[index] for index in refused))

    def finish_many(self, finishes: Sequence[Finish], now: datetime,
                    releases: Sequence[EntityRelease] = ()) -> Finished:
        """Store every outcome at once; say which leases were lost and which children refused."""
        if len(finishes) == 1 and not releases:
            return self._finish_one(finishes[0], now)
        if not finishes and not releases:
            return Finished()
        stamp = documents.epoch_ms(now)
        writes = [UpdateOne(documents.owner_filter(f.key, f.owner), documents.finish_update(f, now))
                  for f in finishes]
        writes += [UpdateOne(documents.holder_filter(r.entity_key, r.owner),
                             documents.release_update(now, r.position, r.applied_key))
                   for r in releases]
        with unavailable("finish batch", "batch"):
            matched, refused = _bulk(self._collection, writes)
            if refused:  # children the store cannot hold: FAILED for good, as for one event
                matched += self._refuse(finishes, refused, now)
            keys = frozenset(finishes[i].key for i in refused)
            if matched >= len(writes):
                return Finished(refused=keys)
            lost = self._not_finished(finishes, stamp)
            return Finished(frozenset(lost), keys - lost)

    def _finish_one(self, finish: Finish, now: datetime) -> Finished:
        try:
            stored = self._finish(finish.key, finish.owner, documents.finish_update(finish, now),
                                  "finish")
        except ContentRejected as exc:  # the children: FAILED for good instead
            stored = self.fail(finish.key, finish.owner, now,
                               documents.error_document(exc, "content"), retryable=False)
            return Finished(refused=frozenset({finish.key}) if stored else frozenset(),
                            lost=frozenset() if stored else frozenset({finish.key}))
        return Finished(lost=frozenset() if stored else frozenset({finish.key}))

    def renew_entities(self, holders: Mapping[str, str], now: datetime) -> set[str]:
        """Extend the entity holds still held (one round trip), and return those keys."""
        if not holders:
            return set()
        until = documents.bson_time(documents.bson_time(now) + self._lease)
        writes = [UpdateOne(documents.holder_filter(key, owner), {"$set": {"holder.until": until}})
                  for key, owner in holders.items()]
        with unavailable("renew entities", "batch"):
            if _bulk(self._collection, writes)[0] == len(holders):
                return set(holders)
            found = self._collection.find({"idempotency_key": {"$in": list(holders)}},
                                          {"idempotency_key": 1, "holder": 1})
            return {str(r["idempotency_key"]) for r in found
                    if (r.get("holder") or {}).get("owner") == holders[str(r["idempotency_key"])]}

    def take_entities(self, takes: Mapping[str, EntityTake], now: datetime) -> EntityHolds:
        """Hold each free entity for one new owner (``EventStore.take_entities``)."""
        now, owner = documents.bson_time(now), uuid.uuid4().hex
        updates = {key: documents.take_pipeline(take.entity, owner, now, self._lease, take.keys,
                                                take.positions)
                   for key, take in takes.items()}  # the rule for entities that exist
        with unavailable("take entities", "batch"):
            if len(updates) == 1:
                ((key, update),) = updates.items()
                found = self._collection.find_one_and_update(
                    documents.key_filter(key), update, upsert=True,
                    return_document=ReturnDocument.AFTER)
                return EntityHolds(owner, {key: found})
            # As claim_many: new entities are inserted held (the cheaper write
            # shape); only the ones that exist get the take's pipeline.
            keys = list(takes)
            _, existing = _insert(self._collection, [InsertOne(
                {"idempotency_key": key, **documents.taken_fields(
                    None, takes[key].entity, owner, now, self._lease, takes[key].keys,
                    takes[key].positions)}) for key in keys])
            _bulk(self._collection, [UpdateOne(documents.key_filter(keys[i]), updates[keys[i]],
                                               upsert=True) for i in existing])
            found_all = self._collection.find({"idempotency_key": {"$in": list(updates)}})
            return EntityHolds(owner, {str(r["idempotency_key"]): r for r in found_all})

    def _refuse(self, finishes: Sequence[Finish], refused: set[int], now: datetime) -> int:
        error = documents.error_document(
            ContentRejected("finish: the store refused the content (the children)"), "content")
        writes = [UpdateOne(documents.owner_filter(finishes[i].key, finishes[i].owner),
                            documents.fail_update(now, error, retryable=False))
                  for i in sorted(refused)]
        return _bulk(self._collection, writes)[0]

    def _not_finished(self, finishes: Sequence[Finish], stamp: str) -> set[str]:
        keys = [finish.key for finish in finishes]
        found = {str(r["idempotency_key"]): r for r in self._collection.find(
            {"idempotency_key": {"$in": keys}},
            {"idempotency_key": 1, "lastUpdatedTime": 1, "lease_owner": 1})}
        return {key for key in keys if found.get(key, {}).get("lastUpdatedTime") != stamp
                or "lease_owner" in found.get(key, {})}

    def renew_many(self, owners: Mapping[str, str], now: datetime) -> set[str]:
        """Extend every lease still held at once; return those keys."""
        if not owners:
            return set()
        update = documents.renew_update(now, self._lease)
        by_owner: dict[str, list[str]] = {}
        for key, owner in owners.items():
            by_owner.setdefault(owner, []).append(key)
        writes = [UpdateMany({"idempotency_key": {"$in": keys}, "lease_owner": owner,
                              "event_status": documents.PROCESSING}, update)
                  for owner, keys in by_owner.items()]
        with unavailable("renew batch", "batch"):
            if _bulk(self._collection, writes)[0] == len(owners):
                return set(owners)
            held = self._collection.find({"idempotency_key": {"$in": list(owners)},
                                          "event_status": documents.PROCESSING},
                                         {"idempotency_key": 1, "lease_owner": 1})
            return {str(r["idempotency_key"]) for r in held
                    if owners.get(str(r["idempotency_key"])) == r.get("lease_owner")}


def _insert(collection: Any, writes: list[Any]) -> tuple[set[int], list[int]]:
    """Insert unordered; return the indexes the store refused for content, and those that exist."""
    if not writes:
        return set(), []
    try:
        collection.bulk_write(writes, ordered=False)
    except BulkWriteError as exc:
        errors = exc.details["writeErrors"]
        refused = {int(e["index"]) for e in errors if e.get("code") in CONTENT_ERROR_CODES}
        existing = sorted(int(e["index"]) for e in errors if e.get("code") == DUPLICATE_KEY)
        if len(refused) + len(existing) != len(errors):
            raise
        return refused, existing
    return set(), []


def _bulk(collection: Any, writes: list[Any]) -> tuple[int, set[int]]:
    """Run ``writes`` unordered; return how many matched and which (by index) the store refused.

    A lost upsert race (two workers inserting one new key) is not an error: the
    read that follows says who took the key. Content the store refuses is
    reported by index; anything else raises.
    """
    if not writes:
        return 0, set()
    try:
        result = collection.bulk_write(writes, ordered=False)
    except BulkWriteError as exc:
        errors = exc.details["writeErrors"]
        refused = {int(e["index"]) for e in errors if e.get("code") in CONTENT_ERROR_CODES}
        if any(e.get("code") != DUPLICATE_KEY and int(e["index"]) not in refused
               for e in errors):
            raise
        return int(exc.details.get("nMatched", 0)), refused
    return int(result.matched_count), set()


def _split(records: dict[str, Record], owner: str) -> BatchClaim:
    taken, others = {}, {}
    for key, record in records.items():
        if record.get("lease_owner") == owner and \
                record.get("event_status") == documents.PROCESSING:
            taken[key] = Claim(attempt=int(record.get("attempts") or 1), owner=owner,
                               previous=record)
        else:
            others[key] = record
    return BatchClaim(taken, others)
