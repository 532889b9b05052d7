"""An in-memory implementation of the store protocol, for tests and local development.

It keeps the same documents as ``MongoEventStore`` (built by the same
``eventbus.store.documents`` functions) in a dict behind one lock, and
applies the same rules in Python; the contract suite runs against both.
Records are copied in and out, so a caller can never change a stored
record by accident, and stored as the server would return them (dates at
the millisecond, in UTC; lists for tuples). No server, no pymongo.

``database`` is whatever the caller gives for handlers' own effects: None
by default, or a ``mongomock`` database in tests of handlers that keep
projections.
"""

from __future__ import annotations

import copy
import dataclasses
import threading
import uuid
from collections import Counter
from collections.abc import Collection, Iterator, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from eventbus.clock import Now, lease_end, utcnow
from eventbus.model.errors import AlreadyExists, Conflict, LeaseHeld
from eventbus.store import documents
from eventbus.store.base import Claim, OutboxEntry, Record
from eventbus.store.documents import parked as parking
from eventbus.store.memory_batch import MemoryBatchMixin
from eventbus.store.memory_ops import MemoryOperatorMixin
from eventbus.store.memory_replays import MemoryReplayMixin


def _keep_rejection(record: Record) -> None:
    """Move the refusal of a rejected record into ``rejections`` (as ``documents.claims`` does)."""
    refused = {name: copy.deepcopy(record[name]) for name in documents.REJECTION_FIELDS
               if name in record}
    record["rejections"] = [*record.get("rejections", []), refused]
    for name in (documents.REJECTED, "payload_sha256", "payload_size", "raw_payload",
                 documents.DELIVERY_COUNT):
        record.pop(name, None)


@dataclasses.dataclass
class MemoryCollection:
    """A feature's documents in a memory database, by ``_id``, behind their own lock."""

    documents: dict[str, Record] = dataclasses.field(default_factory=dict)
    lock: threading.RLock = dataclasses.field(default_factory=threading.RLock)

    def clear(self) -> None:
        """Forget every document."""
        with self.lock:
            self.documents.clear()


class MemoryEventStore(MemoryBatchMixin, MemoryOperatorMixin, MemoryReplayMixin):
    """The store primitives on a dict; safe to share between threads."""

    def __init__(self, *, lease: timedelta = timedelta(seconds=60), created_by: str = "memory",
                 retention: timedelta = timedelta(days=30), database: Any = None,
                 clock: Now = utcnow) -> None:
        self._clock = clock
        self._events: dict[str, Record] = {}
        self._guards: dict[str, Record] = {}
        self._lock = threading.RLock()
        self._lease, self._created_by, self._retention = lease, created_by, retention
        self._database = database
        self._collections: dict[str, MemoryCollection] = {}

    @property
    def lease(self) -> timedelta:
        """How long a claim holds its record before another worker may take it."""
        return self._lease

    @property
    def database(self) -> Any:
        """The database handlers use for their own effects, as given (default None)."""
        return self._database

    @property
    def clock(self) -> Now:
        """The clock this store decides leases on (tests move it: a ``FakeClock``)."""
        return self._clock

    def now(self) -> datetime:
        """The store's clock: the one it was given (a test's ``FakeClock``), at BSON's grain."""
        return documents.bson_time(self._clock())

    def ensure_indexes(self) -> None:
        """Nothing to prepare in memory."""

    def memory_collection(self, name: str) -> MemoryCollection:
        """Return the feature collection ``name`` of this in-memory database, made on first use.

        A feature's memory store (``eventbus.partners.memory``...) keeps its documents
        here, as its MongoDB store keeps them in a collection of the events' database:
        every store built beside this one sees the same documents, and ``reset``
        forgets them with the events.
        """
        with self._lock:
            return self._collections.setdefault(name, MemoryCollection())

    def claim(self, key: str, fields: Mapping[str, Any], now: datetime) -> Claim:
        """Take the lease on ``key``, or raise ``AlreadyExists`` with the unchanged record."""
        return self._claim(key, fields, now, uuid.uuid4().hex)

    def _claim(self, key: str, fields: Mapping[str, Any], now: datetime, owner: str) -> Claim:
        # Decided on the store's clock; the caller's ``now`` stamps the attempt.
        with self._lock:
            previous = self._events.get(key)
            fingerprint = str(fields.get("payload_fingerprint") or "")
            if documents.conflicts(previous, fingerprint):
                raise Conflict(copy.deepcopy(previous or {}))
            if previous is not None and not documents.claimable(previous, self.now(),
                                                                 fingerprint):
                raise AlreadyExists(copy.deepcopy(previous))
            attempt = documents.next_attempt(previous)
            self._events[key] = self._taken(key, previous, fields, now, owner, attempt)
            return Claim(attempt=attempt, owner=owner, record=copy.deepcopy(self._events[key]))

    def _taken(self, key: str, previous: Record | None, fields: Mapping[str, Any],
               now: datetime, owner: str, attempt: int) -> Record:
        # As the claim pipeline decides: a record without a status is new
        # (even if a document exists), gets the seed and audit fields and starts
        # a fresh attempt map; any other record keeps its fields and its map.
        record: Record = _bson(previous) if previous is not None else {"idempotency_key": key}
        stamp = documents.epoch_ms(now)
        redo = documents.redoes(previous, str(fields.get("payload_fingerprint") or ""))
        if redo:
            _keep_rejection(record)
        if documents.is_new(previous) or redo:
            inserted = documents.insert_fields(fields, now, created_by=self._created_by,
                                               retention=self._retention)
            if redo:
                inserted = {name: value for name, value in inserted.items()
                            if name not in documents.AUDIT_FIELDS}
            record.update(_bson(inserted))
            meta = _bson(documents.seed_metadata(fields))
            history: Mapping[str, Any] = {}
        else:
            meta = _mapping(record.get("entity_metadata"))
            history = _mapping(meta.get("resilienceAttemptCount"))
        meta["resilienceAttemptCount"] = {**history, str(attempt): stamp}
        for name in ("retryable", "error", "redrive_at", documents.NOT_BEFORE):
            record.pop(name, None)
        record.update(event_status=documents.PROCESSING, lease_owner=owner, attempts=attempt,
                      lease_until=lease_end(self.now(), self._lease), lastUpdatedTime=stamp,
                      pubsub=_bson(fields.get("pubsub", {})), entity_metadata=meta)
        return record

    def succeed(self, key: str, owner: str, now: datetime,
                outbox: Sequence[Mapping[str, Any]] = ()) -> bool:
        """Mark ``key`` SUCCESS with its children; False if ``owner`` lost the lease."""
        done: dict[str, Any] = {"event_status": documents.SUCCESS,
                                "lastUpdatedTime": documents.epoch_ms(now)}
        if outbox:
            done["outbox"] = [dict(child) for child in outbox]
        return self._finish(key, owner, done)

    def fail(self, key: str, owner: str, now: datetime, error: Mapping[str, Any], *,
             retryable: bool, redrive_at: datetime | None = None) -> bool:
        """Mark ``key`` FAILED with ``error``; False if ``owner`` lost the lease."""
        return self._finish(key, owner, documents.fail_fields(now, error, retryable=retryable,
                                                              redrive_at=redrive_at))

    def redrivable(self, limit: int, exclude: Collection[str] = ()) -> list[Record]:
        """Return up to ``limit`` records due for a redrive on this store's clock, longest due
        first."""
        epoch = documents.EPOCH
        with self._lock:
            now = self.now()
            due = [copy.deepcopy(record) for key, record in self._events.items()
                   if key not in exclude and documents.redrivable(record, now, self._lease)]
        return sorted(due, key=lambda record: record.get("redrive_at") or epoch)[:limit]

    def mark_redriven(self, key: str, redrives: int, next_at: datetime) -> bool:
        """Count a redrive of ``key``; False when another sweeper counted it first, or a live
        worker holds it (``documents.redriven_filter``)."""
        with self._lock:
            record = self._events.get(key)
            status = (record or {}).get("event_status")
            if (record is None or (record.get("redrives") or 0) != redrives
                    or status not in (documents.FAILED, documents.PENDING, documents.PROCESSING)
                    or (status == documents.PROCESSING
                        and not documents.stale(record, self.now(), self._lease))):
                return False
            record.update(redrive_at=documents.bson_time(next_at), redrives=redrives + 1)
        return True

    def abandon(self, key: str, now: datetime, error: Mapping[str, Any]) -> bool:
        """Give ``key`` up for good (FAILED, not retryable); False unless retryable or stale."""
        with self._lock:
            record = self._events.get(key)
            if record is None or not documents.abandonable(record, self.now(), self._lease):
                return False
            record.update(_bson(documents.abandon_fields(now, error)))
            for field in documents.ABANDON_UNSET:
                record.pop(field, None)
        return True

    def _held(self, key: str, owner: str) -> Record | None:
        """The record of ``key`` while ``owner``'s lease holds (``documents.owner_filter``)."""
        record = self._events.get(key)
        return record if documents.holds(record, owner, self.now()) else None

    def _finish(self, key: str, owner: str, fields: Mapping[str, Any],
                parked: bool = False) -> bool:
        with self._lock:
            record = self._held(key, owner)
            if record is None:
                return False
            record.update(_bson(fields))
            record.pop("lease_until", None)
            record.pop("lease_owner", None)
            if parked:
                record[documents.PARKS] = parking.parks(record) + 1
        return True

    def renew(self, key: str, owner: str, now: datetime) -> bool:
        """Extend ``owner``'s lease on ``key`` by a lease from this store's now, while it holds."""
        with self._lock:
            record = self._held(key, owner)
            if record is None:
                return False
            record.update(documents.renewed(self._lease, self.now()))
        return True

    def reject(self, key: str, fields: Mapping[str, Any], now: datetime,
               error: Mapping[str, Any], raw_payload: str | None = None) -> bool:
        """Store ``key`` FAILED for good unless it exists; True if this call inserted it.

        The same refusal again (``documents.repeats``) counts one delivery more.
        """
        _, update = documents.reject_upsert(key, fields, now, error, created_by=self._created_by,
                                            retention=self._retention, raw_payload=raw_payload)
        with self._lock:
            record = self._events.get(key)
            if record is None:
                self._events[key] = {"idempotency_key": key, **_bson(update["$setOnInsert"]),
                                     **update.get("$inc", {})}
                return True
            if documents.repeats(record, fields):
                record[documents.DELIVERY_COUNT] = record.get(documents.DELIVERY_COUNT, 0) + 1
        return False

    def get(self, key: str) -> Record | None:
        """Return a copy of the record of ``key``, or None."""
        with self._lock:
            return copy.deepcopy(self._events.get(key))

    def pending_outbox(self, cutoff: datetime) -> Iterator[OutboxEntry]:
        """Yield every outbox entry PENDING since ``cutoff`` or before."""
        with self._lock:
            found = [OutboxEntry(key, index, copy.deepcopy(entry))
                     for key, record in self._events.items()
                     for index, entry in enumerate(record.get("outbox", []))
                     if documents.entry_pending(entry, cutoff)]
        yield from found

    def mark_published(self, entry: OutboxEntry, now: datetime, message_id: str,
                       tries: int) -> bool:
        """Mark ``entry`` PUBLISHED; False if it was no longer PENDING."""
        with self._lock:
            stored = self._pending_entry(entry)
            if stored is None:
                return False
            stored.update(_bson(documents.published_fields(now, message_id)))
            stored["publish_attempts"] = stored.get("publish_attempts", 0) + tries
            stored.pop("last_error", None)
        return True

    def mark_publish_failed(self, entry: OutboxEntry, now: datetime,
                            error: Mapping[str, Any], tries: int) -> None:
        """Record failed publish tries on ``entry``, which stays PENDING."""
        with self._lock:
            stored = self._pending_entry(entry)
            if stored is not None:
                stored.update(_bson(documents.publish_failed_fields(now, error)))
                stored["publish_attempts"] = stored.get("publish_attempts", 0) + tries

    def _pending_entry(self, entry: OutboxEntry) -> dict[str, Any] | None:
        outbox = self._events.get(entry.parent_key, {}).get("outbox", [])
        if entry.index >= len(outbox):
            return None
        stored: dict[str, Any] = outbox[entry.index]
        matches = (stored.get("idempotency_key") == entry.key
                   and stored.get("status") == documents.PENDING)
        return stored if matches else None

    def guard_take(self, key: str, owner: str, now: datetime, lease: timedelta) -> Record | None:
        """Lease side effect ``key``: None when taken now, its record when already SUCCESS."""
        with self._lock:
            record = self._guards.get(key)
            if not documents.guard_takeable(record, self.now()):
                assert record is not None  # a missing record is always takeable
                if record.get("status") == documents.SUCCESS:
                    return copy.deepcopy(record)
                raise LeaseHeld({**copy.deepcopy(record), "idempotency_key": key})
            self._guards[key] = _bson({"_id": key, **documents.guard_taken(
                record, self.now(), owner, lease)})
        return None

    def guard_renew(self, key: str, owner: str, lease: timedelta) -> bool:
        """Extend ``owner``'s guard lease on ``key`` from this store's now, while it holds."""
        with self._lock:
            record = self._guards.get(key)
            now = self.now()
            if record is None or record.get("lease_owner") != owner or \
                    record.get("status") != documents.PROCESSING or \
                    not documents.lease_live(record.get("lease_until"), now):
                return False
            record["lease_until"] = lease_end(now, lease)
        return True

    def guard_finish(self, key: str, owner: str, now: datetime, *, succeeded: bool,
                     result: Mapping[str, Any]) -> bool:
        """Store how the effect ended; False when ``owner`` lost the lease meanwhile."""
        update = documents.guard_finish_update(now, succeeded=succeeded, result=result)
        with self._lock:
            record = self._guards.get(key)
            if record is None or not (succeeded or record.get("lease_owner") == owner):
                return False
            record.update(_bson(update["$set"]))
            for name in update["$unset"]:
                record.pop(name, None)
        return True

    def guard_get(self, key: str) -> Record | None:
        """Return a copy of the guard record of side effect ``key``, or None."""
        with self._lock:
            return copy.deepcopy(self._guards.get(key))

    def summaries(self, roots: Collection[str] | None = None) -> list[Record]:
        """Return the summary fields of every event, or of the cascades from ``roots``."""
        with self._lock:
            return [documents.summary(copy.deepcopy(record)) for key, record
                    in self._events.items() if not documents.is_entity(record)
                    and (roots is None or key in roots or record.get("root_key") in roots)]

    def get_many(self, keys: Collection[str]) -> list[Record]:
        """Return copies of the records of ``keys`` that exist."""
        with self._lock:
            return [copy.deepcopy(self._events[key]) for key in keys if key in self._events]

    def parked_counts(self) -> dict[str, int]:
        """Return partner → number of parked events."""
        with self._lock:
            return dict(Counter(str(record["error"].get("partner"))
                                for record in self._events.values() if parking.is_parked(record)))

    def unpark(self, name: str, now: datetime) -> int:
        """Make every event parked for ``name`` due for the redrive now; return how many."""
        moved = 0
        with self._lock:
            for record in self._events.values():
                if parking.is_parked(record) and record["error"].get("partner") == name:
                    record["redrive_at"] = documents.bson_time(now)
                    moved += 1
        return moved

    def forget_guards(self) -> None:
        """Forget every guard record, as the server's TTL index does once they outlive their
        retention (this store keeps them until asked): a call whose record is gone."""
        with self._lock:
            self._guards.clear()

    def reset(self) -> None:
        """Forget every record."""
        with self._lock:
            self._events.clear()
            self._guards.clear()
            for collection in self._collections.values():
                collection.clear()

    def oldest_pending_outbox(self) -> datetime | None:
        """Return when the oldest PENDING outbox entry was created; None when none is."""
        with self._lock:
            created = [entry["created_at"] for record in self._events.values()
                       for entry in record.get("outbox", [])
                       if entry.get("status") == documents.PENDING
                       and isinstance(entry.get("created_at"), datetime)]
        return min(created, default=None)


def _bson(value: Any) -> Any:
    """Return a copy of ``value`` as MongoDB would store and return it.

    Dates at the millisecond, in UTC (a tz-aware client's reading); tuples as
    lists; mappings as dicts. So a record read back from memory equals the
    one the server would return.
    """
    if isinstance(value, datetime):
        return documents.bson_time(value)
    if isinstance(value, Mapping):
        return {name: _bson(item) for name, item in value.items()}
    if isinstance(value, list | tuple):
        return [_bson(item) for item in value]
    return copy.deepcopy(value)


def _mapping(value: Any) -> dict[str, Any]:
    # The pipeline merges a missing or null subdocument as an empty one.
    return value if isinstance(value, dict) else {}
