"""The persistence layer: a few storage primitives on the ``partner_events`` collection.

Modelled on AWS Powertools idempotency's persistence layer: this module only
reads and writes records; the state machine that decides what to do lives
in ``eventbus.idempotency``. Documents, filters and updates are built by
``eventbus.records``.

Two error rules hold for every method:

* a conflict that matters to the caller is ``AlreadyExists(record)``,
  carrying the stored record so no second read is needed;
* every other pymongo failure (connection loss, timeouts, server errors)
  is ``StoreUnavailable``, transient, with the original as ``__cause__``.

Round trips: a new event costs two (``claim`` then ``succeed`` or ``fail``);
a duplicate of a finished event costs one (``claim`` raising ``AlreadyExists``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import uuid
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from pymongo import ASCENDING, DESCENDING, IndexModel, MongoClient, ReturnDocument
from pymongo.collection import Collection
from pymongo.database import Database
from pymongo.errors import DuplicateKeyError, PyMongoError

from eventbus import records
from eventbus.config import Settings
from eventbus.errors import AlreadyExists, StoreUnavailable
from eventbus.metrics import round_trips


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
)
"""The collection's indexes: seed 002's four, the unique key, and the relay's outbox sweep."""


@dataclasses.dataclass(frozen=True)
class Claim:
    """A claim taken on a record: this worker now holds its lease."""

    attempt: int
    """1-based number of the attempt taken now."""
    owner: str
    """Random lease token of this claim; finishing needs it."""
    previous: Mapping[str, Any] | None
    """The record as it was before the claim; None when the record is new."""


@contextlib.contextmanager
def _unavailable(action: str, key: str) -> Iterator[None]:
    """Turn any pymongo failure inside the block into ``StoreUnavailable``."""
    try:
        yield
    except PyMongoError as exc:
        raise StoreUnavailable(f"{action} {key!r}: {type(exc).__name__}: {exc}") from exc


class MongoEventStore:
    """The storage primitives of the idempotency state machine, on one collection."""

    def __init__(self, collection: Collection, *, created_by: str, retention: timedelta,
                 lease: timedelta) -> None:
        self._collection = collection
        self._created_by = created_by
        self._retention = retention
        self._lease = lease

    @classmethod
    def from_settings(cls, settings: Settings,
                      client: MongoClient | None = None) -> MongoEventStore:
        """Build the store from ``settings``, with a new client unless one is given.

        A new client is tz-aware, times out after ``store_timeout_ms`` and
        reports to ``metrics.round_trips``; a given client is used as it is.
        """
        client = client if client is not None else _client(settings)
        collection = client[settings.mongodb_db][settings.collection]
        return cls(collection, created_by=settings.service,
                   retention=timedelta(days=settings.retention_days),
                   lease=timedelta(seconds=settings.lease_seconds))

    @property
    def database(self) -> Database:
        """The collection's database, for handlers' own effects."""
        return self._collection.database

    @property
    def collection(self) -> Collection:
        """The event collection itself, for readers such as the outbox relay."""
        return self._collection

    @property
    def lease(self) -> timedelta:
        """How long a claim holds its record before another worker may take it."""
        return self._lease

    def ensure_indexes(self) -> None:
        """Create the collection's indexes; a no-op when they already exist."""
        with _unavailable("create indexes on", self._collection.name):
            self._collection.create_indexes(list(INDEXES))

    def claim(self, key: str, fields: Mapping[str, Any], now: datetime) -> Claim:
        """Take the lease on ``key`` in one round trip, or raise ``AlreadyExists``.

        A record is taken when it is new, PENDING, FAILED and retryable, or
        PROCESSING under an expired lease. ``fields`` (``records.event_fields``)
        are stored only when the record is new. Otherwise ``AlreadyExists``
        carries the record, which the claim left unchanged.
        """
        now = records.bson_time(now)
        owner = uuid.uuid4().hex
        update = records.claim_pipeline(fields, now, owner=owner, lease=self._lease,
                                        created_by=self._created_by, retention=self._retention)
        previous = self._take(key, update)
        if previous is not None and not records.claimable(previous, now):
            raise AlreadyExists(previous)
        return Claim(attempt=records.next_attempt(previous), owner=owner, previous=previous)

    def _take(self, key: str, update: list[dict[str, Any]]) -> dict[str, Any] | None:
        with _unavailable("claim", key):
            try:
                return self._find_one_and_update(key, update)
            except DuplicateKeyError:
                # Two upserts of a new key raced and the other one inserted;
                # the document exists now, so a second try reads it.
                return self._find_one_and_update(key, update)

    def _find_one_and_update(self, key: str, update: list[dict[str, Any]]) -> dict[str, Any] | None:
        previous: dict[str, Any] | None = self._collection.find_one_and_update(
            records.key_filter(key), update, upsert=True,
            return_document=ReturnDocument.BEFORE)
        return previous

    def succeed(self, key: str, owner: str, now: datetime,
                outbox: Sequence[Mapping[str, Any]] = ()) -> bool:
        """Mark ``key`` SUCCESS with its children; False if ``owner`` lost the lease."""
        return self._finish(key, owner, records.succeed_update(now, outbox), "succeed")

    def fail(self, key: str, owner: str, now: datetime, error: Mapping[str, Any], *,
             retryable: bool) -> bool:
        """Mark ``key`` FAILED with ``error``; False if ``owner`` lost the lease."""
        return self._finish(key, owner, records.fail_update(now, error, retryable=retryable),
                            "fail")

    def _finish(self, key: str, owner: str, update: Mapping[str, Any], action: str) -> bool:
        with _unavailable(action, key):
            result = self._collection.update_one(records.owner_filter(key, owner), update)
        return result.matched_count == 1

    def reject(self, key: str, fields: Mapping[str, Any], now: datetime,
               error: Mapping[str, Any], raw_payload: str | None = None) -> bool:
        """Store ``key`` as FAILED for good unless it exists; True if this call inserted it.

        An existing record, whatever its state, is never changed.
        """
        update = records.reject_update(fields, now, error, created_by=self._created_by,
                                       retention=self._retention, raw_payload=raw_payload)
        with _unavailable("reject", key):
            try:
                result = self._collection.update_one(records.key_filter(key), update,
                                                      upsert=True)
            except DuplicateKeyError:
                return False  # a concurrent upsert of the same key inserted it first
        return result.upserted_id is not None

    def get(self, key: str) -> dict[str, Any] | None:
        """Return the record of ``key``, or None."""
        with _unavailable("get", key):
            record: dict[str, Any] | None = self._collection.find_one(records.key_filter(key))
        return record


def _client(settings: Settings) -> MongoClient:
    timeout = settings.store_timeout_ms
    return MongoClient(settings.mongodb_uri, tz_aware=True, appname=settings.service,
                       serverSelectionTimeoutMS=timeout, connectTimeoutMS=timeout,
                       socketTimeoutMS=timeout, event_listeners=[round_trips])
