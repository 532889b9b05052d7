"""Breakers and token buckets in memory: ``MemoryPartnerStore``, beside a memory event store.

The same documents as ``eventbus.partners.mongo`` (``eventbus.partners.documents``),
in a dict behind this store's own lock; its clock is the event store's, and the
parked events are the event store's to count and bring back.
"""

from __future__ import annotations

import copy
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
    rate_document,
    rate_id,
    rate_step,
)
from eventbus.store.base import Record

if TYPE_CHECKING:
    from eventbus.store.memory import MemoryEventStore


class MemoryPartnerStore:
    """``PartnerStore`` in memory: breakers and buckets in ``events``' collection ``name``
    (``MemoryEventStore.memory_collection``: every store beside it shares them), parked
    events in ``events``."""

    def __init__(self, events: MemoryEventStore, name: str = "partners") -> None:
        collection = events.memory_collection(name)
        self._events, self._lock, self._partners = events, collection.lock, collection.documents

    def now(self) -> datetime:
        """The event store's clock."""
        return self._events.now()

    def ensure_indexes(self) -> None:
        """Nothing to prepare in memory."""

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
        """Return partner → number of parked events (the event store's count)."""
        return self._events.parked_counts()

    def unpark(self, name: str, now: datetime) -> int:
        """Make every event parked for ``name`` due for the redrive now (the event store)."""
        return self._events.unpark(name, now)


def _stored(document: Mapping[str, Any]) -> dict[str, Any]:
    # As the server would keep it: dates at the millisecond, copied.
    return {name: bson_time(value) if isinstance(value, datetime) else copy.deepcopy(value)
            for name, value in document.items()}
