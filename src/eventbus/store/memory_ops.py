"""The operator primitives in memory: a mixin that ``MemoryEventStore`` inherits.

It uses the store's ``_events`` and ``_lock`` and applies the same pure
rules (``eventbus.store.operator_queries``) that ``mongo_ops`` sends to the server.
"""

from __future__ import annotations

import copy
import threading
from collections import Counter
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from eventbus.model.errors import AlreadyExists
from eventbus.model.event import lookup
from eventbus.store import documents
from eventbus.store.base import Record
from eventbus.store.operator_queries import (
    Count,
    EventQuery,
    Order,
    StoredAs,
    created_bucket,
    matches,
    sort_key,
)


class MemoryOperatorMixin:
    """``find_events``, ``count_events``, ``record_replay``, ``store_dead_letter`` in memory."""

    _events: dict[str, Record]
    _lock: threading.RLock
    _created_by: str
    _retention: timedelta

    def find_events(self, query: EventQuery, *, limit: int,
                    fields: Sequence[str] | None = None,
                    order: Order = "newest") -> list[Record]:
        """Return at most ``limit`` matching records (top-level ``fields`` only, if given)."""
        with self._lock:
            found = [record for record in self._events.values() if matches(record, query)]
            found.sort(key=sort_key(order), reverse=True)
            return [_projected(record, fields) for record in found[:max(limit, 0)]]

    def count_events(self, query: EventQuery, group_by: Sequence[str], *,
                     bucket_ms: int | None = None) -> list[Count]:
        """Count matching records by the (dotted) fields ``group_by`` and a ``created`` bucket."""
        with self._lock:
            keys = Counter(_group(record, group_by, bucket_ms)
                           for record in self._events.values() if matches(record, query))
        return [Count(values, count, bucket) for (values, bucket), count in keys.items()]

    def record_replay(self, key: str, entry: Mapping[str, Any], now: datetime, *,
                      reopen: bool, redrive_at: datetime | None = None) -> Record | None:
        """Append ``entry`` to ``replays`` (and reopen a FAILED record); the record after."""
        with self._lock:
            record = self._events.get(key)
            if record is None:
                return None
            if reopen and record.get("event_status") != documents.FAILED:
                raise AlreadyExists(copy.deepcopy(record))
            record["replays"] = [*_list(record.get("replays")), _plain(entry)]
            if reopen:
                record.update(retryable=True, replayed_at_attempt=record.get("attempts", 0),
                              lastUpdatedTime=documents.epoch_ms(now))
                record.pop(documents.NOT_BEFORE, None)  # as replay_pipeline: runs now
                if redrive_at is not None:  # as replay_pipeline: a fresh redrive budget
                    record.update(redrive_at=documents.bson_time(redrive_at),
                                  redrives=record.get("parks") or 0)
            return copy.deepcopy(record)

    def store_dead_letter(self, key: str, fields: Mapping[str, Any], now: datetime,
                          error: Mapping[str, Any], mark: Mapping[str, Any],
                          raw_payload: str | None = None) -> StoredAs:
        """Store a dead-lettered message FAILED for good, or mark the record of ``key``."""
        update = documents.reject_update(fields, now, error, created_by=self._created_by,
                                         retention=self._retention, raw_payload=raw_payload)
        with self._lock:
            record = self._events.get(key)
            if record is not None:
                record["dead_lettered"] = _plain(mark)
                return "marked"
            self._events[key] = {"idempotency_key": key, **_plain(update["$setOnInsert"]),
                                 "dead_lettered": _plain(mark)}
        return "stored"


def _projected(record: Record, fields: Sequence[str] | None) -> Record:
    if not fields:  # as the server: no names asked, the whole record
        return copy.deepcopy(record)
    return {name: copy.deepcopy(record[name]) for name in fields if name in record}


def _group(record: Record, group_by: Sequence[str],
           bucket_ms: int | None) -> tuple[tuple[Any, ...], int | None]:
    values = tuple(_hashable(lookup(record, path)) for path in group_by)
    bucket = created_bucket(record.get("created"), bucket_ms) if bucket_ms else None
    return values, bucket


def _hashable(value: Any) -> Any:
    # Grouping on a subdocument is legal on the server; keep it countable here too.
    if isinstance(value, Mapping | list):
        return repr(value)
    return value


def _list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list) else []


def _plain(value: Any) -> Any:
    """Return ``value`` as the server would store it (dates at the ms, lists, dicts)."""
    if isinstance(value, datetime):
        return documents.bson_time(value)
    if isinstance(value, Mapping):
        return {name: _plain(item) for name, item in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    return copy.deepcopy(value)
