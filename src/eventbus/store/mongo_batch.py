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
* ``claim_many(..., takes=)`` (ordered handlers): a batch inserts its new
  entities held in the same insert as its new events (an entity record in
  ``partner_events`` is one more document in that command); entities that
  exist get a conditional upsert (``documents.hold_filter``: free and not
  ahead), whose duplicate key says "not held here". One key and one entity
  (a push) are one ordered ``update`` command: the event's insert-only
  upsert, then the entity's hold; an event that exists stops the command
  before the hold and is claimed the usual way. The entity writes themselves
  are the cost that is left: on the local store an insert or an update of
  any document in the event collection (seven indexes) costs PostgreSQL
  about 110 / 190 µs, so a batch where every event is its own entity writes
  twice the documents of an unordered one.
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

from eventbus.clock import Shift
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
    _shift: Shift

    if TYPE_CHECKING:  # provided by MongoEventStore
        def now(self) -> datetime:
            """``MongoEventStore.now``: the server's clock as last read."""

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

    def claim_many(self, items: Mapping[str, Mapping[str, Any]], now: datetime,
                   takes: Mapping[str, EntityTake] | None = None) -> BatchClaim:
        """Claim every key at once (``EventStore.claim_many``): two round trips, one for one key.

        With ``takes``, the entities ride in the same commands: one key and one
        entity are one ``update`` command (``_claim_and_hold``); a batch inserts
        its new entities held beside its new events.
        """
        if len(items) == 1 and takes and len(takes) == 1:
            return self._claim_and_hold(*next(iter(items.items())), now,
                                        *next(iter(takes.items())))
        if len(items) == 1:
            return self._with_holds(claim_of_one(self.claim, *next(iter(items.items())), now),
                                    takes, now)
        # New records are inserted (the cheap write shape), so their lease is
        # the server's clock as this process last read it (``now()``); every
        # later decision on them is the server's own (``$$NOW``). The caller's
        # ``now`` stamps their audit fields, as a single claim's does.
        now, moment, owner = documents.bson_time(now), self.now(), uuid.uuid4().hex
        keys, entity_keys = list(items), list(takes or {})
        rules = {"owner": owner, "lease": self._lease, "created_by": self._created_by,
                 "retention": self._retention}
        inserts = [InsertOne(documents.new_record(key, items[key], now, **rules,  # type: ignore[arg-type]
                                                  lease_from=moment))
                   for key in keys]
        fresh = {key: self._held_record(key, take, owner, moment)
                 for key, take in (takes or {}).items()}
        inserts += [InsertOne(record) for record in fresh.values()]
        with unavailable("claim batch", "batch"):
            refused, existing = _insert(self._collection, inserts)
            held = {key for i, key in enumerate(entity_keys, len(keys))
                    if i not in refused and i not in existing}
            existing_events = [i for i in existing if i < len(keys)]
            upserts = [UpdateOne(documents.key_filter(keys[i]), documents.claim_pipeline(
                items[keys[i]], now, **rules, shift=self._shift), upsert=True)  # type: ignore[arg-type]
                for i in existing_events]
            _, again = _bulk(self._collection, upserts)
            refused |= {existing_events[i] for i in again}
            held |= self._hold(takes or {}, [k for k in entity_keys if k not in held], owner,
                               moment)
            found = self._collection.find({"idempotency_key": {"$in": keys}})
            records = {str(record["idempotency_key"]): record for record in found}
        claimed = _split(records, owner)
        batch = BatchClaim(claimed.taken, claimed.records,
                           frozenset(keys[index] for index in refused if index < len(keys)))
        if takes is None:
            return batch
        with unavailable("claim batch", "batch"):
            return self._kept(batch, takes, held, owner, moment, fresh)

    def _claim_and_hold(self, key: str, fields: Mapping[str, Any], now: datetime,
                        entity_key: str, take: EntityTake) -> BatchClaim:
        # One ``update`` command, ordered: the event's insert (an upsert whose
        # query only a new key fails to match), then the entity's hold. An
        # event that exists fails the first statement on the unique key, which
        # stops the command before the hold: it is claimed the usual way.
        # An insert: its lease runs from the server's clock as last read; the
        # caller's ``now`` stamps it, as a single claim's does.
        moment, owner = self.now(), uuid.uuid4().hex
        record = documents.new_record(key, fields, now, owner=owner, lease=self._lease,
                                      created_by=self._created_by, retention=self._retention,
                                      lease_from=moment)
        pinned = {"idempotency_key": key, "lease_owner": owner}
        claim = UpdateOne(pinned, {"$setOnInsert": {name: value for name, value in record.items()
                                                     if name not in pinned}}, upsert=True)
        with unavailable("claim", key):
            failed = _ordered_errors(self._collection,
                                     [claim, self._hold_one(entity_key, take, owner, moment)])
        if 0 in failed:  # the event exists (or its content is refused): the usual claim
            return self._with_holds(claim_of_one(self.claim, key, fields, now),
                                    {entity_key: take}, now)
        holds = {} if 1 in failed else {entity_key: self._held_record(entity_key, take, owner,
                                                                      moment)}
        return BatchClaim({key: Claim(attempt=1, owner=owner, record=record)}, {},
                          holds=EntityHolds(owner, holds))

    def _with_holds(self, batch: BatchClaim, takes: Mapping[str, EntityTake] | None,
                    now: datetime) -> BatchClaim:
        """``batch`` with no entity held: ``take_entities`` holds them after (the usual way)."""
        if takes is None:
            return batch
        return BatchClaim(batch.taken, batch.records, batch.refused,
                          EntityHolds(uuid.uuid4().hex, {}))

    def _held_record(self, entity_key: str, take: EntityTake, owner: str,
                     now: datetime) -> Record:
        return documents.held_record(entity_key, take.entity, owner, now, self._lease,
                                     take.keys, take.positions)

    def _hold(self, takes: Mapping[str, EntityTake], keys: Sequence[str], owner: str,
              now: datetime) -> set[str]:
        """Hold the existing entities ``keys`` that are free and not ahead: one bulk write."""
        if not keys:
            return set()
        failed = _ordered_errors(self._collection,
                                 [self._hold_one(key, takes[key], owner, now) for key in keys],
                                 ordered=False)
        return {key for index, key in enumerate(keys) if index not in failed}

    def _hold_one(self, entity_key: str, take: EntityTake, owner: str,
                  now: datetime) -> UpdateOne:
        """The conditional upsert that holds one entity (``documents.hold_filter``)."""
        return UpdateOne(documents.hold_filter(entity_key, min(take.positions), take.kind),
                         documents.hold_update(take.entity, owner, now, self._lease, take.keys,
                                               take.positions, self._shift), upsert=True)

    def _kept(self, batch: BatchClaim, takes: Mapping[str, EntityTake], held: set[str],
              owner: str, now: datetime, records: Mapping[str, Record]) -> BatchClaim:
        """Keep the holds of entities with a taken key; release the others (a rare round trip)."""
        used = {key for key in held if any(k in batch.taken for k in takes[key].keys)}
        if used != held:
            self._collection.bulk_write([UpdateOne(documents.holder_filter(key, owner),
                                                   documents.release_update(now, shift=self._shift))
                                         for key in sorted(held - used)], ordered=False)
        # What the insert wrote, or the hold set (the insert's own _id aside).
        holds = {key: {name: value for name, value in records[key].items() if name != "_id"}
                 for key in used}
        return BatchClaim(batch.taken, batch.records, batch.refused, EntityHolds(owner, holds))

    def finish_many(self, finishes: Sequence[Finish], now: datetime,
                    releases: Sequence[EntityRelease] = ()) -> Finished:
        """Store every outcome at once; say which leases were lost and which children refused."""
        if len(finishes) == 1 and not releases:
            return self._finish_one(finishes[0], now)
        if not finishes and not releases:
            return Finished()
        stamp = documents.epoch_ms(now)
        live = documents.live("$lease_until", self._shift)
        writes = [UpdateOne(documents.owner_filter(f.key, f.owner),
                            documents.guarded(documents.finish_update(f, now), live))
                  for f in finishes]
        writes += [UpdateOne(documents.holder_filter(r.entity_key, r.owner),
                             documents.release_update(now, r.position, r.applied_key, r.orphan,
                                                      self._shift, r.kind))
                   for r in releases]
        with unavailable("finish batch", "batch"):
            matched, refused = _bulk(self._collection, writes, modified=True)
            if refused:  # children the store cannot hold: FAILED for good, as for one event
                matched += self._refuse(finishes, refused, now)
            keys = frozenset(finishes[i].key for i in refused)
            if matched >= len(writes):
                return Finished(refused=keys)
            lost = self._not_finished(finishes, stamp)
            unreleased = self._not_finished_entities(releases, stamp)
            return Finished(frozenset(lost), keys - lost, frozenset(unreleased))

    def _not_finished_entities(self, releases: Sequence[EntityRelease], stamp: str) -> set[str]:
        if not releases:
            return set()
        keys = [release.entity_key for release in releases]
        found = {str(r["idempotency_key"]): r for r in self._collection.find(
            {"idempotency_key": {"$in": keys}}, {"idempotency_key": 1, "lastUpdatedTime": 1})}
        return {key for key in keys if found.get(key, {}).get("lastUpdatedTime") != stamp}

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
        """Extend the entity holds that still hold on the server's clock (one round trip);
        return those keys."""
        if not holders:
            return set()
        writes = [UpdateOne(documents.holder_filter(key, owner),
                            documents.hold_renewal(self._lease, self._shift))
                  for key, owner in holders.items()]
        with unavailable("renew entities", "batch"):
            if _bulk(self._collection, writes, modified=True)[0] == len(holders):
                return set(holders)
            found = self._collection.find({"idempotency_key": {"$in": list(holders)}},
                                          {"idempotency_key": 1, "holder": 1})
            moment = self.now()
            return {str(r["idempotency_key"]) for r in found
                    if documents.held_by(r, holders[str(r["idempotency_key"])], moment)}

    def take_entities(self, takes: Mapping[str, EntityTake], now: datetime) -> EntityHolds:
        """Hold each free entity for one new owner (``EventStore.take_entities``)."""
        now, owner = self.now(), uuid.uuid4().hex
        updates = {key: documents.take_pipeline(take.entity, owner, now, self._lease, take.keys,
                                                take.positions, self._shift)
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
        live = documents.live("$lease_until", self._shift)
        writes = [UpdateOne(documents.owner_filter(finishes[i].key, finishes[i].owner),
                            documents.guarded(documents.fail_update(now, error, retryable=False),
                                              live))
                  for i in sorted(refused)]
        return _bulk(self._collection, writes, modified=True)[0]

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
        update = documents.renew_update(self._lease, self._shift)
        by_owner: dict[str, list[str]] = {}
        for key, owner in owners.items():
            by_owner.setdefault(owner, []).append(key)
        writes = [UpdateMany({"idempotency_key": {"$in": keys}, "lease_owner": owner,
                              "event_status": documents.PROCESSING}, update)
                  for owner, keys in by_owner.items()]
        with unavailable("renew batch", "batch"):
            if _bulk(self._collection, writes, modified=True)[0] == len(owners):
                return set(owners)
            # Which ones took: those whose lease now ends after the store's now.
            held = self._collection.find({"idempotency_key": {"$in": list(owners)},
                                          "event_status": documents.PROCESSING,
                                          "lease_until": {"$gt": self.now()}},
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


def _ordered_errors(collection: Any, writes: list[Any], ordered: bool = True) -> set[int]:
    """Run ``writes`` in one command; return the indexes that failed on a duplicate key or
    on content (an ordered command stops at the first). Anything else raises."""
    try:
        collection.bulk_write(writes, ordered=ordered)
    except BulkWriteError as exc:
        errors = exc.details["writeErrors"]
        if any(e.get("code") not in (DUPLICATE_KEY, *CONTENT_ERROR_CODES) for e in errors):
            raise
        failed = {int(e["index"]) for e in errors}
        return failed | (set(range(min(failed) + 1, len(writes))) if ordered else set())
    return set()


def _bulk(collection: Any, writes: list[Any], modified: bool = False) -> tuple[int, set[int]]:
    """Run ``writes`` unordered; return how many matched (``modified``: changed, which is
    what a fenced write that did not take leaves unchanged) and which (by index) the store
    refused.

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
        return int(exc.details.get("nModified" if modified else "nMatched", 0)), refused
    return int(result.modified_count if modified else result.matched_count), set()


def _split(records: dict[str, Record], owner: str) -> BatchClaim:
    taken, others = {}, {}
    for key, record in records.items():
        if record.get("lease_owner") == owner and \
                record.get("event_status") == documents.PROCESSING:
            taken[key] = Claim(attempt=int(record.get("attempts") or 1), owner=owner,
                               record=record)
        else:
            others[key] = record
    return BatchClaim(taken, others)
