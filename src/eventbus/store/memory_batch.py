"""The batch primitives (``claim_many``, ``finish_many``, ``renew_many``) in memory.

A mixin ``MemoryEventStore`` inherits: each runs the single-key rule for every
key under the store's one lock, so a batch is as atomic here as one key.
"""

from __future__ import annotations

import copy
import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from eventbus.model.errors import AlreadyExists, Conflict, ContentRejected
from eventbus.store import documents
from eventbus.store.base import BatchClaim, Claim, Finish, Finished, Record, claim_of_one


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

    def claim_many(self, items: Mapping[str, Mapping[str, Any]], now: datetime) -> BatchClaim:
        """Claim every key at once, one owner for the batch (``EventStore.claim_many``)."""
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

    def finish_many(self, finishes: Sequence[Finish], now: datetime) -> Finished:
        """Store every outcome; say which leases were lost and which children refused."""
        lost, refused = set(), set()
        with self._lock:
            for finish in finishes:
                try:
                    stored = self._finish_one(finish, now)
                except ContentRejected as exc:
                    refused.add(finish.key)
                    stored = self.fail(finish.key, finish.owner, now,
                                       documents.error_document(exc, "content"), retryable=False)
                if not stored:
                    lost.add(finish.key)
        return Finished(frozenset(lost), frozenset(refused - lost))

    def _finish_one(self, finish: Finish, now: datetime) -> bool:
        if finish.error is None:
            return self.succeed(finish.key, finish.owner, now, finish.outbox)
        return self.fail(finish.key, finish.owner, now, finish.error,
                         retryable=finish.retryable, redrive_at=finish.redrive_at)

    def renew_many(self, owners: Mapping[str, str], now: datetime) -> set[str]:
        """Extend every lease still held; return those keys."""
        with self._lock:
            return {key for key, owner in owners.items() if self.renew(key, owner, now)}
