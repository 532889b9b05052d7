"""The operator primitives on MongoDB: a mixin that ``MongoEventStore`` inherits.

It uses the store's ``_collection``, ``_created_by`` and ``_retention``, and
the store's error rule (``eventbus.store.mongo_errors``): every pymongo
failure becomes ``StoreUnavailable``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from pymongo import ReturnDocument
from pymongo.errors import DuplicateKeyError

from eventbus.model.errors import AlreadyExists
from eventbus.store import documents
from eventbus.store.base import Record
from eventbus.store.mongo_errors import unavailable as _unavailable
from eventbus.store.operator_queries import (
    Count,
    EventQuery,
    Order,
    StoredAs,
    query_filter,
    replay_filter,
    replay_pipeline,
)

ASCENDING, DESCENDING = 1, -1
_ORDERS: dict[str, list[tuple[str, int]]] = {
    "newest": [("created", DESCENDING)],
    "attempts": [("attempts", DESCENDING), ("created", DESCENDING)],
}


class MongoOperatorMixin:
    """``find_events``, ``count_events``, ``record_replay``, ``store_dead_letter`` on MongoDB."""

    _collection: Any
    _created_by: str
    _retention: timedelta

    def find_events(self, query: EventQuery, *, limit: int,
                    fields: Sequence[str] | None = None,
                    order: Order = "newest") -> list[Record]:
        """Return at most ``limit`` matching records (top-level ``fields`` only, if given)."""
        if limit <= 0:
            return []  # the server reads a limit of 0 as "no limit"
        projection: dict[str, int] = {"_id": 0, **dict.fromkeys(fields or (), 1)}
        with _unavailable("query", "events"):
            cursor = self._collection.find(query_filter(query), projection)
            return list(cursor.sort(_ORDERS[order]).limit(limit))

    def count_events(self, query: EventQuery, group_by: Sequence[str], *,
                     bucket_ms: int | None = None) -> list[Count]:
        """Count matching records by the (dotted) fields ``group_by`` and a ``created`` bucket."""
        group: dict[str, Any] = {f"f{index}": f"${path}" for index, path in enumerate(group_by)}
        if bucket_ms is not None:
            group["bucket"] = _bucket_expression(bucket_ms)
        pipeline = [{"$match": query_filter(query)},
                    {"$group": {"_id": group, "n": {"$sum": 1}}}]
        with _unavailable("count", "events"):
            rows = list(self._collection.aggregate(pipeline))
        return [_count(row, len(group_by), bucket_ms) for row in rows]

    def record_replay(self, key: str, entry: Mapping[str, Any], now: datetime, *,
                      reopen: bool, redrive_at: datetime | None = None) -> Record | None:
        """Append ``entry`` to ``replays`` (and reopen a FAILED record); the record after."""
        with _unavailable("replay", key):
            after: Record | None = self._collection.find_one_and_update(
                replay_filter(key, reopen=reopen), replay_pipeline(entry, now, reopen=reopen,
                                                             redrive_at=redrive_at),
                return_document=ReturnDocument.AFTER)
            if after is not None or not reopen:
                return after
            current: Record | None = self._collection.find_one(documents.key_filter(key))
        if current is not None:
            raise AlreadyExists(current)
        return None

    def store_dead_letter(self, key: str, fields: Mapping[str, Any], now: datetime,
                          error: Mapping[str, Any], mark: Mapping[str, Any],
                          raw_payload: str | None = None) -> StoredAs:
        """Store a dead-lettered message FAILED for good, or mark the record of ``key``."""
        update = documents.reject_update(fields, now, error, created_by=self._created_by,
                                         retention=self._retention, raw_payload=raw_payload)
        update["$set"] = {"dead_lettered": dict(mark)}
        with _unavailable("store dead letter", key):
            try:
                done = self._collection.update_one(documents.key_filter(key), update,
                                                   upsert=True)
            except DuplicateKeyError:  # a racing insert of the same key won
                self._collection.update_one(documents.key_filter(key),
                                            {"$set": update["$set"]})
                return "marked"
        return "stored" if done.upserted_id is not None else "marked"


def _bucket_expression(bucket_ms: int) -> dict[str, Any]:
    # A ``created`` that is not a number (never written by this library) has no bucket.
    stamp = {"$convert": {"input": "$created", "to": "long", "onError": None, "onNull": None}}
    return {"$subtract": [stamp, {"$mod": [stamp, bucket_ms]}]}


def _count(row: Mapping[str, Any], width: int, bucket_ms: int | None) -> Count:
    group = row.get("_id") or {}
    bucket = group.get("bucket") if bucket_ms is not None else None
    return Count(values=tuple(group.get(f"f{index}") for index in range(width)),
                 count=int(row["n"]), bucket=int(bucket) if bucket is not None else None)
