"""The MongoDB implementation of the store protocol (``eventbus.store.base``).

Plain pymongo behind ``MONGODB_URI``: any MongoDB works (Atlas, a replica
set, a local ``mongod``, the project's local DocumentDB). Documents, filters
and updates are built by ``eventbus.store.documents``; this module only
sends them. Every pymongo failure becomes ``StoreUnavailable``, transient,
with the original as ``__cause__``.

Round trips: a new event costs two (``claim`` then ``succeed`` or ``fail``);
a duplicate of a finished event costs one (``claim`` raising ``AlreadyExists``).
A store built with ``count_round_trips=True`` counts its own round trips
(``round_trips``) on the client it made; off by default, because a pymongo
command listener makes every command publish two events, which costs a push
about a tenth of the framework's CPU.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection as Collection_
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from pymongo import ASCENDING, DESCENDING, IndexModel, MongoClient, ReturnDocument
from pymongo.collection import Collection
from pymongo.database import Database
from pymongo.errors import DuplicateKeyError

from eventbus.clock import ServerClock, Shift
from eventbus.model.errors import (
    AlreadyExists,
    Conflict,
    LeaseHeld,
)
from eventbus.settings import Settings
from eventbus.store import documents
from eventbus.store.base import Claim, OutboxEntry, Record
from eventbus.store.documents import parked as parking
from eventbus.store.mongo_batch import MongoBatchMixin
from eventbus.store.mongo_errors import unavailable as _unavailable
from eventbus.store.mongo_ops import MongoOperatorMixin
from eventbus.store.mongo_replays import MongoReplayMixin
from eventbus.store.roundtrips import RoundTrips


def _index(*keys: tuple[str, int], **options: Any) -> IndexModel:
    # Named as MongoDB names them by default, so indexes created from the
    # seed's createIndex() calls are recognised instead of conflicting.
    name = "_".join(f"{field}_{direction}" for field, direction in keys)
    return IndexModel(list(keys), name=name, **options)


INDEXES = (
    _index(("entity_metadata.partnerId", ASCENDING), ("created", DESCENDING)),
    _index(("event_status", ASCENDING), ("event_type", ASCENDING)),
    _index(("expire_at", ASCENDING), expireAfterSeconds=0),
    _index(("entity_metadata.entity_id", ASCENDING), ("entity_metadata.entity_type", ASCENDING)),
    _index(("idempotency_key", ASCENDING), unique=True),
    _index(("outbox.status", ASCENDING)),
    _index(("redrive_at", ASCENDING)),
)
"""The collection's indexes: seed 002's four, the unique key, the outbox and redrive sweeps."""
OUTBOX_INDEX = "outbox.status_1"
"""The outbox sweep's index, one of ``INDEXES``."""


class MongoEventStore(MongoBatchMixin, MongoOperatorMixin, MongoReplayMixin):
    """The storage primitives of the idempotency state machine, on one collection."""

    def __init__(self, collection: Collection, *, created_by: str, retention: timedelta,
                 lease: timedelta, guard_collection: str = "side_effects",
                 round_trips: RoundTrips | None = None,
                 shift: Shift | None = None) -> None:
        self._collection = collection
        self._shift = shift or Shift()
        self._clock = ServerClock(self._server_time, shift=self._shift)
        self._guards: Collection = collection.database[guard_collection]
        self._created_by = created_by
        self._retention = retention
        self._lease = lease
        self._round_trips = round_trips

    @classmethod
    def from_settings(cls, settings: Settings, client: MongoClient | None = None, *,
                      count_round_trips: bool = False,
                      shift: Shift | None = None) -> MongoEventStore:
        """Build the store from ``settings``, with a new client unless one is given.

        A new client is tz-aware and times out after ``store_timeout_ms``; with
        ``count_round_trips`` it also reports every command to the store's own
        ``round_trips`` (tests and benches). A given client is used as it is.
        ``shift`` moves the store's clock (tests; see ``eventbus.clock.Shift``).
        """
        counter = RoundTrips() if count_round_trips else None
        with _unavailable("connect to", settings.mongodb_db):
            client = client if client is not None else _client(settings, counter)
        collection = client[settings.mongodb_db][settings.collection]
        return cls(collection, created_by=settings.service,
                   retention=timedelta(days=settings.retention_days),
                   lease=timedelta(seconds=settings.lease_seconds),
                   guard_collection=settings.guard_collection, round_trips=counter,
                   shift=shift)

    @property
    def round_trips(self) -> RoundTrips:
        """The counter of this store's commands; only a store built to count has one."""
        if self._round_trips is None:
            raise RuntimeError("this store counts no round trips: build it with "
                               "MongoEventStore.from_settings(..., count_round_trips=True)")
        return self._round_trips

    @property
    def database(self) -> Database:
        """The collection's database, for handlers' own effects."""
        return self._collection.database

    @property
    def collection(self) -> Collection:
        """The event collection itself: for this package and tests that inspect documents."""
        return self._collection

    def close(self) -> None:
        """Close the store's client."""
        self._collection.database.client.close()

    @property
    def lease(self) -> timedelta:
        """How long a claim holds its record before another worker may take it."""
        return self._lease

    def now(self) -> datetime:
        """The store's clock: the server's, as last read, plus monotonic time since."""
        return self._clock()

    @property
    def shift(self) -> Shift:
        """How far this store's clock is moved (tests), for the stores beside it to share."""
        return self._shift

    def parked_counts(self) -> dict[str, int]:
        """Return partner → number of parked events."""
        pipeline = [{"$match": parking.parked_filter()},
                    {"$group": {"_id": "$error.partner", "n": {"$sum": 1}}}]
        with _unavailable("count", "parked"):
            rows = list(self._collection.aggregate(pipeline))
        return {str(row["_id"]): int(row["n"]) for row in rows}

    def unpark(self, name: str, now: datetime) -> int:
        """Make every event parked for ``name`` due for the redrive now; return how many."""
        with _unavailable("unpark", name):
            done = self._collection.update_many({**parking.parked_filter(), "error.partner": name},
                                                {"$set": {"redrive_at": documents.bson_time(now)}})
        return int(done.modified_count)

    def _server_time(self) -> datetime:
        with _unavailable("read the clock of", self._collection.name):
            moment = self._collection.database.client.admin.command("hello")["localTime"]
        return documents.bson_time(moment)

    def ensure_indexes(self) -> None:
        """Create the collection's indexes; a no-op when they already exist."""
        with _unavailable("create indexes on", self._collection.name):
            self._collection.create_indexes(list(INDEXES))

    def claim(self, key: str, fields: Mapping[str, Any], now: datetime) -> Claim:
        """Take the lease on ``key`` in one round trip, or raise ``AlreadyExists``.

        A record is taken when it is new, PENDING, FAILED and retryable, or
        PROCESSING under a lease that ran out on the server's clock (``$$NOW``).
        ``fields`` (``documents.event_fields``) are stored only when the record
        is new. The server returns the record as the claim left it: taken when
        its owner is this claim's. Otherwise ``AlreadyExists`` carries the
        record, which the claim left unchanged.
        """
        owner = uuid.uuid4().hex
        update = documents.claim_pipeline(fields, documents.bson_time(now), owner=owner,
                                        lease=self._lease, created_by=self._created_by,
                                        retention=self._retention, shift=self._shift)
        record = self._take(key, update)
        if record.get("lease_owner") == owner:
            return Claim(attempt=int(record.get("attempts") or 1), owner=owner, record=record)
        if documents.conflicts(record, str(fields.get("payload_fingerprint") or "")):
            raise Conflict(record)
        raise AlreadyExists(record)

    def _take(self, key: str, update: list[dict[str, Any]]) -> Record:
        with _unavailable("claim", key):
            try:
                return self._find_one_and_update(key, update)
            except DuplicateKeyError:
                # Two upserts of a new key raced and the other one inserted;
                # the document exists now, so a second try reads it.
                return self._find_one_and_update(key, update)

    def _find_one_and_update(self, key: str, update: list[dict[str, Any]]) -> Record:
        record: Record = self._collection.find_one_and_update(
            documents.key_filter(key), update, upsert=True,
            return_document=ReturnDocument.AFTER)
        return record

    def succeed(self, key: str, owner: str, now: datetime,
                outbox: Sequence[Mapping[str, Any]] = ()) -> bool:
        """Mark ``key`` SUCCESS with its children; False if ``owner`` lost the lease."""
        return self._finish(key, owner, documents.succeed_update(now, outbox), "succeed")

    def fail(self, key: str, owner: str, now: datetime, error: Mapping[str, Any], *,
             retryable: bool, redrive_at: datetime | None = None) -> bool:
        """Mark ``key`` FAILED with ``error``; False if ``owner`` lost the lease."""
        update = documents.fail_update(now, error, retryable=retryable, redrive_at=redrive_at)
        return self._finish(key, owner, update, "fail")

    def redrivable(self, limit: int, exclude: Collection_[str] = ()) -> list[Record]:
        """Return up to ``limit`` records due for a redrive on the server's clock, longest due
        first."""
        with _unavailable("find redrivable", "events"):
            cursor = self._collection.find(documents.redrive_filter(self.now(), self._lease,
                                                                    exclude))
            return list(cursor.sort("redrive_at", ASCENDING).limit(limit))

    def mark_redriven(self, key: str, redrives: int, next_at: datetime) -> bool:
        """Count a redrive of ``key``; False when another sweeper counted it first, or a live
        worker holds it."""
        with _unavailable("mark redriven", key):
            done = self._collection.update_one(
                documents.redriven_filter(key, redrives),
                documents.redriven_update(next_at, self._lease, self._shift))
        return done.modified_count == 1

    def abandon(self, key: str, now: datetime, error: Mapping[str, Any]) -> bool:
        """Give ``key`` up for good (FAILED, not retryable); False unless retryable, PENDING or
        stale on the server's clock."""
        with _unavailable("abandon", key):
            done = self._collection.update_one(
                documents.abandon_filter(key),
                documents.abandon_update(now, error, self._lease, self._shift))
        return done.modified_count == 1

    def _finish(self, key: str, owner: str, update: Mapping[str, Any] | list[Any],
                action: str) -> bool:
        # Fenced: ``owner``'s, and its lease has not run out on the server's clock.
        fenced = update if isinstance(update, list) else \
            documents.guarded(update, documents.live("$lease_until", self._shift))
        with _unavailable(action, key):
            result = self._collection.update_one(documents.owner_filter(key, owner), fenced)
        return result.modified_count == 1

    def renew(self, key: str, owner: str, now: datetime) -> bool:
        """Extend ``owner``'s lease on ``key`` by a lease from the server's now, while it holds."""
        return self._finish(key, owner, documents.renew_update(self._lease, self._shift),
                            "renew")

    def reject(self, key: str, fields: Mapping[str, Any], now: datetime,
               error: Mapping[str, Any], raw_payload: str | None = None) -> bool:
        """Store ``key`` as FAILED for good unless it exists; True if this call inserted it.

        The same refusal again (the same bytes, ``documents.reject_upsert``)
        counts one delivery more; any other existing record is never changed.
        """
        selector, update = documents.reject_upsert(key, fields, now, error,
                                                   created_by=self._created_by,
                                                   retention=self._retention,
                                                   raw_payload=raw_payload)
        with _unavailable("reject", key):
            try:
                result = self._collection.update_one(selector, update, upsert=True)
            except DuplicateKeyError:
                # The key has a record the filter does not match (another payload, a
                # claimed event), or a concurrent upsert inserted it first: unchanged.
                return False
        return result.upserted_id is not None

    def get(self, key: str) -> Record | None:
        """Return the record of ``key``, or None."""
        with _unavailable("get", key):
            record: Record | None = self._collection.find_one(documents.key_filter(key))
        return record

    def pending_outbox(self, cutoff: datetime) -> Iterator[OutboxEntry]:
        """Yield every outbox entry PENDING since ``cutoff`` or before."""
        with _unavailable("sweep", "outbox"):
            cursor = self._collection.find(documents.pending_filter(documents.bson_time(cutoff)),
                                           {"idempotency_key": 1, "outbox": 1})
            # Pinned: without the index the sweep would scan every stored event.
            parents = list(cursor.hint(OUTBOX_INDEX))
        for parent in parents:
            for index, entry in enumerate(parent.get("outbox", [])):
                if documents.entry_pending(entry, cutoff):
                    yield OutboxEntry(parent["idempotency_key"], index, entry)

    def mark_published(self, entry: OutboxEntry, now: datetime, message_id: str,
                       tries: int) -> bool:
        """Mark ``entry`` PUBLISHED; False if it was no longer PENDING."""
        update = documents.published_update(entry.index, now, message_id, tries)
        with _unavailable("mark published", entry.key):
            result = self._collection.update_one(self._entry(entry), update)
        return result.matched_count == 1

    def mark_publish_failed(self, entry: OutboxEntry, now: datetime,
                            error: Mapping[str, Any], tries: int) -> None:
        """Record failed publish tries on ``entry``, which stays PENDING."""
        update = documents.failed_update(entry.index, now, error, tries)
        with _unavailable("mark publish failed", entry.key):
            self._collection.update_one(self._entry(entry), update)

    @staticmethod
    def _entry(entry: OutboxEntry) -> dict[str, Any]:
        return documents.entry_filter(entry.parent_key, entry.index, entry.key)

    def guard_take(self, key: str, owner: str, now: datetime, lease: timedelta) -> Record | None:
        """Lease side effect ``key`` (one round trip, decided on the server's clock): None when
        taken now, its record when already SUCCESS; ``LeaseHeld`` when another holds it."""
        update = documents.guard_take(now, owner, lease, self._shift)
        with _unavailable("lease", key):
            try:
                found: Record | None = self._guards.find_one_and_update(
                    {"_id": key}, update, upsert=True, return_document=ReturnDocument.AFTER)
            except DuplicateKeyError:  # two first takes raced: the record exists now
                found = self._guards.find_one_and_update(
                    {"_id": key}, update, upsert=True, return_document=ReturnDocument.AFTER)
        record: Record = found or {"_id": key}
        if record.get("lease_owner") == owner and record.get("status") == documents.PROCESSING:
            return None
        if record.get("status") == documents.SUCCESS:
            return record
        raise LeaseHeld({**record, "idempotency_key": key})

    def guard_renew(self, key: str, owner: str, lease: timedelta) -> bool:
        """Extend ``owner``'s guard lease on ``key`` from the server's now, while it holds."""
        found, update = documents.guard_renewal(key, owner, lease, self._shift)
        with _unavailable("renew lease", key):
            return self._guards.update_one(found, update).modified_count == 1

    def guard_finish(self, key: str, owner: str, now: datetime, *, succeeded: bool,
                     result: Mapping[str, Any]) -> bool:
        """Store how the effect ended; False when ``owner`` lost the lease meanwhile."""
        update = documents.guard_finish_update(now, succeeded=succeeded, result=result)
        with _unavailable("finish", key):
            done = self._guards.update_one(documents.guard_owner_filter(key, owner, succeeded),
                                           update)
        return done.matched_count == 1

    def guard_get(self, key: str) -> Record | None:
        """Return the guard record of side effect ``key``, or None."""
        with _unavailable("get guard", key):
            record: Record | None = self._guards.find_one({"_id": key})
        return record

    def summaries(self, roots: Collection_[str] | None = None) -> list[Record]:
        """Return the summary fields of every event, or of the cascades from ``roots``."""
        query = dict(documents.NOT_ENTITY) if roots is None else \
            documents.cascade_filter(list(roots))
        projection = {name: 1 for name in documents.SUMMARY_FIELDS if name != "outbox"}
        projection.update({f"outbox.{name}": 1 for name in documents.SUMMARY_OUTBOX_FIELDS})
        with _unavailable("summarise", "events"):
            return [documents.summary(doc) for doc in self._collection.find(query, projection)]

    def get_many(self, keys: Collection_[str]) -> list[Record]:
        """Return the records of ``keys`` that exist."""
        with _unavailable("get", "many"):
            return list(self._collection.find({"idempotency_key": {"$in": sorted(keys)}}))

    def reset(self) -> None:
        """Empty every collection of the store's database; indexes stay."""
        database = self._collection.database
        with _unavailable("reset", database.name):
            for name in database.list_collection_names():
                database[name].delete_many({})

    def oldest_pending_outbox(self) -> datetime | None:
        """Return when the oldest PENDING outbox entry was created; None when none is."""
        with _unavailable("outbox age", "outbox"):
            cursor = self._collection.find({"outbox.status": documents.PENDING},
                                           {"outbox.status": 1, "outbox.created_at": 1})
            parents = list(cursor.hint(OUTBOX_INDEX))  # the sweep's index, as pending_outbox
        created = [entry["created_at"] for parent in parents for entry in parent.get("outbox", [])
                   if entry.get("status") == documents.PENDING
                   and isinstance(entry.get("created_at"), datetime)]
        return min(created, default=None)


def _client(settings: Settings, counter: RoundTrips | None) -> MongoClient:
    timeout = settings.store_timeout_ms
    return MongoClient(settings.mongodb_uri, tz_aware=True, appname=settings.service,
                       serverSelectionTimeoutMS=timeout, connectTimeoutMS=timeout,
                       socketTimeoutMS=timeout, event_listeners=[counter] if counter else [])
