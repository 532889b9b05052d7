"""Breakers and token buckets in memory: a mixin that ``MemoryEventStore`` inherits.

The same documents as ``eventbus.partners.mongo`` (``eventbus.partners.documents``),
in a dict behind the store's lock.
"""

from __future__ import annotations

import copy
import threading
from collections import Counter
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from eventbus.clock import bson_time
from eventbus.partners.documents import (
    BREAKER,
    RateLimit,
    RateTake,
    breaker_document,
    breaker_id,
    is_parked,
    rate_document,
    rate_id,
    rate_step,
)
from eventbus.store.base import Record


class MemoryPartnersMixin:
    """``breaker_get``, ``breaker_swap``, ``breakers``, ``rate_take``, ``parked_counts``."""

    _events: dict[str, Record]
    _lock: threading.RLock
    _partners: dict[str, Record]

    if TYPE_CHECKING:  # provided by MemoryEventStore
        def now(self) -> datetime:
            """The store's clock."""
            ...

    def breaker_get(self, name: str) -> Record | None:
        """Return the breaker document of ``name``, or None."""
        with self._lock:
            return copy.deepcopy(self._partners.get(breaker_id(name)))

    def breaker_swap(self, name: str, version: int, document: Mapping[str, Any]) -> bool:
        """Store ``document`` if ``name``'s breaker is still at ``version`` (0: none yet)."""
        with self._lock:
            current = self._partners.get(breaker_id(name))
            if (current["version"] if current else 0) != version:
                return False
            stored = breaker_document(name, version + 1, _stored(document))
            self._partners[breaker_id(name)] = stored
        return True

    def breakers(self) -> list[Record]:
        """Return every breaker document, by name."""
        with self._lock:
            found = [doc for doc in self._partners.values() if doc.get("kind") == BREAKER]
            return copy.deepcopy(sorted(found, key=lambda doc: doc["name"]))

    def rate_take(self, name: str, limit: RateLimit, max_wait: timedelta) -> RateTake:
        """Take a token of ``name``'s bucket on the store's clock (``rate_step``, locked)."""
        with self._lock:
            found = self._partners.get(rate_id(name))
            take, tat = rate_step(found["tat"] if found else None, self.now(), limit, max_wait)
            self._partners[rate_id(name)] = rate_document(name, tat, take)
            return take

    def parked_counts(self) -> dict[str, int]:
        """Return partner → number of parked events."""
        with self._lock:
            return dict(Counter(str(record["error"].get("partner"))
                                for record in self._events.values() if is_parked(record)))

    def unpark(self, name: str, now: datetime) -> int:
        """Make every event parked for ``name`` due for the redrive now; return how many."""
        with self._lock:
            return _unpark(self._events, name, now)


def _unpark(records: dict[str, Record], name: str, now: datetime) -> int:
    moved = 0
    for record in records.values():
        if is_parked(record) and record["error"].get("partner") == name:
            record["redrive_at"] = bson_time(now)
            moved += 1
    return moved


def _stored(document: Mapping[str, Any]) -> dict[str, Any]:
    # As the server would keep it: dates at the millisecond, copied.
    return {name: bson_time(value) if isinstance(value, datetime) else copy.deepcopy(value)
            for name, value in document.items()}
